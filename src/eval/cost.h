// Exact cost accounting from a LlamaConfig alone (no tensors, no weights): parameters, FLOPs per
// token, KV-cache bytes, weight bytes read per decoded token. Per-layer head and MLP sizes (pruned
// models) included: every per-layer quantity reads config.heads(l), kv_heads(l), ffn(l).
//
// Legend: L layers, D hidden_size, V vocab_size, Dh head_dim, H(l) query heads, G(l) KV heads,
// F(l) MLP width, N context (positions a token attends to, itself included).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"

namespace coconut {

struct LayerParameterCount {
  int64_t q = 0, k = 0, v = 0, o = 0;  // weights + biases of each projection
  int64_t gate = 0, up = 0, down = 0;  // weights + biases of each MLP matrix
  int64_t norms = 0;                   // input_layernorm + post_attention_layernorm
  int64_t router = 0;                  // the depth router's gate [1, D] + bias (config.depth_router)
  int64_t attention() const { return q + k + v + o; }
  int64_t mlp() const { return gate + up + down; }
  int64_t total() const { return attention() + mlp() + norms + router; }
};

// Tied head: HF's num_parameters() counts a shared matrix once, so with tie_word_embeddings the
// [V, D] table is counted under `embeddings` and `lm_head` is 0. non_embedding = total minus the
// input embedding table; for a tied model that removes the head's matrix too (it is the same one).
struct ParameterCount {
  int64_t embeddings = 0;  // the input table [V, D]
  std::vector<LayerParameterCount> layers;
  int64_t final_norm = 0;
  int64_t lm_head = 0;  // [V, D]; 0 when tied to the embeddings
  int64_t total = 0;
  int64_t non_embedding = 0;  // total - embeddings (HF num_parameters(exclude_embeddings=True))
};

ParameterCount count_parameters(const LlamaConfig& config);

// FLOPs of a forward pass, 2 FLOPs per multiply-accumulate, split by where they are spent.
// Counted: the q/k/v/o projections, attention scores Q K^T and the weighted sum P V, the three MLP
// matrices and the lm_head. Not counted (elementwise, O(D) or O(H N) per token, well under 1%):
// RMSNorms, RoPE, softmax, SiLU and the gate product, residual adds, bias adds.
struct FlopsBreakdown {
  double projections = 0, attention = 0, mlp = 0, head = 0;
  double total() const { return projections + attention + mlp + head; }
};
inline constexpr const char* kFlopsNotCounted =
    "RMSNorms, RoPE, softmax, SiLU and gate product, residual adds, bias adds (elementwise)";

// One token that attends to `context` positions (the context-th token of a sequence), with its
// logits. Derivation in cost.cpp.
FlopsBreakdown flops_per_token(const LlamaConfig& config, int64_t context);

// A forward over a whole sequence of `tokens` tokens (prefill / training forward): token t = 1..N
// attends to t positions. Logits at every position when `all_logits` (training, scoring), else only
// at the last one (prefill before generation).
FlopsBreakdown prefill_flops(const LlamaConfig& config, int64_t tokens, bool all_logits = false);
double prefill_flops_total(const LlamaConfig& config, int64_t tokens, bool all_logits = false);
// prefill_flops(...).total() / tokens: the average cost of one token of that sequence.
double average_prefill_flops_per_token(const LlamaConfig& config, int64_t tokens, bool all_logits = false);

// One answer: the prompt's prefill (P tokens, logits at the last one), then `latent_steps`
// continuous thoughts (each one position without logits, Coconut; with latent_thought_input
// "expected_embedding" each also pays a head and a [V] x [V, D] product), then `new_tokens` generated
// tokens. Token i of the answer is read from the logits of the position before it, so the n tokens
// need n heads and n - 1 decode steps (the last token is never fed back). With a KV cache each
// step attends to every earlier position and itself.
// `layers` > 0: only the model's first `layers` layers run, for everything (a prefix of it).
FlopsBreakdown generation_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t new_tokens,
                                int64_t latent_steps = 0, int64_t layers = 0);

// Layers [first, end) alone over `tokens` positions at contexts 1..tokens, without logits: what a
// prefix of the model spends on a prompt, or what a shallower pass leaves to a deeper one.
FlopsBreakdown layers_prefill_flops(const LlamaConfig& config, int64_t tokens, int64_t first, int64_t end);

// One level of a depth cascade at `layers`, continuing from a prompt already run through its first
// `previous_layers` (0 for the first level): generation_flops at that depth (`prompt_tokens`: the
// prompt and the tokens after the thoughts) less the prompt's (`prompt_only` tokens) layers below
// previous_layers, which the level does not run again.
double cascade_level_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t prompt_only, int64_t new_tokens,
                           int64_t latent_steps, int64_t layers, int64_t previous_layers);
// One level of a layer-set cascade: generation_flops of the model without the layers `removed`
// (each layer keeps its own sizes), the whole question run again.
double layer_set_flops(const LlamaConfig& config, const std::vector<int64_t>& removed, int64_t prompt_tokens, int64_t new_tokens,
                       int64_t latent_steps);

// A peek halting undid (model/generate.h's ThoughtHalting): after `latent_steps` thoughts, the tokens
// after them and `new_tokens` answer tokens read (their heads; all but the last fed back). What
// generation_flops counts for the whole answer (`prompt_tokens`: the prompt and the tokens after
// the thoughts) less the prompt (`prompt_only` tokens) and the thoughts, which the row keeps.
double undone_peek_flops(const LlamaConfig& config, int64_t prompt_tokens, int64_t prompt_only, int64_t new_tokens,
                         int64_t latent_steps);

// What one position at `context` saves by early exit after its first `layers_run` layers: each
// later layer's projections, attention and MLP, less the K/V projections it still computes for
// later positions (ForwardOptions::exit_threshold).
double early_exit_savings(const LlamaConfig& config, int64_t context, int64_t layers_run);
// What one position at `context` saves by skipping `layer` (early exit or the depth router): the
// layer's q/o projections, attention and MLP; its K/V projections still run.
double skipped_layer_savings(const LlamaConfig& config, int64_t context, int64_t layer);
// The depth router's gates for one routed position: a [1, D] projection per layer it reaches.
double router_gate_flops(const LlamaConfig& config, int64_t layers_reached);

// Bytes of one element of "float32", "float16" or "bfloat16" (throws on any other name).
int64_t dtype_bytes(const std::string& dtype);

// KV-cache bytes per token: 2 (K and V) * sum_l G(l) * Dh * bytes(dtype).
int64_t kv_cache_bytes_per_token(const LlamaConfig& config, torch::ScalarType dtype);
// Same, in the config's own torch_dtype.
int64_t kv_cache_bytes_per_token(const LlamaConfig& config);

// Weight bytes one decoded token reads: every matrix of every layer, norms, the head (the whole
// [V, D] matrix) and one embedding row.
int64_t weight_bytes_per_decoded_token(const LlamaConfig& config, torch::ScalarType dtype);
// The same for a model as it is held, quantized projections (model/quantize_model.h) included.
int64_t weight_bytes_per_decoded_token(Llama& model);


// Memory of one training rank, as this trainer lays it out: float32 weights, bf16 autocast of the
// matrix products (its cache keeps a bf16 copy of every weight matrix for the whole step), AdamW
// (two float32 moments), data parallelism over `world_size` ranks with ZeRO stage 0 or 2
// (distributed/zero.h: ZeRO-2 keeps the moments, a float32 master copy and the averaged gradients
// of 1/W of the parameters; the padding of each bucket to a multiple of W, under W values, is left
// out). Activations are those saved for backward by a forward over `batch` x `tokens` positions,
// counted tensor by tensor from the model code (derivation in cost.cpp); the head's logits for
// `labelled_tokens` positions per row (training_loss computes logits only where a label is). A
// Coconut step with thoughts keeps about the same (each thought is one position of the same
// sequence).
struct TrainingMemoryOptions {
  int64_t world_size = 1;
  int64_t zero_stage = 0;          // 0 or 2
  int64_t batch = 1;               // rows per micro-batch on a rank
  int64_t tokens = 1024;           // positions per row
  int64_t labelled_tokens = -1;    // positions per row with a label (-1: all)
  int64_t bucket_elements = int64_t{1} << 24;  // ZeRO-2: gradients of one bucket in flight
  // Activation checkpointing: each layer keeps its float32 input; one layer's activations at a time
  // exist again while backward recomputes it.
  bool activation_checkpointing = false;
  // Fused attention, as training runs on a GPU and on the CPU (model/llama.cpp): the kernel keeps
  // q, the K/V (repeated to the query heads on a GPU), its output and one float32 logsumexp per
  // head and position, not the T x T scores and probabilities of attention written out (false).
  bool fused_attention = true;
  // Coconut: n thoughts from column `first_latent` (-1: the middle of the row). The passes before
  // the last keep the K/V they attended over: pass 0 those of its first_latent columns (as the
  // fused term counts K/V), and thought pass i the whole cache of every layer as it was then (K
  // and V, [G, S, Dh] a row, S = first_latent + i), in `thought_kv_bytes` a value: 2 where
  // autocast's bf16 casts are what the products save (a GPU), 4 on the CPU, whose attention runs
  // in float32. Every column's own activations are already counted among the T positions.
  int64_t latent_thoughts = 0;
  int64_t first_latent = -1;
  int64_t thought_kv_bytes = 2;
};
struct TrainingMemory {
  int64_t parameters = 0;
  int64_t weights = 0;                  // float32, every rank
  int64_t autocast_weight_copies = 0;   // bf16 copies of the weight matrices (not the norms)
  int64_t gradients = 0;                // ZeRO-0: float32, all; ZeRO-2: the shard + one bucket in flight (+ its staging copy)
  int64_t optimizer_moments = 0;        // AdamW exp_avg + exp_avg_sq, float32 (sharded under ZeRO-2)
  int64_t master_copy = 0;              // ZeRO-2: float32 values of the shard
  int64_t activations = 0;              // saved for backward, one micro-batch
  int64_t activations_per_layer = 0;
  int64_t activations_head = 0;         // rotary tables, final norm, logits and log-softmax
  int64_t activations_thoughts = 0;     // the K/V caches the thought passes keep (in `activations`)
  int64_t total() const {
    return weights + autocast_weight_copies + gradients + optimizer_moments + master_copy + activations;
  }
};
TrainingMemory training_memory(const LlamaConfig& config, const TrainingMemoryOptions& options);
// The column of the first thought the plan counts with: first_latent, or mid-row where it is -1.
int64_t first_latent_column(const TrainingMemoryOptions& options);

}  // namespace coconut
