// Weights held in ggml's own rows (Q5_0, Q4_K, Q5_K, Q6_K; model/quantized_linear.h) against naive
// references: the input quantized as ggml's quantize_row_q8_K_ref and llama.cpp's Q8_0 activations,
// re-implemented here; each product against float64 sums of the dequantized weight
// (model/ggml_blocks.h, checked against gguf-py in io_ggml_blocks_test) times the dequantized input;
// every kernel this CPU has.
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/ggml_blocks.h"
#include "model/quantized_ggml_rows.h"
#include "support/random_blocks.h"
#include "model/quantized_linear.h"

namespace coconut {
namespace {

using coconut::testing::random_rows;

// ggml's quantize_row_q8_K_ref, a block of 256 at a time.
void naive_q8_k(const float* x, int64_t width, std::vector<float>& d, std::vector<int>& q) {
  for (int64_t b = 0; b < width / 256; ++b) {
    float max = 0, amax = 0;
    for (int64_t j = 0; j < 256; ++j)
      if (std::fabs(x[b * 256 + j]) > amax) amax = std::fabs(x[b * 256 + j]), max = x[b * 256 + j];
    const float iscale = amax == 0 ? 0 : -127.0f / max;
    for (int64_t j = 0; j < 256; ++j) q.push_back(amax == 0 ? 0 : std::min(127, static_cast<int>(std::nearbyint(iscale * x[b * 256 + j]))));
    d.push_back(amax == 0 ? 0 : 1 / iscale);
  }
}

// llama.cpp's Q8_0 activations for Q5_0: d = max|x| / 127 per 32, q = nearest(x / d), d as float16.
void naive_q8_0(const float* x, int64_t width, std::vector<float>& d, std::vector<int>& q) {
  for (int64_t b = 0; b < width / 32; ++b) {
    float amax = 0;
    for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float scale = amax / 127.0f, inverse = scale != 0 ? 1.0f / scale : 0.0f;
    for (int64_t j = 0; j < 32; ++j) q.push_back(static_cast<int>(std::nearbyint(x[b * 32 + j] * inverse)));
    d.push_back(static_cast<float>(c10::Half(scale)));
  }
}

// out[m, n] in float64 from the dequantized weight and the dequantized input, with the bound of
// float32 rounding: 1e-5 of the sum of the terms' magnitudes.
std::pair<torch::Tensor, torch::Tensor> reference_product(const torch::Tensor& x, const torch::Tensor& rows, WeightFormat format,
                                                          int64_t columns) {
  const int64_t m_size = x.size(0), n_size = rows.size(0);
  auto weight = torch::empty({n_size, columns}, torch::kFloat32);
  const auto type = format == WeightFormat::kQ5_0 ? GgmlType::kQ5_0 : format == WeightFormat::kQ4_K ? GgmlType::kQ4_K
                    : format == WeightFormat::kQ5_K ? GgmlType::kQ5_K : GgmlType::kQ6_K;
  dequantize_ggml(static_cast<uint32_t>(type), rows.data_ptr<uint8_t>(), n_size * columns, weight.data_ptr<float>());
  auto input = torch::empty({m_size, columns}, torch::kFloat64);
  for (int64_t m = 0; m < m_size; ++m) {
    std::vector<float> d;
    std::vector<int> q;
    const float* row = x.data_ptr<float>() + m * columns;
    const int64_t block = format == WeightFormat::kQ5_0 ? 32 : 256;
    block == 32 ? naive_q8_0(row, columns, d, q) : naive_q8_k(row, columns, d, q);
    for (int64_t k = 0; k < columns; ++k) input[m][k] = static_cast<double>(d[k / block]) * q[k];
  }
  const auto w = weight.to(torch::kFloat64);
  return {torch::matmul(input, w.t()), torch::matmul(input.abs(), w.abs().t()) * 1e-5 + 1e-7};
}

TEST(GgmlRows, ProductsEqualTheDequantizedWeightTimesTheQuantizedInput) {
  // 6 super-blocks a row: the decode kernels' four at a time and two left over.
  const int64_t columns = 1536, rows = 19;
  for (auto format : {WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K, WeightFormat::kQ5_0}) {
    SCOPED_TRACE(weight_format_name(format));
    const auto blocks = random_rows(format, rows, columns, 7 + static_cast<int>(format));
    const QuantizedWeight weight = from_ggml_blocks(blocks, rows, columns, format);
    EXPECT_TRUE(torch::equal(ggml_blocks(weight), blocks));  // held as the file has them
    torch::manual_seed(3);
    for (int64_t m_size : {1, 5, 13}) {  // 13: the VNNI tiles' 4 input rows at a time, and 1 left over
      auto x = torch::randn({m_size, columns}) * 2;
      x[0][17] = 0;
      if (m_size > 1) x[1].zero_();  // an all-zero input row: d = 0
      const auto [expected, bound] = reference_product(x, blocks, format, columns);
      for (const auto& kernel : available_quantized_kernels()) {
        force_quantized_kernel(kernel);
        const auto output = quantized_dense(x, weight);
        force_quantized_kernel("");
        const auto difference = (output.to(torch::kFloat64) - expected).abs();
        EXPECT_TRUE((difference <= bound).all().item<bool>())
            << kernel << " M=" << m_size << ": largest difference " << difference.max().item<double>();
      }
      // bf16 inputs are widened as they are; the results rounded to bf16.
      const auto narrow = x.to(torch::kBFloat16);
      EXPECT_TRUE(torch::equal(quantized_dense(narrow, weight), quantized_dense(narrow.to(torch::kFloat32), weight).to(torch::kBFloat16)));
    }
    // Rows of the weight share its bytes and give the same products (Q5_0, held in groups of 8
    // rows, from a group's first row).
    const auto x = torch::randn({2, columns});
    const int64_t first = held_as_ggml_rows(format) ? 5 : 8, count = held_as_ggml_rows(format) ? 9 : rows - 8;
    const auto part = weight_rows(weight, first, count);
    EXPECT_TRUE(torch::equal(quantized_dense(x, part), quantized_dense(x, weight).narrow(1, first, count)));
    EXPECT_TRUE(torch::equal(dequantize(part), dequantize(weight).narrow(0, first, count)));
    EXPECT_THROW(from_ggml_blocks(blocks.narrow(0, 0, 18), rows, columns, format), std::invalid_argument);
    EXPECT_THROW(quantize_weight(torch::randn({8, columns}), format), std::invalid_argument);  // they come from files
  }
}

// The VNNI decode kernels ask for the weights 4 KiB ahead to the first-level cache or 16 KiB ahead
// to the second (ProductKind::kKQuantPrefetch): the same bits either way, for one to three input
// rows, each k-quant format.
TEST(GgmlRows, DecodeKernelsGiveTheSameBitsPrefetchingNearOrFar) {
  const auto kernels = available_quantized_kernels();
  if (std::find(kernels.begin(), kernels.end(), "vnni") == kernels.end()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  const int64_t columns = 1536, rows = 19;
  for (auto format : {WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K}) {
    SCOPED_TRACE(weight_format_name(format));
    const auto blocks = random_rows(format, rows, columns, 5 + static_cast<int>(format)).contiguous();
    for (int64_t m_size : {1, 3}) {
      const auto x = torch::randn({m_size, columns});
      const auto input = ggml_rows::quantize_q8_k(x.const_data_ptr<float>(), m_size, columns);
      torch::Tensor results[2];
      for (int far = 0; far < 2; ++far) {
        results[far] = torch::full({m_size, rows}, std::numeric_limits<float>::quiet_NaN());
        const ggml_rows::ProductOut out{results[far].data_ptr(), rows, ggml_rows::ProductOut::kFloat32};
        ggml_rows::rows_times_q8_k(blocks.const_data_ptr<uint8_t>(), format, 0, rows, input, 0, out, far == 1);
      }
      EXPECT_FALSE(results[0].isnan().any().item<bool>());
      EXPECT_TRUE(torch::equal(results[0], results[1])) << "M=" << m_size;
    }
  }
}

// An embedding table kept in blocks is looked up row by row: each row as the whole weight
// dequantizes it, in every format (the grouped ones across a last group of 3 rows).
TEST(GgmlRows, DequantizedRowsAreTheWeightsRows) {
  const int64_t columns = 512, rows = 19;
  const auto ids = torch::tensor({{18, 0, 7}, {8, 18, 16}}, torch::kInt64);  // [2, 3]: any shape, repeats
  torch::manual_seed(11);
  for (auto format : {WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K, WeightFormat::kQ5_0, WeightFormat::kQ8_0,
                      WeightFormat::kQ4_0, WeightFormat::kQ4_1}) {
    SCOPED_TRACE(weight_format_name(format));
    const QuantizedWeight weight = held_as_ggml_rows(format) || format == WeightFormat::kQ5_0  // from files only
                                       ? from_ggml_blocks(random_rows(format, rows, columns, 3), rows, columns, format)
                                       : quantize_weight(torch::randn({rows, columns}), format);
    const auto looked_up = dequantize_rows(weight, ids);
    EXPECT_EQ(looked_up.sizes(), (std::vector<int64_t>{6, columns}));
    EXPECT_TRUE(torch::equal(looked_up, dequantize(weight).index_select(0, ids.view({-1}))));
    EXPECT_THROW(dequantize_rows(weight, torch::tensor({rows})), std::out_of_range);
    EXPECT_THROW(dequantize_rows(weight, torch::tensor({-1})), std::out_of_range);
  }
}

TEST(GgmlRows, InputIsQuantizedAsGgmlsQ8K) {
  torch::manual_seed(5);
  auto x = torch::randn({3, 512});
  x[1].zero_();
  x[2][40] = -9.0f;  // the largest magnitude negative: d positive
  // Ties of magnitude: the first value of the largest magnitude sets d's sign, in either order.
  x[0][7] = 5.0f, x[0][9] = -5.0f;
  x[0][300] = -6.0f, x[0][301] = 6.0f;
  for (const std::string kernel : {"", "portable"}) {  // the vector quantizer where the CPU has it, the scalar loop
    SCOPED_TRACE(kernel);
    force_quantized_kernel(kernel);
    const auto [scales, values] = quantize_rows_q8_k(x);
    force_quantized_kernel("");
    for (int64_t m = 0; m < 3; ++m) {
      std::vector<float> d;
      std::vector<int> q;
      naive_q8_k(x.data_ptr<float>() + m * 512, 512, d, q);
      for (int64_t b = 0; b < 2; ++b) EXPECT_EQ(scales[m][b].item<float>(), d[b]) << m << " " << b;
      for (int64_t k = 0; k < 512; ++k) ASSERT_EQ(values[m][k].item<int>(), q[k]) << m << " " << k;
    }
    EXPECT_GT(scales[2][0].item<float>(), 0);
    EXPECT_EQ(values[2][40].item<int>(), -127);
    EXPECT_LT(scales[0][0].item<float>(), 0);
    EXPECT_EQ(values[0][7].item<int>(), -127);
    EXPECT_GT(scales[0][1].item<float>(), 0);
    EXPECT_EQ(values[0][300].item<int>(), -127);
  }
}

// ProductOut::put_row (every quantized kernel's store): the bits c10's casts give, in every dtype, for
// every length around the 8- and 16-wide vector paths, with ties to even, NaN, infinities and
// subnormals among the values, at an offset inside a row.
TEST(GgmlRows, StoredRowsAreTorchsCasts) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> values(40);
  for (auto& v : values) v = normal(rng);
  values[1] = std::numeric_limits<float>::quiet_NaN();
  values[3] = -std::numeric_limits<float>::infinity();
  values[5] = 1.0f + 1.0f / 256;   // a tie: rounds down to even
  values[6] = 1.0f + 3.0f / 256;   // a tie: rounds up to even
  values[9] = 1e-40f;              // subnormal
  values[12] = -0.0f;
  values[17] = 3.4e38f;            // rounds to infinity in bf16
  values[20] = -std::numeric_limits<float>::quiet_NaN();
  const int64_t n_size = 50, first = 3, m = 1;
  for (int64_t count : {1, 7, 8, 9, 15, 16, 17, 24, 33, 40}) {
    std::vector<float> f32(2 * n_size, -1);
    std::vector<c10::BFloat16> bf16(2 * n_size, c10::BFloat16(-1.0f));
    std::vector<c10::Half> f16(2 * n_size, c10::Half(-1.0f));
    ggml_rows::ProductOut{f32.data(), n_size, ggml_rows::ProductOut::kFloat32}.put_row(m, first, values.data(), count);
    ggml_rows::ProductOut{bf16.data(), n_size, ggml_rows::ProductOut::kBFloat16}.put_row(m, first, values.data(), count);
    ggml_rows::ProductOut{f16.data(), n_size, ggml_rows::ProductOut::kHalf}.put_row(m, first, values.data(), count);
    for (int64_t i = 0; i < 2 * n_size; ++i) {
      const int64_t k = i - (m * n_size + first);
      const bool written = k >= 0 && k < count;
      const float expected = written ? values[k] : -1.0f;
      uint32_t got_bits, expected_bits;
      std::memcpy(&got_bits, &f32[i], 4);
      std::memcpy(&expected_bits, &expected, 4);
      ASSERT_EQ(got_bits, expected_bits) << "float32, count " << count << " at " << i;
      ASSERT_EQ(bf16[i].x, c10::BFloat16(expected).x) << "bf16, count " << count << " at " << i << " value " << expected;
      ASSERT_EQ(f16[i].x, c10::Half(expected).x) << "f16, count " << count << " at " << i;
    }
  }
}

TEST(GgmlRows, FormatNamesAndWidths) {
  for (const char* name : {"q5_0", "q4_k", "q5_k", "q6_k", "gguf"}) EXPECT_EQ(weight_format_name(weight_format_from_name(name)), name);
  EXPECT_EQ(ggml_block_bytes(WeightFormat::kQ4_K), 144);
  EXPECT_EQ(ggml_block_bytes(WeightFormat::kQ5_K), 176);
  EXPECT_EQ(ggml_block_bytes(WeightFormat::kQ6_K), 210);
  EXPECT_EQ(ggml_block_bytes(WeightFormat::kQ5_0), 22);
  EXPECT_FALSE(held_as_ggml_rows(WeightFormat::kQ5_0));  // in groups of 8 rows, as Q4's
  EXPECT_TRUE(held_as_ggml_rows(WeightFormat::kQ6_K));
  EXPECT_EQ(block_values(WeightFormat::kQ6_K), 256);
  EXPECT_THROW(ggml_block_bytes(WeightFormat::kGguf), std::invalid_argument);
  const auto blocks = random_rows(WeightFormat::kQ4_K, 4, 256, 1);
  EXPECT_THROW(quantized_dense(torch::randn({1, 288}), from_ggml_blocks(blocks, 4, 256, WeightFormat::kQ4_K)), std::exception);
}

}  // namespace
}  // namespace coconut
