// ggml's block formats against gguf-py's dequantizer (tests/reference/ggml_blocks_reference.py):
// random blocks of every type, read by our GGUF reader, equal gguf-py's float32 values.
#include <gtest/gtest.h>

#include <cstring>

#include "model/ggml_blocks.h"
#include "io/gguf.h"
#include "support/reference_python.h"
#include "support/temp_dir.h"

namespace coconut {
namespace {

using testing::TempDir;

TEST(GgmlBlocks, EveryTypeEqualsGgufPysDequantizer) {
  TempDir dir;
  ASSERT_TRUE(testing::run_reference("ggml_blocks_reference.py", dir.path().string(), dir.file("log")));
  const GgufFile blocks = read_gguf(dir.file("blocks.gguf"));
  const GgufFile reference = read_gguf(dir.file("reference.gguf"));
  const std::vector<std::string> expected_types = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
                                                   "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16"};
  ASSERT_EQ(blocks.tensors.size(), expected_types.size());
  for (const std::string& type : expected_types) {
    const GgufTensorInfo* stored = blocks.find_tensor(type);
    ASSERT_NE(stored, nullptr) << type;
    EXPECT_EQ(ggml_type_name(stored->type), type);
    const torch::Tensor ours = read_gguf_tensor(blocks, *stored).to(torch::kFloat32);
    const torch::Tensor theirs = read_gguf_tensor(reference, *reference.find_tensor(type));
    ASSERT_EQ(ours.sizes(), theirs.sizes()) << type;
    // Both compute each value in float32 from the same operands: equal up to the last bit of a
    // fused or reordered product (scale * q - min).
    const double tolerance = 1e-6 * theirs.abs().max().item<double>();
    EXPECT_LE((ours - theirs).abs().max().item<double>(), tolerance) << type;
    EXPECT_GT(theirs.abs().max().item<double>(), 0) << type;
  }
}

// Hand-made blocks whose values are known without any reference.
TEST(GgmlBlocks, HandMadeBlocksGiveTheirValues) {
  // Q8_0: d = 0.5 (f16 0x3800), q = -16..15 -> -8..7.5
  std::vector<uint8_t> q8(34);
  const uint16_t half = 0x3800;
  std::memcpy(q8.data(), &half, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  std::vector<float> out(32);
  dequantize_ggml(static_cast<uint32_t>(GgmlType::kQ8_0), q8.data(), 32, out.data());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 16));
  // Q4_1: d = 0.5, m = -1 (f16 0xBC00); byte j holds element j (low nibble) and j + 16 (high).
  std::vector<uint8_t> q41(20);
  const uint16_t minus_one = 0xBC00;
  std::memcpy(q41.data(), &half, 2);
  std::memcpy(q41.data() + 2, &minus_one, 2);
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  dequantize_ggml(static_cast<uint32_t>(GgmlType::kQ4_1), q41.data(), 32, out.data());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * static_cast<float>(j) - 1.0f);
    EXPECT_EQ(out[j + 16], 0.5f * static_cast<float>(15 - j) - 1.0f);
  }
}

TEST(GgmlBlocks, UnconvertibleTypesAndPartialBlocksAreRefusedByName) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> out(256);
  try {
    dequantize_ggml(16, bytes.data(), 256, out.data());  // IQ2_XXS
    FAIL() << "IQ2_XXS converted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("IQ2_XXS"), std::string::npos) << error.what();
  }
  EXPECT_THROW(dequantize_ggml(static_cast<uint32_t>(GgmlType::kQ4_K), bytes.data(), 100, out.data()), std::invalid_argument);
  EXPECT_EQ(ggml_type_name(77), "type 77");
  EXPECT_FALSE(ggml_block_layout(4).has_value());  // retired
}

}  // namespace
}  // namespace coconut
