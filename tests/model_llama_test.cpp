// The libtorch Llama against an independent naive implementation (scalar loops in float64),
// KV-cache decoding against full recomputation, and llama3 RoPE against its closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/autocast.h"
#include "model/cpu_linear.h"
#include "model/generate.h"
#include "model/llama.h"
#include "support/autograd_graph.h"
#include "support/heap.h"
#include "support/tiny_model.h"

using namespace coconut;
using coconut::testing::tiny_config;
using coconut::testing::tiny_model;

namespace {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

Matrix to_matrix(const torch::Tensor& tensor) {
  auto t = tensor.to(torch::kFloat64).contiguous();
  if (t.dim() == 1) t = t.unsqueeze(0);
  Matrix m(t.size(0), std::vector<double>(t.size(1)));
  const double* data = t.data_ptr<double>();
  for (int64_t i = 0; i < t.size(0); ++i)
    for (int64_t j = 0; j < t.size(1); ++j) m[i][j] = data[i * t.size(1) + j];
  return m;
}

std::vector<double> matvec(const Matrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.size(), 0.0);
  for (size_t i = 0; i < w.size(); ++i)
    for (size_t j = 0; j < x.size(); ++j) y[i] += w[i][j] * x[j];
  return y;
}

// y = W x + b, b read from the layer when it has one (attention_bias / mlp_bias).
std::vector<double> affine(const torch::nn::Linear& layer, const std::vector<double>& x) {
  auto y = matvec(to_matrix(layer->weight), x);
  if (layer->bias.defined()) {
    const auto bias = to_matrix(layer->bias)[0];
    for (size_t i = 0; i < y.size(); ++i) y[i] += bias[i];
  }
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& weight, double eps) {
  double mean_square = 0;
  for (double v : x) mean_square += v * v;
  mean_square /= static_cast<double>(x.size());
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = weight[i] * x[i] / std::sqrt(mean_square + eps);
  return y;
}

// Closed form of the llama3 rope scaling, written from the formula (not from the model code).
std::vector<double> closed_form_inverse_frequencies(const LlamaConfig& c) {
  std::vector<double> result;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    double frequency = 1.0 / std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    if (c.rope_scaling.type == "llama3") {
      const auto& s = c.rope_scaling;
      const double wavelength = 2 * M_PI / frequency;
      const double low_wavelength = s.original_max_position_embeddings / s.low_freq_factor;
      const double high_wavelength = s.original_max_position_embeddings / s.high_freq_factor;
      if (wavelength < high_wavelength) {
        // high frequencies: unchanged
      } else if (wavelength > low_wavelength) {
        frequency /= s.factor;
      } else {
        const double smooth = (s.original_max_position_embeddings / wavelength - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        frequency = (1 - smooth) * frequency / s.factor + smooth * frequency;
      }
    }
    result.push_back(frequency);
  }
  return result;
}

// Naive forward of one sequence: returns logits [T][V] in float64.
Matrix naive_logits(Llama& model, const std::vector<int64_t>& ids) {
  const LlamaConfig& c = model->config();
  const auto frequencies = closed_form_inverse_frequencies(c);
  const Matrix embedding = to_matrix(model->embed_tokens->weight);
  const int64_t time = static_cast<int64_t>(ids.size()), dh = c.head_dim, half = dh / 2;
  Matrix x;
  for (int64_t id : ids) x.push_back(embedding[id]);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto layer = model->layers[l]->as<DecoderLayer>();
    const auto attention_norm = to_matrix(layer->input_layernorm->weight)[0];
    const auto mlp_norm = to_matrix(layer->post_attention_layernorm->weight)[0];
    const auto& attention = layer->self_attn;
    const auto& mlp = layer->mlp;
    const int64_t heads = c.heads(l), groups = c.kv_heads(l);
    Matrix q(time), k(time), v(time);
    for (int64_t t = 0; t < time; ++t) {
      const auto n = rms_norm(x[t], attention_norm, c.rms_norm_eps);
      q[t] = affine(attention->q_proj, n);
      k[t] = affine(attention->k_proj, n);
      v[t] = affine(attention->v_proj, n);
      auto rotate = [&](std::vector<double>& vec, int64_t count) {
        for (int64_t h = 0; h < count; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(t) * frequencies[i];
            const double a = vec[h * dh + i], b = vec[h * dh + i + half];
            vec[h * dh + i] = a * std::cos(angle) - b * std::sin(angle);
            vec[h * dh + i + half] = b * std::cos(angle) + a * std::sin(angle);
          }
      };
      rotate(q[t], heads);
      rotate(k[t], groups);
    }
    for (int64_t t = 0; t < time; ++t) {
      std::vector<double> context(heads * dh, 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / (heads / groups);
        std::vector<double> scores(t + 1);
        double largest = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < dh; ++i) dot += q[t][h * dh + i] * k[s][g * dh + i];
          scores[s] = dot / std::sqrt(static_cast<double>(dh));
          largest = std::max(largest, scores[s]);
        }
        double total = 0;
        for (auto& score : scores) total += (score = std::exp(score - largest));
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < dh; ++i) context[h * dh + i] += scores[s] / total * v[s][g * dh + i];
      }
      const auto attended = affine(attention->o_proj, context);
      for (size_t i = 0; i < attended.size(); ++i) x[t][i] += attended[i];
      const auto n = rms_norm(x[t], mlp_norm, c.rms_norm_eps);
      auto gate = affine(mlp->gate_proj, n);
      const auto up = affine(mlp->up_proj, n);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const auto down = affine(mlp->down_proj, gate);
      for (size_t i = 0; i < down.size(); ++i) x[t][i] += down[i];
    }
  }
  const auto final_norm = to_matrix(model->norm->weight)[0];
  const Matrix head = to_matrix(model->output_weight());
  Matrix logits;
  for (int64_t t = 0; t < time; ++t) logits.push_back(matvec(head, rms_norm(x[t], final_norm, c.rms_norm_eps)));
  return logits;
}

double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST(LlamaRope, Llama3FrequenciesMatchClosedForm) {
  auto config = tiny_config();
  config.head_dim = 32;  // enough frequencies to cover all three bands
  config.hidden_size = 128;
  config.validate();
  const auto expected = closed_form_inverse_frequencies(config);
  const auto actual = rope_inverse_frequencies(config);
  int bands[3] = {0, 0, 0};
  for (size_t i = 0; i < expected.size(); ++i) {
    const double value = actual[static_cast<int64_t>(i)].item<double>();
    // float32 evaluation of pow/divisions: relative error a few ulp (2^-23 ~ 1.2e-7).
    EXPECT_NEAR(value, expected[i], 1e-6 * expected[i]) << "frequency " << i;
    const double wavelength = 2 * M_PI / expected[i];
    bands[wavelength < 16 ? 0 : (wavelength > 64 ? 2 : 1)]++;  // high, medium, low frequencies
  }
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0);
  EXPECT_GT(bands[2], 0);
}

TEST(LlamaRope, Llama32ConfigFrequenciesMatchClosedForm) {
  LlamaConfig config;  // Llama-3.2-1B rope settings
  config.hidden_size = 2048;
  config.intermediate_size = 8192;
  config.num_attention_heads = 32;
  config.num_key_value_heads = 8;
  config.vocab_size = 128256;
  config.rope_theta = 500000.0;
  config.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
  config.validate();
  const auto expected = closed_form_inverse_frequencies(config);
  const auto actual = rope_inverse_frequencies(config);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual[static_cast<int64_t>(i)].item<double>(), expected[i], 1e-6 * expected[i]) << i;
}

TEST(LlamaForward, MatchesNaiveFloat64Loops) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  const std::vector<int64_t> ids = {1, 5, 3, 9, 0, 7, 2};
  torch::NoGradGuard no_grad;
  auto logits = model->logits(model->forward_ids(torch::tensor(ids).view({1, -1})).hidden)[0];  // [T, V]
  const auto reference = naive_logits(model, ids);
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t v = 0; v < config.vocab_size; ++v)
      worst = std::max(worst, std::abs(logits[t][v].item<double>() - reference[t][v]));
  // float32 forward vs float64 loops: logits are O(1..10); a few hundred float32 roundings of
  // O(1) values stay below 1e-4 absolute.
  std::printf("max |libtorch - naive| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
}

TEST(LlamaForward, UntiedHeadAndBiasesMatchNaive) {
  auto config = tiny_config(false);
  config.tie_word_embeddings = false;
  config.attention_bias = true;  // q/k/v/o biases
  config.mlp_bias = true;        // gate/up/down biases
  config.validate();
  auto model = tiny_model(config, 11);
  const std::vector<int64_t> ids = {4, 4, 8, 1};
  torch::NoGradGuard no_grad;
  // initialize_weights zeroes biases: give every one random values, of the weights' scale.
  int64_t biases = 0;
  for (auto& named : model->named_parameters())
    if (named.key().size() > 5 && named.key().compare(named.key().size() - 5, 5, ".bias") == 0) {
      named.value().normal_(0.0, 0.3);
      ++biases;
    }
  EXPECT_EQ(biases, 7 * config.num_hidden_layers);  // q, k, v, o, gate, up, down in every layer
  auto logits = model->logits(model->forward_ids(torch::tensor(ids).view({1, -1})).hidden)[0];
  const auto reference = naive_logits(model, ids);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t v = 0; v < config.vocab_size; ++v) EXPECT_NEAR(logits[t][v].item<double>(), reference[t][v], 1e-4);
}

TEST(LlamaKVCache, DecodeEqualsFullRecompute) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10}).view({1, -1});
  auto full = model->logits(model->forward_ids(ids).hidden);  // [1, T, V]
  KVCache cache = KVCache::preallocated(config, 1, 16, torch::kFloat32, torch::kCPU);
  auto prefix = model->logits(model->forward_ids(ids.narrow(1, 0, 4), &cache).hidden);
  EXPECT_LT(max_abs_difference(prefix, full.narrow(1, 0, 4)), 1e-5);
  for (int64_t t = 4; t < ids.size(1); ++t) {
    auto step = model->logits(model->forward_ids(ids.narrow(1, t, 1), &cache).hidden);  // [1, 1, V]
    // Same float32 arithmetic in a different order (1 column vs all columns): 1e-5 absolute.
    EXPECT_LT(max_abs_difference(step, full.narrow(1, t, 1)), 1e-5) << "position " << t;
  }
  EXPECT_EQ(cache.length(), ids.size(1));
}

// The fixed-shape cache (what a CUDA graph replays): every call sees all `capacity` columns and
// the whole mask, and the logits are those of the preallocated cache (masked columns weigh 0).
TEST(LlamaKVCache, FixedCacheSeesEveryColumnAndDecodesAsThePreallocatedOne) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10}).view({1, -1});
  KVCache grown = KVCache::preallocated(config, 1, 16, torch::kFloat32, torch::kCPU);
  KVCache fixed = KVCache::fixed(config, 1, 16, torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(fixed.has_fixed_shapes());
  EXPECT_FALSE(grown.has_fixed_shapes());
  const auto prefix_grown = model->logits(model->forward_ids(ids.narrow(1, 0, 4), &grown).hidden);
  const auto prefix_fixed = model->logits(model->forward_ids(ids.narrow(1, 0, 4), &fixed).hidden);
  EXPECT_LT(max_abs_difference(prefix_grown, prefix_fixed), 1e-6);
  for (int64_t t = 4; t < ids.size(1); ++t) {
    const auto a = model->logits(model->forward_ids(ids.narrow(1, t, 1), &grown).hidden);  // [1, 1, V]
    const auto b = model->logits(model->forward_ids(ids.narrow(1, t, 1), &fixed).hidden);
    EXPECT_LT(max_abs_difference(a, b), 1e-6) << "position " << t;
  }
  EXPECT_EQ(fixed.length(), ids.size(1));
  // The shapes one decode step meets do not depend on how far the sequence is.
  KVCache cache = KVCache::fixed(config, 2, 8, torch::kFloat32, torch::kCPU);
  const auto ones = torch::ones({2, 1}, torch::kBool);
  const auto k = torch::randn({2, config.num_key_value_heads, 1, config.head_dim});  // [B, G, 1, Dh]
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(cache.append_key_mask(ones).sizes(), torch::IntArrayRef({2, 8}));
    const auto [keys, values] = cache.append(0, k * static_cast<double>(step + 1), k);
    EXPECT_EQ(keys.sizes(), torch::IntArrayRef({2, config.num_key_value_heads, 8, config.head_dim}));
    EXPECT_TRUE(torch::equal(keys.narrow(2, step, 1), k * static_cast<double>(step + 1)));  // written at its column
    cache.advance(1);
  }
  EXPECT_TRUE(torch::equal(cache.new_columns(2, torch::kCPU), torch::tensor(std::vector<int64_t>{3, 4}).view({1, 2})));
  cache.truncate(1);
  EXPECT_TRUE(torch::equal(cache.new_columns(1, torch::kCPU), torch::tensor(std::vector<int64_t>{1}).view({1, 1})));
}

TEST(LlamaKVCache, GrowingCacheEqualsFullRecompute) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2}).view({1, -1});
  auto full = model->logits(model->forward_ids(ids).hidden);
  KVCache cache = KVCache::growing(config);
  auto first = model->logits(model->forward_ids(ids.narrow(1, 0, 5), &cache).hidden);
  auto rest = model->logits(model->forward_ids(ids.narrow(1, 5, 2), &cache).hidden);
  EXPECT_LT(max_abs_difference(torch::cat({first, rest}, 1), full), 1e-5);
}

// Inference attention over a pass longer than the decode kernels take (16 rows) runs block by block
// against the keys each block sees (on AVX-512 or BLAS, the training kernel's forward; elsewhere
// blocks of 64 rows): a left-padded 150-token batch against the recorded (training) pass, a second
// pass of 120 columns over 30 cached ones against the whole pass, and the prompt's last column
// alone (first_output_column, as generate's prompt pass) against the whole pass's.
TEST(LlamaForward, LongPassesInQueryBlocksAgreeWithTheRecordedPassAndTheCache) {
  auto config = tiny_config();
  config.max_position_embeddings = 256;
  auto model = tiny_model(config);
  torch::manual_seed(13);
  const int64_t columns = 150, padding = 37;
  const auto ids = torch::randint(1, config.vocab_size, {2, columns});
  auto mask = torch::ones({2, columns}, torch::kInt64);
  mask[1].narrow(0, 0, padding).zero_();
  const auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  ForwardOptions padded;
  padded.attention_mask = mask;
  torch::Tensor inference, last_only;
  {
    torch::NoGradGuard no_grad;
    inference = model->forward(model->embed(ids), positions, nullptr, padded).hidden;  // [2, 150, D]
    ForwardOptions last = padded;
    last.first_output_column = columns - 1;
    last_only = model->forward(model->embed(ids), positions, nullptr, last).hidden;  // [2, 1, D]
  }
  const auto recorded = model->forward(model->embed(ids), positions, nullptr, padded).hidden.detach();
  EXPECT_LT(max_abs_difference(inference[0], recorded[0]), 1e-5);
  EXPECT_LT(max_abs_difference(inference[1].narrow(0, padding, columns - padding), recorded[1].narrow(0, padding, columns - padding)),
            1e-5);
  EXPECT_LT(max_abs_difference(last_only, inference.narrow(1, columns - 1, 1)), 1e-5);

  torch::NoGradGuard no_grad;
  const auto row = ids.narrow(0, 0, 1);
  KVCache cache = KVCache::growing(config);
  model->forward_ids(row.narrow(1, 0, 30), &cache);
  const auto later = model->forward_ids(row.narrow(1, 30, 120), &cache).hidden;  // [1, 120, D]
  EXPECT_LT(max_abs_difference(later, inference.narrow(0, 0, 1).narrow(1, 30, 120)), 1e-5);
}

// The same with autograd recording (training: Coconut's thought passes are one position each over a
// growing cache), where the CPU takes libtorch's fused attention: a lone new position sees every
// cached column (a causal flag there would let it see only the first).
TEST(LlamaKVCache, RecordedOnePositionPassesSeeEveryCachedColumn) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  auto ids = torch::tensor(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2}).view({1, -1});
  torch::Tensor full;
  {
    torch::NoGradGuard no_grad;
    full = model->logits(model->forward_ids(ids).hidden);  // [1, 7, V]
  }
  KVCache cache = KVCache::growing(config);
  std::vector<torch::Tensor> parts = {model->logits(model->forward_ids(ids.narrow(1, 0, 4), &cache).hidden)};
  for (int64_t column = 4; column < 7; ++column)
    parts.push_back(model->logits(model->forward_ids(ids.narrow(1, column, 1), &cache).hidden));
  const auto recorded = torch::cat(parts, 1);
  ASSERT_TRUE(recorded.requires_grad());
  EXPECT_LT(max_abs_difference(recorded.detach(), full), 1e-5);
}

TEST(LlamaPadding, LeftPaddedBatchEqualsEachSequenceAlone) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 0}, {7, 2}};
  GenerationOptions options;
  options.max_new_tokens = 6;
  const auto batched = generate(model, prompts, options);
  for (size_t row = 0; row < prompts.size(); ++row) {
    const auto alone = generate(model, {prompts[row]}, options);
    EXPECT_EQ(batched.tokens[row], alone.tokens[0]) << "row " << row;
    // Logits of the last prompt token: padded batch vs alone.
  }
  // Direct check of the logits at real positions of the padded row.
  auto ids = torch::tensor(std::vector<int64_t>{0, 0, 0, 7, 2}).view({1, -1});
  auto mask = torch::tensor(std::vector<int64_t>{0, 0, 0, 1, 1}).view({1, -1});
  auto positions = torch::tensor(std::vector<int64_t>{0, 0, 0, 0, 1}).view({1, -1});
  ForwardOptions padded;
  padded.attention_mask = mask;
  auto with_padding = model->logits(model->forward(model->embed(ids), positions, nullptr, padded).hidden).narrow(1, 3, 2);
  auto alone = model->logits(model->forward_ids(torch::tensor(std::vector<int64_t>{7, 2}).view({1, -1})).hidden);
  EXPECT_LT(max_abs_difference(with_padding, alone), 1e-5);
}

// Passes that autograd records take libtorch's fused attention on the CPU (grouped K/V as they
// are, the padding as an additive mask); inference takes our kernels. Both give the same logits for
// a left-padded batch with two query heads per KV head.
TEST(LlamaForward, RecordedForwardAgreesWithInferenceOnAPaddedBatch) {
  const auto config = tiny_config();
  ASSERT_GT(config.num_attention_heads, config.num_key_value_heads);
  auto model = tiny_model(config);
  auto ids = torch::tensor(std::vector<int64_t>{0, 0, 0, 7, 2, 1, 5, 3, 9, 0}).view({2, -1});
  auto mask = torch::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1, 1, 1}).view({2, -1});
  auto positions = torch::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 0, 1, 2, 3, 4}).view({2, -1});
  ForwardOptions padded;
  padded.attention_mask = mask;
  torch::Tensor inference;
  {
    torch::NoGradGuard no_grad;
    inference = model->logits(model->forward(model->embed(ids), positions, nullptr, padded).hidden);  // [2, 5, V]
  }
  auto recorded = model->logits(model->forward(model->embed(ids), positions, nullptr, padded).hidden);
  ASSERT_TRUE(recorded.requires_grad());
  EXPECT_LT(max_abs_difference(recorded.detach().narrow(1, 3, 2), inference.narrow(1, 3, 2)), 1e-5);
  EXPECT_LT(max_abs_difference(recorded.detach()[1], inference[1]), 1e-5);
}

// first_output_column c: the output of the columns from c, with the values and gradients of the
// whole pass cut there (on a left-padded batch, stored and checkpointed), and the last layer's
// queries, output projection and MLP run on those columns alone, which the graph shows in what it
// keeps: less by about the last layer's MLP activations of the columns left out.
TEST(LlamaForward, LaterColumnsOnlyGiveTheCutOutputAndGradientsAndKeepLess) {
  const auto config = tiny_config();
  const int64_t columns = 12, first = 7;
  auto model = tiny_model(config);
  model->train();
  torch::manual_seed(5);
  const auto ids = torch::randint(1, config.vocab_size, {2, columns});
  auto mask = torch::ones({2, columns}, torch::kInt64);
  mask[1].narrow(0, 0, 3).zero_();  // row 1 left-padded by 3
  const auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  const auto probe = torch::randn({2, columns - first, config.vocab_size});
  for (const bool checkpoint : {false, true}) {
    std::vector<torch::Tensor> outputs, gradients[2];
    for (const int64_t first_output : {int64_t{0}, first}) {
      model->zero_grad();
      ForwardOptions options;
      options.attention_mask = mask;
      options.checkpoint_layers = checkpoint;
      options.first_output_column = first_output;
      auto hidden = model->forward(model->embed(ids), positions, nullptr, options).hidden;
      ASSERT_EQ(hidden.size(1), columns - first_output);
      hidden = hidden.narrow(1, first - first_output, columns - first);  // [2, C - first, D]
      (model->logits(hidden) * probe).sum().backward();
      outputs.push_back(hidden.detach());
      for (const auto& parameter : model->parameters()) gradients[first_output > 0].push_back(parameter.grad().clone());
    }
    EXPECT_LT((outputs[0] - outputs[1]).abs().max().item<double>(), 1e-5) << "checkpoint " << checkpoint;
    for (size_t i = 0; i < gradients[0].size(); ++i) {  // relative to each tensor's largest entry
      const double scale = gradients[0][i].abs().max().item<double>() + 1e-12;
      EXPECT_LT((gradients[0][i] - gradients[1][i]).abs().max().item<double>() / scale, 1e-4)
          << "checkpoint " << checkpoint << ", parameter " << i;
    }
  }
  ForwardOptions late;
  late.first_output_column = columns;
  EXPECT_THROW(model->forward(model->embed(ids), positions, nullptr, late), c10::Error);

  if (!coconut::testing::kGlibcHeap) GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's heap counters read 0";
  const auto wide = coconut::testing::small_gqa_config(512);
  auto large = tiny_model(wide);
  large->train();
  const int64_t rows = 8, length = 256, question = 192;
  const auto wide_ids = torch::randint(1, wide.vocab_size, {rows, length});
  const auto wide_positions = torch::arange(length).expand({rows, length});
  const auto kept = [&](int64_t first_output) {
    ForwardOptions options;
    options.first_output_column = first_output;
    large->forward(large->embed(wide_ids), wide_positions, nullptr, options).hidden.sum().backward();  // warm
    const int64_t before = coconut::testing::heap_in_use();
    const auto graph = large->forward(large->embed(wide_ids), wide_positions, nullptr, options).hidden.sum();
    return coconut::testing::heap_in_use() - before;
  };
  const int64_t whole = kept(0), cut = kept(question);
  // gate, up and their product for every column left out, float32
  const int64_t mlp_activations = rows * question * 3 * wide.intermediate_size * 4;
  std::printf("graph keeps %lld bytes, %lld with the last layer on the last %lld of %lld columns (MLP activations %lld)\n",
              static_cast<long long>(whole), static_cast<long long>(cut), static_cast<long long>(length - question),
              static_cast<long long>(length), static_cast<long long>(mlp_activations));
  EXPECT_GT(whole - cut, mlp_activations * 9 / 10);
}

// The gradients that training takes (fused attention's backward, the projections' tiles) against
// central differences of the naive float64 forward: L = sum of logits x fixed random weights, two
// entries of every parameter (projections, MLP, both norms of each layer, the final norm, and the
// embedding table, which is also the tied head: one entry of a row the input uses, one of a row it
// does not, which only the head sees).
TEST(LlamaForward, TrainingGradientsMatchNaiveFiniteDifferences) {
  auto config = tiny_config();
  config.tie_word_embeddings = true;  // the embedding's gradient then has both its uses
  config.validate();
  auto model = tiny_model(config);
  const std::vector<int64_t> ids = {1, 5, 3, 9, 0, 7, 2};
  torch::manual_seed(11);
  const auto readout = torch::randn({static_cast<int64_t>(ids.size()), config.vocab_size}, torch::kFloat64);
  const Matrix readout_values = to_matrix(readout);
  const auto naive_loss = [&] {
    const auto logits = naive_logits(model, ids);
    double loss = 0;
    for (size_t t = 0; t < logits.size(); ++t)
      for (int64_t v = 0; v < config.vocab_size; ++v) loss += logits[t][v] * readout_values[t][v];
    return loss;
  };
  auto logits = model->logits(model->forward_ids(torch::tensor(ids).view({1, -1})).hidden)[0];  // [T, V]
  (logits.to(torch::kFloat64) * readout).sum().backward();
  int64_t checked_parameters = 0;
  for (auto& named : model->named_parameters()) {
    auto parameter = named.value();
    ASSERT_TRUE(parameter.grad().defined()) << named.key();
    auto flat_gradient = parameter.grad().view(-1);
    auto flat = parameter.view(-1);
    const int64_t n = flat.numel();
    std::vector<int64_t> entries = {n / 3 + 1, (2 * n) / 3 + 2};
    if (named.key() == "embed_tokens.weight")
      entries = {5 * config.hidden_size + 3, 4 * config.hidden_size + 1};  // token 5 is in ids, 4 is not
    for (const int64_t entry : entries) {
      const double analytic = flat_gradient[entry].item<double>();
      torch::NoGradGuard no_grad;
      const float original = flat[entry].item<float>();
      const float up = original + 1e-3f, down = original - 1e-3f;
      flat[entry] = up;
      const double loss_up = naive_loss();
      flat[entry] = down;
      const double loss_down = naive_loss();
      flat[entry] = original;
      const double numeric = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
      // float32 forward and backward against float64 differences with O(h^2) error, h = 1e-3.
      EXPECT_NEAR(analytic, numeric, 1e-3 * std::abs(numeric) + 2e-4) << named.key() << " entry " << entry;
      EXPECT_GT(std::abs(numeric), 1e-3) << named.key() << " entry " << entry << ": a vacuous check";
    }
    ++checked_parameters;
  }
  // 9 per layer (4 attention, 3 MLP, 2 norms), the final norm and the (tied) embedding.
  EXPECT_EQ(checked_parameters, 9 * config.num_hidden_layers + 2);
}

// pack_for_inference: q|k|v and gate|up each in one storage, run as one product in inference; a
// parameter in memory libtorch did not allocate (as the loader's views of the mapped file) copied,
// the others kept. The logits of a prefill and of decode steps stay those of the separate weights
// (and of the naive loops), biases included; training still gives every weight its own gradient;
// and a parameter whose data is replaced ends the packing without changing what the model computes.
TEST(LlamaPackedProjections, GiveTheLogitsAndGradientsOfSeparateWeights) {
  auto config = tiny_config(false);
  config.attention_bias = true;  // split_fused adds each part's bias
  config.mlp_bias = true;
  config.validate();
  auto separate = tiny_model(config, 5);
  auto packed = tiny_model(config, 5);
  {
    torch::NoGradGuard no_grad;
    for (auto& named : separate->named_parameters())
      if (named.key().find(".bias") != std::string::npos) named.value().normal_(0.0, 0.3);
    const auto source = separate->named_parameters();
    for (auto& named : packed->named_parameters()) named.value().copy_(source[named.key()]);
  }
  // Layer 0's o_proj in memory of the test's own, as a mapped file's view is.
  auto& o_weight = packed->layers[0]->as<DecoderLayer>()->self_attn->o_proj->weight;
  std::vector<float> foreign(static_cast<size_t>(o_weight.numel()));
  std::memcpy(foreign.data(), o_weight.const_data_ptr(), foreign.size() * sizeof(float));
  {
    torch::NoGradGuard no_grad;
    o_weight.set_data(torch::from_blob(foreign.data(), o_weight.sizes()));
  }
  const void* o_before = o_weight.const_data_ptr();
  const void* down_before = packed->layers[0]->as<DecoderLayer>()->mlp->down_proj->weight.const_data_ptr();
  pack_for_inference(packed);
  EXPECT_NE(packed->layers[0]->as<DecoderLayer>()->self_attn->o_proj->weight.const_data_ptr(), o_before);
  EXPECT_EQ(packed->layers[0]->as<DecoderLayer>()->mlp->down_proj->weight.const_data_ptr(), down_before);
  for (const auto& layer : *packed->layers) {
    auto& decoder = *layer->as<DecoderLayer>();
    EXPECT_TRUE(qkv_packed(decoder));
    EXPECT_TRUE(gate_up_packed(decoder));
    EXPECT_EQ(static_cast<const char*>(decoder.self_attn->q_proj->weight.const_data_ptr()) + decoder.self_attn->q_proj->weight.nbytes(),
              decoder.self_attn->k_proj->weight.const_data_ptr());
  }
  for (const auto& layer : *separate->layers) EXPECT_FALSE(qkv_packed(*layer->as<DecoderLayer>()));

  const std::vector<int64_t> ids = {1, 5, 3, 9, 0, 7, 2, 6, 6, 10};
  const auto all = torch::tensor(ids).view({1, -1});
  const auto reference = naive_logits(separate, ids);
  const auto decode = [&](Llama& model) {  // a 4-token prefill, then one token at a time: [T, V]
    torch::NoGradGuard no_grad;
    KVCache cache = KVCache::preallocated(config, 1, 16, torch::kFloat32, torch::kCPU);
    std::vector<torch::Tensor> rows = {model->logits(model->forward_ids(all.narrow(1, 0, 4), &cache).hidden)[0]};
    for (int64_t t = 4; t < all.size(1); ++t) rows.push_back(model->logits(model->forward_ids(all.narrow(1, t, 1), &cache).hidden)[0]);
    return torch::cat(rows, 0);
  };
  const auto separate_logits = decode(separate), packed_logits = decode(packed);
  EXPECT_LT(max_abs_difference(packed_logits, separate_logits), 1e-5);
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t v = 0; v < config.vocab_size; ++v) worst = std::max(worst, std::abs(packed_logits[t][v].item<double>() - reference[t][v]));
  EXPECT_LT(worst, 1e-4);  // as LlamaForward.MatchesNaiveFloat64Loops

  // Training: a recorded forward keeps the products apart; each view gets its own gradient.
  const auto loss = [&](Llama& model) { return model->logits(model->forward_ids(all).hidden).pow(2).mean(); };
  loss(separate).backward();
  loss(packed).backward();
  const auto separate_parameters = separate->named_parameters();
  for (const auto& named : packed->named_parameters()) {
    ASSERT_TRUE(named.value().grad().defined()) << named.key();
    EXPECT_LT(max_abs_difference(named.value().grad(), separate_parameters[named.key()].grad()), 1e-6) << named.key();
  }

  // Replacing one weight's data ends that layer's packing; the model computes the same.
  auto& first = *packed->layers[0]->as<DecoderLayer>();
  {
    torch::NoGradGuard no_grad;
    first.self_attn->k_proj->weight.set_data(first.self_attn->k_proj->weight.clone());
    first.mlp->up_proj->weight.set_data(first.mlp->up_proj->weight.clone());
  }
  EXPECT_FALSE(qkv_packed(first));
  EXPECT_FALSE(gate_up_packed(first));
  EXPECT_TRUE(qkv_packed(*packed->layers[1]->as<DecoderLayer>()));
  EXPECT_LT(max_abs_difference(decode(packed), separate_logits), 1e-5);
}

TEST(LlamaForward, BFloat16StaysCloseToFloat32) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7}).view({1, -1});
  auto reference = model->logits(model->forward_ids(ids).hidden);
  model->to(torch::kBFloat16);
  auto low = model->logits(model->forward_ids(ids).hidden);
  EXPECT_EQ(low.scalar_type(), torch::kFloat32);
  // bf16 keeps 8 significant bits (relative 2^-9 per rounding); through 2 layers the logits
  // (max |logit| 3.1 here) moved by 0.041 when measured (libtorch 2.x, x86 CPU), 1.3% of the
  // largest logit. Bound: 3% of the largest |logit| (0.094), room for another kernel's rounding
  // order, while an error of a few percent in one bf16 step (a norm or RoPE left in bf16, a dropped
  // rounding) goes above it.
  const double largest = reference.abs().max().item<double>();
  EXPECT_LT(max_abs_difference(low, reference), 0.03 * largest);
  EXPECT_GT(max_abs_difference(low, reference), 0.0);  // it really ran in bf16
}

TEST(LlamaForward, ResidualsAndSkipLayers) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3}).view({1, -1});
  ForwardOptions options;
  options.return_residuals = true;
  auto result = model->forward_ids(ids, nullptr, options);
  ASSERT_EQ(result.residuals.size(), static_cast<size_t>(config.num_hidden_layers + 1));
  EXPECT_TRUE(torch::equal(result.residuals[0], model->embed(ids)));
  EXPECT_TRUE(torch::allclose(model->norm(result.residuals.back()), result.hidden));
  // Skipping layer 1 leaves the output of layer 0 as the last residual.
  options.skip_layers = {1};
  auto skipped = model->forward_ids(ids, nullptr, options);
  EXPECT_TRUE(torch::equal(skipped.residuals[2], skipped.residuals[1]));
  EXPECT_TRUE(torch::allclose(skipped.residuals[1], result.residuals[1]));
}

TEST(LlamaForward, HeadMaskOfOnesChangesNothingAndZeroHeadMatters) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 8}).view({1, -1});
  auto plain = model->forward_ids(ids).hidden;
  ForwardOptions options;
  options.head_mask = torch::ones({config.num_hidden_layers, config.num_attention_heads});
  EXPECT_TRUE(torch::allclose(model->forward_ids(ids, nullptr, options).hidden, plain));
  options.head_mask[0][1] = 0.0;
  EXPECT_GT(max_abs_difference(model->forward_ids(ids, nullptr, options).hidden, plain), 1e-4);
}

TEST(LlamaGenerate, SamplingIsSeededAndTopKOneIsGreedy) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  GenerationOptions greedy;
  greedy.max_new_tokens = 8;
  GenerationOptions sampled = greedy;
  sampled.sampling = {1.0, 0, 0.9, 1234};
  const auto a = generate(model, {{1, 5}}, sampled);
  const auto b = generate(model, {{1, 5}}, sampled);
  EXPECT_EQ(a.tokens, b.tokens);
  GenerationOptions top1 = greedy;
  top1.sampling = {0.7, 1, 1.0, 99};
  EXPECT_EQ(generate(model, {{1, 5}}, top1).tokens, generate(model, {{1, 5}}, greedy).tokens);
  // Different seeds give different samples at temperature 5 (near-uniform over 11 tokens).
  GenerationOptions hot = greedy;
  hot.max_new_tokens = 16;
  hot.sampling = {5.0, 0, 1.0, 1};
  auto first = generate(model, {{1}}, hot).tokens;
  hot.sampling.seed = 2;
  EXPECT_NE(first, generate(model, {{1}}, hot).tokens);
}

// generate() with the fixed-shape cache: the same tokens as with the preallocated one, for a
// left-padded batch with continuous thoughts and the latent bottleneck.
TEST(LlamaGenerate, FixedCacheGivesTheSameTokens) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> prompts = {{1, 5, 3, 9, 0}, {7, 2}, {4}};
  GenerationOptions options;
  options.max_new_tokens = 8;
  options.latent_thoughts = 2;
  options.after_latents = {3};
  for (const bool bottleneck : {false, true}) {
    options.latent_bottleneck = bottleneck;
    options.fixed_cache = false;
    const auto preallocated = generate(model, prompts, options);
    options.fixed_cache = true;
    const auto fixed = generate(model, prompts, options);
    EXPECT_EQ(preallocated.tokens, fixed.tokens) << "bottleneck " << bottleneck;
    EXPECT_EQ(preallocated.decode_steps, fixed.decode_steps);
  }
}

// CUDA-graph decoding (tests/gpu_reasoning_test.cpp runs it) is refused, saying why, off a GPU; a
// replay's host-side count of cache columns is for fixed caches and stays within their capacity.
TEST(LlamaGenerate, CudaGraphNeedsACudaDeviceAndAFixedCache) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  GenerationOptions options;
  options.max_new_tokens = 8;
  options.cuda_graph = true;
  try {
    generate(model, {{1, 5}}, options);
    FAIL() << "a CPU model was replayed";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("CUDA"), std::string::npos) << error.what();
  }
  auto preallocated = KVCache::preallocated(config, 1, 4, torch::kFloat32, torch::kCPU);
  EXPECT_THROW(preallocated.count_replayed_columns(1), std::logic_error);
  auto fixed = KVCache::fixed(config, 1, 4, torch::kFloat32, torch::kCPU);
  fixed.count_replayed_columns(3);
  EXPECT_EQ(fixed.length(), 3);
  EXPECT_THROW(fixed.count_replayed_columns(2), std::out_of_range);
}

TEST(LlamaGenerate, StopsAtEos) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  GenerationOptions options;
  options.max_new_tokens = 30;
  const auto free_run = generate(model, {{1, 5}}, options).tokens[0];
  // A stop token whose first occurrence is at least the third token, so that a prefix is compared.
  size_t first = 2;
  while (first < free_run.size() &&
         std::find(free_run.begin(), free_run.begin() + static_cast<int64_t>(first), free_run[first]) !=
             free_run.begin() + static_cast<int64_t>(first))
    ++first;
  ASSERT_LT(first, free_run.size()) << "no token occurs for the first time after position 2";
  options.stop_ids = {free_run[first]};
  const auto stopped = generate(model, {{1, 5}}, options).tokens[0];
  // Stops at the first occurrence of that token, which is included, and is the free run's prefix
  // up to and including it: stopping changes nothing before.
  EXPECT_EQ(stopped, std::vector<int64_t>(free_run.begin(), free_run.begin() + static_cast<int64_t>(first) + 1));
}

// Activation checkpointing recomputes each layer in backward: the same loss and the same gradients
// as keeping every activation, in float32 and under bf16 autocast, with backward inside the
// autocast scope (as `train` runs it) or after it (as bench_train does): the recomputation must
// run in the forward's autocast state, or its bf16 roundings would differ.
TEST(LlamaCheckpointing, GradientsEqualThoseOfAStoredForward) {
  const auto config = tiny_config();
  const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10, 4, 8}).view({2, 6});
  for (const bool bf16 : {false, true}) for (const bool backward_in_scope : {true, false}) {
    std::vector<torch::Tensor> gradients[2];
    double losses[2];
    for (int run = 0; run < 2; ++run) {
      auto model = tiny_model(config);
      model->train();
      ForwardOptions options;
      options.checkpoint_layers = run == 1;
      torch::Tensor loss;
      {
        AutocastScope autocast(bf16, torch::kCPU);
        const auto logits = model->logits(model->forward_ids(ids, nullptr, options).hidden);  // [2, 6, V]
        loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, 5).reshape({-1, config.vocab_size}),
                                                    ids.narrow(1, 1, 5).reshape({-1}));
        if (backward_in_scope) loss.backward();
      }
      if (!backward_in_scope) loss.backward();
      EXPECT_FALSE(autocast_enabled(torch::kCPU));  // the scope's end turned it off again
      losses[run] = loss.item<double>();
      for (const auto& parameter : model->parameters()) gradients[run].push_back(parameter.grad().clone());
    }
    EXPECT_EQ(losses[0], losses[1]) << "bf16 " << bf16;
    ASSERT_EQ(gradients[0].size(), gradients[1].size());
    for (size_t i = 0; i < gradients[0].size(); ++i) {
      ASSERT_TRUE(gradients[1][i].defined());
      EXPECT_TRUE(torch::allclose(gradients[0][i], gradients[1][i], 1e-5, 1e-7))
          << "bf16 " << bf16 << ", backward in scope " << backward_in_scope << ", parameter " << i << ": max difference "
          << (gradients[0][i] - gradients[1][i]).abs().max().item<double>();
    }
  }
}

// Under bf16 autocast a weight is cast once per scope, and every product with it shares that
// copy: a Coconut step runs each weight once per thought, and a cast per call kept one more bf16
// copy of the model per thought for backward (a 1B model: 1.8 GiB each). The two products' graphs
// meet at the one cast (with a cast per call they share nothing but the weight's leaf), and the
// weight still gets both products' gradients.
TEST(Autocast, EachWeightIsCastOncePerScope) {
  torch::manual_seed(3);
  torch::nn::Linear layer(torch::nn::LinearOptions(8, 6).bias(false));
  const auto x = torch::randn({2, 8}), z = torch::randn({3, 8});
  torch::Tensor first, second;
  {
    AutocastScope autocast(true, torch::kCPU);
    first = dense(x, layer->weight);   // [2, 6]
    second = dense(z, layer->weight);  // [3, 6]
  }
  EXPECT_EQ(first.scalar_type(), torch::kBFloat16);
  // Besides the weight's own AccumulateGrad, the products' graphs meet at one node: the cast.
  const auto first_nodes = coconut::testing::graph_nodes(first), second_nodes = coconut::testing::graph_nodes(second);
  int64_t shared = 0;
  for (const auto* node : first_nodes) shared += second_nodes.count(node);
  EXPECT_EQ(shared, 2) << "the products should share their weight's one bf16 cast";
  EXPECT_EQ(coconut::testing::count_graph_nodes(first.sum() + second.sum(), "ToCopyBackward"), 1);
  (first.to(torch::kFloat32).sum() + second.to(torch::kFloat32).sum()).backward();
  // d/dW of sum(x W^T) + sum(z W^T) = column sums of x and z, in every row of W (bf16 inputs).
  const auto expected = (x.to(torch::kBFloat16).to(torch::kFloat32).sum(0) + z.to(torch::kBFloat16).to(torch::kFloat32).sum(0))
                            .expand({6, 8});
  EXPECT_TRUE(torch::allclose(layer->weight.grad(), expected, 1e-2, 3e-2)) << layer->weight.grad() - expected;  // summed in bf16
}

// The cast cache must not outlive a step: a checkpointed layer recomputed in a backward run after
// the scope (as bench_train runs it) casts the weights again; after the optimizer changes them, the
// next step's forward must see the new weights, as a fresh model holding them does.
TEST(Autocast, NoCastOutlivesTheStepThatMadeIt) {
  const auto config = tiny_config();
  const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10, 4, 8}).view({2, 6});
  auto model = tiny_model(config);
  model->train();
  ForwardOptions checkpointed;
  checkpointed.checkpoint_layers = true;
  torch::Tensor loss;
  {
    AutocastScope autocast(true, torch::kCPU);
    loss = model->logits(model->forward_ids(ids, nullptr, checkpointed).hidden).sum();
  }
  loss.backward();  // recomputes both layers under autocast, outside any scope
  {
    torch::NoGradGuard no_grad;
    for (auto& parameter : model->parameters()) parameter.add_(0.25);  // an optimizer step, in place
  }
  auto fresh = tiny_model(config);
  {
    torch::NoGradGuard no_grad;
    const auto updated = model->parameters();
    auto parameters = fresh->parameters();
    for (size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(updated[i]);
  }
  torch::Tensor next, expected;
  {
    AutocastScope autocast(true, torch::kCPU);
    next = model->logits(model->forward_ids(ids, nullptr, checkpointed).hidden);
  }
  {
    AutocastScope autocast(true, torch::kCPU);
    expected = fresh->logits(fresh->forward_ids(ids, nullptr, checkpointed).hidden);
  }
  EXPECT_TRUE(torch::equal(next, expected)) << "max difference " << (next - expected).abs().max().item<double>();
}

// Stochastic depth in training (ForwardOptions::layer_keep): a row that drops a layer is the row
// run alone without that layer (skip_layers), the other rows are untouched bit for bit, and a
// layer no row keeps gets no gradient.
TEST(LlamaStochasticDepth, ADroppedLayerPassesItsRowThrough) {
  const auto config = tiny_config();
  auto model = tiny_model(config);
  const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10}).view({2, 5});
  const auto plain = model->forward_ids(ids).hidden;  // [2, 5, D]
  ForwardOptions all_kept;
  all_kept.layer_keep = torch::ones({2, config.num_hidden_layers}, torch::kBool);
  EXPECT_TRUE(torch::equal(model->forward_ids(ids, nullptr, all_kept).hidden, plain));

  ForwardOptions drop;
  drop.layer_keep = torch::tensor(std::vector<int64_t>{1, 0, 1, 1}).view({2, 2});  // row 0 drops layer 1
  const auto dropped = model->forward_ids(ids, nullptr, drop).hidden;
  ForwardOptions skip;
  skip.skip_layers = {1};
  const auto alone = model->forward_ids(ids.narrow(0, 0, 1), nullptr, skip).hidden;
  EXPECT_LT((dropped[0] - alone[0]).abs().max().item<double>(), 1e-6);
  EXPECT_GT((dropped[0] - plain[0]).abs().max().item<double>(), 1e-3);  // the layer did something
  EXPECT_TRUE(torch::equal(dropped[1], plain[1]));

  // No row keeps layer 1: its weights get no gradient, layer 0's do.
  ForwardOptions none;
  none.layer_keep = torch::tensor(std::vector<int64_t>{1, 0, 1, 0}).view({2, 2});
  model->zero_grad();
  model->forward_ids(ids, nullptr, none).hidden.pow(2).sum().backward();
  const auto& second = model->layers[1]->as<DecoderLayer>()->mlp->up_proj->weight;
  EXPECT_TRUE(!second.grad().defined() || second.grad().abs().max().item<double>() == 0);
  EXPECT_GT(model->layers[0]->as<DecoderLayer>()->mlp->up_proj->weight.grad().abs().max().item<double>(), 0);

  ForwardOptions wrong;
  wrong.layer_keep = torch::ones({3, 2}, torch::kBool);
  EXPECT_THROW(model->forward_ids(ids, nullptr, wrong), c10::Error);
}
