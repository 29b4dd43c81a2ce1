#include "model/quantized_linear.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include <unistd.h>

#include "model/cpu_product_choice.h"
#include "model/ggml_blocks.h"
#include "model/huge_pages.h"
#include "model/quantized_ggml_rows.h"
#include "model/x86_intrinsics.h"

namespace coconut {

WeightFormat weight_format_from_name(const std::string& name) {
  if (name == "dense") return WeightFormat::kDense;
  if (name == "q8_0") return WeightFormat::kQ8_0;
  if (name == "q4_0") return WeightFormat::kQ4_0;
  if (name == "q4_1") return WeightFormat::kQ4_1;
  if (name == "q5_0") return WeightFormat::kQ5_0;
  if (name == "q4_k") return WeightFormat::kQ4_K;
  if (name == "q5_k") return WeightFormat::kQ5_K;
  if (name == "q6_k") return WeightFormat::kQ6_K;
  if (name == "gguf") return WeightFormat::kGguf;
  throw std::invalid_argument("weight format must be dense, q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k or gguf, got '" + name + "'");
}

std::string weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0: return "q8_0";
    case WeightFormat::kQ4_0: return "q4_0";
    case WeightFormat::kQ4_1: return "q4_1";
    case WeightFormat::kQ5_0: return "q5_0";
    case WeightFormat::kQ4_K: return "q4_k";
    case WeightFormat::kQ5_K: return "q5_k";
    case WeightFormat::kQ6_K: return "q6_k";
    case WeightFormat::kGguf: return "gguf";
    case WeightFormat::kDense: break;
  }
  return "dense";
}

bool held_as_ggml_rows(WeightFormat format) {
  return format == WeightFormat::kQ4_K || format == WeightFormat::kQ5_K || format == WeightFormat::kQ6_K;
}

int64_t block_values(WeightFormat format) {
  if (format == WeightFormat::kDense || format == WeightFormat::kGguf)
    throw std::invalid_argument(weight_format_name(format) + " is not a block format");
  return format == WeightFormat::kQ4_K || format == WeightFormat::kQ5_K || format == WeightFormat::kQ6_K ? 256 : kQ8_0BlockValues;
}

int64_t ggml_block_bytes(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0: return kQ8_0BlockBytes;
    case WeightFormat::kQ4_0: return kQ4_0BlockBytes;
    case WeightFormat::kQ4_1: return kQ4_1BlockBytes;
    case WeightFormat::kQ5_0: return kQ5_0BlockBytes;
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
    case WeightFormat::kQ6_K: return ggml_rows::block_bytes(format);
    case WeightFormat::kDense:
    case WeightFormat::kGguf: break;
  }
  throw std::invalid_argument(weight_format_name(format) + " weights have no blocks of their own");
}

namespace {

// One weight block of 32 values: d = max|v| / 127, q = roundf(v * (1/d)), as ggml's reference quantizer.
inline float quantize_weight_block(const float* values, int8_t* q) {
  float amax = 0;
  for (int64_t i = 0; i < kQ8_0BlockValues; ++i) amax = std::max(amax, std::fabs(values[i]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int64_t i = 0; i < kQ8_0BlockValues; ++i) q[i] = static_cast<int8_t>(std::roundf(values[i] * id));
  return d;
}

inline float half_to_float(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void check_blocks(const torch::Tensor& values, const char* what, WeightFormat format = WeightFormat::kQ8_0) {
  if (values.size(-1) % kQ8_0BlockValues != 0)
    throw std::invalid_argument(weight_format_name(format) + " " + what + " need rows of a multiple of 32 values, got " +
                                std::to_string(values.size(-1)));
}

bool is_q4(WeightFormat format) { return format == WeightFormat::kQ4_0 || format == WeightFormat::kQ4_1; }
// Formats held as 4-bit values in the interleaved vectors below (Q5_0 with its fifth bits beside them).
bool held_as_nibbles(WeightFormat format) { return is_q4(format) || format == WeightFormat::kQ5_0; }
int64_t group_block_bytes(WeightFormat format) {
  return format == WeightFormat::kQ5_0 ? kQ5_0GroupBlockBytes : is_q4(format) ? kQ4GroupBlockBytes : kQ8_0GroupBlockBytes;
}

// Where row r's block b lives in the held layout: its scale and its chunk c.
inline uint8_t* group_block(uint8_t* packed, int64_t blocks, int64_t row, int64_t block, int64_t block_bytes = kQ8_0GroupBlockBytes) {
  return packed + ((row / kQ8_0GroupRows) * blocks + block) * block_bytes;
}
constexpr int64_t kScalesBytes = 2 * kQ8_0GroupRows;  // 16
inline int64_t chunk_offset(int64_t row, int64_t chunk) {
  return kScalesBytes + chunk * 4 * kQ8_0GroupRows + (row % kQ8_0GroupRows) * 4;
}
// Q4 (Q5_0): row r's ggml nibble byte i (0..15) of a block, in the held layout (after the 8 d and
// 8 m, Q5_0's 8 d and 8 qh).
constexpr int64_t kQ4NibblesAt = 2 * kScalesBytes, kQ5_0HighBitsAt = kScalesBytes, kQ5_0NibblesAt = kScalesBytes + 4 * kQ8_0GroupRows;
inline int64_t nibble_offset(int64_t row, int64_t byte, int64_t nibbles_at = kQ4NibblesAt) {
  return nibbles_at + (byte / 4) * 4 * kQ8_0GroupRows + (row % kQ8_0GroupRows) * 4 + byte % 4;
}
// Q4: value i (0..31) of row r's block in the held layout.
inline int32_t q4_value(const uint8_t* block, int64_t row, int64_t i) {
  const uint8_t byte = block[nibble_offset(row, i % 16)];
  return i < 16 ? byte & 0x0F : byte >> 4;
}

// Input rows quantized for the kernels: scales [M, K/32], values [M, K], sums of each block's values.
// For the 4-bit formats also each scale rounded to float16, as llama.cpp's activation blocks hold it,
// and the scale times the sum (Q4_1: float16(scale * sum), block_q8_1's s; Q4_0: the float16 scale
// times the sum), so that a 4-bit model's greedy text follows llama.cpp's on the same file.
struct InputBlocks {
  int64_t rows = 0;
  const float* scales = nullptr;
  const int8_t* values = nullptr;
  const int32_t* sums = nullptr;
  const float* half_scales = nullptr;
  const float* half_scaled_sums = nullptr;
};

using ggml_rows::ProductOut;
// A contiguous float32, bf16 or f16 output [M, N] as the kernels store into it.
ProductOut product_out_of(torch::Tensor& out) {
  const auto type = out.scalar_type() == torch::kBFloat16 ? ProductOut::kBFloat16
                    : out.scalar_type() == torch::kHalf   ? ProductOut::kHalf
                                                          : ProductOut::kFloat32;
  return {out.data_ptr(), out.size(1), type};
}

// Groups [group_begin, group_end) of 8 weight rows against every input row: out[m, n].
using GroupsKernel = void (*)(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin,
                              int64_t group_end, const ProductOut& out);

// Stores a group's 8 sums of input row m, fewer past the last row.
inline void store_group(const float* sums, int64_t group, int64_t m, const ProductOut& out) {
  const int64_t first = group * kQ8_0GroupRows;
  out.put_row(m, first, sums, std::min(kQ8_0GroupRows, out.n_size - first));
}

void groups_portable(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin, int64_t group_end,
                     const ProductOut& out) {
  const int64_t m_size = x.rows;
  const float* xd = x.scales;
  const int8_t* xq = x.values;
  for (int64_t group = group_begin; group < group_end; ++group) {
    for (int64_t m = 0; m < m_size; ++m) {
      float sums[kQ8_0GroupRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = packed + (group * blocks + b) * kQ8_0GroupBlockBytes;
        const int8_t* values = xq + (m * blocks + b) * kQ8_0BlockValues;
        for (int64_t r = 0; r < kQ8_0GroupRows; ++r) {
          int32_t dot = 0;
          for (int64_t i = 0; i < kQ8_0BlockValues; ++i)
            dot += (int32_t{block[chunk_offset(r, i / 4) + i % 4]} - 128) * int32_t{values[i]};
          sums[r] += half_to_float(block + 2 * r) * xd[m * blocks + b] * static_cast<float>(dot);
        }
      }
      store_group(sums, group, m, out);
    }
  }
}

// Q4: per row and block, d_w * d_x * (sum of q_w q_x) + m_w * d_x * (sum of q_x) (d_x and d_x * sum
// of q_x in float16, InputBlocks).
void groups_q4_portable(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin, int64_t group_end,
                        const ProductOut& out) {
  for (int64_t group = group_begin; group < group_end; ++group) {
    for (int64_t m = 0; m < x.rows; ++m) {
      float sums[kQ8_0GroupRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = packed + (group * blocks + b) * kQ4GroupBlockBytes;
        const int8_t* values = x.values + (m * blocks + b) * kQ8_0BlockValues;
        const float dx = x.half_scales[m * blocks + b], sx = x.half_scaled_sums[m * blocks + b];
        for (int64_t r = 0; r < kQ8_0GroupRows; ++r) {
          int32_t dot = 0;
          for (int64_t i = 0; i < kQ8_0BlockValues; ++i) dot += q4_value(block, r, i) * int32_t{values[i]};
          sums[r] += half_to_float(block + 2 * r) * dx * static_cast<float>(dot) + half_to_float(block + kScalesBytes + 2 * r) * sx;
        }
      }
      store_group(sums, group, m, out);
    }
  }
}

// Q5_0 (as llama.cpp's Q5_0 x Q8_0): per row and block, d_w * d_x * the exact integer sum of
// (q_w - 16) q_x, q_w the nibble with its fifth bit (d_x in float16, InputBlocks).
void groups_q5_0_portable(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin, int64_t group_end,
                          const ProductOut& out) {
  for (int64_t group = group_begin; group < group_end; ++group) {
    for (int64_t m = 0; m < x.rows; ++m) {
      float sums[kQ8_0GroupRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* block = packed + (group * blocks + b) * kQ5_0GroupBlockBytes;
        const int8_t* values = x.values + (m * blocks + b) * kQ8_0BlockValues;
        for (int64_t r = 0; r < kQ8_0GroupRows; ++r) {
          uint32_t high_bits;
          std::memcpy(&high_bits, block + kQ5_0HighBitsAt + 4 * r, 4);
          int32_t dot = 0;
          for (int64_t i = 0; i < kQ8_0BlockValues; ++i) {
            const uint8_t byte = block[nibble_offset(r, i % 16, kQ5_0NibblesAt)];
            const int32_t q = (i < 16 ? byte & 0x0F : byte >> 4) | static_cast<int32_t>(((high_bits >> i) & 1) << 4);
            dot += (q - 16) * int32_t{values[i]};
          }
          sums[r] += half_to_float(block + 2 * r) * x.half_scales[m * blocks + b] * static_cast<float>(dot);
        }
      }
      store_group(sums, group, m, out);
    }
  }
}

#ifdef COCONUT_X86

// The hardware's prefetch alone left a core reading the weights at about 75% of its read speed
// (Zen 4, bench_linear): asking for the lines of the block 16 blocks on (4.3 KiB ahead) reached it.
template <int kBlockBytes = kQ8_0GroupBlockBytes>
__attribute__((target("avx2"), always_inline)) inline void prefetch_ahead(const uint8_t* block) {
  for (int line = 0; line < (kBlockBytes + 63) / 64; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(block + 16 * kBlockBytes + line * 64), _MM_HINT_T0);
}

// kGroups groups of 8 rows against one input row. Chunk c of a block holds 4 values of each of the
// 8 rows: one byte product with the input's 4 values of that chunk, broadcast, adds them to the
// rows' 8 int32 lanes; after a block's 8 chunks the lanes hold its 8 dot products, which are
// scaled by d_w * d_x in float32. Two copies, one per instruction set (a function compiled for
// VNNI may use AVX-512 encodings anywhere in it).
// VNNI: vpdpbusd takes the weights as unsigned bytes (q + 128) and the input as signed; the 128s
// add 128 * (sum of the block's input values), taken off before scaling. A group's chunks go to
// 4 / kGroups independent sums: a chain of 8 dependent vpdpbusd (about 5 cycles each) would bound
// the kernel below the memory's speed.
template <int kGroups>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"))) void dot_groups_vnni(
    const uint8_t* const* groups, int64_t blocks, const float* xd, const int8_t* xq, const int32_t* xs, const float*, float* out) {
  constexpr int kChains = 4 / kGroups > 1 ? 4 / kGroups : 1;  // independent sums per group
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups][kChains];
    for (int g = 0; g < kGroups; ++g)
      for (int j = 0; j < kChains; ++j) sums[g][j] = _mm256_setzero_si256();
    for (int g = 0; g < kGroups; ++g) prefetch_ahead(groups[g] + b * kQ8_0GroupBlockBytes);
    for (int64_t c = 0; c < 8; c += kChains) {
      int32_t fours[kChains];
      std::memcpy(fours, xq + b * kQ8_0BlockValues + c * 4, 4 * kChains);
      for (int j = 0; j < kChains; ++j) {
        const __m256i x = _mm256_set1_epi32(fours[j]);
        for (int g = 0; g < kGroups; ++g) {
          const auto* chunk = groups[g] + b * kQ8_0GroupBlockBytes + kScalesBytes + (c + j) * 32;
          sums[g][j] = _mm256_dpbusd_epi32(sums[g][j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk)), x);
        }
      }
    }
    const __m256i offset = _mm256_set1_epi32(128 * xs[b]);
    const __m256 dx = _mm256_set1_ps(xd[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ8_0GroupBlockBytes);
      const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx);
      __m256i total = sums[g][0];
      for (int j = 1; j < kChains; ++j) total = _mm256_add_epi32(total, sums[g][j]);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(total, offset)), scale, acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// AVX2: the weights back to signed bytes (q + 128 xor 128), then |x| times w with x's signs
// (values lie in [-127, 127]: nothing overflows) by maddubs to int16 pairs (at most 2 * 127 * 127)
// and madd to int32.
template <int kGroups>
__attribute__((target("avx2,fma,f16c"))) void dot_groups_avx2(const uint8_t* const* groups, int64_t blocks, const float* xd,
                                                               const int8_t* xq, const int32_t*, const float*, float* out) {
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), high_bit = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups];
    for (int g = 0; g < kGroups; ++g) sums[g] = _mm256_setzero_si256();
    for (int g = 0; g < kGroups; ++g) prefetch_ahead(groups[g] + b * kQ8_0GroupBlockBytes);
    for (int64_t c = 0; c < 8; ++c) {
      int32_t four;
      std::memcpy(&four, xq + b * kQ8_0BlockValues + c * 4, 4);
      const __m256i x = _mm256_set1_epi32(four), x_abs = _mm256_sign_epi8(x, x);
      for (int g = 0; g < kGroups; ++g) {
        const auto* chunk = groups[g] + b * kQ8_0GroupBlockBytes + kScalesBytes + c * 32;
        const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk)), high_bit);
        const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(w, x));
        sums[g] = _mm256_add_epi32(sums[g], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256 dx = _mm256_set1_ps(xd[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ8_0GroupBlockBytes);
      const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[g]), scale, acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// Q4: the input's values 4j..4j+3 and 16 + 4j..16 + 4j + 3 of a block, each four broadcast to every
// 32-bit lane (the chunks vector j's low and high nibbles multiply).
__attribute__((target("avx2"), always_inline)) inline void broadcast_q4_inputs(const int8_t* block, int j, __m256i& low,
                                                                              __m256i& high) {
  int32_t low_four, high_four;
  std::memcpy(&low_four, block + 4 * j, 4);
  std::memcpy(&high_four, block + 16 + 4 * j, 4);
  low = _mm256_set1_epi32(low_four);
  high = _mm256_set1_epi32(high_four);
}

// Q4 (VNNI): vector j of a block holds the 8 rows' values 4j..4j+3 in its low nibbles and 16 + 4j..
// in its high ones; masked and shifted apart they are unsigned bytes (0..15), which vpdpbusd
// multiplies with the input's signed ones as they are. The sums then take d_w * d_x, and m_w times
// d_x * (the sum of the block's input values) is added. kChains independent sums per group, as Q8_0.
template <int kGroups>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"))) void dot_groups_q4_vnni(
    const uint8_t* const* groups, int64_t blocks, const float* xd, const int8_t* xq, const int32_t*, const float* xs, float* out) {
  constexpr int kChains = kGroups == 1 ? 4 : 2;
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups][kChains];
    for (int g = 0; g < kGroups; ++g)
      for (int j = 0; j < kChains; ++j) sums[g][j] = _mm256_setzero_si256();
    for (int g = 0; g < kGroups; ++g) prefetch_ahead<kQ4GroupBlockBytes>(groups[g] + b * kQ4GroupBlockBytes);
    for (int j = 0; j < 4; ++j) {
      __m256i x_low, x_high;
      broadcast_q4_inputs(xq + b * kQ8_0BlockValues, j, x_low, x_high);
      const int chain = (2 * j) % kChains;
      for (int g = 0; g < kGroups; ++g) {
        const auto* vector = groups[g] + b * kQ4GroupBlockBytes + 2 * kScalesBytes + j * 32;
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector));
        sums[g][chain] = _mm256_dpbusd_epi32(sums[g][chain], _mm256_and_si256(raw, low), x_low);
        sums[g][chain + 1] = _mm256_dpbusd_epi32(sums[g][chain + 1], _mm256_and_si256(_mm256_srli_epi16(raw, 4), low), x_high);
      }
    }
    const __m256 dx = _mm256_set1_ps(xd[b]), sx = _mm256_set1_ps(xs[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ4GroupBlockBytes);
      const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx);
      const __m256 minimum = _mm256_cvtph_ps(_mm_loadu_si128(scales + 1));
      __m256i total = sums[g][0];
      for (int j = 1; j < kChains; ++j) total = _mm256_add_epi32(total, sums[g][j]);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc[g]);
      acc[g] = _mm256_fmadd_ps(minimum, sx, acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// Q4 (AVX2): the unsigned nibbles times the signed input by maddubs (at most 2 * 15 * 127 per
// int16 pair: nothing saturates), then madd to int32.
template <int kGroups>
__attribute__((target("avx2,fma,f16c"))) void dot_groups_q4_avx2(const uint8_t* const* groups, int64_t blocks, const float* xd,
                                                                  const int8_t* xq, const int32_t*, const float* xs, float* out) {
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups];
    for (int g = 0; g < kGroups; ++g) sums[g] = _mm256_setzero_si256();
    for (int g = 0; g < kGroups; ++g) prefetch_ahead<kQ4GroupBlockBytes>(groups[g] + b * kQ4GroupBlockBytes);
    for (int j = 0; j < 4; ++j) {
      __m256i x_low, x_high;
      broadcast_q4_inputs(xq + b * kQ8_0BlockValues, j, x_low, x_high);
      for (int g = 0; g < kGroups; ++g) {
        const auto* vector = groups[g] + b * kQ4GroupBlockBytes + 2 * kScalesBytes + j * 32;
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector));
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(raw, low), x_low),
                                               _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low), x_high));
        sums[g] = _mm256_add_epi32(sums[g], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256 dx = _mm256_set1_ps(xd[b]), sx = _mm256_set1_ps(xs[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ4GroupBlockBytes);
      const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[g]), scale, acc[g]);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales + 1)), sx, acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// Q5_0: row r's fifth bits of vector j's values (4j..4j+3 for the low nibbles, 16 + 4j.. for the
// high ones) each in its byte as 0x10: byte 4j / 8 (2 + 4j / 8) of the row's qh, copied into the
// lane's 4 bytes by a byte shuffle, tested against one bit per byte.
struct Q5_0HighBits {
  __m256i copy_low, copy_high, bit;
};
// In each 128-bit half: lane i's 4 bytes <- its byte `byte` (0..3), as a byte shuffle's control.
__attribute__((target("avx2"), always_inline)) inline __m256i copy_lane_byte(int byte) {
  return _mm256_add_epi8(_mm256_set1_epi8(static_cast<char>(byte)),
                         _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
}
__attribute__((target("avx2"), always_inline)) inline Q5_0HighBits q5_0_high_bits(int j) {
  return {copy_lane_byte(j / 2), copy_lane_byte(2 + j / 2), _mm256_set1_epi32(j % 2 ? static_cast<int>(0x80402010u) : 0x08040201)};
}

// Q5_0 (VNNI): a nibble vector `raw` of the held layout as its low and high values with their fifth
// bits from the rows' `qh` (a masked add of 16 where the bit is set): unsigned bytes 0..31.
__attribute__((target("avx2,avx512f,avx512vl,avx512bw"), always_inline)) inline void q5_0_values_vnni(
    const __m256i& raw, const __m256i& qh, const Q5_0HighBits& bits, __m256i& low_values, __m256i& high_values) {
  const __m256i low = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(0x10);
  low_values = _mm256_and_si256(raw, low);
  high_values = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
  low_values = _mm256_mask_add_epi8(low_values, _mm256_test_epi8_mask(_mm256_shuffle_epi8(qh, bits.copy_low), bits.bit), low_values, sixteen);
  high_values = _mm256_mask_add_epi8(high_values, _mm256_test_epi8_mask(_mm256_shuffle_epi8(qh, bits.copy_high), bits.bit), high_values, sixteen);
}

// Q5_0 (VNNI): as Q4's, each nibble given its fifth bit (q5_0_values_vnni), then the block's integer
// sum less 16 * (the sum of its input values), times d_w * d_x.
template <int kGroups>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))) void dot_groups_q5_0_vnni(
    const uint8_t* const* groups, int64_t blocks, const float* xd, const int8_t* xq, const int32_t* xs, const float*, float* out) {
  constexpr int kChains = kGroups == 1 ? 4 : 2;
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  const Q5_0HighBits high_bits[4] = {q5_0_high_bits(0), q5_0_high_bits(1), q5_0_high_bits(2), q5_0_high_bits(3)};
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups][kChains];
    __m256i qh[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      for (int j = 0; j < kChains; ++j) sums[g][j] = _mm256_setzero_si256();
      prefetch_ahead<kQ5_0GroupBlockBytes>(groups[g] + b * kQ5_0GroupBlockBytes);
      qh[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(groups[g] + b * kQ5_0GroupBlockBytes + kQ5_0HighBitsAt));
    }
    for (int j = 0; j < 4; ++j) {
      __m256i x_low, x_high;
      broadcast_q4_inputs(xq + b * kQ8_0BlockValues, j, x_low, x_high);
      const int chain = (2 * j) % kChains;
      const Q5_0HighBits& bits = high_bits[j];
      for (int g = 0; g < kGroups; ++g) {
        const auto* vector = groups[g] + b * kQ5_0GroupBlockBytes + kQ5_0NibblesAt + j * 32;
        __m256i w_low, w_high;
        q5_0_values_vnni(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector)), qh[g], bits, w_low, w_high);
        sums[g][chain] = _mm256_dpbusd_epi32(sums[g][chain], w_low, x_low);
        sums[g][chain + 1] = _mm256_dpbusd_epi32(sums[g][chain + 1], w_high, x_high);
      }
    }
    const __m256 dx = _mm256_set1_ps(xd[b]);
    const __m256i offset = _mm256_set1_epi32(16 * xs[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ5_0GroupBlockBytes);
      __m256i total = sums[g][0];
      for (int j = 1; j < kChains; ++j) total = _mm256_add_epi32(total, sums[g][j]);
      total = _mm256_sub_epi32(total, offset);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx), acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// Q5_0 (VNNI) in prefill: one group's 8 rows against kRows input rows, each block's 8 weight vectors
// given their fifth bits once and multiplied with every row's inputs (the bit work, which the
// products would repeat for every input row, is the larger part of a block's).
template <int kRows>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))) void dot_rows_q5_0_vnni(
    const uint8_t* group, int64_t blocks, const float* xd, const int8_t* xq, const int32_t* xs, float* out) {
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  const Q5_0HighBits high_bits[4] = {q5_0_high_bits(0), q5_0_high_bits(1), q5_0_high_bits(2), q5_0_high_bits(3)};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = group + b * kQ5_0GroupBlockBytes;
    prefetch_ahead<kQ5_0GroupBlockBytes>(block);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ5_0HighBitsAt));
    __m256i w_low[4], w_high[4];
    for (int j = 0; j < 4; ++j)
      q5_0_values_vnni(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ5_0NibblesAt + j * 32)), qh, high_bits[j],
                       w_low[j], w_high[j]);
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    for (int r = 0; r < kRows; ++r) {
      const int8_t* inputs = xq + (r * blocks + b) * kQ8_0BlockValues;
      __m256i first = _mm256_setzero_si256(), second = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        __m256i x_low, x_high;
        broadcast_q4_inputs(inputs, j, x_low, x_high);
        first = _mm256_dpbusd_epi32(first, w_low[j], x_low);
        second = _mm256_dpbusd_epi32(second, w_high[j], x_high);
      }
      const __m256i total = _mm256_sub_epi32(_mm256_add_epi32(first, second), _mm256_set1_epi32(16 * xs[r * blocks + b]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(scale, _mm256_set1_ps(xd[r * blocks + b])), acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

// One group against kRows input rows at a time (row r's scales, values and sums at r * blocks ...),
// then the rest one by one.
using DotRows = void (*)(const uint8_t* group, int64_t blocks, const float* xd, const int8_t* xq, const int32_t* xs, float* out);
template <int kRows, DotRows kDotRows, DotRows kDot1, int kBlockBytes>
void groups_by_rows_x86(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin, int64_t group_end,
                        const ProductOut& out) {
  for (int64_t group = group_begin; group < group_end; ++group) {
    const uint8_t* weights = packed + group * blocks * kBlockBytes;
    for (int64_t m = 0; m < x.rows;) {
      const int64_t count = x.rows - m >= kRows ? kRows : 1;
      float sums[kRows * kQ8_0GroupRows];
      (count == kRows ? kDotRows : kDot1)(weights, blocks, x.half_scales + m * blocks, x.values + m * blocks * kQ8_0BlockValues,
                                          x.sums + m * blocks, sums);
      for (int64_t r = 0; r < count; ++r) store_group(sums + r * kQ8_0GroupRows, group, m + r, out);
      m += count;
    }
  }
}

// Q5_0 (AVX2): the fifth bits by compare and mask, then Q4's AVX2 products.
template <int kGroups>
__attribute__((target("avx2,fma,f16c"))) void dot_groups_q5_0_avx2(const uint8_t* const* groups, int64_t blocks, const float* xd,
                                                                    const int8_t* xq, const int32_t* xs, const float*, float* out) {
  __m256 acc[kGroups];
  for (int g = 0; g < kGroups; ++g) acc[g] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(0x10);
  const Q5_0HighBits high_bits[4] = {q5_0_high_bits(0), q5_0_high_bits(1), q5_0_high_bits(2), q5_0_high_bits(3)};
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i sums[kGroups];
    __m256i qh[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      sums[g] = _mm256_setzero_si256();
      prefetch_ahead<kQ5_0GroupBlockBytes>(groups[g] + b * kQ5_0GroupBlockBytes);
      qh[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(groups[g] + b * kQ5_0GroupBlockBytes + kQ5_0HighBitsAt));
    }
    for (int j = 0; j < 4; ++j) {
      __m256i x_low, x_high;
      broadcast_q4_inputs(xq + b * kQ8_0BlockValues, j, x_low, x_high);
      const Q5_0HighBits& bits = high_bits[j];
      for (int g = 0; g < kGroups; ++g) {
        const auto* vector = groups[g] + b * kQ5_0GroupBlockBytes + kQ5_0NibblesAt + j * 32;
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vector));
        // 0x10 where the byte's bit is set
        const __m256i fifth_low = _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh[g], bits.copy_low), bits.bit), bits.bit), sixteen);
        const __m256i fifth_high = _mm256_and_si256(
            _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh[g], bits.copy_high), bits.bit), bits.bit), sixteen);
        const __m256i w_low = _mm256_or_si256(_mm256_and_si256(raw, low), fifth_low);
        const __m256i w_high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low), fifth_high);
        // At most 2 * 31 * 127 per int16 pair: nothing saturates.
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w_low, x_low), _mm256_maddubs_epi16(w_high, x_high));
        sums[g] = _mm256_add_epi32(sums[g], _mm256_madd_epi16(pairs, ones));
      }
    }
    const __m256 dx = _mm256_set1_ps(xd[b]);
    const __m256i offset = _mm256_set1_epi32(16 * xs[b]);
    for (int g = 0; g < kGroups; ++g) {
      const auto* scales = reinterpret_cast<const __m128i*>(groups[g] + b * kQ5_0GroupBlockBytes);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sums[g], offset)),
                               _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(scales)), dx), acc[g]);
    }
  }
  for (int g = 0; g < kGroups; ++g) _mm256_storeu_ps(out + 8 * g, acc[g]);
}

// Q8_0 kernels read the scales and the sums of q_x; Q4 ones the float16 scales and scaled sums;
// Q5_0 ones the float16 scales and the sums of q_x.
using DotGroups = void (*)(const uint8_t* const* groups, int64_t blocks, const float* xd, const int8_t* xq,
                           const int32_t* xs, const float* scaled_sums, float* out);

// kWide groups at a time (they share each broadcast input chunk), then one by one; every input row
// against them while their rows stay in L1.
template <int kWide, DotGroups kDotWide, DotGroups kDot1, int kBlockBytes = kQ8_0GroupBlockBytes>
void groups_x86(const uint8_t* packed, int64_t blocks, const InputBlocks& x, int64_t group_begin, int64_t group_end,
                const ProductOut& out) {
  constexpr bool kQ4 = kBlockBytes == kQ4GroupBlockBytes;
  const float* xd = kBlockBytes == kQ8_0GroupBlockBytes ? x.scales : x.half_scales;  // Q4 and Q5_0: float16 scales
  const int8_t* xq = x.values;
  const int32_t* xs = x.sums;
  const float* scaled_sums = x.half_scaled_sums;
  for (int64_t group = group_begin; group < group_end;) {
    const int64_t count = group_end - group >= kWide ? kWide : 1;
    const uint8_t* groups[kWide];
    for (int64_t g = 0; g < count; ++g) groups[g] = packed + (group + g) * blocks * kBlockBytes;
    for (int64_t m = 0; m < x.rows; ++m) {
      float sums[kWide * kQ8_0GroupRows];
      (count == kWide ? kDotWide : kDot1)(groups, blocks, xd + m * blocks, xq + m * blocks * kQ8_0BlockValues,
                                          xs + m * blocks, kQ4 ? scaled_sums + m * blocks : nullptr, sums);
      for (int64_t g = 0; g < count; ++g) store_group(sums + g * kQ8_0GroupRows, group + g, m, out);
    }
    group += count;
  }
}

// A block's 32 values as 4 vectors; returns max |v| over them.
__attribute__((target("avx2,fma"), always_inline)) inline float load_block_avx2(const float* values, __m256 parts[4]) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    parts[i] = _mm256_loadu_ps(values + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, parts[i]));
  }
  __m128 max4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
  max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
  return _mm_cvtss_f32(max4);
}

// 4 vectors of int32 in [-127, 127] as 32 int8 in order (packs works within 128-bit lanes; the
// permute puts them back).
__attribute__((target("avx2,fma"), always_inline)) inline void store_int8_avx2(const __m256i ints[4], int8_t* q) {
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// Input blocks: d = max|x| / 127, q = x * (1/d) rounded to nearest even, and the sum of the q.
__attribute__((target("avx2,fma"))) void quantize_input_avx2(const float* values, int64_t block_count, float* d,
                                                              int8_t* q, int32_t* sums) {
  for (int64_t block = 0; block < block_count; ++block) {
    __m256 parts[4];
    const float scale = load_block_avx2(values + block * kQ8_0BlockValues, parts) / 127.0f;
    const __m256 inverse = _mm256_set1_ps(scale != 0 ? 1.0f / scale : 0.0f);
    __m256i ints[4];
    __m256i total = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      ints[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(parts[i], inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      total = _mm256_add_epi32(total, ints[i]);
    }
    store_int8_avx2(ints, q + block * kQ8_0BlockValues);
    __m128i total4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    total4 = _mm_add_epi32(total4, _mm_shuffle_epi32(total4, 0x4E));
    total4 = _mm_add_epi32(total4, _mm_shuffle_epi32(total4, 0xB1));
    d[block] = scale;
    sums[block] = _mm_cvtsi128_si32(total4);
  }
}

// quantize_weight_block in vectors, with the same results bit for bit: roundf(a) (halves away
// from zero) as trunc(a + copysign(0.5 - 2^-25, a)), exact for |a| < 2^23 (here |a| <= 127).
__attribute__((target("avx2,fma"))) float quantize_weight_block_avx2(const float* values, int8_t* q) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f), below_half = _mm256_set1_ps(0.49999997f);
  __m256 parts[4];
  const float d = load_block_avx2(values, parts) / 127.0f;
  const __m256 inverse = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 scaled = _mm256_mul_ps(parts[i], inverse);
    const __m256 half = _mm256_or_ps(below_half, _mm256_and_ps(scaled, sign_bit));
    ints[i] = _mm256_cvttps_epi32(_mm256_add_ps(scaled, half));
  }
  store_int8_avx2(ints, q);
  return d;
}

bool has_avx2() { return has_avx2_fma_f16c(); }
bool has_vnni() {
  static const bool supported = has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return supported;
}
#else
bool has_avx2() { return false; }
bool has_vnni() { return false; }
#endif

void quantize_input_portable(const float* values, int64_t block_count, float* d, int8_t* q, int32_t* sums) {
  for (int64_t block = 0; block < block_count; ++block) {
    const float* v = values + block * kQ8_0BlockValues;
    float amax = 0;
    for (int64_t i = 0; i < kQ8_0BlockValues; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float scale = amax / 127.0f;
    const float inverse = scale != 0 ? 1.0f / scale : 0.0f;
    int32_t total = 0;
    for (int64_t i = 0; i < kQ8_0BlockValues; ++i) {
      const auto value = static_cast<int32_t>(std::nearbyint(v[i] * inverse));  // ties to even
      q[block * kQ8_0BlockValues + i] = static_cast<int8_t>(value);
      total += value;
    }
    d[block] = scale;
    sums[block] = total;
  }
}

// Buffers of the calling thread that a product's input blocks live in (the workers of its parallel
// regions fill and read them); reused, as a decode step makes hundreds of small products. Results
// go straight into the output tensor, narrowed where they are stored (ggml_rows::ProductOut).
struct Scratch {
  std::vector<float> floats, scales, half_scales, half_scaled_sums;
  std::vector<int8_t> values;
  std::vector<int32_t> sums;
};
thread_local Scratch scratch;

// Elements of a contiguous bf16 or f16 tensor as float32 (a loop: a torch copy costs about a
// microsecond a call, a decode step makes hundreds).
void copy_widened(const torch::Tensor& values, float* out) {
  const int64_t count = values.numel();
  // A prompt's rows in parallel; a decode step's stay on the calling thread.
  constexpr int64_t kGrain = 16384;
  if (values.scalar_type() == torch::kBFloat16) {
    const auto* from = values.data_ptr<c10::BFloat16>();
    at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(from[i]);
    });
  } else if (values.scalar_type() == torch::kHalf) {
    const auto* from = values.data_ptr<c10::Half>();
    at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(from[i]);
    });
  } else {
    torch::from_blob(out, values.sizes(), torch::kFloat32).copy_(values);
  }
}

// Rows [M, K] of float32, bf16 or f16 as float32 values the thread's buffer may hold.
const float* float_rows(const torch::Tensor& contiguous) {
  if (contiguous.scalar_type() == torch::kFloat32) return contiguous.data_ptr<float>();
  scratch.floats.resize(static_cast<size_t>(contiguous.numel()));
  copy_widened(contiguous, scratch.floats.data());
  return scratch.floats.data();
}

// Rows [M, K] of float32, bf16 or f16 into the thread's input blocks.
InputBlocks quantize_input(const float* values, int64_t m_size, int64_t k_size) {
  const int64_t blocks = m_size * k_size / kQ8_0BlockValues;
  scratch.scales.resize(static_cast<size_t>(blocks));
  scratch.values.resize(static_cast<size_t>(m_size * k_size));
  scratch.sums.resize(static_cast<size_t>(blocks));
#ifdef COCONUT_X86
  if (has_avx2()) {
    quantize_input_avx2(values, blocks, scratch.scales.data(), scratch.values.data(), scratch.sums.data());
    return {m_size, scratch.scales.data(), scratch.values.data(), scratch.sums.data()};
  }
#endif
  quantize_input_portable(values, blocks, scratch.scales.data(), scratch.values.data(), scratch.sums.data());
  return {m_size, scratch.scales.data(), scratch.values.data(), scratch.sums.data()};
}

std::atomic<int> forced_kernel{-1};  // -1: by CPU features; else an index into kKernelNames
constexpr const char* kKernelNames[] = {"vnni", "avx2", "portable"};

// One input row (decode): a group at a time, so the weights stream in order (4 groups at a time
// read 4 streams; bench_linear measured the one stream faster from memory). More rows: 4 (VNNI) or
// 2 (AVX2) groups at a time, which share each broadcast input chunk.
GroupsKernel kernel_by_index(int index, int64_t m_size, WeightFormat format) {
  const bool q4 = is_q4(format), q5_0 = format == WeightFormat::kQ5_0;
#ifdef COCONUT_X86
  constexpr int kQ4 = kQ4GroupBlockBytes, kQ5_0 = kQ5_0GroupBlockBytes;
  if (index == 0 && q5_0)
    return m_size == 1 ? groups_x86<1, dot_groups_q5_0_vnni<1>, dot_groups_q5_0_vnni<1>, kQ5_0>
                       : groups_by_rows_x86<4, dot_rows_q5_0_vnni<4>, dot_rows_q5_0_vnni<1>, kQ5_0>;
  if (index == 1 && q5_0)
    return m_size == 1 ? groups_x86<1, dot_groups_q5_0_avx2<1>, dot_groups_q5_0_avx2<1>, kQ5_0>
                       : groups_x86<2, dot_groups_q5_0_avx2<2>, dot_groups_q5_0_avx2<1>, kQ5_0>;
  if (index == 0 && q4)
    return m_size == 1 ? groups_x86<1, dot_groups_q4_vnni<1>, dot_groups_q4_vnni<1>, kQ4>
                       : groups_x86<4, dot_groups_q4_vnni<4>, dot_groups_q4_vnni<1>, kQ4>;
  if (index == 1 && q4)
    return m_size == 1 ? groups_x86<1, dot_groups_q4_avx2<1>, dot_groups_q4_avx2<1>, kQ4>
                       : groups_x86<2, dot_groups_q4_avx2<2>, dot_groups_q4_avx2<1>, kQ4>;
  if (index == 0)
    return m_size == 1 ? groups_x86<1, dot_groups_vnni<1>, dot_groups_vnni<1>> : groups_x86<4, dot_groups_vnni<4>, dot_groups_vnni<1>>;
  if (index == 1)
    return m_size == 1 ? groups_x86<1, dot_groups_avx2<1>, dot_groups_avx2<1>> : groups_x86<2, dot_groups_avx2<2>, dot_groups_avx2<1>>;
#endif
  return q5_0 ? groups_q5_0_portable : q4 ? groups_q4_portable : groups_portable;
}

GroupsKernel pick_kernel(int64_t m_size, WeightFormat format) {
  const int forced = forced_kernel.load();
  if (forced >= 0) return kernel_by_index(forced, m_size, format);
  return kernel_by_index(has_vnni() ? 0 : has_avx2() ? 1 : 2, m_size, format);
}

// ggml's reference quantizers of one block of 32 values into ggml's bytes (quantize_row_q4_0_ref,
// quantize_row_q4_1_ref).
void quantize_block_q4_0(const float* values, uint8_t* bytes) {
  float amax = 0, max = 0;
  for (int64_t i = 0; i < kQ8_0BlockValues; ++i)
    if (amax < std::fabs(values[i])) {
      amax = std::fabs(values[i]);
      max = values[i];
    }
  const float d = max / -8;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t bits = c10::Half(d).x;
  std::memcpy(bytes, &bits, 2);
  for (int64_t i = 0; i < 16; ++i) {
    const int low = std::min(15, static_cast<int>(static_cast<int8_t>(values[i] * id + 8.5f)));
    const int high = std::min(15, static_cast<int>(static_cast<int8_t>(values[i + 16] * id + 8.5f)));
    bytes[2 + i] = static_cast<uint8_t>(low | (high << 4));
  }
}

void quantize_block_q4_1(const float* values, uint8_t* bytes) {
  float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
  for (int64_t i = 0; i < kQ8_0BlockValues; ++i) {
    min = std::min(min, values[i]);
    max = std::max(max, values[i]);
  }
  const float d = (max - min) / 15;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t d_bits = c10::Half(d).x, m_bits = c10::Half(min).x;
  std::memcpy(bytes, &d_bits, 2);
  std::memcpy(bytes + 2, &m_bits, 2);
  for (int64_t i = 0; i < 16; ++i) {
    const int low = std::min(15, static_cast<int>(static_cast<int8_t>((values[i] - min) * id + 0.5f)));
    const int high = std::min(15, static_cast<int>(static_cast<int8_t>((values[i + 16] - min) * id + 0.5f)));
    bytes[4 + i] = static_cast<uint8_t>(low | (high << 4));
  }
}

// One row's Q4 or Q5_0 block in ggml's bytes into the held layout, and back.
void pack_q4_block(const uint8_t* from, WeightFormat format, uint8_t* block, int64_t row) {
  const int64_t r = row % kQ8_0GroupRows;
  std::memcpy(block + 2 * r, from, 2);
  if (format == WeightFormat::kQ5_0) {
    std::memcpy(block + kQ5_0HighBitsAt + 4 * r, from + 2, 4);
    for (int64_t i = 0; i < 16; ++i) block[nibble_offset(row, i, kQ5_0NibblesAt)] = from[6 + i];
    return;
  }
  if (format == WeightFormat::kQ4_1) {
    std::memcpy(block + kScalesBytes + 2 * r, from + 2, 2);
  } else {  // m = -8 d: exact in float16 (a power of two times d)
    const uint16_t bits = c10::Half(-8.0f * half_to_float(from)).x;
    std::memcpy(block + kScalesBytes + 2 * r, &bits, 2);
  }
  const uint8_t* nibbles = from + (format == WeightFormat::kQ4_1 ? 4 : 2);
  for (int64_t i = 0; i < 16; ++i) block[nibble_offset(row, i)] = nibbles[i];
}

void unpack_q4_block(const uint8_t* block, WeightFormat format, int64_t row, uint8_t* to) {
  const int64_t r = row % kQ8_0GroupRows;
  std::memcpy(to, block + 2 * r, 2);
  if (format == WeightFormat::kQ5_0) {
    std::memcpy(to + 2, block + kQ5_0HighBitsAt + 4 * r, 4);
    for (int64_t i = 0; i < 16; ++i) to[6 + i] = block[nibble_offset(row, i, kQ5_0NibblesAt)];
    return;
  }
  if (format == WeightFormat::kQ4_1) std::memcpy(to + 2, block + kScalesBytes + 2 * r, 2);
  uint8_t* nibbles = to + (format == WeightFormat::kQ4_1 ? 4 : 2);
  for (int64_t i = 0; i < 16; ++i) nibbles[i] = block[nibble_offset(row, i)];
}

}  // namespace

std::vector<std::string> available_quantized_kernels() {
  std::vector<std::string> names;
  if (has_vnni()) names.push_back("vnni");
  if (has_avx2()) names.push_back("avx2");
  names.push_back("portable");
  return names;
}

void force_quantized_kernel(const std::string& name) {
  if (name.empty()) {
    forced_kernel = -1;
    return;
  }
  const auto available = available_quantized_kernels();
  if (std::find(available.begin(), available.end(), name) == available.end())
    throw std::invalid_argument("quantized kernel '" + name + "' does not run on this CPU");
  for (int index = 0; index < 3; ++index)
    if (name == kKernelNames[index]) forced_kernel = index;
}

QuantizedWeight from_ggml_blocks(const torch::Tensor& blocks, int64_t out_features, int64_t in_features, WeightFormat format) {
  if (held_as_ggml_rows(format)) {  // as they are: [N, row bytes]
    const int64_t values = block_values(format), row_bytes = in_features / values * ggml_block_bytes(format);
    if (in_features % values != 0 || blocks.scalar_type() != torch::kUInt8 || blocks.numel() != out_features * row_bytes)
      throw std::invalid_argument(weight_format_name(format) + " blocks of " + std::to_string(blocks.numel()) + " bytes do not hold a [" +
                                  std::to_string(out_features) + ", " + std::to_string(in_features) + "] weight");
    return {blocks.reshape({out_features, row_bytes}).contiguous(), in_features, out_features, format};
  }
  const int64_t block_count = in_features / kQ8_0BlockValues, block_bytes = ggml_block_bytes(format);
  if (in_features % kQ8_0BlockValues != 0 || blocks.scalar_type() != torch::kUInt8 || blocks.numel() != out_features * block_count * block_bytes)
    throw std::invalid_argument(weight_format_name(format) + " blocks of " + std::to_string(blocks.numel()) + " bytes do not hold a [" +
                                std::to_string(out_features) + ", " + std::to_string(in_features) + "] weight");
  const auto source_tensor = blocks.to(torch::kCPU).contiguous();
  const int64_t groups = (out_features + kQ8_0GroupRows - 1) / kQ8_0GroupRows;
  if (held_as_nibbles(format)) {  // rows past N: zeros (d = m = 0)
    auto packed = torch::zeros({groups, block_count, group_block_bytes(format)}, torch::kUInt8);
    uint8_t* target = packed.data_ptr<uint8_t>();
    const uint8_t* source = source_tensor.data_ptr<uint8_t>();
    at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        for (int64_t b = 0; b < block_count; ++b)
          pack_q4_block(source + (row * block_count + b) * block_bytes, format,
                        group_block(target, block_count, row, b, group_block_bytes(format)), row);
    });
    return {packed.to(blocks.device()), in_features, out_features, format};
  }
  auto packed = torch::empty({groups, block_count, kQ8_0GroupBlockBytes}, torch::kUInt8);
  uint8_t* target = packed.data_ptr<uint8_t>();
  // Rows past N: scale 0, values 0 (stored 128).
  for (int64_t group = 0; group < groups; ++group)
    for (int64_t b = 0; b < block_count; ++b) {
      uint8_t* block = target + (group * block_count + b) * kQ8_0GroupBlockBytes;
      std::memset(block, 0, kScalesBytes);
      std::memset(block + kScalesBytes, 128, kQ8_0GroupBlockBytes - kScalesBytes);
    }
  const uint8_t* source = source_tensor.data_ptr<uint8_t>();
  at::parallel_for(0, out_features, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t b = 0; b < block_count; ++b) {
        const uint8_t* from = source + (row * block_count + b) * kQ8_0BlockBytes;
        uint8_t* block = group_block(target, block_count, row, b);
        std::memcpy(block + 2 * (row % kQ8_0GroupRows), from, 2);
        for (int64_t i = 0; i < kQ8_0BlockValues; ++i) block[chunk_offset(row, i / 4) + i % 4] = from[2 + i] ^ 0x80;
      }
  });
  return {packed.to(blocks.device()), in_features, out_features};
}

QuantizedWeight weight_rows(const QuantizedWeight& weight, int64_t first, int64_t count) {
  if (held_as_ggml_rows(weight.format)) {
    if (first < 0 || count <= 0 || first + count > weight.out_features)
      throw std::invalid_argument("rows " + std::to_string(first) + "+" + std::to_string(count) + " of a weight of " +
                                  std::to_string(weight.out_features) + " rows");
    return {weight.packed.narrow(0, first, count), weight.in_features, count, weight.format};
  }
  const bool to_last = first + count == weight.out_features;
  if (first < 0 || count <= 0 || first + count > weight.out_features || first % kQ8_0GroupRows != 0 ||
      (!to_last && count % kQ8_0GroupRows != 0))
    throw std::invalid_argument("rows " + std::to_string(first) + "+" + std::to_string(count) + " of a q8_0 weight of " +
                                std::to_string(weight.out_features) + " rows do not fall on groups of 8");
  const int64_t groups = (count + kQ8_0GroupRows - 1) / kQ8_0GroupRows;
  return {weight.packed.narrow(0, first / kQ8_0GroupRows, groups), weight.in_features, count, weight.format};
}

namespace {

// Row `row` of a weight held in groups of 8 rows (`packed` on the CPU) in ggml's bytes, its blocks in order.
void unpack_group_row(uint8_t* packed, int64_t block_count, WeightFormat format, int64_t row, uint8_t* to) {
  const int64_t block_bytes = ggml_block_bytes(format);
  for (int64_t b = 0; b < block_count; ++b, to += block_bytes) {
    if (held_as_nibbles(format)) {
      unpack_q4_block(group_block(packed, block_count, row, b, group_block_bytes(format)), format, row, to);
      continue;
    }
    const uint8_t* block = group_block(packed, block_count, row, b);
    std::memcpy(to, block + 2 * (row % kQ8_0GroupRows), 2);
    for (int64_t i = 0; i < kQ8_0BlockValues; ++i) to[2 + i] = block[chunk_offset(row, i / 4) + i % 4] ^ 0x80;
  }
}

uint32_t ggml_type_of(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ8_0: return static_cast<uint32_t>(GgmlType::kQ8_0);
    case WeightFormat::kQ4_0: return static_cast<uint32_t>(GgmlType::kQ4_0);
    case WeightFormat::kQ4_1: return static_cast<uint32_t>(GgmlType::kQ4_1);
    case WeightFormat::kQ5_0: return static_cast<uint32_t>(GgmlType::kQ5_0);
    default: return ggml_rows::ggml_type(format);
  }
}

}  // namespace

torch::Tensor ggml_blocks(const QuantizedWeight& weight) {
  if (held_as_ggml_rows(weight.format)) return weight.packed.contiguous();
  const auto packed_tensor = weight.packed.to(torch::kCPU).contiguous();
  const int64_t block_count = weight.in_features / kQ8_0BlockValues, row_bytes = block_count * ggml_block_bytes(weight.format);
  auto out = torch::empty({weight.out_features, row_bytes}, torch::kUInt8);
  for (int64_t row = 0; row < weight.out_features; ++row)
    unpack_group_row(packed_tensor.data_ptr<uint8_t>(), block_count, weight.format, row, out.data_ptr<uint8_t>() + row * row_bytes);
  return out.to(weight.packed.device());
}

torch::Tensor dequantize_rows(const QuantizedWeight& weight, const torch::Tensor& ids) {
  TORCH_CHECK(weight.defined(), "dequantize_rows: the weight has no blocks");
  TORCH_CHECK(weight.packed.is_cpu(), "dequantize_rows: the blocks are on ", weight.packed.device(), ", not the CPU");
  const auto rows = ids.to(torch::kCPU, torch::kInt64).contiguous().view({-1});
  const int64_t count = rows.numel(), width = weight.in_features;
  const auto packed = weight.packed.contiguous();
  uint8_t* data = packed.data_ptr<uint8_t>();
  const bool ggml_rows = held_as_ggml_rows(weight.format);
  const int64_t row_bytes = width / block_values(weight.format) * ggml_block_bytes(weight.format);
  const uint32_t type = ggml_type_of(weight.format);
  auto out = torch::empty({count, width}, torch::kFloat32);  // [n, K]
  std::vector<uint8_t> unpacked(static_cast<size_t>(ggml_rows ? 0 : row_bytes));
  const int64_t* id = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    if (id[i] < 0 || id[i] >= weight.out_features)
      throw std::out_of_range("dequantize_rows: row " + std::to_string(id[i]) + " of a weight of " + std::to_string(weight.out_features) + " rows");
    const uint8_t* row = data + id[i] * row_bytes;
    if (!ggml_rows) {
      unpack_group_row(data, width / kQ8_0BlockValues, weight.format, id[i], unpacked.data());
      row = unpacked.data();
    }
    dequantize_ggml(type, row, width, out.data_ptr<float>() + i * width);
  }
  return out;
}

QuantizedWeight quantize_weight(const torch::Tensor& weight, WeightFormat format) {
  if (format == WeightFormat::kQ8_0) return quantize_q8_0(weight);
  if (held_as_ggml_rows(format) || format == WeightFormat::kQ5_0)
    throw std::invalid_argument(weight_format_name(format) + " weights come from a GGUF file as they are (import-gguf); there is no "
                                "quantizer to them here: use q8_0, q4_0 or q4_1");
  if (!is_q4(format)) throw std::invalid_argument("quantize_weight: " + weight_format_name(format) + " is not a block format");
  TORCH_CHECK(weight.dim() == 2, "quantize_weight takes a [N, K] weight, got ", weight.sizes());
  check_blocks(weight, "weights", format);
  const auto values = weight.detach().to(torch::kCPU, torch::kFloat32).contiguous();  // [N, K]
  const int64_t n_size = values.size(0), k_size = values.size(1), blocks = k_size / kQ8_0BlockValues;
  const int64_t groups = (n_size + kQ8_0GroupRows - 1) / kQ8_0GroupRows;
  auto packed = torch::zeros({groups, blocks, kQ4GroupBlockBytes}, torch::kUInt8);  // rows past N: zeros
  uint8_t* target = packed.data_ptr<uint8_t>();
  const float* source = values.data_ptr<float>();
  at::parallel_for(0, n_size, 16, [&](int64_t begin, int64_t end) {
    uint8_t bytes[kQ4_1BlockBytes];
    for (int64_t n = begin; n < end; ++n)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* from = source + n * k_size + b * kQ8_0BlockValues;
        if (format == WeightFormat::kQ4_1)
          quantize_block_q4_1(from, bytes);
        else
          quantize_block_q4_0(from, bytes);
        pack_q4_block(bytes, format, group_block(target, blocks, n, b, kQ4GroupBlockBytes), n);
      }
  });
  return {packed.to(weight.device()), k_size, n_size, format};
}

QuantizedWeight quantize_q8_0(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "quantize_q8_0 takes a [N, K] weight, got ", weight.sizes());
  check_blocks(weight, "weights");
  const auto values = weight.detach().to(torch::kCPU, torch::kFloat32).contiguous();  // [N, K]
  const int64_t n_size = values.size(0), k_size = values.size(1), blocks = k_size / kQ8_0BlockValues;
  const int64_t groups = (n_size + kQ8_0GroupRows - 1) / kQ8_0GroupRows;
  auto packed = torch::empty({groups, blocks, kQ8_0GroupBlockBytes}, torch::kUInt8);
  uint8_t* target = packed.data_ptr<uint8_t>();
  if (n_size % kQ8_0GroupRows != 0) {  // rows past N: scale 0, values 0 (stored 128)
    uint8_t* last = target + (groups - 1) * blocks * kQ8_0GroupBlockBytes;
    for (int64_t b = 0; b < blocks; ++b) {
      std::memset(last + b * kQ8_0GroupBlockBytes, 0, kScalesBytes);
      std::memset(last + b * kQ8_0GroupBlockBytes + kScalesBytes, 128, kQ8_0GroupBlockBytes - kScalesBytes);
    }
  }
  const float* source = values.data_ptr<float>();
#ifdef COCONUT_X86
  const bool vectors = has_avx2() && forced_kernel.load() != 2;  // "portable" forces the scalar quantizer too
#endif
  // Rows straight into the held layout (rows of a group write their own bytes of its blocks).
  at::parallel_for(0, n_size, 16, [&](int64_t begin, int64_t end) {
    int8_t q[kQ8_0BlockValues];
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float* from = source + n * k_size + b * kQ8_0BlockValues;
#ifdef COCONUT_X86
        const float d = vectors ? quantize_weight_block_avx2(from, q) : quantize_weight_block(from, q);
#else
        const float d = quantize_weight_block(from, q);
#endif
        uint8_t* block = group_block(target, blocks, n, b);
        const uint16_t bits = c10::Half(d).x;
        std::memcpy(block + 2 * (n % kQ8_0GroupRows), &bits, 2);
        for (int64_t c = 0; c < 8; ++c) {
          uint32_t four;
          std::memcpy(&four, q + 4 * c, 4);
          four ^= 0x80808080u;  // q + 128 in each byte
          std::memcpy(block + chunk_offset(n, c), &four, 4);
        }
      }
    }
  });
  return {packed.to(weight.device()), k_size, n_size};
}

torch::Tensor dequantize(const QuantizedWeight& weight) {
  // The blocks in ggml's layout, dequantized as ggml does (d * q, d * (q - 8), d * q + m, ...).
  const auto blocks = ggml_blocks(weight).to(torch::kCPU).contiguous();
  auto out = torch::empty({weight.out_features, weight.in_features}, torch::kFloat32);  // [N, K]
  dequantize_ggml(ggml_type_of(weight.format), blocks.data_ptr<uint8_t>(), weight.out_features * weight.in_features,
                  out.data_ptr<float>());
  return out.to(weight.packed.device());
}


std::pair<torch::Tensor, torch::Tensor> quantize_rows_q8_k(const torch::Tensor& rows) {
  const auto contiguous = rows.contiguous();
  const auto x = ggml_rows::quantize_q8_k(float_rows(contiguous), contiguous.size(0), contiguous.size(1), forced_kernel.load() != 2);
  return {torch::from_blob(const_cast<float*>(x.scales), {x.rows, x.width / 256}, torch::kFloat32).clone(),
          torch::from_blob(const_cast<int8_t*>(x.values), {x.rows, x.width}, torch::kInt8).clone()};
}

std::pair<torch::Tensor, torch::Tensor> quantize_rows_q8_0(const torch::Tensor& rows) {
  check_blocks(rows, "inputs");
  const auto contiguous = rows.contiguous();
  const int64_t k_size = rows.size(1);
  const auto x = quantize_input(float_rows(contiguous), contiguous.size(0), k_size);
  return {torch::from_blob(const_cast<float*>(x.scales), {x.rows, k_size / kQ8_0BlockValues}, torch::kFloat32).clone(),
          torch::from_blob(const_cast<int8_t*>(x.values), {x.rows, k_size}, torch::kInt8).clone()};
}

namespace {
// Whether the VNNI k-quant decode kernels ask for the weights far ahead (ProductKind::kKQuantPrefetch),
// decided once per process at the thread count of its first such product (measured once per host
// and thread count, then cached; later runs read the cache) on Q4_K rows 2,048 wide
// filling twice the last-level cache (64 to 256 MiB, every page written, on 2 MiB pages as the
// loaded weights are), one input row, split over the threads as a product splits them. Called
// before a product's parallel region.
bool kquant_prefetch_far() {
  static const bool far = [] {
    static constexpr int64_t k_size = 2048, row_bytes = k_size / 256 * 144;
    const int64_t cache = std::max<int64_t>(sysconf(_SC_LEVEL3_CACHE_SIZE), 0);
    const int64_t n_size = std::clamp<int64_t>(2 * cache, int64_t{64} << 20, int64_t{256} << 20) / row_bytes;
    const auto path = choose_product_path(ProductKind::kKQuantPrefetch, 1, k_size, n_size, [&](int64_t) -> ProductTrial {
      // Bytes 0x11: every d and dmin the float16 0x1111 (a small normal number), every page written.
      auto blocks = torch::full({n_size, row_bytes}, 0x11, torch::kUInt8);
      move_to_huge_pages({blocks});
      const auto x = torch::full({1, k_size}, 0.25, torch::kFloat32);
      auto y = torch::empty({1, n_size}, torch::kFloat32);
      return [blocks, x, y](ProductPath path) {
        const auto input = ggml_rows::quantize_q8_k(x.const_data_ptr<float>(), 1, k_size);
        const ProductOut out{y.data_ptr(), y.size(1), ProductOut::kFloat32};
        const uint8_t* rows = blocks.const_data_ptr<uint8_t>();
        at::parallel_for(0, y.size(1), std::max<int64_t>(1, 64 * 1024 / row_bytes), [&](int64_t begin, int64_t end) {
          ggml_rows::rows_times_q8_k(rows, WeightFormat::kQ4_K, begin, end, input, 0, out, path == ProductPath::kBlas);
        });
      };
    });
    return path == ProductPath::kBlas;
  }();
  return far;
}

// Float32 rows x [M, K] times a weight held as ggml rows (the k-quants) into `out`: the input
// quantized as llama.cpp does for them (block_q8_K), tasks of whole rows.
void ggml_rows_product(const float* x, int64_t m_size, const QuantizedWeight& weight, const ProductOut& out) {
  const int64_t k_size = weight.in_features, n_size = weight.out_features;
  if (k_size % block_values(weight.format) != 0)
    throw std::invalid_argument(weight_format_name(weight.format) + " weights need rows of a multiple of " +
                                std::to_string(block_values(weight.format)) + " values, got " + std::to_string(k_size));
  const int forced = forced_kernel.load();
  const int kernel = forced >= 0 ? forced : has_vnni() ? 0 : has_avx2() ? 1 : 2;
  const uint8_t* rows = weight.packed.const_data_ptr<uint8_t>();
  const int64_t row_bytes = weight.packed.size(1);
  const int64_t unit = ggml_rows::task_rows(kernel, m_size), units = (n_size + unit - 1) / unit;
  const bool far = kernel == 0 && unit == 1 && kquant_prefetch_far();  // before the input: the trial quantizes its own
  const auto input = ggml_rows::quantize_q8_k(x, m_size, k_size, kernel != 2);  // "portable" forces the scalar quantizer too
  // Tasks of whole rows, about 64 KiB of weights per task and input row; with the tiles, of whole
  // groups of rows.
  const int64_t grain = std::max<int64_t>(1, 64 * 1024 / (unit * row_bytes) / m_size);
  at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    ggml_rows::rows_times_q8_k(rows, weight.format, begin * unit, std::min(end * unit, n_size), input, kernel, out, far);
  });
}

// Float32 rows x [M, K] (K a multiple of 32) times the weight transposed into `out`, on the CPU.
void quantized_product(const float* x, int64_t m_size, const QuantizedWeight& weight, const ProductOut& out) {
  if (held_as_ggml_rows(weight.format)) return ggml_rows_product(x, m_size, weight, out);
  const int64_t k_size = weight.in_features, blocks = k_size / kQ8_0BlockValues;
  InputBlocks input = quantize_input(x, m_size, k_size);
  if (weight.format == WeightFormat::kQ5_0) {  // block_q8_0's float16 scale
    const int64_t count = m_size * blocks;
    scratch.half_scales.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) scratch.half_scales[i] = static_cast<float>(c10::Half(input.scales[i]));
    input.half_scales = scratch.half_scales.data();
  }
  if (is_q4(weight.format)) {
    const int64_t count = m_size * blocks;
    scratch.half_scales.resize(static_cast<size_t>(count));
    scratch.half_scaled_sums.resize(static_cast<size_t>(count));
    // Q4_1 as llama.cpp's block_q8_1 (d and d * sum in float16); Q4_0's m = -8 d takes d * sum
    // unrounded: llama.cpp subtracts the 8 from each q in its integer sums, against block_q8_0's d.
    const bool rounded_sums = weight.format == WeightFormat::kQ4_1;
    for (int64_t i = 0; i < count; ++i) {
      const float half_scale = static_cast<float>(c10::Half(input.scales[i]));
      scratch.half_scales[i] = half_scale;
      scratch.half_scaled_sums[i] = rounded_sums ? static_cast<float>(c10::Half(input.scales[i] * static_cast<float>(input.sums[i])))
                                                 : half_scale * static_cast<float>(input.sums[i]);
    }
    input.half_scales = scratch.half_scales.data();
    input.half_scaled_sums = scratch.half_scaled_sums.data();
  }
  const GroupsKernel kernel = pick_kernel(m_size, weight.format);
  const uint8_t* packed = weight.packed.const_data_ptr<uint8_t>();
  // Tasks of whole groups, about 64 KiB of weights per task and input row.
  const int64_t groups = weight.packed.size(0);
  const int64_t grain = std::max<int64_t>(1, 64 * 1024 / (blocks * group_block_bytes(weight.format)) / m_size);
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    kernel(packed, blocks, input, begin, end, out);
  });
}
}  // namespace

void quantized_dense_rows(const float* x, int64_t rows, const QuantizedWeight& weight, float* out, int64_t out_stride) {
  TORCH_CHECK(weight.defined() && weight.packed.device().is_cpu(), "quantized_dense_rows: blocks on the CPU expected");
  quantized_product(x, rows, weight, {out, out_stride, ProductOut::kFloat32});
}

void quantized_dense_rows(const c10::BFloat16* x, int64_t rows, const QuantizedWeight& weight, c10::BFloat16* out,
                          int64_t out_stride) {
  TORCH_CHECK(weight.defined() && weight.packed.device().is_cpu(), "quantized_dense_rows: blocks on the CPU expected");
  thread_local std::vector<float> widened;  // as quantized_dense: the inputs widened exactly
  widened.resize(static_cast<size_t>(rows * weight.in_features));
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = static_cast<float>(x[i]);
  quantized_product(widened.data(), rows, weight, {out, out_stride, ProductOut::kBFloat16});
}

torch::Tensor quantized_dense(const torch::Tensor& x, const QuantizedWeight& weight, const torch::Tensor& bias) {
  TORCH_CHECK(weight.defined(), "quantized_dense: the weight has no blocks");
  TORCH_CHECK(x.size(-1) == weight.in_features, "quantized_dense: input width ", x.size(-1), " but the weight takes ",
              weight.in_features);
  TORCH_CHECK(!(torch::GradMode::is_enabled() && x.requires_grad()), "quantized weights are for inference: no gradients");
  const int64_t k_size = weight.in_features, n_size = weight.out_features;
  auto sizes = x.sizes().vec();
  sizes.back() = n_size;
  if (!x.device().is_cpu())  // no device kernels: the product of the dequantized weight
    return at::linear(x, dequantize(weight).to(x.scalar_type()), bias.defined() ? bias.to(x.scalar_type()) : bias);
  const int64_t m_size = x.numel() / k_size;
  const auto rows = x.reshape({m_size, k_size}).contiguous();  // [M, K]
  if (!held_as_ggml_rows(weight.format)) check_blocks(rows, "inputs");
  auto out = torch::empty({m_size, n_size}, x.options());  // [M, N]
  quantized_product(float_rows(rows), m_size, weight, product_out_of(out));
  if (bias.defined()) out += bias.to(out.scalar_type());
  return out.view(sizes);  // [..., N]
}

}  // namespace coconut
