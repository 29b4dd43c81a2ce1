// `coconut sweep`'s YAML: every key checked against the ones it knows, errors naming the file, the
// section and the key.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model/llama.h"
#include "pruning/selection.h"
#include "reasoning/layout.h"
#include "reasoning/thought_control.h"
#include "recipes/sweep.h"

namespace coconut {

// ---------------------------------------------------------------------------------------------
// The config

namespace {

void check_keys(const YAML::Node& node, const std::set<std::string>& allowed, const std::string& where) {
  if (!node) return;
  if (!node.IsMap()) throw std::invalid_argument(where + ": expected a mapping");
  for (const auto& entry : node) {
    const auto key = entry.first.as<std::string>();
    if (!allowed.count(key)) throw std::invalid_argument(where + ": unknown key '" + key + "'");
  }
}

template <typename T>
T value_or(const YAML::Node& node, const std::string& key, T fallback, const std::string& where) {
  if (!node || !node[key]) return fallback;
  try {
    return node[key].as<T>();
  } catch (const YAML::Exception&) {
    throw std::invalid_argument(where + ": key '" + key + "' has a value of the wrong type");
  }
}

template <typename T>
std::vector<T> list_or(const YAML::Node& node, const std::string& key, std::vector<T> fallback, const std::string& where) {
  if (!node || !node[key]) return fallback;
  const auto list = node[key];
  if (!list.IsSequence()) {  // a single value is a one-element list
    return {value_or<T>(node, key, T{}, where)};
  }
  std::vector<T> values;
  try {
    for (const auto& item : list) values.push_back(item.as<T>());
  } catch (const YAML::Exception&) {
    throw std::invalid_argument(where + ": key '" + key + "' has an item of the wrong type");
  }
  return values;
}

}  // namespace

SweepConfig sweep_config_from_yaml_text(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw std::invalid_argument(source + ": malformed YAML: " + error.what());
  }
  if (!root || !root.IsMap()) throw std::invalid_argument(source + ": expected a mapping at the top level");
  check_keys(root, {"output_dir", "seed", "data", "train", "models", "prune", "latents", "report_latents", "eval_examples",
                    "latency_questions", "eval_batch_size", "max_new_tokens", "exit_thresholds", "exit_min_layers", "router",
                    "prefix_depths", "cascades", "cascade_flops", "cascade_risk", "cascade_risk_delta", "thought_controls", "eval_dtype"},
             source);
  SweepConfig config;
  config.source = source;
  config.output_dir = value_or<std::string>(root, "output_dir", config.output_dir, source);
  config.seed = value_or<uint64_t>(root, "seed", 0, source);
  config.latents = list_or<int64_t>(root, "latents", {}, source);
  config.report_latents = value_or<int64_t>(root, "report_latents", -1, source);
  config.exit_thresholds = list_or<double>(root, "exit_thresholds", {}, source);
  config.exit_min_layers = value_or<int64_t>(root, "exit_min_layers", 1, source);
  config.thought_controls = list_or<std::string>(root, "thought_controls", {}, source);
  for (const auto& control : config.thought_controls) {
    try {
      if (thought_control_from_name(control) == ThoughtControl::kNone) throw std::invalid_argument("none is the normal run");
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(source + ": thought_controls: " + error.what());
    }
  }
  for (double t : config.exit_thresholds)
    if (!(t > 0 && t <= 1)) throw std::invalid_argument(source + ": exit_thresholds must be in (0, 1]");
  config.eval_examples = value_or<int64_t>(root, "eval_examples", 0, source);
  config.latency_questions = value_or<int64_t>(root, "latency_questions", 20, source);
  config.eval_batch_size = value_or<int64_t>(root, "eval_batch_size", 32, source);
  config.max_new_tokens = value_or<int64_t>(root, "max_new_tokens", 64, source);
  config.eval_dtype = value_or<std::string>(root, "eval_dtype", "", source);
  if (!config.eval_dtype.empty()) {
    try {
      dtype_from_name(config.eval_dtype);
    } catch (const std::exception& error) {
      throw std::invalid_argument(source + ": eval_dtype: " + error.what());
    }
  }
  for (int64_t k : config.latents)
    if (k < 0) throw std::invalid_argument(source + ": latents must be >= 0");
  if (config.eval_batch_size <= 0 || config.max_new_tokens <= 0 || config.latency_questions < 0 || config.eval_examples < 0)
    throw std::invalid_argument(source + ": eval_batch_size and max_new_tokens must be positive, latency_questions and eval_examples >= 0");

  const std::string data_where = source + ": data";
  const auto data = root["data"];
  if (!data) throw std::invalid_argument(source + ": missing key 'data' (task: sums or prosqa, or train/valid/test files)");
  check_keys(data, {"task", "digits", "train_examples", "valid_examples", "test_examples", "train", "valid", "test", "test_tokens",
                    "window", "choices", "choice_items"}, data_where);
  config.data.task = value_or<std::string>(data, "task", "", data_where);
  config.data.digits = value_or<int>(data, "digits", config.data.digits, data_where);
  config.data.train_examples = value_or<int>(data, "train_examples", config.data.train_examples, data_where);
  config.data.valid_examples = value_or<int>(data, "valid_examples", config.data.valid_examples, data_where);
  config.data.test_examples = value_or<int>(data, "test_examples", config.data.test_examples, data_where);
  config.data.train = value_or<std::string>(data, "train", "", data_where);
  config.data.valid = value_or<std::string>(data, "valid", "", data_where);
  config.data.test = value_or<std::string>(data, "test", "", data_where);
  config.data.test_tokens = value_or<int64_t>(data, "test_tokens", config.data.test_tokens, data_where);
  config.data.window = value_or<int64_t>(data, "window", config.data.window, data_where);
  config.data.choices = list_or<std::string>(data, "choices", {}, data_where);
  config.data.choice_items = value_or<int64_t>(data, "choice_items", config.data.choice_items, data_where);
  if (!config.data.task.empty() && config.data.task != "sums" && config.data.task != "prosqa" && config.data.task != "text")
    throw std::invalid_argument(data_where + ": task must be 'sums', 'prosqa' or 'text' (or give train/valid/test files), got '" +
                                config.data.task + "'");
  const bool text_task = config.data.text();
  for (const char* key : {"test_tokens", "window", "choices", "choice_items"})
    if (data[key] && !text_task) throw std::invalid_argument(data_where + ": " + key + " is for task: text");
  if (text_task) {
    if (config.data.train.empty() || config.data.valid.empty() || config.data.test.empty())
      throw std::invalid_argument(data_where + ": task: text needs the train (healing), valid (calibration) and test texts");
    if (config.data.test == config.data.train || config.data.test == config.data.valid)
      throw std::invalid_argument(data_where + ": the test text must be neither the train nor the valid text");
    if (config.data.window < 2 || config.data.test_tokens < 2 || config.data.choice_items < 0)
      throw std::invalid_argument(data_where + ": window and test_tokens must be at least 2, choice_items at least 0");
  }
  if (config.data.task.empty() && (config.data.train.empty() || config.data.valid.empty()))
    throw std::invalid_argument(data_where + ": give task: sums, or the train and valid files");
  if (config.data.task == "prosqa" && (config.data.valid.empty() || !config.data.train.empty()))
    throw std::invalid_argument(data_where + ": task: prosqa generates the training questions; give the valid file (the released "
                                "set, whose names the generator takes) and no train file");

  config.train = root["train"] ? YAML::Clone(root["train"]) : YAML::Node(YAML::NodeType::Map);
  if (!config.train.IsMap()) throw std::invalid_argument(source + ": train: expected a mapping of training keys");

  const auto models = root["models"];
  if (!models || !models.IsMap() || models.size() == 0)
    throw std::invalid_argument(source + ": models: expected a mapping name -> training keys (at least one)");
  std::set<std::string> names;
  for (const auto& entry : models) {
    SweepModel model;
    model.name = entry.first.as<std::string>();
    const std::string where = source + ": models: " + model.name;
    if (model.name.empty() || model.name.find_first_of(",/ \"") != std::string::npos)
      throw std::invalid_argument(where + ": a model name must not be empty or hold ',', '/', ' ' or '\"'");
    if (!entry.second.IsMap()) throw std::invalid_argument(where + ": expected a mapping of training keys");
    model.train = YAML::Clone(entry.second);
    model.from = value_or<std::string>(model.train, "from", "", where);
    model.use = value_or<std::string>(model.train, "use", "", where);
    model.train.remove("from");
    model.train.remove("use");
    const YAML::Node merged_mode = model.train["mode"] ? model.train["mode"] : config.train["mode"];
    model.mode = merged_mode ? merged_mode.as<std::string>() : "cot";
    training_mode_from_name(model.mode);  // throws on an unknown mode
    if (text_task && model.use.empty() && model.mode != "lm")
      throw std::invalid_argument(where + ": task: text trains in mode lm (next-token loss over every token), not " + model.mode);
    if (!model.from.empty() && !names.count(model.from))
      throw std::invalid_argument(where + ": from: '" + model.from + "' is not an earlier entry of models");
    names.insert(model.name);
    config.models.push_back(model);
  }

  const std::string prune_where = source + ": prune";
  const auto prune = root["prune"];
  check_keys(prune, {"models", "layer_scores", "layers_removed", "head_fractions", "head_granularity", "heal", "heal_train",
                     "distill", "ablation_metric", "score_samples"},
             prune_where);
  auto& pruning = config.pruning;
  pruning.models = list_or<std::string>(prune, "models", {}, prune_where);
  pruning.layer_scores = list_or<std::string>(prune, "layer_scores", {"angular"}, prune_where);
  pruning.layers_removed = list_or<int64_t>(prune, "layers_removed", {}, prune_where);
  pruning.head_fractions = list_or<double>(prune, "head_fractions", {}, prune_where);
  pruning.head_granularity = value_or<std::string>(prune, "head_granularity", pruning.head_granularity, prune_where);
  pruning.heal = list_or<bool>(prune, "heal", {false}, prune_where);
  pruning.heal_train = prune && prune["heal_train"] ? YAML::Clone(prune["heal_train"]) : YAML::Node(YAML::NodeType::Map);
  pruning.distill = value_or<bool>(prune, "distill", true, prune_where);
  pruning.ablation_metric = value_or<std::string>(prune, "ablation_metric", pruning.ablation_metric, prune_where);
  pruning.score_samples = value_or<int64_t>(prune, "score_samples", pruning.score_samples, prune_where);
  for (const auto& name : pruning.models)
    if (!names.count(name)) throw std::invalid_argument(prune_where + ": models: '" + name + "' is not an entry of models");
  for (const auto& score : pruning.layer_scores) {
    try {
      layer_score_from_name(score);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(prune_where + ": layer_scores: " + error.what());
    }
  }
  for (int64_t k : pruning.layers_removed)
    if (k <= 0) throw std::invalid_argument(prune_where + ": layers_removed: each must be >= 1 (0 is the unpruned model)");
  for (double f : pruning.head_fractions)
    if (!(f > 0 && f < 1)) throw std::invalid_argument(prune_where + ": head_fractions: each must be in (0, 1)");
  if (pruning.head_granularity != "query" && pruning.head_granularity != "kv-group")
    throw std::invalid_argument(prune_where + ": head_granularity must be query or kv-group");
  if (pruning.ablation_metric != "loss" && pruning.ablation_metric != "accuracy")
    throw std::invalid_argument(prune_where + ": ablation_metric must be loss or accuracy");
  if (pruning.heal.empty()) throw std::invalid_argument(prune_where + ": heal: give false, true or both");

  const std::string router_where = source + ": router";
  const auto router = root["router"];
  check_keys(router, {"penalties", "thresholds", "train"}, router_where);
  config.router.penalties = list_or<double>(router, "penalties", {}, router_where);
  config.router.thresholds = list_or<double>(router, "thresholds", config.router.thresholds, router_where);
  config.router.train = router && router["train"] ? YAML::Clone(router["train"]) : YAML::Node(YAML::NodeType::Map);
  for (double p : config.router.penalties)
    if (!(p >= 0)) throw std::invalid_argument(router_where + ": penalties must be >= 0");
  for (double t : config.router.thresholds)
    if (!(t > 0 && t < 1)) throw std::invalid_argument(router_where + ": thresholds must be in (0, 1)");
  if (!config.router.penalties.empty() && pruning.models.empty())
    throw std::invalid_argument(router_where + ": routers are trained for prune.models; name at least one there");

  config.prefix_depths = list_or<int64_t>(root, "prefix_depths", {}, source);
  config.cascades = list_or<std::string>(root, "cascades", {}, source);
  config.cascade_flops = list_or<double>(root, "cascade_flops", {}, source);
  for (int64_t k : config.prefix_depths)
    if (k < 1) throw std::invalid_argument(source + ": prefix_depths: each must be >= 1");
  for (const auto& spec : config.cascades) {
    if (spec == "trained") continue;
    try {
      parse_depth_cascade(spec);
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument(source + ": cascades: " + error.what());
    }
  }
  config.cascade_risk = list_or<double>(root, "cascade_risk", {}, source);
  config.cascade_risk_delta = value_or<double>(root, "cascade_risk_delta", config.cascade_risk_delta, source);
  for (double f : config.cascade_flops)
    if (!(f > 0 && f <= 1)) throw std::invalid_argument(source + ": cascade_flops: each must be in (0, 1]");
  for (double epsilon : config.cascade_risk)
    if (!(epsilon > 0 && epsilon < 1)) throw std::invalid_argument(source + ": cascade_risk: each must be in (0, 1)");
  if (!(config.cascade_risk_delta > 0 && config.cascade_risk_delta < 1))
    throw std::invalid_argument(source + ": cascade_risk_delta must be in (0, 1)");
  if ((!config.prefix_depths.empty() || !config.cascades.empty() || !config.cascade_flops.empty() || !config.cascade_risk.empty()) &&
      pruning.models.empty())
    throw std::invalid_argument(source + ": prefix_depths, cascades, cascade_flops and cascade_risk are for prune.models; name at "
                                "least one there");
  if (text_task) {
    // A text cell measures perplexity and choice scores: no answers to generate, no thoughts.
    const std::vector<std::pair<const char*, bool>> question_keys = {
        {"latents", !config.latents.empty()}, {"thought_controls", !config.thought_controls.empty()},
        {"exit_thresholds", !config.exit_thresholds.empty()}, {"router", !config.router.penalties.empty()},
        {"cascades", !config.cascades.empty()}, {"cascade_flops", !config.cascade_flops.empty()},
        {"cascade_risk", !config.cascade_risk.empty()}};
    for (const auto& [key, given] : question_keys)
      if (given) throw std::invalid_argument(source + ": " + key + " answers questions; task: text measures perplexity and choices");
    if (pruning.ablation_metric != "loss")
      throw std::invalid_argument(prune_where + ": ablation_metric: task: text ablates by the calibration text's loss");
  }
  return config;
}

SweepConfig load_sweep_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot read");
  std::stringstream text;
  text << in.rdbuf();
  return sweep_config_from_yaml_text(text.str(), path);
}

}  // namespace coconut
