// KV cache: per layer K and V [B, G, S, Dh], plus which of the S columns are real tokens.
//
// Four storage modes:
//  - preallocated (inference): capacity columns allocated once, each call writes its columns in
//    place; use under torch::NoGradGuard / InferenceMode.
//  - fixed (inference, for CUDA-graph replay): preallocated, but every call sees all `capacity`
//    columns (unwritten ones masked) and writes at columns held in a device tensor, so a decode step
//    has the same tensor shapes and addresses every time and no host synchronisation: what a graph
//    captured once can replay. Same outputs as preallocated (masked columns weigh exactly 0).
//  - growing (training, Coconut): each call concatenates out of place, so the cache stays part of
//    the autograd graph and gradients flow through earlier columns.
//  - per row (continuous batching): preallocated like the first, but every row is its own sequence
//    with its own length, so a row can start over while the others go on (a server's slots). A
//    forward runs on a contiguous range of rows (select_rows); each selected row either takes part
//    with all its new columns (attention mask all 1) or sits the call out (all 0: nothing written,
//    its length unchanged, its output meaningless).
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
  // Inference cache of fixed shapes (see above).
  static KVCache fixed(const LlamaConfig& config, int64_t batch, int64_t capacity, torch::ScalarType dtype,
                       torch::Device device);
  // Training cache that grows by concatenation.
  static KVCache growing(const LlamaConfig& config);
  // Continuous-batching cache: `rows` independent sequences of up to `capacity` columns each.
  static KVCache per_row(const LlamaConfig& config, int64_t rows, int64_t capacity, torch::ScalarType dtype,
                         torch::Device device);

  int64_t length() const;  // columns written so far (not defined per row: see row_length)
  int64_t capacity() const { return capacity_; }
  bool is_preallocated() const { return preallocated_; }
  bool is_per_row() const { return per_row_; }
  bool has_fixed_shapes() const { return fixed_; }

  // Per row: the next forward's batch row b is cache row first + b, for b < count.
  void select_rows(int64_t first, int64_t count);
  int64_t row_length(int64_t row) const;
  // Per row: empties `row` for a new sequence (its old columns are never read again).
  void reset_row(int64_t row);
  // The cache column each of the next `time` positions occupies: [1, T] (one length for all rows)
  // or [B, T] (per row). A position attends to the real columns up to its own.
  torch::Tensor new_columns(int64_t time, torch::Device device) const;

  // Stores this call's k/v [B, G, T, Dh] for `layer` at columns [length, length + T) and
  // returns all columns so far [B, G, length + T, Dh]. Does not advance length().
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  // Records the new columns' padding mask [B, T] (bool, true = real) and returns the mask of all
  // columns [B, length + T] (per row: [B, S], S the longest taking part row's length + T, each row
  // true up to its own length + T). Call once per forward, before the layers.
  torch::Tensor append_key_mask(const torch::Tensor& new_mask);
  // The written columns of `layer`: K and V [B, G, length, Dh].
  std::pair<torch::Tensor, torch::Tensor> columns(int64_t layer) const {
    const auto index = static_cast<size_t>(layer);
    return {keys_[index].narrow(2, 0, length()), values_[index].narrow(2, 0, length())};
  }
  // Preallocated: the whole K or V storage of `layer` [B, G, capacity, Dh], of which columns
  // [0, length()) are written; for a caller that writes the next columns itself as append would
  // (model/cpu_decode.h).
  const torch::Tensor& key_storage(int64_t layer) const { return keys_[static_cast<size_t>(layer)]; }
  const torch::Tensor& value_storage(int64_t layer) const { return values_[static_cast<size_t>(layer)]; }
  // For that caller, after append_key_mask: batch row b's row of the storage (per row: the first
  // selected row + b), the column its new K/V go to (-1: per row, a row sitting the call out),
  // and the columns S the call's queries see (the mask's width).
  int64_t storage_row(int64_t batch_row) const { return per_row_ ? first_row_ + batch_row : batch_row; }
  int64_t write_column(int64_t batch_row) const;
  int64_t visible_columns(int64_t new_columns) const { return per_row_ ? visible_columns_ : length_ + new_columns; }
  // Hides written columns [0, end) of the rows where `rows` [B] (bool) is true from every later
  // forward's queries (their K/V stay; the columns written meanwhile saw them). Not per row.
  void hide_prefix(const torch::Tensor& rows, int64_t end);
  // Per row: hides the row's columns [0, end) from its later queries (until reset_row).
  void hide_row_prefix(int64_t row, int64_t end);
  // Marks the T columns of the last forward as written (per row: of the rows that took part).
  void advance(int64_t new_columns);
  // Fixed: a replayed CUDA graph wrote `new_columns` more (its captured advance moved the device's
  // column; this moves the host's count, which the replay does not run).
  void count_replayed_columns(int64_t new_columns);
  // Keeps only the first `length` columns (e.g. to rewind a speculative step).
  void truncate(int64_t length);
  // A one-row preallocated cache becomes `rows` copies of that row (its columns, mask and length),
  // e.g. a context run once and then continued in several ways. Not fixed, not per row.
  void repeat_row(int64_t rows);

 private:
  std::vector<torch::Tensor> keys_, values_;
  torch::Tensor key_mask_;  // [B, capacity] bool (preallocated) or [B, length] (growing)
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  bool preallocated_ = false;
  bool fixed_ = false;
  torch::Tensor next_column_;  // fixed: [1] int64 on the cache's device, equal to length_
  torch::Tensor write_index_;  // fixed: [T] the columns this forward writes (append_key_mask)
  // Per row: each row's length, the selected range, and the last append_key_mask's rows taking
  // part (batch-local indices [P]) and the columns S the call sees; for index_put_ (GPU, autograd)
  // the same as tensors, with the cache rows [P, 1] and columns [P, T] they write (built by append).
  bool per_row_ = false;
  std::vector<int64_t> row_lengths_;
  std::vector<int64_t> row_hidden_ends_;  // per row: columns [0, end) hidden (hide_row_prefix)
  int64_t first_row_ = 0, row_count_ = 0;
  std::vector<int64_t> taking_part_;
  torch::Tensor taking_part_index_, write_rows_, write_columns_;
  int64_t visible_columns_ = 0;
};

}  // namespace coconut
