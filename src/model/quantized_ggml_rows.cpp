#include "model/quantized_ggml_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>

#include "model/ggml_blocks.h"
#include "model/x86_intrinsics.h"

namespace coconut::ggml_rows {

namespace {

constexpr int64_t kSuper = 256;  // values per k-quant super-block (QK_K)
constexpr int64_t kTileInputRows = 4;  // the fewest input rows that take the VNNI tiles

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

// Q4_K / Q5_K: vector i (0..3) of a super-block's nibbles as its two sub-blocks' values, unsigned
// bytes: sub-block 2i from the low nibbles, 2i + 1 from the high ones, Q5_K's fifth bits from bits
// 2i and 2i + 1 of each qh byte.
template <bool kFiveBit>
__attribute__((target("avx2"), always_inline)) inline void q45_k_values(const uint8_t* block, int i, __m256i& lo, __m256i& hi) {
  const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (kFiveBit ? 48 : 16) + 32 * i));
  lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
  if (kFiveBit) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16));
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one), 4));
  }
}

// Q6_K: half `half` of a super-block as four vectors of values (q + 32 in 0..63), from 64 bytes of
// nibbles and 32 of 2-bit high parts: values 128 half + 32k.. in vector k.
__attribute__((target("avx2"), always_inline)) inline void q6_k_values(const uint8_t* block, int half, __m256i (&values)[4]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
  values[0] = _mm256_or_si256(_mm256_and_si256(a, low), high_pair(h, 0));
  values[1] = _mm256_or_si256(_mm256_and_si256(c, low), high_pair(h, 2));
  values[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), high_pair(h, 4));
  values[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low), high_pair(h, 6));
}

__attribute__((target("avx2,fma"), always_inline)) inline float sum_float_lanes(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

__attribute__((target("avx2,fma"), always_inline)) inline float sum_float_lanes(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// A float16 by the F16C instruction (c10::Half converts in software, a branch and shifts a block).
__attribute__((target("avx2,f16c"), always_inline)) inline float half_f16c(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return _cvtsh_ss(bits);
}

// vpshufb's control that fills the low 128-bit lane with 16-bit word `low_word` of that lane and the
// high lane with its word `high_word`.
__attribute__((target("avx2"), always_inline)) inline __m256i word_in_each_lane(int low_word, int high_word) {
  const auto lo = static_cast<int16_t>(0x0100 * (2 * low_word + 1) + 2 * low_word);
  const auto hi = static_cast<int16_t>(0x0100 * (2 * high_word + 1) + 2 * high_word);
  return _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi));
}

// Q4_K / Q5_K's 8 scales (16-bit words 0-7) and 8 mins (words 8-15) as int16: k4_scales_mins_words
// in vector lanes (the 12 packed bytes as 32-bit words a, b, c; the load's last 4 bytes, the
// block's first values, are not used), widened.
__attribute__((target("avx2"), always_inline)) inline __m256i k4_scales_mins_vector(const uint8_t* packed) {
  const __m128i abc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i low_parts = _mm_shuffle_epi32(abc, _MM_SHUFFLE(2, 1, 2, 0));  // a, c, b, c
  const __m128i top_parts = _mm_shuffle_epi32(abc, _MM_SHUFFLE(1, 1, 0, 0));  // -, a, -, b
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(low_parts, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(top_parts, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm256_cvtepu8_epi16(_mm_or_si128(low, top));
}

// How far ahead of the block in hand the kernels ask for the weights, and to which level: weight
// rows lie one after another, so this runs into the next rows. Measured on the 2-core Xeon of
// docs/real-models.md (one thread, 200 MB of Q4_K / Q6_K rows times one input row, requests to the
// first level): 4 blocks ahead (576-840 bytes) streamed 7.6-8.9 GB/s, 16 blocks 10.0-10.9, 24-64
// blocks 11.2-11.5 (the machine reads about 12-13 GB/s at all): 4 KiB to the first level (near). On
// the Zen 4 EPYC of docs/performance.md (same bench on 2 MiB pages, binaries alternated) the VNNI
// decode kernels read Q4_K at 24.9-26.3 GB/s 16 KiB ahead to the second level (far) against 20.0-20.4
// near (8 KiB far 24-26, 32 KiB the same as 16, 16 KiB to the first level 19.3, none 16-17), Q6_K
// 25.4-30.5 against 23.7-24.5; but two threads decoded the 1B-shaped Q4_K_M file 9% slower far. So
// the decode kernels take the mode measured per host and thread count (rows_times_q8_k's
// `far_prefetch`, ProductKind::kKQuantPrefetch); the AVX2 kernels and the prefill tiles ask near.
template <bool kFar = false>
__attribute__((always_inline)) inline void prefetch_ahead(const uint8_t* at) {
  if constexpr (kFar)
    _mm_prefetch(reinterpret_cast<const char*>(at + 16384), _MM_HINT_T1);
  else
    _mm_prefetch(reinterpret_cast<const char*>(at + 4096), _MM_HINT_T0);
}

// One weight row times kRows input rows (x + r * x_stride, their scales xd + r * d_stride, their
// sums of 32 in int16 pairs pairs32 + r * d_stride * 4), the blocks decoded in registers as they
// stream (llama.cpp's scheme for these types) and each decoded vector multiplied with every input
// row: each super-block's integer sums scaled in float lanes, one horizontal sum a row (values by
// q45_k_values). The scales and mins are decoded into one vector; each sub-block's scale is a
// byte shuffle of it, and the mins' correction one vpmaddwd with the input's sums of 32.
template <bool kFiveBit, int kRows>
__attribute__((target("avx2,fma,f16c"))) void dot_q45_k_avx2(const uint8_t* row, const int8_t* x, int64_t x_stride, const float* xd,
                                                              const int32_t* pairs32, int64_t d_stride, int64_t supers, float* out) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  __m256 acc[kRows];
  __m128 minimums[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps(), minimums[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* block = row + b * kBytes;
    for (int line = 0; line < 3; ++line) prefetch_ahead(block + 64 * line);
    const __m256i scales_mins = k4_scales_mins_vector(block + 4);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
    const __m128i mins = _mm256_extracti128_si256(scales_mins, 1);
    const float d = half_f16c(block), dmin = half_f16c(block + 2);
    __m256i sums[kRows];
    for (int r = 0; r < kRows; ++r) {
      sums[r] = _mm256_setzero_si256();
      const auto* input_sums = reinterpret_cast<const __m128i*>(pairs32 + (r * d_stride + b) * 4);
      const __m128i minimum_sums = _mm_madd_epi16(mins, _mm_loadu_si128(input_sums));  // 4 int32: mins 2k, 2k + 1 by their sub-blocks' sums
      minimums[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * xd[r * d_stride + b]), _mm_cvtepi32_ps(minimum_sums), minimums[r]);
    }
    for (int i = 0; i < 4; ++i) {
      __m256i lo, hi;
      q45_k_values<kFiveBit>(block, i, lo, hi);
      const __m256i scale_lo = _mm256_shuffle_epi8(scales, word_in_each_lane(2 * i, 2 * i));
      const __m256i scale_hi = _mm256_shuffle_epi8(scales, word_in_each_lane(2 * i + 1, 2 * i + 1));
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
  for (int r = 0; r < kRows; ++r) out[r] = sum_float_lanes(acc[r]) - sum_float_lanes(minimums[r]);
}

// Q6_K: each half of a super-block is four vectors of values (q + 32 in 0..63) from 64 bytes of
// nibbles and 32 of 2-bit high parts, a vector's two 16-value sub-blocks taking their own scales (the
// low and the high 128-bit lane, byte shuffles of the 16 scales widened once). The 32 the values
// carry comes off once a super-block: 32 times the scales by the input's sums of 16 (pairs16), one
// vpmaddwd.
template <int kRows>
__attribute__((target("avx2,fma,f16c"))) void dot_q6_k_avx2(const uint8_t* row, const int8_t* x, int64_t x_stride, const float* xd,
                                                            const int32_t* pairs16, int64_t d_stride, int64_t supers, float* out) {
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* block = row + b * 210;
    for (int line = 0; line < 4; ++line) prefetch_ahead(block + 64 * line);
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)));
    __m256i sums[kRows];
    for (int r = 0; r < kRows; ++r) {
      const auto* input_sums = reinterpret_cast<const __m256i*>(pairs16 + (r * d_stride + b) * 8);
      const __m256i offsets = _mm256_madd_epi16(scales, _mm256_loadu_si256(input_sums));
      sums[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offsets, 5));
    }
    for (int half = 0; half < 2; ++half) {
      __m256i values[4];
      q6_k_values(block, half, values);
      // This half's 8 scales in both lanes.
      const __m256i half_scales = _mm256_permute2x128_si256(scales, scales, half == 0 ? 0x00 : 0x11);
      for (int k = 0; k < 4; ++k) {
        const __m256i scale = _mm256_shuffle_epi8(half_scales, word_in_each_lane(2 * k, 2 * k + 1));
        for (int r = 0; r < kRows; ++r) {
          const __m256i input = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * x_stride + b * kSuper + 128 * half + 32 * k));
          sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(_mm256_maddubs_epi16(values[k], input), scale));
        }
      }
    }
    const float d = half_f16c(block + 208);
    for (int r = 0; r < kRows; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[r * d_stride + b]), _mm256_cvtepi32_ps(sums[r]), acc[r]);
  }
  for (int r = 0; r < kRows; ++r) out[r] = sum_float_lanes(acc[r]);
}

// Decode on AVX-512 VNNI CPUs (one to three input rows): one weight row at a time in memory order,
// 512-bit vectors of 64 values. Q5_K: the AVX2 kernels' scheme (two groups of 32 a vector, the low
// or high nibbles of a 64-byte load, the input read in the matching paired order; vpmaddubsw forms
// the int16 pair sums and vpdpwssd multiplies them by the sub-blocks' scales, byte shuffles of the
// scales broadcast, in two chains). Q4_K and Q6_K: vpdpbusd sums 4 products into int32 lanes that
// each belong to one sub-block (for Q4_K two 128-bit shuffles of the nibbles and the input in the
// lane order bring that about), the sums of two vectors packed to int16 and multiplied by their
// scales in one vpdpwssd; Q4_K decodes four super-blocks' factors at a time. The integer sums are
// the AVX2 kernels' (exact); the float lanes are 16 and not 8. Measured (Zen 4, one thread,
// bench_kquant_rows, 2 MiB pages): the vpmaddubsw scheme for all three was bound by its vector
// instructions (Q4_K 23.0 GB/s with the rows in the second-level cache, 20.4-21.5 from memory, AVX2
// 17.8); vpdpbusd and the factors of four took Q4_K to 28.2 in the cache (2026-12-01), Q6_K 30.1 ->
// 31.7; from memory they need the prefetch above. Several weight rows at a time, their blocks
// interleaved (fewer horizontal sums, shared input loads), streamed at half the rate on that host
// (9.7-12.2 GB/s).

// vpshufb controls taking 16-bit word `words[l]` of every 128-bit lane l of a vector.
__attribute__((target("avx512f"), always_inline)) inline __m512i words_by_lane(int w0, int w1, int w2, int w3) {
  const auto word = [](int w) { return static_cast<int32_t>((0x0100 * (2 * w + 1) + 2 * w) * 0x10001u); };
  return _mm512_setr_epi32(word(w0), word(w0), word(w0), word(w0), word(w1), word(w1), word(w1), word(w1), word(w2), word(w2),
                           word(w2), word(w2), word(w3), word(w3), word(w3), word(w3));
}

// Q5_K: `x` in the paired order (InputRowsQ8K::values_paired), so that a 64-byte load of nibbles
// gives two vectors by a mask and a shift: its low nibbles are groups 4h and 4h + 2 of the
// super-block, its high ones 4h + 1 and 4h + 3; each value's fifth bit from the qh bytes.
template <bool kFar>
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) float dot_q5_k_avx512(
    const uint8_t* row, const int8_t* x, const float* xd, const int32_t* pairs32, int64_t supers) {
  constexpr int64_t kBytes = 176;
  const __m512i low = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
  // Vector v (0..3) holds groups 2v - v % 2 (low half) and 2v - v % 2 + 2 (high half): 0|2, 1|3, 4|6, 5|7.
  __m512i scale_control[4], fifth_shift[4];
  for (int v = 0; v < 4; ++v) {
    const int group = 2 * v - v % 2;
    scale_control[v] = words_by_lane(group, group, group + 2, group + 2);
    // The fifth bits of group j are bit j of the qh bytes.
    fifth_shift[v] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(group))),
                                        _mm256_set1_epi16(static_cast<int16_t>(group + 2)), 1);
  }
  __m512 acc = _mm512_setzero_ps();
  __m128 minimums = _mm_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const float dx = xd[b];
    const uint8_t* block = row + b * kBytes;
    for (int line = 0; line < 3; ++line) prefetch_ahead<kFar>(block + 64 * line);
    const __m256i scales_mins = k4_scales_mins_vector(block + 4);
    const __m512i scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(scales_mins));
    const __m128i input_sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs32 + b * 4));
    const __m128i minimum_sums = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), input_sums);
    minimums = _mm_fmadd_ps(_mm_set1_ps(half_f16c(block + 2) * dx), _mm_cvtepi32_ps(minimum_sums), minimums);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)));
    __m512i sums[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};  // two chains of vpdpwssd, not one of four
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i nibbles = _mm512_loadu_si512(block + 48 + 64 * h);
      __m512i values[2] = {_mm512_and_si512(nibbles, low), _mm512_and_si512(_mm512_srli_epi16(nibbles, 4), low)};
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const int v = 2 * h + k;
        values[k] = _mm512_or_si512(values[k], _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, fifth_shift[v]), one), 4));
        const __m512i pairs = _mm512_maddubs_epi16(values[k], _mm512_loadu_si512(x + b * kSuper + 64 * v));
        sums[k] = _mm512_dpwssd_epi32(sums[k], pairs, _mm512_shuffle_epi8(scales, scale_control[v]));
      }
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(half_f16c(block) * dx), _mm512_cvtepi32_ps(_mm512_add_epi32(sums[0], sums[1])), acc);
  }
  return _mm512_reduce_add_ps(acc) - sum_float_lanes(minimums);
}

// Q4_K with vpdpbusd, four super-blocks' factors at a time. `x` in the lane order
// (InputRowsQ8K::values_lanes): the block's two 64-byte loads of nibbles become two vectors whose
// 128-bit lane j holds group j's first (second) 16 bytes, so that every int32 lane of the low
// nibbles' sums belongs to sub-block 2j and of the high ones' to 2j + 1: four vpdpbusd into two sums
// (each lane at most 8 products of 15 by 128, within int16), packed to int16 and multiplied by the
// sub-blocks' scales in one vpdpwssd. The factors (d, dmin, the 6-bit scales and mins) of four
// super-blocks are decoded together, each 128-bit lane one block's first 16 bytes, and the mins'
// correction of the four is one vpmaddwd with their input sums.
struct Q4KFactors {
  __m512i words_low, words_high;  // scales (words 0-7) and mins (8-15) of blocks 0, 1 | 2, 3 in 256-bit halves
  __m256 d_dmin;                  // d * dx, dmin * dx of the four blocks, interleaved
};

// Super-blocks `block`, + 144, + 288, + 432 (their input scales dx[0..3], their input sums of 32 in
// pairs32[0..15]): the factors, and the four blocks' mins correction added to `minimums`.
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"), always_inline)) inline Q4KFactors q4_k_factors_of_four(
    const uint8_t* block, const float* dx, const int32_t* pairs32, __m512& minimums) {
  __m512i heads = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  heads = _mm512_inserti32x4(heads, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 144)), 1);
  heads = _mm512_inserti32x4(heads, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 288)), 2);
  heads = _mm512_inserti32x4(heads, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 432)), 3);
  // A lane's 32-bit words: d | dmin, then the 12 packed bytes as words a, b, c (k4_scales_mins_vector).
  const __m512i low_parts = _mm512_shuffle_epi32(heads, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(3, 2, 3, 1)));  // a, c, b, c
  const __m512i top_parts = _mm512_shuffle_epi32(heads, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(2, 2, 1, 1)));  // -, a, -, b
  const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(low_parts, _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0, 0, 4))),
                                       _mm512_broadcast_i32x4(_mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)));
  const __m512i top = _mm512_and_si512(_mm512_srli_epi32(top_parts, 2), _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
  const __m512i bytes = _mm512_or_si512(low, top);  // lane k: block k's 8 scales, then 8 mins
  Q4KFactors factors;
  factors.words_low = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(bytes));
  factors.words_high = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(bytes, 1));
  // d, dmin of each block (words 0, 1 of its lane) as float, times its dx.
  const __m512i head_words = _mm512_permutexvar_epi16(_mm512_setr_epi32(0x10000, 0x90008, 0x110010, 0x190018, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), heads);
  const __m256 dx_pairs = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), _mm256_castps128_ps256(_mm_loadu_ps(dx)));
  factors.d_dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(head_words)), dx_pairs);
  // The mins correction: lane k holds block k's mins (words 8-15 of its half) times its input sums.
  const __m512i mins = _mm512_permutex2var_epi16(
      factors.words_low,
      _mm512_setr_epi32(0x90008, 0xb000a, 0xd000c, 0xf000e, 0x190018, 0x1b001a, 0x1d001c, 0x1f001e, 0x290028, 0x2b002a, 0x2d002c,
                        0x2f002e, 0x390038, 0x3b003a, 0x3d003c, 0x3f003e),
      factors.words_high);
  const __m512i minimum_sums = _mm512_madd_epi16(mins, _mm512_loadu_si512(pairs32));
  const __m512 dmin = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7), _mm512_castps256_ps512(factors.d_dmin));
  minimums = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(minimum_sums), minimums);
  return factors;
}

// One super-block's values times its input (lane order), scaled by its sub-blocks' scales (`scales`:
// 128-bit lane j holds sub-block 2j's scale in words 0-3 and 2j + 1's in words 4-7, the order
// _mm512_packs_epi32 leaves the two sums in): 16 int32 lanes.
__attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline)) inline __m512i q4_k_scaled_sums(
    const uint8_t* nibbles, const int8_t* input, __m512i scales) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i q0 = _mm512_loadu_si512(nibbles), q1 = _mm512_loadu_si512(nibbles + 64);
  const __m512i first = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(2, 0, 2, 0));   // lane j: bytes 32j .. 32j + 15
  const __m512i second = _mm512_shuffle_i64x2(q0, q1, _MM_SHUFFLE(3, 1, 3, 1));  // lane j: bytes 32j + 16 .. 32j + 31
  __m512i even = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(first, low), _mm512_loadu_si512(input));
  __m512i odd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(_mm512_srli_epi16(first, 4), low), _mm512_loadu_si512(input + 128));
  even = _mm512_dpbusd_epi32(even, _mm512_and_si512(second, low), _mm512_loadu_si512(input + 64));
  odd = _mm512_dpbusd_epi32(odd, _mm512_and_si512(_mm512_srli_epi16(second, 4), low), _mm512_loadu_si512(input + 192));
  return _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(even, odd), scales);
}

template <bool kFar>
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) float dot_q4_k_lanes_avx512(
    const uint8_t* row, const int8_t* x, const float* xd, const int32_t* pairs32, int64_t supers) {
  // Block k's scales vector from its half of the factors' words: word w takes scale 2 (w / 8) + (w % 8) / 4.
  __m512i scale_index[2];
  for (int half = 0; half < 2; ++half) {
    alignas(64) int16_t words[32];
    for (int w = 0; w < 32; ++w) words[w] = static_cast<int16_t>(16 * half + 2 * (w / 8) + (w % 8) / 4);
    scale_index[half] = _mm512_load_si512(words);
  }
  __m512 acc = _mm512_setzero_ps(), minimums = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= supers; b += 4) {
    const uint8_t* block = row + b * 144;
    for (int line = 0; line < 9; ++line) prefetch_ahead<kFar>(block + 64 * line);
    const Q4KFactors factors = q4_k_factors_of_four(block, xd + b, pairs32 + b * 4, minimums);
    const __m512 d = _mm512_castps256_ps512(factors.d_dmin);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i scales = _mm512_permutexvar_epi16(scale_index[k % 2], k < 2 ? factors.words_low : factors.words_high);
      const __m512i sums = q4_k_scaled_sums(block + 144 * k + 16, x + (b + k) * kSuper, scales);
      acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(2 * k), d), _mm512_cvtepi32_ps(sums), acc);
    }
  }
  float tail = 0;
  for (; b < supers; ++b) {  // the last supers % 4 blocks, one at a time
    const uint8_t* block = row + b * 144;
    const __m256i scales_mins = k4_scales_mins_vector(block + 4);
    const __m512i scales = _mm512_permutexvar_epi16(scale_index[0], _mm512_castsi256_si512(scales_mins));
    const __m512i sums = q4_k_scaled_sums(block + 16, x + b * kSuper, scales);
    const __m128i minimum_sums = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), _mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs32 + b * 4)));
    tail += half_f16c(block) * xd[b] * static_cast<float>(_mm512_reduce_add_epi32(sums)) -
            half_f16c(block + 2) * xd[b] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_zextsi128_si512(minimum_sums)));
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(minimums) + tail;
}

template <bool kFar>
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))) float dot_q6_k_avx512(
    const uint8_t* row, const int8_t* x, const float* xd, const int32_t* pairs16, int64_t supers) {
  const __m512i low = _mm512_set1_epi8(0x0F), high_bits = _mm512_set1_epi8(0x30);
  // The 2-bit high parts of values 0-31 | 32-63 of a half sit at bits 0 | 2 of its qh bytes (shifted
  // up 4 | 2 to bits 4-5), of 64-95 | 96-127 at bits 4 | 6 (shifted down 0 | 2).
  const __m512i first_shift = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(4)), _mm256_set1_epi16(2), 1);
  const __m512i second_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  // 128-bit lane j of the first (second) vector of a half is sub-block j (4 + j) of its 8, so each
  // int32 lane of a vpdpbusd sums 4 products of one sub-block (at most 4 * 63 * 128, within int16).
  // The two sums packed to int16 hold, in lane j, sub-block j's in words 0-3 and 4 + j's in words
  // 4-7: word w of half h's scales vector takes scale 8h + w / 8 + 4 ((w % 8) / 4).
  __m512i scale_index[2];
  for (int half = 0; half < 2; ++half) {
    alignas(64) int16_t words[32];
    for (int w = 0; w < 32; ++w) words[w] = static_cast<int16_t>(8 * half + w / 8 + 4 * ((w % 8) / 4));
    scale_index[half] = _mm512_load_si512(words);
  }
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const __m256i input_sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs16 + b * 8));
    const uint8_t* block = row + b * 210;
    for (int line = 0; line < 4; ++line) prefetch_ahead<kFar>(block + 64 * line);
    const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)));
    // The values are q + 32: 32 times the scales by the input's sums of 16 off.
    const __m256i offsets = _mm256_madd_epi16(scales16, input_sums);
    // Two chains of vpdpwssd (one a half), the offset in the first.
    __m512i sums[2] = {_mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offsets, 5))),
                       _mm512_setzero_si512()};
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const __m512i nibbles = _mm512_loadu_si512(block + 64 * half);  // values 0-31 | 32-63 low, 64-95 | 96-127 high
      const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half)));
      // (nibble & 0x0F) | high part, one vpternlogd (0xEA: (a & b) | c).
      const __m512i first = _mm512_ternarylogic_epi32(nibbles, low, _mm512_and_si512(_mm512_sllv_epi16(high, first_shift), high_bits), 0xEA);
      const __m512i second = _mm512_ternarylogic_epi32(_mm512_srli_epi16(nibbles, 4), low,
                                                       _mm512_and_si512(_mm512_srlv_epi16(high, second_shift), high_bits), 0xEA);
      const int8_t* input = x + b * kSuper + 128 * half;
      const __m512i first_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), first, _mm512_loadu_si512(input));
      const __m512i second_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), second, _mm512_loadu_si512(input + 64));
      sums[half] = _mm512_dpwssd_epi32(sums[half], _mm512_packs_epi32(first_sums, second_sums),
                                       _mm512_permutexvar_epi16(scale_index[half], _mm512_castsi256_si512(scales16)));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(half_f16c(block + 208) * xd[b]), _mm512_cvtepi32_ps(_mm512_add_epi32(sums[0], sums[1])), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Prefill on VNNI CPUs: weight rows 16 at a time (a group: one 512-bit vector of int32 lanes), each
// group's super-blocks unpacked once into the calling thread's buffer and then multiplied with
// every input row, 4 at a time. Per super-block the buffer holds:
//  - the values as unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K q + 32), interleaved as the Q8_0
//    kernels hold theirs: chunk c (of 64) is the 16 rows' values 4c..4c+3, so one vpdpbusd with the
//    input's 4 values of that chunk, broadcast, adds to the 16 rows' int32 lanes;
//  - the sub-blocks' scales as float32 [subs][16 rows] (8 sub-blocks of 32 values; Q6_K 16 of 16);
//  - Q4_K / Q5_K: the mins as int16 pairs [4][16 rows][2], for the correction (times the input's
//    sums of 32);
//  - d, then dmin, as float32 [16 rows] each.
// Rows past the weight's end are zeros. Each sub-block's integer sum (Q6_K's less 32 times the
// input's sum of its 16 values, for the q + 32) times its scale is an integer below 2^24, exact in
// float32, and so is their sum over the super-block while it stays below 2^24: the super-block's sum
// is then llama.cpp's integer exactly, times d * d_x once. Scaling in float32 (cvt, multiply-add) in
// place of vpmulld (two uops on the one port vpdpbusd takes) ran the kernel alone 1.25-1.3x as fast
// (90-93 -> 117-122 GMAC/s, 4 input rows at a time, the Xeon of docs/real-models.md). Scaling by
// d * scale instead, rounded a sub-block, moved SmolLM2's Q4_K_M perplexity 13.815 -> 13.854 against
// llama-perplexity's 13.809: each rounding can flip a later layer's 8-bit input, so the order of a
// product's roundings shows in the perplexity. 16 rows in 512-bit vectors against 8 in 256-bit ones:
// prefill of the 1B-shaped Q4_K_M model 236 -> 288 tokens/s at one thread; the row kernels gave 87.
constexpr int64_t kTileRows = 16;
template <bool kSixBit>
struct GroupLayout {
  static constexpr int kSubs = kSixBit ? 16 : 8;
  static constexpr int kPairs = kSixBit ? 0 : 4;  // mins in int16 pairs
  static constexpr int64_t kChunkBytes = 4 * kTileRows;
  static constexpr int64_t kScalesAt = 64 * kChunkBytes;
  static constexpr int64_t kPairsAt = kScalesAt + kSubs * 4 * kTileRows;
  static constexpr int64_t kDAt = kPairsAt + kPairs * 4 * kTileRows;
  static constexpr int64_t kDminAt = kDAt + 4 * kTileRows;
  static constexpr int64_t kBytes = kDminAt + 4 * kTileRows;  // per super-block
};

thread_local std::vector<uint8_t> group_buffer;

// 8 rows' values of one super-block (rows[i] 256 bytes each) into chunks (chunk c's 32 bytes at
// chunks + c * stride): 8x8 transposes of 4-byte elements.
__attribute__((target("avx2"))) void interleave_values(const uint8_t (*rows)[kSuper], uint8_t* chunks, int64_t stride) {
  for (int c0 = 0; c0 < 64; c0 += 8) {
    __m256i v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + 4 * c0));
    __m256i t[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
      t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    __m256i u[8];
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
      u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
      u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
      u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // u[k]: chunk c0 + k of rows 0-3 (low 128 bits) and c0 + k + 4 (high); u[k + 4] the same of rows 4-7.
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(chunks + (c0 + k) * stride), _mm256_permute2x128_si256(u[k], u[k + 4], 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(chunks + (c0 + k + 4) * stride), _mm256_permute2x128_si256(u[k], u[k + 4], 0x31));
    }
  }
}

// One row's super-block values as unsigned bytes, in vectors (positions as unpack_q45_k_values /
// unpack_q6_k_values).
template <bool kSixBit, bool kFiveBit>
__attribute__((target("avx2"))) void unpack_values_avx2(const uint8_t* block, uint8_t* u) {
  auto* to = reinterpret_cast<__m256i*>(u);
  for (int part = 0; part < (kSixBit ? 2 : 4); ++part) {
    __m256i values[4];
    if (kSixBit)
      q6_k_values(block, part, values);
    else
      q45_k_values<kFiveBit>(block, part, values[0], values[1]);
    for (int k = 0; k < (kSixBit ? 4 : 2); ++k) _mm256_storeu_si256(to++, values[k]);
  }
}

// Rows [first, first + count) (count <= 16) of the weight into `group` (GroupLayout, supers of them).
template <bool kSixBit, bool kFiveBit>
__attribute__((target("avx2,f16c"))) void unpack_group(const uint8_t* weight_rows, int64_t row_bytes, int64_t first, int64_t count,
                                                       int64_t supers, uint8_t* group) {
  using Layout = GroupLayout<kSixBit>;
  constexpr int64_t kBlockBytes = kSixBit ? 210 : kFiveBit ? 176 : 144;
  alignas(32) uint8_t values[kTileRows][kSuper];
  for (int64_t b = 0; b < supers; ++b) {
    uint8_t* to = group + b * Layout::kBytes;
    auto* scales = reinterpret_cast<float*>(to + Layout::kScalesAt);
    auto* pairs = reinterpret_cast<int16_t*>(to + Layout::kPairsAt);
    auto* d = reinterpret_cast<float*>(to + Layout::kDAt);
    auto* dmin = reinterpret_cast<float*>(to + Layout::kDminAt);
    for (int64_t i = 0; i < kTileRows; ++i) {
      int16_t sub_scales[16] = {}, mins[8] = {};
      d[i] = dmin[i] = 0;
      if (i < count) {
        const uint8_t* block = weight_rows + (first + i) * row_bytes + b * kBlockBytes;
        unpack_values_avx2<kSixBit, kFiveBit>(block, values[i]);
        if (kSixBit) {
          for (int j = 0; j < 16; ++j) sub_scales[j] = static_cast<int8_t>(block[192 + j]);
          d[i] = half_f16c(block + 208);
        } else {
          k4_scales_mins(block + 4, sub_scales, mins);
          d[i] = half_f16c(block), dmin[i] = half_f16c(block + 2);
        }
      } else {
        std::memset(values[i], 0, kSuper);
      }
      for (int j = 0; j < Layout::kSubs; ++j) scales[j * kTileRows + i] = static_cast<float>(sub_scales[j]);
      for (int k = 0; k < Layout::kPairs; ++k) {
        pairs[(k * kTileRows + i) * 2] = mins[2 * k];
        pairs[(k * kTileRows + i) * 2 + 1] = mins[2 * k + 1];
      }
    }
    interleave_values(values, to, Layout::kChunkBytes);
    interleave_values(values + 8, to + 32, Layout::kChunkBytes);
  }
}

// One unpacked group against kRows input rows (row r's values at x + r * x_stride, its scales at xd
// + r * supers, its sums at input_sums + r * supers * kSumsPerSuper: Q4_K / Q5_K the int16 pairs of
// sums of 32, Q6_K the sums of 16) -> out[r * 16 + row]. Each sub-block's chunks go to two
// independent sums per input row (a chain of dependent vpdpbusd would bound the kernel by their
// latency).
template <bool kSixBit>
constexpr int64_t kSumsPerSuper = kSixBit ? 16 : 4;
template <bool kSixBit, int kRows>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))) void group_times_rows_vnni(
    const uint8_t* group, int64_t supers, const int8_t* x, int64_t x_stride, const float* xd, const int32_t* input_sums, float* out) {
  using Layout = GroupLayout<kSixBit>;
  constexpr int kChunks = 64 / Layout::kSubs;  // chunks a sub-block
  __m512 acc[kRows], corrections[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = corrections[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < supers; ++b) {
    const uint8_t* unpacked = group + b * Layout::kBytes;
    const int8_t* inputs = x + b * kSuper;
    __m512 totals[kRows];  // the super-block's sum of scale * (integer sum) a sub-block
    for (int r = 0; r < kRows; ++r) totals[r] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < Layout::kSubs; ++j) {
      __m512i even[kRows], odd[kRows];
      for (int r = 0; r < kRows; ++r) even[r] = odd[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = j * kChunks; c < (j + 1) * kChunks; c += 2) {
        const __m512i w0 = _mm512_loadu_si512(unpacked + c * Layout::kChunkBytes);
        const __m512i w1 = _mm512_loadu_si512(unpacked + (c + 1) * Layout::kChunkBytes);
        for (int r = 0; r < kRows; ++r) {
          int32_t x0, x1;
          std::memcpy(&x0, inputs + r * x_stride + 4 * c, 4);
          std::memcpy(&x1, inputs + r * x_stride + 4 * c + 4, 4);
          even[r] = _mm512_dpbusd_epi32(even[r], w0, _mm512_set1_epi32(x0));
          odd[r] = _mm512_dpbusd_epi32(odd[r], w1, _mm512_set1_epi32(x1));
        }
      }
      const __m512 scale = _mm512_loadu_ps(unpacked + Layout::kScalesAt + j * 4 * kTileRows);
      for (int r = 0; r < kRows; ++r) {
        __m512i sum = _mm512_add_epi32(even[r], odd[r]);
        if (kSixBit)  // the values are q + 32: 32 times the input's sum of these 16 off
          sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(32 * input_sums[(r * supers + b) * 16 + j]));
        totals[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, totals[r]);
      }
    }
    const __m512 d = _mm512_loadu_ps(unpacked + Layout::kDAt);
    for (int r = 0; r < kRows; ++r) {
      const __m512 dx = _mm512_set1_ps(xd[r * supers + b]);
      if (!kSixBit) {  // dmin * min times the sub-block's input sum, off the row
        __m512i correction = _mm512_setzero_si512();
        for (int k = 0; k < Layout::kPairs; ++k) {
          const __m512i factors = _mm512_loadu_si512(unpacked + Layout::kPairsAt + k * 4 * kTileRows);
          const __m512i sums = _mm512_set1_epi32(input_sums[(r * supers + b) * 4 + k]);
          correction = _mm512_add_epi32(correction, _mm512_madd_epi16(factors, sums));
        }
        const __m512 dmin = _mm512_loadu_ps(unpacked + Layout::kDminAt);
        corrections[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(correction), _mm512_mul_ps(dmin, dx), corrections[r]);
      }
      acc[r] = _mm512_fmadd_ps(totals[r], _mm512_mul_ps(d, dx), acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(out + kTileRows * r, _mm512_sub_ps(acc[r], corrections[r]));
}

// Weight rows [row_begin, row_end) times every input row, a group of 16 rows unpacked at a time.
template <bool kSixBit, bool kFiveBit>
void rows_times_q8_k_vnni(const uint8_t* weight_rows, int64_t row_bytes, int64_t row_begin, int64_t row_end, const InputRowsQ8K& x,
                          const ProductOut& out) {
  using Layout = GroupLayout<kSixBit>;
  const int64_t supers = x.width / kSuper;
  const int32_t* input_sums = kSixBit ? x.sums16 : x.pairs32;
  group_buffer.resize(static_cast<size_t>(supers * Layout::kBytes));
  uint8_t* group = group_buffer.data();
  for (int64_t first = row_begin; first < row_end; first += kTileRows) {
    const int64_t count = std::min<int64_t>(kTileRows, row_end - first);
    unpack_group<kSixBit, kFiveBit>(weight_rows, row_bytes, first, count, supers, group);
    for (int64_t m = 0; m < x.rows;) {
      constexpr int kRows = 4;
      const int64_t rows = x.rows - m >= kRows ? kRows : 1;
      float sums[kRows * kTileRows];
      (rows == kRows ? group_times_rows_vnni<kSixBit, kRows> : group_times_rows_vnni<kSixBit, 1>)(
          group, supers, x.values + m * x.width, x.width, x.scales + m * supers, input_sums + m * supers * kSumsPerSuper<kSixBit>, sums);
      for (int64_t r = 0; r < rows; ++r) out.put_row(m + r, first, sums + r * kTileRows, count);
      m += rows;
    }
  }
}

// Weight rows [row_begin, row_end) times every input row: 4 input rows at a time, then one by one.
template <typename Dot4, typename Dot1>
void rows_by_four(int64_t row_begin, int64_t row_end, int64_t m_size, const ProductOut& out, Dot4 dot4, Dot1 dot1) {
  for (int64_t n = row_begin; n < row_end; ++n) {
    int64_t m = 0;
    for (float four[4]; m + 4 <= m_size; m += 4) {
      dot4(n, m, four);
      for (int r = 0; r < 4; ++r) out.put(m + r, n, four[r]);
    }
    for (float one; m < m_size; ++m) {
      dot1(n, m, &one);
      out.put(m, n, one);
    }
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
    k4_scales_mins(block + 4, unpacked.scales.data() + b * 16, unpacked.mins.data() + b * 8);
    unpack_q45_k_values(block, five_bit, u);
  }
}

thread_local std::vector<float> input_scales;
thread_local std::vector<int8_t> input_values;
thread_local std::vector<int32_t> input_sums;
thread_local std::vector<int32_t> input_pairs16;
thread_local std::vector<int32_t> input_pairs32;
thread_local std::vector<int8_t> input_values_paired;
thread_local std::vector<int8_t> input_values_lanes;

// Two sums (each within int16: at most 32 * 128) as one int32, the first in the low half.
int32_t int16_pair(int32_t first, int32_t second) {
  return static_cast<int32_t>((static_cast<uint32_t>(second) << 16) | (static_cast<uint32_t>(first) & 0xFFFF));
}

#ifdef COCONUT_X86
// One super-block of quantize_q8_k in AVX-512: the same q and d as the scalar loop (its first value
// of the largest magnitude; the products rounded by MXCSR's nearest-even, as nearbyint rounds them),
// and the sums of 16 from the int32 lanes before they are narrowed. NaN inputs are passed over in
// the magnitude as the scalar loop passes them; their own q may differ from its.
__attribute__((target("avx512f,avx512bw"))) void q8_k_block_avx512(const float* x, int8_t* q, float* scale, int32_t* sums16) {
  __m512 v[16];
  __m512 largest = _mm512_setzero_ps();
  for (int i = 0; i < 16; ++i) {
    v[i] = _mm512_loadu_ps(x + 16 * i);
    largest = _mm512_max_ps(_mm512_abs_ps(v[i]), largest);  // vmaxps keeps the second operand where the first is NaN
  }
  const float amax = _mm512_reduce_max_ps(largest);
  if (amax == 0) {
    *scale = 0;
    std::memset(q, 0, kSuper);
    std::memset(sums16, 0, 16 * sizeof(int32_t));
    return;
  }
  float max = 0;
  for (int i = 0; i < 16; ++i) {
    const __mmask16 at = _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (at != 0) {
      max = x[16 * i + __builtin_ctz(at)];
      break;
    }
  }
  const float iscale = -127.0f / max;
  const __m512 times = _mm512_set1_ps(iscale);
  for (int i = 0; i < 16; ++i) {
    const __m512i rounded = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(times, v[i])), _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * i), _mm512_cvtsepi32_epi8(rounded));
    sums16[i] = _mm512_reduce_add_epi32(rounded);
  }
  *scale = 1 / iscale;
}

// float32 -> bf16 bits, rounded to nearest even as c10::BFloat16 (a NaN as its quiet NaN 0x7FC0):
// 16 values at a time.
__attribute__((target("avx512f,avx512bw"))) void bf16_16_at_a_time(const float* values, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i + 16 <= count; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(values + i));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(bits), _mm512_castsi512_ps(bits), _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(rounded));
  }
}

// The same, 8 at a time in AVX2.
__attribute__((target("avx2"))) void bf16_8_at_a_time(const float* values, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_loadu_ps(values + i);
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    // [r0..r3 r0..r3 | r4..r7 r4..r7] as uint16 (every value fits), then r0..r7 in the low half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
}
#endif

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

InputRowsQ8K quantize_q8_k(const float* values, int64_t rows, int64_t width, bool vectors) {
  if (width % kSuper != 0) throw std::invalid_argument("k-quant products need rows of a multiple of 256 values");
  const int64_t supers = rows * width / kSuper;
  input_scales.resize(static_cast<size_t>(supers));
  input_values.resize(static_cast<size_t>(rows * width));
  input_sums.resize(static_cast<size_t>(supers * 16));
  input_pairs16.resize(static_cast<size_t>(supers * 8));
  input_pairs32.resize(static_cast<size_t>(supers * 4));
  const bool paired = rows < kTileInputRows;
  if (paired) {
    input_values_paired.resize(static_cast<size_t>(rows * width));
    input_values_lanes.resize(static_cast<size_t>(rows * width));
  }
  int8_t* paired_out = input_values_paired.data();
  int8_t* lanes_out = input_values_lanes.data();
#ifdef COCONUT_X86
  vectors = vectors && has_avx512bw();
#else
  vectors = false;
#endif
  // Super-blocks in parallel (a prompt's rows; a decode step's few stay on the calling thread).
  float* scales = input_scales.data();
  int8_t* values_out = input_values.data();
  int32_t *sums16 = input_sums.data(), *pairs16 = input_pairs16.data(), *pairs32 = input_pairs32.data();
  at::parallel_for(0, supers, 64, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* x = values + b * kSuper;
      int8_t* q = values_out + b * kSuper;
#ifdef COCONUT_X86
      if (vectors) {
        q8_k_block_avx512(x, q, scales + b, sums16 + b * 16);
      } else
#endif
      {
        float max = 0, amax = 0;
        for (int64_t j = 0; j < kSuper; ++j)
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            max = x[j];
          }
        if (amax == 0) {
          scales[b] = 0;
          std::memset(q, 0, kSuper);
        } else {
          const float iscale = -127.0f / max;
          for (int64_t j = 0; j < kSuper; ++j) q[j] = static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(iscale * x[j]))));
          scales[b] = 1 / iscale;
        }
        for (int j = 0; j < 16; ++j) {
          int32_t sum = 0;
          for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
          sums16[b * 16 + j] = sum;
        }
      }
      if (paired) {
        constexpr int kGroupOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        for (int k = 0; k < 8; ++k) std::memcpy(paired_out + b * kSuper + 32 * k, q + 32 * kGroupOrder[k], 32);
        for (int v = 0; v < 4; ++v)
          for (int j = 0; j < 4; ++j) std::memcpy(lanes_out + b * kSuper + 64 * v + 16 * j, q + 64 * j + 16 * v, 16);
      }
      const int32_t* sums = sums16 + b * 16;
      for (int k = 0; k < 8; ++k) pairs16[b * 8 + k] = int16_pair(sums[2 * k], sums[2 * k + 1]);
      for (int k = 0; k < 4; ++k)
        pairs32[b * 4 + k] = int16_pair(sums[4 * k] + sums[4 * k + 1], sums[4 * k + 2] + sums[4 * k + 3]);
    }
  });
  return {rows,         width, input_scales.data(), input_values.data(), input_sums.data(), input_pairs16.data(), input_pairs32.data(),
          paired ? input_values_paired.data() : nullptr, paired ? input_values_lanes.data() : nullptr};
}

int64_t task_rows(int kernel, int64_t input_rows) {
#ifdef COCONUT_X86
  return kernel == 0 && input_rows >= kTileInputRows ? kTileRows : 1;
#else
  (void)kernel, (void)input_rows;
  return 1;
#endif
}

void ProductOut::put_row(int64_t m, int64_t first, const float* values, int64_t count) const {
  const int64_t at = m * n_size + first;
  if (type == kFloat32) {
    std::memcpy(static_cast<float*>(data) + at, values, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  int64_t done = 0;
#ifdef COCONUT_X86
  if (type == kBFloat16) {
    uint16_t* row = static_cast<uint16_t*>(data) + at;
    if (count >= 16 && has_avx512bw()) {
      bf16_16_at_a_time(values, count, row);
      done = count / 16 * 16;
    } else if (count >= 8 && has_avx2_fma_f16c()) {
      bf16_8_at_a_time(values, count, row);
      done = count / 8 * 8;
    }
  }
#endif
  for (int64_t i = done; i < count; ++i) put(m, first + i, values[i]);
}

void rows_times_q8_k(const uint8_t* weight_rows, WeightFormat format, int64_t row_begin, int64_t row_end, const InputRowsQ8K& x,
                     int kernel, const ProductOut& out, bool far_prefetch) {
  (void)far_prefetch;  // read by the VNNI decode kernels only
  const int64_t supers = x.width / kSuper, row_bytes = supers * block_bytes(format);
  const bool sixteen = format == WeightFormat::kQ6_K;
#ifdef COCONUT_X86
  if (task_rows(kernel, x.rows) > 1) {
    if (format == WeightFormat::kQ6_K)
      rows_times_q8_k_vnni<true, false>(weight_rows, row_bytes, row_begin, row_end, x, out);
    else if (format == WeightFormat::kQ5_K)
      rows_times_q8_k_vnni<false, true>(weight_rows, row_bytes, row_begin, row_end, x, out);
    else
      rows_times_q8_k_vnni<false, false>(weight_rows, row_bytes, row_begin, row_end, x, out);
    return;
  }
  if (kernel == 0) {  // one to three input rows on a VNNI CPU, each weight row once for each
    const auto rows = [&](auto far) {
      constexpr bool kFar = decltype(far)::value;
      for (int64_t n = row_begin; n < row_end; ++n) {
        const uint8_t* row = weight_rows + n * row_bytes;
        for (int64_t m = 0; m < x.rows; ++m) {
          const int8_t *q = x.values + m * x.width, *paired = x.values_paired + m * x.width;
          const float* dx = x.scales + m * supers;
          out.put(m, n, format == WeightFormat::kQ6_K ? dot_q6_k_avx512<kFar>(row, q, dx, x.pairs16 + m * supers * 8, supers)
                        : format == WeightFormat::kQ5_K ? dot_q5_k_avx512<kFar>(row, paired, dx, x.pairs32 + m * supers * 4, supers)
                                                        : dot_q4_k_lanes_avx512<kFar>(row, x.values_lanes + m * x.width, dx,
                                                                                      x.pairs32 + m * supers * 4, supers));
        }
      }
    };
    if (far_prefetch)
      rows(std::true_type());
    else
      rows(std::false_type());
    return;
  }
  if (kernel != 2 && has_avx2_fma_f16c()) {
    const auto dot = [&](auto rows, int64_t n, int64_t m, float* results) {
      constexpr int kRows = decltype(rows)::value;
      const uint8_t* row = weight_rows + n * row_bytes;
      const int8_t* q = x.values + m * x.width;
      const float* dx = x.scales + m * supers;
      if (format == WeightFormat::kQ6_K)
        dot_q6_k_avx2<kRows>(row, q, x.width, dx, x.pairs16 + m * supers * 8, supers, supers, results);
      else if (format == WeightFormat::kQ5_K)
        dot_q45_k_avx2<true, kRows>(row, q, x.width, dx, x.pairs32 + m * supers * 4, supers, supers, results);
      else
        dot_q45_k_avx2<false, kRows>(row, q, x.width, dx, x.pairs32 + m * supers * 4, supers, supers, results);
    };
    rows_by_four(row_begin, row_end, x.rows, out,
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
      out.put(m, n, sum);
    }
  }
}

}  // namespace coconut::ggml_rows
