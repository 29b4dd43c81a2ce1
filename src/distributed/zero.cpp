#include "distributed/zero.h"

#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#endif

#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "io/hf_config.h"
#include "model/adamw.h"
#include "io/safetensors.h"
#include "util/atomic_file.h"

namespace coconut {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string zero_shard_file_name(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer-rank-%05d-of-%05d.safetensors", rank, world_size);
  return name;
}

#if TORCH_VERSION_MAJOR >= 2
// Called by autograd once a parameter's gradient of this backward has been accumulated into .grad.
struct ZeroOptimizer::Hook : torch::autograd::PostAccumulateGradHook {
  Hook(ZeroOptimizer* owner, size_t bucket) : owner(owner), bucket(bucket) {}
  void operator()(const torch::autograd::Variable&) override { owner->on_gradient(bucket); }
  ZeroOptimizer* owner;
  size_t bucket;
};
#endif

ZeroOptimizer::ZeroOptimizer(ProcessGroup* group, const torch::optim::AdamW& layout, int64_t bucket_elements)
    : group_(group), rank_(group ? group->rank() : 0), world_(group ? group->world_size() : 1) {
  if (bucket_elements < 1) throw std::invalid_argument("ZeroOptimizer: bucket_elements must be positive");
  torch::NoGradGuard no_grad;
  const auto& groups = layout.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    group_options_.push_back(std::make_unique<torch::optim::AdamWOptions>(
        static_cast<const torch::optim::AdamWOptions&>(groups[g].options())));
    if (group_options_.back()->amsgrad()) throw std::invalid_argument("ZeroOptimizer: amsgrad is not sharded");
    const auto& parameters = groups[g].params();
    Bucket* open = nullptr;
    for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {  // last first: backward's order
      const torch::Tensor& parameter = *it;
      const bool fits = open && open->elements + parameter.numel() <= bucket_elements &&
                        parameter.scalar_type() == open->parameters.front().scalar_type() &&
                        parameter.device() == open->parameters.front().device();
      if (!fits) {
        buckets_.emplace_back();
        open = &buckets_.back();
        open->group = g;
      }
      open->offsets.push_back(open->elements);
      open->parameters.push_back(parameter);
      open->elements += parameter.numel();
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.chunk = (bucket.elements + world_ - 1) / world_;
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    const auto device = bucket.parameters.front().device();
    auto flat = torch::zeros({bucket.chunk * world_}, torch::TensorOptions().dtype(torch::kFloat32).device(device));  // [W c]
    for (size_t i = 0; i < bucket.parameters.size(); ++i)
      flat.narrow(0, bucket.offsets[i], bucket.parameters[i].numel()).copy_(bucket.parameters[i].reshape({-1}));
    bucket.master = flat.narrow(0, bucket.chunk * rank_, bucket.chunk).clone().set_requires_grad(true);  // [c]
    bucket.master.mutable_grad() = torch::zeros_like(bucket.master);
#if TORCH_VERSION_MAJOR >= 2
    for (const auto& parameter : bucket.parameters)
      torch::autograd::impl::set_post_acc_grad_hooks(parameter, std::make_unique<Hook>(this, b));
#endif
  }
  make_shard_optimizer();
}

ZeroOptimizer::~ZeroOptimizer() {
#if TORCH_VERSION_MAJOR >= 2
  for (auto& bucket : buckets_)
    for (const auto& parameter : bucket.parameters) torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
#endif
}

void ZeroOptimizer::make_shard_optimizer() {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < group_options_.size(); ++g) {
    std::vector<torch::Tensor> masters;
    for (const auto& bucket : buckets_)
      if (bucket.group == g) masters.push_back(bucket.master);
    groups.emplace_back(masters, std::make_unique<torch::optim::AdamWOptions>(*group_options_[g]));
  }
  optimizer_ = std::make_unique<torch::optim::AdamW>(groups, *group_options_.front());
}

void ZeroOptimizer::reset_state() {
  torch::NoGradGuard no_grad;
  make_shard_optimizer();
}

int64_t ZeroOptimizer::shard_elements() const {
  int64_t total = 0;
  for (const auto& bucket : buckets_) total += bucket.chunk;
  return total;
}

void ZeroOptimizer::on_gradient(size_t bucket) {
  if (in_finish_ || buckets_[bucket].pending == 0) return;
  --buckets_[bucket].pending;
  while (next_to_reduce_ < buckets_.size() && buckets_[next_to_reduce_].pending == 0) {
    reduce(next_to_reduce_++);
    ++reduced_in_backward_;
  }
}

void ZeroOptimizer::finish_backward() {
  in_finish_ = true;
  while (next_to_reduce_ < buckets_.size()) reduce(next_to_reduce_++);
  next_to_reduce_ = 0;
  for (auto& bucket : buckets_) bucket.pending = static_cast<int64_t>(bucket.parameters.size());
  in_finish_ = false;
}

void ZeroOptimizer::reduce(size_t index) {
  torch::NoGradGuard no_grad;
  Bucket& bucket = buckets_[index];
  auto flat = torch::zeros({bucket.chunk * world_}, bucket.master.options().requires_grad(false));  // [W c]
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    auto& parameter = bucket.parameters[i];
    if (!parameter.grad().defined()) continue;  // no gradient in this backward: zeros
    flat.narrow(0, bucket.offsets[i], parameter.numel()).copy_(parameter.grad().reshape({-1}));
    parameter.mutable_grad().reset();
  }
  torch::Tensor mine;  // [c]: the sum over ranks of this rank's chunk
  if (group_) {
    mine = torch::empty({bucket.chunk}, flat.options());
    group_->reduce_scatter_sum(mine, flat);
  } else {
    mine = flat;
  }
  bucket.master.mutable_grad().add_(mine, 1.0 / world_);
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  auto squares = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(buckets_.empty()
                                                                                           ? torch::Device(torch::kCPU)
                                                                                           : buckets_.front().master.device()));
  for (const auto& bucket : buckets_) squares += bucket.master.grad().to(torch::kFloat64).square().sum();
  if (group_) {
    std::vector<torch::Tensor> reduced = {squares};
    group_->all_reduce_sum(reduced);
  }
  const double total = std::sqrt(squares.item<double>());
  if (max_norm > 0) {
    const double coefficient = max_norm / (total + 1e-6);  // clip_grad_norm_'s
    if (coefficient < 1)
      for (auto& bucket : buckets_) bucket.master.mutable_grad().mul_(coefficient);
  }
  return total;
}

void ZeroOptimizer::step() {
  adamw_step(*optimizer_);  // the shard's masters, on the fused kernel as unsharded training
  torch::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    torch::Tensor full = bucket.master.detach();  // [W c]
    if (group_) {
      full = torch::empty({bucket.chunk * world_}, bucket.master.options().requires_grad(false));
      torch::Tensor mine = bucket.master.detach();
      group_->all_gather(full, mine);
    }
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      auto& parameter = bucket.parameters[i];
      parameter.detach().copy_(full.narrow(0, bucket.offsets[i], parameter.numel()).view(parameter.sizes()));
    }
    bucket.master.mutable_grad().zero_();
  }
}

json ZeroOptimizer::index_json() const {
  json sizes = json::array(), files = json::array();
  for (const auto& bucket : buckets_) sizes.push_back(bucket.elements);
  for (int r = 0; r < world_; ++r) files.push_back(zero_shard_file_name(r, world_));
  return {{"zero_stage", 2}, {"world_size", world_}, {"bucket_elements", sizes}, {"files", files}};
}

void ZeroOptimizer::save(const fs::path& directory) const {
  TensorMap tensors;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& bucket = buckets_[b];
    const std::string prefix = "bucket." + std::to_string(b) + ".";
    const auto found = optimizer_->state().find(bucket.master.unsafeGetTensorImpl());
    int64_t step = 0;
    torch::Tensor exp_avg = torch::zeros({bucket.chunk}), exp_avg_sq = torch::zeros({bucket.chunk});
    if (found != optimizer_->state().end()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
      step = state.step();
      exp_avg = state.exp_avg().to(torch::kCPU);
      exp_avg_sq = state.exp_avg_sq().to(torch::kCPU);
    }
    tensors[prefix + "exp_avg"] = exp_avg.contiguous();
    tensors[prefix + "exp_avg_sq"] = exp_avg_sq.contiguous();
    tensors[prefix + "step"] = torch::tensor({step}, torch::kInt64);
  }
  write_safetensors((directory / zero_shard_file_name(rank_, world_)).string(), tensors);
  if (rank_ == 0) write_file_atomically((directory / kZeroIndexFile).string(), index_json().dump(2) + "\n");
}

void ZeroOptimizer::load(const fs::path& directory) {
  const std::string index_path = (directory / kZeroIndexFile).string();
  const json index = read_json_file(index_path);
  int64_t written_world = 0;
  std::vector<int64_t> written_sizes;
  try {
    if (index.at("zero_stage").get<int>() != 2) throw std::invalid_argument("zero_stage is not 2");
    written_world = index.at("world_size").get<int64_t>();
    written_sizes = index.at("bucket_elements").get<std::vector<int64_t>>();
  } catch (const json::exception& error) {
    throw std::invalid_argument(index_path + ": malformed ZeRO index: " + error.what());
  }
  if (written_world < 1) throw std::invalid_argument(index_path + ": world_size " + std::to_string(written_world));
  std::vector<int64_t> sizes;
  for (const auto& bucket : buckets_) sizes.push_back(bucket.elements);
  if (written_sizes != sizes)
    throw std::invalid_argument(index_path + ": written for other parameters (" + std::to_string(written_sizes.size()) +
                                " buckets, not this run's " + std::to_string(sizes.size()) +
                                ", or of other sizes: was the model, LoRA or the router setting changed?)");
  const auto shard_path = [&](int64_t written_rank) {
    return (directory / zero_shard_file_name(static_cast<int>(written_rank), static_cast<int>(written_world))).string();
  };
  std::map<int64_t, TensorMap> files;  // written rank -> its shard, read when first needed
  const auto shard_of = [&](int64_t written_rank) -> const TensorMap& {
    auto found = files.find(written_rank);
    if (found == files.end()) {
      const std::string path = shard_path(written_rank);
      if (!fs::is_regular_file(path)) throw std::invalid_argument(path + ": missing (" + index_path + " names it)");
      found = files.emplace(written_rank, read_safetensors(path)).first;
    }
    return found->second;
  };
  const auto tensor_in = [&](int64_t written_rank, const std::string& name, int64_t values) {
    const TensorMap& shard = shard_of(written_rank);
    const auto found = shard.find(name);
    const std::string where = shard_path(written_rank);
    if (found == shard.end()) throw std::invalid_argument(where + ": no tensor '" + name + "'");
    if (found->second.numel() != values)
      throw std::invalid_argument(where + ": tensor '" + name + "' has " + std::to_string(found->second.numel()) +
                                  " values, expected " + std::to_string(values));
    return found->second;
  };
  torch::NoGradGuard no_grad;
  make_shard_optimizer();  // fresh state, then each chunk's moments from the files
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const std::string prefix = "bucket." + std::to_string(b) + ".";
    const int64_t written_chunk = (bucket.elements + written_world - 1) / written_world;
    const int64_t step = tensor_in(0, prefix + "step", 1).item<int64_t>();
    if (step == 0) continue;  // never stepped: nothing to restore
    auto exp_avg = torch::zeros({bucket.chunk}), exp_avg_sq = torch::zeros({bucket.chunk});
    // This rank's values [begin, end) of the bucket, from the written chunks that hold them.
    const int64_t begin = bucket.chunk * rank_, end = std::min(begin + bucket.chunk, bucket.elements);
    for (int64_t position = begin; position < end;) {
      const int64_t written_rank = position / written_chunk;
      const int64_t stop = std::min(end, (written_rank + 1) * written_chunk);
      const int64_t from = position - written_rank * written_chunk;
      exp_avg.narrow(0, position - begin, stop - position)
          .copy_(tensor_in(written_rank, prefix + "exp_avg", written_chunk).narrow(0, from, stop - position));
      exp_avg_sq.narrow(0, position - begin, stop - position)
          .copy_(tensor_in(written_rank, prefix + "exp_avg_sq", written_chunk).narrow(0, from, stop - position));
      position = stop;
    }
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step);
    state->exp_avg(exp_avg.to(bucket.master.device()));
    state->exp_avg_sq(exp_avg_sq.to(bucket.master.device()));
    optimizer_->state()[bucket.master.unsafeGetTensorImpl()] = std::move(state);
  }
}

}  // namespace coconut
