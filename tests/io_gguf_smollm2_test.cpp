// import-gguf on a file in the form a downloaded model comes in: SmolLM2-135M-Instruct's tokenizer
// (gpt2 BPE, pre-tokenizer smollm, ChatML template) over tiny random weights in Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1 and Q6_K (tests/fixtures/gguf/smollm2-tiny-q.gguf, made by
// tests/reference/make_tiny_gguf.py). Weights against gguf-py's dequantization; the tokenizer
// against the ids HF tokenizers and llama.cpp give for 200+ strings, and against HF tokenizers
// reading the tokenizer.json we wrote.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <set>

#include "io/gguf.h"
#include "io/gguf_export.h"
#include "io/gguf_import.h"
#include "io/gguf_tokenizer.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "model/ggml_blocks.h"
#include "model/quantize_model.h"
#include "pruning/surgery.h"
#include "recipes/evaluate_model.h"
#include "support/reference_python.h"
#include "support/temp_dir.h"
#include "text/hf_tokenizer.h"

namespace coconut {
namespace {

using json = nlohmann::json;
using testing::TempDir;
using testing::test_data;

const std::string kFixture = test_data("gguf/smollm2-tiny-q.gguf");

// Each parameter of the imported folder against gguf-py's float32 values of the same tensor (the
// file's Q/K rows permuted back to HF's order).
void expect_weights_equal_reference(const std::string& folder, const std::string& reference_path, bool tied) {
  const GgufFile reference = read_gguf(reference_path);
  auto model = load_model(folder, torch::kFloat32);
  const LlamaConfig& config = model->config();
  int64_t compared = 0;
  for (const auto& named : model->named_parameters()) {
    const GgufTensorInfo* info = reference.find_tensor(gguf_tensor_name(named.key()));
    ASSERT_NE(info, nullptr) << named.key();
    torch::Tensor expected = read_gguf_tensor(reference, *info);
    if (named.key().find("q_proj") != std::string::npos) expected = unpermute_rows_from_ggml(expected, config.num_attention_heads);
    if (named.key().find("k_proj") != std::string::npos) expected = unpermute_rows_from_ggml(expected, config.num_key_value_heads);
    EXPECT_TRUE(torch::equal(named.value(), expected)) << named.key();
    ++compared;
  }
  EXPECT_EQ(compared, 2 + 9 * 2 + (tied ? 0 : 1));
}

TEST(GgufSmolLM2, TinyQuantizedModelImportsAsGgufPyReadsIt) {
  TempDir dir;
  // The fixture is reproducible: made again here, byte for byte, with gguf-py's dequantization beside it.
  ASSERT_TRUE(testing::run_reference("make_tiny_gguf.py", kFixture + " " + dir.file("tied.gguf") + " --dequantized " + dir.file("tied-ref.gguf"),
                                     dir.file("log")));
  std::ifstream made(dir.file("tied.gguf"), std::ios::binary), fixture(kFixture, std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(made), {}, std::istreambuf_iterator<char>(fixture), {}))
      << "tests/reference/make_tiny_gguf.py no longer makes the fixture";

  const auto report = import_gguf(kFixture, dir.file("tied"), torch::kFloat32);
  EXPECT_EQ(report.tokenizer_model, "gpt2");
  EXPECT_EQ(report.tokenizer_pre, "smollm");
  EXPECT_TRUE(report.has_chat_template);
  EXPECT_EQ(report.tensor_types.at("Q6_K"), 2);
  EXPECT_EQ(report.tensor_types.at("Q8_0"), 3);
  const LlamaConfig config = load_config(dir.file("tied"));
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.vocab_size, 49152);
  EXPECT_EQ(config.num_hidden_layers, 2);
  EXPECT_EQ(config.num_attention_heads, 4);
  EXPECT_EQ(config.num_key_value_heads, 2);
  EXPECT_EQ(config.intermediate_size, 256);
  EXPECT_DOUBLE_EQ(config.rope_theta, 100000.0);
  EXPECT_NEAR(config.rms_norm_eps, 1e-5, 1e-12);
  EXPECT_TRUE(config.bos_token_ids.empty());                           // add_bos_token is false
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{2, 0}));  // <|im_end|>, then <|endoftext|>
  expect_weights_equal_reference(dir.file("tied"), dir.file("tied-ref.gguf"), true);
  const json tokenizer_config = read_json_file(dir.file("tied/tokenizer_config.json"));
  EXPECT_EQ(tokenizer_config["add_bos_token"], false);
  EXPECT_EQ(tokenizer_config["eos_token"], "<|im_end|>");
  EXPECT_EQ(tokenizer_config["pad_token"], "<|im_end|>");
  EXPECT_NE(tokenizer_config["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  const json generation = read_json_file(dir.file("tied/generation_config.json"));
  EXPECT_EQ(generation["bos_token_id"], 1);
  EXPECT_EQ(generation["pad_token_id"], 2);

  // With output.weight: an untied head; stored in bfloat16 on request.
  ASSERT_TRUE(testing::run_reference("make_tiny_gguf.py",
                                     kFixture + " " + dir.file("untied.gguf") + " --untied --dequantized " + dir.file("untied-ref.gguf"),
                                     dir.file("log")));
  import_gguf(dir.file("untied.gguf"), dir.file("untied"), torch::kFloat32);
  EXPECT_FALSE(load_config(dir.file("untied")).tie_word_embeddings);
  expect_weights_equal_reference(dir.file("untied"), dir.file("untied-ref.gguf"), false);
  import_gguf(dir.file("untied.gguf"), dir.file("untied-bf16"), torch::kBFloat16);
  EXPECT_EQ(load_config(dir.file("untied-bf16")).torch_dtype, "bfloat16");
  auto f32 = load_model(dir.file("untied"), torch::kFloat32);
  auto bf16 = load_model(dir.file("untied-bf16"));
  const auto bf16_parameters = bf16->named_parameters();
  for (const auto& named : f32->named_parameters())
    EXPECT_TRUE(torch::equal(named.value().to(torch::kBFloat16), bf16_parameters[named.key()])) << named.key();
}

// A file of mixed blocks, as most downloads are: the fixture with its one Q5_1 projection kind
// (attn_output) made Q8_0, so that every projection is in a format the products run (Q4_1, Q5_0,
// Q4_0, Q8_0, Q6_K). The folder keeps the file's bytes; each projection's blocks dequantize to the
// folder's weight exactly (Q and K rows permuted as the values are); the model on them runs each
// projection in its own format and gives the dense model's
// logits up to the inputs' 8-bit rounding.
TEST(GgufSmolLM2, AFileOfMixedBlocksKeepsThemAndRunsOnThem) {
  TempDir dir;
  {
    const GgufFile fixture = read_gguf(kFixture);
    GgufWriter writer;
    for (const auto& entry : fixture.metadata)
      entry.type == GgufValueType::kArray ? writer.add_array(entry.key, entry.element_type, entry.value)
                                          : writer.add(entry.key, entry.type, entry.value);
    for (const auto& info : fixture.tensors) {
      const std::vector<int64_t> shape(info.dims.rbegin(), info.dims.rend());
      if (info.type == static_cast<uint32_t>(GgmlType::kF32))
        writer.add_tensor(info.name, read_gguf_tensor(fixture, info));
      else if (info.type == static_cast<uint32_t>(GgmlType::kQ5_1))
        writer.add_blocks(info.name, static_cast<uint32_t>(GgmlType::kQ8_0), shape, ggml_blocks(quantize_q8_0(read_gguf_tensor(fixture, info))));
      else
        writer.add_blocks(info.name, info.type, shape, read_gguf_blocks(fixture, info));
    }
    writer.write(dir.file("mixed.gguf"));
  }
  const auto report = import_gguf(dir.file("mixed.gguf"), dir.file("mixed"), torch::kFloat32);
  EXPECT_TRUE(report.keeps_file_blocks);
  EXPECT_EQ(report.projection_types, (std::set<std::string>{"Q4_0", "Q4_1", "Q5_0", "Q6_K", "Q8_0"}));
  EXPECT_FALSE(import_gguf(kFixture, dir.file("with-q5_1"), torch::kFloat32).keeps_file_blocks);  // Q5_1: re-quantized instead
  const auto blocks = read_file_blocks(dir.file("mixed"));
  EXPECT_EQ(blocks.size(), 2u * 7 + 1);  // every projection and the tied head
  auto model = load_model(dir.file("mixed"), torch::kFloat32);
  const auto parameters = model->named_parameters();
  for (const auto& [name, file_blocks] : blocks) {
    const auto& dense = parameters[name];
    EXPECT_TRUE(torch::equal(dequantize(from_ggml_blocks(file_blocks.rows, dense.size(0), dense.size(1), file_blocks.format)), dense)) << name;
  }
  EXPECT_EQ(blocks.at("layers.1.self_attn.k_proj.weight").format, WeightFormat::kQ5_0);
  EXPECT_EQ(blocks.at("layers.1.mlp.down_proj.weight").format, WeightFormat::kQ6_K);

  model->eval();
  auto on_blocks = with_file_blocks(model, blocks);
  const auto& layer = *on_blocks->layers[1]->as<DecoderLayer>();
  EXPECT_EQ(layer.self_attn->q_quantized.format, WeightFormat::kQ4_1);
  EXPECT_EQ(layer.self_attn->o_quantized.format, WeightFormat::kQ8_0);
  EXPECT_EQ(layer.mlp->down_quantized.format, WeightFormat::kQ6_K);
  EXPECT_EQ(layer.self_attn->k_quantized.format, WeightFormat::kQ5_0);
  EXPECT_TRUE(torch::equal(dequantize(layer.self_attn->k_quantized), parameters["layers.1.self_attn.k_proj.weight"]));
  EXPECT_FALSE(layer.self_attn->qkv_quantized.defined());  // three formats: three products
  EXPECT_EQ(layer.mlp->down_quantized.packed.numel(), blocks.at("layers.1.mlp.down_proj.weight").rows.numel());  // the file's bytes
  torch::NoGradGuard no_grad;
  const auto ids = torch::tensor({{1, 504, 3067, 28, 253, 1812, 30}}, torch::kInt64);
  const auto dense_logits = model->logits(model->forward_ids(ids).hidden);
  const auto block_logits = on_blocks->logits(on_blocks->forward_ids(ids).hidden);
  // This random model is sensitive to its inputs' rounding (2026-11-29: logits up to 19.7, the blocks
  // 1.07 from dense, the same model re-quantized to Q8_0 2.85): the bound is a tenth of the largest
  // logit, where a projection given another's blocks lands near the largest logit itself.
  const double scale = dense_logits.abs().max().item<double>(), difference = (dense_logits - block_logits).abs().max().item<double>();
  EXPECT_LT(difference, 0.1 * scale);
  EXPECT_GT(difference, 0);  // the inputs are rounded: the products are the blocks', not the dense weights'
  // The tied table is looked up from the head's blocks (the dense one held empty): the same rows.
  EXPECT_TRUE(on_blocks->embedding_quantized.packed.is_same(on_blocks->output_quantized.packed));
  EXPECT_EQ(on_blocks->embed_tokens->weight.numel(), 0);
  EXPECT_TRUE(torch::equal(on_blocks->embed(ids), model->embed(ids)));

  // As `--weights gguf` loads it: the tensors the blocks stand for are never read, the model holds
  // the file's bytes (the blocks, Q5_0 as Q8_0, and the float32 norms), and runs as above.
  auto loaded = load_model_variant(dir.file("mixed"), "", torch::kFloat32, torch::kCPU, {}, WeightFormat::kGguf);
  EXPECT_EQ(loaded->layers[1]->as<DecoderLayer>()->mlp->down_proj->weight.numel(), 0);
  EXPECT_TRUE(torch::equal(loaded->logits(loaded->forward_ids(ids).hidden), block_logits));
  EXPECT_EQ(held_weight_bytes(loaded), held_weight_bytes(on_blocks));
  // The blocks (Q4_0's 18 bytes per 32 weights held as 20, its minimum -8 d written out) and the norms.
  int64_t file_bytes = 0;
  for (const auto& [name, file_blocks] : blocks) {
    const int64_t bytes = file_blocks.rows.numel();
    file_bytes += file_blocks.format == WeightFormat::kQ4_0 ? bytes / 18 * 20 : bytes;
  }
  for (const auto& named : model->named_parameters())
    if (!blocks.count(named.key())) file_bytes += named.value().numel() * 4;
  EXPECT_EQ(held_weight_bytes(loaded), file_bytes);

  // Without layer 0, the remaining layer takes the file's layer 1 blocks.
  auto shallow = with_file_blocks(drop_layers(model, {0}), blocks, {1});
  EXPECT_TRUE(torch::equal(dequantize(shallow->layers[0]->as<DecoderLayer>()->mlp->down_quantized),
                           parameters["layers.1.mlp.down_proj.weight"]));
  auto shallow_loaded = load_model_variant(dir.file("mixed"), "", torch::kFloat32, torch::kCPU, {0}, WeightFormat::kGguf);
  EXPECT_TRUE(torch::equal(shallow_loaded->logits(shallow_loaded->forward_ids(ids).hidden),
                           shallow->logits(shallow->forward_ids(ids).hidden)));
  EXPECT_THROW(read_file_blocks(dir.file("with-q5_1")), std::invalid_argument);
}

// An imported SmolLM2 exported again keeps what llama.cpp reads of its tokenizer: the "smollm"
// pre-tokenizer (digits one by one; as "gpt-2" they would merge), the BOS id its tokenizer does not
// add, add_bos_token false, the chat template; and it imports back with the same tokenizer.
TEST(GgufSmolLM2, ExportKeepsThePreTokenizerBosAndChatTemplate) {
  TempDir dir;
  import_gguf(kFixture, dir.file("tiny"), torch::kFloat32);
  export_gguf(dir.file("tiny"), dir.file("again.gguf"), torch::kFloat32);
  const GgufFile original = read_gguf(kFixture), again = read_gguf(dir.file("again.gguf"));
  for (const auto& [key, type] : std::vector<std::pair<std::string, std::string>>{{"tokenizer.ggml.pre", "string"},
                                                                                   {"tokenizer.ggml.bos_token_id", "integer"},
                                                                                   {"tokenizer.ggml.add_bos_token", "bool"},
                                                                                   {"tokenizer.chat_template", "string"}}) {
    const json* theirs = original.value(key, type);
    const json* ours = again.value(key, type);
    ASSERT_NE(theirs, nullptr) << key;
    ASSERT_NE(ours, nullptr) << key << " is missing from the export";
    EXPECT_EQ(*ours, *theirs) << key;
  }
  import_gguf(dir.file("again.gguf"), dir.file("back"), torch::kFloat32);
  const auto first = HfTokenizer::load(dir.file("tiny/tokenizer.json")), back = HfTokenizer::load(dir.file("back/tokenizer.json"));
  for (const std::string text : {"In 2024, 12345 people paid $3.50 each.", "x = 1e-10; y = 0.123"})
    EXPECT_EQ(back->encode(text), first->encode(text)) << text;
  EXPECT_EQ(first->encode("12345").size(), 5u);  // one token a digit
}

// encode_cases.jsonl: ids from HF (transformers' reading of the original GGUF) and llama.cpp's
// llama-tokenize, which agree on every line ("source": "hf+llama.cpp"); made by
// tests/reference/make_smollm2_tokenizer_cases.py.
TEST(GgufSmolLM2, TokenizerMatchesHfAndLlamaCpp) {
  TempDir dir;
  import_gguf(kFixture, dir.file("model"), torch::kFloat32);
  const std::string cases_path = test_data("tokenizers/smollm2/encode_cases.jsonl");
  ASSERT_TRUE(testing::run_reference("tokenize_corpus.py", dir.file("model/tokenizer.json") + " " + cases_path + " " + dir.file("hf.json"),
                                     dir.file("log")));
  const json hf = json::parse(std::ifstream(dir.file("hf.json")));
  const auto tokenizer = HfTokenizer::load(dir.file("model/tokenizer.json"));
  std::ifstream cases(cases_path);
  size_t line_number = 0;
  for (std::string line; std::getline(cases, line); ++line_number) {
    const json entry = json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    const auto ids = tokenizer->encode(text);
    EXPECT_EQ(entry["source"], "hf+llama.cpp") << text;
    EXPECT_EQ(ids, entry["ids"].get<std::vector<int64_t>>()) << "line " << line_number + 1 << ": " << text;
    ASSERT_LT(line_number, hf.size());
    EXPECT_EQ(ids, hf[line_number]["ids"].get<std::vector<int64_t>>()) << "HF on our tokenizer.json, line " << line_number + 1;
    EXPECT_EQ(tokenizer->decode(ids), hf[line_number]["decoded"].get<std::string>()) << text;
  }
  EXPECT_GE(line_number, 200u);
  EXPECT_EQ(line_number, hf.size());
}

// The same vocabulary under llama.cpp's gpt-2 and default pre-tokenizers (the file's
// tokenizer.ggml.pre replaced): ids of llama.cpp's llama-tokenize on every third corpus string
// (encode_cases_pre_*.jsonl, made by tests/reference/llamacpp_tokenize_cases.py).
TEST(GgufSmolLM2, Gpt2AndDefaultPreTokenizersSplitAsLlamaCpp) {
  for (const std::string pre : {"gpt-2", "default"}) {
    GgufFile file = read_gguf(kFixture);
    for (auto& entry : file.metadata)
      if (entry.key == "tokenizer.ggml.pre") entry.value = pre;
    const auto files = tokenizer_from_gguf(file);
    EXPECT_EQ(files.pre, pre);
    const auto tokenizer = HfTokenizer::from_json(files.tokenizer, pre);
    std::ifstream cases(test_data("tokenizers/smollm2/encode_cases_pre_" + pre + ".jsonl"));
    int checked = 0, differing_from_smollm = 0;
    const auto smollm = HfTokenizer::from_json(tokenizer_from_gguf(read_gguf(kFixture)).tokenizer, "smollm");
    for (std::string line; std::getline(cases, line); ++checked) {
      const json entry = json::parse(line);
      const std::string text = entry["text"].get<std::string>();
      EXPECT_EQ(tokenizer->encode(text), entry["ids"].get<std::vector<int64_t>>()) << pre << ": " << text;
      differing_from_smollm += tokenizer->encode(text) != smollm->encode(text);
    }
    EXPECT_GE(checked, 100) << pre;
    EXPECT_GT(differing_from_smollm, 0) << pre << " splits as smollm does: the test would not see a wrong pre-tokenizer";
    std::printf("%s: %d of %d strings tokenised otherwise than by smollm\n", pre.c_str(), differing_from_smollm, checked);
  }
}

}  // namespace
}  // namespace coconut
