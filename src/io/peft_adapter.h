// Hugging Face PEFT LoRA adapters: a folder with adapter_config.json and adapter_model.safetensors,
// readable by `PeftModel.from_pretrained` over the same base model, and the other way round.
//
// What is supported is what training here writes and what a plain PEFT LoRA over a Llama holds:
// LoRA on any of the seven projections (q k v o gate up down), one rank and alpha for all of them
// (or rsLoRA's alpha / sqrt(r)), and `trainable_token_indices` on the input embedding: PEFT's
// TrainableTokens, whose saved "trainable_tokens_delta" [n, D] holds the new rows themselves (not
// differences), tied to the output head when the model ties them. Anything else (DoRA, per-module
// ranks, biases, modules_to_save, fan_in_fan_out) is refused by name rather than half-applied.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/llama.h"

namespace coconut {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

struct PeftAdapter {
  int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;                          // scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> targets;             // projection names, in layer order
  // Our names: "layers.3.self_attn.q_proj.lora_A" [r, K] and ".lora_B" [N, r], float32.
  std::map<std::string, torch::Tensor> lora;
  std::vector<int64_t> token_indices;           // embedding rows the adapter replaces
  torch::Tensor token_rows;                     // [n, D] their values (undefined when none)
  std::string base_model;                       // base_model_name_or_path, for people

  double scale() const;
};

// Throws std::invalid_argument naming the folder's file and the problem.
PeftAdapter read_peft_adapter(const std::string& directory);

// Writes the folder atomically (a previous one is replaced only once the new one is complete),
// with PEFT's tensor names and config keys; `extra_files` are copied in beside them and
// `extra_texts` (file name -> contents) written there.
void write_peft_adapter(const std::string& directory, const PeftAdapter& adapter,
                        const std::vector<std::string>& extra_files = {},
                        const std::map<std::string, std::string>& extra_texts = {});

// What an adapter's training copy lacked of its base, named in the adapter's coconut.json so that
// its base is the unpruned model, pruned the same way before it merges: whole layers
// ("dropped_layers", indices of the base) and MLP channels ("dropped_mlp_channels": {"layer":
// [channels]}, indices of the base's layers and channels; removed before the layers go).
struct BasePruning {
  std::vector<int64_t> layers;
  std::map<int64_t, std::set<int64_t>> mlp_channels;  // layer -> its channels removed (pruning/surgery.h's ChannelSelection)
  bool empty() const { return layers.empty() && mlp_channels.empty(); }
};
// Empty when the folder names none; throws naming the file when a key is malformed.
BasePruning adapter_base_pruning(const std::string& adapter_dir);
// The same keys in a JSON object (`coconut prune`'s pruning.json has them too); `source` names it in errors.
BasePruning base_pruning_from_json(const nlohmann::json& settings, const std::string& source);
std::vector<int64_t> adapter_dropped_layers(const std::string& adapter_dir);  // adapter_base_pruning(...).layers
// The keys above for an adapter's coconut.json (only those that are not empty).
void write_base_pruning(nlohmann::json& settings, const BasePruning& pruning);

// A new model: W + scale * B A on every adapted projection, the token rows replaced (in the tied
// head too, since it is the same table). `base` is untouched. Shapes are checked against it;
// `source` names the adapter in errors.
Llama apply_peft_adapter(const Llama& base, const PeftAdapter& adapter, const std::string& source);

// A base model folder with an adapter merged in (W + s B A computed in float32, then cast to
// `dtype`, default the base's); an empty `adapter_dir` is plain load_model. `prepare_base` (the
// float32 base -> the model the adapter was trained on) removes what adapter_base_pruning names
// (recipes' load_model_variant gives it); without one such an adapter is refused by name.
Llama load_model_with_adapter(const std::string& model_dir, const std::string& adapter_dir,
                              std::optional<torch::ScalarType> dtype = std::nullopt, torch::Device device = torch::kCPU,
                              bool allow_nonfinite = false,
                              const std::function<Llama(const Llama&, const BasePruning&)>& prepare_base = {});

// Where to read a model's side file (tokenizer.json, tokenizer_config.json, coconut.json) from:
// the adapter folder when it has one (an adapter ships the tokenizer and settings it was trained
// with), else the base model's folder.
std::string folder_with(const std::string& model_dir, const std::string& adapter_dir, const std::string& file);

// The adapter of a model trained with attach_lora (model/lora.h), with `token_indices`' rows of
// its embedding table.
PeftAdapter peft_adapter_from_lora(const Llama& model, double alpha, const std::vector<int64_t>& token_indices,
                                   const std::string& base_model);

// A rank-r adapter approximating `tuned` - `base` (two models of one config, e.g. a full
// fine-tune and its start) by the truncated SVD of each projection's difference, with
// alpha = rank (scale 1); rows of the embedding that changed by more than `row_tolerance`
// (relative) become token rows. Also returns, per projection, the fraction of the difference's
// Frobenius norm the rank keeps, for the caller to report.
struct ExtractedAdapter {
  PeftAdapter adapter;
  double kept_energy_min = 1, kept_energy_mean = 1;  // over projections, of ||delta_r||^2 / ||delta||^2
  int64_t changed_other_parameters = 0;              // norms or untargeted tensors that changed (not carried)
};
ExtractedAdapter extract_peft_adapter(const Llama& tuned, const Llama& base, int64_t rank,
                                      const std::vector<std::string>& targets, double row_tolerance,
                                      const std::string& base_model);

}  // namespace coconut
