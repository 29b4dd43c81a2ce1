// Q8_0, Q4_0 and Q4_1 weights (model/quantized_linear.h, model/quantize_model.h): the quantizers
// against gguf-py's, every kernel against a product rebuilt from the blocks in double precision,
// and a quantized model against its dense self.
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
  explicit ForcedKernel(const std::string& name) { force_quantized_kernel(name); }
  ~ForcedKernel() { force_quantized_kernel(""); }
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
  // The 4-bit formats the same way (their held layout: 160 bytes per group and block).
  for (const auto& [name, format] : std::vector<std::pair<std::string, WeightFormat>>{{"q4_0", WeightFormat::kQ4_0},
                                                                                       {"q4_1", WeightFormat::kQ4_1}}) {
    const auto expected = read_bytes(dir.file(name + ".bin"));
    const auto weight = quantize_weight(input, format);
    const auto bytes = ggml_blocks(weight);
    ASSERT_EQ(bytes.numel(), static_cast<int64_t>(expected.size())) << name;
    EXPECT_EQ(std::memcmp(bytes.data_ptr<uint8_t>(), expected.data(), expected.size()), 0) << name;
    EXPECT_EQ(weight.packed.numel(), 1 * 3 * kQ4GroupBlockBytes) << name;
    EXPECT_TRUE(torch::equal(ggml_blocks(from_ggml_blocks(bytes, 6, 96, format)), bytes)) << name;
    EXPECT_TRUE(torch::equal(dequantize(weight), read_floats(dir.file(name + ".f32"), {6, 96}))) << name;
  }
}

TEST(QuantizedLinear, RequantizingDequantized4BitBlocksGivesThemBack) {
  // What lets SmolLM2's Q4_1 file, imported as float32, run on its own blocks with --weights q4_1
  // (tests/slow_smollm2_test.cpp checks every tensor of the file).
  torch::manual_seed(4);
  const auto weight = torch::randn({40, 128}) * torch::logspace(-2, 2, 40).unsqueeze(1) + 0.3;
  for (const auto format : {WeightFormat::kQ4_0, WeightFormat::kQ4_1}) {
    const auto first = quantize_weight(weight, format);
    const auto second = quantize_weight(dequantize(first), format);
    EXPECT_TRUE(torch::equal(ggml_blocks(first), ggml_blocks(second))) << weight_format_name(format);
    // Error per block, in steps d = |v|max / 8 (Q4_0) or (max - min) / 15 (Q4_1): half a step, but a
    // whole one in Q4_0 for values opposite the largest (+8 steps is clamped to +7); plus float16's
    // rounding of d (2^-11 relative, over up to 15 steps) and of m (2^-11 |min|).
    const auto blocks = weight.view({40, 4, 32});
    const bool q4_0 = format == WeightFormat::kQ4_0;
    const auto step = q4_0 ? blocks.abs().amax(-1, true) / 8.0 : (blocks.amax(-1, true) - blocks.amin(-1, true)) / 15.0;
    const auto float16 = step * 15.0 / 2048.0 + (q4_0 ? torch::zeros_like(step) : blocks.amin(-1, true).abs() / 2048.0);
    const auto error = (dequantize(first).view({40, 4, 32}) - blocks).abs();
    EXPECT_TRUE((error <= step * (q4_0 ? 1.0 : 0.5) + float16).all().item<bool>()) << weight_format_name(format);
    EXPECT_FALSE((error <= step * 0.45).all().item<bool>()) << weight_format_name(format);  // and the bound is not loose
  }
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

double half_at(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Value i of a ggml block (its bytes, as ggml lays them out) as an integer, and the block's d and m:
// Q8_0 d * q; Q4_0 d * (q - 8); Q4_1 d * q + m.
struct BlockValue {
  double d = 0, m = 0;
  int64_t q = 0;
};
BlockValue block_value(const uint8_t* block, WeightFormat format, int64_t i) {
  BlockValue value;
  value.d = half_at(block);
  if (format == WeightFormat::kQ8_0) {
    value.q = reinterpret_cast<const int8_t*>(block + 2)[i];
    return value;
  }
  const uint8_t* nibbles = block + (format == WeightFormat::kQ4_1 ? 4 : 2);
  value.q = i < 16 ? nibbles[i] & 0x0F : nibbles[i - 16] >> 4;
  if (format == WeightFormat::kQ4_0) value.q -= 8;
  if (format == WeightFormat::kQ4_1) value.m = half_at(block + 2);
  return value;
}

// The product the blocks stand for, rebuilt in double from ggml's bytes: per row and block,
// d_w * d_x * (sum of q_w q_x) + m_w * d_x * (sum of q_x), the input quantized as the products do;
// for the 4-bit formats as llama.cpp's activation blocks hold it: d_x in float16, and Q4_1's d_x *
// (sum of q_x) as float16(float32 d_x * sum) (block_q8_1's s).
torch::Tensor product_from_blocks(const torch::Tensor& x, const QuantizedWeight& weight) {
  const auto [scales, values] = quantize_rows_q8_0(x);  // [M, K/32], [M, K]
  const int64_t m_size = x.size(0), n_size = weight.out_features, blocks = weight.in_features / 32;
  const int64_t block_bytes = ggml_block_bytes(weight.format);
  auto out = torch::zeros({m_size, n_size}, torch::kFloat64);
  const auto w = ggml_blocks(weight);
  for (int64_t m = 0; m < m_size; ++m)
    for (int64_t n = 0; n < n_size; ++n) {
      double sum = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = w.data_ptr<uint8_t>() + (n * blocks + b) * block_bytes;
        int64_t dot = 0, x_sum = 0;
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t xq = values[m][b * 32 + i].item<int8_t>();
          dot += block_value(block, weight.format, i).q * xq;
          x_sum += xq;
        }
        const BlockValue scale = block_value(block, weight.format, 0);
        const float dx = scales[m][b].item<float>();
        const double dx_used = weight.format == WeightFormat::kQ8_0 ? dx : static_cast<float>(c10::Half(dx));
        const double s_used = static_cast<float>(c10::Half(dx * static_cast<float>(x_sum)));
        sum += scale.d * dx_used * static_cast<double>(dot) + scale.m * s_used;
      }
      out[m][n] = sum;
    }
  return out;
}

const std::vector<WeightFormat> kFormats = {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1};

TEST(QuantizedLinear, EveryKernelEqualsTheProductOfItsBlocks) {
  torch::manual_seed(5);
  const auto kernels = available_quantized_kernels();
  EXPECT_EQ(kernels.back(), "portable");
  torch::NoGradGuard no_grad;
  for (const auto format : kFormats)
    for (const auto& [m_size, n_size, k_size] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 32}, {1, 7, 96}, {3, 9, 64}, {17, 13, 160}, {2, 64, 576}}) {
      const auto x = torch::randn({m_size, k_size});
      const auto weight = quantize_weight(torch::randn({n_size, k_size}) * 0.1 + 0.02, format);
      const auto reference = product_from_blocks(x, weight);
      const auto bias = torch::randn({n_size});
      for (const auto& name : kernels) {
        ForcedKernel forced(name);
        const auto out = quantized_dense(x, weight).to(torch::kFloat64);
        // Exact int32 sums; float32 scaling and accumulation over K/32 blocks: 1e-5 relative.
        EXPECT_LE((out - reference).abs().max().item<double>(), 1e-5 * (reference.abs().max().item<double>() + 1))
            << weight_format_name(format) << " " << name << " M=" << m_size << " N=" << n_size << " K=" << k_size;
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
  // 4-bit weights: steps of about a sixth (Q4_1: range / 15) or a quarter (Q4_0: max / 8) of a
  // standard deviation, errors of about a 14th of one: 7-10%; a wrong nibble order is about 140%.
  for (const auto format : {WeightFormat::kQ4_0, WeightFormat::kQ4_1}) {
    const auto four_bit = quantized_dense(x, quantize_weight(weight, format));
    const double error = ((four_bit - dense).norm() / dense.norm()).item<double>();
    EXPECT_LT(error, 0.12) << weight_format_name(format);
    EXPECT_GT(error, 0.03) << weight_format_name(format);  // 4 bits, not 8
  }
}

TEST(QuantizedLinear, BadInputIsNamed) {
  try {
    quantize_q8_0(torch::randn({4, 48}));
    FAIL() << "a row of 48 values was quantized";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("48"), std::string::npos) << error.what();
  }
  EXPECT_THROW(weight_format_from_name("q3_k"), std::invalid_argument);
  EXPECT_EQ(weight_format_from_name("q8_0"), WeightFormat::kQ8_0);
  EXPECT_EQ(weight_format_from_name("q4_1"), WeightFormat::kQ4_1);
  EXPECT_EQ(weight_format_name(weight_format_from_name("q4_0")), "q4_0");
  EXPECT_THROW(quantize_weight(torch::randn({4, 48}), WeightFormat::kQ4_1), std::invalid_argument);
  EXPECT_THROW(from_ggml_blocks(torch::zeros({4 * 20}, torch::kUInt8), 4, 64, WeightFormat::kQ4_1), std::invalid_argument);
  EXPECT_THROW(force_quantized_kernel("sse9"), std::invalid_argument);
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
  for (const auto format : kFormats)
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(weight_format_name(format) + (tied ? ", tied" : ""));
    auto model = testing::tiny_model(blocks_config(tied));
    torch::NoGradGuard no_grad;
    auto quantized = with_quantized_weights(model, format);
    EXPECT_TRUE(quantized->output_quantized.defined());
    EXPECT_EQ(quantized->output_quantized.format, WeightFormat::kQ8_0);  // the head: 8 bits in every format
    EXPECT_EQ(quantized->layers[0]->as<DecoderLayer>()->mlp->down_quantized.format, format);
    EXPECT_EQ(quantized->layers[0]->as<DecoderLayer>()->self_attn->q_proj->weight.numel(), 0);
    // Held bytes: 34 (Q8_0) or 20 (Q4_1) per 32 weights in the projections instead of 4 per weight.
    EXPECT_LT(held_weight_bytes(quantized), held_weight_bytes(model));
    if (format != WeightFormat::kQ8_0) {
      auto eight_bit = with_quantized_weights(model, WeightFormat::kQ8_0);
      EXPECT_LT(held_weight_bytes(quantized), held_weight_bytes(eight_bit));
    }
    const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 2, 6, 6, 10, 44, 31}).view({1, -1});
    const auto dense = model->logits(model->forward_ids(ids).hidden);      // [1, T, V]
    const auto full = quantized->logits(quantized->forward_ids(ids).hidden);
    // 8-bit weights and inputs through two random layers (weights of std 0.3, so no layer is
    // near the identity): 5-6% here; a wrong block or transposed product is off by about 100%.
    // 4-bit weights are 51-53% off the dense model here, so they are checked against the model
    // whose weights are their blocks' values instead: only the inputs' 8-bit rounding differs.
    if (format == WeightFormat::kQ8_0) {
      EXPECT_LT(((full - dense).norm() / dense.norm()).item<double>(), 0.1);
    } else if (!tied) {
      auto blocks_values = testing::tiny_model(blocks_config(tied));
      for (size_t i = 0; i < blocks_values->layers->size(); ++i) {
        auto& to = *blocks_values->layers[i]->as<DecoderLayer>();
        const auto& from = *quantized->layers[i]->as<DecoderLayer>();
        to.self_attn->q_proj->weight.copy_(dequantize(from.self_attn->q_quantized));
        to.self_attn->k_proj->weight.copy_(dequantize(from.self_attn->k_quantized));
        to.self_attn->v_proj->weight.copy_(dequantize(from.self_attn->v_quantized));
        to.self_attn->o_proj->weight.copy_(dequantize(from.self_attn->o_quantized));
        to.mlp->gate_proj->weight.copy_(dequantize(from.mlp->gate_quantized));
        to.mlp->up_proj->weight.copy_(dequantize(from.mlp->up_quantized));
        to.mlp->down_proj->weight.copy_(dequantize(from.mlp->down_quantized));
      }
      blocks_values->lm_head->weight.copy_(dequantize(quantized->output_quantized));
      const auto reference = blocks_values->logits(blocks_values->forward_ids(ids).hidden);
      EXPECT_LT(((full - reference).norm() / reference.norm()).item<double>(), 0.1);
    }
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
  for (const auto format : kFormats) {
  SCOPED_TRACE(weight_format_name(format));
  auto model = testing::tiny_model(blocks_config(true));
  torch::NoGradGuard no_grad;
  auto quantized = with_quantized_weights(model, format);
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
  }
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
