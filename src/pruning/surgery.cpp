#include "pruning/surgery.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace coconut {

namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument(message);
}

// Writes every layer's sizes into the per-layer arrays, or clears them when all layers agree
// (then the globals hold the common values and the config is a plain HF Llama config).
void set_per_layer_sizes(LlamaConfig& config, const std::vector<int64_t>& heads, const std::vector<int64_t>& kv_heads,
                         const std::vector<int64_t>& ffn) {
  config.num_hidden_layers = static_cast<int64_t>(heads.size());
  auto all_equal = [](const std::vector<int64_t>& values) {
    return std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) == values.end();
  };
  if (!heads.empty() && all_equal(heads) && all_equal(kv_heads) && all_equal(ffn)) {
    config.num_attention_heads = heads.front();
    config.num_key_value_heads = kv_heads.front();
    config.intermediate_size = ffn.front();
    config.layer_num_attention_heads.clear();
    config.layer_num_key_value_heads.clear();
    config.layer_intermediate_size.clear();
  } else {
    // The globals keep the unpruned values (at least every layer's own), the arrays rule.
    config.layer_num_attention_heads = heads;
    config.layer_num_key_value_heads = kv_heads;
    config.layer_intermediate_size = ffn;
  }
  config.validate();
}

struct LayerSizes {
  std::vector<int64_t> heads, kv_heads, ffn;
};

LayerSizes layer_sizes(const LlamaConfig& config) {
  LayerSizes sizes;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    sizes.heads.push_back(config.heads(layer));
    sizes.kv_heads.push_back(config.kv_heads(layer));
    sizes.ffn.push_back(config.ffn(layer));
  }
  return sizes;
}

// The config of a model whose layers are copies of `config`'s layers `sources`, in that order, each
// with its source's head and MLP sizes.
LlamaConfig config_of_layers(const LlamaConfig& config, const std::vector<int64_t>& sources) {
  const auto sizes = layer_sizes(config);
  LayerSizes chosen;
  for (int64_t layer : sources) {
    chosen.heads.push_back(sizes.heads[layer]);
    chosen.kv_heads.push_back(sizes.kv_heads[layer]);
    chosen.ffn.push_back(sizes.ffn[layer]);
  }
  LlamaConfig result = config;
  // Depth-router gates start at the first layer whose source was gated (indices move when layers
  // go or come).
  result.depth_router_first_layer = static_cast<int64_t>(sources.size());
  for (size_t position = 0; position < sources.size(); ++position)
    if (sources[position] >= config.depth_router_first_layer) {
      result.depth_router_first_layer = static_cast<int64_t>(position);
      break;
    }
  set_per_layer_sizes(result, chosen.heads, chosen.kv_heads, chosen.ffn);
  return result;
}

// `from`'s values into `to`; a weight held empty (a GGUF file's blocks stand for it, load_model's
// left_empty) stays empty.
void copy_weight(torch::Tensor& to, const torch::Tensor& from) {
  if (from.numel() == 0 && to.numel() != 0)
    to.set_(torch::empty({0}, to.options()));
  else
    to.copy_(from);
}

// What is outside the layers: the embeddings, the final norm, the LM head.
void copy_outside_layers(Llama& from, Llama& to) {
  copy_weight(to->embed_tokens->weight, from->embed_tokens->weight);
  copy_weight(to->norm->weight, from->norm->weight);
  if (to->lm_head) copy_weight(to->lm_head->weight, from->lm_head->weight);
}

// A fresh model of `config` with the dtype and device of `model`'s parameters.
Llama empty_like(Llama& model, const LlamaConfig& config) {
  Llama pruned(config);
  const auto reference = model->parameters().front();
  pruned->to(reference.device(), reference.scalar_type());
  return pruned;
}

// The kept heads and groups of one layer.
struct KeptHeads {
  std::vector<int64_t> heads;   // query heads, ascending (grouped by KV group)
  std::vector<int64_t> groups;  // KV groups, ascending
};

KeptHeads kept_heads(const LlamaConfig& config, int64_t layer, const std::set<int64_t>& removed) {
  const int64_t heads = config.heads(layer), groups = config.kv_heads(layer), per_group = heads / groups;
  for (int64_t head : removed)
    require(head >= 0 && head < heads, "layer " + std::to_string(layer) + " has heads 0.." + std::to_string(heads - 1) +
                                           ", cannot remove head " + std::to_string(head));
  KeptHeads kept;
  int64_t kept_per_group = -1;
  for (int64_t group = 0; group < groups; ++group) {
    std::vector<int64_t> in_group;
    for (int64_t head = group * per_group; head < (group + 1) * per_group; ++head)
      if (!removed.count(head)) in_group.push_back(head);
    if (in_group.empty()) continue;  // the whole group goes, with its K/V head
    const auto count = static_cast<int64_t>(in_group.size());
    require(kept_per_group < 0 || kept_per_group == count,
            "layer " + std::to_string(layer) + ": the KV groups left would keep unequal numbers of query heads (" +
                std::to_string(kept_per_group) + " and " + std::to_string(count) +
                "); remove the same number of query heads from every group that stays, or whole groups");
    kept_per_group = count;
    kept.groups.push_back(group);
    kept.heads.insert(kept.heads.end(), in_group.begin(), in_group.end());
  }
  require(!kept.heads.empty(), "layer " + std::to_string(layer) + " would lose every attention head; drop the layer instead");
  return kept;
}

// Rows [index * width, (index + 1) * width) of `matrix` along `dim`, for each index in order.
torch::Tensor select_blocks(const torch::Tensor& matrix, int64_t dim, const std::vector<int64_t>& indices, int64_t width) {
  std::vector<int64_t> rows;
  for (int64_t index : indices)
    for (int64_t offset = 0; offset < width; ++offset) rows.push_back(index * width + offset);
  auto row_index = torch::tensor(rows, torch::TensorOptions().dtype(torch::kInt64).device(matrix.device()));
  return matrix.index_select(dim, row_index);
}

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  auto source = from.named_parameters();
  for (auto& named : to.named_parameters()) copy_weight(named.value(), source[named.key()]);
}

// How many copies of each layer `after` asks for, checked against the model's layers.
std::vector<int64_t> copies_per_layer(const LlamaConfig& config, const std::vector<int64_t>& after) {
  require(!after.empty(), "no layer to copy: list at least one layer to insert a copy after");
  std::vector<int64_t> copies(static_cast<size_t>(config.num_hidden_layers), 0);
  for (int64_t layer : after) {
    require(layer >= 0 && layer < config.num_hidden_layers,
            "cannot insert a copy after layer " + std::to_string(layer) + ": the model has layers 0.." +
                std::to_string(config.num_hidden_layers - 1));
    ++copies[static_cast<size_t>(layer)];
  }
  return copies;
}

}  // namespace

LlamaConfig config_without_layers(const LlamaConfig& config, const std::set<int64_t>& layers) {
  for (int64_t layer : layers)
    require(layer >= 0 && layer < config.num_hidden_layers,
            "cannot drop layer " + std::to_string(layer) + ": the model has layers 0.." +
                std::to_string(config.num_hidden_layers - 1));
  require(static_cast<int64_t>(layers.size()) < config.num_hidden_layers, "cannot drop every layer of the model");
  std::vector<int64_t> kept;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    if (!layers.count(layer)) kept.push_back(layer);
  return config_of_layers(config, kept);
}

Llama drop_layers(Llama& model, const std::set<int64_t>& layers) {
  const auto& config = model->config();
  auto pruned = empty_like(model, config_without_layers(config, layers));
  torch::NoGradGuard no_grad;
  copy_outside_layers(model, pruned);
  int64_t target = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (layers.count(layer)) continue;
    copy_parameters(*model->layers[layer], *pruned->layers[target]);
    ++target;
  }
  return pruned;
}

LlamaConfig config_with_layer_copies(const LlamaConfig& config, const std::vector<int64_t>& after) {
  const auto copies = copies_per_layer(config, after);
  std::vector<int64_t> sources;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    sources.insert(sources.end(), 1 + copies[static_cast<size_t>(layer)], layer);  // the layer, then its copies
  return config_of_layers(config, sources);
}

Llama expand_layers(Llama& model, const std::vector<int64_t>& after) {
  const auto& config = model->config();
  const auto copies = copies_per_layer(config, after);
  auto expanded = empty_like(model, config_with_layer_copies(config, after));
  torch::NoGradGuard no_grad;
  copy_outside_layers(model, expanded);
  int64_t target = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    copy_parameters(*model->layers[layer], *expanded->layers[target++]);
    for (int64_t copy = 0; copy < copies[static_cast<size_t>(layer)]; ++copy) {
      auto& inserted = *expanded->layers[target++]->as<DecoderLayer>();
      copy_parameters(*model->layers[layer], inserted);
      // What the block adds to the residual stream passes through these two: zero, so it adds nothing.
      for (auto* projection : {&inserted.self_attn->o_proj, &inserted.mlp->down_proj}) {
        (*projection)->weight.zero_();
        if ((*projection)->bias.defined()) (*projection)->bias.zero_();
      }
    }
  }
  return expanded;
}

LlamaConfig config_without_heads(const LlamaConfig& config, const HeadSelection& heads) {
  auto sizes = layer_sizes(config);
  for (const auto& [layer, removed] : heads) {
    require(layer >= 0 && layer < config.num_hidden_layers,
            "cannot remove heads of layer " + std::to_string(layer) + ": the model has layers 0.." +
                std::to_string(config.num_hidden_layers - 1));
    const auto kept = kept_heads(config, layer, removed);
    sizes.heads[layer] = static_cast<int64_t>(kept.heads.size());
    sizes.kv_heads[layer] = static_cast<int64_t>(kept.groups.size());
  }
  LlamaConfig pruned = config;
  set_per_layer_sizes(pruned, sizes.heads, sizes.kv_heads, sizes.ffn);
  return pruned;
}

Llama drop_heads(Llama& model, const HeadSelection& heads) {
  const auto& config = model->config();
  auto pruned = empty_like(model, config_without_heads(config, heads));
  torch::NoGradGuard no_grad;
  copy_outside_layers(model, pruned);
  const int64_t head_dim = config.head_dim;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    auto& source = *model->layers[layer]->as<DecoderLayer>();
    auto& target = *pruned->layers[layer]->as<DecoderLayer>();
    const auto found = heads.find(layer);
    if (found == heads.end() || found->second.empty()) {
      copy_parameters(source, target);
      continue;
    }
    const auto kept = kept_heads(config, layer, found->second);
    target.input_layernorm->weight.copy_(source.input_layernorm->weight);
    target.post_attention_layernorm->weight.copy_(source.post_attention_layernorm->weight);
    copy_parameters(*source.mlp, *target.mlp);
    if (source.router) copy_parameters(*source.router, *target.router);
    auto& from = *source.self_attn;
    auto& to = *target.self_attn;
    // q/k/v: output rows per head [H*Dh, D]; o: input columns per head [D, H*Dh].
    to.q_proj->weight.copy_(select_blocks(from.q_proj->weight, 0, kept.heads, head_dim));
    to.k_proj->weight.copy_(select_blocks(from.k_proj->weight, 0, kept.groups, head_dim));
    to.v_proj->weight.copy_(select_blocks(from.v_proj->weight, 0, kept.groups, head_dim));
    to.o_proj->weight.copy_(select_blocks(from.o_proj->weight, 1, kept.heads, head_dim));
    if (config.attention_bias) {
      to.q_proj->bias.copy_(select_blocks(from.q_proj->bias, 0, kept.heads, head_dim));
      to.k_proj->bias.copy_(select_blocks(from.k_proj->bias, 0, kept.groups, head_dim));
      to.v_proj->bias.copy_(select_blocks(from.v_proj->bias, 0, kept.groups, head_dim));
      to.o_proj->bias.copy_(from.o_proj->bias);
    }
  }
  return pruned;
}

namespace {

// The channels layer `layer` keeps, ascending, checked against its width.
std::vector<int64_t> kept_channels(const LlamaConfig& config, int64_t layer, const std::set<int64_t>& removed) {
  require(layer >= 0 && layer < config.num_hidden_layers,
          "cannot remove MLP channels of layer " + std::to_string(layer) + ": the model has layers 0.." +
              std::to_string(config.num_hidden_layers - 1));
  const int64_t width = config.ffn(layer);
  for (int64_t channel : removed)
    require(channel >= 0 && channel < width, "layer " + std::to_string(layer) + " has MLP channels 0.." +
                                                 std::to_string(width - 1) + ", cannot remove channel " +
                                                 std::to_string(channel));
  std::vector<int64_t> kept;
  for (int64_t channel = 0; channel < width; ++channel)
    if (!removed.count(channel)) kept.push_back(channel);
  require(!kept.empty(), "layer " + std::to_string(layer) + " would lose every MLP channel; drop the layer instead");
  return kept;
}

}  // namespace

LlamaConfig config_without_mlp_channels(const LlamaConfig& config, const ChannelSelection& channels) {
  auto sizes = layer_sizes(config);
  for (const auto& [layer, removed] : channels)
    sizes.ffn[static_cast<size_t>(layer)] = static_cast<int64_t>(kept_channels(config, layer, removed).size());
  LlamaConfig pruned = config;
  set_per_layer_sizes(pruned, sizes.heads, sizes.kv_heads, sizes.ffn);
  return pruned;
}

Llama drop_mlp_channels(Llama& model, const ChannelSelection& channels) {
  const auto& config = model->config();
  auto pruned = empty_like(model, config_without_mlp_channels(config, channels));
  torch::NoGradGuard no_grad;
  copy_outside_layers(model, pruned);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    auto& source = *model->layers[layer]->as<DecoderLayer>();
    auto& target = *pruned->layers[layer]->as<DecoderLayer>();
    const auto found = channels.find(layer);
    if (found == channels.end() || found->second.empty()) {
      copy_parameters(source, target);
      continue;
    }
    const auto kept = kept_channels(config, layer, found->second);
    target.input_layernorm->weight.copy_(source.input_layernorm->weight);
    target.post_attention_layernorm->weight.copy_(source.post_attention_layernorm->weight);
    copy_parameters(*source.self_attn, *target.self_attn);
    if (source.router) copy_parameters(*source.router, *target.router);
    auto& from = *source.mlp;
    auto& to = *target.mlp;
    // gate/up: a row per channel [F, D]; down: a column per channel [D, F].
    to.gate_proj->weight.copy_(select_blocks(from.gate_proj->weight, 0, kept, 1));
    to.up_proj->weight.copy_(select_blocks(from.up_proj->weight, 0, kept, 1));
    to.down_proj->weight.copy_(select_blocks(from.down_proj->weight, 1, kept, 1));
    if (config.mlp_bias) {
      to.gate_proj->bias.copy_(select_blocks(from.gate_proj->bias, 0, kept, 1));
      to.up_proj->bias.copy_(select_blocks(from.up_proj->bias, 0, kept, 1));
      to.down_proj->bias.copy_(from.down_proj->bias);
    }
  }
  return pruned;
}

torch::Tensor mlp_channel_mask_for(const LlamaConfig& config, const ChannelSelection& channels) {
  auto mask = torch::ones({config.num_hidden_layers, config.max_ffn()});  // [L, F_max]
  for (const auto& [layer, removed] : channels)
    for (int64_t channel : removed) mask[layer][channel] = 0.0;
  return mask;
}

HeadSelection heads_of_groups(const LlamaConfig& config, const std::map<int64_t, std::set<int64_t>>& groups) {
  HeadSelection heads;
  for (const auto& [layer, removed] : groups) {
    require(layer >= 0 && layer < config.num_hidden_layers, "no layer " + std::to_string(layer) + " in the model");
    const int64_t per_group = config.heads(layer) / config.kv_heads(layer);
    for (int64_t group : removed) {
      require(group >= 0 && group < config.kv_heads(layer),
              "layer " + std::to_string(layer) + " has KV groups 0.." + std::to_string(config.kv_heads(layer) - 1) +
                  ", cannot remove group " + std::to_string(group));
      for (int64_t head = group * per_group; head < (group + 1) * per_group; ++head) heads[layer].insert(head);
    }
  }
  return heads;
}

namespace {
int64_t parse_index(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  require(used == text.size() && !text.empty() && value >= 0,
          "'" + whole + "': '" + text + "' is not a non-negative integer");
  return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}
}  // namespace

std::map<int64_t, std::set<int64_t>> parse_layer_index_pairs(const std::string& text) {
  std::map<int64_t, std::set<int64_t>> pairs;
  require(!text.empty(), "empty list of layer:index pairs");
  for (const auto& item : split(text, ',')) {
    const auto colon = item.find(':');
    require(colon != std::string::npos, "'" + text + "': '" + item + "' is not layer:index");
    pairs[parse_index(item.substr(0, colon), text)].insert(parse_index(item.substr(colon + 1), text));
  }
  return pairs;
}

std::set<int64_t> parse_index_list(const std::string& text) {
  std::set<int64_t> indices;
  require(!text.empty(), "empty list of indices");
  for (const auto& item : split(text, ',')) indices.insert(parse_index(item, text));
  return indices;
}

torch::Tensor head_mask_for(const LlamaConfig& config, const HeadSelection& heads) {
  auto mask = torch::ones({config.num_hidden_layers, config.max_heads()});  // [L, H_max]
  for (const auto& [layer, removed] : heads)
    for (int64_t head : removed) mask[layer][head] = 0.0;
  return mask;
}

}  // namespace coconut
