#include "model/quantized_ggml_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "model/ggml_blocks.h"
#include "model/x86_intrinsics.h"

namespace coconut::ggml_rows {

namespace {

constexpr int64_t kSuper = 256;  // values per k-quant super-block (QK_K)

// One weight row unpacked for the integer products: its values as unsigned bytes (Q4_K 0..15, Q5_K
// 0..31, Q6_K q + 32 in 0..63), and per super-block the factors the integer sums take: d, dmin (Q4_K,
// Q5_K), the sub-blocks' scales and mins.
struct UnpackedRow {
  std::vector<uint8_t> values;   // [K]
  std::vector<float> d, dmin;    // per super-block
  std::vector<int16_t> scales;   // Q4_K / Q5_K: 8 a super-block; Q6_K: 16
  std::vector<int16_t> mins;     // Q4_K / Q5_K: 8 a super-block
};

thread_local UnpackedRow unpacked;

// The 8 scales and mins of Q4_K / Q5_K's 12 packed bytes.
void scales_mins_k4(const uint8_t* q, int16_t* scales, int16_t* mins) {
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    k4_scale_min(j, q, scale, min);
    scales[j] = static_cast<int16_t>(scale), mins[j] = static_cast<int16_t>(min);
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

#ifdef COCONUT_X86

// ((h >> shift) & 3) << 4 in each byte (the shifts act on 16-bit lanes; the mask keeps each byte's own bits).
__attribute__((target("avx2"), always_inline)) inline __m256i high_pair(__m256i h, int shift) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), _mm256_set1_epi8(3)), 4);
}

__attribute__((target("avx2,fma"), always_inline)) inline float sum_float_lanes(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// A float16 by the F16C instruction (c10::Half converts in software, a branch and shifts a block).
__attribute__((target("avx2,f16c"), always_inline)) inline float half_f16c(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return _cvtsh_ss(bits);
}

// One weight row times kRows input rows (x + r * x_stride, their scales xd + r * d_stride, their
// sums of 16 sums16 + r * d_stride * 16), the blocks decoded in registers as they stream (llama.cpp's
// scheme for these types) and each decoded vector multiplied with every input row: each
// super-block's integer sums scaled in float lanes, one horizontal sum a row. Q4_K / Q5_K: a 32-byte
// vector of nibbles is sub-blocks 2i (low) and 2i + 1 (high), Q5_K's fifth bits from bit 2i / 2i + 1
// of each qh byte.
template <bool kFiveBit, int kRows>
__attribute__((target("avx2,fma,f16c"))) void dot_q45_k_avx2(const uint8_t* row, const int8_t* x, int64_t x_stride, const float* xd,
                                                              const int32_t* sums16, int64_t d_stride, int64_t supers, float* out) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[kRows];
  float minimums[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps(), minimums[r] = 0;
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* block = row + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(block + 4 * kBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(block + 4 * kBytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(block + 4 * kBytes + 128), _MM_HINT_T0);
    int16_t scales[8], mins[8];
    scales_mins_k4(block + 4, scales, mins);
    const float d = half_f16c(block), dmin = half_f16c(block + 2);
    for (int r = 0; r < kRows; ++r) {
      const int32_t* sums = sums16 + (r * d_stride + b) * 16;
      int32_t minimum_sum = 0;
      for (int j = 0; j < 8; ++j) minimum_sum += int32_t{mins[j]} * (sums[2 * j] + sums[2 * j + 1]);
      minimums[r] += dmin * xd[r * d_stride + b] * static_cast<float>(minimum_sum);
    }
    const uint8_t* ql = block + (kFiveBit ? 48 : 16);
    const __m256i qh = kFiveBit ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)) : _mm256_setzero_si256();
    __m256i sums[kRows];
    for (int r = 0; r < kRows; ++r) sums[r] = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * i));
      __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      if (kFiveBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one), 4));
      }
      const __m256i scale_lo = _mm256_set1_epi16(scales[2 * i]), scale_hi = _mm256_set1_epi16(scales[2 * i + 1]);
      for (int r = 0; r < kRows; ++r) {
        const int8_t* input = x + r * x_stride + b * kSuper + 64 * i;
        const __m256i p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(input)));
        const __m256i p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(input + 32)));
        sums[r] = _mm256_add_epi32(sums[r], _mm256_add_epi32(_mm256_madd_epi16(p_lo, scale_lo), _mm256_madd_epi16(p_hi, scale_hi)));
      }
    }
    for (int r = 0; r < kRows; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * d_stride + b]), _mm256_cvtepi32_ps(sums[r]), acc[r]);
  }
  for (int r = 0; r < kRows; ++r) out[r] = sum_float_lanes(acc[r]) - minimums[r];
}

// Q6_K: each half of a super-block is four vectors of values (q + 32 in 0..63) from 64 bytes of
// nibbles and 32 of 2-bit high parts; 32 times the input comes off each product, and a vector's two
// 16-value sub-blocks take their own scales (the low and the high 128-bit lane).
template <int kRows>
__attribute__((target("avx2,fma,f16c"))) void dot_q6_k_avx2(const uint8_t* row, const int8_t* x, int64_t x_stride, const float* xd,
                                                            int64_t d_stride, int64_t supers, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), thirty_two = _mm256_set1_epi8(32);
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* block = row + b * 210;
    for (int line = 0; line < 4; ++line) _mm_prefetch(reinterpret_cast<const char*>(block + 4 * 210 + 64 * line), _MM_HINT_T0);
    const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
    __m256i sums[kRows];
    for (int r = 0; r < kRows; ++r) sums[r] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
      const __m256i values[4] = {_mm256_or_si256(_mm256_and_si256(a, low), high_pair(h, 0)),
                                 _mm256_or_si256(_mm256_and_si256(c, low), high_pair(h, 2)),
                                 _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), high_pair(h, 4)),
                                 _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low), high_pair(h, 6))};
      for (int k = 0; k < 4; ++k) {
        const int s = 8 * half + 2 * k;
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(scales[s + 1]), _mm_set1_epi16(scales[s]));
        for (int r = 0; r < kRows; ++r) {
          const __m256i input = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * x_stride + b * kSuper + 128 * half + 32 * k));
          const __m256i products = _mm256_sub_epi16(_mm256_maddubs_epi16(values[k], input), _mm256_maddubs_epi16(thirty_two, input));
          sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(products, scale));
        }
      }
    }
    const float d = half_f16c(block + 208);
    for (int r = 0; r < kRows; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * d_stride + b]), _mm256_cvtepi32_ps(sums[r]), acc[r]);
  }
  for (int r = 0; r < kRows; ++r) out[r] = sum_float_lanes(acc[r]);
}

// Weight rows [row_begin, row_end) times every input row: 4 input rows at a time, then one by one.
template <typename Dot4, typename Dot1>
void rows_by_four(int64_t row_begin, int64_t row_end, int64_t m_size, int64_t n_size, float* out, Dot4 dot4, Dot1 dot1) {
  for (int64_t n = row_begin; n < row_end; ++n) {
    int64_t m = 0;
    for (float four[4]; m + 4 <= m_size; m += 4) {
      dot4(n, m, four);
      for (int r = 0; r < 4; ++r) out[(m + r) * n_size + n] = four[r];
    }
    for (; m < m_size; ++m) dot1(n, m, out + m * n_size + n);
  }
}
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

// Row n's super-blocks into `unpacked`.
void unpack_k_row(const uint8_t* row, WeightFormat format, int64_t supers) {
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
      unpacked.d[b] = ggml_half(block + 208);
      for (int j = 0; j < 16; ++j) unpacked.scales[b * 16 + j] = static_cast<int8_t>(block[192 + j]);
      unpack_q6_k_values(block, u);
      continue;
    }
    const bool five_bit = format == WeightFormat::kQ5_K;
    unpacked.d[b] = ggml_half(block);
    unpacked.dmin[b] = ggml_half(block + 2);
    scales_mins_k4(block + 4, unpacked.scales.data() + b * 16, unpacked.mins.data() + b * 8);
    unpack_q45_k_values(block, five_bit, u);
  }
}

thread_local std::vector<float> input_scales;
thread_local std::vector<int8_t> input_values;
thread_local std::vector<int32_t> input_sums;

}  // namespace

uint32_t ggml_type(WeightFormat format) {
  switch (format) {
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
  const bool sixteen = format == WeightFormat::kQ6_K;
#ifdef COCONUT_X86
  if (kernel != 2 && has_avx2_fma_f16c()) {
    const auto dot = [&](auto rows, int64_t n, int64_t m, float* results) {
      constexpr int kRows = decltype(rows)::value;
      const uint8_t* row = weight_rows + n * row_bytes;
      const int8_t* q = x.values + m * x.width;
      const float* dx = x.scales + m * supers;
      const int32_t* sums16 = x.sums16 + m * supers * 16;
      if (format == WeightFormat::kQ6_K)
        dot_q6_k_avx2<kRows>(row, q, x.width, dx, supers, supers, results);
      else if (format == WeightFormat::kQ5_K)
        dot_q45_k_avx2<true, kRows>(row, q, x.width, dx, sums16, supers, supers, results);
      else
        dot_q45_k_avx2<false, kRows>(row, q, x.width, dx, sums16, supers, supers, results);
    };
    rows_by_four(row_begin, row_end, x.rows, n_size, out,
                 [&](int64_t n, int64_t m, float* r) { dot(std::integral_constant<int, 4>(), n, m, r); },
                 [&](int64_t n, int64_t m, float* r) { dot(std::integral_constant<int, 1>(), n, m, r); });
    return;
  }
#endif
  for (int64_t n = row_begin; n < row_end; ++n) {
    unpack_k_row(weight_rows + n * row_bytes, format, supers);
    for (int64_t m = 0; m < x.rows; ++m) {
      float sum = 0;
      for (int64_t b = 0; b < supers; ++b) {
        const uint8_t* u = unpacked.values.data() + b * kSuper;
        const int8_t* q = x.values + (m * supers + b) * kSuper;
        const int16_t* scales = unpacked.scales.data() + b * 16;
        const int32_t* sums16 = x.sums16 + (m * supers + b) * 16;
        const float dx = x.scales[m * supers + b];
        int32_t products = scaled_sums_portable(u, q, scales, sixteen);
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

}  // namespace coconut::ggml_rows
