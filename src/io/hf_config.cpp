#include "io/hf_config.h"
#include "util/json_text.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace coconut {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& problem) {
  throw std::runtime_error(source + ": field '" + field + "': " + problem);
}

template <typename T>
T get_or(const json& object, const std::string& key, T fallback, const std::string& source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(source, key, "has the wrong type (" + std::string(it->type_name()) + "): " + it->dump());
  }
}

int64_t get_int(const json& object, const std::string& key, int64_t fallback, const std::string& source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail(source, key, "must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

std::vector<int64_t> get_ids(const json& object, const std::string& key, const std::string& source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  if (it->is_number_integer()) return {it->get<int64_t>()};
  if (it->is_array()) {
    std::vector<int64_t> ids;
    for (const auto& value : *it) {
      if (!value.is_number_integer()) fail(source, key, "must hold integers, got " + it->dump());
      ids.push_back(value.get<int64_t>());
    }
    return ids;
  }
  fail(source, key, "must be an integer or a list of integers, got " + it->dump());
}

std::vector<int64_t> get_array(const json& object, const std::string& key, const std::string& source) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_array()) fail(source, key, "must be a list of integers, got " + it->dump());
  return get_ids(object, key, source);
}

json ids_to_json(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

LlamaConfig config_from_json(const json& j, const std::string& source) {
  if (!j.is_object()) throw std::runtime_error(source + ": config must be a JSON object");
  const auto model_type = get_or<std::string>(j, "model_type", "llama", source);
  if (model_type != "llama") fail(source, "model_type", "unsupported model type '" + model_type + "' (only 'llama')");
  const auto activation = get_or<std::string>(j, "hidden_act", "silu", source);
  if (activation != "silu") fail(source, "hidden_act", "unsupported activation '" + activation + "' (only 'silu')");

  LlamaConfig c;
  const auto required = [&](const char* key) {
    if (!j.contains(key) || j.at(key).is_null()) fail(source, key, "is missing");
    return get_int(j, key, 0, source);
  };
  c.hidden_size = required("hidden_size");
  c.intermediate_size = required("intermediate_size");
  c.num_hidden_layers = required("num_hidden_layers");
  c.num_attention_heads = required("num_attention_heads");
  c.vocab_size = required("vocab_size");
  c.num_key_value_heads = get_int(j, "num_key_value_heads", c.num_attention_heads, source);
  c.head_dim = get_int(j, "head_dim", 0, source);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", 2048, source);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
  // transformers >= 5 writes the RoPE settings as one object, "rope_parameters" (rope_theta, and
  // the scaling keys of "rope_scaling" with rope_type "default" when unscaled), instead of
  // "rope_theta" and "rope_scaling"; either form is read.
  const bool has_rope_parameters = j.contains("rope_parameters") && j.at("rope_parameters").is_object();
  c.rope_theta = get_or<double>(j, "rope_theta",
                                has_rope_parameters ? get_or<double>(j.at("rope_parameters"), "rope_theta", 10000.0, source)
                                                    : 10000.0,
                                source);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
  c.attention_bias = get_or<bool>(j, "attention_bias", false, source);
  c.mlp_bias = get_or<bool>(j, "mlp_bias", false, source);
  c.depth_router = get_or<bool>(j, "depth_router", false, source);
  c.depth_router_first_layer = get_int(j, "depth_router_first_layer", 0, source);
  c.latent_thought_rms = get_or<double>(j, "latent_thought_rms", 0.0, source);
  c.latent_thought_input = get_or<std::string>(j, "latent_thought_input", "last_hidden", source);  // validate() checks it
  c.bos_token_ids = get_ids(j, "bos_token_id", source);
  c.eos_token_ids = get_ids(j, "eos_token_id", source);
  // transformers >= 5 names it "dtype".
  c.torch_dtype = get_or<std::string>(j, "torch_dtype", get_or<std::string>(j, "dtype", "float32", source), source);
  if (c.torch_dtype != "float32" && c.torch_dtype != "float16" && c.torch_dtype != "bfloat16")
    fail(source, "torch_dtype", "unsupported dtype '" + c.torch_dtype + "'");

  const bool has_rope_scaling = j.contains("rope_scaling") && !j.at("rope_scaling").is_null();
  if (has_rope_scaling || has_rope_parameters) {
    const json& s = j.at(has_rope_scaling ? "rope_scaling" : "rope_parameters");
    if (!s.is_object()) fail(source, "rope_scaling", "must be an object or null, got " + s.dump());
    std::string type = get_or<std::string>(s, "rope_type", get_or<std::string>(s, "type", "", source), source);
    if (type == "default") type = "none";
    if (type != "none" && type != "linear" && type != "llama3")
      fail(source, "rope_scaling.rope_type", "unsupported rope scaling '" + type + "' (supported: linear, llama3)");
    c.rope_scaling.type = type;
    c.rope_scaling.factor = get_or<double>(s, "factor", 1.0, source);
    c.rope_scaling.low_freq_factor = get_or<double>(s, "low_freq_factor", 1.0, source);
    c.rope_scaling.high_freq_factor = get_or<double>(s, "high_freq_factor", 4.0, source);
    c.rope_scaling.original_max_position_embeddings = get_int(s, "original_max_position_embeddings", 8192, source);
  }
  c.layer_num_attention_heads = get_array(j, "layer_num_attention_heads", source);
  c.layer_num_key_value_heads = get_array(j, "layer_num_key_value_heads", source);
  c.layer_intermediate_size = get_array(j, "layer_intermediate_size", source);
  try {
    c.validate();
  } catch (const std::invalid_argument& error) {
    throw std::runtime_error(source + ": " + error.what());
  }
  return c;
}

json config_to_json(const LlamaConfig& c) {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == "none") {
    j["rope_scaling"] = nullptr;
  } else {
    json s = {{"rope_type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.type == "llama3") {
      s["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      s["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      s["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = s;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = c.mlp_bias;
  j["bos_token_id"] = ids_to_json(c.bos_token_ids);
  j["eos_token_id"] = ids_to_json(c.eos_token_ids);
  j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  if (c.depth_router) j["depth_router"] = true;
  if (c.depth_router && c.depth_router_first_layer > 0) j["depth_router_first_layer"] = c.depth_router_first_layer;
  if (c.latent_thought_rms > 0) j["latent_thought_rms"] = c.latent_thought_rms;
  if (c.thought_is_expected_embedding()) j["latent_thought_input"] = c.latent_thought_input;
  if (!c.is_uniform()) {
    const auto per_layer = [&](auto accessor) {
      std::vector<int64_t> values;
      for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) values.push_back(accessor(layer));
      return values;
    };
    j["layer_num_attention_heads"] = per_layer([&](int64_t l) { return c.heads(l); });
    j["layer_num_key_value_heads"] = per_layer([&](int64_t l) { return c.kv_heads(l); });
    j["layer_intermediate_size"] = per_layer([&](int64_t l) { return c.ffn(l); });
  }
  return j;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_json_text(buffer.str(), path);
}

LlamaConfig load_config(const std::string& path) {
  if (!fs::exists(path)) throw std::runtime_error(path + ": no such model folder or config file");
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  return config_from_json(read_json_file(file), file);
}

}  // namespace coconut
