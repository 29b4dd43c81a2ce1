#include "distributed/process_group.h"

#include <torch/version.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#if COCONUT_WITH_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif
#if COCONUT_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace coconut {

namespace {

int integer_from_env(const char* name, int fallback, int minimum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < minimum || value > 1 << 20)
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + text +
                                "' is not an integer >= " + std::to_string(minimum));
  return static_cast<int>(value);
}

}  // namespace

DistributedEnvironment distributed_environment_from_env() {
  DistributedEnvironment environment;
  environment.world_size = integer_from_env("WORLD_SIZE", 1, 1);
  environment.rank = integer_from_env("RANK", 0, 0);
  environment.local_rank = integer_from_env("LOCAL_RANK", environment.rank, 0);
  if (environment.rank >= environment.world_size)
    throw std::invalid_argument("environment: RANK=" + std::to_string(environment.rank) + " is not below WORLD_SIZE=" +
                                std::to_string(environment.world_size));
  if (environment.distributed()) {
    const char* address = std::getenv("MASTER_ADDR");
    if (address == nullptr || *address == '\0')
      throw std::invalid_argument("environment: WORLD_SIZE > 1 needs MASTER_ADDR (and MASTER_PORT), as torchrun sets them");
    environment.master_addr = address;
    environment.master_port = integer_from_env("MASTER_PORT", 29500, 1);
  }
  return environment;
}

bool distributed_supported(torch::Device device) {
  return device.is_cuda() ? COCONUT_WITH_NCCL != 0 : COCONUT_WITH_GLOO != 0;
}

#if COCONUT_WITH_GLOO
#if TORCH_VERSION_MAJOR >= 2
using GroupBase = c10d::Backend;  // 2.x: Gloo and NCCL are backends of a process group
#else
using GroupBase = c10d::ProcessGroup;
#endif

struct ProcessGroup::Backend {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<GroupBase> group;
  std::string name;
};

ProcessGroup::ProcessGroup(const DistributedEnvironment& environment, torch::Device device, double timeout_seconds)
    : environment_(environment), backend_(std::make_unique<Backend>()) {
  if (!distributed_supported(device))
    throw std::runtime_error("this build has no " + std::string(device.is_cuda() ? "NCCL" : "Gloo") +
                             " process group for device " + device.str());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(environment.master_port);
  store_options.isServer = environment.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(environment.world_size);
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  backend_->store = c10::make_intrusive<c10d::TCPStore>(environment.master_addr, store_options);
#if COCONUT_WITH_NCCL
  if (device.is_cuda()) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    backend_->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(backend_->store, environment.rank,
                                                                   environment.world_size, options);
    backend_->name = "nccl";
    return;
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface != nullptr && *interface != '\0')
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  else if (environment.master_addr == "127.0.0.1" || environment.master_addr == "localhost")
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));  // one machine: loopback
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  options->threads = 2;
  backend_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(backend_->store, environment.rank,
                                                                environment.world_size, options);
  backend_->name = "gloo";
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend() const { return backend_->name; }

void ProcessGroup::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  backend_->group->allreduce(tensors, options)->wait();
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int root) {
  c10d::BroadcastOptions options;
  options.rootRank = root;
  backend_->group->broadcast(tensors, options)->wait();
}

void ProcessGroup::reduce_scatter_sum(torch::Tensor& output, torch::Tensor& input) {
  if (input.numel() != output.numel() * world_size())
    throw std::invalid_argument("reduce_scatter_sum: input of " + std::to_string(input.numel()) + " values for " +
                                std::to_string(world_size()) + " chunks of " + std::to_string(output.numel()));
#if TORCH_VERSION_MAJOR >= 2
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  backend_->group->_reduce_scatter_base(output, input, options)->wait();
#else  // 1.x Gloo has no reduce-scatter: the whole sum, then this rank's chunk
  std::vector<torch::Tensor> whole = {input};
  all_reduce_sum(whole);
  output.copy_(input.narrow(0, output.numel() * rank(), output.numel()));
#endif
}

void ProcessGroup::all_gather(torch::Tensor& output, torch::Tensor& input) {
  if (output.numel() != input.numel() * world_size())
    throw std::invalid_argument("all_gather: output of " + std::to_string(output.numel()) + " values for " +
                                std::to_string(world_size()) + " chunks of " + std::to_string(input.numel()));
#if TORCH_VERSION_MAJOR >= 2
  backend_->group->_allgather_base(output, input)->wait();
#else
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < world_size(); ++r) outputs[0].push_back(output.narrow(0, input.numel() * r, input.numel()));
  std::vector<torch::Tensor> inputs = {input};
  backend_->group->allgather(outputs, inputs)->wait();
#endif
}

void ProcessGroup::barrier() { backend_->group->barrier()->wait(); }

#else  // no c10d in this build

struct ProcessGroup::Backend {};

ProcessGroup::ProcessGroup(const DistributedEnvironment& environment, torch::Device device, double)
    : environment_(environment) {
  throw std::runtime_error("this build of coconut has no c10d process groups (Gloo headers were not found at "
                           "configure time); data-parallel training on " + device.str() + " is unavailable");
}
ProcessGroup::~ProcessGroup() = default;
std::string ProcessGroup::backend() const { return "none"; }
void ProcessGroup::all_reduce_sum(std::vector<torch::Tensor>&) {}
void ProcessGroup::broadcast(std::vector<torch::Tensor>&, int) {}
void ProcessGroup::reduce_scatter_sum(torch::Tensor&, torch::Tensor&) {}
void ProcessGroup::all_gather(torch::Tensor&, torch::Tensor&) {}
void ProcessGroup::barrier() {}

#endif

void average_gradients(ProcessGroup& group, const std::vector<torch::Tensor>& parameters, int64_t bucket_elements) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> trainable;
  for (const auto& parameter : parameters)
    if (parameter.requires_grad()) trainable.push_back(parameter);
  const double scale = 1.0 / group.world_size();
  size_t begin = 0;
  while (begin < trainable.size()) {
    // One bucket: consecutive parameters of one dtype and device, up to bucket_elements values.
    size_t end = begin;
    int64_t elements = 0;
    while (end < trainable.size() && (end == begin || (elements + trainable[end].numel() <= bucket_elements &&
                                                       trainable[end].scalar_type() == trainable[begin].scalar_type() &&
                                                       trainable[end].device() == trainable[begin].device()))) {
      elements += trainable[end].numel();
      ++end;
    }
    std::vector<torch::Tensor> pieces;
    for (size_t i = begin; i < end; ++i) {
      auto& parameter = trainable[i];
      pieces.push_back(parameter.grad().defined() ? parameter.grad().reshape({-1}) : torch::zeros({parameter.numel()}, parameter.options()));
    }
    std::vector<torch::Tensor> flat = {torch::cat(pieces)};  // [elements]
    group.all_reduce_sum(flat);
    flat[0].mul_(scale);
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      auto& parameter = trainable[i];
      auto averaged = flat[0].narrow(0, offset, parameter.numel()).view(parameter.sizes());
      if (parameter.grad().defined())
        parameter.mutable_grad().copy_(averaged);
      else
        parameter.mutable_grad() = averaged.clone();
      offset += parameter.numel();
    }
    begin = end;
  }
}

void broadcast_parameters(ProcessGroup& group, const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  for (const auto& parameter : parameters) {
    std::vector<torch::Tensor> one = {parameter.detach()};
    group.broadcast(one, 0);
  }
}

}  // namespace coconut
