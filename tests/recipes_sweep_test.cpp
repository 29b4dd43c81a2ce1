// The sweep's pieces that need no training: its config (errors name the file and the key), the
// CSV of cells (round trip) and the Pareto frontier (against a brute-force definition).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>

#include "recipes/sweep.h"
#include "recipes/train_config.h"

using coconut::SweepCell;

namespace {

const char* kMinimal =
    "data: {task: sums, digits: 3}\n"
    "models:\n  cot: {mode: cot}\n  coconut: {mode: coconut, from: cot, max_latent_stage: 2}\n";

std::string error_of(const std::string& text) {
  try {
    coconut::sweep_config_from_yaml_text(text, "grid.yaml");
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST(SweepConfig, ReadsModelsInOrderWithTheirModesAndOrigins) {
  const auto config = coconut::sweep_config_from_yaml_text(
      std::string(kMinimal) + "latents: [0, 2]\nprune: {models: [coconut], layers_removed: [1, 2], heal: [false, true]}\n",
      "grid.yaml");
  ASSERT_EQ(config.models.size(), 2u);
  EXPECT_EQ(config.models[0].name, "cot");
  EXPECT_EQ(config.models[1].mode, "coconut");
  EXPECT_EQ(config.models[1].from, "cot");
  EXPECT_FALSE(config.models[1].train["from"]);  // not passed on to training
  EXPECT_EQ(config.latents, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(config.pruning.layers_removed, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(config.pruning.heal, (std::vector<bool>{false, true}));
  EXPECT_EQ(config.pruning.layer_scores, (std::vector<std::string>{"angular"}));
}

TEST(SweepConfig, BadInputIsNamed) {
  EXPECT_NE(error_of(std::string(kMinimal) + "latent: [1]\n").find("grid.yaml: unknown key 'latent'"), std::string::npos);
  EXPECT_NE(error_of("models: {cot: {mode: cot}}\n").find("missing key 'data'"), std::string::npos);
  EXPECT_NE(error_of("data: {task: sums}\nmodels:\n  b: {mode: coconut, from: a}\n  a: {mode: cot}\n")
                .find("models: b: from: 'a' is not an earlier entry"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prune: {models: [icot]}\n").find("'icot' is not an entry"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prune: {models: [cot], layer_scores: [cosine]}\n").find("'cosine'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prune: {models: [cot], layers_removed: [0]}\n").find("layers_removed"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "latents: [a]\n").find("key 'latents'"), std::string::npos);
  EXPECT_NE(error_of("data: {task: sums}\nmodels: {x: {mode: thinking}}\n").find("thinking"), std::string::npos);
  EXPECT_NE(error_of("data: [\n").find("grid.yaml: malformed YAML"), std::string::npos);
  EXPECT_NE(error_of("data: {task: prosqa}\nmodels: {cot: {mode: cot}}\n").find("give the valid file"), std::string::npos);
  EXPECT_NE(error_of("data: {task: prosqa, valid: v.json, train: t.json}\nmodels: {cot: {mode: cot}}\n").find("no train file"),
            std::string::npos);
  EXPECT_NE(error_of("data: {task: gsm}\nmodels: {cot: {mode: cot}}\n").find("task must be 'sums', 'prosqa' or 'text'"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "router: {penalties: [1]}\n").find("router: routers are trained for prune.models"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prune: {models: [cot]}\nrouter: {penalties: [1], thresholds: [1.5]}\n")
                .find("router: thresholds"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prune: {models: [cot]}\nrouter: {penalty: [1]}\n").find("unknown key 'penalty'"),
            std::string::npos);
}

TEST(SweepConfig, ReadsTheAnyDepthAxesAndNamesBadOnes) {
  const auto config = coconut::sweep_config_from_yaml_text(
      std::string(kMinimal) + "prune: {models: [coconut]}\nprefix_depths: [2, 3]\ncascades: [trained, '2,4@0.9']\ncascade_flops: 0.7\n",
      "grid.yaml");
  EXPECT_EQ(config.prefix_depths, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(config.cascades, (std::vector<std::string>{"trained", "2,4@0.9"}));
  EXPECT_EQ(config.cascade_flops, (std::vector<double>{0.7}));
  const std::string pruned = std::string(kMinimal) + "prune: {models: [coconut]}\n";
  EXPECT_NE(error_of(pruned + "prefix_depths: [0]\n").find("grid.yaml: prefix_depths: each must be >= 1"), std::string::npos);
  EXPECT_NE(error_of(pruned + "cascades: ['2,x@0.9']\n").find("grid.yaml: cascades:"), std::string::npos);
  EXPECT_NE(error_of(pruned + "cascade_flops: [1.5]\n").find("grid.yaml: cascade_flops: each must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "prefix_depths: [2]\n").find("are for prune.models"), std::string::npos);
  EXPECT_NE(error_of(pruned + "cascade_risk: [0]\n").find("grid.yaml: cascade_risk: each must be in (0, 1)"), std::string::npos);
  EXPECT_NE(error_of(pruned + "cascade_risk: [0.1]\ncascade_risk_delta: 1\n").find("cascade_risk_delta must be in (0, 1)"),
            std::string::npos);
  EXPECT_EQ(coconut::sweep_config_from_yaml_text(pruned + "cascade_risk: 0.02\ncascade_risk_delta: 0.05\n", "grid.yaml").cascade_risk_delta,
            0.05);
  // The labels say what ran; a cascade spec keeps no ',' (the CSV's separator).
  SweepCell prefix;
  prefix.model = "m", prefix.structure = "prefix", prefix.score = "first5";
  EXPECT_EQ(prefix.label(), "m first 5 layers");
  SweepCell calibrated = prefix;
  calibrated.structure = "cascade", calibrated.score = "flops0.7", calibrated.dropped = "5+8@0.97717";
  EXPECT_EQ(calibrated.label(), "m cascade flops0.7 (5+8@0.97717)");
  const auto back = coconut::cells_from_csv(coconut::cells_to_csv({prefix, calibrated}), "results.csv");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].key(), calibrated.key());
  EXPECT_NE(back[0].key(), back[1].key());
}

TEST(SweepConfig, ReadsTheRouterAxis) {
  const auto config = coconut::sweep_config_from_yaml_text(
      std::string(kMinimal) + "prune: {models: [coconut]}\nrouter: {penalties: [0.5, 2], thresholds: [0.3, 0.5], train: {num_epochs: 2}}\n",
      "grid.yaml");
  EXPECT_EQ(config.router.penalties, (std::vector<double>{0.5, 2}));
  EXPECT_EQ(config.router.thresholds, (std::vector<double>{0.3, 0.5}));
  EXPECT_EQ(config.router.train["num_epochs"].as<int>(), 2);
}

TEST(SweepConfig, ReadsTheThoughtControlsAndNamesBadOnes) {
  const auto config = coconut::sweep_config_from_yaml_text(std::string(kMinimal) + "thought_controls: [zero, shuffle, token]\n",
                                                           "grid.yaml");
  EXPECT_EQ(config.thought_controls, (std::vector<std::string>{"zero", "shuffle", "token"}));
  EXPECT_NE(error_of(std::string(kMinimal) + "thought_controls: [blank]\n").find("grid.yaml: thought_controls: unknown thought control 'blank'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "thought_controls: [none]\n").find("grid.yaml: thought_controls: none is the normal run"),
            std::string::npos);
  SweepCell control;
  control.model = "coconut", control.structure = "control", control.score = "noise", control.latents = 3;
  EXPECT_EQ(control.label(), "coconut thoughts noise, 3 thoughts");
}

const char* kText =
    "data: {task: text, train: heal.txt, valid: calibration.txt, test: test.txt, test_tokens: 4096, window: 256,\n"
    "       choices: [a.jsonl, b.jsonl], choice_items: 100}\n"
    "models: {base: {use: models/base}}\n";

TEST(SweepConfig, ReadsATextSweepAndRefusesWhatTextCannotMeasure) {
  const auto config = coconut::sweep_config_from_yaml_text(std::string(kText) + "prune: {models: [base], layers_removed: [2, 4]}\n",
                                                           "text.yaml");
  EXPECT_TRUE(config.data.text());
  EXPECT_EQ(config.data.test_tokens, 4096);
  EXPECT_EQ(config.data.window, 256);
  EXPECT_EQ(config.data.choices, (std::vector<std::string>{"a.jsonl", "b.jsonl"}));
  EXPECT_EQ(config.data.choice_items, 100);
  EXPECT_EQ(coconut::sweep_config_from_yaml_text(std::string(kText) + "eval_dtype: bfloat16\n", "t.yaml").eval_dtype, "bfloat16");
  EXPECT_NE(error_of(std::string(kText) + "eval_dtype: float8\n").find("eval_dtype"), std::string::npos);
  EXPECT_NE(error_of(std::string(kText) + "latents: [1]\n").find("latents answers questions"), std::string::npos);
  EXPECT_NE(error_of(std::string(kText) + "prune: {models: [base]}\nexit_thresholds: [0.5]\n").find("exit_thresholds"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kText) + "prune: {models: [base], ablation_metric: accuracy}\n").find("calibration text's loss"),
            std::string::npos);
  EXPECT_NE(error_of("data: {task: text, train: a.txt, valid: b.txt, test: a.txt}\nmodels: {m: {use: x}}\n")
                .find("neither the train nor the valid text"), std::string::npos);
  EXPECT_NE(error_of("data: {task: text, train: a.txt, valid: b.txt}\nmodels: {m: {use: x}}\n").find("needs the train"),
            std::string::npos);
  EXPECT_NE(error_of("data: {task: text, train: a.txt, valid: b.txt, test: c.txt}\nmodels: {m: {mode: cot}}\n")
                .find("models: m: task: text trains in mode lm"), std::string::npos);
  EXPECT_NE(error_of("data: {task: sums, window: 8}\nmodels: {m: {mode: cot}}\n").find("data: window is for task: text"),
            std::string::npos);
  EXPECT_NE(error_of("data: {task: text, train: a.txt, valid: b.txt, test: c.txt, window: 1}\nmodels: {m: {use: x}}\n")
                .find("window and test_tokens"), std::string::npos);
}

TEST(SweepCells, CsvRoundTripKeepsEveryField) {
  SweepCell cell;
  cell.model = "coconut", cell.mode = "coconut", cell.structure = "layers", cell.score = "bi";
  cell.layers_removed = 2, cell.dropped = "1 2", cell.healed = true, cell.latents = 3;
  cell.accuracy = 0.9133, cell.generated_tokens = 4.25, cell.latent_thoughts = 3, cell.flops_per_answer = 2.5e7;
  cell.latency_seconds = 0.00125, cell.parameters = 1052160, cell.layers = 2, cell.questions = 300;
  cell.exit_threshold = 0.05, cell.mean_layers = 1.75;
  cell.model_dir = "runs/x/variants/coconut-drop-1_2-healed/final";
  cell.perplexity = 23.4567;
  SweepCell full;
  full.model = "cot", full.mode = "cot";
  const auto back = coconut::cells_from_csv(coconut::cells_to_csv({cell, full}), "results.csv");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].key(), cell.key());
  EXPECT_EQ(back[0].dropped, "1 2");
  EXPECT_DOUBLE_EQ(back[0].accuracy, 0.9133);
  EXPECT_DOUBLE_EQ(back[0].flops_per_answer, 2.5e7);
  EXPECT_EQ(back[0].parameters, 1052160);
  EXPECT_DOUBLE_EQ(back[0].mean_layers, 1.75);
  EXPECT_EQ(back[0].model_dir, cell.model_dir);
  EXPECT_DOUBLE_EQ(back[0].perplexity, 23.4567);
  EXPECT_EQ(back[1].key(), full.key());
  // A file written before the perplexity column still loads (perplexity 0).
  std::string without = coconut::cells_to_csv({cell});
  without.replace(without.find(",perplexity\n"), 12, "\n");
  without.replace(without.rfind(",23.4567\n"), 9, "\n");
  const auto old = coconut::cells_from_csv(without, "old.csv");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].model_dir, cell.model_dir);
  EXPECT_EQ(old[0].perplexity, 0);
  EXPECT_EQ(back[0].label(), "coconut -2L bi healed, 3 thoughts");

  EXPECT_THROW(coconut::cells_from_csv("model,accuracy\n", "r.csv"), std::invalid_argument);
  const std::string broken = coconut::cells_to_csv({cell}) + "cot,cot,full\n";
  try {
    coconut::cells_from_csv(broken, "r.csv");
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("r.csv:3: expected 22 fields"), std::string::npos);
  }
}

// A router cell keeps its gate threshold in a column of its own; results written before that
// column existed (the router's gate in exit_threshold) still load, with the same keys, so an old
// sweep folder resumes with every cell reused.
TEST(SweepCells, RouterThresholdHasItsOwnColumnAndOldFilesStillLoad) {
  SweepCell router;
  router.model = "coconut", router.mode = "coconut", router.structure = "router", router.score = "p0.5";
  router.latents = 5, router.router_threshold = 0.3, router.mean_layers = 3.62, router.model_dir = "runs/r/final";
  const auto back = coconut::cells_from_csv(coconut::cells_to_csv({router}), "results.csv");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_DOUBLE_EQ(back[0].router_threshold, 0.3);
  EXPECT_DOUBLE_EQ(back[0].exit_threshold, 0.0);
  EXPECT_EQ(back[0].label(), "coconut router p0.5 gate>0.3, 5 thoughts");

  const std::string old_format =
      "model,mode,structure,score,layers_removed,dropped,head_fraction,healed,latents,accuracy,generated_tokens,"
      "latent_thoughts,flops_per_answer,latency_seconds,parameters,layers,questions,exit_threshold,mean_layers,model_dir\n"
      "coconut,coconut,router,p0.5,0,,0.0000,0,5,0.895000,9.5000,5.0000,616000000.0,0.017800,1592320,6,200,0.30000,3.6200,runs/r/final\n"
      "coconut,coconut,exit,angular,0,,0.0000,0,5,0.995000,9.5000,5.0000,632000000.0,0.018300,1592320,6,200,0.05000,5.8700,models/c\n";
  const auto old = coconut::cells_from_csv(old_format, "old.csv");
  ASSERT_EQ(old.size(), 2u);
  EXPECT_EQ(old[0].key(), router.key());
  EXPECT_DOUBLE_EQ(old[0].router_threshold, 0.3);
  EXPECT_DOUBLE_EQ(old[0].exit_threshold, 0.0);
  EXPECT_DOUBLE_EQ(old[1].exit_threshold, 0.05);
  EXPECT_DOUBLE_EQ(old[1].router_threshold, 0.0);
  EXPECT_DOUBLE_EQ(old[1].mean_layers, 5.87);
}

TEST(SweepPareto, FrontierMatchesTheDefinition) {
  // Hand example (cost, accuracy): cell 1 beats cell 0 at the same cost, cell 3 costs more than
  // cell 2 for less accuracy; cells 1, 2, 4 remain.
  EXPECT_EQ(coconut::pareto_frontier({1, 1, 2, 3, 5}, {0.2, 0.5, 0.7, 0.6, 0.9}), (std::vector<size_t>{1, 2, 4}));
  // Random points (with repeated costs and accuracies) against the O(n^2) definition.
  std::mt19937 random(7);
  std::uniform_int_distribution<int> level(0, 9);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> cost(30), accuracy(30);
    for (size_t i = 0; i < cost.size(); ++i) cost[i] = level(random), accuracy[i] = level(random) / 10.0;
    auto frontier = coconut::pareto_frontier(cost, accuracy);
    std::set<std::pair<double, double>> got, expected;
    for (size_t i : frontier) got.insert({cost[i], accuracy[i]});
    for (size_t i = 0; i < cost.size(); ++i) {
      bool dominated = false;
      for (size_t j = 0; j < cost.size(); ++j)
        dominated |= cost[j] <= cost[i] && accuracy[j] >= accuracy[i] && (cost[j] < cost[i] || accuracy[j] > accuracy[i]);
      if (!dominated) expected.insert({cost[i], accuracy[i]});
    }
    EXPECT_EQ(got, expected) << "trial " << trial;
    EXPECT_EQ(got.size(), frontier.size()) << "one cell per frontier point";
    for (size_t k = 1; k < frontier.size(); ++k) EXPECT_LT(cost[frontier[k - 1]], cost[frontier[k]]);
  }
}

// Every config the repository ships parses, and the trained models a sweep uses are in the
// repository (a clone alone can run it).
TEST(ShippedConfigs, EveryConfigParsesAndItsModelsAreShipped) {
  namespace fs = std::filesystem;
  const fs::path root(COCONUT_SOURCE_DIR);
  int sweeps = 0, trainings = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root / "configs")) {  // configs/smollm2/ too
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    if (name.rfind("sweep_", 0) == 0) {
      const auto config = coconut::load_sweep_config(entry.path().string());
      for (const auto& model : config.models) {
        if (!model.use.empty() && model.use.rfind(".models/", 0) != 0) {  // .models/: fetched by ./run fetch-model
          EXPECT_TRUE(fs::exists(root / model.use / "config.json")) << model.name << ": " << model.use;
        }
      }
      ++sweeps;
    } else {
      EXPECT_NO_THROW(coconut::load_train_config(entry.path().string()));
      ++trainings;
    }
  }
  EXPECT_GE(sweeps, 2);
  EXPECT_GE(trainings, 14);
}
