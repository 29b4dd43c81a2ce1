// `coconut sweep` end to end on a tiny grid: one CSV row per planned cell, the values of a cell
// equal what `coconut eval` measures on its model folder, pruned variants really are smaller, the
// plots and report exist, a second run redoes nothing, a run that lost cells redoes only those, and
// a changed experiment in the same folder is refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "support/run_cli.h"
#include "support/temp_dir.h"

using coconut::testing::read_text;
using coconut::testing::run_coconut;
using coconut::testing::TempDir;

namespace {

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) {
    rows.emplace_back();
    std::stringstream fields(line);
    std::string field;
    while (std::getline(fields, field, ',')) rows.back().push_back(field);
    if (!line.empty() && line.back() == ',') rows.back().emplace_back();
  }
  return rows;
}

void write_config(const TempDir& dir, const std::string& cot_epochs = "1") {
  std::ofstream yaml(dir.file("grid.yaml"));
  yaml << "output_dir: " << dir.file("out") << "\nseed: 3\n"
       << "data: {task: sums, digits: 3, train_examples: 300, valid_examples: 20, test_examples: 24}\n"
       << "latents: [0, 2]\nlatency_questions: 2\nmax_new_tokens: 12\nexit_thresholds: [0.3]\n"
       << "train:\n  batch_size: 16\n  lr: 3.0e-3\n  log_every: 100\n  val_generate_limit: 4\n  max_new_tokens: 12\n"
       << "  model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3, num_attention_heads: 4,\n"
       << "          num_key_value_heads: 2, max_position_embeddings: 64, tie_word_embeddings: true}\n"
       << "models:\n  cot: {mode: cot, num_epochs: " << cot_epochs << "}\n"
       << "  coconut: {mode: coconut, from: cot, max_latent_stage: 2, epochs_per_stage: 1, num_epochs: 3, pad_latent_to_max: true}\n"
       << "prune:\n  models: [coconut]\n  layer_scores: [angular, bi]\n  layers_removed: [1]\n  head_fractions: [0.5]\n"
       << "  heal: [false, true]\n  heal_train: {num_epochs: 1}\n  score_samples: 8\n"
       << "router: {penalties: [1.0], thresholds: [0.5], train: {num_epochs: 1, router_init_bias: 1.0}}\n";
}

// The first `total` released ProsQA questions: the first `valid` as valid.json, the rest as test.json.
void write_released_split(const TempDir& dir, size_t valid_count, size_t total) {
  const auto released = nlohmann::json::parse(read_text(std::string(COCONUT_SOURCE_DIR) + "/data/prosqa/valid.json"));
  nlohmann::json valid = nlohmann::json::array(), test = nlohmann::json::array();
  for (size_t i = 0; i < total; ++i) (i < valid_count ? valid : test).push_back(released[i]);
  std::ofstream(dir.file("valid.json")) << valid.dump();
  std::ofstream(dir.file("test.json")) << test.dump();
}

// `coconut eval` of `model` on test.json with `flags`: its summary (and NAME.jsonl beside it).
nlohmann::json eval_summary(const TempDir& dir, const std::string& model, int64_t max_new_tokens, const std::string& flags,
                            const std::string& name) {
  EXPECT_EQ(run_coconut("eval --model " + model + " --data " + dir.file("test.json") + " --max-new-tokens " +
                            std::to_string(max_new_tokens) + " --batch-size 32 " + flags + " --summary " + dir.file(name + ".json") +
                            " --out " + dir.file(name + ".jsonl"),
                        dir.file(name + ".log")),
            0)
      << read_text(dir.file(name + ".log"));
  return nlohmann::json::parse(read_text(dir.file(name + ".json")));
}

}  // namespace

TEST(CliSweep, RunsTheGridResumesAndRefusesAnotherExperiment) {
  TempDir dir;
  write_config(dir);
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("first.log")), 0) << read_text(dir.file("first.log"));

  // cot: 1 cell; coconut: (full + early exit + router + 2 scores x 1 size x healed/not + 1 head fraction x
  // healed/not) x 2 thoughts = 18.
  const auto rows = read_csv(dir.file("out/results.csv"));
  ASSERT_EQ(rows.size(), 1u + 19u);
  const auto& header = rows[0];
  const auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  for (const auto& name : {"model", "structure", "score", "healed", "latents", "accuracy", "flops_per_answer", "mean_layers",
                           "latency_seconds", "parameters", "layers", "model_dir"})
    ASSERT_LT(column(name), header.size()) << name;

  int64_t full_parameters = 0;
  for (size_t r = 1; r < rows.size(); ++r)
    if (rows[r][column("model")] == "coconut" && rows[r][column("structure")] == "full")
      full_parameters = std::stoll(rows[r][column("parameters")]);
  ASSERT_GT(full_parameters, 0);
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    EXPECT_GT(std::stod(row[column("flops_per_answer")]), 0) << r;
    EXPECT_GT(std::stod(row[column("latency_seconds")]), 0) << r;
    if (row[column("structure")] == "layers") {
      EXPECT_EQ(row[column("layers")], "2") << r;
      EXPECT_LT(std::stoll(row[column("parameters")]), full_parameters) << r;
    }
    // Fewer layers per thought/token, fewer FLOPs than the full model: the cells are built so that
    // skipping must happen (exit threshold 0.3 on the angular distance; router penalty 1.0 from an
    // initial bias of 1.0, threshold 0.5), measured 1.5-1.9 layers (exit) and 0.5-1.05 (router) of
    // 3. Strict: a cell that never skips runs 3 layers and the full model's FLOPs.
    if (row[column("structure")] == "exit" || row[column("structure")] == "router") {
      EXPECT_LT(std::stod(row[column("mean_layers")]), 3.0) << r << " " << row[column("structure")] << " never skipped";
      size_t compared = 0;
      for (const auto& other : rows)
        if (other[column("structure")] == "full" && other[column("model")] == "coconut" &&
            other[column("latents")] == row[column("latents")]) {
          EXPECT_LT(std::stod(row[column("flops_per_answer")]), std::stod(other[column("flops_per_answer")])) << r;
          ++compared;
        }
      EXPECT_EQ(compared, 1u) << r;
    }
    if (row[column("structure")] == "heads") {
      EXPECT_LT(std::stoll(row[column("parameters")]), full_parameters) << r;
    }
  }

  // A cell's figures are what `coconut eval` measures on its model folder with its thoughts.
  size_t checked = 0;
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row[column("structure")] != "layers" || row[column("healed")] != "1" || row[column("latents")] != "2") continue;
    ASSERT_EQ(run_coconut("eval --model " + row[column("model_dir")] + " --data " + dir.file("out/data/test.json") +
                              " --latents 2 --max-new-tokens 12 --batch-size 32 --summary " + dir.file("eval.json"),
                          dir.file("eval.log")), 0) << read_text(dir.file("eval.log"));
    const auto summary = nlohmann::json::parse(read_text(dir.file("eval.json")));
    EXPECT_NEAR(summary["accuracy"].get<double>(), std::stod(row[column("accuracy")]), 1e-6);
    EXPECT_NEAR(summary["mean_flops"].get<double>(), std::stod(row[column("flops_per_answer")]), 1.0);
    ++checked;
  }
  EXPECT_EQ(checked, 2u);
  // A router cell: its folder holds a model with gates, measured by `coconut eval --router-threshold`.
  checked = 0;
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row[column("structure")] != "router" || row[column("latents")] != "2") continue;
    EXPECT_EQ(row[column("score")], "p1");
    const auto config = nlohmann::json::parse(read_text(row[column("model_dir")] + "/config.json"));
    EXPECT_TRUE(config.value("depth_router", false));
    ASSERT_EQ(run_coconut("eval --model " + row[column("model_dir")] + " --data " + dir.file("out/data/test.json") +
                              " --latents 2 --max-new-tokens 12 --batch-size 32 --router-threshold 0.5 --summary " +
                              dir.file("eval.json"),
                          dir.file("eval.log")), 0) << read_text(dir.file("eval.log"));
    const auto summary = nlohmann::json::parse(read_text(dir.file("eval.json")));
    EXPECT_NEAR(summary["accuracy"].get<double>(), std::stod(row[column("accuracy")]), 1e-6);
    EXPECT_NEAR(summary["mean_layers"].get<double>(), std::stod(row[column("mean_layers")]), 1e-4);
    EXPECT_NEAR(summary["mean_flops"].get<double>(), std::stod(row[column("flops_per_answer")]), 1.0);
    // --budget calibrates the gate threshold: the largest one that still runs at least that many layers.
    ASSERT_EQ(run_coconut("eval --model " + row[column("model_dir")] + " --data " + dir.file("out/data/test.json") +
                              " --latents 2 --max-new-tokens 12 --batch-size 32 --budget 2.5 --summary " + dir.file("budget.json"),
                          dir.file("budget.log")), 0) << read_text(dir.file("budget.log"));
    const auto budget = nlohmann::json::parse(read_text(dir.file("budget.json")));
    EXPECT_GE(budget["mean_layers"].get<double>(), 2.5);
    EXPECT_GT(budget["router_threshold"].get<double>(), 0.0);
    EXPECT_NE(read_text(dir.file("budget.log")).find("router threshold"), std::string::npos);
    ++checked;
  }
  EXPECT_EQ(checked, 1u);

  for (const auto& file : {"accuracy_vs_flops.png", "accuracy_vs_layers_removed.png", "accuracy_vs_heads_removed.png",
                           "accuracy_vs_latents.png", "layer_scores_coconut.png", "adaptive_vs_static.png", "report.md", "scores/coconut.json"})
    EXPECT_TRUE(std::filesystem::exists(dir.file("out/" + std::string(file)))) << file;
  const std::string report = read_text(dir.file("out/report.md"));
  EXPECT_NE(report.find("## The Pareto frontier"), std::string::npos);
  EXPECT_NE(report.find("Removing layer"), std::string::npos);

  // A second run finds every cell done and trains nothing.
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("second.log")), 0) << read_text(dir.file("second.log"));
  const std::string second = read_text(dir.file("second.log"));
  EXPECT_NE(second.find("19 of 19 cells were finished by an earlier run"), std::string::npos) << second;
  EXPECT_EQ(second.find("training ("), std::string::npos) << second;

  // Cells lost (a run killed midway) are redone, and only they, with the same results.
  {
    std::ofstream truncated(dir.file("out/results.csv"));
    for (size_t r = 0; r + 3 < rows.size(); ++r) {
      for (size_t c = 0; c < rows[r].size(); ++c) truncated << (c ? "," : "") << rows[r][c];
      truncated << "\n";
    }
  }
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("third.log")), 0) << read_text(dir.file("third.log"));
  EXPECT_NE(read_text(dir.file("third.log")).find("16 of 19 cells were finished"), std::string::npos) << read_text(dir.file("third.log"));
  const auto again = read_csv(dir.file("out/results.csv"));
  ASSERT_EQ(again.size(), rows.size());
  for (size_t r = 1; r < rows.size(); ++r) EXPECT_EQ(again[r][column("accuracy")], rows[r][column("accuracy")]) << r;

  // Another training setup in the same folder is refused, naming the folder.
  write_config(dir, "2");
  EXPECT_NE(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("fourth.log")), 0);
  EXPECT_NE(read_text(dir.file("fourth.log")).find("holds a sweep made with other data"), std::string::npos)
      << read_text(dir.file("fourth.log"));
}

// data: {task: prosqa} generates the training questions (healing reads them) with the released
// set's names, and measures the cells on the released validation set: here on the shipped model.
TEST(CliSweep, ProsqaGeneratesItsTrainingQuestionsFromTheReleasedNames) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  {
    std::ofstream yaml(dir.file("grid.yaml"));
    yaml << "output_dir: " << dir.file("out") << "\nseed: 3\n"
         << "data: {task: prosqa, train_examples: 40, valid: " << source << "/data/prosqa/valid.json}\n"
         << "latents: [6]\neval_examples: 8\nlatency_questions: 1\nmax_new_tokens: 12\n"
         << "train: {batch_size: 16, lr: 1.0e-4, log_every: 100, val_split: 8, val_generate_limit: 2, word_forms: true, articles: joined}\n"
         << "models:\n  coconut: {mode: coconut, use: " << source << "/models/prosqa-coconut-2l}\n"
         << "prune: {models: [coconut], layers_removed: [1], heal: [true], heal_train: {num_epochs: 1}, score_samples: 4}\n";
  }
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("sweep.log")), 0) << read_text(dir.file("sweep.log"));
  const auto train = nlohmann::json::parse(read_text(dir.file("out/data/train.json")));
  ASSERT_EQ(train.size(), 40u);
  const auto released = nlohmann::json::parse(read_text(source + "/data/prosqa/valid.json"));
  std::set<std::string> released_names;
  for (const auto& example : released)
    for (const auto& name : example["idx_to_symbol"]) released_names.insert(name.get<std::string>());
  for (const auto& example : train)
    for (const auto& name : example["idx_to_symbol"]) EXPECT_TRUE(released_names.count(name.get<std::string>())) << name;
  // The unpruned model and one healed variant with a layer removed, both measured.
  const auto rows = read_csv(dir.file("out/results.csv"));
  EXPECT_EQ(rows.size(), 1u + 2u);
}

// An any-depth model's cells (the shipped ProsQA one, trained with prefix_drop, whose coconut.json
// makes its depth cascade eval's default): the full cell runs every layer, a prefix cell is what
// `coconut eval --depth K` measures, the trained cascade what plain `coconut eval` measures, and a
// cascade calibrated to a FLOPs fraction chooses its confidence on the valid questions, not the test.
TEST(CliSweep, AnyDepthCellsMatchEvalAtEachDepth) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = source + "/models/prosqa-coconut-anydepth";
  write_released_split(dir, 16, 24);
  {
    std::ofstream yaml(dir.file("grid.yaml"));
    yaml << "output_dir: " << dir.file("out") << "\nlatency_questions: 1\nmax_new_tokens: 12\n"
         << "data: {train: " << dir.file("valid.json") << ", valid: " << dir.file("valid.json") << ", test: " << dir.file("test.json") << "}\n"
         << "models:\n  anydepth: {mode: coconut, use: " << model << "}\n"
         << "prune: {models: [anydepth]}\nprefix_depths: [6]\ncascades: [trained, '5,8@1']\ncascade_flops: [0.8]\n"
         << "cascade_risk: [0.3]\ncascade_risk_delta: 0.2\n";
  }
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("sweep.log")), 0) << read_text(dir.file("sweep.log"));
  const auto rows = read_csv(dir.file("out/results.csv"));
  ASSERT_EQ(rows.size(), 1u + 6u);  // the header, the full cell, one prefix, four cascades
  const auto& header = rows[0];
  const auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  std::map<std::string, std::vector<std::string>> by_score;
  for (size_t r = 1; r < rows.size(); ++r) by_score[rows[r][column("structure")] + ":" + rows[r][column("score")]] = rows[r];
  const auto eval_of = [&](const std::string& flags, const std::string& name) { return eval_summary(dir, model, 12, flags, name); };
  const auto same_as = [&](const std::vector<std::string>& row, const nlohmann::json& eval, const std::string& what) {
    EXPECT_NEAR(std::stod(row[column("accuracy")]), eval["accuracy"].get<double>(), 1e-6) << what;
    EXPECT_NEAR(std::stod(row[column("flops_per_answer")]), eval["mean_flops"].get<double>(), 1e-6 * eval["mean_flops"].get<double>() + 1)
        << what;
    EXPECT_NEAR(std::stod(row[column("mean_layers")]), eval["mean_layers"].get<double>(), 1e-3) << what;
  };
  ASSERT_TRUE(by_score.count("full:") && by_score.count("prefix:first6") && by_score.count("cascade:trained") &&
              by_score.count("cascade:5+8@1") && by_score.count("cascade:flops0.8") && by_score.count("cascade:risk0.3"))
      << read_text(dir.file("out/results.csv"));
  const auto full = eval_of("--depth full", "full");
  EXPECT_DOUBLE_EQ(full["mean_layers"].get<double>(), 8.0);
  same_as(by_score["full:"], full, "full");
  same_as(by_score["prefix:first6"], eval_of("--depth 6", "depth6"), "first 6 layers");
  EXPECT_EQ(by_score["prefix:first6"][column("layers")], "6");
  EXPECT_LT(std::stoll(by_score["prefix:first6"][column("parameters")]), std::stoll(by_score["full:"][column("parameters")]));
  same_as(by_score["cascade:trained"], eval_of("", "default"), "the trained cascade (eval's default)");
  // A thought control runs every layer, not the trained cascade, unless a depth is given.
  EXPECT_DOUBLE_EQ(eval_of("--thought-control zero", "zero")["mean_layers"].get<double>(), 8.0);
  EXPECT_EQ(by_score["cascade:trained"][column("dropped")], "5+8@0.97717");
  // Every question taken deeper: the full model's answers, at the cost of both levels.
  const auto& always = by_score["cascade:5+8@1"];
  EXPECT_NEAR(std::stod(always[column("accuracy")]), full["accuracy"].get<double>(), 1e-6);
  EXPECT_GT(std::stod(always[column("flops_per_answer")]), full["mean_flops"].get<double>());
  EXPECT_EQ(by_score["cascade:flops0.8"][column("dropped")].rfind("5+8@", 0), 0u);
  EXPECT_EQ(by_score["cascade:risk0.3"][column("dropped")].rfind("5+8@", 0), 0u);
  const std::string log = read_text(dir.file("sweep.log"));
  EXPECT_NE(log.find("calibrating the cascade to 0.8 of the full model's FLOPs on " + dir.file("valid.json")), std::string::npos) << log;
  EXPECT_NE(log.find("choosing the cascade's confidence for risk 0.3 at level 0.2 on " + dir.file("valid.json")), std::string::npos)
      << log;
  const std::string report = read_text(dir.file("out/report.md"));
  EXPECT_NE(report.find("anydepth first 6 layers"), std::string::npos);
  EXPECT_NE(report.find("anydepth cascade flops0.8 (5+8@"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/adaptive_vs_static.png")));
}

// A cascade calibrated on the questions it is measured on would choose its threshold on the test.
TEST(CliSweep, CascadeFlopsRefusesToCalibrateOnTheTestQuestions) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  {
    std::ofstream yaml(dir.file("grid.yaml"));
    yaml << "output_dir: " << dir.file("out") << "\nlatency_questions: 0\neval_examples: 2\n"
         << "data: {task: prosqa, train_examples: 8, valid: " << source << "/data/prosqa/valid.json}\n"
         << "models:\n  anydepth: {mode: coconut, use: " << source << "/models/prosqa-coconut-anydepth}\n"
         << "prune: {models: [anydepth]}\ncascade_flops: [0.8]\n";
  }
  EXPECT_NE(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("sweep.log")), 0);
  EXPECT_NE(read_text(dir.file("sweep.log")).find("cascade_flops and cascade_risk calibrate on the valid questions; give a test file"),
            std::string::npos)
      << read_text(dir.file("sweep.log"));
}

// Thought-control cells are `coconut eval --thought-control` on the same questions (mean over the
// valid questions' thoughts, the sweep's seed), kept off the frontier and tabled in the report; and
// eval's zero control is the run with --latents 0.
TEST(CliSweep, ThoughtControlCellsMatchEvalsControls) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = source + "/models/prosqa-coconut";
  write_released_split(dir, 8, 20);
  {
    std::ofstream yaml(dir.file("grid.yaml"));
    yaml << "output_dir: " << dir.file("out") << "\nseed: 5\nlatency_questions: 0\nmax_new_tokens: 16\n"
         << "data: {train: " << dir.file("valid.json") << ", valid: " << dir.file("valid.json") << ", test: " << dir.file("test.json") << "}\n"
         << "models:\n  coconut: {mode: coconut, use: " << model << "}\n"
         << "thought_controls: [zero, noise, mean]\n";
  }
  ASSERT_EQ(run_coconut("sweep " + dir.file("grid.yaml"), dir.file("sweep.log")), 0) << read_text(dir.file("sweep.log"));
  const auto rows = read_csv(dir.file("out/results.csv"));
  ASSERT_EQ(rows.size(), 1u + 4u);  // the header, the normal cell, three controls
  const auto& header = rows[0];
  const auto column = [&](const std::string& name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  std::map<std::string, std::vector<std::string>> by_score;
  for (size_t r = 1; r < rows.size(); ++r) by_score[rows[r][column("structure")] + ":" + rows[r][column("score")]] = rows[r];
  const auto eval_of = [&](const std::string& flags, const std::string& name) { return eval_summary(dir, model, 16, flags, name); };
  const auto normal = eval_of("", "normal");
  EXPECT_TRUE(normal["thought_control"].is_null());
  EXPECT_NEAR(std::stod(by_score["full:"][column("accuracy")]), normal["accuracy"].get<double>(), 1e-6);
  const auto zero = eval_of("--thought-control zero", "zero");
  const auto no_latents = eval_of("--latents 0", "latents0");
  EXPECT_DOUBLE_EQ(zero["accuracy"].get<double>(), no_latents["accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(zero["mean_flops"].get<double>(), no_latents["mean_flops"].get<double>());
  EXPECT_EQ(zero["mean_latent_thoughts"].get<double>(), 0.0);
  EXPECT_EQ(zero["thought_control"]["control"], "zero");
  EXPECT_DOUBLE_EQ(zero["thought_control"]["uncontrolled_accuracy"].get<double>(), normal["accuracy"].get<double>());
  // The per-question records carry the normal run's verdict; the McNemar counts are theirs.
  int64_t only_normal = 0, only_zero = 0;
  std::istringstream records(read_text(dir.file("zero.jsonl")));
  for (std::string line; std::getline(records, line);) {
    const auto record = nlohmann::json::parse(line);
    only_normal += record["uncontrolled_correct"].get<bool>() && !record["correct"].get<bool>();
    only_zero += !record["uncontrolled_correct"].get<bool>() && record["correct"].get<bool>();
  }
  EXPECT_EQ(zero["thought_control"]["only_uncontrolled_right"].get<int64_t>(), only_normal);
  EXPECT_EQ(zero["thought_control"]["only_controlled_right"].get<int64_t>(), only_zero);
  EXPECT_NEAR(std::stod(by_score["control:zero"][column("accuracy")]), zero["accuracy"].get<double>(), 1e-6);
  const auto noise = eval_of("--thought-control noise --control-seed 5", "noise");
  EXPECT_NEAR(std::stod(by_score["control:noise"][column("accuracy")]), noise["accuracy"].get<double>(), 1e-6);
  const auto mean = eval_of("--thought-control mean --thought-calibration " + dir.file("valid.json"), "mean");
  EXPECT_EQ(mean["thought_control"]["mean_over"]["questions"].get<int64_t>(), 8);
  EXPECT_NEAR(std::stod(by_score["control:mean"][column("accuracy")]), mean["accuracy"].get<double>(), 1e-6);
  const std::string report = read_text(dir.file("out/report.md"));
  EXPECT_NE(report.find("## Thought controls"), std::string::npos) << report;
  const auto frontier = report.substr(report.find("## The Pareto frontier"), report.find("![accuracy vs FLOPs") - report.find("## The Pareto frontier"));
  EXPECT_EQ(frontier.find("thoughts zero"), std::string::npos) << frontier;
  // A calibration set is for the mean only.
  EXPECT_NE(run_coconut("eval --model " + model + " --data " + dir.file("test.json") + " --thought-control noise --thought-calibration " +
                            dir.file("valid.json"),
                        dir.file("bad.log")),
            0);
  EXPECT_NE(read_text(dir.file("bad.log")).find("--thought-control mean only"), std::string::npos) << read_text(dir.file("bad.log"));
}
