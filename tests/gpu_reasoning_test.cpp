// CUDA against the CPU: one tiny model gives the same logits, the same greedy tokens (plain and
// with continuous thoughts) and the same Coconut training loss and gradients on both devices, and
// bf16 autocast on the GPU tracks float32. On the GPU attention over several positions is fused
// (causal calls without a mask, padded ones with it) and checkpointed layers carry no mask. Skipped, saying so, where no CUDA device exists (the
// CPU suite covers everything else); experiments/gpu.sh runs them on a GPU machine. Decoding replayed
// from a CUDA graph gives the eager tokens. Deferred weight gradients and the fused RMSNorm under
// autocast give the plain path's values.
#include <gtest/gtest.h>

#include <optional>

#include "data/sequences.h"
#include "model/autocast.h"
#include "model/cpu_linear.h"
#include "model/device.h"
#include "model/generate.h"
#include "model/lora.h"
#include "reasoning/training_loss.h"
#include "support/autograd_graph.h"
#include "support/tiny_model.h"

using namespace coconut;

namespace {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine"

// Two rows: question, <bot> (id 3), three thoughts, <eot> (id 4), then labelled tokens.
Batch coconut_batch() {
  std::vector<Sequence> rows;
  for (int64_t row = 0; row < 2; ++row) {
    Sequence sequence;
    for (int64_t i = 0; i < 4 + row; ++i) {
      sequence.ids.push_back(5 + (i + row) % 6);
      sequence.labels.push_back(kIgnoreLabel);
    }
    sequence.ids.push_back(3);
    sequence.labels.push_back(kIgnoreLabel);
    sequence.first_latent = static_cast<int64_t>(sequence.ids.size());
    sequence.latent_count = 3;
    for (int i = 0; i < 3; ++i) {
      sequence.ids.push_back(0);
      sequence.labels.push_back(kIgnoreLabel);
    }
    sequence.ids.push_back(4);
    sequence.labels.push_back(kIgnoreLabel);
    for (int64_t i = 0; i < 5; ++i) {
      sequence.ids.push_back(5 + (3 * i + row) % 6);
      sequence.labels.push_back(sequence.ids.back());
    }
    rows.push_back(sequence);
  }
  return collate(rows, 0);
}

// The gradients of every parameter, flattened into one CPU vector.
torch::Tensor flat_gradients(Llama& model) {
  std::vector<torch::Tensor> parts;
  for (const auto& parameter : model->parameters()) parts.push_back(parameter.grad().detach().to(torch::kCPU).flatten());
  return torch::cat(parts);
}

}  // namespace

// Host tensors reach the GPU through pinned memory and a non-blocking copy: the values arrive, also
// when the host tensor is changed right after the call (the pinned copy was taken at the call).
TEST(Cuda, HostToDeviceCopiesWithoutWaitingAndKeepsTheValues) {
  REQUIRE_CUDA();
  auto host = torch::arange(1000, torch::kInt64).view({10, 100});
  const auto expected = host.clone();
  auto on_device = host_to_device(host, torch::Device(torch::kCUDA));
  host.fill_(-1);
  EXPECT_TRUE(on_device.is_cuda());
  EXPECT_TRUE(torch::equal(on_device.cpu(), expected));
  EXPECT_TRUE(torch::equal(host_to_device(expected, torch::kCPU), expected));
}

TEST(Cuda, ForwardAndGreedyDecodingMatchTheCpu) {
  REQUIRE_CUDA();
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 7, 2, 6, 8}).view({1, 8});
  const auto cpu_logits = model->logits(model->forward_ids(ids).hidden);  // [1, 8, V]
  GenerationOptions options;
  options.max_new_tokens = 12;
  const auto cpu_tokens = generate(model, {{1, 5, 3, 9}, {2, 6}}, options).tokens;
  options.latent_thoughts = 3;
  options.after_latents = {4};
  const auto cpu_latent_tokens = generate(model, {{1, 5, 3, 9, 3}}, options).tokens;

  model->to(torch::kCUDA);
  const auto cuda_logits = model->logits(model->forward_ids(ids.to(torch::kCUDA)).hidden).to(torch::kCPU);
  EXPECT_TRUE(torch::allclose(cuda_logits, cpu_logits, 1e-4, 1e-4))
      << "max difference " << (cuda_logits - cpu_logits).abs().max().item<float>();
  options.latent_thoughts = 0;
  options.after_latents = {};
  EXPECT_EQ(generate(model, {{1, 5, 3, 9}, {2, 6}}, options).tokens, cpu_tokens);
  options.latent_thoughts = 3;
  options.after_latents = {4};
  EXPECT_EQ(generate(model, {{1, 5, 3, 9, 3}}, options).tokens, cpu_latent_tokens);
}

TEST(Cuda, CoconutLossAndGradientsMatchTheCpu) {
  REQUIRE_CUDA();
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->train();
  const Batch batch = coconut_batch();
  auto cpu = training_loss(model, batch, torch::kCPU, false);
  cpu.loss.backward();
  const auto cpu_gradients = flat_gradients(model);

  model->to(torch::kCUDA);
  model->zero_grad();
  auto cuda = training_loss(model, batch, torch::kCUDA, false);
  cuda.loss.backward();
  EXPECT_NEAR(cuda.loss.item<double>(), cpu.loss.item<double>(), 1e-5);
  const auto cuda_gradients = flat_gradients(model);
  EXPECT_TRUE(torch::allclose(cuda_gradients, cpu_gradients, 1e-4, 1e-5))
      << "max difference " << (cuda_gradients - cpu_gradients).abs().max().item<float>();
}

TEST(Cuda, Bf16AutocastTracksFloat32) {
  REQUIRE_CUDA();
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->to(torch::kCUDA);
  model->train();
  const Batch batch = coconut_batch();
  auto f32 = training_loss(model, batch, torch::kCUDA, false);
  f32.loss.backward();
  const auto f32_gradients = flat_gradients(model);
  model->zero_grad();
  torch::Tensor loss;
  {
    AutocastScope autocast(true, torch::kCUDA);
    loss = training_loss(model, batch, torch::kCUDA, false).loss;
  }
  loss.backward();
  const auto bf16_gradients = flat_gradients(model);
  // bf16 keeps 8 bits of mantissa: the loss within 2%, the gradient direction within cos 0.99.
  EXPECT_NEAR(loss.item<double>(), f32.loss.item<double>(), 0.02 * f32.loss.item<double>());
  EXPECT_GT(torch::cosine_similarity(bf16_gradients, f32_gradients, 0).item<double>(), 0.99);
  for (const auto& parameter : model->parameters()) EXPECT_EQ(parameter.scalar_type(), torch::kFloat32);
}

// The GPU's fused attention: a causal forward with no padding (no mask: the flash path) and a
// left-padded one (the additive mask) give the CPU's logits at the real positions; with activation
// checkpointing (the maskless form crosses the autograd function) the loss and gradients are those
// of a stored forward on the GPU.
TEST(Cuda, FusedAttentionAndCheckpointedLayersMatch) {
  REQUIRE_CUDA();
  const auto config = coconut::testing::tiny_config();
  auto model = coconut::testing::tiny_model(config);
  model->eval();
  const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10, 4, 8}).view({2, 6});
  ForwardOptions padded;
  padded.attention_mask = torch::tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}).view({2, 6});
  torch::Tensor cpu_plain, cpu_padded;
  {
    torch::NoGradGuard no_grad;
    cpu_plain = model->logits(model->forward_ids(ids, nullptr, ForwardOptions()).hidden);
    cpu_padded = model->logits(model->forward_ids(ids, nullptr, padded).hidden);
  }
  model->to(torch::kCUDA);
  ForwardOptions padded_cuda = padded;
  padded_cuda.attention_mask = padded.attention_mask.to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    const auto plain = model->logits(model->forward_ids(ids.to(torch::kCUDA), nullptr, ForwardOptions()).hidden).cpu();
    const auto masked = model->logits(model->forward_ids(ids.to(torch::kCUDA), nullptr, padded_cuda).hidden).cpu();
    EXPECT_TRUE(torch::allclose(plain, cpu_plain, 1e-4, 1e-5)) << (plain - cpu_plain).abs().max().item<float>();
    // Row 1's two padded positions are free to differ; its real ones and row 0 are not.
    const auto real = padded.attention_mask.to(torch::kBool);
    EXPECT_TRUE(torch::allclose(masked.index({real}), cpu_padded.index({real}), 1e-4, 1e-5))
        << (masked.index({real}) - cpu_padded.index({real})).abs().max().item<float>();
  }
  model->train();
  std::vector<torch::Tensor> gradients[2];
  double losses[2];
  for (int run = 0; run < 2; ++run) {
    model->zero_grad();
    ForwardOptions options;
    options.checkpoint_layers = run == 1;
    const auto gpu_ids = ids.to(torch::kCUDA);
    const auto logits = model->logits(model->forward_ids(gpu_ids, nullptr, options).hidden);  // [2, 6, V]
    const auto loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, 5).reshape({-1, config.vocab_size}),
                                                           gpu_ids.narrow(1, 1, 5).reshape({-1}));
    loss.backward();
    losses[run] = loss.item<double>();
    gradients[run].push_back(flat_gradients(model));
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-6);
  EXPECT_TRUE(torch::allclose(gradients[0][0], gradients[1][0], 1e-4, 1e-6))
      << (gradients[0][0] - gradients[1][0]).abs().max().item<float>();
}

// Decode steps replayed from one captured CUDA graph give the tokens of eager decoding: greedy and
// seeded sampling, a left-padded batch (its mask is one tensor for every replay), and after
// continuous thoughts.
TEST(Cuda, CudaGraphDecodingEqualsEagerDecoding) {
  REQUIRE_CUDA();
  auto model = coconut::testing::tiny_model(coconut::testing::tiny_config());
  model->to(torch::kCUDA);
  model->eval();
  for (const bool sample : {false, true}) {
    GenerationOptions eager;
    eager.max_new_tokens = 20;
    if (sample) {
      eager.sampling.temperature = 0.8;
      eager.sampling.seed = 7;
    }
    GenerationOptions replayed = eager;
    replayed.cuda_graph = true;
    const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9}, {2, 6}};
    const auto expected = generate(model, prompts, eager);
    const auto got = generate(model, prompts, replayed);
    EXPECT_EQ(got.tokens, expected.tokens) << (sample ? "sampled" : "greedy");
    EXPECT_EQ(got.decode_steps, expected.decode_steps);
    eager.latent_thoughts = replayed.latent_thoughts = 3;
    eager.after_latents = replayed.after_latents = {4};
    EXPECT_EQ(generate(model, {{1, 5, 3, 9, 3}}, replayed).tokens, generate(model, {{1, 5, 3, 9, 3}}, eager).tokens)
        << (sample ? "sampled" : "greedy") << ", after thoughts";
  }
}


// Deferred weight gradients on the GPU under bf16 autocast (written on 2026-11-26 without a GPU):
// the products read autocast's own cached cast through the gathering node (one cast node in the
// graph with a plain product beside them), and the weight and input gradients are the plain
// path's within bf16 rounding. RMSNorm's fused CUDA kernel under autocast gives the written-out
// form's values.
TEST(Cuda, DeferredWeightGradientsAndFusedNormUnderAutocast) {
  REQUIRE_CUDA();
  torch::manual_seed(5);
  const auto options = torch::TensorOptions().device(torch::kCUDA);
  const auto source_weight = torch::randn({32, 32}, options), source_x = torch::randn({4, 32}, options);
  torch::Tensor gradients[2][2];
  for (int defer = 0; defer < 2; ++defer) {
    auto weight = source_weight.clone().requires_grad_(true);
    auto x = source_x.clone().requires_grad_(true);
    torch::Tensor loss;
    {
      AutocastScope autocast(true, torch::kCUDA);
      const auto plain = dense(x, weight);  // as pass 0 of a Coconut step
      torch::Tensor chained;
      {
        std::optional<DeferredWeightGradients> deferral;
        if (defer) deferral.emplace();
        chained = dense(torch::tanh(dense(plain, weight)), weight);  // as two thought passes
      }
      loss = chained.to(torch::kFloat32).pow(2).sum();
      // Casts: the weight's one, x's, and the loss's widening; a second cast of the weight makes 4.
      EXPECT_EQ(coconut::testing::count_graph_nodes(loss, "ToCopyBackward"), 3) << "defer " << defer;
      EXPECT_EQ(coconut::testing::count_graph_nodes(loss, "GatherWeightGradient"), defer);
    }
    loss.backward();
    gradients[defer][0] = weight.grad().cpu();
    gradients[defer][1] = x.grad().cpu();
  }
  for (int i = 0; i < 2; ++i) {
    const double scale = gradients[0][i].abs().max().item<double>();
    EXPECT_LE((gradients[1][i] - gradients[0][i]).abs().max().item<double>(), 3e-2 * scale) << (i == 0 ? "weight" : "input");
  }
  RMSNorm norm(32, 1e-5);
  norm->to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  const auto x = torch::randn({3, 5, 32}, options).requires_grad_(true);
  torch::Tensor fused;
  {
    AutocastScope autocast(true, torch::kCUDA);
    fused = norm(x);
  }
  const auto written_out = norm->weight * (x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5));
  EXPECT_EQ(fused.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::allclose(fused, written_out, 1e-5, 1e-6))
      << "max difference " << (fused - written_out).abs().max().item<double>();
}

// The step's paths a lease compares (recipes/step_paths.h) on the GPU, before its training jobs run
// them (experiments/gpu_smollm2.sh runs these tests first and compares nothing if they fail): under
// bf16 autocast with LoRA and two trained token rows, the frozen base in bf16 gives the same loss
// and gradients bit for bit, and the last-layer cut and the chunked loss the same within bf16's
// rounding.
TEST(Cuda, StepPathsComputeTheSameStep) {
  REQUIRE_CUDA();
  auto model = coconut::testing::tiny_model(coconut::testing::small_gqa_config(64));
  model->to(torch::kCUDA);
  model->train();
  LoraOptions lora;
  lora.rank = 2;
  attach_lora(model, lora, 3);
  train_token_rows(model, {3, 4});
  coconut::testing::randomize_adapters(model, 0.1);  // B away from zero: the adapters take part
  const Batch batch = coconut_batch();
  struct Step {
    torch::Tensor loss, gradients;
  };
  const auto step = [&](const LossPaths& paths) {
    model->zero_grad();
    Step result;
    {
      AutocastScope autocast(true, torch::kCUDA);
      result.loss = training_loss(model, batch, torch::kCUDA, false, {}, paths).loss;
      result.loss.backward();
    }
    std::vector<torch::Tensor> parts;
    for (const auto& parameter : model->parameters())
      if (parameter.requires_grad()) parts.push_back(parameter.grad().detach().to(torch::kCPU).flatten());
    result.gradients = torch::cat(parts);
    result.loss = result.loss.detach().to(torch::kCPU);
    return result;
  };
  const Step old = step(LossPaths{false, false});
  const auto close = [&](const Step& other, const char* what) {
    EXPECT_NEAR(other.loss.item<double>(), old.loss.item<double>(), 1e-2 * old.loss.item<double>()) << what;
    EXPECT_GT(torch::cosine_similarity(other.gradients, old.gradients, 0).item<double>(), 0.999) << what;
  };
  close(step(LossPaths{true, false}), "cut");
  close(step(LossPaths{false, true}), "chunked loss");
  FrozenBase frozen(model);
  frozen.keep_only(true);
  const Step bf16_base = step(LossPaths{false, false});
  EXPECT_TRUE(torch::equal(bf16_base.loss, old.loss));
  EXPECT_TRUE(torch::equal(bf16_base.gradients, old.gradients))
      << "max difference " << (bf16_base.gradients - old.gradients).abs().max().item<float>();
  close(step(LossPaths{true, true}), "all three");
}
