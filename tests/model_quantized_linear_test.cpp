// Q8_0 weights (model/quantized_linear.h, model/quantize_model.h): the quantizer against gguf-py's,
// every kernel against a product rebuilt from the blocks in double precision, and a quantized
// model against its dense self.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "model/quantize_model.h"
#include "model/quantized_linear.h"
#include "support/reference_python.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace coconut {
namespace {

using testing::TempDir;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), {}};
}

torch::Tensor read_floats(const std::string& path, std::vector<int64_t> shape) {
  auto bytes = read_bytes(path);
  auto out = torch::empty(shape, torch::kFloat32);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(out.numel() * 4)) << path;
  std::memcpy(out.data_ptr<float>(), bytes.data(), std::min<size_t>(bytes.size(), out.numel() * 4));
  return out;
}

// Resets a forced kernel when a test ends.
struct ForcedKernel {
  explicit ForcedKernel(const std::string& name) { force_q8_0_kernel(name); }
  ~ForcedKernel() { force_q8_0_kernel(""); }
};

TEST(QuantizedLinear, BlocksEqualGgufPysQuantizerBitForBit) {
  TempDir dir;
  ASSERT_TRUE(testing::run_reference("ggml_quantize_reference.py", dir.path().string(), dir.file("log")));
  const auto input = read_floats(dir.file("input.f32"), {6, 96});
  const auto theirs = read_bytes(dir.file("q8_0.bin"));
  const auto ours = quantize_q8_0(input);
  const auto blocks = ggml_blocks(ours);
  ASSERT_EQ(blocks.numel(), static_cast<int64_t>(theirs.size()));
  EXPECT_EQ(ours.in_features, 96);
  EXPECT_EQ(ours.out_features, 6);
  EXPECT_EQ(std::memcmp(blocks.data_ptr<uint8_t>(), theirs.data(), theirs.size()), 0);
  // The held layout holds the same bytes, interleaved: 8 rows a group (the last padded).
  EXPECT_EQ(ours.packed.numel(), 1 * 3 * kQ8_0GroupBlockBytes);
  EXPECT_TRUE(torch::equal(ggml_blocks(from_ggml_blocks(blocks, 6, 96)), blocks));
  // Ties went away from zero as roundf does (row 0's first block has d = 1: 0.5 -> 1, -0.5 -> -1).
  const auto* ties = reinterpret_cast<const int8_t*>(blocks.data_ptr<uint8_t>() + 2);
  EXPECT_EQ(ties[0], 127);
  EXPECT_EQ(ties[1], -15);  // -14.5
  EXPECT_EQ(ties[16], 1);   // 0.5
  // Dequantized, the values are gguf-py's exactly (d * q in float32).
  const auto dequantized = read_floats(dir.file("dequantized.f32"), {6, 96});
  EXPECT_TRUE(torch::equal(dequantize(ours), dequantized));
}

TEST(QuantizedLinear, RequantizingDequantizedBlocksGivesThemBack) {
  // What lets a Q8_0 GGUF model, imported as float32, run on its own blocks.
  torch::manual_seed(3);
  const auto weight = torch::randn({40, 128}) * torch::logspace(-2, 2, 40).unsqueeze(1);
  const auto first = quantize_q8_0(weight);
  const auto second = quantize_q8_0(dequantize(first));
  EXPECT_TRUE(torch::equal(first.packed, second.packed));
  // Quantization error: half a step (d / 2, d = max|w| / 127 per block) plus d's rounding to
  // float16 (2^-11 relative) times at most 127 steps: under 0.57 d.
  const auto blocks = weight.view({40, 4, 32});
  const auto step = blocks.abs().amax(-1, true) / 127.0;
  const auto error = (dequantize(first).view({40, 4, 32}) - blocks).abs();
  EXPECT_TRUE((error <= step * 0.57).all().item<bool>());
  EXPECT_FALSE((error <= step * 0.45).all().item<bool>());  // and the bound is not loose
}

TEST(QuantizedLinear, VectorQuantizerEqualsTheScalarOneBitForBit) {
  // d = 1 for the first row (its largest value 127): values on and next to the halves that roundf
  // takes away from zero.
  std::vector<float> edges = {127.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, 126.5f, -126.5f, 0.49999997f, -0.49999997f,
                              2.4999998f, -2.4999998f, 0.0f, -0.0f, 1e-30f};
  edges.resize(32, 3.5f);
  torch::manual_seed(11);
  auto weight = torch::randn({21, 64}) * torch::logspace(-6, 3, 21).unsqueeze(1);
  weight[0].narrow(0, 0, 32).copy_(torch::tensor(edges));
  weight[1].zero_();
  const auto by_cpu = ggml_blocks(quantize_q8_0(weight));
  torch::Tensor portable;
  {
    ForcedKernel forced("portable");
    portable = ggml_blocks(quantize_q8_0(weight));
  }
  EXPECT_TRUE(torch::equal(by_cpu, portable));
  const auto* q = reinterpret_cast<const int8_t*>(portable.data_ptr<uint8_t>() + 2);
  const std::vector<int> expected = {127, 1, -1, 2, -2, 3, -3, 127, -127, 0, 0, 2, -2, 0, 0, 0};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(q[i], expected[i]) << "value " << edges[i];
}

// The product the blocks stand for, rebuilt in double: per row and block, d_w * d_x * (int sum).
torch::Tensor product_from_blocks(const torch::Tensor& x, const QuantizedWeight& weight) {
  const auto [scales, values] = quantize_rows_q8_0(x);  // [M, K/32], [M, K]
  const int64_t m_size = x.size(0), n_size = weight.out_features, blocks = weight.in_features / 32;
  auto out = torch::zeros({m_size, n_size}, torch::kFloat64);
  const auto w = ggml_blocks(weight);
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t n = 0; n < n_size; ++n) {
      double sum = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = w.data_ptr<uint8_t>() + (n * blocks + b) * kQ8_0BlockBytes;
        uint16_t bits;
        std::memcpy(&bits, block, 2);
        const double d = static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
        int64_t dot = 0;
        for (int64_t i = 0; i < 32; ++i)
          dot += int64_t{reinterpret_cast<const int8_t*>(block + 2)[i]} * int64_t{values[m][b * 32 + i].item<int8_t>()};
        sum += d * scales[m][b].item<double>() * static_cast<double>(dot);
      }
      out[m][n] = sum;
    }
  return out;
}

TEST(QuantizedLinear, EveryKernelEqualsTheProductOfItsBlocks) {
  torch::manual_seed(5);
  const auto kernels = available_q8_0_kernels();
  EXPECT_EQ(kernels.back(), "portable");
  torch::NoGradGuard no_grad;
  for (const auto& [m_size, n_size, k_size] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 32}, {1, 7, 96}, {3, 9, 64}, {17, 13, 160}, {2, 64, 576}}) {
    const auto x = torch::randn({m_size, k_size});
    const auto weight = quantize_q8_0(torch::randn({n_size, k_size}) * 0.1);
    const auto reference = product_from_blocks(x, weight);
    const auto bias = torch::randn({n_size});
    for (const auto& name : kernels) {
      ForcedKernel forced(name);
      const auto out = quantized_dense(x, weight).to(torch::kFloat64);
      // Exact int32 sums; float32 scaling and accumulation over K/32 blocks: 1e-5 relative.
      EXPECT_LE((out - reference).abs().max().item<double>(), 1e-5 * (reference.abs().max().item<double>() + 1))
          << name << " M=" << m_size << " N=" << n_size << " K=" << k_size;
      const auto with_bias = quantized_dense(x, weight, bias).to(torch::kFloat64);
      EXPECT_LE((with_bias - reference - bias.to(torch::kFloat64)).abs().max().item<double>(),
                1e-5 * (reference.abs().max().item<double>() + 1));
    }
  }
}

TEST(QuantizedLinear, CloseToTheDenseProductAndShapedAsX) {
  torch::manual_seed(9);
  torch::NoGradGuard no_grad;
  const auto weight = torch::randn({48, 256}) * 0.05;
  const auto x = torch::randn({2, 3, 256});
  const auto dense = torch::matmul(x, weight.t());
  const auto quantized = quantized_dense(x, quantize_q8_0(weight));
  ASSERT_EQ(quantized.sizes(), dense.sizes());
  // Two 8-bit roundings of values ~N(0, s): relative error of a sum of 256 products about 1%.
  EXPECT_LT(((quantized - dense).norm() / dense.norm()).item<double>(), 0.02);
  const auto in_bf16 = quantized_dense(x.to(torch::kBFloat16), quantize_q8_0(weight));
  EXPECT_EQ(in_bf16.scalar_type(), torch::kBFloat16);
}

TEST(QuantizedLinear, BadInputIsNamed) {
  try {
    quantize_q8_0(torch::randn({4, 48}));
    FAIL() << "a row of 48 values was quantized";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("48"), std::string::npos) << error.what();
  }
  EXPECT_THROW(weight_format_from_name("q5_0"), std::invalid_argument);
  EXPECT_EQ(weight_format_from_name("q8_0"), WeightFormat::kQ8_0);
  EXPECT_THROW(force_q8_0_kernel("sse9"), std::invalid_argument);
  auto x = torch::randn({1, 64}, torch::requires_grad());
  EXPECT_THROW(quantized_dense(x, quantize_q8_0(torch::randn({8, 64}))), c10::Error);
}

LlamaConfig blocks_config(bool tied) {
  LlamaConfig config;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.vocab_size = 50;
  config.max_position_embeddings = 64;
  config.tie_word_embeddings = tied;
  config.validate();
  return config;
}

TEST(QuantizedModel, LogitsFollowTheDenseModelAndTheCacheDecodesAsFullRecompute) {
  for (const bool tied : {true, false}) {
    auto model = testing::tiny_model(blocks_config(tied));
    torch::NoGradGuard no_grad;
    auto quantized = with_quantized_weights(model, WeightFormat::kQ8_0);
    EXPECT_TRUE(quantized->output_quantized.defined());
    EXPECT_EQ(quantized->layers[0]->as<DecoderLayer>()->self_attn->q_proj->weight.numel(), 0);
    // Held bytes: 34 per 32 weights in the projections and head instead of 4 per weight.
    EXPECT_LT(held_weight_bytes(quantized), held_weight_bytes(model));
    const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10, 44, 31}).view({1, -1});
    const auto dense = model->logits(model->forward_ids(ids).hidden);      // [1, T, V]
    const auto full = quantized->logits(quantized->forward_ids(ids).hidden);
    // 8-bit weights and inputs through two random layers (weights of std 0.3, so no layer is
    // near the identity): 5-6% here; a wrong block or transposed product is off by about 100%.
    EXPECT_LT(((full - dense).norm() / dense.norm()).item<double>(), 0.1) << "tied " << tied;
    KVCache cache = KVCache::preallocated(quantized->config(), 1, 16, torch::kFloat32, torch::kCPU);
    const auto prefix = quantized->logits(quantized->forward_ids(ids.narrow(1, 0, 4), &cache).hidden);
    EXPECT_LT((prefix - full.narrow(1, 0, 4)).abs().max().item<double>(), 1e-5);
    for (int64_t t = 4; t < ids.size(1); ++t) {
      // Rows are quantized one by one, so a position's products do not depend on the others.
      const auto step = quantized->logits(quantized->forward_ids(ids.narrow(1, t, 1), &cache).hidden);
      EXPECT_LT((step - full.narrow(1, t, 1)).abs().max().item<double>(), 1e-5) << "position " << t;
    }
  }
}

TEST(QuantizedModel, FusedProductsEqualTheirPartsOneByOne) {
  auto model = testing::tiny_model(blocks_config(true));
  torch::NoGradGuard no_grad;
  auto quantized = with_quantized_weights(model, WeightFormat::kQ8_0);
  const auto ids = torch::tensor(std::vector<int64_t>{4, 8, 15, 16, 23, 42}).view({1, -1});
  const auto fused = quantized->logits(quantized->forward_ids(ids).hidden);
  for (const auto& layer : *quantized->layers) {
    auto& decoder = *layer->as<DecoderLayer>();
    EXPECT_TRUE(decoder.self_attn->qkv_quantized.defined());
    EXPECT_TRUE(decoder.mlp->gate_up_quantized.defined());
    EXPECT_EQ(decoder.self_attn->k_quantized.out_features, 32);  // 2 KV heads of 16: rows 64..95 of the fused weight
    decoder.self_attn->qkv_quantized = {};
    decoder.mlp->gate_up_quantized = {};
  }
  // Each row's sums are the same operations either way: equal bit for bit.
  EXPECT_TRUE(torch::equal(quantized->logits(quantized->forward_ids(ids).hidden), fused));
  // Views fall on groups of 8 rows.
  const auto weight = quantize_q8_0(torch::randn({20, 32}));
  EXPECT_EQ(weight_rows(weight, 8, 12).packed.size(0), 2);
  EXPECT_THROW(weight_rows(weight, 4, 8), std::invalid_argument);
  EXPECT_THROW(weight_rows(weight, 0, 12), std::invalid_argument);
}

TEST(QuantizedModel, DenseFormatIsTheModelItselfAndOddWidthsAreRefused) {
  auto model = testing::tiny_model(blocks_config(true));
  EXPECT_EQ(with_quantized_weights(model, WeightFormat::kDense).get(), model.get());
  auto odd = testing::tiny_model(testing::tiny_config());  // width 16
  EXPECT_THROW(with_quantized_weights(odd, WeightFormat::kQ8_0), std::invalid_argument);
}

}  // namespace
}  // namespace coconut
