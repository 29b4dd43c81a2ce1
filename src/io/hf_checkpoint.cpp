#include "io/hf_checkpoint.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "io/hf_config.h"
#include "util/atomic_file.h"

#include <torch/version.h>

namespace coconut {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kModelPrefix = "model.";
}

std::string parameter_name_from_hf(const std::string& hf_name) {
  if (hf_name == "lm_head.weight") return hf_name;
  if (hf_name.rfind(kModelPrefix, 0) == 0) return hf_name.substr(kModelPrefix.size());
  return "";  // not a LlamaForCausalLM tensor
}

std::string hf_name_from_parameter(const std::string& parameter_name) {
  if (parameter_name == "lm_head.weight") return parameter_name;
  return kModelPrefix + parameter_name;
}

std::map<std::string, std::vector<int64_t>> expected_parameter_shapes(const LlamaConfig& c) {
  std::map<std::string, std::vector<int64_t>> shapes;
  const int64_t width = c.hidden_size, dh = c.head_dim;
  shapes["embed_tokens.weight"] = {c.vocab_size, width};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const int64_t q = c.heads(l) * dh, kv = c.kv_heads(l) * dh, f = c.ffn(l);
    shapes[p + "input_layernorm.weight"] = {width};
    shapes[p + "post_attention_layernorm.weight"] = {width};
    shapes[p + "self_attn.q_proj.weight"] = {q, width};
    shapes[p + "self_attn.k_proj.weight"] = {kv, width};
    shapes[p + "self_attn.v_proj.weight"] = {kv, width};
    shapes[p + "self_attn.o_proj.weight"] = {width, q};
    if (c.attention_bias) {
      shapes[p + "self_attn.q_proj.bias"] = {q};
      shapes[p + "self_attn.k_proj.bias"] = {kv};
      shapes[p + "self_attn.v_proj.bias"] = {kv};
      shapes[p + "self_attn.o_proj.bias"] = {width};
    }
    shapes[p + "mlp.gate_proj.weight"] = {f, width};
    shapes[p + "mlp.up_proj.weight"] = {f, width};
    shapes[p + "mlp.down_proj.weight"] = {width, f};
    if (c.mlp_bias) {
      shapes[p + "mlp.gate_proj.bias"] = {f};
      shapes[p + "mlp.up_proj.bias"] = {f};
      shapes[p + "mlp.down_proj.bias"] = {width};
    }
    if (c.depth_router) {
      shapes[p + "router.weight"] = {1, width};
      shapes[p + "router.bias"] = {1};
    }
  }
  shapes["norm.weight"] = {width};
  if (!c.tie_word_embeddings) shapes["lm_head.weight"] = {c.vocab_size, width};
  return shapes;
}

TensorMap load_state_dict(const std::string& directory, const LlamaConfig& config) {
  const fs::path folder(directory);
  const fs::path single = folder / "model.safetensors", index = folder / "model.safetensors.index.json";
  // HF name -> file it must come from.
  std::map<std::string, std::string> source_of;
  std::map<std::string, TensorMap> files;
  if (fs::exists(single)) {
    files[single.string()] = read_safetensors(single.string());
    for (const auto& [name, tensor] : files[single.string()]) source_of[name] = single.string();
  } else if (fs::exists(index)) {
    const json manifest = read_json_file(index.string());
    if (!manifest.contains("weight_map") || !manifest["weight_map"].is_object())
      throw std::runtime_error(index.string() + ": field 'weight_map' is missing or not an object");
    for (auto it = manifest["weight_map"].begin(); it != manifest["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw std::runtime_error(index.string() + ": weight_map['" + it.key() + "'] is not a file name");
      const std::string shard = (folder / it.value().get<std::string>()).string();
      if (!files.count(shard)) files[shard] = read_safetensors(shard);
      source_of[it.key()] = shard;
    }
  } else {
    throw std::runtime_error(directory + ": no model.safetensors or model.safetensors.index.json");
  }

  const auto expected = expected_parameter_shapes(config);
  TensorMap state;
  for (const auto& [hf_name, file] : source_of) {
    auto& tensors = files.at(file);
    auto found = tensors.find(hf_name);
    if (found == tensors.end()) throw std::runtime_error(file + ": tensor '" + hf_name + "' listed in the index is missing");
    const std::string name = parameter_name_from_hf(hf_name);
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;  // checked below
    auto shape = expected.find(name);
    if (name.empty() || shape == expected.end())
      throw std::runtime_error(file + ": unexpected tensor '" + hf_name + "' (not part of this config's model)");
    if (found->second.sizes().vec() != shape->second)
      throw std::runtime_error(file + ": tensor '" + hf_name + "' has shape " + c10::str(found->second.sizes()) +
                               ", config.json implies " + c10::str(c10::IntArrayRef(shape->second)));
    if (!found->second.is_floating_point())
      throw std::runtime_error(file + ": tensor '" + hf_name + "' has non-float dtype " +
                               std::string(c10::toString(found->second.scalar_type())));
    state[name] = found->second;
  }
  for (const auto& [name, shape] : expected)
    if (!state.count(name))
      throw std::runtime_error(directory + ": tensor '" + hf_name_from_parameter(name) + "' is missing from the checkpoint");
  if (config.tie_word_embeddings && source_of.count("lm_head.weight")) {
    const auto& head = files.at(source_of.at("lm_head.weight")).at("lm_head.weight");
    if (!head.sizes().equals(state.at("embed_tokens.weight").sizes()) || !torch::equal(head, state.at("embed_tokens.weight")))
      throw std::runtime_error(source_of.at("lm_head.weight") +
                               ": tensor 'lm_head.weight' differs from the embeddings but tie_word_embeddings is true");
  }
  return state;
}

Llama load_model(const std::string& directory, std::optional<torch::ScalarType> dtype, torch::Device device,
                 bool allow_nonfinite, const std::set<std::string>& left_empty) {
  const LlamaConfig config = load_config(directory);
  // Loading runs on one intra-op thread: it is bound by first touches of the mapped file and of the
  // new tensors, and page faults from two threads contend in the kernel (SmolLM2-135M to bf16 on a
  // 2-core Zen 5: `logits` of one token 1.10-1.33 s with 2 threads, 0.85-0.97 s loading on one;
  // system time 1.2-1.8 s against 0.5; 2026-11-27). The caller's count comes back afterwards.
  struct OneThread {
    const int threads = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(threads); }
  } one_thread;
  const TensorMap state = load_state_dict(directory, config);
  // One pass over the weights: a NaN or an infinity would otherwise surface as garbage output. A
  // sum in float64 is finite exactly when every value is (no float32 sum reaches 1e308), and reads
  // each value once without the boolean tensor isfinite makes.
  if (!allow_nonfinite)
    for (const auto& [name, tensor] : state)
      if (!left_empty.count(name) && tensor.is_floating_point() && !std::isfinite(tensor.sum(torch::kFloat64).item<double>()))
        throw std::invalid_argument(directory + ": tensor " + hf_name_from_parameter(name) +
                                    " holds NaN or infinite values (a broken checkpoint; --allow-nonfinite loads it anyway)");
  auto target = dtype.value_or(dtype_from_name(config.torch_dtype));
#if TORCH_VERSION_MAJOR < 2
  // libtorch 1.x has no float16 matrix products on CPU: a float16 checkpoint runs in float32 there.
  if (target == torch::kFloat16 && device.is_cpu()) {
    if (dtype) throw std::runtime_error(directory + ": float16 compute is not available on CPU with libtorch " TORCH_VERSION
                                        "; use float32 or bfloat16");
    target = torch::kFloat32;
  }
#endif
  Llama model(nullptr);
  {
    UninitializedWeights uninitialized;  // every parameter is copied from `state` below
    model = Llama(config);
  }
  torch::NoGradGuard no_grad;
  // Each parameter becomes its stored tensor in the model's dtype on `device`: one already so on the
  // CPU is taken as it is, a view of the mapped file (read_safetensors): pages are read when first
  // used and copied only if written. (The uninitialized weights are never converted or touched.)
  for (auto& named : model->named_parameters()) {
    const torch::Tensor& stored = state.at(named.key());
    if (left_empty.count(named.key()))
      named.value().set_data(torch::empty({0}, torch::TensorOptions().dtype(target).device(device)));
    else if (device.is_cpu() && stored.scalar_type() == target && stored.is_contiguous())
      named.value().set_data(stored);
    else
      named.value().set_data(stored.to(device, target).contiguous());
  }
  model->to(device, target);  // the buffers (the parameters already are)
  model->eval();
  return model;
}

namespace {

// config.json, the weights (sharded when asked) and the extra files, into `staging`.
void write_folder_contents(const fs::path& staging, Llama& model, const SaveOptions& options) {
  LlamaConfig config = model->config();
  TensorMap tensors;
  for (const auto& named : model->named_parameters()) {
    auto tensor = named.value().detach();
    if (options.dtype) tensor = tensor.to(*options.dtype);
    tensors[hf_name_from_parameter(named.key())] = tensor;
  }
  config.torch_dtype = dtype_name(tensors.begin()->second.scalar_type());
  write_file_atomically((staging / "config.json").string(), config_to_json(config).dump(2) + "\n");

  if (options.max_shard_bytes == 0) {
    write_safetensors((staging / "model.safetensors").string(), tensors);
  } else {
    std::vector<TensorMap> shards(1);
    uint64_t shard_bytes = 0, total_bytes = 0;
    for (const auto& [name, tensor] : tensors) {
      const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
      if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) shards.emplace_back(), shard_bytes = 0;
      shards.back()[name] = tensor;
      shard_bytes += bytes;
      total_bytes += bytes;
    }
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      write_safetensors((staging / file).string(), shards[i]);
      for (const auto& [name, tensor] : shards[i]) weight_map[name] = file;
    }
    const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomically((staging / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  for (const auto& file : options.extra_files) {
    std::error_code error;
    fs::copy_file(file, staging / fs::path(file).filename(), fs::copy_options::overwrite_existing, error);
    if (error) throw std::runtime_error(file + ": cannot copy into " + staging.string() + ": " + error.message());
  }
}

}  // namespace

void save_hf_folder(const std::string& directory, Llama& model, const SaveOptions& options) {
  write_folder_atomically(directory, [&](const std::string& staging) { write_folder_contents(staging, model, options); });
}

}  // namespace coconut
