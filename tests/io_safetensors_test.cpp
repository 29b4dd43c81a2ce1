// safetensors reading and writing: round trips for every dtype, and one test per malformed file.
#include <gtest/gtest.h>

#include <fstream>

#include "io/safetensors.h"
#include "support/temp_dir.h"

using namespace coconut;
using coconut::testing::TempDir;

namespace {

// Writes a file from a raw header and data section.
void write_raw(const std::string& path, const std::string& header, const std::string& data, int64_t lie_length = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t length = lie_length >= 0 ? static_cast<uint64_t>(lie_length) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
  out << header << data;
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeBitExactly) {
  TempDir dir;
  TensorMap tensors;
  tensors["a.f32"] = torch::randn({3, 5});
  tensors["b.f16"] = torch::randn({7}).to(torch::kFloat16);
  tensors["c.bf16"] = torch::randn({2, 2, 3}).to(torch::kBFloat16);
  tensors["d.i64"] = torch::arange(10);
  tensors["e.scalar"] = torch::tensor(3.5);
  tensors["f.empty"] = torch::zeros({0, 4});
  write_safetensors(dir.file("x.safetensors"), tensors);
  const auto loaded = read_safetensors(dir.file("x.safetensors"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_TRUE(loaded.count(name)) << name;
    EXPECT_EQ(loaded.at(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(loaded.at(name), tensor)) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.safetensors.tmp")));
}

TEST(Safetensors, HeaderIsPaddedSoDataIsAligned) {
  TempDir dir;
  write_safetensors(dir.file("x.safetensors"), {{"w", torch::ones({3})}});
  std::ifstream in(dir.file("x.safetensors"), std::ios::binary);
  unsigned char bytes[8];
  in.read(reinterpret_cast<char*>(bytes), 8);
  EXPECT_EQ(bytes[0] % 8, 0);
}

TEST(Safetensors, FileShorterThanHeaderLength) {
  TempDir dir;
  std::ofstream(dir.file("short.safetensors"), std::ios::binary) << "abc";
  EXPECT_THROW_WITH(read_safetensors(dir.file("short.safetensors")), "short.safetensors", "truncated");
}

TEST(Safetensors, HeaderLengthLargerThanFile) {
  TempDir dir;
  write_raw(dir.file("lie.safetensors"), "{}", "", 1000);
  EXPECT_THROW_WITH(read_safetensors(dir.file("lie.safetensors")), "lie.safetensors", "exceeds the file size");
}

TEST(Safetensors, MalformedHeaderJson) {
  TempDir dir;
  write_raw(dir.file("bad.safetensors"), "{\"w\": {\"dtype\": ", "");
  EXPECT_THROW_WITH(read_safetensors(dir.file("bad.safetensors")), "bad.safetensors", "malformed");
  write_raw(dir.file("deep.safetensors"), std::string(5000, '[') + std::string(5000, ']'), "");
  EXPECT_THROW_WITH(read_safetensors(dir.file("deep.safetensors")), "deep.safetensors", "nested deeper");
  std::filesystem::create_directories(dir.file("folder.safetensors"));
  EXPECT_THROW_WITH(read_safetensors(dir.file("folder.safetensors")), "folder.safetensors", "is a folder");
}

TEST(Safetensors, UnknownDtype) {
  TempDir dir;
  write_raw(dir.file("d.safetensors"), R"({"w": {"dtype": "F8_E9", "shape": [1], "data_offsets": [0, 1]}})", "x");
  EXPECT_THROW_WITH(read_safetensors(dir.file("d.safetensors")), "d.safetensors", "'w'", "unknown dtype");
}

TEST(Safetensors, OffsetsBeyondData) {
  TempDir dir;
  write_raw(dir.file("o.safetensors"), R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
            std::string(8, '\0'));
  EXPECT_THROW_WITH(read_safetensors(dir.file("o.safetensors")), "o.safetensors", "'w'", "outside the data section");
}

TEST(Safetensors, OffsetsDisagreeWithShape) {
  TempDir dir;
  write_raw(dir.file("s.safetensors"), R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})",
            std::string(16, '\0'));
  EXPECT_THROW_WITH(read_safetensors(dir.file("s.safetensors")), "s.safetensors", "'w'", "need 12");
}

TEST(Safetensors, OverlappingTensors) {
  TempDir dir;
  write_raw(dir.file("v.safetensors"),
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(12, '\0'));
  EXPECT_THROW_WITH(read_safetensors(dir.file("v.safetensors")), "v.safetensors", "'b'", "overlapping");
}

TEST(Safetensors, TruncatedDataSection) {
  TempDir dir;
  write_safetensors(dir.file("t.safetensors"), {{"a", torch::ones({4})}, {"b", torch::ones({4})}});
  std::filesystem::resize_file(dir.file("t.safetensors"), std::filesystem::file_size(dir.file("t.safetensors")) - 4);
  EXPECT_THROW_WITH(read_safetensors(dir.file("t.safetensors")), "t.safetensors", "'b'");
}

TEST(Safetensors, MissingFile) {
  EXPECT_THROW_WITH(read_safetensors("/nonexistent/m.safetensors"), "/nonexistent/m.safetensors", "cannot open");
}
