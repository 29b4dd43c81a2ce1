// The CLI as a user runs it: the built `coconut` binary, its output and its exit codes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include <unistd.h>

#include "data/example.h"
#include "data/hops.h"
#include "data/prosqa.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "support/reference_python.h"
#include "support/run_cli.h"
#include "support/temp_dir.h"

using coconut::testing::capture_coconut;
using coconut::testing::read_text;
using coconut::testing::run_reference;
using coconut::testing::test_data;
using coconut::testing::TempDir;

namespace {

// A command that must fail cleanly: exit status 1 (an error reported, not a crash: a signal shows as
// 128 + its number) and an error line naming each of `names`.
void expect_clean_failure(const std::string& arguments, std::initializer_list<std::string> names) {
  const auto run = capture_coconut(arguments, "2>&1 >/dev/null");
  EXPECT_EQ(run.status, 1) << arguments << "\n" << run.output;
  EXPECT_EQ(run.output.rfind("coconut: error: ", 0), 0u) << arguments << "\n" << run.output;
  for (const auto& name : names) EXPECT_NE(run.output.find(name), std::string::npos) << name << " not in: " << run.output;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream file(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(line);
  return lines;
}

std::string last_line(const std::string& text) {
  auto end = text.find_last_not_of('\n');
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

}  // namespace

TEST(CliInfo, JsonHasTheExactFigures) {
  const auto run = capture_coconut("info " + test_data("tokenizers/llama3/config.json") + " --json");
  ASSERT_EQ(run.status, 0);
  const auto info = nlohmann::json::parse(run.output);
  EXPECT_EQ(info["total_params"].get<int64_t>(), 1235814400);
  EXPECT_EQ(info["non_embedding_params"].get<int64_t>(), 1235814400 - 128256LL * 2048);
  EXPECT_EQ(info["kv_cache_bytes_per_token"].get<int64_t>(), 32768);
  // FLOPs per token at the default context N = 2048, by hand from Llama-3.2-1B's shape (D 2048,
  // 16 layers, H 32 x Dh 64 = 2048, G 8 x 64 = 512, F 8192, V 128256), 2 per multiply-accumulate:
  //   projections 16 x 2 (2 x 2048 x 2048 + 2 x 512 x 2048)  =   335,544,320  (q, o; k, v)
  //   attention   16 x 2 x 2 x 2048 x 2048 (QK^T, PV over N)  =   268,435,456
  //   mlp         16 x 2 x 3 x 8192 x 2048                    = 1,610,612,736
  //   head        2 x 128256 x 2048                           =   525,336,576
  // All are integers below 2^53: exact in double.
  ASSERT_EQ(info["context"].get<int64_t>(), 2048);
  const auto& breakdown = info["flops_breakdown"];
  EXPECT_EQ(breakdown["projections"].get<double>(), 16.0 * 2 * (2.0 * 2048 * 2048 + 2.0 * 512 * 2048));
  EXPECT_EQ(breakdown["attention"].get<double>(), 16.0 * 2 * 2 * 2048 * 2048);
  EXPECT_EQ(breakdown["mlp"].get<double>(), 16.0 * 2 * 3 * 8192 * 2048);
  EXPECT_EQ(breakdown["head"].get<double>(), 2.0 * 128256 * 2048);
  EXPECT_EQ(info["flops_per_token"].get<double>(), 335544320.0 + 268435456.0 + 1610612736.0 + 525336576.0);
}

// The training memory plan with fused attention (what training runs, the default): fewer
// activations than attention written out, the rest of the plan unchanged, and the text says which.
TEST(CliInfo, MemoryPlanWithFusedAttention) {
  const std::string plan = "info " + test_data("tokenizers/llama3/config.json") + " --world-size 1 --train-batch 8";
  const auto eager = capture_coconut(plan + " --written-out-attention --json"), fused = capture_coconut(plan + " --json");
  ASSERT_EQ(eager.status, 0) << eager.output;
  ASSERT_EQ(fused.status, 0) << fused.output;
  const auto eager_memory = nlohmann::json::parse(eager.output)["training_memory"];
  const auto fused_memory = nlohmann::json::parse(fused.output)["training_memory"];
  EXPECT_TRUE(fused_memory["fused_attention"].get<bool>());
  EXPECT_FALSE(eager_memory["fused_attention"].get<bool>());
  EXPECT_LT(fused_memory["per_rank_bytes"]["activations"].get<int64_t>(), eager_memory["per_rank_bytes"]["activations"].get<int64_t>());
  EXPECT_EQ(fused_memory["per_rank_bytes"]["weights_float32"], eager_memory["per_rank_bytes"]["weights_float32"]);
  const auto text = capture_coconut(plan), written_out = capture_coconut(plan + " --written-out-attention");
  EXPECT_NE(text.output.find("8 x 1024 tokens per micro-batch, fused attention"), std::string::npos) << text.output;
  EXPECT_NE(written_out.output.find("8 x 1024 tokens per micro-batch, written-out attention"), std::string::npos)
      << written_out.output;
}

// Coconut thoughts in the plan: Llama-3.2-1B (16 layers, 32 / 8 heads of 64), 8 rows, six thoughts
// from column 513: pass 0 keeps its K/V repeated to the 32 heads over 513 columns, and each thought
// pass its 8 KV heads' cache, bf16: 8 x (2 x 65,536 x 513 + 2 x 16,384 x (514 + ... + 519)).
TEST(CliInfo, MemoryPlanCountsTheThoughtPassesCaches) {
  const std::string plan = "info " + test_data("tokenizers/llama3/config.json") + " --world-size 1 --train-batch 8";
  const auto cot = capture_coconut(plan + " --json"), coconut = capture_coconut(plan + " --latent-thoughts 6 --first-latent 513 --json");
  ASSERT_EQ(coconut.status, 0) << coconut.output;
  const auto cot_memory = nlohmann::json::parse(cot.output)["training_memory"];
  const auto memory = nlohmann::json::parse(coconut.output)["training_memory"];
  const int64_t expected = 8 * (2 * 65536LL * 513 + 2 * 16384LL * (514 + 515 + 516 + 517 + 518 + 519));
  EXPECT_EQ(memory["per_rank_bytes"]["activations_thoughts"].get<int64_t>(), expected);
  EXPECT_EQ(memory["per_rank_bytes"]["activations"].get<int64_t>() - cot_memory["per_rank_bytes"]["activations"].get<int64_t>(),
            expected);
  EXPECT_EQ(memory["latent_thoughts"].get<int64_t>(), 6);
  const auto text = capture_coconut(plan + " --latent-thoughts 6 --first-latent 513");
  EXPECT_NE(text.output.find("fused attention, 6 Coconut thoughts"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("of which thought passes' K/V"), std::string::npos) << text.output;
  const auto too_many = capture_coconut(plan + " --latent-thoughts 600 --first-latent 513", "2>&1 >/dev/null");
  EXPECT_NE(too_many.status, 0);
  EXPECT_NE(too_many.output.find("600 thoughts from column 513 do not fit in 1024 tokens"), std::string::npos) << too_many.output;
}

TEST(CliGenerate, PrintIdsReproducesTheAnswerKey) {
  const auto keys = coconut::read_json_file(test_data("models/stories260K/answer_keys.json"));
  const auto& key = keys[0];
  std::string ids;
  for (const auto& id : key["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
  const auto expected = key["generated_ids"].get<std::vector<int64_t>>();
  const auto run = capture_coconut("generate --model " + test_data("models/stories260K") + " --ids " + ids +
                               " --max-new-tokens 30 --print-ids");
  ASSERT_EQ(run.status, 0);
  std::string want;
  for (size_t i = 0; i < 30; ++i) want += (i ? "," : "") + std::to_string(expected[i]);
  EXPECT_EQ(last_line(run.output), want);
}

// The continuation reads on from the prompt: a SentencePiece word keeps its leading space
// ("The sun was" + "▁a" is "The sun was a", not "The sun wasa").
// The statistics line says which weights ran; a dense model on the CPU run by default is told what
// ggml blocks would read instead (a healed or merged folder is dense unless asked).
TEST(CliGenerate, SaysWhichWeightsRan) {
  const std::string generate = "generate --model " + test_data("models/stories260K") + " --prompt 'The sun was' --max-new-tokens 3";
  const auto by_default = capture_coconut(generate, "2>&1 >/dev/null");
  ASSERT_EQ(by_default.status, 0) << by_default.output;
  EXPECT_NE(by_default.output.find("continuous thoughts, weights dense float32)\n"), std::string::npos) << by_default.output;
  EXPECT_NE(by_default.output.find("note: dense weights; --weights q8_0"), std::string::npos) << by_default.output;
  const auto asked = capture_coconut(generate + " --weights dense", "2>&1 >/dev/null");
  ASSERT_EQ(asked.status, 0) << asked.output;
  EXPECT_EQ(asked.output.find("note:"), std::string::npos) << asked.output;
}

TEST(CliGenerate, TextKeepsTheSpaceBetweenPromptAndContinuation) {
  const auto run = capture_coconut("generate --model " + test_data("models/stories260K") + " --prompt 'The sun was' --max-new-tokens 3");
  ASSERT_EQ(run.status, 0);
  EXPECT_EQ(last_line(run.output).rfind("The sun was ", 0), 0u) << run.output;
}

TEST(CliLogits, WritesFloat32TimeByVocab) {
  TempDir dir;
  const auto run = capture_coconut("logits --model " + test_data("models/stories260K") + " --ids 1,317,263 --out " +
                               dir.file("logits.safetensors"));
  ASSERT_EQ(run.status, 0);
  const auto tensors = coconut::read_safetensors(dir.file("logits.safetensors"));
  ASSERT_TRUE(tensors.count("logits"));
  EXPECT_EQ(tensors.at("logits").sizes(), (std::vector<int64_t>{3, 512}));
  EXPECT_EQ(tensors.at("logits").scalar_type(), torch::kFloat32);
  // Same numbers as the library's forward in this process.
  auto model = coconut::load_model(test_data("models/stories260K"));
  torch::NoGradGuard no_grad;
  auto expected = model->logits(model->forward_ids(torch::tensor(std::vector<int64_t>{1, 317, 263}).view({1, -1})).hidden)[0];
  EXPECT_TRUE(torch::equal(tensors.at("logits"), expected));
}

namespace {

// `coconut ARGUMENTS` must exit with `status` (not a crash's 134/139) and say `message` on stderr.
// (Its log is a file of its own: a TempDir here would be the calling test's folder, emptied.)
void expect_error(const std::string& arguments, int status, const std::string& message) {
  static int calls = 0;
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("coconut-expect-error-" + std::to_string(::getpid()) + "-" + std::to_string(calls++) + ".log"))
                              .string();
  EXPECT_EQ(coconut::testing::run_coconut(arguments, log), status) << arguments;
  const std::string said = coconut::testing::read_text(log);
  std::filesystem::remove(log);
  EXPECT_NE(said.find(message), std::string::npos) << arguments << ": said '" << said << "'";
}

}  // namespace

TEST(CliErrors, BadInputExitsWithAClearMessage) {
  const std::string stories = test_data("models/stories260K");
  expect_error("generate --model /nonexistent --ids 1", 1, "coconut: error: /nonexistent: no such model folder");
  expect_error("generate --model " + stories + " --ids 1,x", 1, "--ids: 'x' is not an integer id");
  expect_error("generate --model " + stories + " --ids 1,99999", 1, "--ids: id 99999 is outside the vocabulary [0, 512)");
  expect_error("info /nonexistent/config.json", 1, "/nonexistent/config.json: no such model folder or config file");
  expect_error("no-such-command", 106, "A subcommand is required");
}

TEST(CliTokenize, JsonlLinesGiveIdsWithoutBos) {
  TempDir dir;
  { std::ofstream(dir.file("in.jsonl")) << "{\"text\": \"Hello world\"}\n{\"text\": \"\"}\n"; }
  const auto run = capture_coconut("tokenize --tokenizer " + test_data("tokenizers/llama3/tokenizer.json") + " --jsonl < " +
                               dir.file("in.jsonl"));
  ASSERT_EQ(run.status, 0);
  EXPECT_EQ(run.output, "{\"ids\":[9906,1917]}\n{\"ids\":[]}\n");
  { std::ofstream(dir.file("bad.jsonl")) << "{\"txt\": 1}\n"; }
  expect_clean_failure("tokenize --tokenizer " + test_data("tokenizers/llama3/tokenizer.json") + " --jsonl < " + dir.file("bad.jsonl"),
                       {"text"});
}

// Smaller ProsQA graphs for a curriculum: the sizes asked for are the sizes written, and sizes the
// generator cannot make are refused with its reason.
TEST(CliData, ProsqaGraphSizesAreTheOnesAskedFor) {
  TempDir dir;
  for (const std::string shape : {"funnel", "dead-ends", "released"}) {
    SCOPED_TRACE(shape);
    const auto run = capture_coconut("data --task prosqa --count 40 --seed 3 --concepts 8 10 --path-steps 2 3 --people 2 --shape " +
                                     shape + " --out " + dir.file(shape + ".json"));
    ASSERT_EQ(run.status, 0);
    const auto examples = coconut::load_dataset(dir.file(shape + ".json"));
    ASSERT_EQ(examples.size(), 40u);
    for (const auto& example : examples) {
      EXPECT_GE(example.steps.size(), 2u) << example.question;
      EXPECT_LE(example.steps.size(), 3u) << example.question;
      const auto graph = coconut::prosqa_graph(example);
      ASSERT_TRUE(graph.has_value());
      EXPECT_GE(graph->names.size(), 2u + 8u);
      EXPECT_LE(graph->names.size(), 2u + 10u);
    }
  }
  EXPECT_NE(coconut::load_dataset(dir.file("funnel.json"))[0].question, coconut::load_dataset(dir.file("dead-ends.json"))[0].question);
  EXPECT_NE(coconut::load_dataset(dir.file("released.json"))[0].question, coconut::load_dataset(dir.file("dead-ends.json"))[0].question);
  expect_error("data --task prosqa --count 2 --shape tree --out " + dir.file("x.json"), 105, "--shape");
  expect_error("data --task prosqa --count 2 --concepts 8 10 --path-steps 3 6 --out " + dir.file("x.json"), 1,
               "min_concepts >= 2 * max_steps");
  expect_error("data --task prosqa --count 2 --concepts 8 --out " + dir.file("x.json"), 114, "--concepts");
}

TEST(CliTrainEval, TrainsThenEvaluatesWithThoughtsAndReportsBadConfigs) {
  TempDir dir;
  coconut::save_coconut_json(dir.file("train.json"), coconut::generate_hops(16, 1, {6, 2, 3}));
  {
    std::ofstream yaml(dir.file("coconut.yaml"));
    yaml << "mode: coconut\ntrain_path: " << dir.file("train.json") << "\noutput_dir: " << dir.file("run") << "\n"
         << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 2}\n"
         << "num_epochs: 3\nmax_latent_stage: 2\nbatch_size: 8\nlr: 1.0e-3\n";
  }
  const auto trained = capture_coconut("train " + dir.file("coconut.yaml") + " seed=3");
  ASSERT_EQ(trained.status, 0);
  const auto settings = coconut::read_json_file(dir.file("run/final/coconut.json"));
  EXPECT_EQ(settings["mode"], "coconut");
  EXPECT_EQ(settings["stage"], 2);
  const auto evaluated = capture_coconut("eval --model " + dir.file("run/final") + " --data " + dir.file("train.json") +
                                     " --limit 5 --batch-size 2 --max-new-tokens 6 --out " + dir.file("preds.jsonl"));
  ASSERT_EQ(evaluated.status, 0);
  const auto summary = nlohmann::json::parse(evaluated.output);
  EXPECT_EQ(summary["questions"], 5);
  EXPECT_DOUBLE_EQ(summary["mean_latent_thoughts"].get<double>(), 2.0);  // stage 2: two thoughts each
  EXPECT_GT(summary["mean_flops"].get<double>(), 0.0);
  std::ifstream predictions(dir.file("preds.jsonl"));
  std::string line;
  int lines = 0;
  while (std::getline(predictions, line)) {
    const auto prediction = nlohmann::json::parse(line);
    EXPECT_TRUE(prediction.contains("generated") && prediction.contains("correct"));
    ++lines;
  }
  EXPECT_EQ(lines, 5);
  const auto thoughts = capture_coconut("generate --model " + dir.file("run/final") + " --prompt 'a b . start a hops 2' --latents 3 --max-new-tokens 4");
  EXPECT_EQ(thoughts.status, 0);
  // Bad configurations: a clear error and a non-zero exit, nothing trained.
  {
    std::ofstream yaml(dir.file("bad.yaml"));
    yaml << "mode: coconut\ntrain_path: [unclosed\n";
  }
  expect_clean_failure("train " + dir.file("bad.yaml"), {dir.file("bad.yaml")});
  expect_clean_failure("train " + dir.file("coconut.yaml") + " batch_size=0", {"batch_size"});
  expect_clean_failure("train " + dir.file("coconut.yaml") + " train_path=" + dir.file("missing.json"), {dir.file("missing.json")});
}

TEST(CliPrune, ScoresLayersAndHeadsThenPrunesIntoALoadableFolder) {
  TempDir dir;
  coconut::save_coconut_json(dir.file("train.json"), coconut::generate_hops(16, 1, {6, 2, 3}));
  {
    std::ofstream yaml(dir.file("coconut.yaml"));
    yaml << "mode: coconut\ntrain_path: " << dir.file("train.json") << "\noutput_dir: " << dir.file("run") << "\n"
         << "model: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 4, num_attention_heads: 4, "
            "num_key_value_heads: 2}\nnum_epochs: 2\nmax_latent_stage: 1\nbatch_size: 8\nlr: 1.0e-3\n";
  }
  ASSERT_EQ(capture_coconut("train " + dir.file("coconut.yaml")).status, 0);
  const std::string model = dir.file("run/final"), data = dir.file("train.json");
  const auto angular = capture_coconut("score-layers --model " + model + " --data " + data +
                                   " --metric angular --all-blocks --positions latents --samples 8 --out " +
                                   dir.file("angular.csv") + " --plot " + dir.file("angular.png"));
  ASSERT_EQ(angular.status, 0) << angular.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("angular.png")));
  std::ifstream csv(dir.file("angular.csv"));
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 1 + 4 + 3 + 2);  // header + blocks of 1, 2 and 3 layers
  const auto ablation = capture_coconut("score-layers --model " + model + " --data " + data +
                                    " --metric ablation --ablation-metric accuracy --samples 4 --max-new-tokens 6 --plot " +
                                    dir.file("ablation.png"));
  ASSERT_EQ(ablation.status, 0) << ablation.output;
  const auto heads = capture_coconut("score-heads --model " + model + " --data " + data + " --metric grad --samples 4 --out " +
                                 dir.file("heads.csv") + " --plot " + dir.file("heads.png"));
  ASSERT_EQ(heads.status, 0) << heads.output;
  const auto pruned = capture_coconut("prune --model " + model + " --out " + dir.file("pruned") +
                                  " --drop-block 1 --metric bi --data " + data + " --drop-groups 0:1 --samples 4");
  ASSERT_EQ(pruned.status, 0) << pruned.output;
  const auto report = coconut::read_json_file(dir.file("pruned/pruning.json"));
  EXPECT_EQ(report["dropped_layers"].size(), 1u);
  EXPECT_LT(report["parameters"]["after"].get<int64_t>(), report["parameters"]["before"].get<int64_t>());
  const auto evaluated = capture_coconut("eval --model " + dir.file("pruned") + " --data " + data + " --limit 3 --max-new-tokens 4");
  EXPECT_EQ(evaluated.status, 0) << evaluated.output;
  // A width cut to 90% of the FLOPs per token: pruning.json names the channels.
  const double ratio = 0.9;
  const auto narrow = capture_coconut("prune --model " + model + " --out " + dir.file("narrow") + " --data " + data +
                                      " --samples 4 --mlp-flops-ratio 0.9 --channel-metric taylor", "2>&1");
  ASSERT_EQ(narrow.status, 0) << narrow.output;
  const auto narrow_report = coconut::read_json_file(dir.file("narrow/pruning.json"));
  EXPECT_LE(narrow_report["flops_per_token"]["ratio"].get<double>(), ratio + 1e-12);
  EXPECT_EQ(narrow_report["dropped_mlp_channels"].size(), 4u);
  EXPECT_EQ(narrow_report["mlp_channel_metric"], "taylor");
  const auto narrow_config = coconut::read_json_file(dir.file("narrow/config.json"));
  EXPECT_EQ(narrow_config["intermediate_size"].get<int64_t>(), 32 - narrow_report["dropped_mlp_channels"]["0"].size());
  EXPECT_EQ(capture_coconut("eval --model " + dir.file("narrow") + " --data " + data + " --limit 3 --max-new-tokens 4").status, 0);
  // Bad requests fail clearly.
  expect_error("prune --model " + model + " --out " + dir.file("bad") + " --mlp-width 8 --mlp-flops-ratio 0.5 --data " + data, 1,
               "give --mlp-width or --mlp-flops-ratio, not both");
  expect_error("prune --model " + model + " --out " + dir.file("bad") + " --drop-heads 0:0", 1,
               "layer 0: the KV groups left would keep unequal numbers of query heads");
  expect_error("prune --model " + model + " --out " + dir.file("bad") + " --drop-layers 0,1,2,3", 1,
               "cannot drop every layer of the model");
  expect_error("score-layers --model " + model + " --data " + data + " --metric nope", 1,
               "--metric must be angular, bi or ablation, got 'nope'");
}

// The main job end to end at a tiny budget: every stage runs, the table has its five rows, the
// report and plots exist; a second run with --reuse names what it reuses.
TEST(CliDemo, RunsEveryStageAndWritesTheReport) {
  TempDir dir;
  const std::string flags = " --task sums --out " + dir.file("demo") +
                            " --train-examples 160 --valid-examples 12 --cot-epochs 1 --epochs-per-stage 1 "
                            "--max-latent-stage 1 --nocot-epochs 1 --latency-questions 3";
  const auto first = capture_coconut("demo" + flags);
  ASSERT_EQ(first.status, 0) << first.output;
  for (const char* file : {"results.csv", "report.md", "accuracy_vs_flops.png", "layer_distances.png"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(std::string("demo/") + file))) << file;
  const auto rows = lines_of(dir.file("demo/results.csv"));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[1].rfind("no-CoT,4,", 0), 0u) << rows[1];
  EXPECT_NE(rows[4].find(",3,"), std::string::npos) << rows[4];  // the pruned model has 3 layers
  EXPECT_NE(first.output.find("removing layer"), std::string::npos) << first.output;

  const auto second = capture_coconut("demo --reuse" + flags);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("cot: reusing"), std::string::npos) << second.output;
}

// The ProntoQA demo (--task prontoqa) on a models folder laid out as the shipped one, here with
// tiny models trained for two steps (the demo's story does not depend on their quality): five rows
// (the all-latent model's among them), the pruned model one layer shorter, the report and plots
// written; with the shipped any-depth ProsQA model in the folder, its depth-per-question section;
// a missing model folder is named.
TEST(CliDemo, ProntoQaOnAModelsFolder) {
  TempDir dir;
  const std::string data = std::string(COCONUT_SOURCE_DIR) + "/data", models = dir.file("models");
  const std::string common = "train_path: " + data + "/prontoqa/train.json\ntrain_limit: 32\nmax_steps: 2\n"
                             "batch_size: 16\nlr: 1.0e-3\nword_forms: true\nval_generate_limit: 0\n";
  std::ofstream(dir.file("cot.yaml")) << common << "mode: cot\noutput_dir: " << dir.file("cot") << "\n"
                                      << "model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3, "
                                         "num_attention_heads: 2, num_key_value_heads: 2, max_position_embeddings: 512}\n";
  ASSERT_EQ(capture_coconut("train " + dir.file("cot.yaml")).status, 0);
  std::ofstream(dir.file("coconut.yaml")) << common << "mode: coconut\noutput_dir: " << dir.file("coconut") << "\n"
                                          << "load_model_path: " << dir.file("cot/checkpoint-2") << "\n"
                                          << "first_stage: 6\nmax_latent_stage: 6\npad_latent_to_max: true\n";
  ASSERT_EQ(capture_coconut("train " + dir.file("coconut.yaml")).status, 0);
  std::filesystem::create_directories(models);
  std::filesystem::copy(dir.file("cot/checkpoint-2"), models + "/prontoqa-cot");
  std::filesystem::copy(dir.file("coconut/checkpoint-2"), models + "/prontoqa-coconut");
  std::filesystem::copy(dir.file("coconut/checkpoint-2"), models + "/prontoqa-coconut-stage6");  // its row when present
  std::filesystem::copy(std::string(COCONUT_SOURCE_DIR) + "/models/prosqa-coconut-anydepth", models + "/prosqa-coconut-anydepth");
  std::filesystem::copy(std::string(COCONUT_SOURCE_DIR) + "/models/prosqa-coconut-layersets", models + "/prosqa-coconut-layersets");
  const std::string flags = " --task prontoqa --out " + dir.file("demo") + " --models-dir " + models + " --data-dir " + data +
                            " --valid-examples 8 --heal-examples 16 --score-examples 4 --latency-questions 2";
  const auto run = capture_coconut("demo" + flags);
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* file : {"results.csv", "report.md", "accuracy_vs_flops.png", "layer_distances.png"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(std::string("demo/") + file))) << file;
  const auto rows = lines_of(dir.file("demo/results.csv"));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[1].rfind("CoT,", 0), 0u) << rows[1];
  EXPECT_EQ(rows[2].rfind("Coconut,", 0), 0u) << rows[2];
  EXPECT_EQ(rows[3].rfind("Coconut all-latent,", 0), 0u) << rows[3];
  const auto layers = [](const std::string& row) { return std::stoi(row.substr(row.find(',') + 1)); };
  EXPECT_EQ(layers(rows[2]), 3) << rows[2];
  EXPECT_EQ(layers(rows[4]), layers(rows[2]) - 1) << rows[4];
  EXPECT_EQ(layers(rows[5]), layers(rows[2]) - 1) << rows[5];
  // The any-depth ProsQA model's section: every layer, then its cascade (cheaper), then the parent's
  // layer sets per question (cheaper).
  const auto depth_rows = lines_of(dir.file("demo/depth_per_question.csv"));
  ASSERT_EQ(depth_rows.size(), 4u);
  EXPECT_EQ(depth_rows[1].rfind("every layer,", 0), 0u) << depth_rows[1];
  const auto flops = [](const std::string& row) {  // the fourth field
    size_t at = 0;
    for (int i = 0; i < 3; ++i) at = row.find(',', at) + 1;
    return std::stod(row.substr(at));
  };
  EXPECT_LT(flops(depth_rows[2]), flops(depth_rows[1])) << depth_rows[2];
  EXPECT_EQ(depth_rows[3].rfind("layer sets per question (the parent),", 0), 0u) << depth_rows[3];
  EXPECT_LT(flops(depth_rows[3]), flops(depth_rows[1])) << depth_rows[3];
  EXPECT_NE(coconut::testing::read_text(dir.file("demo/report.md")).find("## One model, depth per question"), std::string::npos);

  const int missing = coconut::testing::run_coconut("demo --task prontoqa --out " + dir.file("demo2") + " --models-dir " + dir.file("nowhere"),
                                                    dir.file("missing.log"));
  EXPECT_EQ(missing, 1);
  const std::string message = coconut::testing::read_text(dir.file("missing.log"));
  EXPECT_NE(message.find("nowhere/prontoqa-cot/config.json: not found"), std::string::npos) << message;
}

// The shipped all-latent ProntoQA model reproduces its models/README.md figure: every step in
// thoughts, 6 thoughts + 4 tokens per answer, 197 of the 200 released validation questions. It is
// prompted through the latent bottleneck its coconut.json names; with the question in view of the
// answer (a copy without that setting) it was never trained, and its accuracy falls.
// Throughput against the weights' bandwidth bound: one batched step reads every weight once. The
// shipped 8-layer ProsQA model (tied embeddings, float32): its 2,108,800 parameters and one more
// embedding row of 128, 4 bytes each; the bound is batch x bandwidth / those bytes.
TEST(CliEval, ReportsTokensPerSecondAgainstTheBandwidthBound) {
  const std::string source = COCONUT_SOURCE_DIR;
  const auto run = capture_coconut("eval --model " + source + "/models/prosqa-coconut --data " + source +
                                   "/data/prosqa/valid.json --limit 8 --batch-size 4 --bandwidth-bound");
  ASSERT_EQ(run.status, 0) << run.output;
  const auto summary = coconut::testing::printed_json(run.output);
  EXPECT_EQ(summary["weight_bytes_per_step"].get<int64_t>(), 4 * (2108800 + 128));
  EXPECT_EQ(summary["weights"], "dense");  // which weights ran
  const double bandwidth = summary["copy_bandwidth_bytes_per_second"].get<double>();
  EXPECT_GT(bandwidth, 1e8);
  EXPECT_NEAR(summary["bound_tokens_per_second"].get<double>(), 4 * bandwidth / (4 * (2108800 + 128)),
              1e-9 * summary["bound_tokens_per_second"].get<double>());
  const double rate = summary["generated_tokens_per_second"].get<double>();
  EXPECT_NEAR(rate, summary["mean_generated_tokens"].get<double>() * 8 / summary["seconds"].get<double>(), 1e-6 * rate);
  EXPECT_GT(summary["of_bound"].get<double>(), 0.0);
  EXPECT_LT(summary["of_bound"].get<double>(), 1.0);
}

// --weights q8_0 on the shipped ProsQA model: the answers of the first 60 validation questions stay
// right (98.3% both ways; on all 300, 96.3% both ways, measured 2026-11-27), and a decoding step
// reads the blocks: 8 layers x 262,144 projection weights x 34/32 bytes, the tied head's 74 rows
// padded to 80 (groups of 8) x 4 blocks x 34, the float32 norms (17 x 128 x 4) and one
// embedding row (128 x 4): 2,248,320 bytes against 8,435,712 dense.
TEST(CliEval, QuantizedWeightsKeepTheShippedProsQaAnswersAndReadTheBlocks) {
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string command =
      "eval --model " + source + "/models/prosqa-coconut --data " + source + "/data/prosqa/valid.json --limit 60";
  const auto dense = capture_coconut(command);
  const auto quantized = capture_coconut(command + " --weights q8_0");
  ASSERT_EQ(dense.status, 0) << dense.output;
  ASSERT_EQ(quantized.status, 0) << quantized.output;
  const auto dense_summary = coconut::testing::printed_json(dense.output);
  const auto quantized_summary = coconut::testing::printed_json(quantized.output);
  EXPECT_EQ(quantized_summary["accuracy"].get<double>(), dense_summary["accuracy"].get<double>());
  EXPECT_GE(quantized_summary["accuracy"].get<double>(), 0.95);
  EXPECT_EQ(quantized_summary["weight_bytes_per_step"].get<int64_t>(),
            8 * 262144 * 34 / 32 + 80 * 4 * 34 + 17 * 128 * 4 + 128 * 4);
  EXPECT_EQ(dense_summary["weight_bytes_per_step"].get<int64_t>(), 4 * (2108800 + 128));
  EXPECT_EQ(quantized_summary["weights"], "q8_0");  // the summary names what ran
  EXPECT_EQ(dense_summary["weights"], "dense");
  // Q4_1 projections (20 bytes a block; the head stays Q8_0): 59 and 58 of the 60 right (q4_1,
  // q4_0; 2026-11-27), each reading 1,330,816 bytes a step.
  for (const std::string format : {"q4_1", "q4_0"}) {
    const auto four_bit = capture_coconut(command + " --weights " + format);
    ASSERT_EQ(four_bit.status, 0) << four_bit.output;
    const auto summary = coconut::testing::printed_json(four_bit.output);
    EXPECT_GE(summary["accuracy"].get<double>(), 0.93) << format;
    EXPECT_EQ(summary["weight_bytes_per_step"].get<int64_t>(), 8 * 262144 * 20 / 32 + 80 * 4 * 34 + 17 * 128 * 4 + 128 * 4) << format;
  }
  const auto refused = capture_coconut(command + " --weights q4_k", "2>&1 >/dev/null");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("q4_k"), std::string::npos) << refused.output;
}

// A sub-stack at test time: `eval --drop-layers 1,5` is the model `prune --drop-layers 1,5` writes,
// evaluated: the same answers and realised FLOPs per answer (prompt, thoughts and answer all without
// the two layers); --depth K keeps the first K layers; a layer the model lacks is refused.
TEST(CliEval, DropLayersRunsTheSubStackThatPruneWrites) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string data = " --data " + source + "/data/prosqa/valid.json --limit 20";
  ASSERT_EQ(capture_coconut("prune --model " + source + "/models/prosqa-coconut --out " + dir.file("pruned") + " --drop-layers 1,5").status, 0);
  const auto pruned = capture_coconut("eval --model " + dir.file("pruned") + data);
  const auto sub_stack = capture_coconut("eval --model " + source + "/models/prosqa-coconut" + data + " --drop-layers 1,5");
  const auto full = capture_coconut("eval --model " + source + "/models/prosqa-coconut" + data + " --depth full");
  const auto prefix = capture_coconut("eval --model " + source + "/models/prosqa-coconut" + data + " --depth 6");
  for (const auto* run : {&pruned, &sub_stack, &full, &prefix}) ASSERT_EQ(run->status, 0) << run->output;
  const auto a = coconut::testing::printed_json(pruned.output), b = coconut::testing::printed_json(sub_stack.output);
  EXPECT_EQ(a["accuracy"], b["accuracy"]);
  EXPECT_DOUBLE_EQ(a["mean_flops"].get<double>(), b["mean_flops"].get<double>());
  EXPECT_EQ(b["dropped_layers"], nlohmann::json::array({1, 5}));
  const auto whole = coconut::testing::printed_json(full.output);
  EXPECT_LT(b["mean_flops"].get<double>(), 0.8 * whole["mean_flops"].get<double>());
  EXPECT_EQ(coconut::testing::printed_json(prefix.output)["dropped_layers"], nlohmann::json::array({6, 7}));
  const auto refused = capture_coconut("eval --model " + source + "/models/prosqa-coconut" + data + " --drop-layers 8",
                                       "2>&1 >/dev/null");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("cannot drop layer 8"), std::string::npos) << refused.output;
}

// A depth cascade in coconut.json is what plain `eval` runs; --depth full runs every layer instead;
// --cascade at confidence 1 takes every question to full depth (the full model's answers, at
// more than its FLOPs); --cascade-flops calibrates the confidence to a FLOPs budget; bad
// cascades are refused by name.
TEST(CliEval, DepthCascadeFromCoconutJsonAndFlags) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = dir.file("anydepth");
  std::filesystem::copy(source + "/models/prosqa-coconut", model, std::filesystem::copy_options::recursive);
  auto settings = nlohmann::json::parse(std::ifstream(model + "/coconut.json"));
  settings["depth_cascade"] = {{"depths", {6, 8}}, {"confidence", 0.9}};
  std::ofstream(model + "/coconut.json") << settings.dump(2);
  const std::string data = " --data " + source + "/data/prosqa/valid.json --limit 20";
  const auto cascaded = capture_coconut("eval --model " + model + data + " --out " + dir.file("out.jsonl"));
  const auto full = capture_coconut("eval --model " + model + data + " --depth full");
  const auto always = capture_coconut("eval --model " + model + data + " --cascade 6,8@1");
  for (const auto* run : {&cascaded, &full, &always}) ASSERT_EQ(run->status, 0) << run->output;
  const auto a = coconut::testing::printed_json(cascaded.output), b = coconut::testing::printed_json(full.output),
             c = coconut::testing::printed_json(always.output);
  EXPECT_EQ(a["depth_cascade"]["depths"], nlohmann::json::array({6, 8}));
  EXPECT_TRUE(b["depth_cascade"].is_null());
  EXPECT_EQ(b["mean_layers"], 8.0);
  EXPECT_EQ(c["depth_cascade"]["deepened"], 1.0);
  EXPECT_EQ(c["accuracy"], b["accuracy"]);
  EXPECT_GT(c["mean_flops"].get<double>(), b["mean_flops"].get<double>());
  EXPECT_LT(a["mean_flops"].get<double>(), c["mean_flops"].get<double>());
  std::ifstream lines(dir.file("out.jsonl"));
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  const auto first = nlohmann::json::parse(line);
  ASSERT_TRUE(first.contains("cascade"));
  EXPECT_EQ(first["cascade"][0]["layers"], 6);

  const auto calibrated = capture_coconut("eval --model " + model + data + " --cascade-flops 0.9", "2>&1");
  ASSERT_EQ(calibrated.status, 0) << calibrated.output;
  EXPECT_NE(calibrated.output.find("of full)"), std::string::npos) << calibrated.output;
  // With a guarantee: 20 questions allow a risk of 0.3 at delta 0.2 (up to 3 losses: p = 0.107).
  const auto guaranteed = capture_coconut("eval --model " + model + data + " --cascade-risk 0.3,0.2", "2>&1");
  ASSERT_EQ(guaranteed.status, 0) << guaranteed.output;
  EXPECT_NE(guaranteed.output.find(" <= 0.2, "), std::string::npos) << guaranteed.output;
  const auto risk_summary = coconut::testing::printed_json(guaranteed.output)["depth_cascade"]["calibration"];
  EXPECT_EQ(risk_summary["rule"], "risk") << guaranteed.output;
  EXPECT_EQ(risk_summary["epsilon"], 0.3);
  EXPECT_EQ(risk_summary["delta"], 0.2);
  EXPECT_EQ(risk_summary["questions"], 20);
  EXPECT_LE(risk_summary["p_value"].get<double>(), 0.2);
  EXPECT_LE(risk_summary["risk"].get<double>(), 0.3);
  const auto flops_summary = coconut::testing::printed_json(calibrated.output)["depth_cascade"]["calibration"];
  EXPECT_EQ(flops_summary["rule"], "flops") << calibrated.output;
  EXPECT_EQ(flops_summary["fraction"], 0.9);
  EXPECT_LE(flops_summary["flops_fraction"].get<double>(), 0.9);
  EXPECT_TRUE(b["depth_cascade"].is_null());  // no cascade, no calibration
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {" --cascade 6,9@0.5", "ascend within 1..8"},
           {" --cascade 6,8", "DEPTHS@CONFIDENCE"},
           {" --cascade 6,8@0.5 --depth 6", "not both"},
           {" --cascade-flops 0.1", "more than"},
           {" --cascade-risk 0.001", "no confidence keeps the risk within 0.001 at level 0.1 on 20 questions"},
           {" --cascade-risk 0.1 --cascade-flops 0.9", "not both"},
           {" --cascade-risk 1.5", "--cascade-risk"},
           {" --cascade-risk 0.1,0.1,0.1", "EPSILON or EPSILON,DELTA"}}) {
    const auto refused = capture_coconut("eval --model " + model + data + flags, "2>&1 >/dev/null");
    EXPECT_NE(refused.status, 0) << flags;
    EXPECT_NE(refused.output.find(expected), std::string::npos) << flags << ": " << refused.output;
  }
}

// --halting on the shipped ProsQA model: at confidence 0 every question answers after the first
// count (as --latents 4 does), at 1 after the last (as the model's own 6 do, paying for the undone
// peeks); the summary and --out say what was taken; bad settings are refused by name, and a
// coconut.json cascade gives way to it.
TEST(CliEval, HaltingChoosesThoughtsPerQuestion) {
  TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = " --model " + source + "/models/prosqa-coconut";
  const std::string data = " --data " + source + "/data/prosqa/valid.json --limit 20";
  const auto four = capture_coconut("eval" + model + data + " --latents 4");
  const auto six = capture_coconut("eval" + model + data);
  const auto first = capture_coconut("eval" + model + data + " --halting 4,6@0");
  const auto last = capture_coconut("eval" + model + data + " --halting 4,6@1 --halting-peek 1 --out " + dir.file("out.jsonl"));
  for (const auto* run : {&four, &six, &first, &last}) ASSERT_EQ(run->status, 0) << run->output;
  const auto a = coconut::testing::printed_json(four.output), b = coconut::testing::printed_json(six.output),
             c = coconut::testing::printed_json(first.output), d = coconut::testing::printed_json(last.output);
  EXPECT_EQ(c["accuracy"], a["accuracy"]);
  EXPECT_NEAR(c["mean_flops"].get<double>(), a["mean_flops"].get<double>(), 1e-9 * a["mean_flops"].get<double>());
  EXPECT_EQ(c["mean_latent_thoughts"], 4.0);
  EXPECT_EQ(c["halting"]["went_on"], 0.0);
  EXPECT_EQ(d["accuracy"], b["accuracy"]);
  EXPECT_EQ(d["mean_latent_thoughts"], 6.0);
  EXPECT_GT(d["mean_flops"].get<double>(), b["mean_flops"].get<double>());
  EXPECT_EQ(d["halting"]["thoughts"], nlohmann::json::array({4, 6}));
  EXPECT_EQ(d["halting"]["peek_tokens"], 1);
  EXPECT_EQ(d["halting"]["went_on"], 1.0);
  EXPECT_TRUE(b["halting"].is_null());
  std::ifstream lines(dir.file("out.jsonl"));
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  const auto record = nlohmann::json::parse(line);
  ASSERT_EQ(record["cascade"].size(), 2u) << line;
  EXPECT_EQ(record["cascade"][0]["thoughts"], 4);
  EXPECT_EQ(record["cascade"][0]["generated_tokens"], 1);  // the one token peeked
  EXPECT_EQ(record["cascade"][1]["thoughts"], 6);
  EXPECT_EQ(record["latent_thoughts"], 6);

  // A model whose coconut.json holds a depth cascade runs every layer under --halting.
  const std::string anydepth = " --model " + source + "/models/prosqa-coconut-anydepth";
  const auto halted = capture_coconut("eval" + anydepth + data + " --halting 6@1");
  ASSERT_EQ(halted.status, 0) << halted.output;
  EXPECT_TRUE(coconut::testing::printed_json(halted.output)["depth_cascade"].is_null());
  EXPECT_EQ(coconut::testing::printed_json(halted.output)["mean_layers"], 8.0);
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {model + " --halting 6,4@0.5", "must ascend"},
           {model + " --halting 4,6", "THOUGHTS@CONFIDENCE"},
           {model + " --halting 4,6@0.5 --cascade 6,8@0.5", "not both"},
           {model + " --halting-peek 2", "needs --halting"},
           {" --model " + source + "/models/prosqa-cot --halting 4,6@0.5", "coconut mode only"}}) {
    const auto refused = capture_coconut("eval" + flags + data, "2>&1 >/dev/null");
    EXPECT_NE(refused.status, 0) << flags;
    EXPECT_NE(refused.output.find(expected), std::string::npos) << flags << ": " << refused.output;
  }
}

TEST(CliEval, ShippedAllLatentProntoQaModelReproducesItsFigure) {
  TempDir dir;
  const std::string source = std::string(COCONUT_SOURCE_DIR);
  const auto evaluate = [&](const std::string& model, const std::string& out) {
    const auto run = capture_coconut("eval --model " + model + " --data " + source + "/data/prontoqa/valid.json --out " +
                                 dir.file(out) + " --force");
    EXPECT_EQ(run.status, 0) << run.output;
    return coconut::testing::printed_json(run.output);
  };
  const auto shipped = evaluate(source + "/models/prontoqa-coconut-stage6", "shipped.jsonl");
  ASSERT_TRUE(shipped.contains("accuracy")) << shipped.dump();
  EXPECT_GE(shipped["accuracy"].get<double>(), 0.98);
  EXPECT_DOUBLE_EQ(shipped["mean_latent_thoughts"].get<double>(), 6.0);
  EXPECT_LE(shipped["mean_generated_tokens"].get<double>() + shipped["mean_latent_thoughts"].get<double>(), 10.0);
  std::filesystem::copy(source + "/models/prontoqa-coconut-stage6", dir.file("open"));
  auto settings = coconut::read_json_file(dir.file("open/coconut.json"));
  settings["answer_through_thoughts"] = false;
  std::ofstream(dir.file("open/coconut.json")) << settings.dump();
  const auto open = evaluate(dir.file("open"), "open.jsonl");
  ASSERT_TRUE(open.contains("accuracy")) << open.dump();
  EXPECT_LT(open["accuracy"].get<double>(), shipped["accuracy"].get<double>());
}

// `coconut expand` grows the 2-layer ProsQA Coconut model (models/prosqa-coconut-2l) to 4 layers (a zero-output copy
// after each): the same generated answers on released questions (after six thoughts each), the
// layer count and the parameters the copies add; a layer the model lacks is refused.
TEST(CliExpand, GrownModelAnswersAsTheOriginal) {
  TempDir dir;
  const std::string source = std::string(COCONUT_SOURCE_DIR);
  const std::string shipped = source + "/models/prosqa-coconut-2l";
  const auto grown = capture_coconut("expand --model " + shipped + " --after 0,1 --out " + dir.file("grown"));
  ASSERT_EQ(grown.status, 0) << grown.output;
  const auto report = coconut::read_json_file(dir.file("grown/expansion.json"));
  EXPECT_EQ(report["layers"]["after"].get<int>(), 4);
  // Each copy adds one layer's weights: 4 D^2 attention (8 heads of 32 = D) + 3 D F MLP + 2 D norms.
  const int64_t hidden = 256, ffn = 1024, per_layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden;
  EXPECT_EQ(report["parameters"]["after"].get<int64_t>() - report["parameters"]["before"].get<int64_t>(), 2 * per_layer);
  const auto predictions = [&](const std::string& model, const std::string& out) {
    const auto run = capture_coconut("eval --model " + model + " --data " + source + "/data/prosqa/valid.json --limit 24 --out " +
                                     dir.file(out));
    EXPECT_EQ(run.status, 0) << run.output;
    std::vector<std::string> answers;
    std::ifstream lines(dir.file(out));
    for (std::string line; std::getline(lines, line);) answers.push_back(nlohmann::json::parse(line)["generated"].get<std::string>());
    return answers;
  };
  const auto original = predictions(shipped, "original.jsonl");
  ASSERT_EQ(original.size(), 24u);
  EXPECT_EQ(predictions(dir.file("grown"), "grown.jsonl"), original);
  const auto refused = capture_coconut("expand --model " + shipped + " --after 2 --out " + dir.file("bad"), "2>&1 >/dev/null");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("the model has layers 0..1"), std::string::npos) << refused.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad/config.json")));
}

// ---------------------------------------------------------------------------------------------
// Bad input: refused before any work, with the flag or file named, and nothing of the user's lost.

TEST(CliErrors, FlagsOutsideTheirRangeAreRefused) {
  const std::string stories = test_data("models/stories260K");
  const std::string data = test_data("prontoqa/valid.json");
  constexpr int kValidationError = 105;  // CLI11's exit code for a value a check refused
  expect_error("eval --model " + stories + " --data " + data + " --limit -1", kValidationError, "--limit: '-1' is outside");
  expect_error("eval --model " + stories + " --data " + data + " --latents -1", kValidationError, "--latents");
  expect_error("eval --model " + stories + " --data " + data + " --exit-threshold nan", kValidationError,
               "--exit-threshold: 'nan' is not a finite number");
  expect_error("eval --model " + stories + " --data " + data + " --budget -1", kValidationError, "--budget");
  expect_error("eval --model " + stories + " --data " + data + " --max-new-tokens 2147483648", kValidationError,
               "--max-new-tokens");
  expect_error("generate --model " + stories + " --ids 1 --top-p 0", kValidationError, "--top-p: '0' is outside (0, 1]");
  expect_error("generate --model " + stories + " --ids 1 --top-k -1", kValidationError, "--top-k");
  expect_error("generate --model " + stories + " --ids 1 --temperature -2", kValidationError, "--temperature");
  expect_error("generate --model " + stories + " --ids 1 --max-new-tokens -5", kValidationError, "--max-new-tokens");
  expect_error("generate --model " + stories + " --ids 1 --device cuda:99", 1, "--device: 'cuda:99'");
  expect_error("info " + stories + " --context 0", kValidationError, "--context");
  expect_error("data --task sums --count 0 --out x.json", kValidationError, "--count");
  expect_error("data --task sums --count 3 --digits -3 --out x.json", kValidationError, "--digits");
}

TEST(CliErrors, OutputsThatAreNotTheToolsOwnAreNotReplaced) {
  TempDir dir;
  const std::string stories = test_data("models/stories260K");
  const std::string precious = dir.file("precious.txt");
  std::ofstream(precious) << "keep me";
  expect_error("prune --model " + stories + " --drop-layers 1 --out " + precious, 1,
               "--out " + precious + ": exists and is a file, not a folder");
  EXPECT_EQ(coconut::testing::read_text(precious), "keep me");
  std::filesystem::create_directories(dir.file("mine"));
  std::ofstream(dir.file("mine/notes.txt")) << "mine";
  expect_error("demo --task sums --out " + dir.file("mine"), 1, "is a folder with other contents");
  EXPECT_TRUE(std::filesystem::exists(dir.file("mine/notes.txt")));
  expect_error("eval --model " + stories + " --data " + test_data("prontoqa/valid.json") + " --out " + dir.path().string(), 1,
               "is a folder; give a file name");
  // A symbolic link is refused, and replaced (not followed) with --force.
  std::filesystem::create_symlink(precious, dir.file("link.json"));
  expect_error("data --task sums --count 2 --out " + dir.file("link.json"), 1, "exists and is a symbolic link");
  EXPECT_EQ(coconut::testing::run_coconut("data --task sums --count 2 --force --out " + dir.file("link.json"),
                                          dir.file("force.log")), 0);
  EXPECT_FALSE(std::filesystem::is_symlink(dir.file("link.json")));
  EXPECT_EQ(coconut::testing::read_text(precious), "keep me");
  // A model folder written by prune is the tool's own: pruning again into it replaces it.
  ASSERT_EQ(coconut::testing::run_coconut("prune --model " + stories + " --drop-layers 1 --out " + dir.file("pruned"),
                                          dir.file("prune.log")), 0);
  EXPECT_EQ(coconut::testing::run_coconut("prune --model " + stories + " --drop-layers 2 --out " + dir.file("pruned"),
                                          dir.file("prune.log")), 0);
}

TEST(CliErrors, NonFiniteWeightsAreNamedUnlessAllowed) {
  TempDir dir;
  auto model = coconut::load_model(test_data("models/stories260K"));
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["layers.2.mlp.up_proj.weight"][0][3] = std::numeric_limits<float>::quiet_NaN();
  }
  coconut::SaveOptions options;
  options.extra_files = {test_data("models/stories260K/tokenizer.json")};
  coconut::save_hf_folder(dir.file("broken"), model, options);
  expect_error("generate --model " + dir.file("broken") + " --ids 1,2 --max-new-tokens 2", 1,
               "tensor model.layers.2.mlp.up_proj.weight holds NaN or infinite values");
  EXPECT_EQ(coconut::testing::run_coconut("generate --model " + dir.file("broken") +
                                              " --ids 1,2 --max-new-tokens 2 --allow-nonfinite",
                                          dir.file("allowed.log")),
            0);
}

TEST(CliErrors, AbsurdModelConfigsAreRefusedAtOnce) {
  TempDir dir;
  auto config = coconut::read_json_file(test_data("models/stories260K/config.json"));
  const auto refused = [&](const std::string& key, const nlohmann::json& value, const std::string& message) {
    auto changed = config;
    changed[key] = value;
    std::ofstream(dir.file("config.json")) << changed.dump();
    expect_error("info " + dir.file("config.json"), 1, message);
  };
  refused("num_hidden_layers", int64_t{1} << 31, "num_hidden_layers is 2147483648, above the supported 4096");
  refused("hidden_size", int64_t{1} << 40, "hidden_size is");
  refused("rms_norm_eps", 1e300, "rms_norm_eps must be in (0, 0.1]");
  refused("rope_theta", 1e-300, "rope_theta must be in [1, 1e12]");
}

// A checkpoint write that fails (here: the file-size limit) is an error naming the file; no
// temporary file or folder is left, and the checkpoints before it are intact.
TEST(CliTrain, AFailedCheckpointWriteIsAnErrorAndLeavesNoDebris) {
  TempDir dir;
  coconut::save_coconut_json(dir.file("train.json"), coconut::generate_hops(16, 1, {6, 2, 3}));
  std::ofstream(dir.file("cot.yaml"))
      << "mode: cot\ntrain_path: " << dir.file("train.json") << "\noutput_dir: " << dir.file("run") << "\n"
      << "model: {hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 2}\n"
      << "num_epochs: 1\nbatch_size: 8\nlr: 1.0e-3\n";
  // 100 KB: enough for the config and logs, not for the weights and optimizer state (~300 KB).
  const std::string command = "bash -c 'ulimit -f 100; exec " + std::string(COCONUT_BINARY_DIR) + "/coconut train " +
                              dir.file("cot.yaml") + "' >" + dir.file("log") + " 2>&1";
  const int status = WEXITSTATUS(std::system(command.c_str()));
  const std::string said = coconut::testing::read_text(dir.file("log"));
  EXPECT_EQ(status, 1) << said;
  EXPECT_NE(said.find("write failed"), std::string::npos) << said;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.file("run"))) {
    const std::string name = entry.path().filename().string();
    EXPECT_FALSE(name.size() > 4 && name.substr(name.size() - 4) == ".tmp") << entry.path();
    EXPECT_NE(name, ".pending") << entry.path();
  }
}

// `coconut cpu-kernels` lists what a run measured and cached for this host, and --forget drops it
// (the suite runs on the tiles: here the commands measure, into a folder of the test's own).
TEST(CliCpuKernels, ListsTheHostsMeasuredChoicesAndForgetsThem) {
  TempDir dir;
  struct Restore {  // the suite's settings (tests/support/test_main.cpp) come back afterwards
    std::string policy = std::getenv("COCONUT_CPU_KERNELS") ? std::getenv("COCONUT_CPU_KERNELS") : "";
    ~Restore() {
      policy.empty() ? unsetenv("COCONUT_CPU_KERNELS") : setenv("COCONUT_CPU_KERNELS", policy.c_str(), 1);
      unsetenv("COCONUT_CACHE_DIR");
      unsetenv("COCONUT_CPU_BUSY_LIMIT");
    }
  } restore;
  setenv("COCONUT_CPU_KERNELS", "measure", 1);
  setenv("COCONUT_CACHE_DIR", dir.path().c_str(), 1);
  setenv("COCONUT_CPU_BUSY_LIMIT", "1", 1);  // cached however busy the machine (ctest -j runs tests beside it)
  const auto empty = capture_coconut("cpu-kernels");
  ASSERT_EQ(empty.status, 0);
  EXPECT_NE(empty.output.find("no choices cached for this host yet"), std::string::npos) << empty.output;
  EXPECT_NE(empty.output.find(dir.file("cpu_products.json")), std::string::npos) << empty.output;
  const std::string model = std::string(COCONUT_SOURCE_DIR) + "/models/prosqa-coconut";
  ASSERT_EQ(capture_coconut("eval --model " + model + " --data " + test_data("prosqa/valid.json") + " --limit 4").status, 0);
  const auto listed = capture_coconut("cpu-kernels");
  ASSERT_EQ(listed.status, 0);
  // The model's projections at 4 rows (a batch of 4 decoding): width 128, MLP 512, vocabulary 74.
  for (const char* key : {"forward 4x128x128 threads ", "forward 4x128x512 threads ", "forward 4x512x128 threads "})
    EXPECT_NE(listed.output.find(key), std::string::npos) << key << "\n" << listed.output;
  ASSERT_EQ(capture_coconut("cpu-kernels --forget").status, 0);
  EXPECT_NE(capture_coconut("cpu-kernels").output.find("no choices cached for this host yet"), std::string::npos);
  // A policy it does not know stops any command before it starts, naming the variable.
  setenv("COCONUT_CPU_KERNELS", "fastest", 1);
  const auto refused = capture_coconut("eval --model " + model + " --data " + test_data("prosqa/valid.json") + " --limit 1",
                                       "2>&1 >/dev/null");
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("COCONUT_CPU_KERNELS=fastest: expected measure, tiles or blas"), std::string::npos)
      << refused.output;
}

// import-gguf from the command line: a summary of what it read, a folder `generate --chat` takes,
// and for a cut file a message naming it, a non-zero exit and no folder; a folder that is not a
// model is not replaced.
TEST(CliImportGguf, ImportsChatsAndRefusesBrokenFilesNamingThem) {
  TempDir dir;
  const std::string fixture = test_data("gguf/smollm2-tiny-q.gguf");
  const auto run = capture_coconut("import-gguf " + fixture + " --out " + dir.file("tiny") + " --dtype bfloat16", "2>&1");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("2 layers, width 64, 4 heads / 2 KV heads, FFN 256, vocabulary 49152, tied embeddings, bfloat16"),
            std::string::npos) << run.output;
  EXPECT_NE(run.output.find("2 Q6_K"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("every projection is"), std::string::npos) << run.output;  // the fixture mixes seven types
  EXPECT_NE(run.output.find("tokenizer: gpt2 (pre-tokenizer smollm), with a chat template"), std::string::npos) << run.output;
  const auto chat = capture_coconut("generate --model " + dir.file("tiny") + " --chat --prompt hi --max-new-tokens 3");
  EXPECT_EQ(chat.status, 0);

  std::filesystem::copy_file(fixture, dir.file("cut.gguf"));
  std::filesystem::resize_file(dir.file("cut.gguf"), std::filesystem::file_size(fixture) / 2);
  const auto cut = capture_coconut("import-gguf " + dir.file("cut.gguf") + " --out " + dir.file("cut"), "2>&1 >/dev/null");
  EXPECT_NE(cut.status, 0);
  EXPECT_NE(cut.output.find("cut.gguf"), std::string::npos) << cut.output;
  EXPECT_NE(cut.output.find("truncated or lying header"), std::string::npos) << cut.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("cut")));

  std::filesystem::create_directories(dir.file("mine"));
  std::ofstream(dir.file("mine/notes.txt")) << "keep";
  const auto refused = capture_coconut("import-gguf " + fixture + " --out " + dir.file("mine"), "2>&1 >/dev/null");
  EXPECT_NE(refused.status, 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("mine/notes.txt")));
}

// A file whose projections are all Q8_0 (the fixture's, requantized by gguf-py) imports into a folder
// that runs on those blocks by default: coconut.json says "weights": "q8_0", and `logits` without
// --weights gives --weights q8_0's logits bit for bit, not dense's; with --weights dense it is dense.
// A file of other block formats runs re-quantized to Q8_0; one of float projections stays dense.
TEST(CliImportGguf, AFileOfQuantizedProjectionsRunsQuantizedByDefault) {
  TempDir dir;
  ASSERT_TRUE(run_reference("requantize_gguf.py", test_data("gguf/smollm2-tiny-q.gguf") + " " + dir.file("q8.gguf") + " Q8_0",
                            dir.file("requantize.log")))
      << read_text(dir.file("requantize.log"));
  const auto run = capture_coconut("import-gguf " + dir.file("q8.gguf") + " --out " + dir.file("q8"), "2>&1");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("every projection is Q8_0: eval, generate, serve and logits run on the file's own blocks"),
            std::string::npos) << run.output;
  EXPECT_EQ(coconut::read_json_file(dir.file("q8/coconut.json")).at("weights"), "q8_0");
  // The logits of the folder MODEL with `weights` (" --weights W" or "" for the default).
  const auto logits = [&](const std::string& model, const std::string& weights) {
    const std::string out = dir.file(model + (weights.empty() ? " default" : weights) + ".safetensors");
    const auto status = capture_coconut("logits --model " + dir.file(model) + " --ids 1,2,3 --out '" + out + "'" + weights).status;
    EXPECT_EQ(status, 0) << model << weights;
    return read_text(out);
  };
  const auto by_default = logits("q8", "");
  EXPECT_EQ(by_default, logits("q8", " --weights q8_0"));
  EXPECT_NE(by_default, logits("q8", " --weights dense"));
  // A file mixing block formats (the fixture itself: Q4_0, Q4_1, Q5_0, Q5_1, Q6_K and Q8_0
  // projections) runs re-quantized to Q8_0 by default: its logits are --weights q8_0's, not dense's.
  const auto mixed = capture_coconut("import-gguf " + test_data("gguf/smollm2-tiny-q.gguf") + " --out " + dir.file("mixed"), "2>&1");
  ASSERT_EQ(mixed.status, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("the projections are Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, Q8_0, blocks these kernels do not keep as they are: "
                              "eval, generate, serve and logits run them re-quantized to Q8_0 (`--weights q8_0`"),
            std::string::npos) << mixed.output;
  EXPECT_EQ(coconut::read_json_file(dir.file("mixed/coconut.json")).at("weights"), "q8_0");
  const auto mixed_default = logits("mixed", "");
  EXPECT_EQ(mixed_default, logits("mixed", " --weights q8_0"));
  EXPECT_NE(mixed_default, logits("mixed", " --weights dense"));
  // A file of float projections (F16 here) writes no coconut.json: dense by default.
  const auto floats = capture_coconut("import-gguf " + test_data("gguf/llama-2-tiny-random.gguf") + " --out " + dir.file("floats"), "2>&1");
  ASSERT_EQ(floats.status, 0) << floats.output;
  EXPECT_EQ(floats.output.find("--weights"), std::string::npos) << floats.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("floats/coconut.json")));
}

// The pretrained-model pipeline on a tiny model with SmolLM2's own tokenizer (the GGUF fixture):
// import, a Coconut LoRA run on ProntoQA's released text with the markers mapped onto SmolLM2's
// reserved notebook tokens, its PEFT adapter evaluated over the base, merged, and resumed.
TEST(CliAdapter, SmolLm2TokenizerCoconutLoraRunShipsAPeftAdapter) {
  TempDir dir;
  // One thread in every command: a resumed run is bit-exact only at the thread count of the run it
  // resumes, and the default count leaves out cores other processes (a parallel ctest) keep busy.
  setenv("OMP_NUM_THREADS", "1", 1);
  struct Unset {
    ~Unset() { unsetenv("OMP_NUM_THREADS"); }
  } unset;
  ASSERT_EQ(capture_coconut("import-gguf " + test_data("gguf/smollm2-tiny-q.gguf") + " --out " + dir.file("base")).status, 0);
  const auto yaml_for = [&](const std::string& out) {
    std::ofstream yaml(dir.file(out + ".yaml"));
    yaml << "mode: coconut\ntrain_path: " << test_data("prontoqa/train.json") << "\ntrain_limit: 8\n"
         << "load_model_path: " << dir.file("base") << "\noutput_dir: " << dir.file(out) << "\n"
         << "marker_tokens: ['<jupyter_start>', '<jupyter_text>', '<jupyter_code>', '<jupyter_output>']\n"
         << "lora_rank: 4\nlora_alpha: 8\nnum_epochs: 2\nepochs_per_stage: 1\nfirst_stage: 1\nmax_latent_stage: 2\n"
         << "batch_size: 4\nlr: 1.0e-2\neval_every_epochs: 0\nlog_every: 1\nseed: 5\n";
    return dir.file(out + ".yaml");
  };
  const auto trained = capture_coconut("train " + yaml_for("run"), "2>&1");
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_NE(trained.output.find("vocabulary 49152"), std::string::npos) << trained.output;  // no rows added
  // Every folder the run writes is a model folder like its base: the chat template and generation
  // settings come along, so the final model chats.
  for (const char* side : {"tokenizer_config.json", "generation_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file("run/final/") + side)) << side;
    EXPECT_EQ(read_text(dir.file("run/final/") + side), read_text(dir.file("base/") + side)) << side;
  }
  EXPECT_EQ(capture_coconut("generate --model " + dir.file("run/final") + " --chat --prompt 'Hi' --max-new-tokens 2").status, 0);
  const std::string adapter = dir.file("run/final/adapter");
  for (const char* file : {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "coconut.json"})
    EXPECT_TRUE(std::filesystem::exists(adapter + "/" + file)) << file;
  const auto adapter_config = coconut::read_json_file(adapter + "/adapter_config.json");
  EXPECT_EQ(adapter_config["trainable_token_indices"], nlohmann::json({11, 12, 13, 14}));  // the four notebook tokens
  EXPECT_EQ(adapter_config["r"], 4);
  EXPECT_EQ(coconut::read_json_file(adapter + "/coconut.json")["mode"], "coconut");

  // Over the base, the adapter answers as the run's merged final folder, question for question.
  const std::string data = " --data " + test_data("prontoqa/valid.json") + " --limit 3 --max-new-tokens 8 --batch-size 3";
  const auto with_adapter = capture_coconut("eval --model " + dir.file("base") + " --adapter " + adapter + data + " --out " + dir.file("a.jsonl"));
  ASSERT_EQ(with_adapter.status, 0) << with_adapter.output;
  const auto merged_run = capture_coconut("eval --model " + dir.file("run/final") + data + " --out " + dir.file("b.jsonl"));
  ASSERT_EQ(merged_run.status, 0);
  EXPECT_EQ(nlohmann::json::parse(with_adapter.output)["mean_latent_thoughts"], 2.0);
  const auto a = lines_of(dir.file("a.jsonl")), b = lines_of(dir.file("b.jsonl"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(nlohmann::json::parse(a[i])["generated"], nlohmann::json::parse(b[i])["generated"]) << i;

  // merge-adapter writes the same weights as the run's final folder, with the adapter's tokenizer.
  const auto merged = capture_coconut("merge-adapter --model " + dir.file("base") + " --adapter " + adapter + " --out " + dir.file("merged"));
  ASSERT_EQ(merged.status, 0) << merged.output;
  EXPECT_NE(merged.output.find("4 embedding rows replaced"), std::string::npos) << merged.output;
  auto expected = coconut::load_model(dir.file("run/final"), torch::kFloat32)->named_parameters();
  for (const auto& named : coconut::load_model(dir.file("merged"), torch::kFloat32)->named_parameters())
    EXPECT_LT((named.value() - expected[named.key()]).abs().max().item<double>(), 1e-6) << named.key();
  EXPECT_TRUE(std::filesystem::exists(dir.file("merged/coconut.json")));
  const auto generated = capture_coconut("generate --model " + dir.file("base") + " --adapter " + adapter +
                                         " --prompt 'Wren is a cat.' --latents 2 --max-new-tokens 3");
  EXPECT_EQ(generated.status, 0);

  // Killed after one step and resumed: the same adapter, the trained rows included.
  ASSERT_EQ(capture_coconut("train " + yaml_for("resumed") + " max_steps=1").status, 0);
  ASSERT_EQ(capture_coconut("train " + yaml_for("resumed") + " resume=true").status, 0);
  const auto straight = coconut::read_safetensors(adapter + "/adapter_model.safetensors");
  const auto resumed = coconut::read_safetensors(dir.file("resumed/final/adapter/adapter_model.safetensors"));
  ASSERT_EQ(resumed.size(), straight.size());
  for (const auto& [name, tensor] : straight) EXPECT_TRUE(torch::equal(resumed.at(name), tensor)) << name;

  // Continued from the shipped adapter alone (init_adapter): it starts where the adapter is.
  ASSERT_EQ(capture_coconut("train " + yaml_for("continued") + " init_adapter=" + adapter + " lr=1e-12 max_steps=1").status, 0);
  const auto continued = coconut::read_safetensors(dir.file("continued/checkpoint-1/adapter/adapter_model.safetensors"));
  for (const auto& [name, tensor] : straight)
    EXPECT_LT((continued.at(name) - tensor).abs().max().item<double>(), 1e-6) << name;
  expect_clean_failure("train " + yaml_for("continued") + " init_adapter=" + adapter + " lora_rank=8", {"init_adapter", "rank 4"});

  // A reserved token the tokenizer does not have is named.
  expect_clean_failure("train " + yaml_for("bad") + " marker_tokens=a,b,c,'<nope>'", {"marker_tokens"});
  expect_clean_failure("eval --model " + dir.file("base") + " --adapter " + dir.file("base") + data, {"adapter_config.json"});
}
