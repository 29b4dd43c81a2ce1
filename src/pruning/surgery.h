// Structural pruning as passes that build a new, physically smaller model from an existing one
// (the original is left untouched), and its converse, depth expansion. The result's config is an
// ordinary LlamaConfig: uniform results are plain HF Llama configs, non-uniform ones carry the
// per-layer head / KV-head arrays.
//
// Grouped-query attention: query head h of a layer belongs to KV group h / R (R = H / G query
// heads per KV head), as in HF's repeat_kv layout. Removing query heads keeps, in every remaining
// group, the same number of query heads (so H stays a multiple of G); a group whose query heads
// are all removed is removed with its K/V head.
#pragma once

#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"

namespace coconut {

// layer -> query heads to remove (indices within that layer).
using HeadSelection = std::map<int64_t, std::set<int64_t>>;

// The config after removing `layers` (the others keep their order and per-layer sizes). Throws
// std::invalid_argument on an out-of-range layer or when every layer would go.
LlamaConfig config_without_layers(const LlamaConfig& config, const std::set<int64_t>& layers);
Llama drop_layers(Llama& model, const std::set<int64_t>& layers);

// The config after removing query heads; throws std::invalid_argument naming the layer when the
// groups left would hold unequal numbers of query heads or when a layer would lose every head.
LlamaConfig config_without_heads(const LlamaConfig& config, const HeadSelection& heads);
Llama drop_heads(Llama& model, const HeadSelection& heads);

// MLP width: layer -> intermediate channels to remove (indices within that layer; channel c is
// row c of gate_proj and up_proj and column c of down_proj). Removing a channel is exactly the
// model with its activation silu(gate_c) * up_c masked to zero (mlp_channel_mask_for). Throws
// std::invalid_argument naming the layer on an out-of-range layer or channel, or when a layer would
// lose every channel. A result whose layers all keep the same width is a plain HF Llama config.
using ChannelSelection = std::map<int64_t, std::set<int64_t>>;
LlamaConfig config_without_mlp_channels(const LlamaConfig& config, const ChannelSelection& channels);
Llama drop_mlp_channels(Llama& model, const ChannelSelection& channels);

// [L, F_max] multipliers with 0 at the given channels (1 elsewhere): ForwardOptions::mlp_channel_mask.
torch::Tensor mlp_channel_mask_for(const LlamaConfig& config, const ChannelSelection& channels);

// Depth expansion (block expansion, LLaMA Pro, Wu et al. 2024): after each layer listed in `after`
// (indices of the original model, ascending or not; a layer listed twice gets two copies) a copy of
// that layer with its output projections (o_proj, down_proj and their biases) set to zero. A copy
// adds nothing to the residual stream, so the grown model computes exactly what the original did,
// and training goes on from there with the copies' projections receiving gradients. Throws
// std::invalid_argument on an out-of-range layer or an empty list.
LlamaConfig config_with_layer_copies(const LlamaConfig& config, const std::vector<int64_t>& after);
Llama expand_layers(Llama& model, const std::vector<int64_t>& after);

// Whole KV groups: layer -> groups to remove (each with its R query heads).
HeadSelection heads_of_groups(const LlamaConfig& config, const std::map<int64_t, std::set<int64_t>>& groups);

// "3:0,3:5,7:1" -> {3: {0, 5}, 7: {1}} (layer:index pairs); throws std::invalid_argument on bad text.
std::map<int64_t, std::set<int64_t>> parse_layer_index_pairs(const std::string& text);
// "5,6,7" -> {5, 6, 7}
std::set<int64_t> parse_index_list(const std::string& text);

// [L, H_max] multipliers with 0 at the given heads (1 elsewhere): the masked model that the
// physically pruned one must equal.
torch::Tensor head_mask_for(const LlamaConfig& config, const HeadSelection& heads);

}  // namespace coconut
