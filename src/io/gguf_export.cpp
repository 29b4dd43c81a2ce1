#include "io/gguf_export.h"

#include <cctype>
#include <filesystem>
#include <optional>
#include <regex>
#include <stdexcept>
#include <utility>

#include "io/gguf.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "model/llama.h"

namespace coconut {

namespace fs = std::filesystem;
using json = nlohmann::json;

torch::Tensor permute_rows_for_ggml(const torch::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0), half = rows / heads / 2;
  // [H*Dh, D] -> [H, 2, Dh/2, D] -> [H, Dh/2, 2, D] -> [H*Dh, D]
  return weight.reshape({heads, 2, half, -1}).transpose(1, 2).reshape(weight.sizes()).contiguous();
}

torch::Tensor unpermute_rows_from_ggml(const torch::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0), half = rows / heads / 2;
  // [H*Dh, D] -> [H, Dh/2, 2, D] -> [H, 2, Dh/2, D] -> [H*Dh, D]
  return weight.reshape({heads, half, 2, -1}).transpose(1, 2).reshape(weight.sizes()).contiguous();
}

std::string gguf_tensor_name(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> globals = {
      {"embed_tokens.weight", "token_embd.weight"}, {"norm.weight", "output_norm.weight"}, {"lm_head.weight", "output.weight"}};
  for (const auto& [ours, theirs] : globals)
    if (name == ours) return theirs;
  static const std::regex layer_name(R"(layers\.(\d+)\.(.+)\.(weight|bias))");
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},       {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"},  {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},            {"mlp.down_proj", "ffn_down"}};
  std::smatch match;
  if (std::regex_match(name, match, layer_name)) {
    for (const auto& [ours, theirs] : parts)
      if (match[2] == ours) return "blk." + match[1].str() + "." + theirs + "." + match[3].str();
  }
  throw std::invalid_argument("no GGUF name for parameter '" + name + "'");
}

torch::Tensor rope_frequency_factors(const LlamaConfig& config) {
  LlamaConfig unscaled = config;
  unscaled.rope_scaling = RopeScaling{};
  return (rope_inverse_frequencies(unscaled) / rope_inverse_frequencies(config)).to(torch::kFloat32);
}

namespace {

// llama.cpp's token types.
enum GgmlTokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

bool is_byte_token(const std::string& token) {
  return token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && std::isxdigit(static_cast<unsigned char>(token[3])) &&
         std::isxdigit(static_cast<unsigned char>(token[4]));
}

// A merge list "a b" / ["a", "b"] entry as its two parts.
std::pair<std::string, std::string> merge_parts(const json& merge) {
  if (merge.is_array()) return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  const std::string text = merge.get<std::string>();
  const size_t space = text.find(' ');
  return {text.substr(0, space), text.substr(space + 1)};
}

// tokenizer.json -> tokenizer.ggml.*:
// - byte-level BPE (Llama 3, GPT-2) as "gpt2": tokens, types and merges;
// - SentencePiece-style BPE (byte fallback, "\u2581" for spaces: Llama 2, TinyLlama, stories260K)
//   as "llama" (SPM): tokens, types (byte tokens marked), and scores. llama.cpp's SPM tokenizer
//   merges the adjacent pair whose joined token scores highest (leftmost on ties); a merge of rank
//   r gives its result the score -r, so that order is the merge list's;
// - anything else as "none" (ids only).
std::string add_tokenizer(GgufWriter& writer, const std::string& path, const LlamaConfig& config) {
  if (!fs::exists(path)) {
    writer.add("tokenizer.ggml.model", GgufValueType::kString, "none");
    return "none";
  }
  const json tokenizer = read_json_file(path);
  const json& model = tokenizer.at("model");
  const std::string pre_tokenizer = tokenizer.contains("pre_tokenizer") ? tokenizer["pre_tokenizer"].dump() : "";
  const bool byte_level = model.value("type", "") == "BPE" && pre_tokenizer.find("ByteLevel") != std::string::npos;
  const bool sentencepiece = model.value("type", "") == "BPE" && !byte_level && model.value("byte_fallback", false);
  std::vector<std::string> tokens(static_cast<size_t>(config.vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(config.vocab_size), 1);  // normal
  for (size_t id = 0; id < tokens.size(); ++id) {
    tokens[id] = "[PAD" + std::to_string(id) + "]";
    types[id] = 5;  // unused
  }
  auto place = [&](const std::string& token, int64_t id, int32_t type) {
    if (id < 0 || id >= config.vocab_size)
      throw std::invalid_argument(path + ": token id " + std::to_string(id) + " is outside the model's vocabulary");
    tokens[static_cast<size_t>(id)] = token;
    types[static_cast<size_t>(id)] = type;
  };
  if (model.contains("vocab") && model["vocab"].is_object())
    for (const auto& [token, id] : model["vocab"].items())
      place(token, id.get<int64_t>(), sentencepiece && is_byte_token(token) ? kByte : kNormal);
  if (sentencepiece && model.contains("unk_token") && model["unk_token"].is_string() && model["vocab"].contains(model["unk_token"]))
    types[static_cast<size_t>(model["vocab"][model["unk_token"].get<std::string>()].get<int64_t>())] = kUnknown;
  if (tokenizer.contains("added_tokens"))
    for (const auto& added : tokenizer["added_tokens"]) {
      const int64_t id = added.at("id").get<int64_t>();
      const bool unknown = id >= 0 && id < config.vocab_size && types[static_cast<size_t>(id)] == kUnknown;
      place(added.at("content").get<std::string>(), id, unknown ? kUnknown : added.value("special", false) ? kControl : kUserDefined);
    }
  const std::string kind = byte_level ? "gpt2" : sentencepiece ? "llama" : "none";
  writer.add("tokenizer.ggml.model", GgufValueType::kString, kind);
  if (byte_level) {
    const bool llama3 = pre_tokenizer.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos;
    // SmolLM2's: every digit alone, then GPT-2's pattern (llama.cpp's "smollm"; as "gpt-2", digit
    // strings would tokenize differently there).
    const json& pre = tokenizer.contains("pre_tokenizer") ? tokenizer["pre_tokenizer"] : json();
    const bool smollm = pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
                        pre["pretokenizers"].size() == 2 && pre["pretokenizers"][0].value("type", "") == "Digits" &&
                        pre["pretokenizers"][0].value("individual_digits", false) &&
                        pre["pretokenizers"][1].value("type", "") == "ByteLevel" && pre["pretokenizers"][1].value("use_regex", false);
    writer.add("tokenizer.ggml.pre", GgufValueType::kString, llama3 ? "llama-bpe" : smollm ? "smollm" : "gpt-2");
  }
  writer.add_array("tokenizer.ggml.tokens", GgufValueType::kString, tokens);
  writer.add_array("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  if (byte_level && model.contains("merges")) {
    json merges = json::array();
    for (const auto& merge : model["merges"]) {
      const auto [left, right] = merge_parts(merge);
      merges.push_back(left + " " + right);
    }
    writer.add_array("tokenizer.ggml.merges", GgufValueType::kString, merges);
  }
  if (sentencepiece) {
    std::vector<float> scores(tokens.size(), 0.0f);
    std::vector<bool> scored(tokens.size(), false);
    int64_t rank = 0;
    for (const auto& merge : model.value("merges", json::array())) {
      const auto [left, right] = merge_parts(merge);
      const auto merged = model["vocab"].find(left + right);
      if (merged != model["vocab"].end()) {
        const auto id = static_cast<size_t>(merged->get<int64_t>());
        if (!scored[id]) scores[id] = -static_cast<float>(rank);  // the first (best) merge making it
        scored[id] = true;
      }
      ++rank;
    }
    writer.add_array("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
    // The normaliser's Prepend("\u2581") is SPM's space prefix; a template opening with BOS adds it.
    const std::string normalizer = tokenizer.contains("normalizer") ? tokenizer["normalizer"].dump() : "";
    writer.add("tokenizer.ggml.add_space_prefix", GgufValueType::kBool, normalizer.find("Prepend") != std::string::npos);
    const json post = tokenizer.value("post_processor", json());
    const bool bos_first = post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
                           post["single"].is_array() && !post["single"].empty() && post["single"][0].contains("SpecialToken");
    writer.add("tokenizer.ggml.add_bos_token", GgufValueType::kBool, bos_first);
    writer.add("tokenizer.ggml.add_eos_token", GgufValueType::kBool, false);
    if (model.contains("unk_token") && model["vocab"].contains(model["unk_token"]))
      writer.add("tokenizer.ggml.unknown_token_id", GgufValueType::kUint32, model["vocab"][model["unk_token"].get<std::string>()].get<int64_t>());
  }
  // BOS: the config's, else generation_config.json's (an imported file whose tokenizer adds no BOS
  // still names one); whether it is added, and the chat template, from tokenizer_config.json.
  const fs::path folder = fs::path(path).parent_path();
  std::optional<int64_t> bos;
  if (!config.bos_token_ids.empty()) bos = config.bos_token_ids.front();
  if (!bos && fs::exists(folder / "generation_config.json")) {
    const json generation = read_json_file((folder / "generation_config.json").string());
    if (generation.contains("bos_token_id") && generation["bos_token_id"].is_number_integer()) bos = generation["bos_token_id"].get<int64_t>();
  }
  if (bos) writer.add("tokenizer.ggml.bos_token_id", GgufValueType::kUint32, *bos);
  if (!config.eos_token_ids.empty())
    writer.add("tokenizer.ggml.eos_token_id", GgufValueType::kUint32, config.eos_token_ids.front());
  if (fs::exists(folder / "tokenizer_config.json")) {
    const json tokenizer_config = read_json_file((folder / "tokenizer_config.json").string());
    if (byte_level && tokenizer_config.contains("add_bos_token") && tokenizer_config["add_bos_token"].is_boolean())
      writer.add("tokenizer.ggml.add_bos_token", GgufValueType::kBool, tokenizer_config["add_bos_token"].get<bool>());
    if (tokenizer_config.contains("chat_template") && tokenizer_config["chat_template"].is_string())
      writer.add("tokenizer.chat_template", GgufValueType::kString, tokenizer_config["chat_template"].get<std::string>());
  }
  return kind;
}

}  // namespace

GgufExportReport export_gguf(const std::string& model_dir, const std::string& out_path, torch::ScalarType dtype) {
  if (dtype != torch::kFloat32 && dtype != torch::kFloat16 && dtype != torch::kBFloat16)
    throw std::invalid_argument("GGUF export: dtype must be float32, float16 or bfloat16");
  auto model = load_model(model_dir, torch::kFloat32);
  const LlamaConfig& config = model->config();
  GgufExportReport report;
  report.architecture = config.is_uniform() ? "llama" : "deci";
  const std::string& arch = report.architecture;
  GgufWriter writer;
  writer.add("general.architecture", GgufValueType::kString, arch);
  writer.add("general.name", GgufValueType::kString, fs::path(model_dir).lexically_normal().filename().string());
  writer.add("general.file_type", GgufValueType::kUint32, dtype == torch::kFloat32 ? 0 : dtype == torch::kFloat16 ? 1 : 32);
  writer.add(arch + ".context_length", GgufValueType::kUint32, config.max_position_embeddings);
  writer.add(arch + ".embedding_length", GgufValueType::kUint32, config.hidden_size);
  writer.add(arch + ".block_count", GgufValueType::kUint32, config.num_hidden_layers);
  if (config.is_uniform()) {
    writer.add(arch + ".feed_forward_length", GgufValueType::kUint32, config.intermediate_size);
    writer.add(arch + ".attention.head_count", GgufValueType::kUint32, config.num_attention_heads);
    writer.add(arch + ".attention.head_count_kv", GgufValueType::kUint32, config.num_key_value_heads);
  } else {
    std::vector<int32_t> ffn, heads, kv_heads;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      ffn.push_back(static_cast<int32_t>(config.ffn(l)));
      heads.push_back(static_cast<int32_t>(config.heads(l)));
      kv_heads.push_back(static_cast<int32_t>(config.kv_heads(l)));
    }
    writer.add_array(arch + ".feed_forward_length", GgufValueType::kInt32, ffn);
    writer.add_array(arch + ".attention.head_count", GgufValueType::kInt32, heads);
    writer.add_array(arch + ".attention.head_count_kv", GgufValueType::kInt32, kv_heads);
  }
  writer.add(arch + ".attention.key_length", GgufValueType::kUint32, config.head_dim);
  writer.add(arch + ".attention.value_length", GgufValueType::kUint32, config.head_dim);
  writer.add(arch + ".rope.dimension_count", GgufValueType::kUint32, config.head_dim);
  writer.add(arch + ".rope.freq_base", GgufValueType::kFloat32, config.rope_theta);
  writer.add(arch + ".attention.layer_norm_rms_epsilon", GgufValueType::kFloat32, config.rms_norm_eps);
  writer.add(arch + ".vocab_size", GgufValueType::kUint32, config.vocab_size);
  if (config.rope_scaling.type == "linear") {
    writer.add(arch + ".rope.scaling.type", GgufValueType::kString, "linear");
    writer.add(arch + ".rope.scaling.factor", GgufValueType::kFloat32, config.rope_scaling.factor);
  }
  report.tokenizer_model = add_tokenizer(writer, model_dir + "/tokenizer.json", config);

  if (config.rope_scaling.type == "llama3") writer.add_tensor("rope_freqs.weight", rope_frequency_factors(config));
  for (const auto& named : model->named_parameters()) {
    const std::string& name = named.key();
    if (name.find(".router.") != std::string::npos) {
      report.router_dropped = true;
      continue;
    }
    torch::Tensor tensor = named.value().detach();
    const auto dot = name.find(".self_attn.");
    const bool query = name.find("q_proj") != std::string::npos, key = name.find("k_proj") != std::string::npos;
    if (dot != std::string::npos && (query || key)) {
      const int64_t layer = std::stoll(name.substr(7, dot - 7));  // "layers.<l>.self_attn..."
      const int64_t heads = query ? config.heads(layer) : config.kv_heads(layer);
      tensor = tensor.dim() == 1 ? permute_rows_for_ggml(tensor.unsqueeze(1), heads).squeeze(1)  // bias [H*Dh]
                                 : permute_rows_for_ggml(tensor, heads);
    }
    writer.add_tensor(gguf_tensor_name(name), tensor.dim() == 1 ? tensor.to(torch::kFloat32) : tensor.to(dtype));
    ++report.tensors;
  }
  writer.write(out_path);
  report.bytes = fs::file_size(out_path);
  return report;
}

}  // namespace coconut
