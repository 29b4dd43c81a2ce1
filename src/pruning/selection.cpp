#include "pruning/selection.h"

#include <algorithm>
#include <map>
#include <queue>
#include <stdexcept>

#include "eval/cost.h"

namespace coconut {

LayerScore layer_score_from_name(const std::string& name) {
  if (name == "angular") return LayerScore::kAngular;
  if (name == "bi") return LayerScore::kBlockInfluence;
  if (name == "ablation") return LayerScore::kAblation;
  throw std::invalid_argument("unknown layer score '" + name + "' (expected angular, bi or ablation)");
}

std::string layer_score_name(LayerScore score) {
  switch (score) {
    case LayerScore::kAngular: return "angular";
    case LayerScore::kBlockInfluence: return "bi";
    case LayerScore::kAblation: return "ablation";
  }
  return "?";
}

LayerScores measure_layer_scores(Llama& model, const std::vector<Batch>& batches, const LayerScoreRequest& request) {
  LayerScores scores;
  const auto wants = [&](LayerScore score) {
    return std::find(request.scores.begin(), request.scores.end(), score) != request.scores.end();
  };
  if (wants(LayerScore::kAngular)) scores.angular = angular_distances(model, batches, request.positions, request.device);
  if (wants(LayerScore::kBlockInfluence)) scores.influence = block_influence(model, batches, request.device);
  if (wants(LayerScore::kAblation)) {
    if (!request.ablation_metric) throw std::invalid_argument("layer ablation needs a metric (loss or accuracy)");
    scores.ablation_higher_is_better = request.ablation_higher_is_better;
    scores.ablation_baseline = request.ablation_metric(model);
    scores.ablation = layer_ablation(model, request.ablation_sizes, request.ablation_metric, request.on_ablated_block);
  }
  return scores;
}

std::set<int64_t> choose_layers(const LayerScores& scores, LayerScore score, int64_t count) {
  const auto missing = [&] {
    return std::invalid_argument("cannot choose layers by " + layer_score_name(score) + ": that score was not measured");
  };
  switch (score) {
    case LayerScore::kAngular:
      if (!scores.angular.defined()) throw missing();
      return layers_to_drop_by_angular(scores.angular, count);
    case LayerScore::kBlockInfluence:
      if (!scores.influence.defined()) throw missing();
      return layers_to_drop_by_influence(scores.influence, count);
    case LayerScore::kAblation:
      if (scores.ablation.empty()) throw missing();
      return layers_to_drop_by_ablation(scores.ablation, count, scores.ablation_higher_is_better);
  }
  throw missing();
}

std::vector<BlockScore> layer_ablation(Llama& model, const std::vector<int64_t>& block_sizes,
                                       const std::function<double(Llama&)>& metric,
                                       const std::function<void(const BlockScore&)>& on_block) {
  const int64_t layers = model->config().num_hidden_layers;
  std::vector<BlockScore> scores;
  for (int64_t size : block_sizes) {
    for (int64_t start = 0; start + size <= layers && size < layers; ++start) {
      std::set<int64_t> block;
      for (int64_t l = start; l < start + size; ++l) block.insert(l);
      auto pruned = drop_layers(model, block);
      pruned->eval();
      scores.push_back({start, size, metric(pruned)});
      if (on_block) on_block(scores.back());
    }
  }
  return scores;
}

std::vector<BlockScore> blocks_from_angular(const torch::Tensor& distances, const std::vector<int64_t>& block_sizes) {
  const int64_t layers = distances.size(0);
  std::vector<BlockScore> blocks;
  for (int64_t size : block_sizes)
    for (int64_t start = 0; start + size <= layers; ++start)
      blocks.push_back({start, size, distances[size - 1][start].item<double>()});
  return blocks;
}

namespace {
std::set<int64_t> block_layers(int64_t start, int64_t size) {
  std::set<int64_t> layers;
  for (int64_t l = start; l < start + size; ++l) layers.insert(l);
  return layers;
}
void require_size(int64_t size, int64_t layers) {
  if (size < 1 || size >= layers)
    throw std::invalid_argument("block size must be in 1.." + std::to_string(layers - 1) + ", got " + std::to_string(size));
}
}  // namespace

std::set<int64_t> layers_to_drop_by_angular(const torch::Tensor& distances, int64_t size) {
  require_size(size, distances.size(0));
  const auto blocks = blocks_from_angular(distances, {size});
  const auto best = std::min_element(blocks.begin(), blocks.end(),
                                     [](const BlockScore& a, const BlockScore& b) { return a.score < b.score; });
  return block_layers(best->start, size);
}

std::set<int64_t> layers_to_drop_by_influence(const torch::Tensor& influence, int64_t size) {
  require_size(size, influence.size(0));
  auto order = influence.argsort();
  std::set<int64_t> layers;
  for (int64_t i = 0; i < size; ++i) layers.insert(order[i].item<int64_t>());
  return layers;
}

std::set<int64_t> layers_to_drop_by_ablation(const std::vector<BlockScore>& scores, int64_t size, bool higher_is_better) {
  const BlockScore* best = nullptr;
  for (const auto& block : scores) {
    if (block.size != size) continue;
    if (best == nullptr || (higher_is_better ? block.score > best->score : block.score < best->score)) best = &block;
  }
  if (best == nullptr) throw std::invalid_argument("no ablation score for blocks of " + std::to_string(size) + " layers");
  return block_layers(best->start, size);
}

HeadScores measure_head_scores(Llama& model, const std::vector<Batch>& batches, torch::Device device,
                               const std::string& metric) {
  HeadScores scores;
  if (metric == "grad") {
    const auto importance = head_gradient_importance(model, batches, device);
    scores.query = importance.heads;
    scores.groups = importance.groups;
  } else if (metric == "ablation") {
    scores.baseline = mean_loss(model, batches, device);
    scores.query = head_ablation_losses(model, batches, device, false) - scores.baseline;
    scores.groups = head_ablation_losses(model, batches, device, true) - scores.baseline;
  } else {
    throw std::invalid_argument("head metric must be grad or ablation, got '" + metric + "'");
  }
  return scores;
}

HeadSelection choose_heads(const LlamaConfig& config, const torch::Tensor& importance, double fraction,
                           const std::string& granularity) {
  if (!(fraction > 0 && fraction < 1)) throw std::invalid_argument("head fraction must be in (0, 1)");
  if (granularity != "query" && granularity != "kv-group")
    throw std::invalid_argument("unknown granularity '" + granularity + "' (expected query or kv-group)");
  int64_t total = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) total += config.heads(l);
  const auto target = static_cast<int64_t>(std::llround(fraction * static_cast<double>(total)));
  auto score = importance.to(torch::kFloat64).cpu();
  HeadSelection selection;
  int64_t removed = 0;

  // A unit is what can go at once; candidates are ranked by the mean importance of their heads.
  struct Unit {
    double score;
    int64_t layer;
    std::vector<int64_t> heads;
    bool operator>(const Unit& other) const { return score > other.score; }
  };
  if (granularity == "kv-group") {
    std::vector<Unit> units;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const int64_t per_group = config.heads(l) / config.kv_heads(l);
      for (int64_t g = 0; g < config.kv_heads(l); ++g) {
        Unit unit{score[l][g].item<double>(), l, {}};
        for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) unit.heads.push_back(h);
        units.push_back(unit);
      }
    }
    std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.score < b.score; });
    std::map<int64_t, int64_t> groups_removed;
    for (const auto& unit : units) {
      const auto size = static_cast<int64_t>(unit.heads.size());
      if (removed + size > target || groups_removed[unit.layer] + 1 >= config.kv_heads(unit.layer)) continue;
      groups_removed[unit.layer] += 1;
      selection[unit.layer].insert(unit.heads.begin(), unit.heads.end());
      removed += size;
    }
    return selection;
  }
  // query: per layer, the k-th unit removes the k-th least important head of every group.
  std::vector<std::vector<std::vector<int64_t>>> ranked(static_cast<size_t>(config.num_hidden_layers));  // [l][g] heads
  std::vector<int64_t> next_unit(static_cast<size_t>(config.num_hidden_layers), 0);
  auto unit_of = [&](int64_t l, int64_t k) {
    Unit unit{0.0, l, {}};
    for (const auto& group : ranked[l]) {
      unit.heads.push_back(group[k]);
      unit.score += score[l][group[k]].item<double>();
    }
    unit.score /= static_cast<double>(unit.heads.size());
    return unit;
  };
  std::priority_queue<Unit, std::vector<Unit>, std::greater<Unit>> queue;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const int64_t per_group = config.heads(l) / config.kv_heads(l);
    for (int64_t g = 0; g < config.kv_heads(l); ++g) {
      std::vector<int64_t> heads;
      for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) heads.push_back(h);
      std::stable_sort(heads.begin(), heads.end(),
                       [&](int64_t a, int64_t b) { return score[l][a].item<double>() < score[l][b].item<double>(); });
      ranked[l].push_back(heads);
    }
    if (per_group > 1) {
      queue.push(unit_of(l, 0));
    } else {
      // One query head per KV head (multi-head attention): a head goes with its K/V head.
      for (int64_t h = 0; h < config.heads(l); ++h) queue.push(Unit{score[l][h].item<double>(), l, {h}});
    }
  }
  while (!queue.empty()) {
    auto unit = queue.top();
    queue.pop();
    const int64_t l = unit.layer, per_group = config.heads(l) / config.kv_heads(l);
    const auto size = static_cast<int64_t>(unit.heads.size());
    if (removed + size > target) continue;  // too big for what is left; smaller units may still fit
    if (per_group == 1 && static_cast<int64_t>(selection[l].size()) + 1 >= config.heads(l)) continue;  // keep one
    selection[l].insert(unit.heads.begin(), unit.heads.end());
    removed += size;
    if (per_group > 1 && ++next_unit[l] < per_group - 1) queue.push(unit_of(l, next_unit[l]));  // keep one per group
  }
  for (auto it = selection.begin(); it != selection.end();) it = it->second.empty() ? selection.erase(it) : std::next(it);
  return selection;
}

ChannelSelection choose_mlp_channels(const LlamaConfig& config, const torch::Tensor& importance, int64_t width) {
  if (width < 1) throw std::invalid_argument("an MLP width must be at least 1 channel, got " + std::to_string(width));
  const auto scores = importance.to(torch::kCPU, torch::kFloat64).contiguous();
  ChannelSelection removed;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const int64_t channels = config.ffn(layer);
    if (channels <= width) continue;
    std::vector<int64_t> order(static_cast<size_t>(channels));
    for (int64_t c = 0; c < channels; ++c) order[static_cast<size_t>(c)] = c;
    const double* row = scores[layer].data_ptr<double>();
    // Most important first; among equals the lower index first.
    std::stable_sort(order.begin(), order.end(), [row](int64_t a, int64_t b) { return row[a] > row[b]; });
    removed[layer] = std::set<int64_t>(order.begin() + width, order.end());
  }
  return removed;
}

int64_t mlp_width_for_flops_ratio(const LlamaConfig& config, double ratio, int64_t context) {
  const double budget = ratio * flops_per_token(config, context).total();
  const auto flops_at = [&](int64_t width) {
    LlamaConfig narrow = config;
    narrow.intermediate_size = width;
    narrow.layer_intermediate_size.clear();
    return flops_per_token(narrow, context).total();
  };
  if (flops_at(1) > budget)
    throw std::invalid_argument("no MLP width keeps FLOPs per token within " + std::to_string(ratio) +
                                " of the model's: the attention and head alone cost more");
  int64_t low = 1, high = config.max_ffn();  // flops_at(low) <= budget; the answer is in [low, high]
  while (low < high) {
    const int64_t middle = (low + high + 1) / 2;
    if (flops_at(middle) <= budget) low = middle; else high = middle - 1;
  }
  return low;
}

}  // namespace coconut
