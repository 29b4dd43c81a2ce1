// What to prune, chosen from scores: layer scores (angular distance, block influence, measured
// ablation) measured once per model and read by whichever score a run asks for, and the heads to
// remove for a fraction of all query heads. Used alike by `coconut prune`/`score-layers`, the
// sweep and the demo.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "model/llama.h"
#include "pruning/scores.h"
#include "pruning/surgery.h"

namespace coconut {

enum class LayerScore {
  kAngular,         // the block of k consecutive layers whose input and output are closest (Gromov et al.)
  kBlockInfluence,  // the k layers of least block influence, contiguous or not (ShortGPT)
  kAblation,        // the block of k layers whose removal hurts a measured metric least
};
// "angular" | "bi" | "ablation" (the names of the CLI, the sweep's YAML and its results.csv).
LayerScore layer_score_from_name(const std::string& name);
std::string layer_score_name(LayerScore score);

struct BlockScore {
  int64_t start = 0, size = 1;  // layers [start, start + size)
  double score = 0;
};

// What to measure. Ablation needs a metric (loss or accuracy of a model: the pruned one, and the
// unpruned one for the baseline) and the block sizes to remove.
struct LayerScoreRequest {
  std::vector<LayerScore> scores;
  ScorePositions positions = ScorePositions::kLastToken;  // where angular distance is measured
  std::vector<int64_t> ablation_sizes = {1};
  std::function<double(Llama&)> ablation_metric;
  bool ablation_higher_is_better = false;  // accuracy: true; loss: false
  std::function<void(const BlockScore&)> on_ablated_block;  // progress, optional
  torch::Device device = torch::kCPU;
};

// One model's layer scores; those not requested stay empty (undefined tensors, no blocks).
struct LayerScores {
  torch::Tensor angular;             // [L, L] float64, entry [n - 1][l] (angular_distances)
  torch::Tensor influence;           // [L] float64 (block_influence)
  std::vector<BlockScore> ablation;  // every block of every requested size
  double ablation_baseline = std::nan("");
  bool ablation_higher_is_better = false;
};

LayerScores measure_layer_scores(Llama& model, const std::vector<Batch>& batches, const LayerScoreRequest& request);

// The `count` layers to remove by `score`; throws when that score was not measured (or, for
// ablation, not for blocks of `count` layers) or when `count` is not in 1..L-1.
std::set<int64_t> choose_layers(const LayerScores& scores, LayerScore score, int64_t count);

// The metric of the model with each block of each size removed (physically: drop_layers);
// `on_block` (optional) hears of each block as soon as it is measured.
std::vector<BlockScore> layer_ablation(Llama& model, const std::vector<int64_t>& block_sizes,
                                       const std::function<double(Llama&)>& metric,
                                       const std::function<void(const BlockScore&)>& on_block = {});

// Blocks of `size` from an angular-distance matrix [L, L] (entry [n-1][l]).
std::vector<BlockScore> blocks_from_angular(const torch::Tensor& distances, const std::vector<int64_t>& block_sizes);

// The three rules choose_layers applies:
//   angular: the block of `size` with the smallest distance
//   influence: the `size` layers of lowest block influence
//   ablation: the block whose removal scores best (`higher_is_better`: accuracy; else loss)
std::set<int64_t> layers_to_drop_by_angular(const torch::Tensor& distances, int64_t size);
std::set<int64_t> layers_to_drop_by_influence(const torch::Tensor& influence, int64_t size);
std::set<int64_t> layers_to_drop_by_ablation(const std::vector<BlockScore>& scores, int64_t size, bool higher_is_better);

// Head importance for choose_heads, per query head [L, H_max] and per KV group [L, G_max], larger =
// more important: "grad" (Michel et al., head_gradient_importance) or "ablation" (how much the loss
// rises without the head or group; `baseline` is the unpruned loss).
struct HeadScores {
  torch::Tensor query, groups;
  double baseline = std::nan("");
};
HeadScores measure_head_scores(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                               const std::string& metric);

// Which heads to remove for a fraction of all query heads, least important first, keeping every
// layer valid: granularity "query" removes one query head from every KV group of a layer at a time
// (the least important of each group) and keeps at least one per group (with one query head per
// KV head, as in multi-head attention, a head goes with its K/V head); "kv-group" removes whole
// groups and keeps at least one per layer. `importance` [L, H_max] (query) or [L, G_max] (groups),
// larger = more important.
HeadSelection choose_heads(const LlamaConfig& config, const torch::Tensor& importance, double fraction,
                           const std::string& granularity);

// MLP width (Minitron's uniform width pruning): every layer keeps its `width` most important
// channels by `importance` [L, F_max] (mlp_channel_importance; ties: the lower index stays), so the
// result is a plain HF config with intermediate_size `width`. Layers already at most that wide
// lose nothing. Throws std::invalid_argument when `width` < 1.
ChannelSelection choose_mlp_channels(const LlamaConfig& config, const torch::Tensor& importance, int64_t width);

// The widest uniform MLP width whose FLOPs per token at `context` (eval/cost.h) are at most
// `ratio` times the model's: the width cut that costs what a given depth cut costs. Throws
// std::invalid_argument when even a width of 1 costs more.
int64_t mlp_width_for_flops_ratio(const LlamaConfig& config, double ratio, int64_t context);

}  // namespace coconut
