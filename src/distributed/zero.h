// ZeRO stage 2 (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models") over c10d: data parallelism in which each of the W ranks keeps AdamW's two
// moments, a float32 master copy and the averaged gradients of 1/W of the trainable parameters.
//
// Layout. The trainable parameters of each optimizer group, last first (the order backward yields
// their gradients in), fill buckets of at most `bucket_elements` values, one dtype and device each.
// A bucket of n values is cut into W chunks of c = ceil(n / W) (the last one padded with zeros);
// rank r owns chunk r of every bucket. Only c depends on W, so a checkpoint written by W ranks is
// read back by any other number of them.
//
// One optimizer step:
// - during backward, a hook after each parameter's gradient is accumulated counts down its bucket;
//   a complete bucket (once every bucket before it is done, so that all ranks call the collectives
//   in one order) is reduce-scattered: its gradients are flattened, summed over the ranks chunk by
//   chunk, this rank's chunk / W is added to the shard's gradient, and the parameters' gradients
//   are freed. finish_backward() reduces what is left: every rank calls it after every micro-batch
//   (a rank without one too); a parameter without a gradient counts as zero;
// - clip_grad_norm(): the global L2 norm from the shards (one all-reduce); the shards are scaled
//   as torch::nn::utils::clip_grad_norm_ scales gradients;
// - step(): libtorch's AdamW on this rank's chunks (one optimizer group per original group, with its
//   options), then every bucket's chunks are all-gathered back into the parameters.
// With gradient accumulation the shard gradients add up over the step's micro-batches. A single
// process (no group) is W = 1: the same code, no collectives.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace coconut {

inline constexpr const char* kZeroIndexFile = "optimizer_shards.json";

// "optimizer-rank-00001-of-00004.safetensors"
std::string zero_shard_file_name(int rank, int world_size);

class ZeroOptimizer {
 public:
  // The parameters, groups and options of `layout` (as the unsharded run would build it); `group`
  // may be null (one process). The parameters must be equal on every rank already.
  ZeroOptimizer(ProcessGroup* group, const torch::optim::AdamW& layout, int64_t bucket_elements = int64_t{1} << 24);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // AdamW over this rank's chunks, one group per group of `layout`: set learning rates here.
  torch::optim::AdamW& shard_optimizer() { return *optimizer_; }
  void finish_backward();
  // The norm of the averaged gradients before clipping; max_norm <= 0 only measures.
  double clip_grad_norm(double max_norm);
  // AdamW on the shards, the parameters gathered back, the shard gradients zeroed.
  void step();
  // Fresh moments, as a new optimizer (a stage switch).
  void reset_state();

  // Checkpoints: every rank writes its shard into `directory`; rank 0 also writes the index.
  void save(const std::filesystem::path& directory) const;
  // From a checkpoint written by any number of ranks; errors name the file and the mismatch.
  void load(const std::filesystem::path& directory);

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  int64_t shard_elements() const;                   // values this rank owns (padding included)
  int64_t buckets_reduced_in_backward() const { return reduced_in_backward_; }  // by the hooks, since construction

 private:
  struct Bucket {
    std::vector<torch::Tensor> parameters;
    std::vector<int64_t> offsets;  // of each parameter in the bucket's flat values
    int64_t elements = 0, chunk = 0;
    size_t group = 0;
    int64_t pending = 0;  // parameters whose gradient this backward has not produced yet
    torch::Tensor master;  // [chunk] float32 leaf: this rank's values; its grad is the shard's gradient
  };
  struct Hook;

  void on_gradient(size_t bucket);
  void reduce(size_t bucket);
  void make_shard_optimizer();
  nlohmann::json index_json() const;

  ProcessGroup* group_;
  int rank_ = 0, world_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<std::unique_ptr<torch::optim::AdamWOptions>> group_options_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  size_t next_to_reduce_ = 0;
  int64_t reduced_in_backward_ = 0;
  bool in_finish_ = false;
};

}  // namespace coconut
