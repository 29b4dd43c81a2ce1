// Decode attention products with AVX-512 (chosen at run time); other machines use torch::matmul.
// Each output is computed on its own, in a fixed order, so a row's attention does not depend on
// the other rows of the batch.
#include "model/cpu_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "model/x86_intrinsics.h"

namespace coconut {

namespace {

#ifdef COCONUT_X86

// The four lane sums of a0..a3, as one vector [sum a0, sum a1, sum a2, sum a3]: a transposing
// tree of 11 instructions instead of four separate reductions.
__attribute__((target("avx512f"))) inline __m128 reduce_four(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Pairs interleaved: t01 holds a0, a1 partial sums in alternating lanes, t23 a2, a3.
  const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  // Each 128-bit lane now holds partial sums [a0, a1, a2, a3].
  const __m512 quads = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
                                     _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
  // Sum the four 128-bit lanes.
  const __m512 halves = _mm512_add_ps(quads, _mm512_shuffle_f32x4(quads, quads, 0x4E));  // lanes 0+2, 1+3
  const __m512 whole = _mm512_add_ps(halves, _mm512_shuffle_f32x4(halves, halves, 0xB1));  // (0+2)+(1+3)
  return _mm512_castps512_ps128(whole);
}

// out[q, s] = scale * dot(queries[q], keys[s]) for one (batch, KV head); keys four at a time.
__attribute__((target("avx512f"))) void scores_avx512(const float* queries, int64_t query_stride, int64_t query_rows,
                                                    const float* keys, int64_t key_stride, int64_t key_rows,
                                                    int64_t head_dim, float scale, float* out) {
  const int64_t vector_end = head_dim / 16 * 16;
  const __m128 scales = _mm_set1_ps(scale);
  for (int64_t q = 0; q < query_rows; ++q) {
    const float* query = queries + q * query_stride;
    float* row = out + q * key_rows;
    const auto tail = [&](const float* key) {
      float sum = 0;
      for (int64_t d = vector_end; d < head_dim; ++d) sum += query[d] * key[d];
      return sum;
    };
    int64_t s = 0;
    for (; s + 4 <= key_rows; s += 4) {
      const float* key = keys + s * key_stride;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      for (int64_t d = 0; d < vector_end; d += 16) {
        const __m512 part = _mm512_loadu_ps(query + d);
        a0 = _mm512_fmadd_ps(part, _mm512_loadu_ps(key + d), a0);
        a1 = _mm512_fmadd_ps(part, _mm512_loadu_ps(key + key_stride + d), a1);
        a2 = _mm512_fmadd_ps(part, _mm512_loadu_ps(key + 2 * key_stride + d), a2);
        a3 = _mm512_fmadd_ps(part, _mm512_loadu_ps(key + 3 * key_stride + d), a3);
      }
      __m128 sums = reduce_four(a0, a1, a2, a3);
      if (vector_end < head_dim)
        sums = _mm_add_ps(sums, _mm_setr_ps(tail(key), tail(key + key_stride), tail(key + 2 * key_stride), tail(key + 3 * key_stride)));
      _mm_storeu_ps(row + s, _mm_mul_ps(sums, scales));
    }
    for (; s < key_rows; ++s) {
      const float* key = keys + s * key_stride;
      __m512 a0 = _mm512_setzero_ps();
      for (int64_t d = 0; d < vector_end; d += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(query + d), _mm512_loadu_ps(key + d), a0);
      const __m512 zero = _mm512_setzero_ps();
      row[s] = (_mm_cvtss_f32(reduce_four(a0, zero, zero, zero)) + tail(key)) * scale;
    }
  }
}

// NV vectors of 16 head dimensions of out = sum over s of weights[s] * values[s], in one pass over
// the values: even and odd positions in separate accumulators (2 NV chains of multiply-adds in
// flight), added at the end.
template <int NV>
__attribute__((target("avx512f"))) void context_vectors(const float* weights, int64_t key_rows, const float* values,
                                                      int64_t value_stride, float* out) {
  __m512 even[NV], odd[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) even[v] = odd[v] = _mm512_setzero_ps();
  int64_t s = 0;
  for (; s + 2 <= key_rows; s += 2) {
    const float* value = values + s * value_stride;
    const __m512 w0 = _mm512_set1_ps(weights[s]), w1 = _mm512_set1_ps(weights[s + 1]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      even[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(value + 16 * v), even[v]);
      odd[v] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(value + value_stride + 16 * v), odd[v]);
    }
  }
  if (s < key_rows) {
    const __m512 w0 = _mm512_set1_ps(weights[s]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) even[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(values + s * value_stride + 16 * v), even[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_add_ps(even[v], odd[v]));
}

// out[q] = sum over s of probabilities[q, s] * values[s] for one (batch, KV head): up to 128 head
// dimensions per pass over the values, the rest (past a multiple of 16) in scalar code.
__attribute__((target("avx512f"))) void context_avx512(const float* probabilities, int64_t query_rows, int64_t key_rows,
                                                     const float* values, int64_t value_stride, int64_t head_dim,
                                                     float* out) {
  const int64_t vector_end = head_dim / 16 * 16;
  for (int64_t q = 0; q < query_rows; ++q) {
    const float* weights = probabilities + q * key_rows;
    float* row = out + q * head_dim;
    for (int64_t d = 0; d < vector_end; d += 128) {
      const float* value = values + d;
      switch (std::min<int64_t>(8, (vector_end - d) / 16)) {
        case 1: context_vectors<1>(weights, key_rows, value, value_stride, row + d); break;
        case 2: context_vectors<2>(weights, key_rows, value, value_stride, row + d); break;
        case 3: context_vectors<3>(weights, key_rows, value, value_stride, row + d); break;
        case 4: context_vectors<4>(weights, key_rows, value, value_stride, row + d); break;
        case 5: context_vectors<5>(weights, key_rows, value, value_stride, row + d); break;
        case 6: context_vectors<6>(weights, key_rows, value, value_stride, row + d); break;
        case 7: context_vectors<7>(weights, key_rows, value, value_stride, row + d); break;
        default: context_vectors<8>(weights, key_rows, value, value_stride, row + d); break;
      }
    }
    for (int64_t d = vector_end; d < head_dim; ++d) {
      float even = 0, odd = 0;
      int64_t s = 0;
      for (; s + 2 <= key_rows; s += 2) {
        even += weights[s] * values[s * value_stride + d];
        odd += weights[s + 1] * values[(s + 1) * value_stride + d];
      }
      if (s < key_rows) even += weights[s] * values[s * value_stride + d];
      row[d] = even + odd;
    }
  }
}
#endif

bool fits(const torch::Tensor& x) {
  return x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.stride(3) == 1 &&
         !(torch::GradMode::is_enabled() && x.requires_grad());
}

}  // namespace

bool uses_decode_attention(const torch::Tensor& queries, const torch::Tensor& keys) {
  return has_avx512f() && fits(queries) && fits(keys) && queries.size(2) <= kDecodeAttentionMaxRows &&
         queries.size(0) == keys.size(0) && queries.size(1) == keys.size(1) && queries.size(3) == keys.size(3);
}

namespace {

bool uses_decode_context(const torch::Tensor& probabilities, const torch::Tensor& values) {
  return has_avx512f() && fits(probabilities) && fits(values) && probabilities.size(2) <= kDecodeAttentionMaxRows &&
         probabilities.size(0) == values.size(0) && probabilities.size(1) == values.size(1) &&
         probabilities.size(3) == values.size(2);
}

// (batch, KV head) pairs per task: about 32K multiply-adds each, so tiny batches stay on one thread.
int64_t grain(int64_t rows, int64_t key_rows, int64_t head_dim) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, rows * key_rows * head_dim));
}

AttentionOperand operand(const torch::Tensor& x) { return {x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)}; }

}  // namespace

bool has_decode_attention_kernels() { return has_avx512f(); }

void attention_scores_into(AttentionOperand queries, AttentionOperand keys, int64_t batch, int64_t groups, int64_t rows,
                           int64_t key_rows, int64_t head_dim, double scale, float* out) {
#ifdef COCONUT_X86
  at::parallel_for(0, batch * groups, grain(rows, key_rows, head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / groups, g = index % groups;
      scores_avx512(queries.data + b * queries.batch_stride + g * queries.group_stride, queries.row_stride, rows,
                    keys.data + b * keys.batch_stride + g * keys.group_stride, keys.row_stride, key_rows, head_dim,
                    static_cast<float>(scale), out + index * rows * key_rows);
    }
  });
#endif
}

void attention_context_into(const float* probabilities, AttentionOperand values, int64_t batch, int64_t groups, int64_t rows,
                            int64_t key_rows, int64_t head_dim, float* out) {
#ifdef COCONUT_X86
  at::parallel_for(0, batch * groups, grain(rows, key_rows, head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / groups, g = index % groups;
      context_avx512(probabilities + index * rows * key_rows, rows, key_rows,
                     values.data + b * values.batch_stride + g * values.group_stride, values.row_stride, head_dim,
                     out + index * rows * head_dim);
    }
  });
#endif
}

torch::Tensor attention_scores(const torch::Tensor& queries, const torch::Tensor& keys, double scale) {
  if (!uses_decode_attention(queries, keys)) return torch::matmul(queries, keys.transpose(2, 3)) * scale;
  const int64_t batch = queries.size(0), groups = queries.size(1), rows = queries.size(2), head_dim = queries.size(3);
  const int64_t key_rows = keys.size(2);
  auto out = torch::empty({batch, groups, rows, key_rows}, queries.options());  // [B, G, Q, S]
  attention_scores_into(operand(queries), operand(keys), batch, groups, rows, key_rows, head_dim, scale, out.data_ptr<float>());
  return out;
}

torch::Tensor attention_context(const torch::Tensor& probabilities, const torch::Tensor& values) {
  if (!uses_decode_context(probabilities, values)) return torch::matmul(probabilities, values);
  const int64_t batch = values.size(0), groups = values.size(1), rows = probabilities.size(2), head_dim = values.size(3);
  const int64_t key_rows = values.size(2);
  auto weights = probabilities.contiguous();  // [B, G, Q, S]
  auto out = torch::empty({batch, groups, rows, head_dim}, values.options());  // [B, G, Q, Dh]
  attention_context_into(weights.data_ptr<float>(), operand(values), batch, groups, rows, key_rows, head_dim, out.data_ptr<float>());
  return out;
}

}  // namespace coconut
