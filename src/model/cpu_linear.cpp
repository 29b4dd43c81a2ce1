// Decode-time matrix-vector and few-row kernels. Weights stay in their stored dtype (bf16, f16 or
// f32) and are widened to f32 in registers; the input rows are widened once; accumulation is f32,
// as BLAS does. ISA paths are chosen at run time (AVX-512F, AVX2+FMA+F16C); the binary needs neither.
#include "model/cpu_linear.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "model/autocast.h"
#include "model/call_with_rows.h"
#include "model/cpu_product_choice.h"
#include "model/x86_intrinsics.h"

namespace coconut {

namespace {

enum class WeightType { kF32, kF16, kBF16 };

#ifdef COCONUT_X86

// Products past the last full vector, in scalar code.
template <WeightType kType>
inline float scalar_tail(const char* row, const float* x, int64_t begin, int64_t end) {
  float sum = 0;
  for (int64_t k = begin; k < end; ++k) {
    float w;
    if (kType == WeightType::kF32) {
      w = reinterpret_cast<const float*>(row)[k];
    } else if (kType == WeightType::kF16) {
      w = static_cast<float>(reinterpret_cast<const c10::Half*>(row)[k]);
    } else {
      w = static_cast<float>(reinterpret_cast<const c10::BFloat16*>(row)[k]);
    }
    sum += w * x[k];
  }
  return sum;
}

// ---- AVX-512: 16 lanes -----------------------------------------------------------------------
__attribute__((target("avx512f"))) inline __m512 load16_avx512(const void* base, int64_t index, WeightType type) {
  switch (type) {
    case WeightType::kF32: return _mm512_loadu_ps(static_cast<const float*>(base) + index);
    case WeightType::kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index)));
    case WeightType::kBF16: {
      __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + index)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
  }
  return _mm512_setzero_ps();
}

// Runs tile(MR, NR, m, row) over weight rows [row_begin, row_end) x input rows [0, m_size): tiles of
// 4 weight rows (then single rows) by kMaxRows input rows (then the 1..kMaxRows-1 left over). MR and
// NR come as std::integral_constant so that each tile shape is its own unrolled function.
template <int kMaxRows, typename Tile>
void for_each_tile(int64_t m_size, int64_t row_begin, int64_t row_end, const Tile& tile) {
  const auto along_inputs = [&](auto weight_rows, int64_t row) {
    int64_t m = 0;
    for (; m + kMaxRows <= m_size; m += kMaxRows) tile(std::integral_constant<int, kMaxRows>{}, weight_rows, m, row);
    call_with_rows<kMaxRows - 1>(m_size - m, [&](auto input_rows) { tile(input_rows, weight_rows, m, row); });
  };
  int64_t row = row_begin;
  for (; row + 4 <= row_end; row += 4) along_inputs(std::integral_constant<int, 4>{}, row);
  for (; row < row_end; ++row) along_inputs(std::integral_constant<int, 1>{}, row);
}

// The 16 horizontal sums of a[0..15] in one vector, lane 4j + t holding the sum of a[4t + j], each
// added in _mm512_reduce_add_ps's order (lanes i + 8, then i + 4, i + 2, i + 1 folded onto i), so
// the bits equal 16 separate reductions. 45 instructions instead of about 128: at K = 128 the
// reductions were a third of a tile's work.
__attribute__((target("avx512f"), always_inline)) inline __m512 sums_of_four_by_four(const __m512 a[16]) {
  __m512 halves[8];  // halves[p]: a[2p]'s 8 partial sums (i + 8 folded), then a[2p + 1]'s
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)
    halves[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44), _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
  __m512 quarters[4];  // quarters[q]: a[4q + b]'s 4 partial sums (i + 4 folded) in 128-bit block b
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q)
    quarters[q] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * q], halves[2 * q + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * q], halves[2 * q + 1], 0xDD));
  __m512 pairs[2];  // pairs[r], block b: a[8r + b]'s 2 partial sums (i + 2 folded), then a[8r + 4 + b]'s
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r)
    pairs[r] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * r], quarters[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(quarters[2 * r], quarters[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Block b: the sums of a[b], a[4 + b], a[8 + b], a[12 + b].
  return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Register tiles of MR input rows x NR weight rows: each weight vector loaded feeds MR products and
// each input vector NR, so a batch of rows costs little more than one in loads. Every output has
// one accumulator, filled in ascending k, then reduced in a fixed order, so an output does not
// depend on the tile it was computed in nor on the other rows of the batch (batch invariance: a
// row gets the same bits in any batch of 2 to 16 rows; a lone row takes vector_avx512).
template <WeightType kType, int MR, int NR>
__attribute__((target("avx512f"))) void tile_avx512(const char* w, size_t row_bytes, int64_t k_size, const float* x,
                                                   float* out, int64_t n_size) {
  const int64_t vector_end = k_size / 16 * 16;
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < vector_end; k += 16) {
    __m512 weights[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) weights[n] = load16_avx512(w + n * row_bytes, k, kType);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512 input = _mm512_loadu_ps(x + m * k_size + k);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fmadd_ps(weights[n], input, acc[m][n]);
    }
  }
  if constexpr (NR == 4) {
    // Up to 16 sums at once, bit for bit those of the loop below (see sums_of_four_by_four).
    __m512 sums[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) sums[i] = i % 4 < MR ? acc[i % 4 < MR ? i % 4 : 0][i / 4] : _mm512_setzero_ps();
    alignas(64) float tails[16] = {};
    if (vector_end < k_size)
      for (int m = 0; m < MR; ++m)
        for (int n = 0; n < NR; ++n) tails[4 * m + n] = scalar_tail<kType>(w + n * row_bytes, x + m * k_size, vector_end, k_size);
    // Lane 4m + n; through memory, since _mm512_extractf32x4_ps takes only a constant lane (clang
    // refuses the loop's m where it is not unrolled, as in the sanitizer build at -O1).
    alignas(64) float reduced[16];
    _mm512_store_ps(reduced, _mm512_add_ps(sums_of_four_by_four(sums), _mm512_load_ps(tails)));
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) _mm_storeu_ps(out + m * n_size, _mm_load_ps(reduced + 4 * m));
  } else {
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n)
        out[m * n_size + n] =
            _mm512_reduce_add_ps(acc[m][n]) + scalar_tail<kType>(w + n * row_bytes, x + m * k_size, vector_end, k_size);
  }
}

// One input row (decode of a single sequence), where the weights' bandwidth bounds: kRows weight rows
// a pass, each with two accumulators (even and odd 16-value steps) and one reduction, each row's
// lines requested 4 KiB before they are read; a row's sum is the same whichever rows share its pass.
// Against one row at a time with four accumulators and one line prefetched 8 rows ahead, float32:
// 10.9-11.2 -> 11.9-12.3 GB/s at K = 576, 10.5-11.7 -> 12.3-13.0 at 2,048 (one thread, 200 MB of
// weights, the 2-core Xeon of docs/real-models.md).
// kRequestAhead false: no lines requested ahead, for rows read one at a time in memory order, which
// the hardware prefetchers follow (on a Zen 4 EPYC the requests cost a fifth: 22 -> 16-17 GB/s).
template <WeightType kType, int kRows, bool kRequestAhead = true>
__attribute__((target("avx512f"))) inline void rows_vector_avx512(const char* w0, size_t row_bytes, int64_t k_size, const float* x,
                                                                 float* out) {
  constexpr int64_t kValueBytes = kType == WeightType::kF32 ? 4 : 2;
  const int64_t vector_end = k_size / 16 * 16;
  __m512 even[kRows], odd[kRows];
  for (int r = 0; r < kRows; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= vector_end; k += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    for (int r = 0; r < kRows; ++r) {
      const char* w = w0 + r * row_bytes;
      if constexpr (kRequestAhead)
        for (int line = 0; line < kValueBytes / 2; ++line) _mm_prefetch(w + k * kValueBytes + 4096 + 64 * line, _MM_HINT_T0);
      even[r] = _mm512_fmadd_ps(load16_avx512(w, k, kType), x0, even[r]);
      odd[r] = _mm512_fmadd_ps(load16_avx512(w, k + 16, kType), x1, odd[r]);
    }
  }
  if (k < vector_end)
    for (int r = 0; r < kRows; ++r) even[r] = _mm512_fmadd_ps(load16_avx512(w0 + r * row_bytes, k, kType), _mm512_loadu_ps(x + k), even[r]);
  for (int r = 0; r < kRows; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r])) + scalar_tail<kType>(w0 + r * row_bytes, x, vector_end, k_size);
}

// One input row over weight rows [row_begin, row_end): four rows a pass, or one row at a time in
// memory order (`in_order`, ProductKind::kOneRowOrder); either way each row's sum is the same.
template <WeightType kType>
__attribute__((target("avx512f"))) void vector_avx512(const char* weight, size_t row_bytes, int64_t k_size, const float* x,
                                                    int64_t row_begin, int64_t row_end, float* out, bool in_order) {
  int64_t row = row_begin;
  if (in_order) {
    for (; row < row_end; ++row)
      rows_vector_avx512<kType, 1, false>(weight + static_cast<size_t>(row) * row_bytes, row_bytes, k_size, x, out + row);
    return;
  }
  for (; row + 4 <= row_end; row += 4) rows_vector_avx512<kType, 4>(weight + static_cast<size_t>(row) * row_bytes, row_bytes, k_size, x, out + row);
  for (; row < row_end; ++row) rows_vector_avx512<kType, 1>(weight + static_cast<size_t>(row) * row_bytes, row_bytes, k_size, x, out + row);
}

// The measured order of the one-row kernels by value width (index 0: 4-byte values, 1: 2-byte):
// 0 not measured (four rows a pass), 1 four rows a pass, 2 memory order. Set by
// measure_one_row_order before a one-row product's parallel region, read by the kernels in it.
std::atomic<int> one_row_orders[2];
bool one_row_in_order(int64_t value_bytes) { return one_row_orders[value_bytes == 2 ? 1 : 0].load(std::memory_order_relaxed) == 2; }

template <WeightType kType>
void rows_avx512(const void* weight, int64_t k_size, const float* x, int64_t m_size, int64_t row_begin, int64_t row_end,
                 float* out, int64_t n_size) {
  constexpr int64_t kValueBytes = kType == WeightType::kF32 ? 4 : 2;
  const size_t row_bytes = static_cast<size_t>(k_size) * kValueBytes;
  if (m_size == 1)
    return vector_avx512<kType>(static_cast<const char*>(weight), row_bytes, k_size, x, row_begin, row_end, out,
                                one_row_in_order(kValueBytes));
  for_each_tile<4>(m_size, row_begin, row_end, [&](auto input_rows, auto weight_rows, int64_t m, int64_t row) {
    const char* w = static_cast<const char*>(weight) + static_cast<size_t>(row) * row_bytes;
    tile_avx512<kType, input_rows(), weight_rows()>(w, row_bytes, k_size, x + m * k_size, out + m * n_size + row, n_size);
  });
}

// ---- AVX-512 BF16: bf16 weights and bf16 inputs, 32 products per instruction -----------------
// Used when the input rows are themselves bf16 (a bf16 model), so no input value is rounded.
// vdpbf16ps multiplies bf16 pairs exactly and accumulates in f32.
__attribute__((target("avx512f,avx512bf16"))) inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Tiles as tile_avx512, 32 bf16 products per instruction; the same fixed order per output.
template <int MR, int NR>
__attribute__((target("avx512f,avx512bf16"))) void tile_avx512_bf16_dot(const uint16_t* w, int64_t k_size,
                                                                       const uint16_t* x, float* out, int64_t n_size) {
  const int64_t vector_end = k_size / 32 * 32;
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < vector_end; k += 32) {
    __m512i weights[NR];
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) weights[n] = _mm512_loadu_si512(w + n * k_size + k);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const __m512i input = _mm512_loadu_si512(x + m * k_size + k);
#pragma GCC unroll 8
      for (int n = 0; n < NR; ++n) acc[m][n] = dot(acc[m][n], weights[n], input);
    }
  }
  const auto widen = [](uint16_t bits) { return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits())); };
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      float tail = 0;
      for (int64_t k = vector_end; k < k_size; ++k) tail += widen(w[n * k_size + k]) * widen(x[m * k_size + k]);
      out[m * n_size + n] = _mm512_reduce_add_ps(acc[m][n]) + tail;
    }
}

// One input row: bf16 dot products on 32 values at a time, four weight rows at a time (each row two
// accumulators, even and odd 32-value steps, one reduction), each row's lines requested 4 KiB before
// they are read; a row's sum is the same whichever rows share its pass. Against one row at a time
// with four accumulators and one line prefetched 8 rows ahead: 9.2 -> 13.1 GB/s at K = 576
// (SmolLM2's width), 10.7 -> 13.3 at 1,536, 10.4 -> 12.1 at 2,048 (one thread, 200 MB of weights,
// the 2-core Xeon of docs/real-models.md).
template <int kRows>
__attribute__((target("avx512f,avx512bf16"))) inline void rows_bf16_dot(const uint16_t* w0, int64_t k_size, const uint16_t* x,
                                                                       float* out) {
  const int64_t vector_end = k_size / 32 * 32;
  __m512 even[kRows], odd[kRows];
  for (int r = 0; r < kRows; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= vector_end; k += 64) {
    const __m512i x0 = _mm512_loadu_si512(x + k), x1 = _mm512_loadu_si512(x + k + 32);
    for (int r = 0; r < kRows; ++r) {
      const uint16_t* w = w0 + r * k_size + k;
      _mm_prefetch(reinterpret_cast<const char*>(w) + 4096, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w) + 4096 + 64, _MM_HINT_T0);
      even[r] = dot(even[r], _mm512_loadu_si512(w), x0);
      odd[r] = dot(odd[r], _mm512_loadu_si512(w + 32), x1);
    }
  }
  if (k < vector_end) {
    const __m512i x0 = _mm512_loadu_si512(x + k);
    for (int r = 0; r < kRows; ++r) even[r] = dot(even[r], _mm512_loadu_si512(w0 + r * k_size + k), x0);
  }
  const auto widen = [](uint16_t bits) { return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits())); };
  for (int r = 0; r < kRows; ++r) {
    float tail = 0;
    for (k = vector_end; k < k_size; ++k) tail += widen(w0[r * k_size + k]) * widen(x[k]);
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r])) + tail;
  }
}

// Four rows a pass only: a lone row read in memory order is widened to float32 instead (dense_rows).
__attribute__((target("avx512f,avx512bf16"))) void vector_avx512_bf16_dot(const uint16_t* weight, int64_t k_size,
                                                                         const uint16_t* x, int64_t row_begin,
                                                                         int64_t row_end, float* out) {
  int64_t row = row_begin;
  for (; row + 4 <= row_end; row += 4) rows_bf16_dot<4>(weight + row * k_size, k_size, x, out + row);
  for (; row < row_end; ++row) rows_bf16_dot<1>(weight + row * k_size, k_size, x, out + row);
}

void rows_avx512_bf16_dot(const void* weight, int64_t k_size, const uint16_t* x, int64_t m_size, int64_t row_begin,
                          int64_t row_end, float* out, int64_t n_size) {
  if (m_size == 1) return vector_avx512_bf16_dot(static_cast<const uint16_t*>(weight), k_size, x, row_begin, row_end, out);
  for_each_tile<4>(m_size, row_begin, row_end, [&](auto input_rows, auto weight_rows, int64_t m, int64_t row) {
    tile_avx512_bf16_dot<input_rows(), weight_rows()>(static_cast<const uint16_t*>(weight) + row * k_size, k_size,
                                                      x + m * k_size, out + m * n_size + row, n_size);
  });
}

bool has_avx512_bf16() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return supported;
}

// ---- AVX2 + FMA + F16C: 8 lanes --------------------------------------------------------------
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8_avx2(const void* base, int64_t index, WeightType type) {
  switch (type) {
    case WeightType::kF32: return _mm256_loadu_ps(static_cast<const float*>(base) + index);
    case WeightType::kF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
    case WeightType::kBF16: {
      __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
  }
  return _mm256_setzero_ps();
}

__attribute__((target("avx2,fma"))) inline float reduce8(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// Tiles as tile_avx512 with 8 lanes (16 registers: at most 2 x 4 accumulators).
template <WeightType kType, int MR, int NR>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const char* w, size_t row_bytes, int64_t k_size, const float* x,
                                                       float* out, int64_t n_size) {
  const int64_t vector_end = k_size / 8 * 8;
  __m256 acc[MR][NR];
#pragma GCC unroll 2
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  for (int64_t k = 0; k < vector_end; k += 8) {
    __m256 weights[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) weights[n] = load8_avx2(w + n * row_bytes, k, kType);
#pragma GCC unroll 2
    for (int m = 0; m < MR; ++m) {
      const __m256 input = _mm256_loadu_ps(x + m * k_size + k);
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(weights[n], input, acc[m][n]);
    }
  }
#pragma GCC unroll 2
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n)
      out[m * n_size + n] = reduce8(acc[m][n]) + scalar_tail<kType>(w + n * row_bytes, x + m * k_size, vector_end, k_size);
}

template <WeightType kType>
void rows_avx2(const void* weight, int64_t k_size, const float* x, int64_t m_size, int64_t row_begin, int64_t row_end,
               float* out, int64_t n_size) {
  const size_t row_bytes = static_cast<size_t>(k_size) * (kType == WeightType::kF32 ? 4 : 2);
  for_each_tile<2>(m_size, row_begin, row_end, [&](auto input_rows, auto weight_rows, int64_t m, int64_t row) {
    const char* w = static_cast<const char*>(weight) + static_cast<size_t>(row) * row_bytes;
    tile_avx2<kType, input_rows(), weight_rows()>(w, row_bytes, k_size, x + m * k_size, out + m * n_size + row, n_size);
  });
}

using RowsFunction = void (*)(const void*, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t);

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

// dW = dy^T x for float32 training: out [N, K] += sum over m of dy[m, n] x[m, k]. Register tiles of
// NR output rows by KV vectors of 16 columns; each m loads KV vectors of x's row and broadcasts NR
// values of dy's, so nothing is transposed. Every output sums over m in ascending order, over rows
// [m_begin, m_end), starting from zero or (past the first rows) from what out holds.
template <int NR, int KV>
__attribute__((target("avx512f"))) void outer_tile_avx512(const float* dy, int64_t n_stride, const float* x, int64_t k_stride,
                                                         int64_t m_begin, int64_t m_end, float* out, int64_t out_stride) {
  __m512 acc[NR][KV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) acc[r][v] = m_begin == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out + r * out_stride + 16 * v);
  for (int64_t m = m_begin; m < m_end; ++m) {
    __m512 columns[KV];
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) columns[v] = _mm512_loadu_ps(x + m * k_stride + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 scale = _mm512_set1_ps(dy[m * n_stride + r]);
#pragma GCC unroll 4
      for (int v = 0; v < KV; ++v) acc[r][v] = _mm512_fmadd_ps(scale, columns[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < KV; ++v) _mm512_storeu_ps(out + r * out_stride + 16 * v, acc[r][v]);
}

// dW's rows [n_begin, n_end) x columns [k_begin, k_end): blocks of 64 columns (then 16), 4 rows
// (then 1); a block's columns of x stay in cache while the rows of dy stream past. Columns past the
// last 16 in scalar code, in the same order.
void weight_gradient_block(const float* dy, const float* x, int64_t m_size, int64_t n_size, int64_t k_size, int64_t n_begin,
                           int64_t n_end, int64_t k_begin, int64_t k_end, float* out) {
  // The rows in chunks of 256: a chunk's 64 columns of x (64 KB) stay in L2 while every tile of
  // the block passes over them; a tile goes on from the sums it stored, so the order is unchanged.
  // bench_train: the 1M CoT step 96-98 -> 89.5 ms, the 25M one 1,811 -> 1,607-1,615 ms.
  constexpr int64_t kRowChunk = 256;
  for (int64_t m_begin = 0; m_begin < m_size; m_begin += kRowChunk) {
    const int64_t m_end = std::min(m_size, m_begin + kRowChunk);
    const auto rows = [&](auto vectors, int64_t k) {
      int64_t n = n_begin;
      for (; n + 4 <= n_end; n += 4)
        outer_tile_avx512<4, decltype(vectors)::value>(dy + n, n_size, x + k, k_size, m_begin, m_end, out + n * k_size + k, k_size);
      for (; n < n_end; ++n)
        outer_tile_avx512<1, decltype(vectors)::value>(dy + n, n_size, x + k, k_size, m_begin, m_end, out + n * k_size + k, k_size);
    };
    int64_t k = k_begin;
    for (; k + 64 <= k_end; k += 64) rows(std::integral_constant<int, 4>{}, k);
    for (; k + 16 <= k_end; k += 16) rows(std::integral_constant<int, 1>{}, k);
  }
  for (int64_t k = k_begin + (k_end - k_begin) / 16 * 16; k < k_end; ++k)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float sum = 0;
      for (int64_t m = 0; m < m_size; ++m) sum += dy[m * n_size + n] * x[m * k_size + k];
      out[n * k_size + k] = sum;
    }
}

RowsFunction pick_kernel(WeightType type) {
  static const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  if (has_avx512f()) {
    switch (type) {
      case WeightType::kF32: return rows_avx512<WeightType::kF32>;
      case WeightType::kF16: return rows_avx512<WeightType::kF16>;
      case WeightType::kBF16: return rows_avx512<WeightType::kBF16>;
    }
  }
  if (has_avx2) {
    switch (type) {
      case WeightType::kF32: return rows_avx2<WeightType::kF32>;
      case WeightType::kF16: return rows_avx2<WeightType::kF16>;
      case WeightType::kBF16: return rows_avx2<WeightType::kBF16>;
    }
  }
  return nullptr;
}

#else
using RowsFunction = void (*)(const void*, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t);
RowsFunction pick_kernel(WeightType) { return nullptr; }
void weight_gradient_block(const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*) {}
bool has_avx512_bf16() { return false; }
#endif

bool weight_type_of(torch::ScalarType dtype, WeightType* type) {
  switch (dtype) {
    case torch::kFloat32: *type = WeightType::kF32; return true;
    case torch::kFloat16: *type = WeightType::kF16; return true;
    case torch::kBFloat16: *type = WeightType::kBF16; return true;
    default: return false;
  }
}

// Input row blocks of up to kDecodeKernelRowBlock rows, so that a block's inputs stay in cache
// while the weights stream past them. No block of one row when there are more: a lone row takes
// the matrix-vector path, whose summation order differs (17 rows -> 15 + 2).
template <typename Block>
void for_each_row_block(int64_t m_size, const Block& block) {
  for (int64_t m = 0; m < m_size;) {
    int64_t count = std::min(kDecodeKernelRowBlock, m_size - m);
    if (m_size - m - count == 1) --count;
    block(m, count);
    m += count;
  }
}

// Threads split the weight rows in ranges of ~64 KB per block of input rows: large enough to
// stream, small enough to balance threads (a prefill of many blocks splits even a small matrix).
int64_t weight_rows_grain(int64_t row_bytes, int64_t m_size) {
  const int64_t input_blocks = (m_size + kDecodeKernelRowBlock - 1) / kDecodeKernelRowBlock;
  return std::max<int64_t>(4, (64 * 1024 / std::max<int64_t>(row_bytes, 1)) / input_blocks / 4 * 4);
}

// Measures once (per host, thread count and value width, then cached: ProductKind::kOneRowOrder)
// the order in which the one-row kernels read the weights: on 1,024-wide rows filling twice the
// last-level cache (64 MiB to 1 GiB, every page written, so that they stream from memory), split
// over the threads as a product splits them. Called before a one-row product's parallel region.
void measure_one_row_order(int64_t value_bytes) {
#ifdef COCONUT_X86
  auto& order = one_row_orders[value_bytes == 2 ? 1 : 0];
  if (order.load(std::memory_order_relaxed) != 0) return;
  if (!has_avx512f()) {
    order.store(1, std::memory_order_relaxed);
    return;
  }
  constexpr int64_t k_size = 1024;
  const int64_t cache = std::max<int64_t>(sysconf(_SC_LEVEL3_CACHE_SIZE), 0);
  const int64_t bytes = std::clamp<int64_t>(2 * cache, int64_t{64} << 20, int64_t{1} << 30);
  const int64_t n_size = bytes / (k_size * value_bytes);
  const auto path = choose_product_path(ProductKind::kOneRowOrder, 1, k_size, n_size, [&](int64_t) -> ProductTrial {
    const auto weight = torch::full({n_size, k_size}, 0.5, torch::TensorOptions().dtype(value_bytes == 2 ? torch::kBFloat16 : torch::kFloat32));
    const auto x = torch::full({k_size}, 0.25, torch::TensorOptions().dtype(torch::kFloat32));
    const auto x_bf16 = x.to(torch::kBFloat16);
    const auto out = torch::empty({n_size}, torch::TensorOptions().dtype(torch::kFloat32));
    return [=](ProductPath path) {
      const bool in_order = path == ProductPath::kBlas;
      const size_t row_bytes = static_cast<size_t>(k_size * value_bytes);
      const char* w = static_cast<const char*>(weight.const_data_ptr());
      float* y = out.data_ptr<float>();
      at::parallel_for(0, n_size, weight_rows_grain(k_size * value_bytes, 1), [&](int64_t begin, int64_t end) {
        // As the products run: 2-byte values four rows a pass on bf16 dot products where the CPU
        // has them, in memory order widened to float32 (dense_rows).
        if (value_bytes == 4)
          vector_avx512<WeightType::kF32>(w, row_bytes, k_size, x.data_ptr<float>(), begin, end, y, in_order);
        else if (has_avx512_bf16() && !in_order)
          vector_avx512_bf16_dot(reinterpret_cast<const uint16_t*>(w), k_size,
                                 reinterpret_cast<const uint16_t*>(x_bf16.const_data_ptr()), begin, end, y);
        else
          vector_avx512<WeightType::kBF16>(w, row_bytes, k_size, x.data_ptr<float>(), begin, end, y, in_order);
      });
    };
  });
  order.store(path == ProductPath::kBlas ? 2 : 1, std::memory_order_relaxed);
#else
  (void)value_bytes;
#endif
}

}  // namespace

bool one_row_reads_in_memory_order(int64_t value_bytes) {
  measure_one_row_order(value_bytes);
#ifdef COCONUT_X86
  return one_row_in_order(value_bytes);
#else
  return false;
#endif
}

void forget_one_row_orders() {
#ifdef COCONUT_X86
  for (auto& order : one_row_orders) order.store(0, std::memory_order_relaxed);
#endif
}

namespace {

// What every hand-written inference product needs: x [..., K] and a contiguous weight [N, K] on the
// CPU, no gradient recorded through either.
bool inference_operands(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2 || !weight.is_contiguous()) return false;
  if (x.size(-1) != weight.size(1)) return false;
  return !(torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()));
}

}  // namespace

bool uses_bf16_prefill_choice(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!inference_operands(x, weight) || x.scalar_type() != torch::kBFloat16 || weight.scalar_type() != torch::kBFloat16) return false;
  if (autocast_enabled(x.device())) return false;
  return x.numel() / std::max<int64_t>(weight.size(1), 1) > kDecodeKernelRowBlock;
}

bool uses_decode_kernel(const torch::Tensor& x, const torch::Tensor& weight) {
  WeightType type;
  if (!inference_operands(x, weight) || !weight_type_of(weight.scalar_type(), &type) || !x.is_floating_point()) return false;
  // Past one block of rows, float32 only: bf16 rows take the choice of uses_bf16_prefill_choice, f16 ones oneDNN.
  // And weights of at most 64 MiB: each block of rows streams them once, so a matrix far past the
  // caches (an LM head of 128k words) is read from memory once per 16 rows, where BLAS blocks it;
  // bench_linear measured the tiles ahead up to 8,192 x 2,048 (64 MiB).
  const int64_t rows = x.numel() / std::max<int64_t>(weight.size(1), 1);
  if (rows > kDecodeKernelRowBlock &&
      (x.scalar_type() != torch::kFloat32 || type != WeightType::kF32 || weight.numel() * 4 > (int64_t{64} << 20)))
    return false;
  if (pick_kernel(type) == nullptr) return false;
  // Float32 weights: whichever of the tiles (for one row, the matrix-vector kernel) and BLAS
  // measured faster on this host. One row included: on an Intel Xeon MKL's matrix-vector product
  // read a 1 GB LM head at 23.9 GB/s against the kernel's 21.5 on two threads (bench_linear,
  // 2026-11-30; equal on one), where on AMD hosts the wheel's MKL takes generic kernels.
  return type != WeightType::kF32 ||
         float32_product_path(ProductKind::kForward, rows, weight.size(1), weight.size(0), weight) == ProductPath::kTiles;
}

namespace {

// rows [M, K] float32 times weight [N, K] (float32, f16 or bf16) transposed -> [M, N] float32, on
// the tiles (a lone row: the matrix-vector kernel). Both contiguous.
void tile_product(const float* x_data, int64_t m_size, const torch::Tensor& weight, float* out_data, int64_t out_stride) {
  WeightType type;
  weight_type_of(weight.scalar_type(), &type);
  const RowsFunction kernel = pick_kernel(type);
  const int64_t k_size = weight.size(1), n_size = weight.size(0);
  const void* weight_data = weight.const_data_ptr();
  const int64_t grain = weight_rows_grain(k_size * static_cast<int64_t>(weight.element_size()), m_size);
  if (m_size == 1) measure_one_row_order(weight.element_size());
  at::parallel_for(0, n_size, grain, [&](int64_t begin, int64_t end) {
    for_each_row_block(m_size, [&](int64_t m, int64_t count) {
      kernel(weight_data, k_size, x_data + m * k_size, count, begin, end, out_data + m * out_stride, out_stride);
    });
  });
}

torch::Tensor tile_product(const torch::Tensor& rows, const torch::Tensor& weight) {
  auto out = torch::empty({rows.size(0), weight.size(0)}, rows.options());  // [M, N]
  tile_product(rows.data_ptr<float>(), rows.size(0), weight, out.data_ptr<float>(), weight.size(0));
  return out;
}

// dW = dy^T x for float32 rows on the outer-product tiles: dy [M, N], x [M, K], both contiguous
// -> [N, K]. Needs AVX-512.
torch::Tensor weight_gradient_tiles(const torch::Tensor& gradient, const torch::Tensor& rows) {
  const int64_t m_size = rows.size(0), k_size = rows.size(1), n_size = gradient.size(1);
  auto weight_gradient = torch::empty({n_size, k_size}, rows.options());  // [N, K]
  const float* dy = gradient.data_ptr<float>();
  const float* x = rows.data_ptr<float>();
  float* out = weight_gradient.data_ptr<float>();
  // Tasks of 64 columns by a share of the rows: at least two per thread where dW is large enough
  // (a share keeps a multiple of 4 rows).
  const int64_t column_blocks = (k_size + 63) / 64;
  const int64_t row_shares = std::clamp<int64_t>((2 * at::get_num_threads() + column_blocks - 1) / column_blocks, 1,
                                                 std::max<int64_t>(1, n_size / 16));
  const int64_t share = ((n_size + row_shares - 1) / row_shares + 3) / 4 * 4;
  at::parallel_for(0, column_blocks * row_shares, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t k0 = (task % column_blocks) * 64, n0 = (task / column_blocks) * share;
      if (n0 < n_size)
        weight_gradient_block(dy, x, m_size, n_size, k_size, n0, std::min(n0 + share, n_size), k0, std::min(k0 + 64, k_size),
                              out);
    }
  });
  return weight_gradient;
}

}  // namespace

torch::Tensor float32_product(ProductKind kind, ProductPath path, const torch::Tensor& a, const torch::Tensor& b) {
  const bool tiles = path == ProductPath::kTiles && pick_kernel(WeightType::kF32) != nullptr;
  switch (kind) {
    case ProductKind::kForward: return tiles ? tile_product(a, b) : a.mm(b.t());  // [M, K] x [N, K]^T -> [M, N]
    // The tiles read W^T [K, N] made contiguous: a copy of the weights, part of what the path costs.
    case ProductKind::kInputGradient: return tiles ? tile_product(a, b.t().contiguous()) : a.mm(b);  // [M, N] x [N, K]
    case ProductKind::kWeightGradient:  // [M, N]^T x [M, K] -> [N, K]
      return tiles && has_avx512f() ? weight_gradient_tiles(a, b) : a.t().mm(b);
    case ProductKind::kBf16Forward: break;  // not a float32 product: widened_bf16_product
    case ProductKind::kOneRowOrder: break;  // an order of reading, not a product: measure_one_row_order
    case ProductKind::kKQuantPrefetch: break;  // a way of reading, not a product: quantized_linear.cpp
  }
  throw std::logic_error("float32_product: not a float32 product kind");
}

ProductPath float32_product_path(ProductKind kind, int64_t rows, int64_t k_size, int64_t n_size, const torch::Tensor& weight) {
  if (kind == ProductKind::kBf16Forward) throw std::invalid_argument("float32_product_path: kBf16Forward is bf16_product_path's");
  if (pick_kernel(WeightType::kF32) == nullptr) return ProductPath::kBlas;
  if (kind == ProductKind::kWeightGradient && !has_avx512f()) return ProductPath::kBlas;
  // A one-row trial runs the one-row kernels, whose order is measured first (not from inside this
  // measurement, which holds the choices' lock).
  if (product_row_class(rows) == 1) measure_one_row_order(4);
  return choose_product_path(kind, rows, k_size, n_size, [&](int64_t trial_rows) -> ProductTrial {
    // Random inputs from a generator of their own (the program's random stream stays as it was);
    // W itself where the product reads it and the caller has it, so nothing of its size is
    // allocated to measure.
    static const auto generator = at::make_generator<at::CPUGeneratorImpl>(20261127);
    const auto options = torch::TensorOptions().dtype(torch::kFloat32);
    const auto random = [&](int64_t first, int64_t columns) { return torch::randn({first, columns}, generator, options); };
    const torch::Tensor a = random(trial_rows, kind == ProductKind::kForward ? k_size : n_size);
    const torch::Tensor b = kind == ProductKind::kWeightGradient ? random(trial_rows, k_size)
                            : weight.defined()                   ? weight.detach().contiguous()
                                                                 : random(n_size, k_size);
    return [kind, a, b](ProductPath path) {
      torch::NoGradGuard no_grad;
      float32_product(kind, path, a, b);
    };
  });
}

namespace {

// dW = dy^T x for float32 rows: dy [M, N], x [M, K], both contiguous -> [N, K], on the path this
// host takes.
torch::Tensor float32_weight_gradient(const torch::Tensor& gradient, const torch::Tensor& rows) {
  const auto path = float32_product_path(ProductKind::kWeightGradient, rows.size(0), rows.size(1), gradient.size(1));
  return float32_product(ProductKind::kWeightGradient, path, gradient, rows);
}

// y = x W^T with gradients: each of the three products on the tiles or BLAS, whichever measured
// faster on this host for its size (model/cpu_product_choice.h). On a Zen 5 host (full-width
// AVX-512) the wheel's MKL runs float32 products at about 105 GFLOP/s a core where the tiles reach
// 180-200 (bench_linear); a float32 training step of the 25M bench model takes about 1,850 ms
// instead of 2,370 with BLAS (bench_train), its Coconut step with 6 thoughts 1,910-2,010 instead
// of 2,600 (2026-11-26, a Zen 5 host; 1,813-1,838 with deferred weight gradients). On a Zen 4
// host (AVX-512 as two 256-bit halves) both run about 100 GFLOP/s a core and the two paths
// measured equal within that host's noise (1M step, 2026-11-26).
class TileLinear : public torch::autograd::Function<TileLinear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x, const torch::Tensor& weight) {
    const int64_t k_size = weight.size(1);
    auto rows = x.reshape({-1, k_size}).contiguous();  // [M, K]
    context->save_for_backward({rows, weight});
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    const auto path = float32_product_path(ProductKind::kForward, rows.size(0), k_size, weight.size(0), weight);
    return float32_product(ProductKind::kForward, path, rows, weight.contiguous()).view(sizes);  // [..., N]
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    const auto& rows = saved[0];    // [M, K]
    const auto& weight = saved[1];  // [N, K]
    const int64_t k_size = weight.size(1), n_size = weight.size(0);
    const auto gradient = outputs[0].reshape({-1, n_size}).contiguous();  // [M, N]
    torch::Tensor input_gradient, weight_gradient;
    if (context->needs_input_grad(0)) {
      const auto path = float32_product_path(ProductKind::kInputGradient, gradient.size(0), k_size, n_size, weight);
      input_gradient = float32_product(ProductKind::kInputGradient, path, gradient, weight);  // [M, K]
      auto sizes = outputs[0].sizes().vec();
      sizes.back() = k_size;
      input_gradient = input_gradient.view(sizes);
    }
    // dW = dy^T x reduces over the rows: outer-product tiles (AVX-512) read both as they are.
    if (context->needs_input_grad(1)) weight_gradient = float32_weight_gradient(gradient, rows);
    return {input_gradient, weight_gradient};
  }
};

// The deferred products of one weight in one scope: what each backward kept for the weight
// gradient. Shared by the weight's gathering node and the products that read it.
struct KeptRows : torch::CustomClassHolder {
  std::mutex mutex;
  std::vector<torch::Tensor> rows;       // each [M_i, K], in the product's dtype
  std::vector<torch::Tensor> gradients;  // each [M_i, N]
};

c10::intrusive_ptr<KeptRows> kept_rows(const c10::IValue& value) {
  return c10::static_intrusive_pointer_cast<KeptRows>(value.toCapsule());
}

// W -> the same W (or its autocast copy), the one node through which every deferred product of a
// scope takes the weight. Backward runs it after all of them (each holds an edge to it), and it
// returns their weight gradient as one product over every row they kept.
class GatherWeightGradient : public torch::autograd::Function<GatherWeightGradient> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& weight, c10::IValue kept) {
    context->saved_data["kept"] = std::move(kept);
    context->set_materialize_grads(false);  // the products send no gradient here (undefined)
    return weight;                          // autograd returns it as a view with this node's history
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto kept = kept_rows(context->saved_data["kept"]);
    torch::Tensor rows, gradient;
    {
      std::lock_guard<std::mutex> lock(kept->mutex);
      if (!kept->rows.empty()) {
        rows = torch::cat(kept->rows, 0);           // [M, K], M = the rows of every product
        gradient = torch::cat(kept->gradients, 0);  // [M, N]
      }
      kept->rows.clear();
      kept->gradients.clear();
    }
    torch::Tensor weight_gradient = outputs[0];  // undefined unless something else read the alias
    if (rows.defined()) {
      const auto product = rows.scalar_type() == torch::kFloat32 && rows.device().is_cpu()
                               ? float32_weight_gradient(gradient, rows)
                               : gradient.t().mm(rows);  // [N, M] x [M, K] -> [N, K]
      weight_gradient = weight_gradient.defined() ? weight_gradient + product : product;
    }
    return {weight_gradient, torch::Tensor()};
  }
};

// y = x W^T whose backward returns dx = dy W at once and keeps (x, dy) for W's gathering node.
// `weight` is the gathering node's alias; x is cast to its dtype (what autocast does to a product).
class DeferredProduct : public torch::autograd::Function<DeferredProduct> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x, const torch::Tensor& weight,
                               c10::IValue kept) {
    const int64_t k_size = weight.size(1);
    auto rows = x.reshape({-1, k_size}).to(weight.scalar_type()).contiguous();  // [M, K]
    context->save_for_backward({rows, weight});
    context->saved_data["kept"] = std::move(kept);
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    const bool tiles = rows.device().is_cpu() && rows.scalar_type() == torch::kFloat32 && pick_kernel(WeightType::kF32) != nullptr &&
                       float32_product_path(ProductKind::kForward, rows.size(0), k_size, weight.size(0), weight) == ProductPath::kTiles;
    return (tiles ? tile_product(rows, weight.contiguous()) : rows.mm(weight.t())).view(sizes);  // [..., N]
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    const auto& rows = saved[0];    // [M, K]
    const auto& weight = saved[1];  // [N, K]
    const int64_t k_size = weight.size(1), n_size = weight.size(0);
    const auto gradient = outputs[0].reshape({-1, n_size}).to(weight.scalar_type()).contiguous();  // [M, N]
    {
      const auto kept = kept_rows(context->saved_data["kept"]);
      std::lock_guard<std::mutex> lock(kept->mutex);
      kept->rows.push_back(rows);
      kept->gradients.push_back(gradient);
    }
    auto sizes = outputs[0].sizes().vec();
    sizes.back() = k_size;
    return {gradient.mm(weight).view(sizes), torch::Tensor(), torch::Tensor()};  // [M, N] x [N, K] -> [..., K]
  }
};

thread_local DeferredWeightGradients* active_deferral = nullptr;

// Training and other autograd passes on the CPU in float32 without autocast take the tiles.
bool uses_training_tiles(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2) return false;
  if (x.scalar_type() != torch::kFloat32 || weight.scalar_type() != torch::kFloat32 || x.size(-1) != weight.size(1)) return false;
  if (!torch::GradMode::is_enabled() || !(x.requires_grad() || weight.requires_grad())) return false;
  if (autocast_enabled(x.device())) return false;  // autocast casts at::linear to bf16
  return pick_kernel(WeightType::kF32) != nullptr;
}

}  // namespace

DeferredWeightGradients::DeferredWeightGradients() : previous_(active_deferral) { active_deferral = this; }

DeferredWeightGradients::~DeferredWeightGradients() { active_deferral = previous_; }

torch::Tensor DeferredWeightGradients::product(const torch::Tensor& x, const torch::Tensor& weight) {
  auto found = gathered_.find(weight.unsafeGetTensorImpl());
  if (found == gathered_.end()) {
    // Under autocast the products take autocast's own cast of the weight (the one the other passes
    // of the step share), through the gathering node; its gradient then goes back through that cast.
    const auto device_type = weight.device().type();
    const bool cast = autocast_enabled(weight.device()) && weight.scalar_type() == torch::kFloat32;
    const auto source = cast ? at::autocast::cached_cast(at::autocast::get_autocast_dtype(device_type), weight, device_type) : weight;
    const auto kept = c10::IValue::make_capsule(c10::make_intrusive<KeptRows>());
    Gathered gathered{weight, GatherWeightGradient::apply(source, kept), kept};
    found = gathered_.emplace(weight.unsafeGetTensorImpl(), std::move(gathered)).first;
  }
  return DeferredProduct::apply(x, found->second.alias, found->second.kept);
}

torch::Tensor widened_bf16_product(const torch::Tensor& rows, const torch::Tensor& weight, ProductPath float32_path) {
  const auto widened_rows = rows.to(torch::kFloat32).contiguous();  // [M, K], exact
  if (float32_path == ProductPath::kTiles && pick_kernel(WeightType::kBF16) != nullptr)
    return tile_product(widened_rows, weight);  // the tiles widen bf16 weights in registers
  // BLAS reads float32 weights: widened a chunk of rows at a time (at most 8 MiB), so that an LM
  // head of 49k words x 576 is not copied whole (113 MB) for each call. (Panels of 64 rows widened
  // by each thread into a buffer of its own, one BLAS call a panel, ran 1.4x slower: BLAS packs
  // the rows again for every call.)
  const int64_t n_size = weight.size(0), k_size = weight.size(1);
  const int64_t chunk = std::max<int64_t>(64, (int64_t{8} << 20) / (4 * std::max<int64_t>(k_size, 1)));
  if (chunk >= n_size) return widened_rows.mm(weight.to(torch::kFloat32).t());  // [M, K] x [K, N]
  auto out = torch::empty({rows.size(0), n_size}, widened_rows.options());  // [M, N]
  for (int64_t n = 0; n < n_size; n += chunk) {
    const int64_t count = std::min(chunk, n_size - n);
    auto chunk_out = out.narrow(1, n, count);  // [M, count], row stride N
    at::mm_out(chunk_out, widened_rows, weight.narrow(0, n, count).to(torch::kFloat32).t());
  }
  return out;
}

ProductPath bf16_product_path(int64_t rows, int64_t k_size, int64_t n_size, const torch::Tensor& weight) {
  // The float32 forward of this size is chosen first: the widened trial runs on it, and a choice
  // cannot be measured inside another one's trial.
  const ProductPath float32_path = float32_product_path(ProductKind::kForward, rows, k_size, n_size);
  return choose_product_path(ProductKind::kBf16Forward, rows, k_size, n_size, [&](int64_t trial_rows) -> ProductTrial {
    static const auto generator = at::make_generator<at::CPUGeneratorImpl>(20261130);
    const auto options = torch::TensorOptions().dtype(torch::kBFloat16);
    const torch::Tensor a = torch::randn({trial_rows, k_size}, generator, options);
    const torch::Tensor b = weight.defined() ? weight.detach().contiguous() : torch::randn({n_size, k_size}, generator, options);
    return [a, b, float32_path](ProductPath path) {
      torch::NoGradGuard no_grad;
      if (path == ProductPath::kTiles)
        widened_bf16_product(a, b, float32_path).to(torch::kBFloat16);
      else
        at::linear(a, b);
    };
  });
}

bool uses_dense_rows(int64_t rows, const torch::Tensor& weight, torch::ScalarType input) {
  WeightType type;
  if (!weight.device().is_cpu() || weight.dim() != 2 || !weight.is_contiguous() || weight.scalar_type() != input ||
      !weight_type_of(weight.scalar_type(), &type) || pick_kernel(type) == nullptr || rows < 1 || rows > kDecodeKernelRowBlock)
    return false;
  if (input == torch::kBFloat16) return true;  // dense: every bf16 product of up to a block of rows
  return input == torch::kFloat32 &&
         float32_product_path(ProductKind::kForward, rows, weight.size(1), weight.size(0), weight) == ProductPath::kTiles;
}

void dense_rows(const float* x, int64_t rows, const torch::Tensor& weight, float* out, int64_t out_stride) {
  tile_product(x, rows, weight, out, out_stride);
}

void dense_rows(const c10::BFloat16* x, int64_t rows, const torch::Tensor& weight, float* out, int64_t out_stride) {
  const int64_t k_size = weight.size(1), n_size = weight.size(0);
#ifdef COCONUT_X86
  // As dense: the bf16 rows as they are, on bf16 dot products; but a lone row read in memory order
  // widened to float32 (on a Zen 4 EPYC, one thread, K = 576: 22 GB/s against 16 on dot products).
  if (has_avx512_bf16() && !(rows == 1 && one_row_reads_in_memory_order(2))) {
    const auto* x_data = reinterpret_cast<const uint16_t*>(x);
    const void* weight_data = weight.const_data_ptr();
    at::parallel_for(0, n_size, weight_rows_grain(k_size * 2, rows), [&](int64_t begin, int64_t end) {
      for_each_row_block(rows, [&](int64_t m, int64_t count) {
        rows_avx512_bf16_dot(weight_data, k_size, x_data + m * k_size, count, begin, end, out + m * out_stride, out_stride);
      });
    });
    return;
  }
#endif
  std::vector<float> widened(static_cast<size_t>(rows * k_size));  // as dense: the inputs widened once
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = static_cast<float>(x[i]);
  tile_product(widened.data(), rows, weight, out, out_stride);
}

torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (active_deferral != nullptr && torch::GradMode::is_enabled() && weight.requires_grad() && weight.dim() == 2 &&
      x.size(-1) == weight.size(1)) {
    auto out = active_deferral->product(x, weight);
    return bias.defined() ? out + bias.to(out.scalar_type()) : out;
  }
  if (uses_training_tiles(x, weight)) {
    auto out = TileLinear::apply(x, weight);
    return bias.defined() ? out + bias : out;
  }
  // at::linear, not torch::nn::functional::linear: the latter multiplies by weight.t(), a view,
  // which autocast's cast cache skips, so every call under autocast made a new bf16 copy of the
  // weights and autograd kept each one (a Coconut step's thought passes: one copy of the model
  // per thought). at::linear casts the weight itself, once per autocast scope.
  const int64_t k_size = weight.size(1), n_size = weight.size(0);
  const int64_t m_size = x.numel() / std::max<int64_t>(k_size, 1);
  torch::Tensor out;  // [M, N] f32
  if (uses_bf16_prefill_choice(x, weight)) {
    if (bf16_product_path(m_size, k_size, n_size, weight) == ProductPath::kBlas) return at::linear(x, weight, bias);
    out = widened_bf16_product(x.reshape({m_size, k_size}), weight,
                               float32_product_path(ProductKind::kForward, m_size, k_size, n_size));
  } else if (!uses_decode_kernel(x, weight)) {
    return at::linear(x, weight, bias);
  } else if (weight.scalar_type() == torch::kBFloat16 && x.scalar_type() == torch::kBFloat16 && has_avx512_bf16()) {
    auto rows = x.reshape({m_size, k_size}).contiguous();  // [M, K] bf16, used as is
    out = torch::empty({m_size, n_size}, x.options().dtype(torch::kFloat32));
    dense_rows(rows.const_data_ptr<c10::BFloat16>(), m_size, weight, out.data_ptr<float>(), n_size);
  } else {
    out = tile_product(x.reshape({m_size, k_size}).to(torch::kFloat32).contiguous(), weight);  // inputs widened once
  }
  if (bias.defined()) out += bias.to(torch::kFloat32);
  auto sizes = x.sizes().vec();
  sizes.back() = n_size;
  return out.to(x.scalar_type()).view(sizes);  // [..., N]
}

}  // namespace coconut
