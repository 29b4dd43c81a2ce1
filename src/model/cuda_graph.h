// One step's GPU work captured once as a CUDA graph (at::cuda::CUDAGraph) and replayed: a decode
// step of a small batch is launch-bound (hundreds of kernels of microseconds each, each launched
// from the host), and a replay launches them all at once. The step must read and write only
// tensors that outlive the graph at fixed addresses (its inputs are refilled in place between
// replays), synchronise nothing with the host, and allocate only inside the capture (from the
// graph's own pool). Host-side effects of the captured code happen once, at capture: a caller
// that keeps host state (a KV cache's length) advances it itself for each replay.
//
// Built where libtorch has CUDA (COCONUT_WITH_CUDA); elsewhere available() is false.
#pragma once

#include <functional>
#include <memory>

namespace coconut {

class CapturedStep {
 public:
  // Whether this build can capture CUDA graphs.
  static bool available();

  // Runs `warm_up` on a side stream (library handles and workspaces are created there, outside the
  // capture; it must leave every state it reads unchanged), then captures `step` on that stream.
  // The captured kernels have not run: call replay() for the first step too. Throws
  // std::runtime_error where !available().
  CapturedStep(const std::function<void()>& warm_up, const std::function<void()>& step);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Launches the captured kernels on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace coconut
