// ggml's tensor types: their names, block layouts, and dequantization of the block formats to
// float32, following ggml's own block definitions (ggml-common.h) and reference dequantizers
// (ggml-quants.c). Checked block by block against gguf-py's dequantizer (tests/io_ggml_blocks_test.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace coconut {

enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9, kQ2_K = 10, kQ3_K = 11,
  kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};

// Elements per block and bytes per block (1 and the element size for plain types).
struct BlockLayout {
  uint64_t elements, bytes;
};

// The layout of any type ggml defines (including those this code cannot convert), or nullopt for
// an id ggml does not define (the retired 4, 5 and 31-33, anything past the last).
std::optional<BlockLayout> ggml_block_layout(uint32_t type);
// "Q4_K", "F16", ...; "type 77" for an id ggml does not define.
std::string ggml_type_name(uint32_t type);

// Whether dequantize_ggml converts `type`: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K.
bool ggml_type_dequantizable(uint32_t type);

// A float16 as ggml stores it (2 bytes, little-endian), in float32.
float ggml_half(const uint8_t* bytes);
// The 8 6-bit scales and 8 mins of Q4_K / Q5_K's 12 packed scale bytes (ggml's get_scale_min_k4 for
// j = 0..7), four bytes at a time: bytes 0-3 hold scales 0-3 in their low 6 bits and the top 2 bits
// of scales 4-7; bytes 4-7 the same of the mins; bytes 8-11 the low nibbles of scales 4-7 (low) and
// mins 4-7 (high); byte j of a word at bits 8j (little-endian, as every target here). Inline: decode
// runs it for every super-block of every row (out of line, one sub-block a call, it took 11% of a
// Q4_K_M file's decode).
// As four words of bytes: scales 0-3, scales 4-7, mins 0-3, mins 4-7 (the row kernels widen them in
// vectors).
inline void k4_scales_mins_words(const uint8_t* packed, uint32_t (&words)[4]) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0xc0c0c0c0;
  words[0] = a & kLow6;
  words[1] = (c & kLow4) | ((a & kTop2) >> 2);
  words[2] = b & kLow6;
  words[3] = ((c >> 4) & kLow4) | ((b & kTop2) >> 2);
}

inline void k4_scales_mins(const uint8_t* packed, int16_t* scales, int16_t* mins) {
  uint32_t words[4];
  k4_scales_mins_words(packed, words);
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<int16_t>((words[0] >> (8 * j)) & 0xff);
    scales[j + 4] = static_cast<int16_t>((words[1] >> (8 * j)) & 0xff);
    mins[j] = static_cast<int16_t>((words[2] >> (8 * j)) & 0xff);
    mins[j + 4] = static_cast<int16_t>((words[3] >> (8 * j)) & 0xff);
  }
}

// `elements` values of `type` (a whole number of blocks) from `blocks` into `out`. Throws
// std::invalid_argument for a type it cannot convert or a count that is not whole blocks.
void dequantize_ggml(uint32_t type, const uint8_t* blocks, int64_t elements, float* out);

}  // namespace coconut
