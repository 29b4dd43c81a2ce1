#pragma once
// bfloat16 autocast for a scope, on CPU or CUDA, with libtorch 1.13 and 2.x alike.

#include <torch/types.h>

namespace coconut {

// Matrix products in bfloat16 inside, float32 master weights. Each weight matrix is cast once per
// scope (autocast's cast cache: every later product with it, a Coconut step's thought passes
// included, shares that copy, and autograd keeps it once); the cache is cleared on entry and on
// exit, since the weights change after every optimizer step. A disabled scope does nothing.
class AutocastScope {
 public:
  AutocastScope(bool enabled, torch::Device device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  torch::Device device_;
};

// Whether bf16 autocast is on for `device`'s type on the calling thread.
bool autocast_enabled(torch::Device device);

// Sets bf16 autocast on or off for a scope and puts back what was there before (activation
// checkpointing recomputes a layer in the autocast state of its forward, whatever the state where
// backward runs). Where it turned autocast on from off, it clears the cast cache on exit; inside a
// scope the cache is the scope's.
class AutocastRestore {
 public:
  AutocastRestore(bool enabled, torch::Device device);
  ~AutocastRestore();
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  bool enabled_;
  bool previous_;
  torch::Device device_;
};

}  // namespace coconut
