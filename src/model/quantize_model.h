// A model whose projections keep their weights quantized (model/quantized_linear.h), for inference
// on a CPU: q/k/v/o, gate/up/down (in the chosen format) and the output head (Q8_0). Norms, the embedding table (lookups stay
// dense, also when the head is tied to it), a depth router's gates and LoRA updates stay as they are.
#pragma once

#include "model/llama.h"
#include "model/quantized_linear.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace coconut {

// A new model: the projections quantized to `format` from `model`'s weights (their Linear weights
// left empty), the output head to Q8_0 whatever the format, every other tensor shared with `model`
// (not copied). kDense returns `model`. Throws
// std::invalid_argument for a model on another device than the CPU (no device kernels) or a
// projection whose input width is not a multiple of 32.
Llama with_quantized_weights(Llama model, WeightFormat format);

// A projection's blocks as a GGUF file held them: their format and the rows' bytes, uint8
// [out_features, in_features / block values * block bytes] in ggml's layout.
struct FileBlocks {
  WeightFormat format = WeightFormat::kQ8_0;
  torch::Tensor rows;
};

// The block format of a ggml type id (model/ggml_blocks.h) that these products run (Q8_0, Q4_0,
// Q4_1, Q5_0, Q4_K, Q5_K, Q6_K), or nullopt.
std::optional<WeightFormat> weight_format_of_ggml_type(uint32_t type);

// A new model whose projections run on a file's own blocks (WeightFormat::kGguf), each in its own
// format: `blocks` keyed by parameter name as the file's model names them ("layers.3.mlp.down_proj.weight",
// and for the output head "lm_head.weight", or "embed_tokens.weight" when tied); `source_layers[i]`
// is the file's index of the model's layer i (a model with layers removed; empty: the same). Q, K and V
// (gate and up) share one product when their blocks share a format. A projection without blocks stays
// dense; the head without blocks is Q8_0 as in with_quantized_weights. The embedding table with
// blocks is looked up from them (LlamaImpl::embedding_quantized; its dense weight held empty), the
// tied head then reading the same bytes. Every other tensor is shared. The model's projections and
// tables that the blocks replace may be held empty already (load_model's `left_empty`).
// Throws std::invalid_argument for a model off the CPU or blocks of the wrong shape, naming the tensor.
Llama with_file_blocks(Llama model, const std::map<std::string, FileBlocks>& blocks, const std::vector<int64_t>& source_layers = {});

// Bytes the model's weights take as they are held (quantized blocks included).
int64_t held_weight_bytes(Llama& model);
// The tensors holding them: parameters, buffers and blocks (the same storage may come more than once).
std::vector<torch::Tensor> held_weight_tensors(Llama& model);

}  // namespace coconut
