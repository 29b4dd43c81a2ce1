// CUDA against the CPU: one tiny model gives the same logits, the same greedy tokens (plain and
// with continuous thoughts) and the same Coconut training loss and gradients on both devices, and
// bf16 autocast on the GPU tracks float32. Skipped, saying so, where no CUDA device exists (the
// CPU suite covers everything else); experiments/gpu.sh runs them on a GPU machine.
#include <gtest/gtest.h>

#include "data/sequences.h"
#include "model/autocast.h"
#include "model/generate.h"
#include "reasoning/training_loss.h"
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
