// GGUF: reading a file written by llama.cpp's tools, round trips of our export (the Q/K row
// permutation checked against index loops), per-layer arrays for pruned models, bad files, and
// import-gguf reading our exports back.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include "io/gguf.h"
#include "io/gguf_export.h"
#include "io/gguf_import.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "model/depth_router.h"
#include "pruning/surgery.h"
#include "text/hf_tokenizer.h"
#include "support/reference_python.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;
using coconut::testing::TempDir;

TEST(Gguf, ReadsAFileWrittenByLlamaCpp) {
  const auto file = read_gguf(coconut::testing::test_data("gguf/llama-2-tiny-random.gguf"));
  EXPECT_EQ(file.version, 3u);
  ASSERT_NE(file.find("general.architecture"), nullptr);
  EXPECT_EQ(file.find("general.architecture")->value, "llama");
  ASSERT_NE(file.find("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(file.find("tokenizer.ggml.tokens")->value.size(), 32000u);
  const auto width = file.find("llama.embedding_length")->value.get<uint64_t>();
  const auto* embeddings = file.find_tensor("token_embd.weight");
  ASSERT_NE(embeddings, nullptr);
  EXPECT_EQ(embeddings->dims, (std::vector<uint64_t>{width, 32000}));  // ggml order: row length first
  const auto* norm = file.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  const auto values = read_gguf_tensor(file, *norm);
  EXPECT_EQ(values.sizes(), torch::IntArrayRef({static_cast<int64_t>(width)}));
  EXPECT_TRUE(torch::isfinite(values.to(torch::kFloat32)).all().item<bool>());

  // Values against gguf-py's reading of the same file (llama.cpp's own Python reader): every tensor,
  // the same shape, and at fixed flat indices (all of a small tensor, first/last 16 and 64 spread
  // over a large one) the same numbers exactly: F16 and F32 widen to float64 without rounding.
  TempDir dir;
  ASSERT_TRUE(coconut::testing::run_reference(
      "gguf_tensor_values.py", coconut::testing::test_data("gguf/llama-2-tiny-random.gguf") + " " + dir.file("values.json"),
      dir.file("log")));
  std::ifstream in(dir.file("values.json"));
  const auto reference = nlohmann::json::parse(in);
  ASSERT_EQ(reference.size(), file.tensors.size());
  int64_t compared = 0;
  for (const auto& info : file.tensors) {
    ASSERT_TRUE(reference.contains(info.name)) << info.name;
    const auto& expected = reference[info.name];
    const auto tensor = read_gguf_tensor(file, info).to(torch::kFloat64).contiguous();
    EXPECT_EQ(tensor.sizes().vec(), expected["shape"].get<std::vector<int64_t>>()) << info.name;
    const auto flat = tensor.view(-1);
    const auto indices = expected["indices"].get<std::vector<int64_t>>();
    const auto numbers = expected["values"].get<std::vector<double>>();
    for (size_t i = 0; i < indices.size(); ++i, ++compared)
      EXPECT_EQ(flat[indices[i]].item<double>(), numbers[i]) << info.name << " [" << indices[i] << "]";
  }
  EXPECT_GT(compared, 1000);
}

TEST(Gguf, PermutationMatchesIndexLoops) {
  const int64_t heads = 3, head_dim = 6, width = 2;
  auto weight = torch::arange(heads * head_dim * width, torch::kFloat32).view({heads * head_dim, width});
  const auto permuted = permute_rows_for_ggml(weight, heads);
  // ggml row h*Dh + 2i + j holds HF row h*Dh + j*Dh/2 + i (rotate-half pairs become adjacent).
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < head_dim / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_TRUE(torch::equal(permuted[h * head_dim + 2 * i + j], weight[h * head_dim + j * head_dim / 2 + i]));
  EXPECT_TRUE(torch::equal(unpermute_rows_from_ggml(permuted, heads), weight));
}

TEST(Gguf, Llama32RopeFactorsAreTheKnownBands) {
  const auto config = load_config(coconut::testing::test_data("tokenizers/llama3/config.json"));
  const auto factors = rope_frequency_factors(config);
  EXPECT_EQ(factors.size(0), 32);  // head_dim 64
  EXPECT_FLOAT_EQ(factors[0].item<float>(), 1.0f);    // high frequencies unscaled
  EXPECT_FLOAT_EQ(factors[31].item<float>(), 32.0f);  // low frequencies divided by factor 32
}

TEST(Gguf, ExportRoundTripsAUniformModel) {
  TempDir dir;
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = true;
  auto model = coconut::testing::tiny_model(config);
  save_hf_folder(dir.file("model"), model);
  const auto report = export_gguf(dir.file("model"), dir.file("model.gguf"), torch::kFloat32);
  EXPECT_EQ(report.architecture, "llama");
  const auto file = read_gguf(dir.file("model.gguf"));
  EXPECT_EQ(file.find("llama.attention.head_count")->value, 4);
  EXPECT_EQ(file.find("llama.attention.head_count_kv")->value, 2);
  EXPECT_EQ(file.find("llama.block_count")->value, 2);
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);  // tied: llama.cpp reuses token_embd
  ASSERT_NE(file.find_tensor("rope_freqs.weight"), nullptr);
  EXPECT_TRUE(torch::equal(read_gguf_tensor(file, *file.find_tensor("rope_freqs.weight")),
                           rope_frequency_factors(model->config())));
  const auto q = read_gguf_tensor(file, *file.find_tensor("blk.1.attn_q.weight"));
  EXPECT_TRUE(torch::equal(unpermute_rows_from_ggml(q, 4), model->layers[1]->as<DecoderLayer>()->self_attn->q_proj->weight));
  const auto k = read_gguf_tensor(file, *file.find_tensor("blk.0.attn_k.weight"));
  EXPECT_TRUE(torch::equal(unpermute_rows_from_ggml(k, 2), model->layers[0]->as<DecoderLayer>()->self_attn->k_proj->weight));
  const auto down = read_gguf_tensor(file, *file.find_tensor("blk.0.ffn_down.weight"));
  EXPECT_TRUE(torch::equal(down, model->layers[0]->as<DecoderLayer>()->mlp->down_proj->weight));
  EXPECT_EQ(file.tensors.size(), 1u + 1u + 1u + 2u * 9u);  // embeddings, norm, rope_freqs, 9 per layer
}

TEST(Gguf, PrunedModelsUseDeciWithPerLayerArrays) {
  TempDir dir;
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  auto pruned = drop_heads(model, {{1, {2, 3}}});  // layer 1 keeps one KV group
  save_hf_folder(dir.file("pruned"), pruned);
  const auto report = export_gguf(dir.file("pruned"), dir.file("pruned.gguf"), torch::kFloat16);
  EXPECT_EQ(report.architecture, "deci");
  const auto file = read_gguf(dir.file("pruned.gguf"));
  EXPECT_EQ(file.find("deci.attention.head_count")->value, (nlohmann::json{4, 2}));
  EXPECT_EQ(file.find("deci.attention.head_count_kv")->value, (nlohmann::json{2, 1}));
  const auto q = read_gguf_tensor(file, *file.find_tensor("blk.1.attn_q.weight"));
  EXPECT_EQ(q.scalar_type(), torch::kFloat16);
  EXPECT_EQ(q.sizes(), torch::IntArrayRef({2 * 4, 16}));
  EXPECT_EQ(read_gguf_tensor(file, *file.find_tensor("blk.1.attn_norm.weight")).scalar_type(), torch::kFloat32);
}

namespace {

// A tiny model (Llama 3 frequency scaling) with Llama 3's vocabulary and tokenizer.json, saved in `folder`.
Llama save_tiny_llama3(const std::string& folder, int64_t eos) {
  auto config = coconut::testing::tiny_config();
  config.vocab_size = 128256;
  config.bos_token_ids = {128000};
  config.eos_token_ids = {eos};
  auto model = coconut::testing::tiny_model(config);
  SaveOptions save;
  save.extra_files = {coconut::testing::test_data("tokenizers/llama3/tokenizer.json")};
  save_hf_folder(folder, model, save);
  return model;
}

}  // namespace

TEST(Gguf, Llama3TokenizerBecomesGpt2Metadata) {
  TempDir dir;
  save_tiny_llama3(dir.file("model"), 128001);
  const auto report = export_gguf(dir.file("model"), dir.file("model.gguf"), torch::kBFloat16);
  EXPECT_EQ(report.tokenizer_model, "gpt2");
  const auto file = read_gguf(dir.file("model.gguf"));
  EXPECT_EQ(file.find("tokenizer.ggml.pre")->value, "llama-bpe");
  const auto& tokens = file.find("tokenizer.ggml.tokens")->value;
  ASSERT_EQ(tokens.size(), 128256u);
  EXPECT_EQ(tokens[128000], "<|begin_of_text|>");
  EXPECT_EQ(file.find("tokenizer.ggml.token_type")->value[128000], 3);  // control
  EXPECT_EQ(file.find("tokenizer.ggml.merges")->value.size(), 280147u);
  EXPECT_EQ(file.find("tokenizer.ggml.bos_token_id")->value, 128000);
}

namespace {

// A GGUF v3 file by hand (no metadata but an optional duplicate key): tensor records
// (name, ggml dims, type, offset) and `data_bytes` of data after the 32-byte aligned header.
struct Record {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};
std::string handmade_gguf(const std::vector<Record>& records, uint64_t data_bytes, bool duplicate_key = false) {
  std::string out;
  const auto put = [&](auto value) { out.append(reinterpret_cast<const char*>(&value), sizeof value); };
  const auto put_string = [&](const std::string& text) {
    put(static_cast<uint64_t>(text.size()));
    out += text;
  };
  put(uint32_t{0x46554747});
  put(uint32_t{3});
  put(static_cast<uint64_t>(records.size()));
  put(static_cast<uint64_t>(duplicate_key ? 2 : 0));
  for (int i = 0; duplicate_key && i < 2; ++i) {
    put_string("general.name");
    put(uint32_t{8});  // string
    put_string("x");
  }
  for (const auto& record : records) {
    put_string(record.name);
    put(static_cast<uint32_t>(record.dims.size()));
    for (uint64_t dim : record.dims) put(dim);
    put(record.type);
    put(record.offset);
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  out.append(data_bytes, '\0');
  return out;
}

}  // namespace

// Every tensor record is checked: type, size arithmetic, blocks, alignment, bounds, overlap, names.
TEST(Gguf, LyingTensorRecordsAreRefusedByName) {
  TempDir dir;
  const auto check = [&](const std::string& bytes, const std::string& message) {
    std::ofstream(dir.file("x.gguf"), std::ios::binary) << bytes;
    try {
      read_gguf(dir.file("x.gguf"));
      ADD_FAILURE() << "accepted; expected '" << message << "'";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("x.gguf"), std::string::npos) << error.what();
    }
  };
  // The well-formed file first: two F32 tensors and a Q8_0 one (2 blocks of 32 = 68 bytes).
  const std::vector<Record> good = {{"a", {4, 2}, 0, 0}, {"b", {8}, 0, 32}, {"q", {64}, 8, 64}};
  std::ofstream(dir.file("good.gguf"), std::ios::binary) << handmade_gguf(good, 64 + 68);
  EXPECT_EQ(read_gguf(dir.file("good.gguf")).tensors.size(), 3u);
  check(handmade_gguf({{"a", {4}, 99, 0}}, 64), "unknown ggml type 99");
  check(handmade_gguf({{"a", {1ULL << 40, 1ULL << 40}, 0, 0}}, 64), "product overflows");
  check(handmade_gguf({{"a", {4}, 0, ~0ULL - 8}}, 64), "runs past the end");
  check(handmade_gguf({{"a", {4}, 0, 4}}, 64), "not a multiple of the alignment");
  check(handmade_gguf({{"a", {8}, 0, 0}, {"b", {8}, 0, 0}}, 64), "overlap");
  check(handmade_gguf({{"a", {4}, 0, 0}, {"a", {4}, 0, 32}}, 64), "'a' appears twice");
  check(handmade_gguf({{"q", {40}, 8, 0}}, 64), "not whole blocks of 32");
  check(handmade_gguf({}, 0, true), "metadata key 'general.name' appears twice");
}

TEST(Gguf, TruncatedOrForeignFilesFailNamingTheFile) {
  TempDir dir;
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  save_hf_folder(dir.file("model"), model);
  export_gguf(dir.file("model"), dir.file("model.gguf"), torch::kFloat32);
  const auto size = std::filesystem::file_size(dir.file("model.gguf"));
  std::filesystem::copy_file(dir.file("model.gguf"), dir.file("cut.gguf"));
  std::filesystem::resize_file(dir.file("cut.gguf"), size - 100);
  try {
    read_gguf(dir.file("cut.gguf"));
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("cut.gguf"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("past the end"), std::string::npos) << error.what();
  }
  std::filesystem::resize_file(dir.file("cut.gguf"), 40);
  EXPECT_THROW(read_gguf(dir.file("cut.gguf")), std::invalid_argument);
  std::ofstream(dir.file("text.gguf")) << "not a gguf file at all";
  EXPECT_THROW(read_gguf(dir.file("text.gguf")), std::invalid_argument);
}

TEST(Gguf, RoutedModelsRoundTripTheirGatesAndExportWithoutThem) {
  TempDir dir;
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = true;
  auto plain = coconut::testing::tiny_model(config);
  auto routed = attach_depth_router(plain, 2.0, 1);
  {
    torch::NoGradGuard no_grad;
    routed->layers[1]->as<DecoderLayer>()->router->weight.normal_();  // something to round-trip
  }
  save_hf_folder(dir.file("routed"), routed);
  EXPECT_TRUE(load_config(dir.file("routed/config.json")).depth_router);
  EXPECT_EQ(load_config(dir.file("routed/config.json")).depth_router_first_layer, 1);
  auto loaded = load_model(dir.file("routed"));
  auto expected = routed->named_parameters();
  for (const auto& named : loaded->named_parameters())
    EXPECT_TRUE(torch::equal(named.value(), *expected.find(named.key()))) << named.key();
  EXPECT_EQ(loaded->named_parameters().size(), plain->named_parameters().size() + 4u);  // + weight and bias per layer
  // Head surgery keeps the gates of the layers it changes.
  auto pruned = drop_heads(routed, {{1, {2, 3}}});
  EXPECT_TRUE(torch::equal(pruned->layers[1]->as<DecoderLayer>()->router->weight,
                           routed->layers[1]->as<DecoderLayer>()->router->weight));
  // llama.cpp has no router: the file holds the plain model's tensors.
  const auto report = export_gguf(dir.file("routed"), dir.file("routed.gguf"), torch::kFloat32);
  EXPECT_TRUE(report.router_dropped);
  EXPECT_EQ(read_gguf(dir.file("routed.gguf")).tensors.size(), 1u + 1u + 1u + 2u * 9u);
}

namespace {

// llama.cpp's SPM tokenisation, from the GGUF fields alone: spaces become U+2581 (one more in front
// with add_space_prefix), the text splits into UTF-8 characters, and the adjacent pair whose joined
// piece is a token of the highest score merges first (leftmost on ties) until no pair is a token; a
// piece that is no token is spelled with its byte tokens <0xXX>; BOS in front with add_bos_token.
std::vector<int64_t> spm_tokenize(const GgufFile& file, const std::string& text) {
  const auto& tokens = file.find("tokenizer.ggml.tokens")->value;
  const auto& scores = file.find("tokenizer.ggml.scores")->value;
  std::map<std::string, int64_t> ids;
  for (size_t id = 0; id < tokens.size(); ++id) ids.emplace(tokens[id].get<std::string>(), static_cast<int64_t>(id));
  std::string spaced = file.find("tokenizer.ggml.add_space_prefix")->value.get<bool>() ? " " + text : text;
  std::string normalized;
  for (char c : spaced) normalized += c == ' ' ? std::string("\xe2\x96\x81") : std::string(1, c);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < normalized.size();) {
    const auto lead = static_cast<unsigned char>(normalized[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
    pieces.push_back(normalized.substr(i, length));
    i += length;
  }
  while (true) {
    std::optional<size_t> best;
    double best_score = 0;
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      const auto found = ids.find(pieces[i] + pieces[i + 1]);
      if (found == ids.end()) continue;
      const double score = scores[static_cast<size_t>(found->second)].get<double>();
      if (!best || score > best_score) {
        best = i;
        best_score = score;
      }
    }
    if (!best) break;
    pieces[*best] += pieces[*best + 1];
    pieces.erase(pieces.begin() + static_cast<long>(*best) + 1);
  }
  std::vector<int64_t> result;
  if (file.find("tokenizer.ggml.add_bos_token")->value.get<bool>())
    result.push_back(file.find("tokenizer.ggml.bos_token_id")->value.get<int64_t>());
  for (const auto& piece : pieces) {
    if (ids.count(piece)) {
      result.push_back(ids.at(piece));
      continue;
    }
    for (unsigned char byte : piece) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", byte);
      result.push_back(ids.at(name));
    }
  }
  return result;
}

}  // namespace

// A SentencePiece-style tokenizer (stories260K's, Llama 2's family) is exported as llama.cpp's "llama"
// vocabulary with the fields llama.cpp's own converter writes (compared with a file it wrote), and
// tokenising from those fields as llama.cpp does gives llama2.c's ids for the answer-key prompts.
TEST(Gguf, SentencePieceTokenizersExportAsLlamaVocabularies) {
  TempDir dir;
  const std::string model_dir = coconut::testing::test_data("models/stories260K");
  const auto report = export_gguf(model_dir, dir.file("stories.gguf"), torch::kFloat32);
  EXPECT_EQ(report.tokenizer_model, "llama");
  const auto file = read_gguf(dir.file("stories.gguf"));
  const auto reference = read_gguf(coconut::testing::test_data("gguf/llama-2-tiny-random.gguf"));
  for (const std::string key : {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"}) {
    ASSERT_NE(reference.find(key), nullptr) << key;
    ASSERT_NE(file.find(key), nullptr) << key;
    EXPECT_EQ(file.find(key)->type, reference.find(key)->type) << key;
    EXPECT_EQ(file.find(key)->element_type, reference.find(key)->element_type) << key;
  }
  EXPECT_EQ(file.find("tokenizer.ggml.model")->value, "llama");
  const auto& types = file.find("tokenizer.ggml.token_type")->value;
  ASSERT_EQ(types.size(), 512u);
  EXPECT_EQ(file.find("tokenizer.ggml.scores")->value.size(), 512u);
  // As llama.cpp typed its own file: <unk> unknown, <s> and </s> control, <0x00>.. bytes.
  for (size_t id = 0; id < 6; ++id) EXPECT_EQ(types[id], reference.find("tokenizer.ggml.token_type")->value[id]) << id;
  EXPECT_EQ(types[3 + 255], 6);

  for (const auto& key : read_json_file(coconut::testing::test_data("models/stories260K/answer_keys.json")))
    EXPECT_EQ(spm_tokenize(file, key["prompt"].get<std::string>()), key["prompt_ids"].get<std::vector<int64_t>>()) << key["prompt"];
  // Text that needs byte fallback and runs of spaces: the same ids as our tokenizer.json reader.
  const auto tokenizer = HfTokenizer::load(model_dir + "/tokenizer.json");
  for (const std::string text : {"Once upon a time, there was a cat.", "caf\xc3\xa9  \xe2\x98\x83 12345!", "  two  spaces"})
    EXPECT_EQ(spm_tokenize(file, text), tokenizer->encode_with_special_tokens(text)) << text;
}

// import-gguf reads back what export-gguf wrote: the weights exactly (Q/K rows permuted back), the
// config (Llama 3's frequency scaling recovered from rope_freqs), and a SentencePiece vocabulary
// rebuilt from scores that tokenises as the tokenizer.json it came from and as llama.cpp does.
TEST(GgufImport, ExportedModelsComeBackAsTheyWere) {
  TempDir dir;
  const std::string model_dir = coconut::testing::test_data("models/stories260K");
  export_gguf(model_dir, dir.file("stories.gguf"), torch::kFloat32);
  const auto report = import_gguf(dir.file("stories.gguf"), dir.file("imported"), torch::kFloat32);
  EXPECT_EQ(report.tokenizer_model, "llama");
  auto original = load_model(model_dir, torch::kFloat32);
  auto imported = load_model(dir.file("imported"), torch::kFloat32);
  const auto imported_parameters = imported->named_parameters();
  for (const auto& named : original->named_parameters())
    EXPECT_TRUE(torch::equal(named.value(), imported_parameters[named.key()])) << named.key();
  EXPECT_EQ(imported->config().tie_word_embeddings, original->config().tie_word_embeddings);
  EXPECT_EQ(imported->config().bos_token_ids, original->config().bos_token_ids);  // SPM adds BOS
  const auto file = read_gguf(dir.file("stories.gguf"));
  const auto tokenizer = HfTokenizer::load(model_dir + "/tokenizer.json");
  const auto rebuilt = HfTokenizer::load(dir.file("imported/tokenizer.json"));
  for (const std::string text : {"Once upon a time, there was a cat.", "caf\xc3\xa9  \xe2\x98\x83 12345!", "  two  spaces",
                                 "Lily and Ben went to the park. They saw a big, red ball!", "", "\n\nx\ty"}) {
    EXPECT_EQ(rebuilt->encode_with_special_tokens(text), tokenizer->encode_with_special_tokens(text)) << text;
    if (!text.empty()) {
      EXPECT_EQ(rebuilt->encode_with_special_tokens(text), spm_tokenize(file, text)) << text;
    }
    EXPECT_EQ(rebuilt->decode(rebuilt->encode(text), true), tokenizer->decode(tokenizer->encode(text), true)) << text;
  }

  // A Llama 3 model: rope_freqs back into rope_scaling, its tokenizer as llama-bpe.
  auto llama3 = save_tiny_llama3(dir.file("llama3"), 128009);
  const LlamaConfig& config = llama3->config();
  export_gguf(dir.file("llama3"), dir.file("llama3.gguf"), torch::kFloat32);
  const auto llama3_report = import_gguf(dir.file("llama3.gguf"), dir.file("llama3-imported"), torch::kBFloat16);
  EXPECT_EQ(llama3_report.tokenizer_pre, "llama-bpe");
  const LlamaConfig back = load_config(dir.file("llama3-imported"));
  EXPECT_EQ(back.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(back.rope_scaling.factor, config.rope_scaling.factor);
  // Head width 4 has no frequency between the bands: any context putting both in their band is
  // the same scaling, so the frequencies are compared, not the parameters.
  EXPECT_TRUE(torch::allclose(rope_inverse_frequencies(back), rope_inverse_frequencies(config), 1e-6, 0));
  // Llama 3.2's own parameters come back as they were (head width 64: frequencies between the bands).
  {
    LlamaConfig llama32;
    llama32.hidden_size = 128;
    llama32.num_attention_heads = 2;
    llama32.num_key_value_heads = 1;
    llama32.intermediate_size = 32;
    llama32.num_hidden_layers = 1;
    llama32.vocab_size = 10;
    llama32.rope_theta = 500000;
    llama32.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
    llama32.validate();
    GgufWriter writer;
    writer.add("general.architecture", GgufValueType::kString, "llama");
    for (const auto& [key, value] : std::vector<std::pair<std::string, int>>{{"embedding_length", 128}, {"block_count", 1},
                                                                             {"context_length", 131072}, {"feed_forward_length", 32},
                                                                             {"attention.head_count", 2}, {"attention.head_count_kv", 1}})
      writer.add("llama." + key, GgufValueType::kUint32, value);
    writer.add("llama.attention.layer_norm_rms_epsilon", GgufValueType::kFloat32, 1e-5);
    writer.add("llama.rope.freq_base", GgufValueType::kFloat32, 500000.0);
    writer.add_tensor("token_embd.weight", torch::zeros({10, 128}));
    writer.add_tensor("rope_freqs.weight", rope_frequency_factors(llama32));
    writer.write(dir.file("llama32.gguf"));
    const LlamaConfig recovered = config_from_gguf(read_gguf(dir.file("llama32.gguf")));
    EXPECT_EQ(recovered.rope_scaling.factor, 32.0);
    EXPECT_EQ(recovered.rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(recovered.max_position_embeddings, 131072);
    EXPECT_TRUE(recovered.tie_word_embeddings);
  }
  EXPECT_EQ(back.torch_dtype, "bfloat16");
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{128009, 128008, 128001}));  // EOS, <|eom_id|>, <|end_of_text|>
  auto llama3_back = load_model(dir.file("llama3-imported"), torch::kFloat32);
  const auto back_parameters = llama3_back->named_parameters();
  for (const auto& named : llama3->named_parameters())
    EXPECT_TRUE(torch::equal(named.value().to(torch::kBFloat16).to(torch::kFloat32), back_parameters[named.key()])) << named.key();
  const auto llama3_tokenizer = HfTokenizer::load(dir.file("llama3-imported/tokenizer.json"));
  std::ifstream cases(coconut::testing::test_data("tokenizers/llama3/encode_cases.jsonl"));
  int checked = 0;
  for (std::string line; std::getline(cases, line);) {
    const auto entry = nlohmann::json::parse(line);
    EXPECT_EQ(llama3_tokenizer->encode(entry["text"].get<std::string>()), entry["ids"].get<std::vector<int64_t>>()) << entry["text"];
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// What the importer cannot read faithfully is refused by name.
TEST(GgufImport, UnknownArchitecturesTokenizersAndTypesAreRefusedByName) {
  TempDir dir;
  const auto refused = [&](const std::string& path, const std::string& message) {
    try {
      import_gguf(path, dir.file("out"), torch::kFloat32);
      ADD_FAILURE() << "imported; expected '" << message << "'";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  };
  const auto with_metadata = [&](const std::string& name, const std::string& key, const std::string& value) {
    // The stories260K export with one string entry replaced.
    export_gguf(coconut::testing::test_data("models/stories260K"), dir.file("base.gguf"), torch::kFloat32);
    const auto base = read_gguf(dir.file("base.gguf"));
    GgufWriter writer;
    for (const auto& entry : base.metadata) {
      if (entry.key == key) writer.add(key, GgufValueType::kString, value);
      else if (entry.type == GgufValueType::kArray) writer.add_array(entry.key, entry.element_type, entry.value);
      else writer.add(entry.key, entry.type, entry.value);
    }
    for (const auto& info : base.tensors) writer.add_tensor(info.name, read_gguf_tensor(base, info));
    writer.write(dir.file(name));
    return dir.file(name);
  };
  refused(with_metadata("arch.gguf", "general.architecture", "mamba"), "architecture 'mamba' is not read here");
  refused(with_metadata("vocab.gguf", "tokenizer.ggml.model", "bert"), "tokenizer.ggml.model 'bert'");
  // IQ2_XXS (type 16) blocks of 256: listed, sized, and refused when read.
  std::ofstream(dir.file("iq.gguf"), std::ios::binary) << handmade_gguf({{"token_embd.weight", {256, 1}, 16, 0}}, 96);
  try {
    read_gguf_tensor(read_gguf(dir.file("iq.gguf")), read_gguf(dir.file("iq.gguf")).tensors[0]);
    ADD_FAILURE() << "IQ2_XXS read";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("has ggml type IQ2_XXS, which is not read here"), std::string::npos) << error.what();
  }
}
