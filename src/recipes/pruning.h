// Pruning workflows over a trained reasoning model: the data the scores are measured on, layer
// ablation by physical removal, and the choice of what to remove from a score.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "data/example.h"
#include "data/sequences.h"
#include "model/llama.h"
#include "pruning/surgery.h"
#include "reasoning/layout.h"
#include "text/tokenizer.h"

namespace coconut {

struct ScoringDataOptions {
  std::string mode;         // empty: the mode the model was trained in (coconut.json)
  int64_t latents = -1;     // Coconut: thoughts per example (-1: the trained curriculum stage)
  int64_t samples = 64;     // first N examples (0 = all)
  int64_t batch_size = 8;
};

// Sequences of the model's training layout (question, thoughts, remaining steps, answer) for the
// first `samples` examples, collated in batches of equal thought counts. Throws on an empty set.
std::vector<Batch> scoring_batches(const std::vector<Example>& examples, const Tokenizer& tokenizer,
                                   const SpecialTokenIds& special, const ReasoningSettings& settings,
                                   const ScoringDataOptions& options);

// Saves a model derived from `source_dir` (pruned) as an HF folder at `out`, with the source's
// tokenizer, reasoning settings (coconut.json) and other side files, so it evaluates and heals as
// the source did.
void save_derived_model(Llama& model, const std::string& source_dir, const std::string& out);

// A [rows, columns] tensor as rows of doubles (NaN stays NaN), for plots and JSON, and back
// (rows of unequal length leave NaN where a row is short).
std::vector<std::vector<double>> tensor_rows(const torch::Tensor& values);
torch::Tensor tensor_from_rows(const std::vector<std::vector<double>>& rows);

struct BlockScore {
  int64_t start = 0, size = 1;  // layers [start, start + size)
  double score = 0;
};

// The metric of the model with each block of each size removed (physically: drop_layers).
std::vector<BlockScore> layer_ablation(Llama& model, const std::vector<int64_t>& block_sizes,
                                       const std::function<double(Llama&)>& metric);

// Blocks of `size` from an angular-distance matrix [L, L] (entry [n-1][l]).
std::vector<BlockScore> blocks_from_angular(const torch::Tensor& distances, const std::vector<int64_t>& block_sizes);

// Which layers to remove:
//   angular: the block of `size` with the smallest distance (Gromov et al.)
//   bi:      the `size` layers of lowest block influence, contiguous or not (ShortGPT)
//   ablation: the block whose removal scores best (`higher_is_better`: accuracy; else loss)
std::set<int64_t> layers_to_drop_by_angular(const torch::Tensor& distances, int64_t size);
std::set<int64_t> layers_to_drop_by_influence(const torch::Tensor& influence, int64_t size);
std::set<int64_t> layers_to_drop_by_ablation(const std::vector<BlockScore>& scores, int64_t size, bool higher_is_better);

// Which heads to remove for a fraction of all query heads, least important first, keeping every
// layer valid: granularity "query" removes one query head from every KV group of a layer at a time
// (the least important of each group) and keeps at least one per group (with one query head per
// KV head, as in multi-head attention, a head goes with its K/V head); "kv-group" removes whole
// groups and keeps at least one per layer. `importance` [L, H_max] (query) or [L, G_max] (groups),
// larger = more important.
HeadSelection heads_to_drop(const LlamaConfig& config, const torch::Tensor& importance, double fraction,
                            const std::string& granularity);

}  // namespace coconut
