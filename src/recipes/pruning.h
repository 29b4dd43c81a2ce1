// Pruning workflows over a trained reasoning model: the model and data the scores are measured on
// (pruning/selection.h chooses what to remove from them), and saving the pruned folder.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/example.h"
#include "data/sequences.h"
#include "model/llama.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/layout.h"
#include "text/hf_tokenizer.h"

namespace coconut {

struct ScoringDataOptions {
  std::string mode;         // empty: the mode the model was trained in (coconut.json)
  int64_t latents = -1;     // Coconut: thoughts per example (-1: the trained curriculum stage)
  int64_t samples = 64;     // first N examples, or windows of plain text (0 = all)
  int64_t batch_size = 8;
  int64_t window = 0;       // plain text: tokens a window (0: the model's context, at most kDefaultTextWindow)
};

// Sequences of the model's training layout (question, thoughts, remaining steps, answer) for the
// first `samples` examples, collated in batches of equal thought counts. Throws on an empty set.
std::vector<Batch> scoring_batches(const std::vector<Example>& examples, const Tokenizer& tokenizer,
                                   const SpecialTokenIds& special, const ReasoningSettings& settings,
                                   const ScoringDataOptions& options);

// Windows of plain text (data/text_documents.h) as batches of `batch_size` rows, every token
// labelled (mode lm), in order.
std::vector<Batch> text_batches(const std::vector<TokenizedExample>& windows, int64_t pad, int64_t batch_size);

// A model loaded for scoring (eval mode), with its tokenizer, reasoning settings and the first
// `samples` examples of a dataset in batches of its training layout: what `coconut score-layers`,
// `score-heads`, `prune` and the sweep measure on. Plain text (data/text_documents.h) gives the
// first `samples` windows of its packed documents instead, every token labelled (mode lm), and no
// examples. Without `data_path` only the model and its settings are loaded. Errors name the file
// (a missing tokenizer.json, an empty dataset, a mode whose markers the tokenizer lacks).
struct ScoringData {
  Llama model{nullptr};
  std::unique_ptr<HfTokenizer> tokenizer;
  SpecialTokenIds special;
  ReasoningSettings settings;
  std::vector<Example> examples;  // empty for plain text
  std::vector<Batch> batches;
  bool plain_text = false;
  torch::Device device = torch::kCPU;
};
ScoringData load_scoring_data(const std::string& model_dir, const std::string& data_path, const ScoringDataOptions& options,
                              std::optional<torch::ScalarType> dtype = std::nullopt, torch::Device device = torch::kCPU);

// What `coconut prune` removes, given explicitly or chosen by a score measured on scoring data:
// layers (explicit, or the best block of `drop_block` layers by `layer_score`), query heads
// (explicit, or a fraction by `head_metric` importance under the GQA rules of choose_heads) and MLP
// channels (every layer cut to `mlp_width` channels, or to the widest width whose FLOPs per token at
// `flops_context` are at most `mlp_flops_ratio` of the model's, by `channel_metric` importance).
// Everything is chosen on the original model, with its layer, head and channel indices.
struct PruneRequest {
  std::set<int64_t> layers;
  HeadSelection heads;
  int64_t drop_block = 0;
  LayerScoreRequest layer_score;  // its one score, positions, ablation metric (device: the data's)
  double head_fraction = 0;
  std::string head_granularity = "query", head_metric = "grad";
  int64_t mlp_width = 0;         // 0: no width cut (unless mlp_flops_ratio)
  double mlp_flops_ratio = 0;    // 0: none
  int64_t flops_context = 256;
  std::string channel_metric = "activation";
};

struct PruneResult {
  Llama model{nullptr};  // the new, smaller model (the source is untouched)
  std::set<int64_t> layers;
  HeadSelection heads;                       // less those of removed layers
  ChannelSelection mlp_channels;             // less those of removed layers
  std::vector<std::string> notes;            // e.g. "layer 3 is removed whole, so its head removals are moot"
};

// Chooses, then builds the pruned model by surgery (heads, channels, then layers). Scores need
// `source` loaded with data (load_scoring_data).
PruneResult prune_model(ScoringData& source, const PruneRequest& request);

// Saves a model derived from `source_dir` (pruned) as an HF folder at `out`, with the source's
// tokenizer, reasoning settings (coconut.json) and other side files, so it evaluates and heals as
// the source did (one that ran on its GGUF file's blocks, coconut.json weights gguf, runs q8_0).
void save_derived_model(Llama& model, const std::string& source_dir, const std::string& out);

// A [rows, columns] tensor as rows of doubles (NaN stays NaN), for plots and JSON, and back
// (rows of unequal length leave NaN where a row is short).
std::vector<std::vector<double>> tensor_rows(const torch::Tensor& values);
torch::Tensor tensor_from_rows(const std::vector<std::vector<double>>& rows);

}  // namespace coconut
