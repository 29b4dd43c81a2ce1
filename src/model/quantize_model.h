// A model whose projections keep their weights quantized (model/quantized_linear.h), for inference
// on a CPU: q/k/v/o, gate/up/down (in the chosen format) and the output head (Q8_0). Norms, the embedding table (lookups stay
// dense, also when the head is tied to it), a depth router's gates and LoRA updates stay as they are.
#pragma once

#include "model/llama.h"
#include "model/quantized_linear.h"

namespace coconut {

// A new model: the projections quantized to `format` from `model`'s weights (their Linear weights
// left empty), the output head to Q8_0 whatever the format, every other tensor shared with `model`
// (not copied). kDense returns `model`. Throws
// std::invalid_argument for a model on another device than the CPU (no device kernels) or a
// projection whose input width is not a multiple of 32.
Llama with_quantized_weights(Llama model, WeightFormat format);

// Bytes the model's weights take as they are held (quantized blocks included).
int64_t held_weight_bytes(Llama& model);

}  // namespace coconut
