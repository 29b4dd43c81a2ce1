// The slow tier (`./run test-slow`, ctest label `slow`): every model shipped in models/ reproduces the
// figures models/README.md gives for it, with `coconut eval` on the whole released validation set
// in the repository (200 ProntoQA questions, 300 ProsQA ones): correct answers counted exactly,
// thoughts and generated tokens per answer to the rounding of models/README.md. About 40 seconds on 2 idle cores.
// A regression guard, not a correctness check: the figures it compares with were measured by this
// code when the models were trained, so it says that nothing changed what the shipped models
// answer, not that the answers were right to begin with (the unit tests check the model against
// independent references: naive loops, finite differences, HF transformers, gguf-py, llama.cpp files).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <string>

#include "support/run_cli.h"
#include "support/temp_dir.h"

using coconut::testing::TempDir;

namespace {

struct ShippedFigure {
  const char* model;
  const char* data;
  int questions, correct;
  double thoughts, generated_tokens;  // per answer, as models/README.md rounds them
};

// models/README.md, each model's validation table.
constexpr std::array<ShippedFigure, 18> kFigures{{
    {"prontoqa-cot", "prontoqa", 200, 199, 0, 66.9},
    {"prontoqa-coconut", "prontoqa", 200, 199, 5, 9.5},
    {"prontoqa-coconut-stage6", "prontoqa", 200, 197, 6, 4},
    {"prontoqa-coconut-2h", "prontoqa", 200, 196, 6, 4},
    {"prontoqa-nocot", "prontoqa", 200, 89, 0, 4},
    {"prontoqa-pause-as-thought", "prontoqa", 200, 106, 0, 9.3},  // its five pause tokens are prompt tokens
    {"prosqa-coconut", "prosqa", 300, 289, 6, 7.0},
    {"prosqa-cot", "prosqa", 300, 234, 0, 21.9},
    {"prosqa-coconut-2l", "prosqa", 300, 194, 6, 7},
    {"prosqa-cot-2l", "prosqa", 300, 140, 0, 35.1},
    {"prosqa-coconut-4l", "prosqa", 300, 176, 6, 7},
    {"prosqa-coconut-anydepth", "prosqa", 300, 284, 6, 7.0},  // its depth cascade (coconut.json)
    {"prontoqa-coconut-anydepth", "prontoqa", 200, 195, 5, 9.5},  // its depth cascade (coconut.json)
    {"prosqa-coconut-layersets", "prosqa", 300, 285, 6, 7.0},  // its cascade over layer sets (coconut.json)
    {"prosqa-coconut-matched", "prosqa", 300, 227, 6, 7.0},
    {"prosqa-pause-as-thought", "prosqa", 300, 202, 0, 7.0},  // its six pause tokens are prompt tokens
    {"prosqa-cot-matched", "prosqa", 300, 230, 0, 21.9},
    {"prosqa-nocot", "prosqa", 300, 237, 0, 7.0},
}};

// The summary `coconut eval` prints last (a JSON object), or null when it failed.
nlohmann::json evaluate(const std::string& model, const std::string& data, const std::string& out) {
  const auto run = coconut::testing::capture_coconut("eval --model " + model + " --data " + data + " --out " + out + " --force");
  return run.status == 0 ? coconut::testing::printed_json(run.output) : nlohmann::json();
}

}  // namespace

TEST(ShippedModels, ReproduceTheFiguresOfModelsReadme) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  for (const auto& figure : kFigures) {
    SCOPED_TRACE(figure.model);
    const auto summary = evaluate(source + "/models/" + figure.model, source + "/data/" + figure.data + "/valid.json",
                                  dir.file(std::string(figure.model) + ".jsonl"));
    ASSERT_TRUE(summary.is_object() && summary.contains("accuracy")) << summary.dump();
    EXPECT_EQ(summary["questions"].get<int>(), figure.questions);
    EXPECT_NEAR(summary["accuracy"].get<double>() * figure.questions, figure.correct, 1e-6);
    EXPECT_NEAR(summary["mean_latent_thoughts"].get<double>(), figure.thoughts, 0.05);
    EXPECT_NEAR(summary["mean_generated_tokens"].get<double>(), figure.generated_tokens, 0.05);
    EXPECT_EQ(summary["unknown_tokens"].get<int>(), 0);
  }
}

// models/prosqa-coconut-anydepth's cascade: the realised FLOPs per answer and the questions that went
// to full depth, as models/README.md gives them, and the full-depth figure beside it; the same for
// models/prontoqa-coconut-anydepth's cascade.
TEST(ShippedModels, AnyDepthModelsCascadeAndFullDepth) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = source + "/models/prosqa-coconut-anydepth", data = source + "/data/prosqa/valid.json";
  const auto cascade = evaluate(model, data, dir.file("cascade.jsonl"));
  ASSERT_TRUE(cascade.is_object() && cascade.contains("depth_cascade")) << cascade.dump();
  EXPECT_NEAR(cascade["depth_cascade"]["deepened"].get<double>() * 300, 67, 1e-6);
  EXPECT_NEAR(cascade["mean_flops"].get<double>() / 1e6, 791.8, 0.05);
  const auto run = coconut::testing::capture_coconut("eval --model " + model + " --data " + data + " --depth full");
  ASSERT_EQ(run.status, 0) << run.output;
  const auto full = coconut::testing::printed_json(run.output);
  EXPECT_NEAR(full["accuracy"].get<double>() * 300, 285, 1e-6);
  EXPECT_NEAR(full["mean_flops"].get<double>() / 1e6, 1100.5, 0.05);
  // models/prontoqa-coconut-anydepth's: three levels, 3 -> 5 -> 6 layers.
  const std::string pronto = source + "/models/prontoqa-coconut-anydepth", pronto_data = source + "/data/prontoqa/valid.json";
  const auto three = evaluate(pronto, pronto_data, dir.file("pronto.jsonl"));
  ASSERT_TRUE(three.is_object() && three.contains("depth_cascade")) << three.dump();
  EXPECT_NEAR(three["depth_cascade"]["deepened"].get<double>() * 200, 195, 1e-6);
  EXPECT_NEAR(three["mean_flops"].get<double>() / 1e6, 585.4, 0.05);
  // models/prosqa-coconut-layersets': without layers 1, 3, 5, 7, then without 1 and 5.
  const auto sets = evaluate(source + "/models/prosqa-coconut-layersets", data, dir.file("sets.jsonl"));
  ASSERT_TRUE(sets.is_object() && sets.contains("depth_cascade")) << sets.dump();
  EXPECT_NEAR(sets["depth_cascade"]["deepened"].get<double>() * 300, 58, 1e-6);
  EXPECT_NEAR(sets["mean_flops"].get<double>() / 1e6, 709.5, 0.05);
}
