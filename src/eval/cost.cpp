#include "eval/cost.h"

#include <algorithm>
#include <stdexcept>

#include "model/quantize_model.h"

namespace coconut {

ParameterCount count_parameters(const LlamaConfig& c) {
  ParameterCount count;
  const int64_t width = c.hidden_size, dh = c.head_dim;
  const int64_t attention_bias = c.attention_bias ? 1 : 0, mlp_bias = c.mlp_bias ? 1 : 0;
  count.embeddings = c.vocab_size * width;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerParameterCount layer;
    const int64_t q = c.heads(l) * dh, kv = c.kv_heads(l) * dh, f = c.ffn(l);
    layer.q = q * width + attention_bias * q;  // [H Dh, D] (+ [H Dh])
    layer.k = kv * width + attention_bias * kv;  // [G Dh, D] (+ [G Dh])
    layer.v = kv * width + attention_bias * kv;
    layer.o = width * q + attention_bias * width;  // [D, H Dh] (+ [D])
    layer.gate = f * width + mlp_bias * f;  // [F, D] (+ [F])
    layer.up = f * width + mlp_bias * f;
    layer.down = width * f + mlp_bias * width;  // [D, F] (+ [D])
    layer.norms = 2 * width;
    layer.router = c.depth_router ? width + 1 : 0;
    count.layers.push_back(layer);
  }
  count.final_norm = width;
  count.lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * width;  // a tied matrix is counted once
  count.total = count.embeddings + count.final_norm + count.lm_head;
  for (const auto& layer : count.layers) count.total += layer.total();
  count.non_embedding = count.total - count.embeddings;
  return count;
}

// Derivation. A matrix-vector product y = W x with W of shape [rows, cols] is rows * cols
// multiply-accumulates, i.e. 2 * rows * cols FLOPs: every weight of a linear layer is used once per
// token. For one token at context N, in layer l (bias adds are elementwise, not counted):
//   projections  q [H Dh, D], k and v [G Dh, D], o [D, H Dh]:  2 * (2 H Dh D + 2 G Dh D)
//   attention    each of the H query heads takes N dot products of length Dh with the cached keys
//                (scores Q K^T: H N Dh MACs) and sums N value vectors of width Dh weighted by the
//                softmax (P V: H N Dh MACs). GQA shares K/V between heads but does not reduce these
//                products.                                   2 * 2 * H Dh N
//   mlp          gate and up [F, D], down [D, F]:            2 * 3 F D
// then once per token with logits: lm_head [V, D]:           2 V D
// The embedding lookup is a row copy (0 FLOPs). So, without biases,
//   flops_per_token = 2 * (matrix weights used) + 4 * N * sum_l H(l) Dh,
// where the matrix weights used are those of the layers plus the [V, D] head (tied or not).
FlopsBreakdown flops_per_token(const LlamaConfig& c, int64_t context) {
  FlopsBreakdown flops;
  const double width = static_cast<double>(c.hidden_size), dh = static_cast<double>(c.head_dim);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double q = static_cast<double>(c.heads(l)) * dh, kv = static_cast<double>(c.kv_heads(l)) * dh;
    flops.projections += 2.0 * (2.0 * q * width + 2.0 * kv * width);  // q, o and k, v
    flops.attention += 2.0 * 2.0 * q * static_cast<double>(context);  // Q K^T and P V
    flops.mlp += 2.0 * 3.0 * static_cast<double>(c.ffn(l)) * width;  // gate, up, down
  }
  flops.head = 2.0 * static_cast<double>(c.vocab_size) * width;
  return flops;
}

double skipped_layer_savings(const LlamaConfig& c, int64_t context, int64_t layer) {
  if (layer < 0 || layer >= c.num_hidden_layers || context < 1)
    throw std::invalid_argument("skipped_layer_savings: layer must be in 0..L-1 and context positive");
  const double width = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.heads(layer)) * static_cast<double>(c.head_dim);
  return 2.0 * 2.0 * q * width                                  // q and o projections (k, v still run)
         + 2.0 * 2.0 * q * static_cast<double>(context)         // Q K^T and P V
         + 2.0 * 3.0 * static_cast<double>(c.ffn(layer)) * width;  // gate, up, down
}

double early_exit_savings(const LlamaConfig& c, int64_t context, int64_t layers_run) {
  if (layers_run < 0 || layers_run > c.num_hidden_layers || context < 1)
    throw std::invalid_argument("early_exit_savings: layers_run must be in 0..L and context positive");
  double saved = 0;
  for (int64_t l = layers_run; l < c.num_hidden_layers; ++l) saved += skipped_layer_savings(c, context, l);
  return saved;
}

double router_gate_flops(const LlamaConfig& c, int64_t layers_reached) {
  return 2.0 * static_cast<double>(c.hidden_size) * static_cast<double>(layers_reached);
}

namespace {
// first + (first + 1) + ... + last, 0 when last < first.
double sum_of_contexts(int64_t first, int64_t last) {
  if (last < first) return 0.0;
  return static_cast<double>(last - first + 1) * static_cast<double>(first + last) / 2.0;
}

// Positions at contexts first..last, each without logits; `heads` lm_head evaluations on top.
// Attention FLOPs are linear in the context, so the sum is attention(1) * sum of the contexts.
FlopsBreakdown positions_flops(const LlamaConfig& c, int64_t first, int64_t last, int64_t heads) {
  const FlopsBreakdown one = flops_per_token(c, 1);
  const double positions = last < first ? 0.0 : static_cast<double>(last - first + 1);
  FlopsBreakdown flops;
  flops.projections = one.projections * positions;
  flops.mlp = one.mlp * positions;
  flops.attention = one.attention * sum_of_contexts(first, last);
  flops.head = one.head * static_cast<double>(heads);
  return flops;
}

FlopsBreakdown operator+(FlopsBreakdown a, const FlopsBreakdown& b) {
  a.projections += b.projections;
  a.attention += b.attention;
  a.mlp += b.mlp;
  a.head += b.head;
  return a;
}
}  // namespace

FlopsBreakdown prefill_flops(const LlamaConfig& c, int64_t tokens, bool all_logits) {
  const int64_t heads = all_logits ? tokens : (tokens > 0 ? 1 : 0);
  return positions_flops(c, 1, tokens, heads);
}

double prefill_flops_total(const LlamaConfig& c, int64_t tokens, bool all_logits) {
  return prefill_flops(c, tokens, all_logits).total();
}

double average_prefill_flops_per_token(const LlamaConfig& c, int64_t tokens, bool all_logits) {
  if (tokens <= 0) throw std::invalid_argument("average_prefill_flops_per_token: tokens must be positive");
  return prefill_flops_total(c, tokens, all_logits) / static_cast<double>(tokens);
}

namespace {
// The layers [first, end) as a model of their own (per-layer sizes kept; width, vocabulary and head
// unchanged).
// The config of layers `kept` of c (in that order), each with its own sizes, for counting FLOPs.
LlamaConfig layer_selection(const LlamaConfig& c, const std::vector<int64_t>& kept) {
  LlamaConfig selection = c;
  const auto select = [&](std::vector<int64_t>& sizes) {
    if (sizes.empty()) return;
    std::vector<int64_t> chosen;
    for (int64_t layer : kept) chosen.push_back(sizes[static_cast<size_t>(layer)]);
    sizes = chosen;
  };
  select(selection.layer_num_attention_heads);
  select(selection.layer_num_key_value_heads);
  select(selection.layer_intermediate_size);
  selection.num_hidden_layers = static_cast<int64_t>(kept.size());
  return selection;
}

LlamaConfig layer_range(const LlamaConfig& c, int64_t first, int64_t end) {
  std::vector<int64_t> kept;
  for (int64_t layer = first; layer < end; ++layer) kept.push_back(layer);
  return layer_selection(c, kept);
}
}  // namespace

FlopsBreakdown layers_prefill_flops(const LlamaConfig& c, int64_t tokens, int64_t first, int64_t end) {
  if (first < 0 || end > c.num_hidden_layers || first > end || tokens < 0)
    throw std::invalid_argument("layers_prefill_flops: the range must lie in 0..L and tokens be non-negative");
  return positions_flops(layer_range(c, first, end), 1, tokens, 0);
}

double cascade_level_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t prompt_only, int64_t new_tokens,
                           int64_t latent_steps, int64_t layers, int64_t previous_layers) {
  return generation_flops(config, prompt_tokens, new_tokens, latent_steps, layers).total() -
         layers_prefill_flops(config, prompt_only, 0, previous_layers).total();
}

double undone_peek_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t prompt_only, int64_t new_tokens,
                         int64_t latent_steps) {
  return generation_flops(config, prompt_tokens, new_tokens, latent_steps).total() -
         generation_flops(config, prompt_only, 0, latent_steps).total();
}

double layer_set_flops(const LlamaConfig& config, const std::vector<int64_t>& removed, int64_t prompt_tokens, int64_t new_tokens,
                       int64_t latent_steps) {
  std::vector<int64_t> kept;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    if (std::find(removed.begin(), removed.end(), layer) == removed.end()) kept.push_back(layer);
  if (kept.empty()) throw std::invalid_argument("layer_set_flops: every layer removed");
  return generation_flops(layer_selection(config, kept), prompt_tokens, new_tokens, latent_steps, 0).total();
}

FlopsBreakdown generation_flops(const LlamaConfig& model, int64_t prompt_tokens, int64_t new_tokens, int64_t latent_steps,
                                int64_t layers) {
  if (prompt_tokens < 0 || new_tokens < 0 || latent_steps < 0)
    throw std::invalid_argument("generation_flops: negative token count");
  if (layers < 0 || layers > model.num_hidden_layers)
    throw std::invalid_argument("generation_flops: layers must lie in 0..L");
  const LlamaConfig prefix = layers > 0 ? layer_range(model, 0, layers) : LlamaConfig{};
  const LlamaConfig& c = layers > 0 ? prefix : model;  // what runs
  // Prompt at contexts 1..P, latent thoughts at P+1..P+K, then the n - 1 generated tokens that are
  // fed back at P+K+1..P+K+n-1; n heads, one per generated token.
  const int64_t fed_positions = prompt_tokens + latent_steps + (new_tokens > 0 ? new_tokens - 1 : 0);
  FlopsBreakdown flops = positions_flops(c, 1, fed_positions, 0) + positions_flops(c, 1, 0, new_tokens);
  // A thought fed back as an expected embedding: its logits (one head) and probabilities @ the
  // [V, D] embedding table (the same multiply-accumulates again).
  if (c.thought_is_expected_embedding()) flops.head += 2 * positions_flops(c, 1, 0, latent_steps).head;
  return flops;
}

int64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "float16" || dtype == "bfloat16") return 2;
  throw std::invalid_argument("unsupported dtype '" + dtype + "' (supported: float32, float16, bfloat16)");
}

namespace {
int64_t kv_cache_elements_per_token(const LlamaConfig& c) {
  int64_t elements = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) elements += 2 * c.kv_heads(l) * c.head_dim;  // K and V
  return elements;
}
}  // namespace

int64_t kv_cache_bytes_per_token(const LlamaConfig& c, torch::ScalarType dtype) {
  return kv_cache_elements_per_token(c) * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t kv_cache_bytes_per_token(const LlamaConfig& c) {
  return kv_cache_elements_per_token(c) * dtype_bytes(c.torch_dtype);
}

int64_t weight_bytes_per_decoded_token(const LlamaConfig& c, torch::ScalarType dtype) {
  const ParameterCount count = count_parameters(c);
  int64_t elements = count.total - count.embeddings + c.hidden_size;  // one embedding row
  if (c.tie_word_embeddings) elements += count.embeddings;  // the head reads the whole table
  return elements * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t weight_bytes_per_decoded_token(Llama& model) {
  const auto& table = model->embed_tokens->weight;
  if (!model->output_quantized.defined()) return weight_bytes_per_decoded_token(model->config(), table.scalar_type());
  // Quantized projections and head: the weights as held, of the embedding table one row (all of
  // it when the head reads the same blocks).
  const auto& blocks = model->embedding_quantized;
  if (!blocks.defined())
    return held_weight_bytes(model) - (table.numel() - table.size(1)) * static_cast<int64_t>(table.element_size());
  if (blocks.packed.is_same(model->output_quantized.packed)) return held_weight_bytes(model);
  return held_weight_bytes(model) - blocks.packed.numel() + blocks.packed.numel() / blocks.out_features;
}

int64_t first_latent_column(const TrainingMemoryOptions& options) {
  return options.first_latent < 0 ? options.tokens / 2 : options.first_latent;
}

// Activations, per position, of one decoder layer in training with bf16 autocast (D width, H/G
// heads, Dh head size, F MLP width, T positions; attention written out keeps every row's T scores):
// - each RMSNorm: its float32 input (pow and mul save it; for the first layer that is the
//   embeddings' output), the normalised float32 values (the gain's mul saves them), and the bf16
//   copy autocast makes for each projection that reads it (q, k, v: three; gate, up: two; each
//   saved by its matmul): 4D + 4D + 3 x 2D, then 4D + 4D + 2 x 2D;
// - q, k after RoPE: x and rotate_half(x) saved by the two muls, bf16: 2 (2 H Dh + 2 G Dh);
// - attention written out: its two matmuls run in bf16 under autocast, so they save bf16
//   casts of q, k, v and of the probabilities: 2 (H Dh + 2 G Dh) + 2 H T; softmax saves its
//   float32 output, 4 H T; o_proj saves the bf16 copy of the context, 2 H Dh;
//   With fused attention (what training runs, on a GPU and on the CPU) the kernel instead saves
//   q, the K/V repeated to the H heads and its output, bf16, and a float32 logsumexp per head:
//   4 x 2 H Dh + 4 H, no term in T (the CPU's kernel keeps K/V unrepeated in float32: within the
//   5% of the measured forward);
// - the MLP: gate (saved by SiLU), SiLU's output and up (saved by the product), the product (saved
//   by down_proj), bf16: 4 x 2F.
// Shared by the layers: the rotary tables, float32 cos and sin of the head size (8 Dh), which
// every layer saves (the checkpointed ones too). The head: the final norm (4D + 4D + 2D), and for
// each labelled position the float32 logits (training_loss returns them, so they live through
// backward) and cross-entropy's log-softmax, 2 x 4V. Checked against a measured forward
// (eval_cost_test.cpp).
TrainingMemory training_memory(const LlamaConfig& c, const TrainingMemoryOptions& options) {
  if (options.world_size < 1) throw std::invalid_argument("training memory: world size must be >= 1");
  if (options.zero_stage != 0 && options.zero_stage != 2)
    throw std::invalid_argument("training memory: ZeRO stage " + std::to_string(options.zero_stage) + " (the plan covers 0 and 2)");
  if (options.batch < 1 || options.tokens < 1)
    throw std::invalid_argument("training memory: batch and tokens must be >= 1");
  const ParameterCount count = count_parameters(c);
  TrainingMemory memory;
  const int64_t p = count.total, w = options.world_size;
  memory.parameters = p;
  // Autocast casts the matrices of the products: every layer's, and the head (the tied table's
  // when tied); the input lookup and the norms stay float32.
  int64_t cast_matrices = c.tie_word_embeddings ? count.embeddings : count.lm_head;
  for (const auto& layer : count.layers) cast_matrices += layer.attention() + layer.mlp();
  memory.weights = 4 * p;
  memory.autocast_weight_copies = 2 * cast_matrices;
  if (options.zero_stage == 2) {
    const int64_t shard = (p + w - 1) / w;
    memory.gradients = 4 * shard + 2 * 4 * std::min(options.bucket_elements, p);
    memory.optimizer_moments = 8 * shard;
    memory.master_copy = 4 * shard;
  } else {
    memory.gradients = 4 * p;
    memory.optimizer_moments = 8 * p;
  }
  const int64_t d = c.hidden_size, dh = c.head_dim, t = options.tokens;
  const int64_t labelled = options.labelled_tokens < 0 ? t : std::min(options.labelled_tokens, t);
  int64_t per_row = 0, largest_layer = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t h = c.heads(l), g = c.kv_heads(l), f = c.ffn(l);
    const int64_t attention = options.fused_attention ? 4 * 2 * h * dh + 4 * h : 2 * (h * dh + 2 * g * dh) + (2 + 4) * h * t;
    const int64_t per_position =
        (4 + 4 + 3 * 2) * d + (4 + 4 + 2 * 2) * d + 2 * (2 * h * dh + 2 * g * dh) + attention + 2 * h * dh + 8 * f;
    // Checkpointed, a layer keeps only its float32 input between forward and backward.
    per_row += options.activation_checkpointing ? 4 * d * t : per_position * t;
    largest_layer = std::max(largest_layer, per_position * t);
    if (l == 0) memory.activations_per_layer = per_position * t * options.batch;
  }
  if (options.activation_checkpointing) per_row += largest_layer;  // the layer backward is recomputing
  const int64_t head = 8 * dh * t + 10 * d * t + 8 * c.vocab_size * labelled;
  memory.activations_head = head * options.batch;
  const int64_t n = options.latent_thoughts, first = first_latent_column(options);
  if (n < 0 || (n > 0 && (first < 1 || first + n > t)))
    throw std::invalid_argument("training memory: " + std::to_string(n) + " thoughts from column " + std::to_string(first) +
                                " do not fit in " + std::to_string(t) + " tokens after at least one token");
  if (n > 0) {
    int64_t thought_columns = 0;  // over the thought passes, the columns each one's cache holds
    for (int64_t i = 1; i <= n; ++i) thought_columns += first + i;
    int64_t kv_width = 0, repeated_kv_width = 0;  // K and V of a column over all layers, in elements
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      kv_width += 2 * c.kv_heads(l) * dh;
      repeated_kv_width += 2 * c.heads(l) * dh;
    }
    // Pass 0's fused attention over the first columns keeps its own K/V as the per-position term
    // counts them (bf16, repeated to the query heads), then each thought pass its cache.
    memory.activations_thoughts =
        (2 * repeated_kv_width * first + options.thought_kv_bytes * kv_width * thought_columns) * options.batch;
  }
  memory.activations = (per_row + head) * options.batch + memory.activations_thoughts;
  return memory;
}

}  // namespace coconut
