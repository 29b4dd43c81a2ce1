// Cost accounting against published parameter counts of public models, a hand count of a pruned
// config, and FLOPs against an independent count of the multiply-accumulates of the naive loops;
// the training memory plan against the published 8B count and a measured forward's activations.
#include <gtest/gtest.h>

#include <cstdio>

#include "eval/cost.h"
#include "model/autocast.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "support/heap.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {
LlamaConfig fixture(const std::string& name) {
  return load_config(std::string(COCONUT_SOURCE_DIR) + "/tests/fixtures/configs/" + name + ".json");
}
}  // namespace

// Totals as published for each model (HF num_parameters(), tied matrices counted once).
TEST(CostParameters, PublicModelsExactTotals) {
  EXPECT_EQ(count_parameters(fixture("llama-3.2-1b")).total, 1235814400);
  EXPECT_EQ(count_parameters(fixture("llama-3.2-3b")).total, 3212749824);
  EXPECT_EQ(count_parameters(fixture("llama-7b")).total, 6738415616);
  EXPECT_EQ(count_parameters(fixture("llama-3.1-8b")).total, 8030261248);
  EXPECT_EQ(count_parameters(load_config(coconut::testing::test_data("tokenizers/llama3/config.json"))).total, 1235814400);
}

TEST(CostParameters, Llama32OneBAttentionPerLayerIsTenMillion) {
  const auto count = count_parameters(fixture("llama-3.2-1b"));
  // q 2048x2048 + k 512x2048 + v 512x2048 + o 2048x2048 (GQA: 8 KV heads), not 4 x 2048^2.
  EXPECT_EQ(count.layers[0].attention(), 10485760);
  EXPECT_NE(count.layers[0].attention(), 12582912);
  EXPECT_EQ(count.non_embedding, 1235814400 - 128256LL * 2048);
  EXPECT_EQ(count.lm_head, 0);  // tied: the shared matrix is counted once, as embeddings
  // Untied: non-embedding keeps the head. LLaMA-7B: 6,738,415,616 - 32000 x 4096.
  const auto llama7b = count_parameters(fixture("llama-7b"));
  EXPECT_EQ(llama7b.lm_head, 32000LL * 4096);
  EXPECT_EQ(llama7b.non_embedding, 6607343616);
  EXPECT_EQ(llama7b.layers[31].attention(), 4LL * 4096 * 4096);
  EXPECT_EQ(llama7b.layers[31].mlp(), 3LL * 4096 * 11008);
}

TEST(CostParameters, CountEqualsTheModelsOwnParameters) {
  auto config = coconut::testing::tiny_config();
  config.tie_word_embeddings = false;
  config.attention_bias = true;
  config.mlp_bias = true;
  config.layer_num_attention_heads = {4, 2};
  config.layer_num_key_value_heads = {2, 1};
  config.layer_intermediate_size = {24, 7};
  config.validate();
  Llama model(config);
  int64_t actual = 0;
  for (const auto& parameter : model->parameters()) actual += parameter.numel();
  EXPECT_EQ(count_parameters(config).total, actual);
  // Hand sum of the pruned layer 1: q 2*4x16 (+8), k/v 1*4x16 (+4 each), o 16x8 (+16),
  // MLP 7x16 (+7) twice and 16x7 (+16), norms 2x16.
  const int64_t layer1 = (128 + 8) + (64 + 4) * 2 + (128 + 16) + (112 + 7) * 2 + (112 + 16) + 32;
  EXPECT_EQ(count_parameters(config).layers[1].total(), layer1);
}

TEST(CostKVCache, Llama32ThreeBFloat16) {
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-3.2-3b"), torch::kFloat16), 114688);
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-3.2-1b"), torch::kBFloat16), 2 * 16 * 8 * 64 * 2);
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-3.2-1b"), torch::kFloat32), 65536);
  // In the config's own dtype: the 7B file says float16 (32 layers x 32 KV heads x 128 x 2 x 2 bytes).
  EXPECT_EQ(kv_cache_bytes_per_token(fixture("llama-7b")), 524288);
}

TEST(CostKVCache, PerLayerKeyValueHeads) {
  auto config = coconut::testing::tiny_config();
  config.layer_num_attention_heads = {4, 2};
  config.layer_num_key_value_heads = {2, 1};
  config.torch_dtype = "float32";
  config.validate();
  // K and V: (2 + 1) KV heads x head_dim 4 x 2 x 4 bytes.
  EXPECT_EQ(kv_cache_bytes_per_token(config), 96);
  EXPECT_EQ(kv_cache_bytes_per_token(config, torch::kBFloat16), 48);
  EXPECT_EQ(dtype_bytes("bfloat16"), 2);
  EXPECT_THROW(dtype_bytes("float64"), std::invalid_argument);
}

// Independent count: the multiply-accumulates of the naive forward loops for one token at
// context N (matvec rows x cols per weight, dh per score and per weighted value).
TEST(CostFlops, MatchesMultiplyAccumulateCountOfNaiveLoops) {
  auto config = coconut::testing::tiny_config();
  config.layer_num_attention_heads = {4, 2};
  config.layer_num_key_value_heads = {2, 2};
  config.layer_intermediate_size = {24, 9};
  config.validate();
  const int64_t context = 13, width = 16, dh = config.head_dim;
  int64_t macs = 0;
  for (int64_t l = 0; l < 2; ++l) {
    const int64_t heads = config.heads(l), groups = config.kv_heads(l), f = config.ffn(l);
    macs += heads * dh * width + 2 * groups * dh * width + width * heads * dh;  // q, k, v, o
    macs += heads * context * dh * 2;                                          // scores, weighted sum
    macs += 3 * f * width;
  }
  macs += config.vocab_size * width;
  EXPECT_DOUBLE_EQ(flops_per_token(config, context).total(), 2.0 * static_cast<double>(macs));
  // A prefill of N tokens is the sum over contexts 1..N (logits at the last only).
  double sum = 0;
  for (int64_t t = 1; t <= context; ++t) sum += flops_per_token(config, t).total() - flops_per_token(config, t).head;
  sum += flops_per_token(config, 1).head;
  EXPECT_DOUBLE_EQ(prefill_flops_total(config, context), sum);
}

// Hand computation for the tiny config (D 16, 4 heads, 2 KV heads, Dh 4, F 24, V 11, 2 layers,
// untied), written out as numbers rather than through the formula's structure.
TEST(CostFlops, TinyConfigByHand) {
  const auto config = coconut::testing::tiny_config();
  ASSERT_EQ(config.head_dim, 4);
  // Per layer at context 5: q 16x16 + k 8x16 + v 8x16 + o 16x16 = 768 MACs -> 1536 FLOPs;
  // scores + weighted sum 2 x 4 heads x 4 x 5 = 160 MACs -> 320; MLP 3 x 24 x 16 = 1152 MACs -> 2304.
  // Head 11 x 16 = 176 MACs -> 352.
  const FlopsBreakdown flops = flops_per_token(config, 5);
  EXPECT_DOUBLE_EQ(flops.projections, 2 * 1536);
  EXPECT_DOUBLE_EQ(flops.attention, 2 * 320);
  EXPECT_DOUBLE_EQ(flops.mlp, 2 * 2304);
  EXPECT_DOUBLE_EQ(flops.head, 352);
  EXPECT_DOUBLE_EQ(flops.total(), 8672);

  // Prefill of 3 tokens: 3 x (1536 + 2304) x 2 layers = 23040, attention 64 per context unit per
  // layer x (1 + 2 + 3) x 2 layers = 768, one head 352 (or three with all logits).
  EXPECT_DOUBLE_EQ(prefill_flops_total(config, 3), 23040 + 768 + 352);
  EXPECT_DOUBLE_EQ(prefill_flops_total(config, 3, true), 23040 + 768 + 3 * 352);
  EXPECT_DOUBLE_EQ(average_prefill_flops_per_token(config, 3, true), (23040 + 768 + 3 * 352) / 3.0);
  EXPECT_THROW(average_prefill_flops_per_token(config, 0), std::invalid_argument);

  // An answer: prompt 3, one latent thought, 2 new tokens. Fed positions: 3 prompt + 1 latent + 1
  // generated token fed back = contexts 1..5: 5 x 7680 + 128 x 15; two heads.
  EXPECT_DOUBLE_EQ(generation_flops(config, 3, 2, 1).total(), 5 * 7680 + 128 * 15 + 2 * 352);
  EXPECT_DOUBLE_EQ(generation_flops(config, 3, 2, 1).head, 2 * 352);
  // Thoughts fed back as expected embeddings: each pays a head and the same products again.
  auto mixing = config;
  mixing.latent_thought_input = "expected_embedding";
  EXPECT_DOUBLE_EQ(generation_flops(mixing, 3, 2, 1).total(), 5 * 7680 + 128 * 15 + 2 * 352 + 2 * 352);
  EXPECT_DOUBLE_EQ(generation_flops(mixing, 3, 2, 0).total(), generation_flops(config, 3, 2, 0).total());
  // No new tokens: the prompt's forward only, no head; one new token: the prefill as usual.
  EXPECT_DOUBLE_EQ(generation_flops(config, 3, 0).total(), 23040 + 768);
  EXPECT_DOUBLE_EQ(generation_flops(config, 3, 1).total(), prefill_flops_total(config, 3));
  EXPECT_THROW(generation_flops(config, -1, 1), std::invalid_argument);
}

// Generation equals the step-by-step sum of per-token FLOPs at growing context (a KV cache).
TEST(CostFlops, GenerationIsTheSumOfItsSteps) {
  const auto config = fixture("llama-3.2-1b");
  const int64_t prompt = 37, latent = 4, generated = 25;
  double steps = 0;
  int64_t context = 0;
  for (int64_t t = 0; t < prompt + latent; ++t) {
    const FlopsBreakdown step = flops_per_token(config, ++context);
    steps += step.total() - step.head;
  }
  steps += flops_per_token(config, context).head;  // the first generated token
  for (int64_t t = 1; t < generated; ++t) steps += flops_per_token(config, ++context).total();
  EXPECT_DOUBLE_EQ(generation_flops(config, prompt, generated, latent).total(), steps);
}

// flops_per_token = 2 x (matrix weights used, the [V, D] head included even when tied)
//                   + 4 x N x sum_l H(l) Dh, from the parameter count (no biases in these models).
TEST(CostFlops, TwiceTheMatrixWeightsPlusAttention) {
  for (const char* name : {"llama-3.2-1b", "llama-3.2-3b", "llama-7b", "llama-3.1-8b"}) {
    const auto config = fixture(name);
    const auto count = count_parameters(config);
    int64_t norms = count.final_norm, query_width = 0;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      norms += count.layers[static_cast<size_t>(l)].norms;
      query_width += config.heads(l) * config.head_dim;
    }
    const int64_t head = config.vocab_size * config.hidden_size;
    const int64_t matrix_weights = count.total - norms - count.embeddings - count.lm_head + head;
    for (int64_t context : {1, 100, 2048}) {
      const double expected = 2.0 * static_cast<double>(matrix_weights) + 4.0 * static_cast<double>(context * query_width);
      EXPECT_DOUBLE_EQ(flops_per_token(config, context).total(), expected) << name << " at context " << context;
    }
  }
}

TEST(CostFlops, Llama32OneBAtContext2048) {
  // 2 x 1,235,746,816 matrix weights (total minus 33 norms of 2048) + 4 x 2048 x 2048 x 16 layers.
  EXPECT_DOUBLE_EQ(flops_per_token(fixture("llama-3.2-1b"), 2048).total(), 2739929088.0);
  const auto flops = flops_per_token(fixture("llama-3.2-1b"), 2048);
  // 2 x (matrix weights of the layers) + 4 x (32 heads x 64) x 2048 context x 16 layers + 2 x V x D.
  EXPECT_DOUBLE_EQ(flops.projections + flops.mlp, 2.0 * 16 * (10485760 + 50331648));
  EXPECT_DOUBLE_EQ(flops.attention, 4.0 * (32 * 64) * 2048 * 16);
  EXPECT_DOUBLE_EQ(flops.head, 2.0 * 128256 * 2048);
}

TEST(EarlyExitCost, SavingsAreTheSkippedLayersLessTheirKeysAndValues) {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 4;
  config.validate();
  EXPECT_EQ(coconut::early_exit_savings(config, 9, 4), 0.0);
  // Running no layer in full saves the whole per-token cost except the head and every K/V projection.
  const auto whole = coconut::flops_per_token(config, 9);
  const double kv = 4 * 2.0 * 2.0 * config.kv_heads(0) * config.head_dim * config.hidden_size;
  EXPECT_DOUBLE_EQ(coconut::early_exit_savings(config, 9, 0), whole.total() - whole.head - kv);
  EXPECT_DOUBLE_EQ(coconut::early_exit_savings(config, 9, 2), coconut::early_exit_savings(config, 9, 0) / 2);  // uniform layers
  EXPECT_THROW(coconut::early_exit_savings(config, 9, 5), std::invalid_argument);
}

namespace {
// A pruned model's config: 3 layers whose heads, KV heads and MLP widths differ.
coconut::LlamaConfig three_uneven_layers() {
  auto config = coconut::testing::tiny_config();
  config.num_hidden_layers = 3;
  config.layer_num_attention_heads = {4, 2, 4};
  config.layer_num_key_value_heads = {2, 1, 2};
  config.layer_intermediate_size = {24, 24, 8};
  config.validate();
  return config;
}
}  // namespace

TEST(EarlyExitCost, ASkippedLayerSavesItsOwnShareOfAPrunedModel) {
  // Per-layer sizes differ: skipping layer l saves what layer l costs, less its K/V projections.
  const auto config = three_uneven_layers();
  double sum = 0;
  for (int64_t layer = 0; layer < 3; ++layer) {
    const double width = config.hidden_size, q = config.heads(layer) * config.head_dim;
    const double expected = 2 * 2 * q * width + 2 * 2 * q * 7 + 2 * 3 * config.ffn(layer) * width;
    EXPECT_DOUBLE_EQ(coconut::skipped_layer_savings(config, 7, layer), expected) << layer;
    sum += expected;
  }
  EXPECT_DOUBLE_EQ(coconut::early_exit_savings(config, 7, 0), sum);
  EXPECT_DOUBLE_EQ(coconut::early_exit_savings(config, 7, 2), coconut::skipped_layer_savings(config, 7, 2));
  EXPECT_THROW(coconut::skipped_layer_savings(config, 7, 3), std::invalid_argument);
  EXPECT_DOUBLE_EQ(coconut::router_gate_flops(config, 3), 2.0 * config.hidden_size * 3);
}

TEST(LayerRangeCost, EachLayersShareOfAPrefillByNaiveLoops) {
  // Per-layer sizes differ: a range costs its own layers' projections, attention and MLP at every
  // context 1..T (no head); ranges add up to the whole prefill less its one head.
  const auto config = three_uneven_layers();
  const int64_t tokens = 9;
  const auto naive = [&](int64_t first, int64_t end) {
    double flops = 0;
    for (int64_t context = 1; context <= tokens; ++context)
      for (int64_t layer = first; layer < end; ++layer) {
        const double width = config.hidden_size, q = config.heads(layer) * config.head_dim, kv = config.kv_heads(layer) * config.head_dim;
        flops += 2 * (2 * q * width + 2 * kv * width) + 2 * 2 * q * context + 2 * 3 * config.ffn(layer) * width;
      }
    return flops;
  };
  for (int64_t first = 0; first <= 3; ++first)
    for (int64_t end = first; end <= 3; ++end)
      EXPECT_DOUBLE_EQ(coconut::layers_prefill_flops(config, tokens, first, end).total(), naive(first, end)) << first << ".." << end;
  const auto whole = coconut::prefill_flops(config, tokens);
  EXPECT_DOUBLE_EQ(coconut::layers_prefill_flops(config, tokens, 0, 1).total() + coconut::layers_prefill_flops(config, tokens, 1, 3).total(),
                   whole.total() - whole.head);
  // A prefix's generation: the whole model's less the layers above it at every fed position
  // (7 prompt tokens, 2 thoughts, 3 new tokens of which 2 are fed back).
  EXPECT_DOUBLE_EQ(coconut::generation_flops(config, 7, 3, 2, 2).total(),
                   coconut::generation_flops(config, 7, 3, 2).total() -
                       coconut::layers_prefill_flops(config, 7 + 2 + 2, 2, 3).total());
  EXPECT_DOUBLE_EQ(coconut::generation_flops(config, 7, 3, 2, 3).total(), coconut::generation_flops(config, 7, 3, 2).total());
  EXPECT_THROW(coconut::generation_flops(config, 7, 3, 2, 4), std::invalid_argument);
  EXPECT_THROW(coconut::layers_prefill_flops(config, tokens, 2, 4), std::invalid_argument);
  EXPECT_THROW(coconut::layers_prefill_flops(config, tokens, 2, 1), std::invalid_argument);
}

TEST(ParameterCount, CountsTheDepthRouterGates) {
  auto config = coconut::testing::tiny_config();
  config.depth_router = true;
  config.layer_num_attention_heads = {4, 2};  // non-uniform as well
  config.layer_num_key_value_heads = {2, 1};
  config.layer_intermediate_size = {24, 24};
  config.validate();
  coconut::Llama model(config);
  int64_t numel = 0;
  for (const auto& parameter : model->parameters()) numel += parameter.numel();
  const auto count = coconut::count_parameters(config);
  EXPECT_EQ(count.total, numel);
  EXPECT_EQ(count.layers[0].router, config.hidden_size + 1);
}

// The training memory plan of Llama-3.1-8B on 8 ranks with ZeRO-2, against the published
// parameter count: float32 weights everywhere, moments and master values in eighths.
TEST(TrainingMemory, Llama31EightBOnEightRanksWithZeroTwo) {
  const LlamaConfig config = fixture("llama-3.1-8b");
  TrainingMemoryOptions options;
  options.world_size = 8;
  options.zero_stage = 2;
  options.batch = 1;
  options.tokens = 1024;
  const TrainingMemory memory = training_memory(config, options);
  const int64_t p = 8030261248, embeddings = 128256LL * 4096, norms = 65LL * 4096;
  EXPECT_EQ(memory.parameters, p);
  EXPECT_EQ(memory.weights, 4 * p);
  EXPECT_EQ(memory.optimizer_moments, 8 * (p / 8));  // 8,030,261,248 = 8 x 1,003,782,656
  EXPECT_EQ(memory.master_copy, 4 * (p / 8));
  EXPECT_EQ(memory.gradients, 4 * (p / 8) + 8 * (int64_t{1} << 24));
  // Every matrix but the input embeddings (the head is its own matrix in 8B) gets a bf16 copy.
  EXPECT_EQ(memory.autocast_weight_copies, 2 * (p - embeddings - norms));
  // Unsharded, the same rank needs 12 bytes more per parameter than it holds in weights: no 80 GB GPU.
  options.zero_stage = 0;
  const TrainingMemory whole = training_memory(config, options);
  EXPECT_EQ(whole.gradients + whole.optimizer_moments, 12 * p);
  EXPECT_GT(whole.total(), int64_t{80} * 1000 * 1000 * 1000);
  EXPECT_LT(memory.total(), int64_t{80} * 1000 * 1000 * 1000);
  EXPECT_EQ(memory.activations, whole.activations);  // sharding leaves activations alone
}

// Fused attention (the GPU's forward) keeps nothing of size T x T: its activations grow linearly
// with the sequence, where the written-out attention's grow faster (its scores and probabilities).
TEST(TrainingMemory, FusedAttentionKeepsNoScores) {
  const LlamaConfig config = fixture("llama-3.2-1b");
  TrainingMemoryOptions options;
  options.batch = 2;
  options.fused_attention = true;
  options.tokens = 512;
  const int64_t fused_512 = training_memory(config, options).activations;
  options.tokens = 1024;
  const int64_t fused_1024 = training_memory(config, options).activations;
  EXPECT_EQ(fused_1024, 2 * fused_512);
  options.fused_attention = false;
  const int64_t eager_1024 = training_memory(config, options).activations;
  options.tokens = 512;
  const int64_t eager_512 = training_memory(config, options).activations;
  EXPECT_GT(eager_1024, 2 * eager_512);
  // The scores' share at 1,024 tokens: 32 heads x 6 bytes x 1,024 per position and layer, against
  // the fused kernel's 8 x 32 x 64 + 4 x 32 bytes (and the written-out path's own bf16 q, k, v copies).
  const int64_t heads = 32, head_dim = 64, kv_heads = 8, layers = 16, rows_positions = 2 * 1024;
  const int64_t written_out = 2 * (heads * head_dim + 2 * kv_heads * head_dim) + 6 * heads * 1024;
  const int64_t fused = 8 * heads * head_dim + 4 * heads;
  EXPECT_EQ(eager_1024 - fused_1024, layers * rows_positions * (written_out - fused));
}

// Activations: the estimate against what a training forward of this model code actually keeps
// alive on the CPU (glibc's heap in use before and after; the forward's graph and the logits held
// as training_loss holds them), bf16 autocast; with activation checkpointing too (layer inputs
// only, measured after forward, before backward recomputes any layer). Counting the attention's
// products in float32 (as this CPU path computes them without autocast) misses by 13%.
TEST(TrainingMemory, ActivationsMatchAMeasuredForward) {
  if (!coconut::testing::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's heap counters read 0";
  const LlamaConfig config = coconut::testing::small_gqa_config(256);
  const int64_t batch = 4, tokens = 192;
  torch::manual_seed(0);
  Llama model(config);
  model->train();
  const auto ids = torch::randint(0, config.vocab_size, {batch, tokens + 1}, torch::kInt64);  // [B, T + 1]
  using coconut::testing::heap_in_use;
  for (const bool checkpointing : {false, true}) {
    ForwardOptions forward_options;
    forward_options.checkpoint_layers = checkpointing;
    // A first step fills what libraries keep once allocated (kernel and primitive caches); the
    // second is measured.
    {
      AutocastScope autocast(true, torch::kCPU);
      auto logits = model->logits(model->forward_ids(ids.narrow(1, 0, tokens), nullptr, forward_options)
                                      .hidden.reshape({-1, config.hidden_size}));
      torch::nn::functional::cross_entropy(logits, ids.narrow(1, 1, tokens).reshape({-1})).backward();
    }
    int64_t measured = 0;
    {
      AutocastScope autocast(true, torch::kCPU);
      const int64_t before = heap_in_use();
      auto hidden = model->forward_ids(ids.narrow(1, 0, tokens), nullptr, forward_options).hidden;  // [B, T, D]
      auto logits = model->logits(hidden.reshape({-1, config.hidden_size}));  // [B T, V] float32
      hidden = torch::Tensor();
      auto loss = torch::nn::functional::cross_entropy(logits, ids.narrow(1, 1, tokens).reshape({-1}));
      measured = heap_in_use() - before;
    }
    TrainingMemoryOptions options;
    options.batch = batch;
    options.tokens = tokens;
    options.activation_checkpointing = checkpointing;
    const TrainingMemory estimate = training_memory(config, options);
    // After forward no layer is being recomputed yet: the plan's one recomputed layer is not there.
    const double recomputing = checkpointing ? static_cast<double>(estimate.activations_per_layer) : 0.0;
    // On the CPU the layers also keep the additive causal mask (a GPU's causal kernel needs none):
    // one [T, T] float32 storage, expanded over rows and heads.
    const double cpu_mask = 4.0 * tokens * tokens;
    const double expected = static_cast<double>(estimate.activations + estimate.autocast_weight_copies) - recomputing + cpu_mask;
    std::printf("checkpointing %d: measured / estimated activations %.3f\n", checkpointing, static_cast<double>(measured) / expected);
    EXPECT_NEAR(static_cast<double>(measured) / expected, 1.0, 0.05)
        << "checkpointing " << checkpointing << ": measured " << measured << " bytes, estimated " << expected
        << " (activations " << estimate.activations << ", autocast copies " << estimate.autocast_weight_copies << ")";
  }
}
