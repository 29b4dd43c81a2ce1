// GGUF -> HF folder: a llama.cpp model file (llama architecture, or the "deci" of our own pruned
// exports) as config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
// generation_config.json, which every command reads. Tensors of any type dequantize_ggml converts
// are read to float32 and stored as float32 or bfloat16; the rotary row permutation llama.cpp's
// converter applies to attn_q / attn_k is undone; a file without output.weight has tied embeddings;
// rope_freqs (Llama 3's frequency scaling) becomes rope_scaling; config.json's EOS ids are the
// file's EOS and the end-of-turn tokens llama.cpp also stops at, its BOS only when the tokenizer
// adds one. Unknown architectures, tensors and tensor types are refused by name. Projections in a
// mix of block formats also keep their bytes as the file has them (kFileBlocksFile, below).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "io/gguf.h"
#include "model/config.h"
#include "model/quantize_model.h"

namespace coconut {

// The model's config from the file's metadata (and its tensors: output.weight, rope_freqs).
LlamaConfig config_from_gguf(const GgufFile& file);

struct GgufImportReport {
  LlamaConfig config;
  std::string architecture, tokenizer_model, tokenizer_pre;
  std::map<std::string, int64_t> tensor_types;  // ggml type name -> tensors of that type
  std::set<std::string> projection_types;  // the ggml types of the projections (q/k/v/o, gate/up/down), each once
  bool projections_in_blocks = false;      // every projection in a block format (Q8_0, Q4_K, ...: not F32/F16/BF16)
  bool has_chat_template = false;
  // The folder keeps the file's own blocks (kFileBlocksFile): every projection is in a block format
  // the CPU products run as it is (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) and they are not all one
  // of Q8_0 / Q4_0 / Q4_1, which quantizing the imported values gives back bit for bit.
  bool keeps_file_blocks = false;
};

// The file's blocks in an imported folder: safetensors of uint8 [rows, bytes a row] named as the
// model's parameters ("layers.0.mlp.down_proj.weight", "embed_tokens.weight"), each tensor's ggml
// type in the metadata under its name.
inline constexpr const char* kFileBlocksFile = "ggml_blocks.safetensors";
// Reads <folder>/ggml_blocks.safetensors; errors name the file and the tensor.
std::map<std::string, FileBlocks> read_file_blocks(const std::string& folder);

// Writes `out_dir` atomically (a complete folder or none); `dtype` float32 or bfloat16.
GgufImportReport import_gguf(const std::string& gguf_path, const std::string& out_dir, torch::ScalarType dtype);

}  // namespace coconut
