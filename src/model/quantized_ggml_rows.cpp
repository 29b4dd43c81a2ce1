#include "model/quantized_ggml_rows.h"

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "model/ggml_blocks.h"
#include "model/x86_intrinsics.h"

namespace coconut::ggml_rows {

namespace {

constexpr int64_t kSuper = 256;  // values per k-quant super-block (QK_K)
constexpr int64_t kBlock = 32;   // values per Q5_0 / Q8_0 block

float half_at(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// One weight row unpacked for the integer products: its values as unsigned bytes (Q4_K 0..15, Q5_K
// 0..31, Q6_K q + 32 in 0..63, Q5_0 q + 16 in 0..31), and per super-block (Q5_0: block) the factors
// the integer sums take: d, dmin (Q4_K, Q5_K), the sub-blocks' scales and mins.
struct UnpackedRow {
  std::vector<uint8_t> values;   // [K]
  std::vector<float> d, dmin;    // per super-block (Q5_0: per block, dmin unused)
  std::vector<int16_t> scales;   // Q4_K / Q5_K: 8 a super-block; Q6_K: 16
  std::vector<int16_t> mins;     // Q4_K / Q5_K: 8 a super-block
};

thread_local UnpackedRow unpacked;

// The 6-bit scales and mins of Q4_K / Q5_K's 12 packed bytes (ggml's get_scale_min_k4).
void scales_mins_k4(const uint8_t* q, int16_t* scales, int16_t* mins) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = q[j] & 63;
      mins[j] = q[j + 4] & 63;
    } else {
      scales[j] = static_cast<int16_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
      mins[j] = static_cast<int16_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
  }
}

// Values of one super-block (positions as model/ggml_blocks.cpp dequantizes them), portable.
void unpack_q45_k_values(const uint8_t* block, bool five_bit, uint8_t* u) {
  const uint8_t* qh = block + 16;
  const uint8_t* ql = block + (five_bit ? 48 : 16);
  for (int i = 0; i < 4; ++i, ql += 32)
    for (int part = 0; part < 2; ++part) {
      const uint8_t high_bit = static_cast<uint8_t>(1u << (2 * i + part));
      for (int l = 0; l < 32; ++l) {
        int q = part == 0 ? ql[l] & 0x0F : ql[l] >> 4;
        if (five_bit && (qh[l] & high_bit)) q += 16;
        u[64 * i + 32 * part + l] = static_cast<uint8_t>(q);
      }
    }
}

void unpack_q6_k_values(const uint8_t* block, uint8_t* u) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, u += 128)
    for (int l = 0; l < 32; ++l) {
      u[l] = static_cast<uint8_t>((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
      u[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
      u[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      u[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
}

void unpack_q5_0_values(const uint8_t* block, uint8_t* u) {
  uint32_t qh;
  std::memcpy(&qh, block + 2, 4);
  const uint8_t* qs = block + 6;
  for (int j = 0; j < 16; ++j) {
    u[j] = static_cast<uint8_t>((qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
    u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

#ifdef COCONUT_X86
bool has_avx2() {
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported;
}

// The same values with vectors (bit for bit the portable ones).
__attribute__((target("avx2"))) void unpack_q45_k_values_avx2(const uint8_t* block, bool five_bit, uint8_t* u) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const uint8_t* ql = block + (five_bit ? 48 : 16);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int i = 0; i < 4; ++i) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * i));
    __m256i parts[2] = {_mm256_and_si256(raw, low), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low)};
    for (int part = 0; part < 2; ++part) {
      if (five_bit) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1u << (2 * i + part)));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        parts[part] = _mm256_or_si256(parts[part], _mm256_and_si256(set, sixteen));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 64 * i + 32 * part), parts[part]);
    }
  }
}

// ((h >> shift) & 3) << 4 in each byte (the shifts act on 16-bit lanes; the mask keeps each byte's own bits).
__attribute__((target("avx2"), always_inline)) inline __m256i high_pair(__m256i h, int shift) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), _mm256_set1_epi8(3)), 4);
}

__attribute__((target("avx2"))) void unpack_q6_k_values_avx2(const uint8_t* block, uint8_t* u) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int half = 0; half < 2; ++half, u += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
    const __m256i a_high = _mm256_and_si256(_mm256_srli_epi16(a, 4), low), b_high = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u), _mm256_or_si256(_mm256_and_si256(a, low), high_pair(h, 0)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 32), _mm256_or_si256(_mm256_and_si256(b, low), high_pair(h, 2)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 64), _mm256_or_si256(a_high, high_pair(h, 4)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + 96), _mm256_or_si256(b_high, high_pair(h, 6)));
  }
}

// Horizontal sum of 8 int32 lanes.
__attribute__((target("avx2"), always_inline)) inline int32_t sum_lanes(__m256i v) {
  __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1));
  return _mm_cvtsi128_si32(sum);
}

// Sum over a super-block's 8 sub-blocks of 32 of scale_j * (u . x), or (Q6_K) over its 16 of 16:
// the byte products by maddubs (u <= 63, |x| <= 127: no int16 pair saturates), weighted by the
// sub-block's scale in madd.
__attribute__((target("avx2"))) int32_t scaled_sums_avx2(const uint8_t* u, const int8_t* x, const int16_t* scales, bool sixteen) {
  __m256i total = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 32 * k));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * k));
    const __m256i scale = sixteen ? _mm256_set_m128i(_mm_set1_epi16(scales[2 * k + 1]), _mm_set1_epi16(scales[2 * k]))
                                  : _mm256_set1_epi16(scales[k]);
    total = _mm256_add_epi32(total, _mm256_madd_epi16(_mm256_maddubs_epi16(w, v), scale));
  }
  return sum_lanes(total);
}

__attribute__((target("avx2"))) int32_t dot32_avx2(const uint8_t* u, const int8_t* x) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return sum_lanes(_mm256_madd_epi16(_mm256_maddubs_epi16(w, v), _mm256_set1_epi16(1)));
}
#else
bool has_avx2() { return false; }
#endif

int32_t scaled_sums_portable(const uint8_t* u, const int8_t* x, const int16_t* scales, bool sixteen) {
  int32_t total = 0;
  const int size = sixteen ? 16 : 32;
  for (int j = 0; j < kSuper / size; ++j) {
    int32_t dot = 0;
    for (int l = 0; l < size; ++l) dot += int32_t{u[j * size + l]} * int32_t{x[j * size + l]};
    total += int32_t{scales[j]} * dot;
  }
  return total;
}

int32_t dot32_portable(const uint8_t* u, const int8_t* x) {
  int32_t dot = 0;
  for (int l = 0; l < 32; ++l) dot += int32_t{u[l]} * int32_t{x[l]};
  return dot;
}

// Row n's super-blocks into `unpacked`.
void unpack_k_row(const uint8_t* row, WeightFormat format, int64_t supers, bool vectors) {
  unpacked.values.resize(static_cast<size_t>(supers * kSuper));
  unpacked.d.resize(static_cast<size_t>(supers));
  unpacked.dmin.resize(static_cast<size_t>(supers));
  unpacked.scales.resize(static_cast<size_t>(supers * 16));
  unpacked.mins.resize(static_cast<size_t>(supers * 8));
  const int64_t bytes = block_bytes(format);
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* block = row + b * bytes;
    uint8_t* u = unpacked.values.data() + b * kSuper;
    if (format == WeightFormat::kQ6_K) {
      unpacked.d[b] = half_at(block + 208);
      for (int j = 0; j < 16; ++j) unpacked.scales[b * 16 + j] = static_cast<int8_t>(block[192 + j]);
#ifdef COCONUT_X86
      if (vectors) {
        unpack_q6_k_values_avx2(block, u);
        continue;
      }
#endif
      unpack_q6_k_values(block, u);
      continue;
    }
    const bool five_bit = format == WeightFormat::kQ5_K;
    unpacked.d[b] = half_at(block);
    unpacked.dmin[b] = half_at(block + 2);
    scales_mins_k4(block + 4, unpacked.scales.data() + b * 16, unpacked.mins.data() + b * 8);
#ifdef COCONUT_X86
    if (vectors) {
      unpack_q45_k_values_avx2(block, five_bit, u);
      continue;
    }
#endif
    unpack_q45_k_values(block, five_bit, u);
  }
}

thread_local std::vector<float> input_scales;
thread_local std::vector<int8_t> input_values;
thread_local std::vector<int32_t> input_sums;

}  // namespace

uint32_t ggml_type(WeightFormat format) {
  switch (format) {
    case WeightFormat::kQ5_0: return static_cast<uint32_t>(GgmlType::kQ5_0);
    case WeightFormat::kQ4_K: return static_cast<uint32_t>(GgmlType::kQ4_K);
    case WeightFormat::kQ5_K: return static_cast<uint32_t>(GgmlType::kQ5_K);
    case WeightFormat::kQ6_K: return static_cast<uint32_t>(GgmlType::kQ6_K);
    default: break;
  }
  throw std::invalid_argument(weight_format_name(format) + " weights are not held as ggml rows");
}

int64_t block_bytes(WeightFormat format) { return static_cast<int64_t>(ggml_block_layout(ggml_type(format))->bytes); }

InputRowsQ8K quantize_q8_k(const float* values, int64_t rows, int64_t width) {
  if (width % kSuper != 0) throw std::invalid_argument("k-quant products need rows of a multiple of 256 values");
  const int64_t supers = rows * width / kSuper;
  input_scales.resize(static_cast<size_t>(supers));
  input_values.resize(static_cast<size_t>(rows * width));
  input_sums.resize(static_cast<size_t>(supers * 16));
  for (int64_t b = 0; b < supers; ++b) {
    const float* x = values + b * kSuper;
    int8_t* q = input_values.data() + b * kSuper;
    float max = 0, amax = 0;
    for (int64_t j = 0; j < kSuper; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    if (amax == 0) {
      input_scales[b] = 0;
      std::memset(q, 0, kSuper);
    } else {
      const float iscale = -127.0f / max;
      for (int64_t j = 0; j < kSuper; ++j) q[j] = static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(iscale * x[j]))));
      input_scales[b] = 1 / iscale;
    }
    for (int j = 0; j < 16; ++j) {
      int32_t sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
      input_sums[b * 16 + j] = sum;
    }
  }
  return {rows, width, input_scales.data(), input_values.data(), input_sums.data()};
}

void rows_times_q8_k(const uint8_t* weight_rows, WeightFormat format, int64_t row_begin, int64_t row_end, const InputRowsQ8K& x,
                     int kernel, float* out, int64_t n_size) {
  const int64_t supers = x.width / kSuper, row_bytes = supers * block_bytes(format);
  const bool vectors = kernel != 2 && has_avx2();
  const bool sixteen = format == WeightFormat::kQ6_K;
  for (int64_t n = row_begin; n < row_end; ++n) {
    unpack_k_row(weight_rows + n * row_bytes, format, supers, vectors);
    for (int64_t m = 0; m < x.rows; ++m) {
      float sum = 0;
      for (int64_t b = 0; b < supers; ++b) {
        const uint8_t* u = unpacked.values.data() + b * kSuper;
        const int8_t* q = x.values + (m * supers + b) * kSuper;
        const int16_t* scales = unpacked.scales.data() + b * 16;
        const int32_t* sums16 = x.sums16 + (m * supers + b) * 16;
        const float dx = x.scales[m * supers + b];
#ifdef COCONUT_X86
        int32_t products = vectors ? scaled_sums_avx2(u, q, scales, sixteen) : scaled_sums_portable(u, q, scales, sixteen);
#else
        int32_t products = scaled_sums_portable(u, q, scales, sixteen);
#endif
        if (sixteen) {  // the values are q + 32: take 32 * scale * (sum of the input's 16) off
          for (int j = 0; j < 16; ++j) products -= 32 * int32_t{scales[j]} * sums16[j];
          sum += unpacked.d[b] * dx * static_cast<float>(products);
        } else {  // d * scale * q - dmin * min, the min times the sub-block's input sum
          int32_t minimums = 0;
          for (int j = 0; j < 8; ++j) minimums += int32_t{unpacked.mins[b * 8 + j]} * (sums16[2 * j] + sums16[2 * j + 1]);
          sum += unpacked.d[b] * dx * static_cast<float>(products);
          sum -= unpacked.dmin[b] * dx * static_cast<float>(minimums);
        }
      }
      out[m * n_size + n] = sum;
    }
  }
}

void rows_times_q8_0(const uint8_t* weight_rows, int64_t row_begin, int64_t row_end, const InputRowsQ8_0& x, int kernel, float* out,
                     int64_t n_size) {
  const int64_t blocks = x.width / kBlock, bytes = block_bytes(WeightFormat::kQ5_0);
  const bool vectors = kernel != 2 && has_avx2();
  unpacked.values.resize(static_cast<size_t>(x.width));
  unpacked.d.resize(static_cast<size_t>(blocks));
  for (int64_t n = row_begin; n < row_end; ++n) {
    const uint8_t* row = weight_rows + n * blocks * bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      unpacked.d[b] = half_at(row + b * bytes);
      unpack_q5_0_values(row + b * bytes, unpacked.values.data() + b * kBlock);
    }
    for (int64_t m = 0; m < x.rows; ++m) {
      float sum = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* u = unpacked.values.data() + b * kBlock;
        const int8_t* q = x.values + (m * blocks + b) * kBlock;
#ifdef COCONUT_X86
        const int32_t dot = vectors ? dot32_avx2(u, q) : dot32_portable(u, q);
#else
        const int32_t dot = dot32_portable(u, q);
#endif
        // The values are q + 16: take 16 * (sum of the input's 32) off.
        sum += unpacked.d[b] * x.half_scales[m * blocks + b] * static_cast<float>(dot - 16 * x.sums[m * blocks + b]);
      }
      out[m * n_size + n] = sum;
    }
  }
}

}  // namespace coconut::ggml_rows
