// `coconut sweep CONFIG.yaml`: the test-time-compute experiment. For a fixed budget per answer,
// which mix of depth (layers kept), width (heads kept) and latent thoughts answers best?
//
// One YAML file names a dataset (generated or files), the models to train (any training mode, one
// may start from another), the structural variants of some of them (layers removed 0..k by each
// score, a fraction of heads removed, each healed or not) and the latent thoughts to evaluate
// with. Every cell (model x structure x healed x thoughts) becomes one row of <out>/results.csv
// with its accuracy, generated tokens, thoughts, analytic FLOPs, measured latency and parameters;
// from the CSV come the plots and <out>/report.md. A second run skips finished cells: trained
// models, pruned and healed variants and evaluated cells are reused (and said to be); training
// killed midway resumes from its last checkpoint.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace coconut {

struct SweepData {
  std::string task;                  // "sums": generated; "prosqa": train generated, valid (and test) files; "text"; empty: the files below
  int digits = 4;                    // sums: digits per question
  int train_examples = 6000, valid_examples = 300, test_examples = 300;
  std::string train, valid, test;    // files (test defaults to valid)
  // task: text, plain text (.txt documents or JSONL with a text field): `train` is what models train
  // and heal on (mode lm), `valid` the calibration text the layer and head scores measure on, `test`
  // the text each cell's perplexity is measured on (its first test_tokens tokens, non-overlapping
  // windows of `window`, which the scores use too), and each cell's accuracy is the mean acc_norm
  // over the multiple-choice sets `choices` (eval-lm's JSONL; the first choice_items of each, 0 = all).
  int64_t test_tokens = 16384, window = 512, choice_items = 0;
  std::vector<std::string> choices;
  bool text() const { return task == "text"; }
};

struct SweepModel {
  std::string name;                  // the row label and folder name
  std::string mode;                  // training mode (train's `mode`)
  std::string from;                  // another entry whose final model this one starts from
  std::string use;                   // an existing trained model folder: no training
  YAML::Node train;                  // training keys over the shared ones
};

struct SweepPruning {
  std::vector<std::string> models;           // entries that get structural variants
  std::vector<std::string> layer_scores;     // angular | bi | ablation
  std::vector<int64_t> layers_removed;       // k > 0 (k = 0 is the unpruned model)
  std::vector<double> head_fractions;        // of all query heads, by gradient importance
  std::string head_granularity = "query";    // query | kv-group
  std::vector<bool> heal = {false};          // without and/or with healing
  YAML::Node heal_train;                     // training keys for healing
  bool distill = true;                       // healing distils from the unpruned model
  std::string ablation_metric = "loss";      // loss | accuracy (on the scoring samples)
  int64_t score_samples = 64;
};

// Learned depth routers (compute-adaptive depth) for the unpruned models of prune.models: one
// router trained per penalty (coconut heal with depth_router, like healing: heal keys, distilled
// from the model), each evaluated at every gate threshold.
struct SweepRouter {
  std::vector<double> penalties;             // router_penalty of each trained router
  std::vector<double> thresholds = {0.5};    // gate thresholds at evaluation
  YAML::Node train;                          // training keys over the shared ones (e.g. num_epochs)
};

struct SweepConfig {
  std::string source;                        // the YAML file (for messages)
  std::string output_dir = "runs/sweep";
  uint64_t seed = 0;
  SweepData data;
  YAML::Node train;                          // training keys every model shares
  std::vector<SweepModel> models;
  SweepPruning pruning;
  std::vector<int64_t> latents;              // thoughts at evaluation (Coconut-mode models)
  // Adaptive depth: the unpruned models of prune.models evaluated with early exit at each threshold
  // (ForwardOptions::exit_threshold), next to static pruning.
  std::vector<double> exit_thresholds;
  int64_t exit_min_layers = 1;
  SweepRouter router;
  // Any-depth models (trained with stochastic depth, layer_drop or prefix_drop;
  // docs/adaptive-depth.md), for the unpruned models of prune.models: each run at its first K
  // layers, the prompt included (structure prefix), and through depth cascades (structure cascade):
  // each of `cascades` ("5,8@0.97", or "trained": the model's coconut.json), and the trained depths
  // at the confidence whose mean FLOPs on the valid questions stay within each fraction of
  // `cascade_flops` of the full model's, or with the learn-then-test guarantee at each risk of
  // `cascade_risk` (at level cascade_risk_delta; eval's --cascade-risk), both chosen on the valid
  // questions (the test questions never choose it).
  std::vector<int64_t> prefix_depths;
  std::vector<std::string> cascades;
  std::vector<double> cascade_flops;
  std::vector<double> cascade_risk;
  double cascade_risk_delta = 0.1;
  // Every Coconut-mode model also evaluated with its thoughts replaced by each control of
  // reasoning/thought_control.h (zero, noise, shuffle, mean, token), seeded by `seed`; mean feeds the
  // mean thought of the valid questions. Kept out of the Pareto frontier: a control is a test of the
  // thoughts, not a way to answer.
  std::vector<std::string> thought_controls;
  int64_t report_latents = -1;               // the thoughts of the by-layers plots; -1: the largest of `latents`
  int64_t eval_examples = 0;                 // first N test questions (0 = all)
  int64_t latency_questions = 20;            // timed one at a time
  int64_t eval_batch_size = 32, max_new_tokens = 64;
  std::string eval_dtype;                    // float32 | bfloat16 | float16 the cells run in; empty: each checkpoint's
};

// Throws std::invalid_argument naming the file and the key for unknown keys, bad values, models
// that start from an unknown or later entry, pruned models that are not entries.
SweepConfig load_sweep_config(const std::string& path);
SweepConfig sweep_config_from_yaml_text(const std::string& text, const std::string& source);

// One cell of the grid and what it measured.
struct SweepCell {
  std::string model, mode;
  std::string structure = "full";    // full | layers | heads | exit | router | prefix | cascade | control
  // layers: angular|bi|ablation; heads: grad; router: p<penalty>; prefix: first<K>; cascade: the
  // spec with '+' for ',' ("5+8@0.97"), "trained", flops<fraction> or risk<epsilon>; control: the
  // thought control (zero, noise, shuffle, mean, token); full: empty
  std::string score;
  int64_t layers_removed = 0;
  std::string dropped;               // the layers removed, e.g. "1 2" (head count for heads; the cascade run for cascade)
  double head_fraction = 0;
  bool healed = false;
  int64_t latents = -1;              // thoughts asked for (-1: the trained prompt)
  double exit_threshold = 0;         // early exit (structure exit)
  double router_threshold = 0;       // the depth router's gate (structure router)
  double mean_layers = 0;            // layers run per thought / decoded token
  // task text: accuracy is the mean acc_norm over the choice sets, flops_per_answer the FLOPs per
  // token at the window's context, latency_seconds the seconds per window of the perplexity run.
  double accuracy = 0, generated_tokens = 0, latent_thoughts = 0, flops_per_answer = 0, latency_seconds = 0;
  double perplexity = 0;             // task text: of the test text; else 0
  int64_t parameters = 0, layers = 0, questions = 0;
  std::string model_dir;

  std::string key() const;           // what identifies the cell across runs
  std::string label() const;         // e.g. "coconut -2L angular healed, 3 thoughts"
};

// The CSV of cells (header + one row each) and back; throws naming `source` for a malformed file.
std::string cells_to_csv(const std::vector<SweepCell>& cells);
std::vector<SweepCell> cells_from_csv(const std::string& text, const std::string& source);

// Indices of the cells on the Pareto frontier of (cost, accuracy): no other cell costs at most as
// much and is at least as accurate, one of them strictly. Sorted by cost.
std::vector<size_t> pareto_frontier(const std::vector<double>& cost, const std::vector<double>& accuracy);

// Runs (or resumes) the sweep; returns the cells. Progress (cell i of N, ETA) goes to `progress`.
std::vector<SweepCell> run_sweep(const SweepConfig& config, std::ostream& progress);

}  // namespace coconut
