#include "io/peft_adapter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <stdexcept>

#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "util/atomic_file.h"

namespace coconut {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// PEFT's names for a LoRA over LlamaForCausalLM: the PeftModel wraps the model twice
// (base_model.model), then comes the HF module path; the adapter's name ("default") is left out
// of saved files.
constexpr const char* kPeftPrefix = "base_model.model.model.";
constexpr const char* kTokenRowsName = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta";

// The entries of a key that may be null, absent, empty, or must equal `fine`.
void refuse_unless(const json& config, const std::string& key, const json& fine, const std::string& file,
                   const std::string& why) {
  if (!config.contains(key) || config[key].is_null() || config[key] == fine) return;
  if ((config[key].is_object() || config[key].is_array()) && config[key].empty()) return;
  throw std::invalid_argument(file + ": '" + key + "' is " + config[key].dump() + "; " + why);
}

}  // namespace

double PeftAdapter::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

PeftAdapter read_peft_adapter(const std::string& directory) {
  const std::string config_path = (fs::path(directory) / kAdapterConfigFile).string();
  const std::string weights_path = (fs::path(directory) / kAdapterWeightsFile).string();
  if (!fs::is_directory(directory)) throw std::invalid_argument(directory + ": not a folder (an adapter is a PEFT folder)");
  if (!fs::exists(config_path)) throw std::invalid_argument(config_path + ": not found (not a PEFT adapter folder)");
  if (!fs::exists(weights_path))
    throw std::invalid_argument(weights_path + ": not found (PEFT adapters saved as adapter_model.bin are not read; "
                                "save with safe_serialization=True)");
  const json config = read_json_file(config_path);
  if (!config.is_object()) throw std::invalid_argument(config_path + ": not a JSON object");
  PeftAdapter adapter;
  if (config.value("peft_type", std::string()) != "LORA")
    throw std::invalid_argument(config_path + ": peft_type is " + (config.contains("peft_type") ? config["peft_type"].dump() : "missing") +
                                "; only LORA adapters are read");
  try {
    adapter.rank = config.at("r").get<int64_t>();
    adapter.alpha = config.at("lora_alpha").get<double>();
    adapter.rslora = config.value("use_rslora", false);
  } catch (const json::exception& error) {
    throw std::invalid_argument(config_path + ": 'r' and 'lora_alpha' must be numbers (" + error.what() + ")");
  }
  if (adapter.rank < 1 || !(adapter.alpha > 0))
    throw std::invalid_argument(config_path + ": r must be at least 1 and lora_alpha positive");
  refuse_unless(config, "use_dora", false, config_path, "DoRA adapters are not supported");
  refuse_unless(config, "fan_in_fan_out", false, config_path, "only nn.Linear layouts (fan_in_fan_out false) are supported");
  refuse_unless(config, "bias", "none", config_path, "adapters with biases are not supported");
  refuse_unless(config, "lora_bias", false, config_path, "adapters with biases are not supported");
  refuse_unless(config, "rank_pattern", json::object(), config_path, "per-module ranks are not supported");
  refuse_unless(config, "alpha_pattern", json::object(), config_path, "per-module alphas are not supported");
  refuse_unless(config, "modules_to_save", json::array(), config_path,
                "whole modules saved beside the adapter are not supported (trainable_token_indices is)");
  refuse_unless(config, "target_parameters", json::array(), config_path, "LoRA on bare parameters is not supported");
  adapter.base_model = config.value("base_model_name_or_path", std::string());
  if (config.contains("trainable_token_indices") && !config["trainable_token_indices"].is_null()) {
    json indices = config["trainable_token_indices"];
    if (indices.is_object()) {  // {"embed_tokens": [...]}: only the input embedding (tied to the head or not)
      for (const auto& [module, ids] : indices.items())
        if (module != "embed_tokens")
          throw std::invalid_argument(config_path + ": trainable_token_indices on '" + module + "' is not supported (embed_tokens is)");
      indices = indices.contains("embed_tokens") ? indices["embed_tokens"] : json::array();
    }
    if (!indices.is_array()) throw std::invalid_argument(config_path + ": trainable_token_indices must be a list of token ids");
    for (const auto& id : indices) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        throw std::invalid_argument(config_path + ": trainable_token_indices holds " + id.dump() + ", not a token id");
      adapter.token_indices.push_back(id.get<int64_t>());
    }
  }

  // Tensors: every name must be a LoRA factor of a known projection or the token rows.
  static const std::regex lora_name(R"(base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight)");
  std::set<std::string> targets;
  for (auto& [name, tensor] : read_safetensors(weights_path)) {
    std::smatch match;
    if (name == kTokenRowsName) {
      adapter.token_rows = tensor.to(torch::kFloat32);
      continue;
    }
    if (!std::regex_match(name, match, lora_name))
      throw std::invalid_argument(weights_path + ": tensor '" + name + "' is not a LoRA factor of a Llama projection "
                                  "nor embed_tokens' trainable tokens");
    const std::string projection = match[3];
    const auto& known = lora_target_names();
    if (std::find(known.begin(), known.end(), projection) == known.end())
      throw std::invalid_argument(weights_path + ": tensor '" + name + "' adapts an unknown module '" + projection + "'");
    const std::string key = lora_module_path(std::stoll(match[1]), projection) + ".lora_" + match[4].str();
    if (key.find(match[2].str()) == std::string::npos)
      throw std::invalid_argument(weights_path + ": tensor '" + name + "' puts " + projection + " under " + match[2].str());
    if (tensor.dim() != 2) throw std::invalid_argument(weights_path + ": tensor '" + name + "' is not a matrix");
    const int64_t rank_dim = match[4] == "A" ? tensor.size(0) : tensor.size(1);
    if (rank_dim != adapter.rank)
      throw std::invalid_argument(weights_path + ": tensor '" + name + "' has rank " + std::to_string(rank_dim) +
                                  ", the config says r = " + std::to_string(adapter.rank));
    adapter.lora[key] = tensor.to(torch::kFloat32);
    targets.insert(projection);
  }
  for (const auto& [key, tensor] : adapter.lora) {
    const std::string module = key.substr(0, key.size() - 7);  // less ".lora_A" / ".lora_B"
    if (!adapter.lora.count(module + ".lora_A") || !adapter.lora.count(module + ".lora_B"))
      throw std::invalid_argument(weights_path + ": " + module + " has only one of lora_A and lora_B");
  }
  if (adapter.token_rows.defined() != !adapter.token_indices.empty() ||
      (adapter.token_rows.defined() && (adapter.token_rows.dim() != 2 ||
                                        adapter.token_rows.size(0) != static_cast<int64_t>(adapter.token_indices.size()))))
    throw std::invalid_argument(weights_path + ": the trainable token rows do not match the " +
                                std::to_string(adapter.token_indices.size()) + " trainable_token_indices of " + config_path);
  if (adapter.lora.empty() && !adapter.token_rows.defined())
    throw std::invalid_argument(weights_path + ": holds no LoRA factors and no token rows");
  for (const auto& name : lora_target_names())
    if (targets.count(name)) adapter.targets.push_back(name);
  return adapter;
}

void write_peft_adapter(const std::string& directory, const PeftAdapter& adapter, const std::vector<std::string>& extra_files,
                        const std::map<std::string, std::string>& extra_texts) {
  TensorMap tensors;
  for (const auto& [key, tensor] : adapter.lora) {
    const std::string factor = key.substr(key.size() - 6);    // "lora_A"
    const std::string module = key.substr(0, key.size() - 7);  // "layers.3.self_attn.q_proj"
    tensors[kPeftPrefix + module + "." + factor + ".weight"] = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  }
  if (adapter.token_rows.defined()) tensors[kTokenRowsName] = adapter.token_rows.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", adapter.base_model},
      {"r", adapter.rank},
      {"lora_alpha", adapter.alpha},
      {"use_rslora", adapter.rslora},
      {"lora_dropout", 0.0},
      {"target_modules", adapter.targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"trainable_token_indices", adapter.token_indices.empty() ? json(nullptr) : json(adapter.token_indices)},
  };
  write_folder_atomically(directory, [&](const std::string& staging) {
    write_safetensors((fs::path(staging) / kAdapterWeightsFile).string(), tensors);
    write_file_atomically((fs::path(staging) / kAdapterConfigFile).string(), config.dump(2) + "\n");
    for (const auto& file : extra_files) fs::copy_file(file, fs::path(staging) / fs::path(file).filename());
    for (const auto& [name, text] : extra_texts) write_file_atomically((fs::path(staging) / name).string(), text);
  });
}

BasePruning base_pruning_from_json(const json& settings, const std::string& source) {
  BasePruning pruning;
  const auto index = [&](const json& value, const std::string& key, const char* what) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0)
      throw std::invalid_argument(source + ": " + key + ": " + value.dump() + " is not " + what);
    return value.get<int64_t>();
  };
  if (settings.contains("dropped_layers")) {
    const json& layers = settings["dropped_layers"];
    if (!layers.is_array()) throw std::invalid_argument(source + ": dropped_layers: expected a list of layer indices");
    for (const auto& layer : layers) pruning.layers.push_back(index(layer, "dropped_layers", "a layer index"));
  }
  if (settings.contains("dropped_mlp_channels")) {
    const json& channels = settings["dropped_mlp_channels"];
    if (!channels.is_object())
      throw std::invalid_argument(source + ": dropped_mlp_channels: expected {\"layer\": [channel, ...], ...}");
    for (const auto& [layer_text, list] : channels.items()) {
      int64_t layer = -1;
      try {
        size_t used = 0;
        layer = std::stoll(layer_text, &used);
        if (used != layer_text.size()) layer = -1;
      } catch (const std::exception&) {
        layer = -1;
      }
      if (layer < 0) throw std::invalid_argument(source + ": dropped_mlp_channels: '" + layer_text + "' is not a layer index");
      if (!list.is_array())
        throw std::invalid_argument(source + ": dropped_mlp_channels: layer " + layer_text + ": expected a list of channels");
      auto& dropped = pruning.mlp_channels[layer];
      for (const auto& channel : list)
        if (!dropped.insert(index(channel, "dropped_mlp_channels", "a channel index")).second)
          throw std::invalid_argument(source + ": dropped_mlp_channels: layer " + layer_text + ": channel " + channel.dump() +
                                      " listed twice");
    }
  }
  return pruning;
}

BasePruning adapter_base_pruning(const std::string& adapter_dir) {
  const fs::path path = fs::path(adapter_dir) / "coconut.json";
  if (!fs::exists(path)) return {};
  return base_pruning_from_json(read_json_file(path.string()), path.string());
}

std::vector<int64_t> adapter_dropped_layers(const std::string& adapter_dir) { return adapter_base_pruning(adapter_dir).layers; }

void write_base_pruning(json& settings, const BasePruning& pruning) {
  if (!pruning.layers.empty()) settings["dropped_layers"] = pruning.layers;
  if (!pruning.mlp_channels.empty()) {
    json channels = json::object();
    for (const auto& [layer, list] : pruning.mlp_channels) channels[std::to_string(layer)] = list;
    settings["dropped_mlp_channels"] = channels;
  }
}

Llama apply_peft_adapter(const Llama& base, const PeftAdapter& adapter, const std::string& source) {
  Llama merged = with_low_rank_updates(base, adapter.lora, adapter.scale(), source);
  if (adapter.token_rows.defined()) {
    const auto& table = merged->embed_tokens->weight;  // [V, D]; the head's too when tied
    if (adapter.token_rows.size(1) != table.size(1))
      throw std::invalid_argument(source + ": token rows of width " + std::to_string(adapter.token_rows.size(1)) +
                                  " for a model of hidden size " + std::to_string(table.size(1)));
    for (const int64_t id : adapter.token_indices)
      if (id >= table.size(0))
        throw std::invalid_argument(source + ": trainable token " + std::to_string(id) + " is outside the base's vocabulary [0, " +
                                    std::to_string(table.size(0)) + ") (a token the training run added: train with "
                                    "marker_tokens, so that the markers reuse tokens the base has)");
    set_token_rows(merged, adapter.token_indices, adapter.token_rows);
  }
  return merged;
}

Llama load_model_with_adapter(const std::string& model_dir, const std::string& adapter_dir,
                              std::optional<torch::ScalarType> dtype, torch::Device device, bool allow_nonfinite,
                              const std::function<Llama(const Llama&, const BasePruning&)>& prepare_base) {
  if (adapter_dir.empty()) return load_model(model_dir, dtype, device, allow_nonfinite);
  const PeftAdapter adapter = read_peft_adapter(adapter_dir);
  const auto dropped = adapter_base_pruning(adapter_dir);
  if (!dropped.empty() && !prepare_base)
    throw std::invalid_argument(adapter_dir + ": the adapter was trained on a pruned copy of " + model_dir +
                                " (coconut.json dropped_layers / dropped_mlp_channels); this loader cannot prune it");
  const torch::ScalarType target = dtype.value_or(dtype_from_name(load_config(model_dir + "/config.json").torch_dtype));
  Llama base = load_model(model_dir, torch::kFloat32, device, allow_nonfinite);
  if (!dropped.empty()) base = prepare_base(base, dropped);
  Llama merged = apply_peft_adapter(base, adapter, adapter_dir);
  base = Llama{nullptr};
  merged->to(target);
  merged->eval();
  return merged;
}

std::string folder_with(const std::string& model_dir, const std::string& adapter_dir, const std::string& file) {
  if (!adapter_dir.empty() && fs::exists(fs::path(adapter_dir) / file)) return adapter_dir;
  return model_dir;
}

PeftAdapter peft_adapter_from_lora(const Llama& model, double alpha, const std::vector<int64_t>& token_indices,
                                   const std::string& base_model) {
  PeftAdapter adapter;
  adapter.alpha = alpha;
  adapter.base_model = base_model;
  std::set<std::string> targets;
  for (const auto& [key, tensor] : lora_state(model)) {
    adapter.lora[key] = tensor.detach().to(torch::kFloat32);
    if (key.compare(key.size() - 6, 6, "lora_A") == 0) adapter.rank = tensor.size(0);
    const std::string module = key.substr(0, key.size() - 7);
    targets.insert(module.substr(module.rfind('.') + 1));
  }
  if (adapter.lora.empty()) throw std::invalid_argument("the model has no LoRA adapters to save");
  for (const auto& name : lora_target_names())
    if (targets.count(name)) adapter.targets.push_back(name);
  if (!token_indices.empty()) {
    adapter.token_indices = token_indices;
    const auto ids = torch::tensor(token_indices, torch::kLong).to(model->embed_tokens->weight.device());
    adapter.token_rows = model->embed_tokens->weight.detach().index_select(0, ids).to(torch::kFloat32);
  }
  return adapter;
}

ExtractedAdapter extract_peft_adapter(const Llama& tuned, const Llama& base, int64_t rank,
                                      const std::vector<std::string>& targets, double row_tolerance,
                                      const std::string& base_model) {
  torch::NoGradGuard no_grad;
  LoraOptions options;
  options.rank = rank;
  options.alpha = static_cast<double>(rank);
  options.targets = targets;
  validate_lora_options(options);
  auto tuned_parameters = tuned->named_parameters();
  auto base_parameters = base->named_parameters();
  if (tuned_parameters.size() != base_parameters.size())
    throw std::invalid_argument("the fine-tuned model and the base have different parameters (another config?)");
  ExtractedAdapter result;
  PeftAdapter& adapter = result.adapter;
  adapter.rank = rank;
  adapter.alpha = static_cast<double>(rank);
  adapter.base_model = base_model;
  for (const auto& name : lora_target_names())
    if (std::find(targets.begin(), targets.end(), name) != targets.end()) adapter.targets.push_back(name);
  double energy_sum = 0;
  int64_t projections = 0;
  std::set<std::string> carried;
  for (int64_t layer = 0; layer < tuned->config().num_hidden_layers; ++layer) {
    for (const auto& projection : adapter.targets) {
      const std::string module = lora_module_path(layer, projection);
      const auto& tuned_weight = tuned_parameters[module + ".weight"];
      const auto& base_weight = base_parameters[module + ".weight"];
      if (tuned_weight.sizes() != base_weight.sizes())
        throw std::invalid_argument(module + ": the fine-tuned and base weights differ in shape");
      carried.insert(module + ".weight");
      const auto delta = (tuned_weight.to(torch::kFloat32) - base_weight.to(torch::kFloat32)).cpu();  // [N, K]
      const auto [u, s, vh] = torch::linalg_svd(delta, /*full_matrices=*/false);  // [N, m], [m], [m, K]
      const int64_t r = std::min<int64_t>(rank, s.size(0));
      // B = U_r sqrt(S_r), A = sqrt(S_r) V_r^T, so B A is the best rank-r approximation.
      const auto root = s.slice(0, 0, r).sqrt();
      auto b = torch::zeros({delta.size(0), rank}, torch::kFloat32);
      auto a = torch::zeros({rank, delta.size(1)}, torch::kFloat32);
      b.slice(1, 0, r).copy_(u.slice(1, 0, r) * root.unsqueeze(0));
      a.slice(0, 0, r).copy_(vh.slice(0, 0, r) * root.unsqueeze(1));
      adapter.lora[module + ".lora_A"] = a;
      adapter.lora[module + ".lora_B"] = b;
      const double total = s.pow(2).sum().item<double>();
      const double kept = total > 0 ? s.slice(0, 0, r).pow(2).sum().item<double>() / total : 1.0;
      result.kept_energy_min = std::min(result.kept_energy_min, kept);
      energy_sum += kept;
      ++projections;
    }
  }
  result.kept_energy_mean = projections > 0 ? energy_sum / static_cast<double>(projections) : 1.0;
  // Embedding rows that moved: carried as token rows (the new markers, typically).
  const auto tuned_table = tuned->embed_tokens->weight.to(torch::kFloat32).cpu();
  const auto base_table = base->embed_tokens->weight.to(torch::kFloat32).cpu();
  const auto moved = (tuned_table - base_table).norm(2, 1) > base_table.norm(2, 1).clamp_min(1e-12) * row_tolerance;  // [V]
  const auto ids = moved.nonzero().flatten();
  for (int64_t i = 0; i < ids.size(0); ++i) adapter.token_indices.push_back(ids[i].item<int64_t>());
  if (!adapter.token_indices.empty()) adapter.token_rows = tuned_table.index_select(0, ids);
  carried.insert("embed_tokens.weight");
  if (tuned->config().tie_word_embeddings) carried.insert("lm_head.weight");
  for (const auto& named : tuned_parameters) {
    if (carried.count(named.key())) continue;
    if (!torch::equal(named.value().to(torch::kFloat32).cpu(), base_parameters[named.key()].to(torch::kFloat32).cpu()))
      ++result.changed_other_parameters;
  }
  return result;
}

}  // namespace coconut
