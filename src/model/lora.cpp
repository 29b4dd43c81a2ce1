#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace coconut {
namespace {

// The projection and its adapter slot, by name, in one layer.
std::pair<torch::nn::Linear, LowRankAdapter*> projection(DecoderLayerImpl& layer, const std::string& name) {
  auto& attention = *layer.self_attn;
  auto& mlp = *layer.mlp;
  if (name == "q_proj") return {attention.q_proj, &attention.q_lora};
  if (name == "k_proj") return {attention.k_proj, &attention.k_lora};
  if (name == "v_proj") return {attention.v_proj, &attention.v_lora};
  if (name == "o_proj") return {attention.o_proj, &attention.o_lora};
  if (name == "gate_proj") return {mlp.gate_proj, &mlp.gate_lora};
  if (name == "up_proj") return {mlp.up_proj, &mlp.up_lora};
  if (name == "down_proj") return {mlp.down_proj, &mlp.down_lora};
  throw std::invalid_argument("unknown LoRA target '" + name + "'");
}

template <typename Visit>
void for_each_adapter(const Llama& model, Visit visit) {
  auto& layers = *model->layers;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& layer = *layers.ptr<DecoderLayerImpl>(l);
    for (const auto& name : lora_target_names()) {
      auto [linear, adapter] = projection(layer, name);
      if (adapter->a.defined()) visit(static_cast<int64_t>(l), name, linear, *adapter);
    }
  }
}

}  // namespace

std::string lora_module_path(int64_t layer, const std::string& projection) {
  const bool attention = projection == "q_proj" || projection == "k_proj" || projection == "v_proj" || projection == "o_proj";
  return "layers." + std::to_string(layer) + (attention ? ".self_attn." : ".mlp.") + projection;
}

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

void validate_lora_options(const LoraOptions& options) {
  if (options.rank < 1) throw std::invalid_argument("LoRA rank must be at least 1, got " + std::to_string(options.rank));
  if (!(options.alpha > 0)) throw std::invalid_argument("LoRA alpha must be positive");
  if (options.targets.empty()) throw std::invalid_argument("LoRA needs at least one target projection");
  std::set<std::string> seen;
  for (const auto& target : options.targets) {
    if (std::find(lora_target_names().begin(), lora_target_names().end(), target) == lora_target_names().end())
      throw std::invalid_argument("unknown LoRA target '" + target +
                                  "' (known: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)");
    if (!seen.insert(target).second) throw std::invalid_argument("LoRA target '" + target + "' given twice");
  }
}

void attach_lora(Llama& model, const LoraOptions& options, uint64_t seed) {
  validate_lora_options(options);
  if (has_lora(model)) throw std::invalid_argument("the model already has LoRA adapters");
  torch::NoGradGuard no_grad;
  for (auto& parameter : model->parameters()) parameter.set_requires_grad(false);
  auto generator = at::detail::createCPUGenerator(seed);
  const double scale = options.alpha / static_cast<double>(options.rank);
  auto& layers = *model->layers;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& layer = *layers.ptr<DecoderLayerImpl>(l);
    for (const auto& name : lora_target_names()) {  // a fixed order, so the draws do not depend on `targets`' order
      if (std::find(options.targets.begin(), options.targets.end(), name) == options.targets.end()) continue;
      auto [linear, adapter] = projection(layer, name);
      const int64_t out_features = linear->weight.size(0), in_features = linear->weight.size(1);
      const auto device = linear->weight.device();
      // Kaiming-uniform with a = sqrt(5), as torch.nn.Linear and PEFT initialise A: bound 1/sqrt(K).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
      auto a = at::empty({options.rank, in_features}, torch::kFloat32).uniform_(-bound, bound, generator).to(device);
      auto b = torch::zeros({out_features, options.rank}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
      adapter->a = linear->register_parameter("lora_A", a);
      adapter->b = linear->register_parameter("lora_B", b);
      adapter->scale = scale;
    }
  }
}

bool has_lora(const Llama& model) {
  bool found = false;
  for_each_adapter(model, [&](int64_t, const std::string&, const torch::nn::Linear&, const LowRankAdapter&) { found = true; });
  return found;
}

std::vector<torch::Tensor> frozen_projection_weights(const Llama& model) {
  std::vector<torch::Tensor> weights;
  auto& layers = *model->layers;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto& layer = *layers.ptr<DecoderLayerImpl>(l);
    for (const auto& name : lora_target_names()) {
      const auto& weight = projection(layer, name).first->weight;
      if (weight.defined() && !weight.requires_grad()) weights.push_back(weight);
    }
  }
  return weights;
}

FrozenBase::FrozenBase(Llama& model) : weights_(frozen_projection_weights(model)) {
  torch::NoGradGuard no_grad;
  for (const auto& weight : weights_) {
    float32_.push_back(weight.data());
    bfloat16_.push_back(weight.data().to(torch::kBFloat16));
  }
}

void FrozenBase::use(bool bf16) {
  const auto& chosen = bf16 ? bfloat16_ : float32_;
  if (chosen.size() != weights_.size()) throw std::logic_error("FrozenBase::use: that copy was freed");
  for (size_t i = 0; i < weights_.size(); ++i) weights_[i].set_data(chosen[i]);
}

void FrozenBase::keep_only(bool bf16) {
  use(bf16);
  float32_.clear();
  bfloat16_.clear();
}

std::map<std::string, torch::Tensor> lora_state(const Llama& model) {
  std::map<std::string, torch::Tensor> state;
  for_each_adapter(model, [&](int64_t layer, const std::string& name, const torch::nn::Linear&, const LowRankAdapter& adapter) {
    state[lora_module_path(layer, name) + ".lora_A"] = adapter.a.detach();
    state[lora_module_path(layer, name) + ".lora_B"] = adapter.b.detach();
  });
  return state;
}

void load_lora_state(Llama& model, const std::map<std::string, torch::Tensor>& state, const std::string& source) {
  torch::NoGradGuard no_grad;
  size_t used = 0;
  for_each_adapter(model, [&](int64_t layer, const std::string& name, const torch::nn::Linear&, const LowRankAdapter& adapter) {
    for (const auto& [suffix, tensor] : {std::pair{".lora_A", adapter.a}, std::pair{".lora_B", adapter.b}}) {
      const std::string key = lora_module_path(layer, name) + suffix;
      const auto found = state.find(key);
      if (found == state.end()) throw std::invalid_argument(source + ": no tensor '" + key + "'");
      if (found->second.sizes() != tensor.sizes())
        throw std::invalid_argument(source + ": '" + key + "' has the wrong shape for this model's adapters");
      tensor.copy_(found->second);
      ++used;
    }
  });
  if (used != state.size())
    throw std::invalid_argument(source + ": holds " + std::to_string(state.size()) + " adapter tensors, the model has " +
                                std::to_string(used) + " (different rank or targets?)");
}

void train_token_rows(Llama& model, const std::vector<int64_t>& ids) {
  auto& table = model->embed_tokens->weight;  // [V, D]
  auto mask = torch::zeros({table.size(0), 1}, table.options().requires_grad(false));
  for (int64_t id : ids) {
    if (id < 0 || id >= table.size(0))
      throw std::invalid_argument("train_token_rows: token " + std::to_string(id) + " is outside the vocabulary");
    mask[id] = 1;
  }
  table.set_requires_grad(true);
  table.register_hook([mask](const torch::Tensor& grad) { return grad * mask.to(grad.scalar_type()); });
}

void set_token_rows(Llama& model, const std::vector<int64_t>& ids, const torch::Tensor& rows) {
  torch::NoGradGuard no_grad;
  auto& table = model->embed_tokens->weight;  // [V, D]
  table.index_copy_(0, torch::tensor(ids, torch::kLong).to(table.device()), rows.to(table.options()));
}

Llama with_low_rank_updates(const Llama& model, const std::map<std::string, torch::Tensor>& factors, double scale,
                            const std::string& source) {
  torch::NoGradGuard no_grad;
  auto parameters = model->named_parameters();
  for (const auto& [key, tensor] : factors) {
    const std::string weight = key.substr(0, key.size() - 7) + ".weight";  // less ".lora_A" / ".lora_B"
    if (!parameters.contains(weight))
      throw std::invalid_argument(source + ": adapts " + weight + ", which the model lacks (" +
                                  std::to_string(model->config().num_hidden_layers) + " layers)");
  }
  Llama merged{nullptr};
  {
    UninitializedWeights uninitialized;  // every parameter is copied below
    merged = Llama(model->config());
  }
  const auto& reference = model->embed_tokens->weight;
  merged->to(reference.device(), reference.scalar_type());
  auto targets = merged->named_parameters();
  for (auto& named : targets) named.value().copy_(parameters[named.key()]);
  for (const auto& [key, a] : factors) {
    if (key.compare(key.size() - 6, 6, "lora_A") != 0) continue;
    const std::string module = key.substr(0, key.size() - 7);
    const auto found = factors.find(module + ".lora_B");
    if (found == factors.end()) throw std::invalid_argument(source + ": " + module + " has lora_A but no lora_B");
    const auto& b = found->second;
    auto& weight = targets[module + ".weight"];
    if (b.size(0) != weight.size(0) || a.size(1) != weight.size(1))
      throw std::invalid_argument(source + ": " + module + "'s factors make a [" + std::to_string(b.size(0)) + ", " +
                                  std::to_string(a.size(1)) + "] update for a [" + std::to_string(weight.size(0)) + ", " +
                                  std::to_string(weight.size(1)) + "] weight");
    // W + s B A in float32: [N, r] x [r, K] -> [N, K]
    const auto delta = torch::matmul(b.to(weight.device(), torch::kFloat32), a.to(weight.device(), torch::kFloat32)) * scale;
    weight.copy_(weight.to(torch::kFloat32) + delta);
  }
  return merged;
}

Llama merge_lora(const Llama& model) {
  double scale = 0;  // attach_lora gives every adapter the same
  for_each_adapter(model, [&](int64_t, const std::string&, const torch::nn::Linear&, const LowRankAdapter& adapter) {
    scale = adapter.scale;
  });
  Llama merged = with_low_rank_updates(model, lora_state(model), scale, "the model's LoRA adapters");
  for (auto& parameter : merged->parameters()) parameter.set_requires_grad(true);
  return merged;
}

}  // namespace coconut
