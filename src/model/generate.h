// Token generation with a KV cache: prefill the prompts once, then one position per new token.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "model/llama.h"

namespace coconut {

struct SamplingOptions {
  double temperature = 0.0;  // 0 = greedy (argmax)
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off (nucleus sampling)
  uint64_t seed = 0;
};

// One prompt's state after its first `layers` layers: what a deeper pass over the same prompt
// continues from without running those layers again (a depth cascade: shallow first, deeper only
// where the shallow answer is not confident).
struct PromptPrefix {
  int64_t layers = 0;
  torch::Tensor residual;                   // [T, D]: the input of layer `layers` at each prompt position
  std::vector<torch::Tensor> keys, values;  // per layer < `layers`: [G, T, Dh] (the cache's dtype)
};

// Halting (Coconut): how many thoughts each row takes, decided per row. After thoughts[i] thoughts
// (each but the last) a row peeks: the tokens after the thoughts, then its first `peek_tokens`
// answer tokens (0: the whole answer). Where the lowest probability among them is above
// `confidence`, the row halts: that answer goes on to its end and the row takes no more thoughts;
// else the peek is undone (the cache rewound to the thoughts) and it thinks on. A row that never
// halts answers after the last count, which GenerationOptions::latent_thoughts must equal.
// Confidence 1: no row halts before the last count; 0: every row at the first.
struct ThoughtHalting {
  std::vector<int64_t> thoughts;  // ascending, from 0
  double confidence = 0;
  int64_t peek_tokens = 0;
  bool active() const { return !thoughts.empty(); }
};

// A peek that did not halt its row: after `thoughts` thoughts, the tokens it read and their
// probabilities.
struct ThoughtPeek {
  int64_t thoughts = 0;
  std::vector<int64_t> tokens;
  std::vector<double> probabilities;
};

struct GenerationOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<int64_t> stop_ids;  // generation of a row ends after it emits one of these
  // Coconut: after the prompt, this many continuous thoughts (each feeds the previous position's
  // last hidden state back as the next input embedding), then the `after_latents` tokens (e.g.
  // <|end-latent|>) as one forward, then decoding. The prompt should end with <|start-latent|>.
  int64_t latent_thoughts = 0;
  std::vector<int64_t> after_latents;
  // Latent bottleneck (a model trained with it): after the thoughts, the prompt but its last
  // token (<|start-latent|>) is hidden from every later position; the answer reads the thoughts.
  bool latent_bottleneck = false;
  // Early exit and the depth router's gate in the one-position passes (thoughts and decoded
  // tokens); the prompt and the tokens after the thoughts run every layer. See ForwardOptions.
  DepthPolicy depth;
  // A KV cache of fixed shapes (KVCache::fixed): every decode step sees the same tensor shapes and
  // synchronises with the device only to read its sampled tokens: the path a CUDA graph replays.
  bool fixed_cache = false;
  // Decode steps replay one CUDA graph captured at the first step (model/cuda_graph.h): implies the
  // fixed cache; a CUDA device, every layer (no early exit or router in the decode steps). The
  // prompt, the thoughts and the tokens after them run as usual.
  bool cuda_graph = false;
  // Run only the first `layers` layers in every pass, prompt included (0 = all): a prefix of the
  // model, as the model with the others removed but sharing its weights and cache layout.
  int64_t layers = 0;
  // Continue each prompt from its prefix (one per prompt, all of the same depth, shallower than
  // `layers`): the prompt's layers below it are not run again, their K/V come from the prefix.
  std::vector<PromptPrefix> prompt_prefixes;
  // Return each prompt's PromptPrefix at `layers` (GenerationResult::prompt_prefixes).
  bool keep_prompt_prefixes = false;
  // Layers no pass runs, prompt included: the model without them (the same answers and cost as the
  // model `prune --drop-layers` writes), sharing its weights. Every other layer runs: not with
  // `layers`, prompt prefixes, early exit, the depth router or the fixed cache.
  std::set<int64_t> skip_layers;
  // Record the probability of each generated token under the logits it was picked from.
  bool record_probabilities = false;
  // Thoughts per row, decided by peeking at the answer (see ThoughtHalting): not with early exit,
  // the depth router, the fixed cache or the latent bottleneck (a rewound peek cannot un-hide the
  // prompt).
  ThoughtHalting halting;
  // What each continuous thought feeds back, replaced (the thought controls of
  // reasoning/thought_control.h): called before thought `thought` (0-based) runs with the last hidden
  // state it comes from [B, 1, D] and the input the model made of it (LlamaImpl::thought_input,
  // [B, 1, D]); returns the input to feed instead [B, 1, D]. Empty: the model's own.
  std::function<torch::Tensor(int64_t thought, const torch::Tensor& hidden, const torch::Tensor& input)> replace_thought;
};

// One one-position pass of a row under early exit or the depth router.
struct AdaptivePass {
  int64_t context = 0;                  // positions attended to (this one and every earlier real one)
  int64_t layers_run = 0;
  std::vector<int64_t> skipped_layers;  // ascending
};

struct GenerationResult {
  std::vector<std::vector<int64_t>> tokens;  // new tokens per prompt (stop token included)
  int64_t prefill_tokens = 0;                // real prompt tokens processed
  int64_t decode_steps = 0;                  // one-position forward passes after the prefill (halting: peeks too)
  int64_t latent_steps = 0;                  // continuous thoughts (one-position passes each)
  // With early exit or a depth router: per prompt, each one-position pass it took part in
  // (thoughts, then decoded tokens that were fed back).
  std::vector<std::vector<AdaptivePass>> exits;
  std::vector<PromptPrefix> prompt_prefixes;            // keep_prompt_prefixes: one per prompt
  std::vector<std::vector<double>> token_probabilities;  // record_probabilities: one per new token
  // Halting: per row, the thoughts it took before its answer and the peeks it undid on the way.
  std::vector<int64_t> thoughts_taken;
  std::vector<std::vector<ThoughtPeek>> undone_peeks;
};

// An answer's confidence, as a depth cascade and halting read it: the lowest of its first `first`
// token probabilities (all of them at 0); 1 when there are none.
double lowest_probability(const std::vector<double>& probabilities, int64_t first = 0);

// Picks the next token of each row from logits [B, V] (float32). Greedy when temperature is 0.
std::vector<int64_t> sample_next_tokens(const torch::Tensor& logits, const SamplingOptions& options, std::mt19937_64& rng);

// Batched generation: prompts of different lengths are left-padded; finished rows stop
// contributing tokens (they still occupy a row of the batch).
GenerationResult generate(Llama& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options);

}  // namespace coconut
