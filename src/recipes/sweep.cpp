#include "recipes/sweep.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "data/example.h"
#include "data/sums.h"
#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "pruning/scores.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/special_tokens.h"
#include "recipes/evaluate_model.h"
#include "recipes/heal.h"
#include "recipes/pruning.h"
#include "recipes/sweep_report.h"
#include "recipes/train.h"
#include "recipes/train_config.h"
#include "text/hf_tokenizer.h"
#include "util/atomic_file.h"

namespace coconut {
namespace fs = std::filesystem;

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
                    "latency_questions", "eval_batch_size", "max_new_tokens", "exit_thresholds", "exit_min_layers", "router"},
             source);
  SweepConfig config;
  config.source = source;
  config.output_dir = value_or<std::string>(root, "output_dir", config.output_dir, source);
  config.seed = value_or<uint64_t>(root, "seed", 0, source);
  config.latents = list_or<int64_t>(root, "latents", {}, source);
  config.report_latents = value_or<int64_t>(root, "report_latents", -1, source);
  config.exit_thresholds = list_or<double>(root, "exit_thresholds", {}, source);
  config.exit_min_layers = value_or<int64_t>(root, "exit_min_layers", 1, source);
  for (double t : config.exit_thresholds)
    if (!(t > 0 && t <= 1)) throw std::invalid_argument(source + ": exit_thresholds must be in (0, 1]");
  config.eval_examples = value_or<int64_t>(root, "eval_examples", 0, source);
  config.latency_questions = value_or<int64_t>(root, "latency_questions", 20, source);
  config.eval_batch_size = value_or<int64_t>(root, "eval_batch_size", 32, source);
  config.max_new_tokens = value_or<int64_t>(root, "max_new_tokens", 64, source);
  for (int64_t k : config.latents)
    if (k < 0) throw std::invalid_argument(source + ": latents must be >= 0");
  if (config.eval_batch_size <= 0 || config.max_new_tokens <= 0 || config.latency_questions < 0 || config.eval_examples < 0)
    throw std::invalid_argument(source + ": eval_batch_size and max_new_tokens must be positive, latency_questions and eval_examples >= 0");

  const std::string data_where = source + ": data";
  const auto data = root["data"];
  if (!data) throw std::invalid_argument(source + ": missing key 'data' (task: sums, or train/valid/test files)");
  check_keys(data, {"task", "digits", "train_examples", "valid_examples", "test_examples", "train", "valid", "test"}, data_where);
  config.data.task = value_or<std::string>(data, "task", "", data_where);
  config.data.digits = value_or<int>(data, "digits", config.data.digits, data_where);
  config.data.train_examples = value_or<int>(data, "train_examples", config.data.train_examples, data_where);
  config.data.valid_examples = value_or<int>(data, "valid_examples", config.data.valid_examples, data_where);
  config.data.test_examples = value_or<int>(data, "test_examples", config.data.test_examples, data_where);
  config.data.train = value_or<std::string>(data, "train", "", data_where);
  config.data.valid = value_or<std::string>(data, "valid", "", data_where);
  config.data.test = value_or<std::string>(data, "test", "", data_where);
  if (!config.data.task.empty() && config.data.task != "sums")
    throw std::invalid_argument(data_where + ": task must be 'sums' (or give train/valid/test files), got '" + config.data.task + "'");
  if (config.data.task.empty() && (config.data.train.empty() || config.data.valid.empty()))
    throw std::invalid_argument(data_where + ": give task: sums, or the train and valid files");

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
  return config;
}

SweepConfig load_sweep_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(path + ": cannot read");
  std::stringstream text;
  text << in.rdbuf();
  return sweep_config_from_yaml_text(text.str(), path);
}

// ---------------------------------------------------------------------------------------------
// Cells, CSV, Pareto

std::string SweepCell::key() const {
  // One threshold slot: a cell has at most one of the two (a router cell's gate, or early exit).
  return fmt::format("{}|{}|{}|{}|{:.4f}|{}|{}|{:.5f}", model, structure, score, layers_removed, head_fraction, healed ? 1 : 0,
                     latents, structure == "router" ? router_threshold : exit_threshold);
}

std::string SweepCell::label() const {
  std::string text = model;
  if (structure == "layers") text += fmt::format(" -{}L {}", layers_removed, score);
  if (structure == "heads") text += fmt::format(" -{:.0f}% heads", 100 * head_fraction);
  if (structure == "exit") text += fmt::format(" exit<{:g}", exit_threshold);
  if (structure == "router") text += fmt::format(" router {} gate>{:g}", score, router_threshold);
  if (healed) text += " healed";
  if (latents >= 0) text += fmt::format(", {} thoughts", latents);
  return text;
}

namespace {
const char* kCsvHeader =
    "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
    "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,router_threshold,mean_layers,"
    "model_dir";
// Before the router's gate had a column of its own, a router cell kept it in exit_threshold.
const char* kCsvHeaderWithoutRouterThreshold =
    "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
    "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,mean_layers,model_dir";
}

std::string cells_to_csv(const std::vector<SweepCell>& cells) {
  std::ostringstream csv;
  csv << kCsvHeader << "\n";
  for (const auto& c : cells)
    csv << fmt::format("{},{},{},{},{},{},{:.4f},{},{},{:.6f},{:.4f},{:.4f},{:.1f},{:.6f},{},{},{},{:.5f},{:.5f},{:.4f},{}\n",
                       c.model, c.mode, c.structure, c.score, c.layers_removed, c.dropped, c.head_fraction, c.healed ? 1 : 0,
                       c.latents, c.accuracy, c.generated_tokens, c.latent_thoughts, c.flops_per_answer, c.latency_seconds,
                       c.parameters, c.layers, c.questions, c.exit_threshold, c.router_threshold, c.mean_layers, c.model_dir);
  return csv.str();
}

std::vector<SweepCell> cells_from_csv(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || (line != kCsvHeader && line != kCsvHeaderWithoutRouterThreshold))
    throw std::invalid_argument(source + ": not a sweep results file (its header differs)");
  const bool router_column = line == kCsvHeader;
  const size_t expected = router_column ? 21 : 20;
  std::vector<SweepCell> cells;
  int line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::stringstream row(line);
    std::string field;
    while (std::getline(row, field, ',')) fields.push_back(field);
    if (!line.empty() && line.back() == ',') fields.emplace_back();
    if (fields.size() != expected)
      throw std::invalid_argument(fmt::format("{}:{}: expected {} fields, found {}", source, line_number, expected, fields.size()));
    try {
      SweepCell c;
      c.model = fields[0], c.mode = fields[1], c.structure = fields[2], c.score = fields[3];
      c.layers_removed = std::stoll(fields[4]);
      c.dropped = fields[5];
      c.head_fraction = std::stod(fields[6]);
      c.healed = fields[7] == "1";
      c.latents = std::stoll(fields[8]);
      c.accuracy = std::stod(fields[9]), c.generated_tokens = std::stod(fields[10]), c.latent_thoughts = std::stod(fields[11]);
      c.flops_per_answer = std::stod(fields[12]), c.latency_seconds = std::stod(fields[13]);
      c.parameters = std::stoll(fields[14]), c.layers = std::stoll(fields[15]), c.questions = std::stoll(fields[16]);
      size_t next = 17;
      c.exit_threshold = std::stod(fields[next++]);
      if (router_column) {
        c.router_threshold = std::stod(fields[next++]);
      } else if (c.structure == "router") {
        c.router_threshold = c.exit_threshold;
        c.exit_threshold = 0;
      }
      c.mean_layers = std::stod(fields[next++]);
      c.model_dir = fields[next];
      cells.push_back(c);
    } catch (const std::logic_error&) {
      throw std::invalid_argument(fmt::format("{}:{}: a number field does not parse", source, line_number));
    }
  }
  return cells;
}

std::vector<size_t> pareto_frontier(const std::vector<double>& cost, const std::vector<double>& accuracy) {
  if (cost.size() != accuracy.size()) throw std::invalid_argument("pareto_frontier: cost and accuracy differ in length");
  std::vector<size_t> order(cost.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Cheapest first; at equal cost the most accurate first, so it is the one kept.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return cost[a] != cost[b] ? cost[a] < cost[b] : accuracy[a] > accuracy[b];
  });
  std::vector<size_t> frontier;
  double best = -std::numeric_limits<double>::infinity();
  for (size_t i : order)
    if (accuracy[i] > best) {
      frontier.push_back(i);
      best = accuracy[i];
    }
  return frontier;
}

// ---------------------------------------------------------------------------------------------
// The procedure

namespace {

// A structural variant of a trained model: what the cells of one row of the grid evaluate.
struct Variant {
  const SweepModel* model = nullptr;
  std::string structure = "full", score;
  int64_t layers_removed = 0;
  double head_fraction = 0;
  bool healed = false;
  DepthPolicy depth;  // early exit (structure exit) or the router's gate (structure router)
  double router_penalty = 0;
};

// Cells of one model folder, thought count and depth policy measure the same thing (e.g. two
// scores that chose the same layers): they are evaluated once.
std::string measured_key(const SweepCell& cell) {
  return fmt::format("{}|{}|{:.5f}|{:.5f}", cell.model_dir, cell.latents, cell.exit_threshold, cell.router_threshold);
}

YAML::Node overlay(const YAML::Node& base, const YAML::Node& over) {
  YAML::Node merged = base && base.IsMap() ? YAML::Clone(base) : YAML::Node(YAML::NodeType::Map);
  if (over && over.IsMap())
    for (const auto& entry : over) merged[entry.first.as<std::string>()] = YAML::Clone(entry.second);
  return merged;
}

struct Paths {
  std::string train, valid, test;
};

Paths prepare_data(const SweepConfig& config, std::ostream& progress) {
  Paths paths;
  if (config.data.task.empty()) {
    paths = {config.data.train, config.data.valid, config.data.test.empty() ? config.data.valid : config.data.test};
    for (const auto& path : {paths.train, paths.valid, paths.test})
      if (!fs::exists(path)) throw std::invalid_argument(config.source + ": data file " + path + " not found");
    return paths;
  }
  const std::string dir = config.output_dir + "/data";
  paths = {dir + "/train.json", dir + "/valid.json", dir + "/test.json"};
  if (fs::exists(paths.test)) {
    progress << "== data: reusing " << dir << "\n";
    return paths;
  }
  fs::create_directories(dir);
  const SumsOptions sums{config.data.digits, 10};
  save_coconut_json(paths.train, generate_sums(config.data.train_examples, config.seed + 1, sums));
  save_coconut_json(paths.valid, generate_sums(config.data.valid_examples, config.seed + 2, sums));
  save_coconut_json(paths.test, generate_sums(config.data.test_examples, config.seed + 3, sums));
  progress << fmt::format("== data: running sums of {} digits: {} train, {} valid, {} test questions in {}\n",
                          config.data.digits, config.data.train_examples, config.data.valid_examples, config.data.test_examples, dir);
  return paths;
}

bool is_trained(const std::string& final_dir) { return fs::exists(final_dir + "/coconut.json"); }

// Fine-tunes `model_dir` with `coconut heal` (its coconut.json gives the layout) into `out_dir`, with
// the shared training keys overlaid by `keys_over_shared` and distilled from `teacher_dir` when the
// sweep distils; a finished run is reused, a killed one resumes. `announce` is the progress line
// printed before training. Returns the final folder.
std::string heal_into(const SweepConfig& config, const YAML::Node& keys_over_shared, const std::string& model_dir,
                      const std::string& teacher_dir, const std::string& out_dir, const Paths& paths,
                      const std::string& source, const std::string& announce, std::ostream& progress) {
  if (is_trained(out_dir + "/final")) return out_dir + "/final";
  progress << "== " << announce << "\n";
  YAML::Node keys = overlay(config.train, keys_over_shared);
  keys.remove("model");
  keys.remove("init");
  keys.remove("mode");  // the model's coconut.json gives the layout it trains in
  keys["load_model_path"] = model_dir;
  keys["train_path"] = paths.train;
  if (!keys["val_split"]) keys["val_path"] = paths.valid;  // val_split: the test questions stay out of training
  keys["output_dir"] = out_dir;
  keys["resume"] = true;
  if (!keys["seed"]) keys["seed"] = config.seed;
  if (config.pruning.distill && !keys["distill_from"]) keys["distill_from"] = teacher_dir;
  const auto summary = heal(train_config_from_yaml_text(YAML::Dump(keys), config.source + " (" + source + ")"), progress);
  if (summary.final_dir.empty()) throw std::runtime_error(announce + ": stopped before its end (max_steps?)");
  return summary.final_dir;
}

// Trains (or resumes, or reuses) `model`; returns its final folder.
std::string train_model(const SweepConfig& config, const SweepModel& model, const Paths& paths,
                        const std::map<std::string, std::string>& finals, std::ostream& progress) {
  if (!model.use.empty()) {
    if (!fs::exists(model.use + "/config.json"))
      throw std::invalid_argument(config.source + ": models: " + model.name + ": use: " + model.use + " holds no config.json");
    progress << "== " << model.name << ": using the trained model " << model.use << "\n";
    return model.use;
  }
  const std::string out = config.output_dir + "/models/" + model.name;
  if (is_trained(out + "/final")) {
    progress << "== " << model.name << ": reusing " << out << "/final (trained by an earlier run of this sweep)\n";
    return out + "/final";
  }
  YAML::Node keys = overlay(config.train, model.train);
  keys["mode"] = model.mode;
  keys["train_path"] = paths.train;
  if (!keys["val_split"]) keys["val_path"] = paths.valid;
  keys["output_dir"] = out;
  keys["resume"] = true;  // a sweep killed while training goes on from the last checkpoint
  if (!keys["seed"]) keys["seed"] = config.seed;
  if (!model.from.empty()) {
    keys.remove("model");
    keys.remove("init");
    keys["load_model_path"] = finals.at(model.from);
  }
  progress << "== " << model.name << ": training (" << model.mode << (model.from.empty() ? "" : ", from " + model.from) << ")\n";
  const auto summary = train(train_config_from_yaml_text(YAML::Dump(keys), config.source + " (models: " + model.name + ")"), progress);
  if (summary.final_dir.empty()) throw std::runtime_error(model.name + ": training stopped before its end (max_steps?)");
  return summary.final_dir;
}

// Layer and head scores of one trained model, measured once and kept in <out>/scores/<model>.json.
struct ModelScores {
  std::vector<std::vector<double>> angular;            // [n - 1][l]; NaN where l + n > L
  std::vector<double> influence;                       // [L]
  std::vector<BlockScore> ablation;                    // blocks of every size asked for
  std::vector<std::vector<double>> head_importance;    // [L][units]
  std::string positions;                               // where angular was measured
  double baseline = 0;                                 // the unpruned model's ablation metric
};

nlohmann::json number(double value) { return std::isnan(value) ? nlohmann::json(nullptr) : nlohmann::json(value); }
double number(const nlohmann::json& value) { return value.is_null() ? std::nan("") : value.get<double>(); }

void save_scores(const ModelScores& scores, const std::string& path) {
  nlohmann::json json;
  json["positions"] = scores.positions;
  json["baseline"] = scores.baseline;
  for (const auto& row : scores.angular) {
    auto& out = json["angular"].emplace_back(nlohmann::json::array());
    for (double v : row) out.push_back(number(v));
  }
  json["block_influence"] = scores.influence;
  json["ablation"] = nlohmann::json::array();
  for (const auto& block : scores.ablation) json["ablation"].push_back({{"start", block.start}, {"size", block.size}, {"score", number(block.score)}});
  json["head_importance"] = scores.head_importance;
  write_file_atomically(path, json.dump(1) + "\n");
}

std::optional<ModelScores> load_scores(const std::string& path) {
  if (!fs::exists(path)) return std::nullopt;
  try {
    std::ifstream in(path);
    const auto json = nlohmann::json::parse(in);
    ModelScores scores;
    scores.positions = json.at("positions");
    scores.baseline = json.at("baseline");
    for (const auto& row : json.at("angular")) {
      scores.angular.emplace_back();
      for (const auto& v : row) scores.angular.back().push_back(number(v));
    }
    scores.influence = json.at("block_influence").get<std::vector<double>>();
    for (const auto& block : json.at("ablation")) scores.ablation.push_back({block.at("start"), block.at("size"), number(block.at("score"))});
    scores.head_importance = json.at("head_importance").get<std::vector<std::vector<double>>>();
    return scores;
  } catch (const nlohmann::json::exception& error) {
    throw std::invalid_argument(path + ": malformed scores file (" + error.what() + "); delete it to measure again");
  }
}

ModelScores measure_scores(const SweepConfig& config, ScoringData& scoring, std::ostream& progress) {
  const bool latent = scoring.settings.mode == "coconut" && scoring.settings.stage > 0;
  LayerScoreRequest request;
  request.scores = {LayerScore::kAngular, LayerScore::kBlockInfluence, LayerScore::kAblation};
  request.positions = latent ? ScorePositions::kLatents : ScorePositions::kLastToken;
  request.ablation_sizes = {1};  // single layers always: the report says which ones the model relies on
  const int64_t layers = scoring.model->config().num_hidden_layers;
  for (int64_t k : config.pruning.layers_removed)
    if (k > 1 && k < layers) request.ablation_sizes.push_back(k);
  request.ablation_higher_is_better = config.pruning.ablation_metric == "accuracy";
  if (request.ablation_higher_is_better) {
    request.ablation_metric = [&](Llama& model) {
      ModelEvalOptions options;
      options.batch_size = config.eval_batch_size;
      options.max_new_tokens = config.max_new_tokens;
      return evaluate_with_settings(model, *scoring.tokenizer, scoring.special, scoring.settings, scoring.examples, options).accuracy;
    };
  } else {
    request.ablation_metric = [&](Llama& model) { return mean_loss(model, scoring.batches, torch::kCPU); };
  }
  const LayerScores measured = measure_layer_scores(scoring.model, scoring.batches, request);
  ModelScores scores;
  scores.positions = latent ? "latents" : "last";
  scores.angular = tensor_rows(measured.angular);
  scores.influence.assign(measured.influence.data_ptr<double>(), measured.influence.data_ptr<double>() + measured.influence.numel());
  scores.ablation = measured.ablation;
  scores.baseline = measured.ablation_baseline;
  if (!config.pruning.head_fractions.empty()) {
    const auto importance = head_gradient_importance(scoring.model, scoring.batches, torch::kCPU);
    scores.head_importance = tensor_rows(config.pruning.head_granularity == "query" ? importance.heads : importance.groups);
  }
  progress << "   angular distance per layer (" << scores.positions << "):";
  for (size_t l = 0; l < scores.angular[0].size(); ++l) progress << fmt::format(" {:.3f}", scores.angular[0][l]);
  progress << "\n   ablation " << config.pruning.ablation_metric << " without each layer (unpruned " << fmt::format("{:.4f}", scores.baseline) << "):";
  for (const auto& block : scores.ablation)
    if (block.size == 1) progress << fmt::format(" {:.4f}", block.score);
  progress << "\n";
  return scores;
}

// The layer scores kept in <out>/scores/<model>.json, as choose_layers reads them.
LayerScores layer_scores_of(const ModelScores& scores, const SweepPruning& pruning) {
  LayerScores layer_scores;
  layer_scores.angular = tensor_from_rows(scores.angular);
  layer_scores.influence = torch::tensor(scores.influence, torch::kFloat64);
  layer_scores.ablation = scores.ablation;
  layer_scores.ablation_baseline = scores.baseline;
  layer_scores.ablation_higher_is_better = pruning.ablation_metric == "accuracy";
  return layer_scores;
}

// What the trained models depend on: a sweep resumed in an output folder made under other data,
// training keys or models would mix two experiments, so it stops instead.
void check_same_experiment(const SweepConfig& config) {
  YAML::Node identity;
  identity["seed"] = config.seed;
  identity["data"]["task"] = config.data.task;
  identity["data"]["digits"] = config.data.digits;
  identity["data"]["examples"] = fmt::format("{} {} {}", config.data.train_examples, config.data.valid_examples,
                                             config.data.test_examples);
  identity["data"]["files"] = fmt::format("{} {} {}", config.data.train, config.data.valid, config.data.test);
  identity["train"] = config.train;
  for (const auto& model : config.models) {
    YAML::Node entry = YAML::Clone(model.train);
    entry["mode"] = model.mode;
    entry["from"] = model.from;
    entry["use"] = model.use;
    identity["models"][model.name] = entry;
  }
  identity["heal_train"] = config.pruning.heal_train;
  identity["distill"] = config.pruning.distill;
  identity["score"] = fmt::format("{} on {} samples", config.pruning.ablation_metric, config.pruning.score_samples);
  identity["head_granularity"] = config.pruning.head_granularity;
  const std::string text = YAML::Dump(identity) + "\n";
  const std::string path = config.output_dir + "/experiment.yaml";
  if (fs::exists(path)) {
    std::ifstream in(path);
    std::stringstream previous;
    previous << in.rdbuf();
    if (previous.str() != text)
      throw std::invalid_argument(config.source + ": " + config.output_dir + " holds a sweep made with other data, training "
                                  "keys, models or scoring (see " + path + "); give another output_dir or delete it");
    return;
  }
  write_file_atomically(path, text);
}

std::string join(const std::set<int64_t>& values, const std::string& separator) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : separator) + std::to_string(v);
  return text;
}

}  // namespace

std::vector<SweepCell> run_sweep(const SweepConfig& config, std::ostream& progress) {
  const auto started = std::chrono::steady_clock::now();
  const std::string out = config.output_dir;
  fs::create_directories(out);
  check_same_experiment(config);
  const std::string results_path = out + "/results.csv";

  // Finished cells of an earlier run: kept and skipped.
  std::map<std::string, SweepCell> finished;
  if (fs::exists(results_path)) {
    std::ifstream in(results_path);
    std::stringstream text;
    text << in.rdbuf();
    for (const auto& cell : cells_from_csv(text.str(), results_path)) finished[cell.key()] = cell;
  }

  const Paths paths = prepare_data(config, progress);
  auto test = load_dataset(paths.test);
  if (test.empty()) throw std::invalid_argument(paths.test + ": no examples");
  if (config.eval_examples > 0 && static_cast<size_t>(config.eval_examples) < test.size())
    test.resize(static_cast<size_t>(config.eval_examples));
  const std::vector<Example> timed(test.begin(), test.begin() + std::min<size_t>(test.size(), config.latency_questions));

  // The grid, planned before anything runs (so progress can say "cell i of N").
  std::vector<Variant> variants;
  const auto& pruning = config.pruning;
  for (const auto& model : config.models) {
    variants.push_back({&model});
    if (std::find(pruning.models.begin(), pruning.models.end(), model.name) == pruning.models.end()) continue;
    for (double threshold : config.exit_thresholds)
      variants.push_back({&model, "exit", "angular", 0, 0, false, {threshold, config.exit_min_layers, DepthPolicy{}.router_threshold}});
    for (double penalty : config.router.penalties)
      for (double threshold : config.router.thresholds)
        variants.push_back({&model, "router", fmt::format("p{:g}", penalty), 0, 0, false, {0, 1, threshold}, penalty});
    for (bool healed : pruning.heal) {
      for (const auto& score : pruning.layer_scores)
        for (int64_t k : pruning.layers_removed) variants.push_back({&model, "layers", score, k, 0, healed});
      for (double fraction : pruning.head_fractions) variants.push_back({&model, "heads", "grad", 0, fraction, healed});
    }
  }
  const auto latents_of = [&](const SweepModel& model) {
    return model.mode == "coconut" && !config.latents.empty() ? config.latents : std::vector<int64_t>{-1};
  };
  size_t planned = 0, skipped = 0;
  for (const auto& variant : variants) planned += latents_of(*variant.model).size();

  std::vector<SweepCell> cells;
  std::map<std::string, SweepCell> measured;  // model_dir|latents -> the cell that evaluated it
  for (const auto& [key, cell] : finished)
    measured[measured_key(cell)] = cell;
  size_t evaluated_now = 0;
  double evaluation_seconds = 0;
  const auto save_results = [&] {
    write_file_atomically(results_path, cells_to_csv(cells));
  };

  std::map<std::string, std::string> finals;
  std::map<std::string, ModelScores> scores_of;
  for (const auto& model : config.models) finals[model.name] = train_model(config, model, paths, finals, progress);

  for (const auto& variant : variants) {
    const SweepModel& model = *variant.model;
    const std::string base_dir = finals.at(model.name);
    // Cells of this variant still to do?
    std::vector<SweepCell> todo;
    for (int64_t latents : latents_of(model)) {
      SweepCell cell;
      cell.model = model.name, cell.mode = model.mode, cell.structure = variant.structure, cell.score = variant.score;
      cell.layers_removed = variant.layers_removed, cell.head_fraction = variant.head_fraction, cell.healed = variant.healed;
      cell.latents = latents;
      cell.exit_threshold = variant.depth.exit_threshold;
      if (variant.structure == "router") cell.router_threshold = variant.depth.router_threshold;
      const auto done = finished.find(cell.key());
      if (done != finished.end()) {
        cells.push_back(done->second);
        ++skipped;
      } else {
        todo.push_back(cell);
      }
    }
    if (todo.empty()) continue;

    // The variant's model folder.
    std::string dir = base_dir, dropped;
    if (variant.structure == "layers" || variant.structure == "heads") {
      if (!scores_of.count(model.name)) {
        const std::string scores_path = out + "/scores/" + model.name + ".json";
        auto loaded = load_scores(scores_path);
        if (loaded) {
          progress << "== " << model.name << ": layer and head scores from " << scores_path << "\n";
          scores_of[model.name] = *loaded;
        } else {
          progress << "== " << model.name << ": scoring layers and heads on " << pruning.score_samples << " training examples\n";
          ScoringDataOptions options;
          options.samples = config.pruning.score_samples;
          auto scoring = load_scoring_data(base_dir, paths.train, options);
          scores_of[model.name] = measure_scores(config, scoring, progress);
          fs::create_directories(out + "/scores");
          save_scores(scores_of[model.name], scores_path);
        }
      }
      const ModelScores& scores = scores_of.at(model.name);
      // The model is loaded only when its pruned folder does not exist yet.
      std::set<int64_t> layers;
      HeadSelection selection;
      std::string name;
      if (variant.structure == "layers") {
        layers = choose_layers(layer_scores_of(scores, pruning), layer_score_from_name(variant.score), variant.layers_removed);
        dropped = join(layers, " ");
        name = model.name + "-drop-" + join(layers, "_");
      } else {
        selection = choose_heads(load_config(base_dir + "/config.json"), tensor_from_rows(scores.head_importance),
                                 variant.head_fraction, pruning.head_granularity);
        int64_t removed = 0;
        for (const auto& [layer, heads] : selection) removed += static_cast<int64_t>(heads.size());
        dropped = std::to_string(removed) + " query heads";
        name = fmt::format("{}-heads-{}-{:.0f}", model.name, pruning.head_granularity, 100 * variant.head_fraction);
      }
      dir = out + "/variants/" + name;
      if (!fs::exists(dir + "/config.json")) {
        auto source = load_model(base_dir);
        auto pruned = variant.structure == "layers" ? drop_layers(source, layers) : drop_heads(source, selection);
        progress << "== " << name << ": pruned (" << dropped << ")\n";
        save_derived_model(pruned, base_dir, dir);
      }
      if (variant.healed) {
        dir = heal_into(config, pruning.heal_train, dir, base_dir, out + "/variants/" + name + "-healed", paths,
                        "prune: heal_train", name + ": healing", progress);
      }
    }

    if (variant.structure == "router") {
      const std::string name = fmt::format("{}-router-p{:g}", model.name, variant.router_penalty);
      YAML::Node keys = overlay(pruning.heal_train, config.router.train);
      keys["depth_router"] = true;
      keys["router_penalty"] = variant.router_penalty;
      dir = heal_into(config, keys, base_dir, base_dir, out + "/variants/" + name, paths, "router: train",
                      fmt::format("{}: training the depth router (penalty {:g})", name, variant.router_penalty), progress);
    }

    const auto config_of_dir = load_config(dir + "/config.json");
    for (auto& cell : todo) {
      cell.dropped = dropped;
      cell.model_dir = dir;
      const auto same = measured.find(measured_key(cell));
      if (same != measured.end()) {  // another score chose the same layers: the same model, measured once
        const SweepCell& m = same->second;
        cell.accuracy = m.accuracy, cell.generated_tokens = m.generated_tokens, cell.latent_thoughts = m.latent_thoughts;
        cell.flops_per_answer = m.flops_per_answer, cell.latency_seconds = m.latency_seconds;
        cell.parameters = m.parameters, cell.layers = m.layers, cell.questions = m.questions, cell.mean_layers = m.mean_layers;
      } else {
        const auto cell_started = std::chrono::steady_clock::now();
        ModelEvalOptions options;
        options.latents = cell.latents;
        options.batch_size = config.eval_batch_size;
        options.max_new_tokens = config.max_new_tokens;
        options.depth = variant.depth;
        const auto accuracy_run = evaluate_model_folder(dir, test, options);
        options.batch_size = 1;
        const auto latency_run = timed.empty() ? accuracy_run : evaluate_model_folder(dir, timed, options);
        cell.accuracy = accuracy_run.accuracy;
        cell.generated_tokens = accuracy_run.mean_generated_tokens;
        cell.latent_thoughts = accuracy_run.mean_latent_thoughts;
        cell.mean_layers = accuracy_run.mean_layers;
        cell.flops_per_answer = accuracy_run.mean_flops;
        cell.latency_seconds = latency_run.mean_latency_seconds;
        cell.parameters = count_parameters(config_of_dir).total;
        cell.layers = config_of_dir.num_hidden_layers;
        cell.questions = static_cast<int64_t>(accuracy_run.questions);
        measured[measured_key(cell)] = cell;
        evaluation_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - cell_started).count();
        ++evaluated_now;
      }
      cells.push_back(cell);
      save_results();
      const size_t done = cells.size();
      const double per_cell = evaluated_now > 0 ? evaluation_seconds / evaluated_now : 0;
      progress << fmt::format("[cell {}/{}] {}: accuracy {:.1f}%, {:.1f} tokens, {:.1f} thoughts, {:.2f} layers, {:.3g} MFLOP, {:.2f} ms"
                              " (evaluation ETA {:.0f} s, not counting training)\n",
                              done, planned, cell.label(), 100 * cell.accuracy, cell.generated_tokens, cell.latent_thoughts, cell.mean_layers,
                              cell.flops_per_answer / 1e6, 1e3 * cell.latency_seconds, per_cell * (planned - done));
    }
  }
  save_results();
  if (skipped > 0) progress << "== " << skipped << " of " << planned << " cells were finished by an earlier run (kept)\n";

  // Scores of models whose cells were all finished earlier come from their files.
  for (const auto& name : pruning.models)
    if (!scores_of.count(name))
      if (auto loaded = load_scores(out + "/scores/" + name + ".json")) scores_of[name] = *loaded;
  SweepReport report;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& [name, scores] : scores_of)
    report.layer_scores[name] = {scores.positions, config.pruning.ablation_metric, scores.baseline, scores.angular,
                                 scores.influence, scores.ablation};
  write_sweep_report(config, cells, report, progress);
  return cells;
}

}  // namespace coconut
