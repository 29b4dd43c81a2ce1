// HF Llama folder -> GGUF that llama.cpp loads. Uniform models: arch "llama"; models with per-layer
// head / KV-head / MLP sizes (pruned): arch "deci", whose loader reads those as per-layer arrays.
// As llama.cpp's own converter does: Q and K rows are permuted from HF's rotate-half layout to
// ggml's interleaved RoPE, Llama-3 frequency scaling is stored as the `rope_freqs` tensor, 1-D
// tensors (norms) stay float32, and the tokenizer goes into `tokenizer.ggml.*`.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "model/config.h"

namespace coconut {

// Rows of a q_proj / k_proj weight [heads * Dh, D] from rotate-half to interleaved pairs:
// [heads, 2, Dh/2, D] -> swap the middle axes -> [heads * Dh, D].
torch::Tensor permute_rows_for_ggml(const torch::Tensor& weight, int64_t heads);
// The inverse (for reading our files back).
torch::Tensor unpermute_rows_from_ggml(const torch::Tensor& weight, int64_t heads);

// "layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight", "embed_tokens.weight" -> "token_embd.weight", ...
std::string gguf_tensor_name(const std::string& parameter_name);

// The llama3 RoPE scaling as llama.cpp's rope_freqs: per frequency, unscaled / scaled (Dh/2).
torch::Tensor rope_frequency_factors(const LlamaConfig& config);

struct GgufExportReport {
  std::string architecture;     // llama | deci
  std::string tokenizer_model;  // gpt2 (byte-level BPE) | llama (SentencePiece-style BPE) | none
  int64_t tensors = 0;
  uint64_t bytes = 0;
  // llama.cpp has no depth router: its gates are left out, so llama.cpp runs every layer.
  bool router_dropped = false;
};

// `dtype` of the matrices: float32, float16 or bfloat16.
GgufExportReport export_gguf(const std::string& model_dir, const std::string& out_path, torch::ScalarType dtype);

}  // namespace coconut
