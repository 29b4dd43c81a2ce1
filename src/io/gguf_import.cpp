#include "io/gguf_import.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "io/gguf_export.h"
#include "io/gguf_tokenizer.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "model/ggml_blocks.h"
#include "model/llama.h"
#include "util/atomic_file.h"

namespace coconut {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A per-layer size: one integer for every layer, or (deci) an array of one per layer.
int64_t uniform_or_layers(const GgufFile& file, const std::string& key, int64_t layers, std::vector<int64_t>& per_layer) {
  const GgufMetadata* entry = file.find(key);
  if (!entry) throw std::invalid_argument(file.path + ": metadata '" + key + "' is missing");
  if (entry->value.is_number_integer()) return entry->value.get<int64_t>();
  if (!entry->value.is_array() || static_cast<int64_t>(entry->value.size()) != layers)
    throw std::invalid_argument(file.path + ": metadata '" + key + "' must be an integer or one integer per layer (" +
                                std::to_string(layers) + ")");
  for (const json& value : entry->value) {
    if (!value.is_number_integer()) throw std::invalid_argument(file.path + ": metadata '" + key + "' must hold integers");
    per_layer.push_back(value.get<int64_t>());
  }
  return *std::max_element(per_layer.begin(), per_layer.end());
}

// Llama 3's frequency scaling from its rope_freqs tensor (per frequency: unscaled / scaled). The
// factor is the largest entry; low and high frequency factors are Llama 3's 1 and 4; the original
// context is Llama 3's 8192 when that reproduces the tensor, else solved from an entry between the
// bands, else (no entry between them) any context that puts every entry in its band, which gives
// the same frequencies. Every entry is checked against the result; a tensor no parameters
// reproduce is refused.
RopeScaling rope_scaling_from_factors(const GgufFile& file, const torch::Tensor& factors, LlamaConfig config) {
  const auto given = factors.to(torch::kFloat64).contiguous();
  LlamaConfig unscaled = config;
  unscaled.rope_scaling = RopeScaling{};
  const auto wavelengths = (2 * M_PI / rope_inverse_frequencies(unscaled).to(torch::kFloat64)).contiguous();
  RopeScaling scaling;
  scaling.type = "llama3";
  scaling.factor = given.max().item<double>();
  scaling.low_freq_factor = 1.0;
  scaling.high_freq_factor = 4.0;
  std::vector<double> contexts = {8192};
  double above = 0, below = 1e300;  // the context lies above wavelength * high of unscaled entries, below wavelength * low of full ones
  for (int64_t i = 0; i < given.numel(); ++i) {
    const double f = given[i].item<double>(), wavelength = wavelengths[i].item<double>();
    if (std::abs(f - 1) < 1e-6) {
      above = std::max(above, wavelength * scaling.high_freq_factor);
    } else if (std::abs(f - scaling.factor) < 1e-6 * scaling.factor) {
      below = std::min(below, wavelength * scaling.low_freq_factor);
    } else {  // 1 / f = (1 - s) / factor + s, s = (context / wavelength - low) / (high - low)
      const double smooth = (1 / f - 1 / scaling.factor) / (1 - 1 / scaling.factor);
      contexts.push_back(wavelength * (smooth * (scaling.high_freq_factor - scaling.low_freq_factor) + scaling.low_freq_factor));
    }
  }
  if (above < below) contexts.push_back(std::sqrt(std::max(above, 1.0) * below));
  for (double context : contexts) {
    scaling.original_max_position_embeddings = static_cast<int64_t>(std::llround(context));
    config.rope_scaling = scaling;
    const auto expected = rope_frequency_factors(config).to(torch::kFloat64);
    if (expected.sizes() == given.sizes() && torch::allclose(expected, given, 1e-5, 1e-6)) return scaling;
  }
  throw std::invalid_argument(file.path + ": rope_freqs.weight is not a Llama 3 frequency scaling (factor " + std::to_string(scaling.factor) +
                              ", low 1, high 4, any original context); no other is read here");
}

}  // namespace

LlamaConfig config_from_gguf(const GgufFile& file) {
  const std::string arch = file.required("general.architecture", "string").get<std::string>();
  if (arch != "llama" && arch != "deci")
    throw std::invalid_argument(file.path + ": architecture '" + arch + "' is not read here (llama and deci are)");
  const auto integer = [&](const std::string& key) { return file.required(arch + "." + key, "integer").get<int64_t>(); };
  LlamaConfig config;
  config.hidden_size = integer("embedding_length");
  config.num_hidden_layers = integer("block_count");
  config.max_position_embeddings = integer("context_length");
  config.intermediate_size = uniform_or_layers(file, arch + ".feed_forward_length", config.num_hidden_layers, config.layer_intermediate_size);
  config.num_attention_heads =
      uniform_or_layers(file, arch + ".attention.head_count", config.num_hidden_layers, config.layer_num_attention_heads);
  const std::string kv_key = arch + ".attention.head_count_kv";
  config.num_key_value_heads = file.find(kv_key) ? uniform_or_layers(file, kv_key, config.num_hidden_layers, config.layer_num_key_value_heads)
                                                 : config.num_attention_heads;
  if (config.num_attention_heads <= 0) throw std::invalid_argument(file.path + ": " + arch + ".attention.head_count must be positive");
  const json* key_length = file.value(arch + ".attention.key_length", "integer");
  config.head_dim = key_length ? key_length->get<int64_t>() : config.hidden_size / config.num_attention_heads;
  if (const json* value_length = file.value(arch + ".attention.value_length", "integer"); value_length && value_length->get<int64_t>() != config.head_dim)
    throw std::invalid_argument(file.path + ": key and value heads of different widths are not read here");
  if (const json* rotary = file.value(arch + ".rope.dimension_count", "integer"); rotary && rotary->get<int64_t>() != config.head_dim)
    throw std::invalid_argument(file.path + ": RoPE over " + std::to_string(rotary->get<int64_t>()) + " of " +
                                std::to_string(config.head_dim) + " head dimensions (partial rotary) is not read here");
  if (const json* theta = file.value(arch + ".rope.freq_base", "number")) config.rope_theta = theta->get<double>();
  config.rms_norm_eps = file.required(arch + ".attention.layer_norm_rms_epsilon", "number").get<double>();
  if (const json* scaling = file.value(arch + ".rope.scaling.type", "string"); scaling && scaling->get<std::string>() != "none") {
    if (scaling->get<std::string>() != "linear")
      throw std::invalid_argument(file.path + ": RoPE scaling '" + scaling->get<std::string>() + "' is not read here (linear and Llama 3's are)");
    config.rope_scaling.type = "linear";
    config.rope_scaling.factor = file.required(arch + ".rope.scaling.factor", "number").get<double>();
  }
  const GgufTensorInfo* embedding = file.find_tensor("token_embd.weight");
  if (!embedding || embedding->dims.size() != 2) throw std::invalid_argument(file.path + ": no 2-D tensor 'token_embd.weight'");
  config.vocab_size = static_cast<int64_t>(embedding->dims[1]);
  if (const json* vocab = file.value(arch + ".vocab_size", "integer"); vocab && vocab->get<int64_t>() != config.vocab_size)
    throw std::invalid_argument(file.path + ": " + arch + ".vocab_size " + std::to_string(vocab->get<int64_t>()) +
                                " differs from token_embd.weight's " + std::to_string(config.vocab_size) + " rows");
  config.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;
  config.attention_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
  config.mlp_bias = file.find_tensor("blk.0.ffn_up.bias") != nullptr;
  if (const GgufTensorInfo* factors = file.find_tensor("rope_freqs.weight")) {
    config.validate();
    config.rope_scaling = rope_scaling_from_factors(file, read_gguf_tensor(file, *factors), config);
  }
  config.validate();
  return config;
}

GgufImportReport import_gguf(const std::string& gguf_path, const std::string& out_dir, torch::ScalarType dtype) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16)
    throw std::invalid_argument("import-gguf: --dtype must be float32 or bfloat16");
  const GgufFile file = read_gguf(gguf_path);
  GgufImportReport report;
  report.architecture = file.required("general.architecture", "string").get<std::string>();
  LlamaConfig config = config_from_gguf(file);
  const GgufTokenizerFiles tokenizer = tokenizer_from_gguf(file);
  report.tokenizer_model = tokenizer.model;
  report.tokenizer_pre = tokenizer.pre;
  report.has_chat_template = tokenizer.tokenizer_config.contains("chat_template");
  if (const json* tokens = file.value("tokenizer.ggml.tokens", "array"); static_cast<int64_t>(tokens->size()) > config.vocab_size)
    throw std::invalid_argument(gguf_path + ": " + std::to_string(tokens->size()) + " tokens for " + std::to_string(config.vocab_size) +
                                " embedding rows");
  // config.json's BOS is what this toolkit puts before a prompt (serve, eval, training), so it is
  // written only when the file's tokenizer adds one; generation_config.json names it either way.
  if (tokenizer.bos_id && tokenizer.tokenizer_config.value("add_bos_token", false)) config.bos_token_ids = {*tokenizer.bos_id};
  // Generation stops at EOS and at the end-of-turn tokens llama.cpp also stops at.
  if (tokenizer.eos_id) config.eos_token_ids = {*tokenizer.eos_id};
  const auto& tokens = tokenizer.tokenizer.at("model").at("vocab");
  for (const char* end_of_turn : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"})
    if (tokens.contains(end_of_turn)) {
      const auto id = tokens[end_of_turn].get<int64_t>();
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) == config.eos_token_ids.end())
        config.eos_token_ids.push_back(id);
    }
  config.torch_dtype = dtype_name(dtype);
  report.config = config;

  // Every tensor of the file is a parameter of the model (or rope_freqs, read into the config).
  Llama model(nullptr);
  {
    UninitializedWeights uninitialized;  // every parameter comes from the file (checked below)
    model = Llama(config);
  }
  torch::NoGradGuard no_grad;
  model->to(dtype);
  std::map<std::string, std::string> parameter_of;  // GGUF name -> our parameter name
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& named : model->named_parameters()) {
    parameter_of[gguf_tensor_name(named.key())] = named.key();
    parameters[named.key()] = named.value();
  }
  std::set<std::string> loaded;
  report.projections_in_blocks = true;
  TensorMap file_blocks;  // the bytes of every tensor in a format the products run, by parameter name
  std::map<std::string, std::string> block_types;
  bool projections_kept = true;  // every projection in a block format the products run
  for (const GgufTensorInfo& info : file.tensors) {
    if (info.name == "rope_freqs.weight") continue;
    const auto found = parameter_of.find(info.name);
    if (found == parameter_of.end())
      throw std::invalid_argument(gguf_path + ": tensor '" + info.name + "' is not part of a " + report.architecture + " model read here");
    torch::Tensor value = read_gguf_tensor(file, info).to(torch::kFloat32);
    const std::string& name = found->second;
    const bool query = name.find("self_attn.q_proj") != std::string::npos, key = name.find("self_attn.k_proj") != std::string::npos;
    const bool blocks = value.dim() == 2 && weight_format_of_ggml_type(info.type).has_value();
    if (blocks) {
      file_blocks[name] = read_gguf_blocks(file, info);
      block_types[name] = ggml_type_name(info.type);
    }
    if (query || key) {  // rows of values or of blocks alike
      const int64_t layer = std::stoll(name.substr(7, name.find('.', 7) - 7));  // "layers.<l>.self_attn..."
      const int64_t heads = query ? config.heads(layer) : config.kv_heads(layer);
      value = value.dim() == 1 ? unpermute_rows_from_ggml(value.unsqueeze(1), heads).squeeze(1) : unpermute_rows_from_ggml(value, heads);
      if (blocks) file_blocks[name] = unpermute_rows_from_ggml(file_blocks[name], heads);
    }
    torch::Tensor& parameter = parameters.at(name);
    if (parameter.sizes() != value.sizes())
      throw std::invalid_argument(gguf_path + ": tensor '" + info.name + "' has shape " + c10::str(value.sizes()) + ", the config implies " +
                                  c10::str(parameter.sizes()));
    if (!torch::isfinite(value).all().item<bool>())
      throw std::invalid_argument(gguf_path + ": tensor '" + info.name + "' holds NaN or infinite values");
    parameter.copy_(value);
    loaded.insert(name);
    ++report.tensor_types[ggml_type_name(info.type)];
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && name.find("_proj.") != std::string::npos) {
      report.projection_types.insert(ggml_type_name(info.type));
      if (ggml_block_layout(info.type)->elements == 1) report.projections_in_blocks = false;
      if (!blocks) projections_kept = false;
    }
  }
  const bool requantizable = report.projection_types.size() == 1 &&
                             std::set<std::string>{"Q8_0", "Q4_0", "Q4_1"}.count(*report.projection_types.begin());
  report.keeps_file_blocks = projections_kept && !report.projection_types.empty() && !requantizable;
  for (const auto& [gguf_name, name] : parameter_of)
    if (!loaded.count(name) && !(name == "lm_head.weight" && config.tie_word_embeddings))
      throw std::invalid_argument(gguf_path + ": tensor '" + gguf_name + "' is missing");

  // The tokenizer files are written beside the folder, then copied in with it (one atomic swap).
  const std::string staging = out_dir + ".files.tmp";
  fs::remove_all(staging);
  fs::create_directories(staging);
  const json generation = {{"bos_token_id", tokenizer.bos_id ? json(*tokenizer.bos_id) : json(nullptr)},
                           {"eos_token_id", config.eos_token_ids.size() == 1 ? json(config.eos_token_ids[0]) : json(config.eos_token_ids)},
                           {"pad_token_id", tokenizer.pad_id ? json(*tokenizer.pad_id) : json(nullptr)}};
  const std::pair<std::string, json> files[] = {{"tokenizer.json", tokenizer.tokenizer},
                                                {"tokenizer_config.json", tokenizer.tokenizer_config},
                                                {"generation_config.json", generation}};
  SaveOptions options;
  for (const auto& [name, content] : files) {
    write_file_atomically(staging + "/" + name, content.dump(2) + "\n");
    options.extra_files.push_back(staging + "/" + name);
  }
  if (report.keeps_file_blocks) {
    block_types["format"] = "ggml blocks, rows as the GGUF file holds them (q_proj and k_proj in HF's row order)";
    write_safetensors(staging + "/" + kFileBlocksFile, file_blocks, block_types);
    options.extra_files.push_back(staging + "/" + kFileBlocksFile);
  }
  try {
    save_hf_folder(out_dir, model, options);
  } catch (...) {
    fs::remove_all(staging);
    throw;
  }
  fs::remove_all(staging);
  return report;
}

std::map<std::string, FileBlocks> read_file_blocks(const std::string& folder) {
  const std::string path = folder + "/" + kFileBlocksFile;
  if (!fs::exists(path))
    throw std::invalid_argument(path + ": not found (--weights gguf runs a folder import-gguf made from a file of mixed blocks)");
  const auto types = read_safetensors_metadata(path);
  std::map<std::string, FileBlocks> blocks;
  for (const auto& [name, rows] : read_safetensors(path)) {
    const auto found = types.find(name);
    const std::string type = found == types.end() ? "" : found->second;
    std::optional<WeightFormat> format;
    for (uint32_t id = 0; id < 64 && !format; ++id)
      if (ggml_type_name(id) == type) format = weight_format_of_ggml_type(id);
    if (!format || rows.scalar_type() != torch::kUInt8 || rows.dim() != 2)
      throw std::invalid_argument(path + ": tensor '" + name + "' is not uint8 rows of a block type the products run (type '" + type + "')");
    blocks[name] = {*format, rows};
  }
  return blocks;
}

}  // namespace coconut
