#include "model/cpu_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/cpu_attention.h"
#include "model/cpu_linear.h"
#include "model/cpu_norm.h"
#include "model/cpu_rope.h"
#include "model/cpu_swiglu.h"
#include "model/quantized_linear.h"

namespace coconut {

namespace {

std::atomic<bool> decode_layers_on{true};

bool on_cpu_as(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous();
}

// A bias the step can add: absent; with float32 activations, [size] float32 on the CPU. (The
// general path adds a bf16 model's biases in two orders, before and after rounding the product:
// such models are left to it.)
bool usable_bias(const torch::Tensor& bias, int64_t size, torch::ScalarType activations) {
  return !bias.defined() || (activations == torch::kFloat32 && on_cpu_as(bias, torch::kFloat32) && bias.numel() == size);
}

// uses_dense_rows for each weight shape once per call (pruned models have several).
class KernelChoices {
 public:
  KernelChoices(int64_t rows, torch::ScalarType activations) : rows_(rows), activations_(activations) {}
  bool take(const torch::Tensor& weight) {
    if (!on_cpu_as(weight, activations_) || weight.dim() != 2) return false;
    for (const auto& seen : seen_)
      if (seen.k == weight.size(1) && seen.n == weight.size(0)) return seen.tiles;
    seen_.push_back({weight.size(1), weight.size(0), uses_dense_rows(rows_, weight, activations_)});
    return seen_.back().tiles;
  }

 private:
  struct Seen {
    int64_t k, n;
    bool tiles;
  };
  int64_t rows_;
  torch::ScalarType activations_;
  std::vector<Seen> seen_;
};

// One product as the general path runs it: a weight of the activations' dtype on the hand-written
// kernels, or quantized blocks.
struct Product {
  torch::Tensor dense;                         // [N, K], or
  const QuantizedWeight* quantized = nullptr;  // its blocks
  bool usable(KernelChoices& kernels) const {
    return quantized != nullptr ? quantized->packed.device().is_cpu() : kernels.take(dense);
  }
  // x [rows, K] -> out [rows, N], rows `out_stride` values apart. A dense product of bf16 rows sums
  // in float32 into `sums` (laid out as out) and rounds them, as `dense` does.
  void run(const float* x, int64_t rows, float* out, int64_t out_stride, float* /*sums*/) const {
    if (quantized != nullptr) return quantized_dense_rows(x, rows, *quantized, out, out_stride);
    dense_rows(x, rows, dense, out, out_stride);
  }
  void run(const c10::BFloat16* x, int64_t rows, c10::BFloat16* out, int64_t out_stride, float* sums) const {
    if (quantized != nullptr) return quantized_dense_rows(x, rows, *quantized, out, out_stride);
    dense_rows(x, rows, dense, sums, out_stride);
    const int64_t n_size = dense.size(0);
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < n_size; ++i) out[row * out_stride + i] = static_cast<c10::BFloat16>(sums[row * out_stride + i]);
  }
};

Product product_of(const torch::nn::Linear& linear, const QuantizedWeight& quantized) {
  return quantized.defined() ? Product{torch::Tensor(), &quantized} : Product{linear->weight, nullptr};
}

// The products of q|k|v as AttentionImpl::forward runs them (no adapters): one (fused blocks, or
// packed weights) or one each.
int qkv_products(DecoderLayerImpl& layer, Product* products) {
  const auto& attention = *layer.self_attn;
  if (attention.qkv_quantized.defined()) {
    products[0] = {torch::Tensor(), &attention.qkv_quantized};
    return 1;
  }
  if (!attention.q_quantized.defined()) {
    products[0] = {packed_qkv_weight(layer), nullptr};
    if (products[0].dense.defined()) return 1;
  }
  products[0] = product_of(attention.q_proj, attention.q_quantized);
  products[1] = product_of(attention.k_proj, attention.k_quantized);
  products[2] = product_of(attention.v_proj, attention.v_quantized);
  return 3;
}

// The products of gate|up as MLPImpl::forward runs them for `rows` positions (no adapters): one
// (fused blocks; packed weights for one position) or one each.
int gate_up_products(DecoderLayerImpl& layer, int64_t rows, Product* products) {
  const auto& mlp = *layer.mlp;
  if (mlp.gate_up_quantized.defined()) {
    products[0] = {torch::Tensor(), &mlp.gate_up_quantized};
    return 1;
  }
  if (!mlp.gate_quantized.defined() && rows == 1) {
    products[0] = {packed_gate_up_weight(layer), nullptr};
    if (products[0].dense.defined()) return 1;
  }
  products[0] = product_of(mlp.gate_proj, mlp.gate_quantized);
  products[1] = product_of(mlp.up_proj, mlp.up_quantized);
  return 2;
}

// out[i] += bias[i] for each of `rows` rows of `width` values `stride` apart (float32 activations).
void add_bias(float* out, int64_t rows, int64_t stride, const torch::Tensor& bias, int64_t width) {
  if (!bias.defined()) return;
  const float* b = bias.const_data_ptr<float>();
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < width; ++i) out[row * stride + i] += b[i];
}
void add_bias(c10::BFloat16*, int64_t, int64_t, const torch::Tensor&, int64_t) {}  // none (usable_bias)

// x = x + y in the activations' dtype (a bf16 sum rounded, as libtorch's add).
void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] + y[i];
}
void add_into(c10::BFloat16* x, const c10::BFloat16* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<c10::BFloat16>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

// values [count] in float32 <-> the activations' dtype (widening exact, narrowing rounded as libtorch's cast).
void to_float(const float* from, int64_t count, float* to) { std::memcpy(to, from, static_cast<size_t>(count) * sizeof(float)); }
void to_float(const c10::BFloat16* from, int64_t count, float* to) {
  for (int64_t i = 0; i < count; ++i) to[i] = static_cast<float>(from[i]);
}
void from_float(const float* from, int64_t count, float* to) { std::memcpy(to, from, static_cast<size_t>(count) * sizeof(float)); }
void from_float(const float* from, int64_t count, c10::BFloat16* to) {
  for (int64_t i = 0; i < count; ++i) to[i] = static_cast<c10::BFloat16>(from[i]);
}

// activation = silu(gate) * up over `count` values: float32 on the SwiGLU kernel, bf16 as the general
// path's libtorch silu and product (two operator calls).
void swiglu_values(float* gate, float* up, int64_t count, float* activation) { cpu_swiglu_values(gate, up, count, activation); }
void swiglu_values(c10::BFloat16* gate, c10::BFloat16* up, int64_t count, c10::BFloat16* activation) {
  const auto wrap = [count](c10::BFloat16* data) { return torch::from_blob(data, {count}, torch::kBFloat16); };
  auto out = wrap(activation);
  at::silu_out(out, wrap(gate));
  at::mul_out(out, out, wrap(up));
}

// SwiGLU of gate|up fused in blocks for several rows: the general path splits the product's
// [B, 2F] output into strided halves, which libtorch's silu and product take (not the float32
// kernel, which needs contiguous halves); the same two calls on the same strided views here.
template <typename T>
void strided_swiglu_rows(T* gate_up, int64_t rows, int64_t inner, T* activation) {
  const auto dtype = std::is_same_v<T, float> ? torch::kFloat32 : torch::kBFloat16;
  const auto gates = torch::from_blob(gate_up, {rows, inner}, {2 * inner, 1}, dtype);          // [B, F], row stride 2F
  const auto ups = torch::from_blob(gate_up + inner, {rows, inner}, {2 * inner, 1}, dtype);    // [B, F], row stride 2F
  auto out = torch::from_blob(activation, {rows, inner}, dtype);                               // [B, F]
  at::silu_out(out, gates);
  at::mul_out(out, out, ups);
}

template <typename T>
void decode_layers(LlamaImpl& model, T* state, int64_t rows, const torch::Tensor& cos, const torch::Tensor& sin, KVCache& cache,
                   const float* additive_mask) {
  const auto& config = model.config();
  const int64_t width = config.hidden_size, head_dim = config.head_dim;
  // Each row's new column (-1: a per-row cache's row sitting the call out writes nothing) and the
  // columns every query sees: the new ones and every one before them, as append returns them.
  std::vector<int64_t> write_columns(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) write_columns[static_cast<size_t>(b)] = cache.write_column(b);
  const int64_t keys_seen = cache.visible_columns(1), first_row = cache.storage_row(0);
  // Buffers for the widest layer, [B, ...] each.
  int64_t widest_qkv = 0, widest_heads = 0, widest_inner = 0;
  for (int64_t index = 0; index < config.num_hidden_layers; ++index) {
    widest_heads = std::max(widest_heads, config.heads(index));
    widest_qkv = std::max(widest_qkv, (config.heads(index) + 2 * config.kv_heads(index)) * head_dim);
    widest_inner = std::max(widest_inner, config.ffn(index));
  }
  const int64_t widest_product = std::max({widest_qkv, 2 * widest_inner, width});
  std::vector<T> buffer(static_cast<size_t>(rows * (2 * width + widest_qkv + widest_heads * head_dim + 5 * widest_inner)));
  T* normed = buffer.data();                                  // [B, D]
  T* projected = normed + rows * width;                       // [B, D]: o_proj's or down_proj's output
  T* qkv = projected + rows * width;                          // [B, Nq + 2 Nkv]
  T* context = qkv + rows * widest_qkv;                       // [B, H, Dh]
  T* gate_up = context + rows * widest_heads * head_dim;      // [B, 2F]
  T* gates = gate_up + rows * 2 * widest_inner;               // [B, F] and
  T* ups = gates + rows * widest_inner;                       // [B, F]: gate|up as two products
  T* activation = ups + rows * widest_inner;                  // [B, F]
  std::vector<float> float_buffer(static_cast<size_t>(rows * (widest_heads * head_dim + widest_product)));
  float* queries = float_buffer.data();                       // [B, H, Dh], rotated, in float32
  float* sums = queries + rows * widest_heads * head_dim;     // a bf16 dense product's float32 sums
  float* context_sums = sums;                                 // [B, H, Dh]: attention's output before its cast
  std::vector<T> rotated(static_cast<size_t>(head_dim));     // [Dh]: one head's rotation, before it is widened
  const T* cos_data = cos.const_data_ptr<T>();                // [B, Dh]
  const T* sin_data = sin.const_data_ptr<T>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  torch::Tensor scores, probabilities;  // [B * G * R, S], for the layers of the last shape seen
  for (int64_t index = 0; index < config.num_hidden_layers; ++index) {
    auto& layer = *model.layers[index]->as<DecoderLayer>();
    const auto& attention = *layer.self_attn;
    const auto& mlp = *layer.mlp;
    const int64_t heads = attention.heads, groups = attention.kv_heads, per_group = heads / groups;
    const int64_t q_size = heads * head_dim, kv_size = groups * head_dim, qkv_size = q_size + 2 * kv_size;
    const int64_t inner = config.ffn(index);
    Product products[3];

    // Attention: normed = RMSNorm(x); q|k|v = normed W^T (+ biases), [B, Nq + 2 Nkv].
    cpu_rms_norm_rows(state, rows, layer.input_layernorm->weight.const_data_ptr<T>(), width, layer.input_layernorm->eps, normed);
    const int qkv_count = qkv_products(layer, products);
    products[0].run(normed, rows, qkv, qkv_size, sums);
    if (qkv_count == 3) {
      products[1].run(normed, rows, qkv + q_size, qkv_size, sums + q_size);
      products[2].run(normed, rows, qkv + q_size + kv_size, qkv_size, sums + q_size + kv_size);
    }
    add_bias(qkv, rows, qkv_size, attention.q_proj->bias, q_size);
    add_bias(qkv + q_size, rows, qkv_size, attention.k_proj->bias, kv_size);
    add_bias(qkv + q_size + kv_size, rows, qkv_size, attention.v_proj->bias, kv_size);
    // Rotated queries [B, H, Dh]; rotated keys and the values into the cache's column [B, G,
    // capacity, Dh]; attention in float32 (a bf16 model's rotations rounded first, then widened).
    const auto& key_storage = cache.key_storage(index);
    const auto& value_storage = cache.value_storage(index);
    const int64_t capacity = key_storage.size(2);
    float* keys = key_storage.data_ptr<float>() + first_row * groups * capacity * head_dim;  // [B, G, capacity, Dh]
    float* values = value_storage.data_ptr<float>() + first_row * groups * capacity * head_dim;
    for (int64_t b = 0; b < rows; ++b) {
      const T* row = qkv + b * qkv_size;
      const T *c = cos_data + b * head_dim, *s = sin_data + b * head_dim;
      for (int64_t h = 0; h < heads; ++h) {
        cpu_rope_rows(row + h * head_dim, 1, c, s, head_dim, rotated.data());
        to_float(rotated.data(), head_dim, queries + (b * heads + h) * head_dim);
      }
      const int64_t column = write_columns[static_cast<size_t>(b)];
      if (column < 0) continue;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = ((b * groups + g) * capacity + column) * head_dim;
        cpu_rope_rows(row + q_size + g * head_dim, 1, c, s, head_dim, rotated.data());
        to_float(rotated.data(), head_dim, keys + at);
        to_float(row + q_size + kv_size + g * head_dim, head_dim, values + at);
      }
    }
    // Scores [B, G, R, S] of the R query heads sharing each KV head, softmax, context [B, G, R, Dh] = [B, H * Dh].
    if (!scores.defined() || scores.size(0) != rows * heads) {
      scores = torch::empty({rows * heads, keys_seen}, torch::kFloat32);
      probabilities = torch::empty_like(scores);
    }
    const AttentionOperand grouped_queries{queries, q_size, per_group * head_dim, head_dim};
    const AttentionOperand cached_keys{keys, groups * capacity * head_dim, capacity * head_dim, head_dim};
    const AttentionOperand cached_values{values, groups * capacity * head_dim, capacity * head_dim, head_dim};
    attention_scores_into(grouped_queries, cached_keys, rows, groups, per_group, keys_seen, head_dim, scale,
                          scores.data_ptr<float>());
    if (additive_mask != nullptr) {  // + mask [B, S] over each row's G * R query heads, as the general path adds it
      float* score = scores.data_ptr<float>();
      for (int64_t b = 0; b < rows; ++b)
        for (int64_t head = 0; head < heads; ++head, score += keys_seen)
          for (int64_t key = 0; key < keys_seen; ++key) score[key] = score[key] + additive_mask[b * keys_seen + key];
    }
    at::_softmax_out(probabilities, scores, -1, false);
    attention_context_into(probabilities.const_data_ptr<float>(), cached_values, rows, groups, per_group, keys_seen, head_dim,
                           context_sums);
    from_float(context_sums, rows * q_size, context);
    // x += context W_o^T (+ bias)
    product_of(attention.o_proj, attention.o_quantized).run(context, rows, projected, width, sums);
    add_bias(projected, rows, width, attention.o_proj->bias, width);
    add_into(state, projected, rows * width);

    // MLP: x += down(silu(gate) * up) of RMSNorm(x).
    cpu_rms_norm_rows(state, rows, layer.post_attention_layernorm->weight.const_data_ptr<T>(), width,
                      layer.post_attention_layernorm->eps, normed);
    if (gate_up_products(layer, rows, products) == 1) {  // [gate | up] per row: one product
      products[0].run(normed, rows, gate_up, 2 * inner, sums);
      add_bias(gate_up, rows, 2 * inner, mlp.gate_proj->bias, inner);
      add_bias(gate_up + inner, rows, 2 * inner, mlp.up_proj->bias, inner);
      if (rows == 1)  // contiguous halves, as the general path sees them for one row
        swiglu_values(gate_up, gate_up + inner, inner, activation);
      else
        strided_swiglu_rows(gate_up, rows, inner, activation);
    } else {  // gate [B, F] and up [B, F], one pass over B * F values
      products[0].run(normed, rows, gates, inner, sums);
      products[1].run(normed, rows, ups, inner, sums);
      add_bias(gates, rows, inner, mlp.gate_proj->bias, inner);
      add_bias(ups, rows, inner, mlp.up_proj->bias, inner);
      swiglu_values(gates, ups, rows * inner, activation);
    }
    product_of(mlp.down_proj, mlp.down_quantized).run(activation, rows, projected, width, sums);
    add_bias(projected, rows, width, mlp.down_proj->bias, width);
    add_into(state, projected, rows * width);
  }
}

}  // namespace

void set_cpu_decode_layers(bool enabled) { decode_layers_on = enabled; }
bool cpu_decode_layers_enabled() { return decode_layers_on; }

bool uses_cpu_decode_layers(LlamaImpl& model, const torch::Tensor& x, const KVCache* cache, const ForwardOptions& options) {
  if (!decode_layers_on || cache == nullptr || !cache->is_preallocated() || cache->has_fixed_shapes() ||
      (!cache->is_per_row() && cache->length() + 1 > cache->capacity()))
    return false;
  const auto activations = x.scalar_type();
  if (torch::GradMode::is_enabled() || !x.device().is_cpu() ||
      (activations != torch::kFloat32 && activations != torch::kBFloat16) || x.dim() != 3 || x.size(1) != 1 || x.size(0) < 1 ||
      x.size(0) > kDecodeKernelRowBlock || !has_decode_attention_kernels())
    return false;
  const auto& config = model.config();
  if (options.head_mask.defined() || options.mlp_channel_mask.defined() || options.on_mlp_activation ||
      !options.skip_layers.empty() || options.return_residuals || options.layer_keep.defined() || options.route_mask.defined() ||
      options.router_thresholds.defined() || options.router_max_layers.defined() || options.router_straight_through ||
      options.depth.exit_threshold > 0 || (config.depth_router && options.depth.router_threshold > 0) ||
      options.first_layer != 0 || (options.end_layer >= 0 && options.end_layer != config.num_hidden_layers))
    return false;
  const int64_t rows = x.size(0), width = config.hidden_size, head_dim = config.head_dim;
  if (head_dim % 2 != 0) return false;
  KernelChoices kernels(rows, activations);
  for (int64_t index = 0; index < config.num_hidden_layers; ++index) {
    auto& layer = *model.layers[index]->as<DecoderLayer>();
    const auto& attention = *layer.self_attn;
    const auto& mlp = *layer.mlp;
    for (const auto* adapter : {&attention.q_lora, &attention.k_lora, &attention.v_lora, &attention.o_lora, &mlp.gate_lora,
                                &mlp.up_lora, &mlp.down_lora})
      if (adapter->a.defined()) return false;
    const int64_t heads = attention.heads, groups = attention.kv_heads;
    // The general path's attention takes the decode kernels for up to 16 query heads per KV head.
    if (groups < 1 || heads % groups != 0 || heads / groups > kDecodeAttentionMaxRows) return false;
    const auto& keys = cache->key_storage(index);
    const auto& values = cache->value_storage(index);
    for (const auto* storage : {&keys, &values})
      if (!on_cpu_as(*storage, torch::kFloat32) || storage->dim() != 4 || storage->size(0) <= cache->storage_row(rows - 1) ||
          (!cache->is_per_row() && storage->size(0) != rows) || storage->size(1) != groups || storage->size(3) != head_dim)
        return false;
    Product products[3];
    const int qkv_count = qkv_products(layer, products);
    for (int i = 0; i < qkv_count; ++i)
      if (!products[i].usable(kernels)) return false;
    const int gate_up_count = gate_up_products(layer, rows, products);
    for (int i = 0; i < gate_up_count; ++i)
      if (!products[i].usable(kernels)) return false;
    if (!product_of(attention.o_proj, attention.o_quantized).usable(kernels) ||
        !product_of(mlp.down_proj, mlp.down_quantized).usable(kernels))
      return false;
    const int64_t inner = config.ffn(index);
    if (!usable_bias(attention.q_proj->bias, heads * head_dim, activations) ||
        !usable_bias(attention.k_proj->bias, groups * head_dim, activations) ||
        !usable_bias(attention.v_proj->bias, groups * head_dim, activations) ||
        !usable_bias(attention.o_proj->bias, width, activations) || !usable_bias(mlp.gate_proj->bias, inner, activations) ||
        !usable_bias(mlp.up_proj->bias, inner, activations) || !usable_bias(mlp.down_proj->bias, width, activations))
      return false;
    for (const auto* norm : {&layer.input_layernorm->weight, &layer.post_attention_layernorm->weight})
      if (!on_cpu_as(*norm, activations) || norm->numel() != width) return false;
  }
  return true;
}

torch::Tensor cpu_decode_layers(LlamaImpl& model, const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                KVCache& cache, const torch::Tensor& bias_mask) {
  const int64_t rows = x.size(0), width = model.config().hidden_size, keys = cache.visible_columns(1);
  torch::Tensor additive;  // [B, S] float32, the general path's mask as its attention adds it
  if (bias_mask.defined()) {
    TORCH_CHECK(bias_mask.size(-1) == keys, "cpu_decode_layers: a mask of ", bias_mask.sizes(), " for ", keys, " columns");
    additive = bias_mask.to(torch::kFloat32).expand({rows, 1, 1, keys}).reshape({rows, keys}).contiguous();
  }
  const float* mask = additive.defined() ? additive.const_data_ptr<float>() : nullptr;
  auto residual = x.reshape({rows, width}).clone();  // [B, D], updated in place layer by layer
  if (x.scalar_type() == torch::kBFloat16)
    decode_layers(model, residual.data_ptr<c10::BFloat16>(), rows, cos, sin, cache, mask);
  else
    decode_layers(model, residual.data_ptr<float>(), rows, cos, sin, cache, mask);
  return residual.view({rows, 1, width});  // [B, 1, D]
}

}  // namespace coconut
