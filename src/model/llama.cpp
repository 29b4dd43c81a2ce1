// Llama forward pass. Numerics follow HF `LlamaForCausalLM` (eager attention): RMSNorm in float32
// then cast back, RoPE tables in float32 cast to the activation dtype, softmax in float32.
#include "model/llama.h"

#include "model/autocast.h"
#include "model/cpu_attention.h"
#include "model/cpu_decode.h"
#include "model/cpu_linear.h"
#include "model/cpu_norm.h"
#include "model/cpu_rope.h"
#include "model/cpu_swiglu.h"
#include "model/cpu_training_attention.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

namespace coconut {

torch::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "fp32") return torch::kFloat32;
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return torch::kFloat16;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  throw std::invalid_argument("unknown dtype '" + name + "' (expected float32, float16 or bfloat16)");
}

std::string dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return "float32";
    case torch::kFloat16: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: throw std::invalid_argument("unsupported model dtype " + std::string(c10::toString(dtype)));
  }
}

// HF computes inv_freq = 1 / theta^(arange(0, Dh, 2) / Dh) in float32, then applies the scaling.
torch::Tensor rope_inverse_frequencies(const LlamaConfig& config) {
  const int64_t half = config.head_dim / 2;
  auto exponents = torch::arange(0, config.head_dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<float>(config.head_dim);
  auto inverse = 1.0 / torch::pow(static_cast<float>(config.rope_theta), exponents);  // [Dh/2] float32
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == "linear") {
    inverse = inverse / static_cast<float>(scaling.factor);
  } else if (scaling.type == "llama3") {
    // Llama 3.1 "llama3" scaling: long wavelengths divided by factor, short ones kept, and a
    // smooth interpolation between low_freq_wavelen and high_freq_wavelen.
    const double old_context = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / scaling.low_freq_factor;
    const double high_freq_wavelen = old_context / scaling.high_freq_factor;
    auto wavelen = 2.0 * M_PI / inverse;
    auto scaled = torch::where(wavelen > low_freq_wavelen, inverse / scaling.factor, inverse);
    auto smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
    auto is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    inverse = torch::where(is_medium, smoothed, scaled);
  }
  TORCH_CHECK(inverse.size(0) == half);
  return inverse.to(torch::kFloat32);
}

namespace {

// [.., Dh] -> [.., Dh] with halves (x1, x2) mapped to (-x2, x1).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (uses_cpu_rope(x, cos, sin)) return cpu_rope(x, cos, sin);  // inference on the CPU: the same bits, one pass
  if (uses_recorded_cpu_rope(x, cos, sin)) return recorded_cpu_rope(x, cos, sin);  // training on the CPU, same bits
  return x * cos + rotate_half(x) * sin;
}

// x / rms(x) over the last axis, in float32 (RMSNorm without its gain).
torch::Tensor rms_normalize(const torch::Tensor& x, double eps) {
  auto x32 = x.to(torch::kFloat32);
  return x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

torch::Tensor project(const torch::nn::Linear& layer, const LowRankAdapter& adapter, const QuantizedWeight& quantized,
                      const torch::Tensor& x) {
  auto y = quantized.defined() ? quantized_dense(x, quantized, layer->bias) : coconut::dense(x, layer->weight, layer->bias);
  if (!adapter.a.defined()) return y;
  // [.., K] -> [.., r] -> [.., N]
  return y + torch::matmul(torch::matmul(x, adapter.a.t().to(x.scalar_type())), adapter.b.t().to(x.scalar_type())) *
                 adapter.scale;
}

// The weights of `parts` as one [N1 + N2 + .., K] matrix where pack_for_inference left them
// one after another in one storage (same dtype, device and K, each contiguous), undefined otherwise.
torch::Tensor adjacent_weights(std::initializer_list<const torch::nn::Linear*> parts) {
  const auto& first = (**parts.begin())->weight;
  if (!first.defined() || first.dim() != 2 || !first.is_contiguous()) return {};
  const int64_t k_size = first.size(1);
  const char* next = static_cast<const char*>(first.const_data_ptr());
  int64_t rows = 0;
  for (const auto* part : parts) {
    const auto& weight = (*part)->weight;
    if (!weight.defined() || weight.dim() != 2 || weight.size(1) != k_size || !weight.is_contiguous() ||
        weight.scalar_type() != first.scalar_type() || weight.device() != first.device() ||
        !weight.storage().is_alias_of(first.storage()) || static_cast<const char*>(weight.const_data_ptr()) != next)
      return {};
    next += weight.nbytes();
    rows += weight.size(0);
  }
  return first.as_strided({rows, k_size}, {k_size, 1});  // [N1 + N2 + .., K], within the shared storage
}

// adjacent_weights for an inference product of x: a product autograd records keeps the parts
// apart (each weight its own gradient).
torch::Tensor packed_weights(std::initializer_list<const torch::nn::Linear*> parts, const torch::Tensor& x) {
  const auto& first = (**parts.begin())->weight;
  if (torch::GradMode::is_enabled() && (x.requires_grad() || (first.defined() && first.requires_grad()))) return {};
  return adjacent_weights(parts);
}

// The outputs of a fused product [.., N1 + N2 + ..] split into its parts, each plus its Linear's
// bias where it has one.
std::vector<torch::Tensor> split_fused(const torch::Tensor& fused, std::initializer_list<const torch::nn::Linear*> parts) {
  std::vector<torch::Tensor> outputs;
  int64_t first = 0;
  for (const auto* part : parts) {
    const int64_t count = (*part)->options.out_features();
    auto output = fused.narrow(-1, first, count);
    outputs.push_back((*part)->bias.defined() ? output + (*part)->bias.to(output.scalar_type()) : output);
    first += count;
  }
  return outputs;
}

}  // namespace

// One decoder layer under activation checkpointing: forward keeps only the layer's input; backward
// runs the layer again with recording on and backpropagates through it, which also accumulates the
// layer's parameter gradients. The first forward runs with grad mode on as well (its graph is
// dropped at once): with it off, the CPU inference kernels (one-pass RMSNorm and RoPE, the decode
// matrix kernels, which bypass autocast) would compute other values than the recomputation.
// The recomputation runs in the autocast state of the forward (backward may run outside the scope
// that had it on), so its activations are bit for bit the first ones (tested both ways).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  // The mask as the layer takes it: an empty one (none, on a GPU: causal) becomes undefined.
  static torch::Tensor mask_or_none(const torch::Tensor& bias_mask) {
    return bias_mask.numel() == 0 ? torch::Tensor() : bias_mask;
  }
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, const torch::Tensor& bias_mask, int64_t layer_address) {
    context->save_for_backward({x, cos, sin, bias_mask});
    context->saved_data["layer"] = layer_address;
    context->saved_data["autocast"] = autocast_enabled(x.device());
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(layer_address);
    torch::AutoGradMode recording(true);
    return layer->forward(x.detach(), cos, sin, mask_or_none(bias_mask), nullptr, torch::Tensor()).detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list output_gradients) {
    const auto saved = context->get_saved_variables();
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(context->saved_data["layer"].toInt());
    auto x = saved[0].detach().requires_grad_(true);
    torch::Tensor output;
    {
      AutocastRestore autocast(context->saved_data["autocast"].toBool(), x.device());
      torch::AutoGradMode recording(true);
      output = layer->forward(x, saved[1], saved[2], mask_or_none(saved[3]), nullptr, torch::Tensor());
    }
    torch::autograd::backward({output}, {output_gradients[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

namespace {

thread_local int uninitialized_scopes = 0;

// A Linear (Embedding) of the given size: libtorch's, randomly initialized, or, inside an
// UninitializedWeights scope, a 1 x 1 one whose weight is then given the full, uninitialized shape.
torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  if (uninitialized_scopes == 0) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(bias));
  torch::NoGradGuard no_grad;
  linear->weight.set_(torch::empty({out, in}));
  if (bias) linear->bias.set_(torch::empty({out}));
  linear->options.in_features(in).out_features(out);
  return linear;
}

torch::nn::Embedding make_embedding(int64_t count, int64_t width) {
  if (uninitialized_scopes == 0) return torch::nn::Embedding(count, width);
  torch::nn::Embedding embedding(1, 1);
  torch::NoGradGuard no_grad;
  embedding->weight.set_(torch::empty({count, width}));
  embedding->options.num_embeddings(count).embedding_dim(width);
  return embedding;
}

// Query rows per block of the CPU's inference attention over a longer pass (a prompt).
constexpr int64_t kPrefillQueryBlock = 64;

// Inference attention on the CPU, grouped-query without repeating K/V: softmax(scale q k^T + mask) v
// for q [B, H, T, Dh] against k, v [B, G, S, Dh] -> [B, H, T, Dh] in `compute`: a decode step's few
// rows, and prompts where the training kernel does not take the arguments. A pass of more than
// kPrefillQueryBlock positions runs in blocks of that many query rows, each against the keys up to
// the last column any of its rows sees (read off the mask): a causal prompt leaves out about half of
// the products and of the softmax (a masked column only added exp(lowest) = 0 to its row), and a
// row's result depends on its block, not on the other rows of the batch.
torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& bias_mask, double scale, torch::ScalarType compute) {
  const int64_t batch = q.size(0), heads = q.size(1), time = q.size(2), head_dim = q.size(3);
  const int64_t groups = k.size(1), per_group = heads / groups, keys = k.size(2);
  const auto rows_against = [&](int64_t first, int64_t rows, int64_t visible) {
    // The R query heads that share a KV head stacked along the row axis: [B, H, rows, Dh] -> [B, G, R*rows, Dh]
    const auto q_grouped = q.narrow(2, first, rows).reshape({batch, groups, per_group * rows, head_dim});
    auto scores = attention_scores(q_grouped, k.narrow(2, 0, visible), scale);  // [B, G, R*rows, visible]
    if (bias_mask.defined()) {
      // [B, G, R*rows, visible] -> [B, G, R, rows, visible] + [B, 1, 1, rows, visible]
      const auto mask = bias_mask.narrow(2, first, rows).narrow(3, 0, visible);
      scores = (scores.view({batch, groups, per_group, rows, visible}) + mask.unsqueeze(1).to(compute))
                   .view({batch, groups, per_group * rows, visible});
    }
    const auto probabilities = torch::softmax(scores, -1, torch::kFloat32).to(compute);
    return attention_context(probabilities, v.narrow(2, 0, visible)).view({batch, heads, rows, head_dim});  // [B, G, R*rows, Dh] -> [B, H, rows, Dh]
  };
  if (time <= kPrefillQueryBlock || !bias_mask.defined()) return rows_against(0, time, keys);
  // One past the last column the last row of each block sees in any batch row (at least 1):
  // [B, 1, T, S] -> [B, blocks, S] -> [blocks]
  const int64_t blocks = (time + kPrefillQueryBlock - 1) / kPrefillQueryBlock;
  const auto last_rows = torch::clamp_max(torch::arange(1, blocks + 1, torch::kInt64) * kPrefillQueryBlock, time) - 1;
  const auto allowed = bias_mask.select(1, 0).index_select(1, last_rows.to(bias_mask.device())).to(torch::kFloat32) >
                       -std::numeric_limits<float>::max() / 2;  // [B, blocks, S]
  const auto columns = torch::arange(1, keys + 1, torch::TensorOptions().dtype(torch::kInt64).device(bias_mask.device()));
  const auto ends = torch::where(allowed, columns, torch::zeros_like(columns)).amax({0, 2}).clamp_min(1).cpu();  // [blocks]
  const auto* end = ends.const_data_ptr<int64_t>();
  std::vector<torch::Tensor> parts;
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kPrefillQueryBlock;
    parts.push_back(rows_against(first, std::min(kPrefillQueryBlock, time - first), end[block]));
  }
  return torch::cat(parts, 2);  // [B, H, T, Dh]
}

}  // namespace

UninitializedWeights::UninitializedWeights() { ++uninitialized_scopes; }
UninitializedWeights::~UninitializedWeights() { --uninitialized_scopes; }

RMSNormImpl::RMSNormImpl(int64_t width, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (uses_cpu_rms_norm(x, weight)) return cpu_rms_norm(x, weight, eps);  // inference on the CPU, one pass
  // Training in float32 on the CPU: a one-pass kernel with its own backward (model/cpu_norm.h),
  // where libtorch's rms_norm is a composite of about six operators forward and ten backward
  // (bench_train, 1M CoT step 104-107 -> 98-103 ms against it). Under bf16 autocast the CPU keeps
  // the written-out form below (libtorch's measured slower there: 1M 75-78 against 68-72 ms).
  if (!autocast_enabled(x.device()) && uses_recorded_cpu_rms_norm(x, weight)) return recorded_cpu_rms_norm(x, weight, eps);
  // On a GPU libtorch's rms_norm is one fused CUDA kernel each way, also under autocast (it has no
  // autocast rule: float32 in and out, as below), where a thought pass is launch-bound (not
  // measured on a GPU yet).
  if (x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
      (x.is_cuda() || !autocast_enabled(x.device())))
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
  return weight * rms_normalize(x, eps).to(x.scalar_type());
}

AttentionImpl::AttentionImpl(const LlamaConfig& config, int64_t layer_)
    : layer(layer_), heads(config.heads(layer_)), kv_heads(config.kv_heads(layer_)), head_dim(config.head_dim) {
  const int64_t width = config.hidden_size;
  const bool bias = config.attention_bias;
  q_proj = register_module("q_proj", make_linear(width, heads * head_dim, bias));
  k_proj = register_module("k_proj", make_linear(width, kv_heads * head_dim, bias));
  v_proj = register_module("v_proj", make_linear(width, kv_heads * head_dim, bias));
  o_proj = register_module("o_proj", make_linear(heads * head_dim, width, bias));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                     const torch::Tensor& given_bias_mask, KVCache* cache, const torch::Tensor& head_scale,
                                     int64_t first_query) {
  const int64_t batch = x.size(0), columns = x.size(1), groups = kv_heads, per_group = heads / kv_heads;
  const int64_t time = columns - first_query;  // query rows
  TORCH_CHECK(0 <= first_query && first_query < columns, "attention: first query column ", first_query, " outside ", columns, " columns");
  // [B, T, H*Dh] -> [B, T, H, Dh] -> [B, H, T, Dh]
  torch::Tensor q, k, v;
  torch::Tensor bias_mask = given_bias_mask;
  const bool no_adapters = !q_lora.a.defined() && !k_lora.a.defined() && !v_lora.a.defined();
  torch::Tensor qkv_weight;  // [Nq + Nk + Nv, D] where packed
  if (first_query > 0) {
    // Queries of the later columns only: [B, C, D] -> q [B, T, Nq]; K/V of every column.
    q = project(q_proj, q_lora, q_quantized, x.narrow(1, first_query, time));
    k = project(k_proj, k_lora, k_quantized, x), v = project(v_proj, v_lora, v_quantized, x);
    TORCH_CHECK(bias_mask.defined(), "attention: queries from column ", first_query, " need the pass's mask");
    bias_mask = bias_mask.narrow(2, first_query, time);  // [B, 1, C, S] -> [B, 1, T, S]
  } else if (qkv_quantized.defined() && no_adapters) {
    const auto parts = split_fused(quantized_dense(x, qkv_quantized), {&q_proj, &k_proj, &v_proj});
    q = parts[0], k = parts[1], v = parts[2];
  } else if (no_adapters && !q_quantized.defined() && (qkv_weight = packed_weights({&q_proj, &k_proj, &v_proj}, x)).defined()) {
    const auto parts = split_fused(coconut::dense(x, qkv_weight), {&q_proj, &k_proj, &v_proj});
    q = parts[0], k = parts[1], v = parts[2];
  } else {
    q = project(q_proj, q_lora, q_quantized, x), k = project(k_proj, k_lora, k_quantized, x);
    v = project(v_proj, v_lora, v_quantized, x);
  }
  q = q.view({batch, time, heads, head_dim}).transpose(1, 2);
  k = k.view({batch, columns, groups, head_dim}).transpose(1, 2);  // [B, G, C, Dh]
  v = v.view({batch, columns, groups, head_dim}).transpose(1, 2);  // [B, G, C, Dh]
  const auto compute = attention_dtype(x.scalar_type(), x.device());
  // The queries' rows of the tables, contiguous as the RoPE kernels take them: [B, 1, C, Dh] -> [B, 1, T, Dh]
  q = first_query > 0 ? apply_rope(q, cos.narrow(2, first_query, time).contiguous(), sin.narrow(2, first_query, time).contiguous())
                            .to(compute)
                      : apply_rope(q, cos, sin).to(compute);
  k = apply_rope(k, cos, sin).to(compute);
  v = v.to(compute);
  if (cache != nullptr) std::tie(k, v) = cache->append(layer, k, v);  // [B, G, S, Dh]
  // On a GPU, more than one position: fused attention (PyTorch's flash / memory-efficient kernels),
  // the [T, S] scores never stored. There an undefined mask means plain causal attention over
  // T == S columns (the forward leaves the mask out when nothing else is masked): the flash kernel.
  // One position at a time (decoding, a thought) keeps the two products below, faster there on an
  // H200 (1B decoding 160 against 129 tokens/s, a 1B Coconut step with six thoughts 369 against 392 ms).
  // On the CPU, passes that autograd records (training) in float32 take a blocked kernel of ours
  // (model/cpu_training_attention.h; bench_training_attention, one thread, a 1M layer's forward and
  // backward 10.8 against libtorch's 13.5 ms), one position too (Coconut's thought passes), and
  // return the context as the output projection reads it; libtorch's fused CPU kernel takes the rest of the
  // recorded passes (it keeps no [T, S] scores for backward and measured faster than the written-out
  // form: bench_train, float32, 1M CoT step 91.0-91.3 against 92.9-94.2 ms; bf16 autocast 69-70
  // against 75-76). Inference on the CPU keeps the kernels below, whose rows get the same bits in
  // any batch (serving depends on that). A lone position with no mask sees every column: not
  // causal (that would be column 0).
  const bool recorded = torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (!x.is_cuda() && recorded) {
    const auto float32_mask = bias_mask.defined() ? bias_mask.to(compute) : torch::Tensor();  // [B, 1, T, S]
    if (uses_cpu_training_attention(q, k, v, float32_mask)) {
      auto context = cpu_training_attention(q, k, v, float32_mask, /*causal=*/time > 1, scale).to(x.scalar_type());  // [B, T, H, Dh]
      if (head_scale.defined()) context = context * head_scale.view({1, 1, heads, 1}).to(context.scalar_type());
      return project(o_proj, o_lora, o_quantized, context.view({batch, time, heads * head_dim}));  // [B, T, D]
    }
  }
  if (x.is_cuda() ? time > 1 : recorded) {
    // On a GPU, K/V repeated to the query heads ([B, G, S, Dh] -> [B, H, S, Dh]) for the flash
    // kernel; the CPU kernel takes the groups as they are (enable_gqa).
    const bool repeat = x.is_cuda() && per_group > 1;
    const auto k_heads = repeat ? k.repeat_interleave(per_group, 1) : k;
    const auto v_heads = repeat ? v.repeat_interleave(per_group, 1) : v;
    std::optional<torch::Tensor> mask;
    if (bias_mask.defined()) mask = bias_mask.to(compute);  // [B, 1, T, S], broadcast over heads
    // On the CPU in float32 even under autocast (whose bf16 flash kernel is slower there: bench_train
    // --bf16, 1M CoT step 97-105 ms against 69-70, 25M 986-1,015 against 857-880).
    std::optional<AutocastRestore> float32_attention;
    if (!x.is_cuda()) float32_attention.emplace(false, x.device());
    auto context = at::scaled_dot_product_attention(q, k_heads, v_heads, mask, 0.0, /*is_causal=*/!bias_mask.defined() && time > 1, scale,
                                                    /*enable_gqa=*/!repeat && per_group > 1);  // [B, H, T, Dh]
    context = context.to(x.scalar_type()).transpose(1, 2);  // [B, H, T, Dh] -> [B, T, H, Dh]
    if (head_scale.defined()) context = context * head_scale.view({1, 1, heads, 1}).to(context.scalar_type());
    return project(o_proj, o_lora, o_quantized, context.reshape({batch, time, heads * head_dim}));  // [B, T, D]
  }
  TORCH_CHECK(bias_mask.defined() || time == 1, "attention over ", time, " positions needs a mask on the CPU");
  // A prompt (more rows than the decode kernels take; the CPU's, in float32): the training kernel's
  // forward (blocks of 32 query rows against the columns they see, products on register tiles),
  // which computes each (batch row, KV head) on its own and returns the context as the output
  // projection reads it. A row's bits depend on its own sequence only (its block's masked columns
  // add exact zeros), so serving's batch invariance holds.
  const auto prompt_mask = time > kDecodeAttentionMaxRows ? bias_mask.to(compute) : torch::Tensor();  // [B, 1, T, S]
  torch::Tensor context;  // [B, T, H, Dh]
  if (prompt_mask.defined() && uses_cpu_training_attention(q, k, v, prompt_mask))
    context = cpu_training_attention(q, k, v, prompt_mask, /*causal=*/true, scale).to(x.scalar_type());
  else  // [B, H, T, Dh] -> [B, T, H, Dh]
    context = grouped_attention(q, k, v, bias_mask, scale, compute).to(x.scalar_type()).transpose(1, 2);
  if (head_scale.defined()) context = context * head_scale.view({1, 1, heads, 1}).to(context.scalar_type());
  return project(o_proj, o_lora, o_quantized, context.reshape({batch, time, heads * head_dim}));  // [B, T, D]
}

void AttentionImpl::append_keys_values(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                       KVCache& cache) {
  const int64_t batch = x.size(0), time = x.size(1);
  // [B, T, G*Dh] -> [B, T, G, Dh] -> [B, G, T, Dh]
  auto k = project(k_proj, k_lora, k_quantized, x).view({batch, time, kv_heads, head_dim}).transpose(1, 2);
  auto v = project(v_proj, v_lora, v_quantized, x).view({batch, time, kv_heads, head_dim}).transpose(1, 2);
  const auto compute = attention_dtype(x.scalar_type(), x.device());
  cache.append(layer, apply_rope(k, cos, sin).to(compute), v.to(compute));
}

MLPImpl::MLPImpl(const LlamaConfig& config, int64_t layer) {
  const int64_t width = config.hidden_size, inner = config.ffn(layer);
  const bool bias = config.mlp_bias;
  gate_proj = register_module("gate_proj", make_linear(width, inner, bias));
  up_proj = register_module("up_proj", make_linear(width, inner, bias));
  down_proj = register_module("down_proj", make_linear(inner, width, bias));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x, const torch::Tensor& channel_scale,
                               const std::function<void(const torch::Tensor&)>& observe) {
  torch::Tensor gate, up;
  const bool no_adapters = !gate_lora.a.defined() && !up_lora.a.defined();
  // Packed gate|up weights in one product for a single position (decode), where the two halves of
  // its output are contiguous for the SwiGLU kernel; a longer pass keeps two products.
  torch::Tensor gate_up_weight;  // [2F, D]
  if (gate_up_quantized.defined() && no_adapters) {
    const auto parts = split_fused(quantized_dense(x, gate_up_quantized), {&gate_proj, &up_proj});
    gate = parts[0], up = parts[1];
  } else if (no_adapters && !gate_quantized.defined() && x.numel() == x.size(-1) &&
             (gate_up_weight = packed_weights({&gate_proj, &up_proj}, x)).defined()) {
    const auto parts = split_fused(coconut::dense(x, gate_up_weight), {&gate_proj, &up_proj});
    gate = parts[0], up = parts[1];
  } else {
    gate = project(gate_proj, gate_lora, gate_quantized, x), up = project(up_proj, up_lora, up_quantized, x);
  }
  auto activation = swiglu(gate, up);  // silu(gate) * up [B, T, F]
  if (channel_scale.defined()) activation = activation * channel_scale.to(activation.scalar_type());
  if (observe) observe(activation);
  return project(down_proj, down_lora, down_quantized, activation);
}

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& config, int64_t layer) {
  input_layernorm = register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(config, layer));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", MLP(config, layer));
  if (config.depth_router) {
    router = register_module("router", make_linear(config.hidden_size, 1, true));
    torch::NoGradGuard no_grad;  // a fresh gate lets everything through (attach_depth_router sets its own)
    router->weight.zero_();
    router->bias.fill_(3.0);
  }
}

torch::Tensor DecoderLayerImpl::router_logits(const torch::Tensor& x) {
  const auto normed = rms_normalize(x, 1e-6);  // scale-free input
  return router(normed.to(router->weight.scalar_type())).to(torch::kFloat32).squeeze(-1);  // [B, T, 1] -> [B, T]
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                        const torch::Tensor& bias_mask, KVCache* cache, const torch::Tensor& head_scale,
                                        const torch::Tensor& channel_scale,
                                        const std::function<void(const torch::Tensor&)>& observe_mlp, int64_t first_output_column) {
  const auto kept = first_output_column > 0 ? x.narrow(1, first_output_column, x.size(1) - first_output_column) : x;  // [B, T, D]
  auto h = kept + self_attn->forward(input_layernorm(x), cos, sin, bias_mask, cache, head_scale, first_output_column);
  return h + mlp(post_attention_layernorm(h), channel_scale, observe_mlp);
}

LlamaImpl::LlamaImpl(LlamaConfig config) : config_(std::move(config)) {
  config_.validate();
  embed_tokens = register_module("embed_tokens", make_embedding(config_.vocab_size, config_.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) layers->push_back(DecoderLayer(config_, layer));
  norm = register_module("norm", RMSNorm(config_.hidden_size, config_.rms_norm_eps));
  if (!config_.tie_word_embeddings)
    lm_head = register_module("lm_head", make_linear(config_.hidden_size, config_.vocab_size, false));
  inverse_frequencies_ = register_buffer("inverse_frequencies", rope_inverse_frequencies(config_));
}

torch::Tensor LlamaImpl::embed(const torch::Tensor& ids) {
  if (!embedding_quantized.defined()) return embed_tokens(ids);
  auto sizes = ids.sizes().vec();
  sizes.push_back(config_.hidden_size);
  // [n, D] float32 -> [..., D] in the model's dtype
  return dequantize_rows(embedding_quantized, ids).to(embed_tokens->weight.scalar_type()).view(sizes);
}

torch::Tensor LlamaImpl::output_weight() { return lm_head ? lm_head->weight : embed_tokens->weight; }

torch::Tensor LlamaImpl::logits(const torch::Tensor& hidden) {
  if (output_quantized.defined()) return quantized_dense(hidden, output_quantized).to(torch::kFloat32);
  return coconut::dense(hidden, output_weight()).to(torch::kFloat32);
}

torch::Tensor LlamaImpl::thought_input(const torch::Tensor& hidden) {
  torch::Tensor thought = hidden;
  if (config_.thought_is_expected_embedding()) {
    TORCH_CHECK(!embedding_quantized.defined(),
                "expected_embedding thoughts read the dense embedding table, which this model keeps in blocks: load it with --weights dense");
    const auto probabilities = torch::softmax(logits(hidden), -1);  // [.., V] float32
    const auto& table = embed_tokens->weight;                        // [V, D]
    thought = torch::matmul(probabilities.to(table.scalar_type()), table).to(hidden.scalar_type());  // [.., D]
  }
  if (config_.latent_thought_rms <= 0) return thought;
  // Per vector, in float32: thought / rms(thought) * target.
  return (rms_normalize(thought, 1e-12) * config_.latent_thought_rms).to(hidden.scalar_type());
}

void LlamaImpl::set_latent_thought_input(const std::string& input) {
  TORCH_CHECK(LlamaConfig::is_latent_thought_input(input),
              "latent_thought_input must be last_hidden or expected_embedding, got '", input, "'");
  config_.latent_thought_input = input;
}

void LlamaImpl::set_latent_thought_rms(double rms) {
  TORCH_CHECK(std::isfinite(rms) && rms >= 0, "latent_thought_rms must be a finite number >= 0, got ", rms);
  config_.latent_thought_rms = rms;
}

ForwardResult LlamaImpl::forward(const torch::Tensor& inputs_embeds, const torch::Tensor& positions, KVCache* cache,
                                 const ForwardOptions& options) {
  TORCH_CHECK(inputs_embeds.dim() == 3 && inputs_embeds.size(2) == config_.hidden_size,
              "inputs_embeds must be [B, T, ", config_.hidden_size, "], got ", inputs_embeds.sizes());
  TORCH_CHECK(positions.dim() == 2 && positions.size(0) == inputs_embeds.size(0) && positions.size(1) == inputs_embeds.size(1),
              "positions must be [B, T] like inputs_embeds, got ", positions.sizes());
  const int64_t batch = inputs_embeds.size(0), time = inputs_embeds.size(1);
  TORCH_CHECK(0 <= options.first_output_column && options.first_output_column < time, "first_output_column ",
              options.first_output_column, " is outside the call's ", time, " columns");
  const auto dtype = inputs_embeds.scalar_type();
  const auto device = inputs_embeds.device();

  // Rotary tables: [B, T, Dh/2] angles in float32 -> cos/sin [B, 1, T, Dh] in the activation dtype.
  auto angles = positions.to(torch::kFloat32).unsqueeze(-1) * inverse_frequencies_.to(device).view({1, 1, -1});
  auto doubled = torch::cat({angles, angles}, -1).unsqueeze(1);
  auto cos = doubled.cos().to(dtype), sin = doubled.sin().to(dtype);

  // Additive mask [B, 1, T, S]: causal over cache columns, and padded keys hidden. As in HF, the
  // masked value is the dtype's lowest finite number (a fully masked padding row stays finite).
  // A single new column with no padding anywhere needs no mask at all.
  torch::Tensor key_mask;  // [B, S] bool, true = real token
  const bool has_padding = options.attention_mask.defined();
  if (cache != nullptr) {
    auto new_mask = has_padding ? options.attention_mask.to(torch::kBool)
                                : torch::ones({batch, time}, torch::TensorOptions().dtype(torch::kBool).device(device));
    key_mask = cache->append_key_mask(new_mask);
  } else if (has_padding) {
    key_mask = options.attention_mask.to(torch::kBool);
  }
  torch::Tensor bias_mask;
  // A fixed-shape cache always has masked columns (those not written yet), and asking would
  // synchronise with the device; so would asking a mask on a GPU, where a given mask is taken to
  // pad (callers pass one only when a row is padded; an all-real one gives the same output).
  const bool fixed = cache != nullptr && cache->has_fixed_shapes();
  const bool any_padding =
      fixed || (key_mask.defined() && (key_mask.is_cuda() || !key_mask.all().item<bool>()));
  // On the GPU, plain causal attention without a cache needs no mask: the fused kernel applies it
  // (not where the last layer's queries start later: first_output_column).
  const bool causal_only = device.is_cuda() && cache == nullptr && !any_padding && options.first_output_column == 0;
  if ((time > 1 && !causal_only) || any_padding) {
    const int64_t keys = cache != nullptr ? key_mask.size(1) : time;
    // The column of each new position: [1, T], or [B, T] when every row has its own length.
    auto query_columns = cache != nullptr ? cache->new_columns(time, device)
                                          : torch::arange(time, torch::TensorOptions().dtype(torch::kInt64).device(device)).view({1, time});
    auto key_columns = torch::arange(0, keys, torch::TensorOptions().dtype(torch::kInt64).device(device));
    auto allowed = key_columns.view({1, 1, keys}) <= query_columns.unsqueeze(-1);  // [1 or B, T, S]
    // Rows differ only where some key is padding (on a GPU, whenever a key mask is given: asking
    // would wait for the device); otherwise one [T, S] mask serves every row (a Coconut step's
    // cached passes on the CPU kept a [B, T, S] one each).
    if (key_mask.defined() && any_padding) allowed = allowed.logical_and(key_mask.view({batch, 1, keys}));  // [B, T, S]
    const double lowest = dtype == torch::kFloat32 ? std::numeric_limits<float>::lowest()
                                                   : (dtype == torch::kFloat16 ? -65504.0 : -3.3895313892515355e38);
    bias_mask = torch::zeros(allowed.sizes(), inputs_embeds.options()).masked_fill(allowed.logical_not(), lowest);
    bias_mask = bias_mask.expand({batch, time, keys}).unsqueeze(1);  // [B, 1, T, S]
  }

  ForwardResult result;
  // A decoded position per row on the CPU (float32 or bf16, dense or quantized weights, padded or
  // per-row caches): the same computation on buffers, without the general path's operator calls
  // (model/cpu_decode.h).
  if (uses_cpu_decode_layers(*this, inputs_embeds, cache, options)) {
    auto x = cpu_decode_layers(*this, inputs_embeds, cos, sin, *cache, bias_mask);
    cache->advance(time);
    result.hidden = norm(x);
    return result;
  }
  auto x = inputs_embeds;
  const int64_t depth = config_.num_hidden_layers;
  const auto flags = torch::TensorOptions().dtype(torch::kBool).device(device);
  const bool early_exit = options.depth.exit_threshold > 0 && time == 1;
  const bool per_row_routing = options.router_thresholds.defined() || options.router_max_layers.defined();
  const bool routing = config_.depth_router &&
                       (options.router_straight_through || options.depth.router_threshold > 0 || per_row_routing) &&
                       (options.route_mask.defined() || time == 1);
  TORCH_CHECK(!options.router_max_layers.defined() || time == 1, "router_max_layers is for one-position calls");
  TORCH_CHECK(!(early_exit && routing), "early exit and the depth router cannot be combined");
  TORCH_CHECK(!options.layer_keep.defined() || (!early_exit && !routing),
              "layer_keep (stochastic depth) cannot be combined with early exit or the depth router");
  TORCH_CHECK(!options.layer_keep.defined() || (options.layer_keep.dim() == 2 && options.layer_keep.size(0) == batch &&
                                                options.layer_keep.size(1) == config_.num_hidden_layers),
              "layer_keep must be [batch, layers] = [", batch, ", ", config_.num_hidden_layers, "]");
  const int64_t first_layer = options.first_layer, end_layer = options.end_layer < 0 ? depth : options.end_layer;
  TORCH_CHECK(0 <= first_layer && first_layer < end_layer && end_layer <= depth, "layer range [", first_layer, ", ",
              end_layer, ") is not inside the model's ", depth, " layers");
  const int64_t first_output = options.first_output_column;
  // The last layer on the columns from first_output only, where nothing else reads its other columns.
  const bool trim_last_layer = first_output > 0 && !early_exit && !routing && !options.layer_keep.defined() &&
                               !options.return_residuals && !options.on_mlp_activation && !options.skip_layers.count(end_layer - 1);
  const bool whole_stack = first_layer == 0 && end_layer == depth;
  TORCH_CHECK(whole_stack || (!early_exit && !routing && !options.layer_keep.defined() && options.skip_layers.empty()),
              "a layer range runs every layer in it: not with early exit, the depth router, layer_keep or skip_layers");
  torch::Tensor keep;  // [B, L] bool
  if (options.layer_keep.defined()) keep = options.layer_keep.to(device).to(torch::kBool);
  const bool recording = (early_exit || routing) && !options.router_straight_through;
  torch::Tensor exited;  // [B] bool: rows that stopped at an earlier layer (early exit)
  if (early_exit) exited = torch::zeros({batch}, flags);
  torch::Tensor routed;  // [B, T, 1] bool: positions whose layers the router decides
  if (routing) {
    routed = options.route_mask.defined() ? options.route_mask.to(device).to(torch::kBool) : torch::ones({batch, time}, flags);
    routed = routed.unsqueeze(-1);
  }
  // Per-row gate thresholds [B, 1] and layer caps [B, 1, 1], and the layers each row has run [B, 1, 1].
  torch::Tensor thresholds, max_layers, layers_ran;
  if (routing && options.router_thresholds.defined())
    thresholds = options.router_thresholds.to(device).to(torch::kFloat32).view({batch, 1});
  if (routing && options.router_max_layers.defined()) {
    max_layers = options.router_max_layers.to(device).to(torch::kInt64).view({batch, 1, 1});
    layers_ran = torch::zeros({batch, 1, 1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  }
  std::vector<torch::Tensor> skipped;        // L x [B] bool (one-position adaptive calls)
  std::vector<torch::Tensor> probabilities;  // L x [B, T] (straight-through training)
  for (int64_t layer = first_layer; layer < end_layer; ++layer) {
    if (options.return_residuals) result.residuals.push_back(x);
    if (options.skip_layers.count(layer)) {
      if (recording) skipped.push_back(torch::ones({batch}, flags));
      continue;
    }
    auto decoder = layers[layer]->as<DecoderLayer>();
    torch::Tensor head_scale;
    if (options.head_mask.defined()) head_scale = options.head_mask[layer].narrow(0, 0, config_.heads(layer));
    torch::Tensor channel_scale;
    if (options.mlp_channel_mask.defined())
      channel_scale = options.mlp_channel_mask[layer].narrow(0, 0, config_.ffn(layer));
    std::function<void(const torch::Tensor&)> observe_mlp;
    if (options.on_mlp_activation)
      observe_mlp = [&options, layer](const torch::Tensor& activation) { options.on_mlp_activation(layer, activation); };
    const bool checkpoint = options.checkpoint_layers && cache == nullptr && !head_scale.defined() &&
                            !channel_scale.defined() && !observe_mlp && torch::GradMode::is_enabled();
    const auto run_layer = [&] {
      if (trim_last_layer && layer == end_layer - 1)  // [B, T, D] -> [B, T - first_output, D]
        return decoder->forward(x, cos, sin, bias_mask, cache, head_scale, channel_scale, observe_mlp, first_output);
      if (checkpoint)  // an autograd function takes no undefined tensor: no mask travels as an empty one
        return CheckpointedLayer::apply(x, cos, sin, bias_mask.defined() ? bias_mask : torch::empty({0}, x.options()),
                                        reinterpret_cast<int64_t>(decoder));
      return decoder->forward(x, cos, sin, bias_mask, cache, head_scale, channel_scale, observe_mlp);
    };
    const auto keys_values_only = [&] {
      if (cache != nullptr) decoder->self_attn->append_keys_values(decoder->input_layernorm(x), cos, sin, *cache);
    };

    const bool route_layer = routing && layer >= config_.depth_router_first_layer;
    if (route_layer && options.router_straight_through) {
      const auto logits = decoder->router_logits(x);  // [B, T]
      probabilities.push_back(torch::sigmoid(logits));
      auto noisy = logits;
      if (options.router_noise > 0) {
        auto uniform = torch::rand_like(logits).clamp(1e-6, 1.0 - 1e-6);
        noisy = logits + options.router_noise * (uniform.log() - (1.0 - uniform).log());  // + logistic noise
      }
      auto soft = torch::sigmoid(noisy);
      auto gate = (soft > 0.5).to(soft.scalar_type()) + soft - soft.detach();  // hard forward, sigmoid backward
      auto output = run_layer();
      // [B, T] -> [B, T, 1]; positions the router does not decide take the layer's output as it is.
      x = torch::where(routed, x + gate.unsqueeze(-1).to(x.scalar_type()) * (output - x), output);
      continue;
    }
    if (route_layer) {
      const auto probabilities_now = torch::sigmoid(decoder->router_logits(x));  // [B, T]
      auto gate_open = thresholds.defined() ? (probabilities_now > thresholds).logical_or(thresholds <= 0)
                                            : probabilities_now > options.depth.router_threshold;
      auto runs = gate_open.unsqueeze(-1).logical_or(routed.logical_not());  // [B, T, 1]
      if (max_layers.defined()) {  // one position per row: [B, 1, 1]
        runs = runs.logical_and(layers_ran < max_layers);
        layers_ran = layers_ran + runs.to(torch::kInt64);
      }
      if (time == 1) skipped.push_back(runs.logical_not().view({batch}));
      if (!runs.any().item<bool>()) {  // no position runs the layer: only its K/V for later positions
        keys_values_only();
        continue;
      }
      x = torch::where(runs, run_layer(), x);
      continue;
    }
    if (!early_exit) {
      if (recording && time == 1) skipped.push_back(torch::zeros({batch}, flags));  // a layer the router never skips
      if (layers_ran.defined()) layers_ran = layers_ran + 1;
      // [B] -> [B, 1, 1]: dropped rows keep their state (where, not x + k (out - x): kept rows get
      // the layer's output bit for bit).
      // In inference a layer no row keeps does not run at all (nor write K/V): a prefix or sub-stack
      // of every row of the call (a server's requests at their own depths).
      if (keep.defined() && !torch::GradMode::is_enabled() && !keep.select(1, layer).any().item<bool>()) continue;
      x = keep.defined() ? torch::where(keep.select(1, layer).view({batch, 1, 1}), run_layer(), x) : run_layer();
      continue;
    }
    skipped.push_back(exited.clone());
    if (exited.all().item<bool>()) {  // every row has stopped: K/V for later positions only
      keys_values_only();
      continue;
    }
    auto output = run_layer();
    // Rows already stopped keep their state (this layer's K/V for them came from it, as above).
    auto stops = torch::zeros_like(exited);
    if (layer + 1 >= options.depth.exit_min_layers) {
      // [B, 1, D] -> [B] angular distance between the layer's input and output
      const auto cosine = torch::cosine_similarity(x.to(torch::kFloat32), output.to(torch::kFloat32), -1).squeeze(1);
      stops = torch::acos(cosine.clamp(-1.0, 1.0)) / M_PI < options.depth.exit_threshold;
    }
    x = torch::where(exited.view({batch, 1, 1}), x, output);
    exited = exited.logical_or(stops);
  }
  if (recording && time == 1) {
    result.layers_skipped = torch::stack(skipped, 1);  // [B, L]
    result.layers_run = depth - result.layers_skipped.sum(1);
  }
  if (!probabilities.empty()) result.router_probabilities = torch::stack(probabilities, -1);  // [B, T, L]
  if (options.return_residuals) result.residuals.push_back(x);
  if (cache != nullptr) cache->advance(time);
  if (first_output > 0 && !trim_last_layer) x = x.narrow(1, first_output, time - first_output);  // [B, T, D] -> [B, T - first_output, D]
  result.hidden = norm(x);
  return result;
}

void pack_for_inference(Llama& model) {
  const auto parameters = model->parameters();
  if (parameters.empty() || !parameters.front().device().is_cpu()) return;  // measured on the CPU only
  torch::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> packed;
  const auto pack = [&packed](std::initializer_list<torch::nn::Linear*> parts) {
    std::vector<torch::Tensor> weights;
    for (auto* part : parts) {
      if (!(*part)->weight.defined() || (*part)->weight.numel() == 0) return;  // quantized: its blocks are elsewhere
      weights.push_back((*part)->weight);
    }
    const auto together = torch::cat(weights, 0);  // [N1 + N2 + .., K]
    int64_t first = 0;
    for (auto* part : parts) {
      const int64_t rows = (*part)->weight.size(0);
      (*part)->weight.set_data(together.narrow(0, first, rows));
      packed.insert((*part)->weight.unsafeGetTensorImpl());
      first += rows;
    }
  };
  for (const auto& layer : *model->layers) {
    auto& decoder = *layer->as<DecoderLayer>();
    pack({&decoder.self_attn->q_proj, &decoder.self_attn->k_proj, &decoder.self_attn->v_proj});
    pack({&decoder.mlp->gate_proj, &decoder.mlp->up_proj});
  }
  // Memory libtorch did not allocate (no allocator: from_blob, the loader's views of the mapped
  // file) is copied; tensors it allocated (a dtype conversion at load, the packing) are kept.
  for (auto& parameter : model->parameters())
    if (parameter.numel() > 0 && !packed.count(parameter.unsafeGetTensorImpl()) && parameter.storage().allocator() == nullptr)
      parameter.set_data(parameter.clone());
}

torch::Tensor packed_qkv_weight(DecoderLayerImpl& layer) {
  const auto& attention = *layer.self_attn;
  return adjacent_weights({&attention.q_proj, &attention.k_proj, &attention.v_proj});
}

torch::Tensor packed_gate_up_weight(DecoderLayerImpl& layer) { return adjacent_weights({&layer.mlp->gate_proj, &layer.mlp->up_proj}); }

bool qkv_packed(DecoderLayerImpl& layer) { return packed_qkv_weight(layer).defined(); }

bool gate_up_packed(DecoderLayerImpl& layer) { return packed_gate_up_weight(layer).defined(); }

ForwardResult LlamaImpl::forward_ids(const torch::Tensor& ids, KVCache* cache, const ForwardOptions& options) {
  TORCH_CHECK(cache == nullptr || !cache->is_per_row(), "forward_ids: give positions (forward) with a per-row cache");
  const int64_t past = cache ? cache->length() : 0;
  auto positions = torch::arange(past, past + ids.size(1), torch::TensorOptions().dtype(torch::kInt64).device(ids.device()))
                       .unsqueeze(0)
                       .expand({ids.size(0), ids.size(1)});
  return forward(embed(ids), positions, cache, options);
}

void initialize_weights(Llama& model, double std, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& named : model->named_parameters()) {
    auto& parameter = named.value();
    const std::string& name = named.key();
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_norm) {
      parameter.fill_(1.0);
    } else if (is_bias) {
      parameter.zero_();
    } else {
      auto values = at::normal(0.0, std, parameter.sizes(), generator, torch::TensorOptions().dtype(torch::kFloat32));
      parameter.copy_(values);
    }
  }
}

}  // namespace coconut
