// HF folders: config.json parsing, loading the real stories260K model and reproducing the greedy
// continuations of llama2.c's own implementation, atomic save + bit-exact reload, shards, and one
// test per bad checkpoint.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <fstream>

#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "model/generate.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;
using coconut::testing::test_data;
using coconut::testing::TempDir;
using nlohmann::json;

namespace {

json base_config() {
  return json::parse(R"({"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "model_type": "llama"})");
}

// A tiny saved model folder to corrupt.
std::string save_tiny(const TempDir& dir, bool tied = true) {
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = tied;
  auto model = coconut::testing::tiny_model(config);
  save_hf_folder(dir.file("model"), model);
  return dir.file("model");
}

}  // namespace

TEST(HfConfig, ParsesIdsAsIntOrListAndDerivesHeadDim) {
  auto j = base_config();
  j["eos_token_id"] = json::array({128001, 128008, 128009});
  j["bos_token_id"] = 128000;
  const auto config = config_from_json(j, "config.json");
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(config.bos_token_ids, (std::vector<int64_t>{128000}));
  EXPECT_EQ(config.head_dim, 4);
  EXPECT_EQ(config.rope_scaling.type, "none");
}

TEST(HfConfig, ReadsTheRealLlama32Config) {
  const auto config = load_config(test_data("tokenizers/llama3/config.json"));
  EXPECT_EQ(config.hidden_size, 2048);
  EXPECT_EQ(config.num_key_value_heads, 8);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(config.rope_scaling.factor, 32.0);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(config.tie_word_embeddings);
}

TEST(HfConfig, UnknownRopeTypeIsAnError) {
  auto j = base_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THROW_WITH(config_from_json(j, "dir/config.json"), "dir/config.json", "rope_scaling", "yarn");
}

TEST(HfConfig, ActivationOtherThanSiluIsAnError) {
  auto j = base_config();
  j["hidden_act"] = "gelu";
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "hidden_act", "gelu");
}

TEST(HfConfig, MissingFieldAndWrongTypeAreErrors) {
  auto j = base_config();
  j.erase("vocab_size");
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "vocab_size", "missing");
  j = base_config();
  j["num_attention_heads"] = "four";
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "num_attention_heads");
  j = base_config();
  j["num_key_value_heads"] = 3;
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "multiple");
}

TEST(HfConfig, MalformedJsonNamesTheFile) {
  TempDir dir;
  std::ofstream(dir.file("config.json")) << "{\"hidden_size\": 16,";
  EXPECT_THROW_WITH(load_config(dir.path().string()), "config.json", "malformed JSON");
}

TEST(HfConfig, PerLayerArraysRoundTrip) {
  auto j = base_config();
  j["layer_num_attention_heads"] = {4, 2};
  j["layer_num_key_value_heads"] = {2, 1};
  j["layer_intermediate_size"] = {24, 10};
  const auto config = config_from_json(j, "c.json");
  EXPECT_FALSE(config.is_uniform());
  EXPECT_EQ(config.heads(1), 2);
  EXPECT_EQ(config.ffn(1), 10);
  const auto again = config_from_json(config_to_json(config), "again");
  EXPECT_EQ(again.layer_num_attention_heads, config.layer_num_attention_heads);
  EXPECT_EQ(again.layer_num_key_value_heads, config.layer_num_key_value_heads);
  EXPECT_EQ(again.layer_intermediate_size, config.layer_intermediate_size);
  // A uniform config writes no arrays (a plain HF config).
  EXPECT_FALSE(config_to_json(config_from_json(base_config(), "c")).contains("layer_intermediate_size"));
  j["layer_intermediate_size"] = {24};
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "layer_intermediate_size");
}

TEST(HfConfig, LatentThoughtRmsRoundTripsAndOnlyWhenSet) {
  auto j = base_config();
  EXPECT_EQ(config_from_json(j, "c.json").latent_thought_rms, 0.0);
  EXPECT_FALSE(config_to_json(config_from_json(j, "c.json")).contains("latent_thought_rms"));  // a plain HF config
  j["latent_thought_rms"] = 0.125;
  const auto again = config_from_json(config_to_json(config_from_json(j, "c.json")), "again");
  EXPECT_EQ(again.latent_thought_rms, 0.125);
  j["latent_thought_rms"] = -1;
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "latent_thought_rms");
  j["latent_thought_rms"] = "big";
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "latent_thought_rms");
}

TEST(HfConfig, LatentThoughtInputRoundTripsAndRejectsUnknownValues) {
  auto j = base_config();
  EXPECT_EQ(config_from_json(j, "c.json").latent_thought_input, "last_hidden");
  EXPECT_FALSE(config_to_json(config_from_json(j, "c.json")).contains("latent_thought_input"));  // a plain HF config
  j["latent_thought_input"] = "expected_embedding";
  const auto again = config_from_json(config_to_json(config_from_json(j, "c.json")), "again");
  EXPECT_TRUE(again.thought_is_expected_embedding());
  j["latent_thought_input"] = "soft";
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "latent_thought_input");
  j["latent_thought_input"] = 1;
  EXPECT_THROW_WITH(config_from_json(j, "c.json"), "c.json", "latent_thought_input");
}

TEST(HfCheckpoint, Stories260KReproducesLlama2cGreedyContinuations) {
  const std::string folder = test_data("models/stories260K");
  auto model = load_model(folder);
  EXPECT_EQ(model->config().num_hidden_layers, 5);
  EXPECT_TRUE(model->config().tie_word_embeddings);
  const json keys = read_json_file(folder + "/answer_keys.json");
  ASSERT_GE(keys.size(), 3u);
  for (const auto& key : keys) {
    const auto prompt = key["prompt_ids"].get<std::vector<int64_t>>();
    const auto expected = key["generated_ids"].get<std::vector<int64_t>>();
    GenerationOptions options;
    options.max_new_tokens = static_cast<int64_t>(expected.size());
    const auto result = generate(model, {prompt}, options);
    EXPECT_EQ(result.tokens[0], expected) << "prompt '" << key["prompt"].get<std::string>() << "'";
  }
  // And all three prompts at once, left-padded in one batch.
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& key : keys) prompts.push_back(key["prompt_ids"].get<std::vector<int64_t>>());
  GenerationOptions options;
  options.max_new_tokens = 40;
  const auto batched = generate(model, prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto expected = keys[i]["generated_ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(batched.tokens[i], std::vector<int64_t>(expected.begin(), expected.begin() + 40)) << "row " << i;
  }
}

// Loading runs on one intra-op thread and gives the caller's count back, whatever it was.
TEST(HfCheckpoint, LoadingLeavesTheThreadCountAsItWas) {
  const int threads = at::get_num_threads();
  for (int count : {2, 1, 3}) {
    at::set_num_threads(count);
    auto model = load_model(test_data("models/stories260K"));
    EXPECT_EQ(at::get_num_threads(), count);
  }
  at::set_num_threads(threads);
}

TEST(HfCheckpoint, Stories260KGreedyFromBos) {
  const std::string folder = test_data("models/stories260K");
  auto model = load_model(folder);
  const json key = read_json_file(folder + "/greedy_bos_256.json");
  const auto prompt = key["prompt_ids"].get<std::vector<int64_t>>();
  auto expected = key["output_ids"].get<std::vector<int64_t>>();
  GenerationOptions options;
  options.max_new_tokens = static_cast<int64_t>(expected.size()) - static_cast<int64_t>(prompt.size()) + 1;
  const auto result = generate(model, {prompt}, options);
  // output_ids = prompt tokens after BOS, then the new tokens.
  std::vector<int64_t> produced(prompt.begin() + 1, prompt.end());
  produced.insert(produced.end(), result.tokens[0].begin(), result.tokens[0].end());
  produced.resize(expected.size());
  EXPECT_EQ(produced, expected);
}

TEST(HfCheckpoint, SaveThenLoadIsBitExactInEveryDtype) {
  TempDir dir;
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = false;
  auto model = coconut::testing::tiny_model(config);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    SaveOptions options;
    options.dtype = dtype;
    save_hf_folder(dir.file("m"), model, options);
    EXPECT_EQ(load_config(dir.file("m")).torch_dtype, dtype_name(dtype));
    // Loaded back in the saved dtype: bit-exact.
    auto loaded = load_model(dir.file("m"), dtype == torch::kFloat16 ? std::optional<torch::ScalarType>(torch::kFloat32) : std::nullopt);
    auto original = model->named_parameters();
    for (const auto& named : loaded->named_parameters())
      EXPECT_TRUE(torch::equal(named.value(), original[named.key()].to(dtype).to(named.value().scalar_type()))) << named.key();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.tmp")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.old")));
}

TEST(HfCheckpoint, ShardedFolderLoadsLikeASingleFile) {
  TempDir dir;
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  SaveOptions options;
  options.max_shard_bytes = 2000;
  save_hf_folder(dir.file("sharded"), model, options);
  EXPECT_TRUE(std::filesystem::exists(dir.file("sharded/model.safetensors.index.json")));
  int shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("sharded")))
    shards += entry.path().extension() == ".safetensors";
  EXPECT_GE(shards, 3);  // ~12 KB of float32 weights in shards of at most 2000 bytes (one tensor may exceed)
  auto loaded = load_model(dir.file("sharded"));
  auto ids = torch::tensor(std::vector<int64_t>{1, 2, 3}).view({1, -1});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(loaded->forward_ids(ids).hidden, model->forward_ids(ids).hidden));
}

TEST(HfCheckpoint, MissingTensorIsNamed) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  auto tensors = read_safetensors(folder + "/model.safetensors");
  tensors.erase("model.layers.1.mlp.up_proj.weight");
  write_safetensors(folder + "/model.safetensors", tensors);
  EXPECT_THROW_WITH(load_model(folder), "model.layers.1.mlp.up_proj.weight", "missing");
}

TEST(HfCheckpoint, UnexpectedTensorIsNamed) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  auto tensors = read_safetensors(folder + "/model.safetensors");
  tensors["model.layers.2.mlp.up_proj.weight"] = torch::zeros({24, 16});
  write_safetensors(folder + "/model.safetensors", tensors);
  EXPECT_THROW_WITH(load_model(folder), "model.safetensors", "model.layers.2.mlp.up_proj.weight", "unexpected");
}

TEST(HfCheckpoint, WrongShapeIsNamed) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  auto tensors = read_safetensors(folder + "/model.safetensors");
  tensors["model.layers.0.self_attn.k_proj.weight"] = torch::zeros({16, 16});
  write_safetensors(folder + "/model.safetensors", tensors);
  EXPECT_THROW_WITH(load_model(folder), "model.safetensors", "model.layers.0.self_attn.k_proj.weight", "shape");
}

TEST(HfCheckpoint, TiedHeadThatDiffersIsAnError) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  auto tensors = read_safetensors(folder + "/model.safetensors");
  tensors["lm_head.weight"] = torch::zeros({11, 16});
  write_safetensors(folder + "/model.safetensors", tensors);
  EXPECT_THROW_WITH(load_model(folder), "lm_head.weight", "tie_word_embeddings");
}

TEST(HfCheckpoint, TruncatedWeightsFileIsNamed) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  const auto file = folder + "/model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  EXPECT_THROW_WITH(load_model(folder), "model.safetensors");
}

TEST(HfCheckpoint, NoWeightsAtAll) {
  TempDir dir;
  const auto folder = save_tiny(dir);
  std::filesystem::remove(folder + "/model.safetensors");
  EXPECT_THROW_WITH(load_model(folder), folder, "no model.safetensors");
}

TEST(HfCheckpoint, ShardListedInIndexButTensorAbsent) {
  TempDir dir;
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  SaveOptions options;
  options.max_shard_bytes = 2000;
  save_hf_folder(dir.file("s"), model, options);
  auto index = read_json_file(dir.file("s/model.safetensors.index.json"));
  const std::string moved = "model.norm.weight";
  const std::string other = index["weight_map"]["model.embed_tokens.weight"] == index["weight_map"][moved]
                                ? "model.layers.1.mlp.down_proj.weight"
                                : "model.embed_tokens.weight";
  index["weight_map"][moved] = index["weight_map"][other];  // lie about where it is
  std::ofstream(dir.file("s/model.safetensors.index.json")) << index.dump();
  EXPECT_THROW_WITH(load_model(dir.file("s")), moved, "missing");
}

// Loaded weights view the mapped file (read_safetensors): writing one in place copies its pages and
// never reaches the file, a second load reads what was saved, and both loads equal the saved model.
TEST(Checkpoint, WeightsWrittenInPlaceAfterLoadingLeaveTheFileAsItWas) {
  TempDir dir;
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  save_hf_folder(dir.file("model"), model);
  auto first = load_model(dir.file("model"), torch::kFloat32);
  const auto saved = model->named_parameters();
  {
    torch::NoGradGuard no_grad;
    for (auto& named : first->named_parameters()) {
      EXPECT_TRUE(torch::equal(named.value(), saved[named.key()])) << named.key();
      named.value().add_(1.0);
    }
  }
  auto second = load_model(dir.file("model"), torch::kFloat32);
  for (const auto& named : second->named_parameters()) {
    EXPECT_TRUE(torch::equal(named.value(), saved[named.key()])) << named.key();
    EXPECT_TRUE(torch::equal(first->named_parameters()[named.key()], saved[named.key()] + 1.0)) << named.key();
  }
  // Built without random initialization, a model still has every parameter in its shape.
  Llama empty(nullptr);
  {
    UninitializedWeights uninitialized;
    empty = Llama(model->config());
  }
  for (const auto& named : model->named_parameters())
    EXPECT_EQ(empty->named_parameters()[named.key()].sizes(), named.value().sizes()) << named.key();
}

// transformers 5's config.json: "dtype" for torch_dtype, RoPE settings in one "rope_parameters".
TEST(HfConfig, ReadsTransformers5Names) {
  const auto config = config_from_json(
      nlohmann::json::parse(R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})"),
      "config.json");
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(config.rope_theta, 500000.0);
  EXPECT_EQ(config.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(config.rope_scaling.factor, 32.0);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);
}
