// Data parallelism over libtorch's c10d process groups: Gloo for CPU tensors, NCCL for CUDA ones
// (where this libtorch was built with it). One `ProcessGroup` per process; every rank must call
// the collectives in the same order.
//
// A run is distributed when the environment says so, as torchrun sets it: RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT (GLOO_SOCKET_IFNAME picks a network interface).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace coconut {

struct DistributedEnvironment {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool distributed() const { return world_size > 1; }
};

// Reads the torchrun variables; a single process when WORLD_SIZE is unset. Bad values name the variable.
DistributedEnvironment distributed_environment_from_env();

// Whether this build can form a process group on `device` (Gloo for CPU, NCCL for CUDA).
bool distributed_supported(torch::Device device);

class ProcessGroup {
 public:
  // Rendezvous through a TCP store on master_addr:master_port (rank 0 serves it). Blocks until all
  // ranks joined or `timeout_seconds` passed.
  ProcessGroup(const DistributedEnvironment& environment, torch::Device device, double timeout_seconds = 1800);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return environment_.rank; }
  int world_size() const { return environment_.world_size; }
  std::string backend() const;

  // In place: the sum over ranks of each tensor (all on this group's device).
  void all_reduce_sum(std::vector<torch::Tensor>& tensors);
  // In place: rank `root`'s values everywhere.
  void broadcast(std::vector<torch::Tensor>& tensors, int root = 0);
  // `input` [W * c] on every rank; `output` [c] receives the sum over ranks of input's chunk `rank`.
  void reduce_scatter_sum(torch::Tensor& output, torch::Tensor& input);
  // `input` [c] on every rank; `output` [W * c] receives rank r's input as chunk r.
  void all_gather(torch::Tensor& output, torch::Tensor& input);
  void barrier();

 private:
  struct Backend;
  DistributedEnvironment environment_;
  std::unique_ptr<Backend> backend_;
};

// Gradient averaging for data parallelism: the gradients of `parameters` that require one are
// summed over ranks in flat buckets of at most `bucket_elements` and divided by the world size.
// A parameter without a gradient on this rank counts as zero (so every rank reduces the same buckets).
void average_gradients(ProcessGroup& group, const std::vector<torch::Tensor>& parameters,
                       int64_t bucket_elements = 16 * 1024 * 1024);

// Rank 0's parameter values on every rank (start of training).
void broadcast_parameters(ProcessGroup& group, const std::vector<torch::Tensor>& parameters);

}  // namespace coconut
