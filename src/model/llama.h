// A decoder-only Llama faithful to Hugging Face `LlamaForCausalLM` numerics.
//
// Shape legend: B batch, T new positions, S cached + new positions, D hidden width, H query
// heads, G KV heads, R = H / G query heads per KV head, Dh head width, F MLP width, V vocab.
//
// Parameter names (the `name_table` in io/ maps HF names onto these, which are HF's without the
// leading "model."):
//   embed_tokens.weight                       [V, D]
//   layers.{l}.input_layernorm.weight         [D]
//   layers.{l}.self_attn.{q,k,v,o}_proj.weight  q [H*Dh, D], k/v [G*Dh, D], o [D, H*Dh] (+ .bias)
//   layers.{l}.post_attention_layernorm.weight [D]
//   layers.{l}.mlp.{gate,up}_proj.weight      [F, D], mlp.down_proj.weight [D, F] (+ .bias)
//   norm.weight                               [D]
//   lm_head.weight                            [V, D]  (absent when tie_word_embeddings)
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "model/config.h"
#include "model/kv_cache.h"
#include "model/quantized_linear.h"

namespace coconut {

torch::ScalarType dtype_from_name(const std::string& name);  // "float32" | "float16" | "bfloat16"
std::string dtype_name(torch::ScalarType dtype);

// Rotary embedding inverse frequencies [Dh/2] in float64, with the config's rope scaling applied
// (none, linear, llama3). Exposed for tests against the closed form.
torch::Tensor rope_inverse_frequencies(const LlamaConfig& config);

// How deep the one-position passes (continuous thoughts, decoded tokens) go: early exit and the
// depth router's gate. One value passed from the evaluation options down to the forward (eval ->
// EvalOptions -> GenerationOptions -> ForwardOptions::depth); the fields are explained there.
struct DepthPolicy {
  double exit_threshold = 0;      // early exit; 0 = off
  int64_t exit_min_layers = 1;    // early exit: layers every position runs
  double router_threshold = 0.5;  // depth router (models that have one); <= 0 = every layer

  // Every layer for every position: what multi-position calls (prompts) use.
  static DepthPolicy every_layer() { return {0, 1, 0}; }
};

struct ForwardOptions {
  // [B, T] with 1 for real tokens and 0 for padding (left padding). Empty = all real. With a
  // cache, the mask of earlier columns is remembered by the cache.
  torch::Tensor attention_mask;
  // [L, H] multipliers of each query head's output before o_proj (gradient importance, ablation).
  torch::Tensor head_mask;
  // [L, F_max] multipliers of each MLP channel, the activation silu(gate) * up, before down_proj
  // (channel importance; width pruning removes channels physically).
  torch::Tensor mlp_channel_mask;
  // Hears each layer's MLP activation silu(gate) * up [B, T, F] (channel statistics), after the mask.
  std::function<void(int64_t layer, const torch::Tensor& activation)> on_mlp_activation;
  // Layers to bypass (ablation scores only; pruning removes layers physically).
  std::set<int64_t> skip_layers;
  // Also return the residual stream: the input of every layer and the last layer's output
  // before the final norm (L + 1 tensors [B, T, D]).
  bool return_residuals = false;
  // Activation checkpointing: a layer keeps only its input for backward and runs its forward again
  // there (less memory, one more forward of every layer). Applies where gradients are recorded,
  // there is no KV cache (a cached pass writes K/V that later passes read) and no head or channel
  // mask or activation observer.
  bool checkpoint_layers = false;
  // Early exit (compute-adaptive depth) for calls of one new position per row (T == 1: a thought
  // or a decoded token; longer calls run every layer). After layer l, once l + 1 >= depth.exit_min_layers,
  // a row whose state moved by less than `depth.exit_threshold` in angular distance,
  // arccos(cos(x_l, x_{l+1})) / pi, stops there: its state passes through the remaining layers
  // unchanged and costs only their K/V projections. Those layers still get K/V columns for the
  // position, computed from the exit state (CALM's state propagation), so later positions attend
  // to it as usual. depth.exit_threshold 0 = off.
  //
  // Learned depth router (models whose config has depth_router). Layer l's gate reads the layer's
  // input x: p = sigmoid(w_l . x / rms(x) + b_l) [B, T]; a routed position runs the layer only when
  // p > depth.router_threshold, otherwise its state passes through unchanged. A skipped layer still
  // writes the position's K/V, projected from x: exactly the K/V the layer would have written,
  // because K/V read the layer's input, so later positions attend as if nothing was skipped and
  // the cost is the K/V projections. Routed positions: `route_mask` [B, T] (bool or 0/1), else
  // every position of a one-position call (thoughts, decoded tokens). depth.router_threshold <= 0
  // runs every layer without evaluating the gates. Layers before config.depth_router_first_layer
  // always run. Cannot be combined with early exit.
  DepthPolicy depth;
  torch::Tensor route_mask;
  // Per row, for a batch whose rows belong to different requests (a server's continuous batch):
  // `router_thresholds` [B] float replaces depth.router_threshold row by row (a row at <= 0 runs every
  // layer), and `router_max_layers` [B] int64 caps the layers each row runs in a one-position call
  // (a depth budget): once a row has run that many layers (routed or not), it skips every later
  // routed layer. Either one turns routing on for a model with a router.
  torch::Tensor router_thresholds;
  torch::Tensor router_max_layers;
  // Training: hard decisions with straight-through gradients. A routed position runs layer l when
  // sigmoid(logit + router_noise * logistic noise) > 0.5 (a Gumbel-sigmoid sample: with scale 1,
  // P(run) = p exactly); the output is x + gate * (layer(x) - x) with the hard gate forward and the
  // sigmoid's gradient backward. Returns ForwardResult::router_probabilities.
  bool router_straight_through = false;
  double router_noise = 1.0;
  // Stochastic depth in training (LayerDrop, LayerSkip): [B, L] bool or 0/1. Where row b's entry for
  // layer l is 0, the layer's output is dropped for that row: its state passes through unchanged,
  // as at test time when a sub-stack leaves the layer out; the layer still writes the row's K/V
  // (from its input, which dropping does not change). Every call of a training step (a Coconut
  // step's passes) takes the same mask, so an example sees one sub-stack throughout. Not with
  // the depth router or early exit. In inference (no gradient), a layer no row keeps does not run
  // at all and writes no K/V (rows that never run it never read them).
  torch::Tensor layer_keep;
  // A range of layers [first_layer, end_layer) (end_layer -1: to the last): the layers outside it
  // neither run nor write K/V. With first_layer k, inputs_embeds is the residual stream at layer k's
  // input (what an earlier call with end_layer k returned in `residuals`), and a cache must already
  // hold the columns of layers < k (a depth cascade continues a shallow prompt pass this way).
  // Every layer in the range runs: not with early exit, the depth router, layer_keep or skip_layers.
  int64_t first_layer = 0;
  int64_t end_layer = -1;
  // Only the columns from this one on need an output: `hidden` is then [B, T - first_output_column, D].
  // The last layer runs its queries, output projection and MLP on those columns alone (every column
  // still gets its K/V, which the kept columns read): exact, and a layer's work saved at each column
  // left out. Training passes the first column whose prediction has a label (a question's columns
  // pay for no loss). Where the last layer cannot run that way (early exit, the depth router,
  // layer_keep, an MLP observer, residuals asked for, a decoded position), the output is cut after it.
  int64_t first_output_column = 0;
};

// Whether callers ask for a later first_output_column on `device` (training's loss, generate's and
// the server's prompt passes): on the CPU; a GPU path stays as it was until a lease has compared
// the two (issue 70).
inline bool cuts_last_layer(torch::Device device) { return device.is_cpu(); }

struct ForwardResult {
  torch::Tensor hidden;                    // [B, T, D], after the final norm (columns from options.first_output_column)
  std::vector<torch::Tensor> residuals;    // L + 1 x [B, T, D] when requested (a layer range: its inputs, then its output)
  torch::Tensor layers_run;                // [B] int64: layers each row ran in full (early exit, router)
  torch::Tensor layers_skipped;            // [B, L] bool: which layers each row skipped (same calls)
  torch::Tensor router_probabilities;      // [B, T, L - first routed layer] gate probabilities (router_straight_through)
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t width, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// A low-rank (LoRA) update of one projection: y = x W^T + b + scale * (x A^T) B^T. Empty (a
// undefined) unless model/lora.h attached one; A and B are then parameters of the projection's
// Linear module, named `lora_A` / `lora_B`.
struct LowRankAdapter {
  torch::Tensor a;  // [r, K]
  torch::Tensor b;  // [N, r]
  double scale = 0;
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const LlamaConfig& config, int64_t layer);
  // x [B, T, D]; cos/sin [B, 1, T, Dh]; bias_mask [B, 1, T, S] additive (0 or -inf) or undefined.
  // Queries from column `first_query` on only (K/V from every column): returns [B, T - first_query, D].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias_mask, KVCache* cache, const torch::Tensor& head_scale,
                        int64_t first_query = 0);
  // Only this position's K/V of the (already normed) x, stored in the cache: what a layer that a
  // position skips by early exit still provides to later positions.
  void append_keys_values(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, KVCache& cache);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LowRankAdapter q_lora, k_lora, v_lora, o_lora;
  // Inference with quantized weights (model/quantize_model.h): where defined, the projection's
  // product uses these blocks and its Linear's weight is empty.
  QuantizedWeight q_quantized, k_quantized, v_quantized, o_quantized;
  // q, k and v in one product where their row counts allow (q/k/v_quantized are then its rows):
  // one quantization of x and one parallel region instead of three.
  QuantizedWeight qkv_quantized;
  int64_t layer, heads, kv_heads, head_dim;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const LlamaConfig& config, int64_t layer);
  // `channel_scale` [F] (optional) multiplies the activation silu(gate) * up, which `observe`
  // (optional) then hears.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& channel_scale = {},
                        const std::function<void(const torch::Tensor&)>& observe = {});
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  LowRankAdapter gate_lora, up_lora, down_lora;
  QuantizedWeight gate_quantized, up_quantized, down_quantized;  // as Attention's
  QuantizedWeight gate_up_quantized;                              // as Attention's qkv_quantized
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const LlamaConfig& config, int64_t layer);
  // x [B, T, D] -> [B, T - first_output_column, D]: the output of the columns from first_output_column.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias_mask, KVCache* cache, const torch::Tensor& head_scale,
                        const torch::Tensor& channel_scale = {},
                        const std::function<void(const torch::Tensor&)>& observe_mlp = {}, int64_t first_output_column = 0);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  torch::nn::Linear router{nullptr};  // [1, D] + bias when config.depth_router, else null
  // Gate logits of the depth router for x [B, T, D] -> [B, T] float32.
  torch::Tensor router_logits(const torch::Tensor& x);
};
TORCH_MODULE(DecoderLayer);

// While one lives (on this thread), the modules built here get uninitialized weights (torch::empty)
// instead of libtorch's random initialization: for loaders that overwrite every parameter (the
// random init of SmolLM2-135M took 0.47 s of a 1.1 s load).
class UninitializedWeights {
 public:
  UninitializedWeights();
  ~UninitializedWeights();
  UninitializedWeights(const UninitializedWeights&) = delete;
  UninitializedWeights& operator=(const UninitializedWeights&) = delete;
};

class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(LlamaConfig config);

  // Token ids [B, T] (int64) -> embeddings [B, T, D].
  torch::Tensor embed(const torch::Tensor& ids);
  // inputs_embeds [B, T, D]; positions [B, T] (int64). With a cache, attends to its earlier
  // columns too and appends this call's K/V.
  ForwardResult forward(const torch::Tensor& inputs_embeds, const torch::Tensor& positions,
                        KVCache* cache = nullptr, const ForwardOptions& options = {});
  // Convenience: ids [B, T] with positions 0..T-1 (offset by the cache length).
  ForwardResult forward_ids(const torch::Tensor& ids, KVCache* cache = nullptr, const ForwardOptions& options = {});
  // hidden [.., D] -> logits [.., V] in float32.
  torch::Tensor logits(const torch::Tensor& hidden);
  // A continuous thought: the last hidden state [.., D] -> the next input embedding [.., D]:
  // itself or, with config.latent_thought_input "expected_embedding", softmax(logits) @ the
  // embedding table; then rescaled to config.latent_thought_rms when that is set. Every place that
  // feeds a thought back calls this.
  torch::Tensor thought_input(const torch::Tensor& hidden);
  // Sets config.latent_thought_rms (training picks it from the embeddings; >= 0).
  void set_latent_thought_rms(double rms);
  // Sets config.latent_thought_input ("last_hidden" or "expected_embedding").
  void set_latent_thought_input(const std::string& input);

  const LlamaConfig& config() const { return config_; }
  torch::Tensor output_weight();  // lm_head.weight or embed_tokens.weight when tied

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings
  // The output head in blocks (model/quantize_model.h), used by `logits` where defined.
  QuantizedWeight output_quantized;
  // The embedding table in blocks (a GGUF file's own, model/quantize_model.h with_file_blocks),
  // where defined: `embed` then dequantizes the rows it looks up, and embed_tokens->weight is empty
  // (it keeps the model's dtype and device). With tied embeddings it shares output_quantized's bytes.
  QuantizedWeight embedding_quantized;

 private:
  LlamaConfig config_;
  torch::Tensor inverse_frequencies_;  // [Dh/2] float32 buffer
};
TORCH_MODULE(Llama);

// Standard initialisation for training from scratch (normal(0, std) weights, ones for norms).
void initialize_weights(Llama& model, double std, uint64_t seed);

// A loaded model made ready for inference on the CPU: every layer's q, k and v weights moved into
// one storage, one after another, and gate and up into another, the parameters becoming row ranges
// (views) of it with the same values; every other parameter that is a view of memory libtorch did
// not allocate (the loader's views of the mapped file) copied into memory of its own. Inference
// then runs each group as one product (one parallel region and one read of x, where it was three or
// two), as long as the weights stay adjacent: anything that replaces a parameter's data (a dtype or
// device change, surgery) only ends it, and the products run one by one again. The copies: the
// loader leaves float32 weights as views of the mapped file, whose pages decoded SmolLM2-135M 7-10%
// slower than the process's own memory on this project's Xeon VM (docs/real-models.md).
void pack_for_inference(Llama& model);
// Whether `layer`'s q|k|v, and its gate|up, lie packed (adjacent in one storage), so that inference
// runs each as one product (gate|up for one position at a time).
bool qkv_packed(DecoderLayerImpl& layer);
bool gate_up_packed(DecoderLayerImpl& layer);
// The packed weights themselves, [Nq + 2 Nkv, D] and [2F, D] within the shared storage, or undefined
// where the layer's are not packed.
torch::Tensor packed_qkv_weight(DecoderLayerImpl& layer);
torch::Tensor packed_gate_up_weight(DecoderLayerImpl& layer);

}  // namespace coconut
