// KV cache: per layer K and V [B, G, S, Dh], plus which of the S columns are real tokens.
//
// Two storage modes:
//  - preallocated (inference): capacity columns allocated once, each call writes its columns in
//    place; use under torch::NoGradGuard / InferenceMode.
//  - growing (training, Coconut): each call concatenates out of place, so the cache stays part of
//    the autograd graph and gradients flow through earlier columns.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/config.h"

namespace coconut {

// The dtype attention runs in (and the cache stores): the model dtype, except on CPU where
// libtorch's half-precision batched matrix products are slow (bf16) or missing (f16), so
// attention runs in float32 there. K and V values are still the model dtype's values (widened
// exactly); scores and the weighted sum are then computed without intermediate rounding.
torch::ScalarType attention_dtype(torch::ScalarType model_dtype, torch::Device device);

class KVCache {
 public:
  // Inference cache with room for `capacity` columns.
  static KVCache preallocated(const LlamaConfig& config, int64_t batch, int64_t capacity,
                              torch::ScalarType dtype, torch::Device device);
  // Training cache that grows by concatenation.
  static KVCache growing(const LlamaConfig& config);

  int64_t length() const { return length_; }  // columns written so far
  int64_t capacity() const { return capacity_; }
  bool is_preallocated() const { return preallocated_; }

  // Stores this call's k/v [B, G, T, Dh] for `layer` at columns [length, length + T) and
  // returns all columns so far [B, G, length + T, Dh]. Does not advance length().
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  // Records the new columns' padding mask [B, T] (bool, true = real) and returns the mask of all
  // columns [B, length + T]. Call once per forward, before the layers.
  torch::Tensor append_key_mask(const torch::Tensor& new_mask);
  // The written columns of `layer`: K and V [B, G, length, Dh].
  std::pair<torch::Tensor, torch::Tensor> columns(int64_t layer) const {
    const auto index = static_cast<size_t>(layer);
    return {keys_[index].narrow(2, 0, length_), values_[index].narrow(2, 0, length_)};
  }
  // Marks the T columns of the last forward as written.
  void advance(int64_t new_columns) { length_ += new_columns; }
  // Keeps only the first `length` columns (e.g. to rewind a speculative step).
  void truncate(int64_t length);

 private:
  std::vector<torch::Tensor> keys_, values_;
  torch::Tensor key_mask_;  // [B, capacity] bool (preallocated) or [B, length] (growing)
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  bool preallocated_ = false;
};

}  // namespace coconut
