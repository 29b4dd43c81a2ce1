#include "model/cuda_graph.h"

#include <stdexcept>

#if COCONUT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace coconut {

#if COCONUT_WITH_CUDA

struct CapturedStep::Impl {
  at::cuda::CUDAGraph graph;
};

bool CapturedStep::available() { return true; }

CapturedStep::CapturedStep(const std::function<void()>& warm_up, const std::function<void()>& step)
    : impl_(std::make_unique<Impl>()) {
  // Graphs are captured on a stream other than the default one; the side stream first waits for
  // the work already queued on the current stream (the prompt's pass wrote the cache it reads).
  const auto current = c10::cuda::getCurrentCUDAStream();
  const auto side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    warm_up();
    side.synchronize();  // capture begins with nothing in flight
    impl_->graph.capture_begin();
    step();
    impl_->graph.capture_end();
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(current);
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::replay() { impl_->graph.replay(); }

#else

struct CapturedStep::Impl {};

bool CapturedStep::available() { return false; }

CapturedStep::CapturedStep(const std::function<void()>&, const std::function<void()>&) {
  throw std::runtime_error("CUDA graphs: this build's libtorch has no CUDA");
}

CapturedStep::~CapturedStep() = default;

void CapturedStep::replay() {}

#endif

}  // namespace coconut
