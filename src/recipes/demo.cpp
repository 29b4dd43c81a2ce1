#include "recipes/demo.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "data/example.h"
#include "data/sums.h"
#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "pruning/scores.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/special_tokens.h"
#include "recipes/evaluate_model.h"
#include "recipes/heal.h"
#include "recipes/pruning.h"
#include "recipes/train.h"
#include "recipes/train_config.h"
#include "text/hf_tokenizer.h"
#include "util/atomic_file.h"
#include "util/gnuplot.h"
#include "util/output_path.h"

namespace coconut {
namespace fs = std::filesystem;

namespace {

// One row of the result table.
struct Row {
  std::string name, model_dir;
  EvalSummary accuracy_run, latency_run;
  int64_t parameters = 0, layers = 0;
};

// Trains `yaml` unless `reuse` and its final model exists; returns the final folder.
std::string train_or_reuse(const std::string& yaml, const std::string& name, const std::string& out, bool reuse,
                           std::ostream& progress, bool healing = false) {
  const std::string final_dir = out + "/" + name + "/final";
  if (reuse && fs::exists(final_dir + "/coconut.json")) {
    progress << "== " << name << ": reusing " << final_dir << " (from an earlier run; --reuse)\n";
    return final_dir;
  }
  fs::remove_all(out + "/" + name);
  progress << "== " << name << "\n";
  const auto config = train_config_from_yaml_text(yaml, name + " (demo)");
  return healing ? heal(config, progress).final_dir : train(config, progress).final_dir;
}

// `cascade`: a depth cascade to run (an inactive one: every layer); empty: the folder's coconut.json.
Row evaluate_row(const std::string& name, const std::string& model_dir, const std::vector<Example>& valid,
                 int latency_questions, std::ostream& progress, int64_t max_new_tokens = 32,
                 std::optional<DepthCascade> cascade = std::nullopt) {
  Row row{name, model_dir, {}, {}, 0, 0};
  ModelEvalOptions options;
  options.cascade = cascade;
  options.batch_size = 32;
  options.max_new_tokens = max_new_tokens;
  row.accuracy_run = evaluate_model_folder(model_dir, valid, options);
  options.batch_size = 1;  // latency: one question at a time
  std::vector<Example> timed(valid.begin(), valid.begin() + std::min<size_t>(valid.size(), latency_questions));
  row.latency_run = evaluate_model_folder(model_dir, timed, options);
  const auto model = load_model(model_dir);
  row.parameters = count_parameters(model->config()).total;
  row.layers = model->config().num_hidden_layers;
  progress << fmt::format("   {}: accuracy {:.1f}%, {:.1f} tokens, {:.1f} thoughts, {:.2f} MFLOP, {:.2f} ms per question\n",
                          name, 100 * row.accuracy_run.accuracy, row.accuracy_run.mean_generated_tokens,
                          row.accuracy_run.mean_latent_thoughts, row.accuracy_run.mean_flops / 1e6,
                          1e3 * row.latency_run.mean_latency_seconds);
  return row;
}

std::string model_yaml() {
  return "model:\n  hidden_size: 128\n  intermediate_size: 512\n  num_hidden_layers: 4\n  num_attention_heads: 4\n"
         "  num_key_value_heads: 4\n  max_position_embeddings: 128\n  rope_theta: 10000\n  tie_word_embeddings: true\n";
}

void plot_accuracy_vs_flops(const std::vector<Row>& rows, const std::string& task, const std::string& png) {
  Figure figure{task + ": accuracy vs compute per answer", "MFLOP per answer", "accuracy (%)"};
  figure.yrange = {{0, 105}};
  figure.key = "off";
  PlotSeries models{"", {}, "points pointtype 7 pointsize 2"};
  models.label_style = "offset 0,1.2 font ',10'";
  for (const auto& row : rows) {
    models.points.push_back({row.accuracy_run.mean_flops / 1e6, 100 * row.accuracy_run.accuracy});
    models.labels.push_back(row.name);
  }
  figure.series.push_back(models);
  plot_figure(figure, png);
}

void plot_layer_distances(const torch::Tensor& per_layer, const std::string& png) {
  Figure figure{"angular distance between the input and output of each layer, at the continuous thoughts", "layer",
                "arccos(cos(x_l, x_l+1)) / pi"};
  figure.key = "off";
  figure.settings = {"boxwidth 0.6", "style fill solid", "xtics 1", "yrange [0:*]"};
  PlotSeries layers{"", {}, "boxes"};
  for (int64_t l = 0; l < per_layer.size(0); ++l) layers.points.push_back({static_cast<double>(l), per_layer[l].item<double>()});
  figure.series.push_back(layers);
  plot_figure(figure, png);
}

// The Coconut model's layers scored by the angular distance they move its continuous thoughts
// (on the first `samples` of `examples`); the layer that moves them least is removed and saved.
struct PruneStep {
  torch::Tensor per_layer;  // [L]
  int64_t dropped = -1;
  std::string pruned_dir;
};

PruneStep prune_least_used_layer(const std::string& coconut, const std::vector<Example>& examples, int64_t samples,
                                 const std::string& pruned_dir, std::ostream& progress) {
  progress << "== scoring the Coconut model's layers at its continuous thoughts\n";
  auto model = load_model(coconut);
  model->eval();
  const auto tokenizer = HfTokenizer::load(coconut + "/tokenizer.json");
  const auto special = find_special_tokens(*tokenizer, model->config());
  ScoringDataOptions data;
  data.samples = samples;
  const auto batches = scoring_batches(examples, *tokenizer, special, load_reasoning_settings(coconut), data);
  LayerScoreRequest request;
  request.scores = {LayerScore::kAngular};
  request.positions = ScorePositions::kLatents;
  const auto scores = measure_layer_scores(model, batches, request);  // angular [L, L], row n-1: blocks of n
  PruneStep step;
  step.per_layer = scores.angular[0];  // [L]
  const auto drop = choose_layers(scores, LayerScore::kAngular, 1);
  step.dropped = *drop.begin();
  progress << "   per-layer distance:";
  for (int64_t l = 0; l < step.per_layer.size(0); ++l) progress << fmt::format(" {}: {:.3f}", l, step.per_layer[l].item<double>());
  progress << "\n   removing layer " << step.dropped << "\n";
  auto pruned = drop_layers(model, drop);
  step.pruned_dir = pruned_dir;
  save_derived_model(pruned, coconut, pruned_dir);
  return step;
}

// One model, depth per question: the shipped any-depth ProsQA model at every layer and with its depth
// cascade (coconut.json), and the parent with its cascade over layer sets, where the folders have
// them: a Markdown section for the report (empty without them) and <out>/depth_per_question.csv.
std::string depth_per_question_section(const DemoOptions& options, std::ostream& progress) {
  const std::string model = options.models_dir + "/prosqa-coconut-anydepth", data = options.data_dir + "/prosqa/valid.json";
  if (!fs::exists(model + "/config.json") || !fs::exists(data)) return "";
  auto valid = load_dataset(data);
  if (options.valid_examples > 0 && static_cast<size_t>(options.valid_examples) < valid.size())
    valid.resize(static_cast<size_t>(options.valid_examples));
  progress << "== one model, depth per question: " << model << " on " << valid.size() << " ProsQA validation questions\n";
  std::vector<Row> rows = {
      evaluate_row("every layer", model, valid, options.latency_questions, progress, 32, DepthCascade{}),
      evaluate_row("depth per question (its cascade)", model, valid, options.latency_questions, progress)};
  const std::string layer_sets = options.models_dir + "/prosqa-coconut-layersets";
  if (fs::exists(layer_sets + "/config.json"))
    rows.push_back(evaluate_row("layer sets per question (the parent)", layer_sets, valid, options.latency_questions, progress));
  std::ostringstream table, csv;
  table << "| ProsQA, " << valid.size() << " released validation questions | accuracy | questions taken to full depth | "
        << "MFLOP / answer | latency / answer |\n|---|---|---|---|---|\n";
  csv << "model,accuracy,deepened,flops_per_answer,latency_seconds,model_dir\n";
  for (const auto& row : rows) {
    const auto& a = row.accuracy_run;
    const std::string deepened = a.cascade.active() ? fmt::format("{:.1f}%", 100 * a.deepened) : "all";
    table << fmt::format("| {} | {:.1f}% | {} | {:.1f} | {:.2f} ms |\n", row.name, 100 * a.accuracy, deepened, a.mean_flops / 1e6,
                         1e3 * row.latency_run.mean_latency_seconds);
    csv << fmt::format("{},{:.4f},{:.4f},{:.0f},{:.6f},{}\n", row.name, a.accuracy, a.cascade.active() ? a.deepened : 1.0,
                       a.mean_flops, row.latency_run.mean_latency_seconds, row.model_dir);
  }
  write_file_atomically(options.out + "/depth_per_question.csv", csv.str());
  progress << "\n" << table.str();
  return "## One model, depth per question\n\n`" + model +
         "` (healed with stochastic depth) runs its first 5 layers on every question, prompt included, and all 8 "
         "where its answer is unsure, from the prompt's state at layer 5; `" + layer_sets +
         "` (its parent, untrained since) runs without layers 1, 3, 5, 7, and again without 1, 5 where unsure "
         "(docs/adaptive-depth.md):\n\n" + table.str() + "\n";
}

// Table, CSV, plots and report.md; prints the table.
void write_results(const std::vector<Row>& rows, const PruneStep& prune, const std::string& task_title,
                   const std::string& description, const DemoOptions& options,
                   std::chrono::steady_clock::time_point started, std::ostream& progress,
                   const std::string& extra_section = "") {
  const std::string& out = options.out;
  std::ostringstream table, csv;
  table << "| model | layers | parameters | accuracy | generated tokens | thoughts | MFLOP / answer | latency / answer |\n"
        << "|---|---|---|---|---|---|---|---|\n";
  csv << "model,layers,parameters,accuracy,generated_tokens,latent_thoughts,flops_per_answer,latency_seconds,model_dir\n";
  for (const auto& row : rows) {
    const auto& a = row.accuracy_run;
    table << fmt::format("| {} | {} | {} | {:.1f}% | {:.1f} | {:.1f} | {:.2f} | {:.2f} ms |\n", row.name, row.layers,
                         row.parameters, 100 * a.accuracy, a.mean_generated_tokens, a.mean_latent_thoughts,
                         a.mean_flops / 1e6, 1e3 * row.latency_run.mean_latency_seconds);
    csv << fmt::format("{},{},{},{:.4f},{:.3f},{:.3f},{:.0f},{:.6f},{}\n", row.name, row.layers, row.parameters, a.accuracy,
                       a.mean_generated_tokens, a.mean_latent_thoughts, a.mean_flops, row.latency_run.mean_latency_seconds,
                       row.model_dir);
  }
  write_file_atomically(out + "/results.csv", csv.str());
  plot_accuracy_vs_flops(rows, task_title, out + "/accuracy_vs_flops.png");
  plot_layer_distances(prune.per_layer, out + "/layer_distances.png");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::ostringstream report;
  report << "# coconut demo: " << task_title << "\n\n" << description << "\n\n"
         << table.str() << "\nAccuracy on all validation questions (batch 32); latency per answer with one question "
         << "at a time on the first " << options.latency_questions << "; FLOPs from the exact accounting (prefill, thoughts, "
         << "decoding).\n\n![accuracy vs FLOPs](accuracy_vs_flops.png)\n\n![layer distances](layer_distances.png)\n\n"
         << extra_section << fmt::format("Whole demo: {:.0f} s.\n", seconds);
  write_file_atomically(out + "/report.md", report.str());
  progress << "\n" << table.str() << "\nreport: " << out << "/report.md (plots beside it), results: " << out
           << "/results.csv; " << fmt::format("{:.0f} s in all\n", seconds);
}

// Healing keys shared by both tasks: the pruned Coconut model at its final stage, distilled from the
// unpruned one.
std::string heal_yaml(const std::string& pruned_dir, const std::string& teacher, const DemoOptions& options,
                      const std::string& common) {
  return fmt::format("load_model_path: {}\noutput_dir: {}/healed\nnum_epochs: {}\ndistill_from: {}\ndistill_weight: 0.5\n"
                     "distill_temperature: 2.0\nwarmup_steps: 20\n{}",
                     pruned_dir, options.out, options.heal_epochs, teacher, common);
}

// The demo replaces only a folder it made itself (it holds kDemoMarker) or an empty one.
constexpr const char* kDemoMarker = ".coconut-demo";

void start_fresh(const DemoOptions& options, std::ostream& progress) {
  check_output_path(options.out, OutputKind::kFolder, "--out", options.force, kDemoMarker);
  if (!options.reuse && fs::exists(options.out)) {
    progress << "== " << options.out << " exists: starting over (pass --reuse to keep finished models)\n";
    fs::remove_all(options.out);
  }
  fs::create_directories(options.out + "/data");
  write_file_atomically(options.out + "/" + kDemoMarker, "made by coconut demo; the demo may replace this folder\n");
}

int run_sums_demo(const DemoOptions& options, std::ostream& progress) {
  const auto started = std::chrono::steady_clock::now();
  const std::string out = options.out;
  start_fresh(options, progress);

  // 1. Data: running sums of `digits` digits mod 10, one step per digit.
  const std::string train_path = out + "/data/train.json", valid_path = out + "/data/valid.json";
  save_coconut_json(train_path, generate_sums(options.train_examples, options.seed + 1, {options.digits, 10}));
  save_coconut_json(valid_path, generate_sums(options.valid_examples, options.seed + 2, {options.digits, 10}));
  const auto valid = load_dataset(valid_path);
  progress << fmt::format("== data: {} training and {} validation running sums of {} digits (e.g. \"{}\" -> steps {} -> {})\n",
                          options.train_examples, options.valid_examples, options.digits, valid[0].question,
                          fmt::format("{}", fmt::join(valid[0].steps, " ")), valid[0].answer);

  // 2. Training: CoT from scratch, Coconut from the CoT model, no-CoT from scratch.
  const std::string common = fmt::format(
      "train_path: {}\nval_path: {}\nbatch_size: 32\nlr: 1.0e-3\nweight_decay: 0.01\nseed: {}\nlog_every: 50\n"
      "val_generate_limit: 100\nmax_new_tokens: 32\n",
      train_path, valid_path, options.seed);
  const std::string cot = train_or_reuse(
      fmt::format("mode: cot\noutput_dir: {}/cot\nnum_epochs: {}\nwarmup_steps: 50\n{}{}", out, options.cot_epochs, model_yaml(), common),
      "cot", out, options.reuse, progress);
  const std::string coconut = train_or_reuse(
      fmt::format("mode: coconut\noutput_dir: {}/coconut\nload_model_path: {}\nc_thought: 1\nmax_latent_stage: {}\n"
                  "epochs_per_stage: {}\npad_latent_to_max: true\nnum_epochs: {}\n{}",
                  out, cot, options.max_latent_stage, options.epochs_per_stage,
                  options.epochs_per_stage * (options.max_latent_stage + 1), common),
      "coconut", out, options.reuse, progress);
  const std::string nocot = train_or_reuse(
      fmt::format("mode: no_cot\noutput_dir: {}/nocot\nnum_epochs: {}\nwarmup_steps: 50\n{}{}", out, options.nocot_epochs, model_yaml(), common),
      "nocot", out, options.reuse, progress);

  // 3. Which layers do the continuous thoughts use? The layer that moves them least goes.
  const PruneStep prune = prune_least_used_layer(coconut, load_dataset(train_path), 64, out + "/pruned", progress);
  const std::string pruned_dir = prune.pruned_dir;
  const int64_t dropped = prune.dropped;

  // 4. Healing: the pruned model at its final stage, distilled from the unpruned one.
  const std::string healed =
      train_or_reuse(heal_yaml(pruned_dir, coconut, options, common), "healed", out, false, progress, /*healing=*/true);

  // 5. Evaluation and the report.
  progress << "== evaluating on " << valid.size() << " validation questions (latency: " << options.latency_questions
           << " questions one at a time)\n";
  std::vector<Row> rows;
  rows.push_back(evaluate_row("no-CoT", nocot, valid, options.latency_questions, progress));
  rows.push_back(evaluate_row("CoT", cot, valid, options.latency_questions, progress));
  rows.push_back(evaluate_row("Coconut", coconut, valid, options.latency_questions, progress));
  rows.push_back(evaluate_row(fmt::format("Coconut -layer {}", dropped), pruned_dir, valid, options.latency_questions, progress));
  rows.push_back(evaluate_row(fmt::format("Coconut -layer {} healed", dropped), healed, valid, options.latency_questions, progress));

  const std::string description =
      fmt::format("Task: the running sum mod 10 of {} digits (`coconut data --task sums`), {} training and {} "
                  "validation questions; e.g. `{}` -> steps `{}` -> answer `{}`.\n\n",
                  options.digits, options.train_examples, options.valid_examples, valid[0].question,
                  fmt::format("{}", fmt::join(valid[0].steps, " ")), valid[0].answer) +
      fmt::format("Models: a 4-layer Llama (width 128) trained from scratch: CoT {} epochs; Coconut from the CoT "
                  "model, stages 0-{} ({} epochs each, one thought per step); no-CoT {} epochs. The Coconut model's "
                  "layer {} moves its continuous thoughts least (angular distance) and was removed; healing: {} "
                  "epoch(s) distilled from the unpruned model.",
                  options.cot_epochs, options.max_latent_stage, options.epochs_per_stage, options.nocot_epochs,
                  dropped, options.heal_epochs);
  write_results(rows, prune, "running sums", description, options, started, progress);
  return 0;
}

// ProntoQA on the shipped models: nothing is trained but the healing of the pruned model.
int run_prontoqa_demo(const DemoOptions& options, std::ostream& progress) {
  const auto started = std::chrono::steady_clock::now();
  const std::string out = options.out;
  const std::string cot = options.models_dir + "/prontoqa-cot", coconut = options.models_dir + "/prontoqa-coconut";
  const std::string train_path = options.data_dir + "/prontoqa/train.json", valid_path = options.data_dir + "/prontoqa/valid.json";
  for (const std::string& needed : {cot + "/config.json", coconut + "/config.json", train_path, valid_path})
    if (!fs::exists(needed))
      throw std::invalid_argument(needed + ": not found (run the demo from the repository root, or give --models-dir / --data-dir)");
  start_fresh(options, progress);
  auto valid = load_dataset(valid_path);
  if (options.valid_examples > 0 && static_cast<size_t>(options.valid_examples) < valid.size())
    valid.resize(static_cast<size_t>(options.valid_examples));  // a shorter run (tests); all 200 by default
  auto train_set = load_dataset(train_path);
  progress << fmt::format("== ProntoQA: the shipped models {} and {}; {} released validation questions, e.g.\n   {}\n   -> {} steps -> {}\n",
                          cot, coconut, valid.size(), valid[0].question, valid[0].steps.size(), valid[0].answer);

  // Which layers do the continuous thoughts use? The layer that moves them least goes.
  const PruneStep prune = prune_least_used_layer(coconut, train_set, options.score_examples, out + "/pruned", progress);

  // Healing on the first heal_examples training questions, distilled from the unpruned model.
  if (options.heal_examples > 0 && static_cast<size_t>(options.heal_examples) < train_set.size())
    train_set.resize(static_cast<size_t>(options.heal_examples));
  const std::string heal_train = out + "/data/heal_train.json";
  save_coconut_json(heal_train, train_set);
  const std::string common = fmt::format(
      "train_path: {}\nval_path: {}\nbatch_size: 32\nlr: 5.0e-4\nweight_decay: 0.01\nseed: {}\nlog_every: 25\n"
      "shuffle_facts: true\nval_generate_limit: 0\nmax_new_tokens: 16\n",
      heal_train, valid_path, options.seed);
  const std::string healed = train_or_reuse(heal_yaml(prune.pruned_dir, coconut, options, common), "healed", out, false,
                                            progress, /*healing=*/true);

  progress << "== evaluating on " << valid.size() << " validation questions (latency: " << options.latency_questions
           << " questions one at a time)\n";
  std::vector<Row> rows;
  constexpr int64_t kMaxNewTokens = 128;  // a ProntoQA chain of thought is ~75 tokens
  rows.push_back(evaluate_row("CoT", cot, valid, options.latency_questions, progress, kMaxNewTokens));
  rows.push_back(evaluate_row("Coconut", coconut, valid, options.latency_questions, progress, kMaxNewTokens));
  // The all-latent model, where the models folder has it: every step in thoughts, the answer after them.
  const std::string all_latent = options.models_dir + "/prontoqa-coconut-stage6";
  if (fs::exists(all_latent + "/config.json"))
    rows.push_back(evaluate_row("Coconut all-latent", all_latent, valid, options.latency_questions, progress,
                                kMaxNewTokens));
  rows.push_back(evaluate_row(fmt::format("Coconut -layer {}", prune.dropped), prune.pruned_dir, valid,
                              options.latency_questions, progress, kMaxNewTokens));
  rows.push_back(evaluate_row(fmt::format("Coconut -layer {} healed", prune.dropped), healed, valid,
                              options.latency_questions, progress, kMaxNewTokens));
  const std::string description = fmt::format(
      "Task: ProntoQA 5-hop (fictional ontology), the {} released validation questions; e.g. `{}` -> answer `{}`.\n\n"
      "Models: the shipped `{}` (chain of thought in words) and `{}` (the Coconut curriculum from it: the first five "
      "of six steps in continuous thoughts, the last one and the answer in words), both trained here from scratch (models/README.md), "
      "and, where the folder has it, `prontoqa-coconut-stage6` (every step in thoughts, the answer straight after them). "
      "The Coconut model's layer {} moves its "
      "continuous thoughts least (angular distance, {} training questions) and was removed; healing: {} epoch(s) on {} "
      "training questions, distilled from the unpruned model.",
      valid.size(), valid[0].question, valid[0].answer, cot, coconut, prune.dropped, options.score_examples,
      options.heal_epochs, train_set.size());
  const std::string depth_section = depth_per_question_section(options, progress);
  write_results(rows, prune, "ProntoQA", description, options, started, progress, depth_section);
  return 0;
}

}  // namespace

int run_demo(const DemoOptions& options, std::ostream& progress) {
  if (options.task == "sums") return run_sums_demo(options, progress);
  if (options.task == "prontoqa") return run_prontoqa_demo(options, progress);
  throw std::invalid_argument("demo: unknown task '" + options.task + "' (expected prontoqa or sums)");
}

}  // namespace coconut

