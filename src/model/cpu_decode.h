// The layers of a decode step on the CPU (float32 or bfloat16 activations), as one function over memory.
//
// The general forward (model/llama.cpp) spends about a hundred libtorch operator calls a layer on
// a decoded token (views, empties, no-op casts, the cache's slices): about 3,000 a token of
// SmolLM2-135M, milliseconds of one thread in which the other waits and no weight streams. Here a
// layer calls the same kernels on buffers allocated once per call (float32 weights on the
// hand-written kernels, or quantized blocks, model/quantized_linear.h): RMSNorm, the q|k|v products,
// RoPE written straight into the cache's new column, the two attention products around libtorch's
// softmax (its one operator call a layer), the output product, RMSNorm, the gate|up products,
// SwiGLU and the down product. Each step computes what the general path computes, in the same order and
// on the same kernels, so the outputs are the same bits (tested): a row decodes the same whichever
// path runs it, and batch invariance is kept.
#pragma once

#include <torch/torch.h>

#include "model/kv_cache.h"
#include "model/llama.h"

namespace coconut {

// Whether cpu_decode_layers takes this forward: x [B, 1, D] float32 or bfloat16 on the CPU, B <= 16,
// every layer (no depth option, head or channel mask, observer, residuals), no gradient recorded,
// `cache` preallocated (not fixed) with room for the column, or per row (a server's slots: rows of
// their own lengths, rows sitting the call out, hidden prefixes), no layer with an adapter, no
// bias in a bf16 model, every dense weight in x's dtype with its product on this host's
// hand-written kernel (uses_dense_rows), quantized blocks on the CPU and the attention kernels
// present (has_decode_attention_kernels). Each group of projections runs as the general path runs
// it: q|k|v (gate|up) as one product where packed (pack_for_inference) or fused in blocks, else
// one product each.
bool uses_cpu_decode_layers(LlamaImpl& model, const torch::Tensor& x, const KVCache* cache, const ForwardOptions& options);

// x [B, 1, D] -> the residual stream after the last layer [B, 1, D] (before the final norm). Call
// after the forward's cache.append_key_mask; each layer's K/V go to each row's new column
// (KVCache::write_column) and the caller advances the cache. cos/sin [B, 1, 1, Dh], contiguous, in
// x's dtype. `bias_mask`: the forward's additive mask [B, 1, 1, S] (padding, rows of other lengths,
// hidden columns) or undefined where every column is seen.
torch::Tensor cpu_decode_layers(LlamaImpl& model, const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                KVCache& cache, const torch::Tensor& bias_mask = {});

// On by default; off sends every forward to the general path (tests, A/B benchmarks).
void set_cpu_decode_layers(bool enabled);
bool cpu_decode_layers_enabled();

}  // namespace coconut
