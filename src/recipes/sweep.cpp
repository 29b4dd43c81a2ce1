#include "recipes/sweep.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "data/example.h"
#include "data/prosqa.h"
#include "data/sums.h"
#include "data/text_documents.h"
#include "eval/choice_items.h"
#include "eval/cost.h"
#include "eval/loglikelihood.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "pruning/scores.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/special_tokens.h"
#include "reasoning/thought_control.h"
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
  int64_t prefix_depth = 0;  // structure prefix: the first K layers
  std::string cascade;       // structure cascade: a spec ("5,8@0.97"), "trained", or empty with cascade_flops
  double cascade_flops = 0;  // structure cascade: the FLOPs fraction its confidence is calibrated to
  double cascade_risk = 0;   // structure cascade: the risk its confidence is chosen for (learn then test)
};

// Cells of one model folder, thought count and depth policy measure the same thing (e.g. two
// scores that chose the same layers): they are evaluated once.
std::string measured_key(const SweepCell& cell) {
  // The full model's folder, run otherwise.
  const bool depth_of_its_own = cell.structure == "prefix" || cell.structure == "cascade" || cell.structure == "control";
  return fmt::format("{}|{}|{:.5f}|{:.5f}|{}", cell.model_dir, cell.latents, cell.exit_threshold, cell.router_threshold,
                     depth_of_its_own ? cell.structure + cell.score : "");
}

// The cascade spec as a score (the CSV separates fields by ',').
std::string cascade_score(const std::string& spec) {
  std::string score = spec;
  std::replace(score.begin(), score.end(), ',', '+');
  return score;
}

std::string format_cascade(const DepthCascade& cascade) {
  std::string text;
  for (size_t level = 0; level < cascade.levels(); ++level) {
    std::string item;
    if (cascade.layer_sets()) {
      item = "all";  // all-1-3: every layer but 1 and 3
      for (int64_t layer : cascade.removed[level]) item += "-" + std::to_string(layer);
    } else {
      item = std::to_string(cascade.depths[level]);
    }
    text += (text.empty() ? "" : "+") + item;
  }
  return fmt::format("{}@{:.5g}", text, cascade.confidence);
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
  const auto require = [&](std::initializer_list<std::string> files) {
    for (const auto& path : files)
      if (!fs::exists(path)) throw std::invalid_argument(config.source + ": data file " + path + " not found");
  };
  if (config.data.task.empty() || config.data.text()) {
    paths = {config.data.train, config.data.valid, config.data.test.empty() ? config.data.valid : config.data.test};
    require({paths.train, paths.valid, paths.test});
    return paths;
  }
  const std::string dir = config.output_dir + "/data";
  if (config.data.task == "prosqa") {
    // Generated training questions (for healing and routers), named from the released set, which
    // the cells are measured on.
    paths = {dir + "/train.json", config.data.valid, config.data.test.empty() ? config.data.valid : config.data.test};
    require({paths.valid, paths.test});
    if (fs::exists(paths.train)) {
      progress << "== data: reusing " << paths.train << "\n";
      return paths;
    }
    fs::create_directories(dir);
    ProsqaOptions options;
    std::tie(options.people_names, options.concept_names) = prosqa_symbol_vocabulary(load_dataset(config.data.valid));
    save_coconut_json(paths.train, generate_prosqa(config.data.train_examples, config.seed + 1, options));
    progress << fmt::format("== data: {} generated ProsQA training questions in {} (names from {})\n", config.data.train_examples,
                            paths.train, config.data.valid);
    return paths;
  }
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
  keys.remove("mode");  // the model's coconut.json gives the layout it trains in; plain text trains in mode lm
  if (config.data.text()) {
    keys["mode"] = "lm";
    if (!keys["text_window"]) keys["text_window"] = config.data.window;
  }
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
  if (config.data.text() && !keys["text_window"]) keys["text_window"] = config.data.window;
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

std::optional<torch::ScalarType> eval_dtype(const SweepConfig& config) {
  if (config.eval_dtype.empty()) return std::nullopt;
  return dtype_from_name(config.eval_dtype);
}

// task: text, what every cell is measured on, read once.
struct TextTestSet {
  std::string text;                                // the test text as `eval-lm --text` reads it
  std::vector<std::vector<ChoiceItem>> choice_sets;  // each choices file's first choice_items items
};

TextTestSet load_text_test_set(const SweepData& data) {
  TextTestSet set;
  if (data.test.size() >= 6 && data.test.compare(data.test.size() - 6, 6, ".jsonl") == 0) {
    for (const auto& document : load_text_documents(data.test)) set.text += (set.text.empty() ? "" : "\n\n") + document;
  } else {
    std::ifstream file(data.test, std::ios::binary);
    if (!file) throw std::invalid_argument(data.test + ": cannot open the test text");
    std::ostringstream text;
    text << file.rdbuf();
    set.text = text.str();
  }
  for (const auto& path : data.choices) {
    auto items = load_choice_items(path);
    if (data.choice_items > 0 && static_cast<size_t>(data.choice_items) < items.size()) items.resize(static_cast<size_t>(data.choice_items));
    set.choice_sets.push_back(std::move(items));
  }
  return set;
}

// One cell of a text sweep, as `eval-lm` measures it: the perplexity of the test text's first
// test_tokens tokens in non-overlapping windows (--text --limit --window), and the mean over the
// choice sets of their acc_norm (--choices --limit); FLOPs per token at the window's context.
void measure_text_cell(const std::string& dir, const std::set<int64_t>& drop, const SweepConfig& config, const TextTestSet& test,
                       SweepCell& cell) {
  Llama model = load_model_variant(dir, "", eval_dtype(config), torch::kCPU, drop, WeightFormat::kDense);
  model->eval();
  const auto tokenizer = HfTokenizer::load(dir + "/tokenizer.json");
  auto ids = tokenizer->encode_with_special_tokens(test.text);
  if (static_cast<int64_t>(ids.size()) > config.data.test_tokens) ids.resize(static_cast<size_t>(config.data.test_tokens));
  const int64_t context = model->config().max_position_embeddings;
  const int64_t window = std::min(config.data.window, context);
  const auto started = std::chrono::steady_clock::now();
  const auto scored = score_text(model, ids, window, window, 4);
  cell.perplexity = scored.perplexity();
  cell.latency_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() /
                         static_cast<double>(scored.windows);
  const LlamaConfig& run = model->config();
  const int64_t prefix = !run.bos_token_ids.empty() ? run.bos_token_ids.front() : !run.eos_token_ids.empty() ? run.eos_token_ids.front() : 0;
  double acc_norm_sum = 0;
  cell.questions = 0;
  for (const auto& items : test.choice_sets) {
    int64_t right = 0;
    for (const auto& item : items) {
      const auto scores = score_choices(model, encode_choices(*tokenizer, item.context, item.choices, prefix), context);
      right += argmax_choice_normalized(scores, item.choices) == item.label;
    }
    acc_norm_sum += static_cast<double>(right) / static_cast<double>(items.size());
    cell.questions += static_cast<int64_t>(items.size());
  }
  cell.accuracy = test.choice_sets.empty() ? 0 : acc_norm_sum / static_cast<double>(test.choice_sets.size());
  cell.flops_per_answer = flops_per_token(run, window).total();
  cell.parameters = count_parameters(run).total;
  cell.layers = run.num_hidden_layers;
  cell.mean_layers = static_cast<double>(run.num_hidden_layers);
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
  if (!config.eval_dtype.empty()) identity["eval_dtype"] = config.eval_dtype;  // only when set: earlier sweeps' folders still match
  if (config.data.text())  // keys of text sweeps only, so that earlier sweeps' folders still match
    identity["data"]["text"] = fmt::format("{} tokens, windows of {}, choices {} ({} items each)", config.data.test_tokens,
                                           config.data.window, fmt::join(config.data.choices, " "), config.data.choice_items);
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
  TextTestSet text_test;
  std::vector<Example> test;
  if (config.data.text()) {
    text_test = load_text_test_set(config.data);
  } else {
    test = load_dataset(paths.test);
    if (test.empty()) throw std::invalid_argument(paths.test + ": no examples");
  }
  if (config.eval_examples > 0 && static_cast<size_t>(config.eval_examples) < test.size())
    test.resize(static_cast<size_t>(config.eval_examples));
  const std::vector<Example> timed(test.begin(), test.begin() + std::min<size_t>(test.size(), config.latency_questions));

  // The grid, planned before anything runs (so progress can say "cell i of N").
  std::vector<Variant> variants;
  const auto& pruning = config.pruning;
  for (const auto& model : config.models) {
    variants.push_back({&model});
    if (model.mode == "coconut")
      for (const auto& control : config.thought_controls) variants.push_back({&model, "control", control});
    if (std::find(pruning.models.begin(), pruning.models.end(), model.name) == pruning.models.end()) continue;
    for (double threshold : config.exit_thresholds)
      variants.push_back({&model, "exit", "angular", 0, 0, false, {threshold, config.exit_min_layers, DepthPolicy{}.router_threshold}});
    for (double penalty : config.router.penalties)
      for (double threshold : config.router.thresholds)
        variants.push_back({&model, "router", fmt::format("p{:g}", penalty), 0, 0, false, {0, 1, threshold}, penalty});
    for (int64_t depth : config.prefix_depths) {
      Variant prefix{&model, "prefix", fmt::format("first{}", depth)};
      prefix.prefix_depth = depth;
      variants.push_back(prefix);
    }
    for (const auto& spec : config.cascades) {
      Variant cascade{&model, "cascade", cascade_score(spec)};
      cascade.cascade = spec;
      variants.push_back(cascade);
    }
    for (double fraction : config.cascade_flops) {
      Variant cascade{&model, "cascade", fmt::format("flops{:g}", fraction)};
      cascade.cascade_flops = fraction;
      variants.push_back(cascade);
    }
    for (double epsilon : config.cascade_risk) {
      Variant cascade{&model, "cascade", fmt::format("risk{:g}", epsilon)};
      cascade.cascade_risk = epsilon;
      variants.push_back(cascade);
    }
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
  std::vector<Example> valid_examples;  // cascade_flops' calibration questions, read when first needed
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
          ScoringDataOptions options;
          options.samples = config.pruning.score_samples;
          if (config.data.text()) {  // the calibration text, in the cells' windows
            options.window = config.data.window;
            progress << "== " << model.name << ": scoring layers and heads on " << pruning.score_samples << " windows of "
                     << paths.valid << "\n";
          } else {
            progress << "== " << model.name << ": scoring layers and heads on " << pruning.score_samples << " training examples\n";
          }
          auto scoring = load_scoring_data(base_dir, config.data.text() ? paths.valid : paths.train, options);
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

    // The depth the cells run at: every layer of `dir` (a model trained with a depth cascade would
    // run it by default), a prefix of it, or a cascade.
    const auto config_of_dir = load_config(dir + "/config.json");
    std::set<int64_t> drop_layers;
    std::optional<DepthCascade> cascade = DepthCascade{};
    if (variant.structure == "exit" || variant.structure == "router") cascade.reset();  // per position: no cascade beside them
    if (variant.structure == "prefix") {
      if (variant.prefix_depth > config_of_dir.num_hidden_layers)
        throw std::invalid_argument(fmt::format("{}: prefix_depths: {} is more than {}'s {} layers", config.source,
                                                variant.prefix_depth, model.name, config_of_dir.num_hidden_layers));
      for (int64_t layer = variant.prefix_depth; layer < config_of_dir.num_hidden_layers; ++layer) drop_layers.insert(layer);
      dropped = join(drop_layers, " ");
    }
    if (variant.structure == "cascade") {
      const DepthCascade trained = load_reasoning_settings(dir).depth_cascade;
      if (!variant.cascade.empty() && variant.cascade != "trained") {
        cascade = parse_depth_cascade(variant.cascade);
      } else if (!trained.active()) {
        throw std::invalid_argument(config.source + ": " + model.name + " (" + dir + ") has no depth_cascade in its coconut.json: "
                                    "'trained' and cascade_flops need one");
      } else {
        cascade = trained;
      }
      check_depth_cascade(*cascade, config_of_dir.num_hidden_layers, config.source + ": cascades (" + model.name + ")");
      if (variant.cascade_flops > 0 || variant.cascade_risk > 0) {
        if (paths.valid == paths.test)
          throw std::invalid_argument(config.source + ": cascade_flops and cascade_risk calibrate on the valid questions; give a "
                                      "test file apart from them");
        ModelEvalOptions calibration;  // at the variant's first thought count; its other cells take the same confidence
        calibration.latents = todo.front().latents;
        calibration.batch_size = config.eval_batch_size;
        calibration.max_new_tokens = config.max_new_tokens;
        if (valid_examples.empty()) valid_examples = load_dataset(paths.valid);
        const auto log = [&](const std::string& line) { progress << "   " << line << "\n"; };
        if (variant.cascade_flops > 0) {
          progress << fmt::format("== {}: calibrating the cascade to {:g} of the full model's FLOPs on {}\n", model.name,
                                  variant.cascade_flops, paths.valid);
          cascade->confidence = cascade_confidence_for_flops(dir, valid_examples, calibration, *cascade, variant.cascade_flops, log);
        } else {
          progress << fmt::format("== {}: choosing the cascade's confidence for risk {:g} at level {:g} on {}\n", model.name,
                                  variant.cascade_risk, config.cascade_risk_delta, paths.valid);
          cascade->confidence = cascade_confidence_for_risk(dir, valid_examples, calibration, *cascade, variant.cascade_risk,
                                                            config.cascade_risk_delta, log);
        }
      }
      dropped = format_cascade(*cascade);
    }
    for (auto& cell : todo) {
      cell.dropped = dropped;
      cell.model_dir = dir;
      const auto same = measured.find(measured_key(cell));
      if (same != measured.end()) {  // another score chose the same layers: the same model, measured once
        const SweepCell& m = same->second;
        cell.accuracy = m.accuracy, cell.generated_tokens = m.generated_tokens, cell.latent_thoughts = m.latent_thoughts;
        cell.flops_per_answer = m.flops_per_answer, cell.latency_seconds = m.latency_seconds;
        cell.parameters = m.parameters, cell.layers = m.layers, cell.questions = m.questions, cell.mean_layers = m.mean_layers;
        cell.perplexity = m.perplexity;
      } else if (config.data.text()) {
        const auto cell_started = std::chrono::steady_clock::now();
        measure_text_cell(dir, drop_layers, config, text_test, cell);
        measured[measured_key(cell)] = cell;
        evaluation_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - cell_started).count();
        ++evaluated_now;
      } else {
        const auto cell_started = std::chrono::steady_clock::now();
        ModelEvalOptions options;
        options.latents = cell.latents;
        options.batch_size = config.eval_batch_size;
        options.max_new_tokens = config.max_new_tokens;
        options.dtype = eval_dtype(config);
        options.depth = variant.depth;
        options.drop_layers = drop_layers;
        options.cascade = cascade;
        if (variant.structure == "control") {
          options.thought_control = thought_control_from_name(variant.score);
          options.control_seed = config.seed;
          if (options.thought_control == ThoughtControl::kMean) {
            if (valid_examples.empty()) valid_examples = load_dataset(paths.valid);
            options.control_calibration = valid_examples;
          }
        }
        const auto accuracy_run = evaluate_model_folder(dir, test, options);
        options.batch_size = 1;
        const auto latency_run = timed.empty() ? accuracy_run : evaluate_model_folder(dir, timed, options);
        cell.accuracy = accuracy_run.accuracy;
        cell.generated_tokens = accuracy_run.mean_generated_tokens;
        cell.latent_thoughts = accuracy_run.mean_latent_thoughts;
        cell.mean_layers = accuracy_run.mean_layers;
        cell.flops_per_answer = accuracy_run.mean_flops;
        cell.latency_seconds = latency_run.mean_latency_seconds;
        const auto config_run = config_without_layers(config_of_dir, drop_layers);  // what a prefix cell loads
        cell.parameters = count_parameters(config_run).total;
        cell.layers = config_run.num_hidden_layers;
        cell.questions = static_cast<int64_t>(accuracy_run.questions);
        measured[measured_key(cell)] = cell;
        evaluation_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - cell_started).count();
        ++evaluated_now;
      }
      cells.push_back(cell);
      save_results();
      const size_t done = cells.size();
      const double per_cell = evaluated_now > 0 ? evaluation_seconds / evaluated_now : 0;
      if (config.data.text())
        progress << fmt::format("[cell {}/{}] {}: perplexity {:.2f}, mean acc_norm {:.1f}%, {} layers, {:.3g} GFLOP/token, "
                                "{:.0f} ms/window (evaluation ETA {:.0f} s, not counting healing)\n",
                                done, planned, cell.label(), cell.perplexity, 100 * cell.accuracy, cell.layers,
                                cell.flops_per_answer / 1e9, 1e3 * cell.latency_seconds, per_cell * (planned - done));
      else
        progress << fmt::format("[cell {}/{}] {}: accuracy {:.1f}%, {:.1f} tokens, {:.1f} thoughts, {:.2f} layers, {:.3g} MFLOP, {:.2f} ms"
                                " (evaluation ETA {:.0f} s, not counting training)\n",
                                done, planned, cell.label(), 100 * cell.accuracy, cell.generated_tokens, cell.latent_thoughts,
                                cell.mean_layers, cell.flops_per_answer / 1e6, 1e3 * cell.latency_seconds, per_cell * (planned - done));
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
  for (const auto& [name, scores] : scores_of) {
    report.layer_scores[name] = scores;
    report.layer_scores[name].ablation_metric = config.pruning.ablation_metric;
  }
  write_sweep_report(config, cells, report, progress);
  return cells;
}

}  // namespace coconut
