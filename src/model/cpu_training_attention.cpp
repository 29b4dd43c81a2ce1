#include "model/cpu_training_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "model/call_with_rows.h"
#include "model/x86_intrinsics.h"

// The Fortran BLAS entry libtorch_cpu exports (MKL's on x86 wheels; LP64 integers). Weak, so a
// libtorch without it leaves this kernel off rather than failing to link.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) __attribute__((weak));

namespace coconut {

namespace {

// Query rows per block: the scores of a block are computed up to the last column its rows see.
constexpr int64_t kBlockRows = 32;

// Row-major C [m, n] = alpha op(A) op(B) + beta C with op(A) [m, k] and op(B) [k, n]; A is stored
// [m, k] with row stride lda, or [k, m] when a_transposed; B likewise. Column-major BLAS computes
// C^T = op(B)^T op(A)^T, and a row-major matrix is its transpose in column-major order.
void gemm(bool a_transposed, bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char transa = b_transposed ? 'T' : 'N', transb = a_transposed ? 'T' : 'N';
  const int rows = static_cast<int>(n), columns = static_cast<int>(m), inner = static_cast<int>(k);
  const int first_ld = static_cast<int>(ldb), second_ld = static_cast<int>(lda), out_ld = static_cast<int>(ldc);
  sgemm_(&transa, &transb, &rows, &columns, &inner, &alpha, b, &first_ld, a, &second_ld, &beta, c, &out_ld);
}

#ifdef COCONUT_X86
// C [m, n] = alpha A B, or C + alpha A B where `accumulate`, for a tile of MR rows by NV vectors of
// 16 columns (the last vector masked by `last`): A's element (i, p) at a[i * a_row + p * a_inner]
// (A row-major, or transposed), B [k, n] row-major with row stride ldb. Each row of B is loaded
// once per tile and each element of A broadcast once; every output sums over p in ascending order
// in one accumulator.
template <int MR, int NV>
__attribute__((target("avx512f"))) void product_tile_avx512(int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_inner,
                                                           const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc,
                                                           __mmask16 last) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 row[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      row[v] = v + 1 < NV ? _mm512_loadu_ps(b + p * ldb + 16 * v) : _mm512_maskz_loadu_ps(last, b + p * ldb + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 element = _mm512_set1_ps(a[i * a_row + p * a_inner]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(element, row[v], acc[i][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 lanes = v + 1 < NV ? static_cast<__mmask16>(0xFFFF) : last;
      float* out = c + i * ldc + 16 * v;
      __m512 result = _mm512_mul_ps(acc[i][v], scale);
      if (accumulate) result = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out), result);
      _mm512_mask_storeu_ps(out, lanes, result);
    }
}

// The whole C [m, n] in tiles: columns in blocks of up to 64 (4 vectors, 6 rows a tile: 24
// accumulators) or, for a block of at most 32, 8 rows a tile.
void product_avx512(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_inner, const float* b,
                    int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; j += 64) {
    const int64_t width = std::min<int64_t>(64, n - j);
    const __mmask16 last = width % 16 == 0 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (width % 16)) - 1u);
    const auto columns = [&](auto vectors) {
      constexpr int kRows = vectors() <= 2 ? 8 : 6;
      const auto tile = [&](auto rows, int64_t i) {
        product_tile_avx512<rows(), vectors()>(k, alpha, a + i * a_row, a_row, a_inner, b + j, ldb, accumulate, c + i * ldc + j, ldc,
                                               last);
      };
      int64_t i = 0;
      for (; i + kRows <= m; i += kRows) tile(std::integral_constant<int, kRows>{}, i);
      call_with_rows<kRows - 1>(m - i, [&](auto rows) { tile(rows, i); });
    };
    call_with_rows<4>((width + 15) / 16, columns);
  }
}
#endif

// Row-major C [m, n] = alpha op(A) B, or C + alpha op(A) B where `accumulate`; op(A) [m, k] is A
// [m, k] (row stride lda) or, where a_transposed, A stored [k, m] transposed; B [k, n] with row
// stride ldb. The AVX-512 tiles above where the CPU has them (at these sizes, a block of 32 rows
// against a head of 32-128 dimensions, MKL's call, packing and threading checks cost as much as
// its products), else BLAS.
void product(bool a_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
             int64_t ldb, bool accumulate, float* c, int64_t ldc) {
#ifdef COCONUT_X86
  if (has_avx512f())
    return product_avx512(m, n, k, alpha, a, a_transposed ? 1 : lda, a_transposed ? lda : 1, b, ldb, accumulate, c, ldc);
#endif
  gemm(a_transposed, false, m, n, k, alpha, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

// K or V of one task as the products with B transposed read it: for the AVX-512 tiles, which read B
// row by row, a transposed copy [Dh, S] made once per task; for BLAS the rows [S, Dh] as they are.
struct RowsOrTransposed {
  const float* rows = nullptr;
  int64_t row_stride = 0, keys = 0;
  std::vector<float> transposed;  // [Dh, S], empty on the BLAS path

  void take(const float* data, int64_t stride, int64_t key_count, int64_t head_dim) {
    rows = data, row_stride = stride, keys = key_count;
    if (!has_avx512f()) return;
    transposed.resize(static_cast<size_t>(head_dim * key_count));
    for (int64_t s = 0; s < key_count; ++s)
      for (int64_t d = 0; d < head_dim; ++d) transposed[static_cast<size_t>(d * key_count + s)] = data[s * stride + d];
  }
};

// C [m, n] = alpha A B^T for A [m, k] (row stride lda) and B [n, k], the first n rows of `b`.
void product_b_transposed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const RowsOrTransposed& b,
                          float* c, int64_t ldc) {
  if (!b.transposed.empty()) return product(false, m, n, k, alpha, a, lda, b.transposed.data(), b.keys, false, c, ldc);
  gemm(false, true, m, n, k, alpha, a, lda, b.rows, b.row_stride, 0.0f, c, ldc);
}

// One row of n scores replaced by its softmax: max, exp(x - max) and its sum, then scaled (libtorch's
// SLEEF exp where the CPU has the vectors).
void softmax_row_portable(float* row, int64_t n) {
  const float top = *std::max_element(row, row + n);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (row[i] = std::exp(row[i] - top));
  const float inverse = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) row[i] *= inverse;
}

#ifdef COCONUT_X86
__attribute__((target("avx512f"))) void softmax_row_avx512(float* row, int64_t n) {
  const int64_t full = n / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - full)) - 1u);
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 tops = lowest;
  for (int64_t i = 0; i < full; i += 16) tops = _mm512_max_ps(tops, _mm512_loadu_ps(row + i));
  tops = _mm512_max_ps(tops, _mm512_mask_loadu_ps(lowest, tail, row + full));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(tops));
  __m512 sums = _mm512_setzero_ps();
  for (int64_t i = 0; i < full; i += 16) {
    const __m512 values = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_loadu_ps(row + i), top));
    _mm512_storeu_ps(row + i, values);
    sums = _mm512_add_ps(sums, values);
  }
  if (tail != 0) {
    const __m512 values = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_mask_loadu_ps(lowest, tail, row + full), top));
    _mm512_mask_storeu_ps(row + full, tail, values);
    sums = _mm512_add_ps(sums, _mm512_maskz_mov_ps(tail, values));
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sums));
  for (int64_t i = 0; i < full; i += 16) _mm512_storeu_ps(row + i, _mm512_mul_ps(_mm512_loadu_ps(row + i), inverse));
  if (tail != 0) _mm512_mask_storeu_ps(row + full, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + full), inverse));
}

__attribute__((target("avx2,fma"))) void softmax_row_avx2(float* row, int64_t n) {
  const int64_t full = n / 8 * 8;
  __m256 tops = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < full; i += 8) tops = _mm256_max_ps(tops, _mm256_loadu_ps(row + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, tops);
  float top = *std::max_element(lanes, lanes + 8);
  for (int64_t i = full; i < n; ++i) top = std::max(top, row[i]);
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sums = _mm256_setzero_ps();
  for (int64_t i = 0; i < full; i += 8) {
    const __m256 values = Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_loadu_ps(row + i), shift));
    _mm256_storeu_ps(row + i, values);
    sums = _mm256_add_ps(sums, values);
  }
  _mm256_store_ps(lanes, sums);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  for (int64_t i = full; i < n; ++i) sum += (row[i] = std::exp(row[i] - top));
  const float inverse = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) row[i] *= inverse;
}
#endif

// Shapes and strides of one call, in elements.
struct Layout {
  int64_t batch, heads, groups, per_group, rows, keys, head_dim;
  int64_t q_batch, q_head, q_row;  // q [B, H, T, Dh]
  int64_t k_batch, k_group, k_row;  // k [B, G, S, Dh]
  int64_t v_batch, v_group, v_row;
  int64_t mask_batch, mask_row;     // mask [B, 1, T, S] (0 strides where broadcast)
  float scale;
};

Layout layout_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
                 double scale) {
  Layout l{};
  l.batch = q.size(0), l.heads = q.size(1), l.rows = q.size(2), l.head_dim = q.size(3);
  l.groups = k.size(1), l.per_group = l.heads / l.groups, l.keys = k.size(2);
  l.q_batch = q.stride(0), l.q_head = q.stride(1), l.q_row = q.stride(2);
  l.k_batch = k.stride(0), l.k_group = k.stride(1), l.k_row = k.stride(2);
  l.v_batch = v.stride(0), l.v_group = v.stride(1), l.v_row = v.stride(2);
  if (mask.numel() > 0) l.mask_batch = mask.stride(0), l.mask_row = mask.stride(2);
  l.scale = static_cast<float>(scale);
  return l;
}

// Whether a mask value forbids its column (what the forward writes: the dtype's lowest, or -inf).
bool forbidden(float value) { return value <= -std::numeric_limits<float>::max() / 2; }

// Which columns each query row sees: `ends` [B * T] holds one past the last (a row whose mask forbids
// every column spreads its softmax over all S, as libtorch's kernels do, so it sees all S); and
// `prefix` [B] says whether every row of a batch row sees exactly the columns before its end (a
// causal mask, padding only at the end): there the mask need not be added, only the columns past
// each row's end set to -inf. Without a mask: causal (end t + 1) or every column.
struct VisibleColumns {
  torch::Tensor ends;    // int32 [B * T]
  torch::Tensor prefix;  // uint8 [B]
};

VisibleColumns visible_columns(const Layout& l, const float* mask, bool causal) {
  VisibleColumns visible{torch::full({l.batch * l.rows}, l.keys, torch::kInt32), torch::ones({l.batch}, torch::kUInt8)};
  int32_t* ends = visible.ends.data_ptr<int32_t>();
  uint8_t* prefix = visible.prefix.data_ptr<uint8_t>();
  for (int64_t b = 0; b < l.batch; ++b)
    for (int64_t t = 0; t < l.rows; ++t) {
      int64_t end = l.keys;
      if (mask != nullptr) {
        const float* row = mask + b * l.mask_batch + t * l.mask_row;
        while (end > 0 && forbidden(row[end - 1])) --end;
        if (end == 0) end = l.keys;
        if (prefix[b] != 0 && !std::all_of(row, row + end, [](float value) { return value == 0.0f; })) prefix[b] = 0;
      } else if (causal) {
        end = t + 1;
      }
      ends[b * l.rows + t] = static_cast<int32_t>(end);
    }
  return visible;
}

// The last column any row of [first, last) of batch row b sees.
int64_t block_end(const VisibleColumns& visible, const Layout& l, int64_t b, int64_t first, int64_t last) {
  const int32_t* ends = visible.ends.data_ptr<int32_t>() + b * l.rows;
  return *std::max_element(ends + first, ends + last);
}

// Each of `count` rows of `columns` scores replaced by its softmax. Backward recomputes the
// probabilities rather than keeping a log-sum-exp per row, which would lose them where a row's
// scores are all near float32's lowest (a row with every key masked).
void softmax_rows(float* scores, int64_t count, int64_t columns) {
  for (int64_t i = 0; i < count; ++i) {
#ifdef COCONUT_X86
    if (has_avx512f()) {
      softmax_row_avx512(scores + i * columns, columns);
      continue;
    }
    if (has_avx2_fma()) {
      softmax_row_avx2(scores + i * columns, columns);
      continue;
    }
#endif
    softmax_row_portable(scores + i * columns, columns);
  }
}

// probabilities [count, columns] = softmax(scale q k^T + mask) for the query rows
// [first, first + count) of batch row b: the mask added, or where it is a prefix (or absent) -inf
// past each row's end. Forward and backward both take a block's probabilities from here, so
// backward's are the forward's bit for bit.
void block_probabilities(const Layout& l, const VisibleColumns& visible, const float* q, const RowsOrTransposed& k,
                         const float* mask, int64_t b, int64_t first, int64_t count, int64_t columns, float* scores) {
  product_b_transposed(count, columns, l.head_dim, l.scale, q + first * l.q_row, l.q_row, k, scores, columns);
  if (mask == nullptr || visible.prefix.data_ptr<uint8_t>()[b] != 0) {
    const int32_t* ends = visible.ends.data_ptr<int32_t>() + b * l.rows + first;
    for (int64_t i = 0; i < count; ++i)
      std::fill(scores + i * columns + std::min<int64_t>(columns, ends[i]), scores + (i + 1) * columns,
                -std::numeric_limits<float>::infinity());
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const float* __restrict row = mask + b * l.mask_batch + (first + i) * l.mask_row;
      float* __restrict out = scores + i * columns;
      for (int64_t c = 0; c < columns; ++c) out[c] += row[c];
    }
  }
  softmax_rows(scores, count, columns);
}

// An uninitialised tensor shaped as x, laid out as x where x's rows are dense, else contiguous.
torch::Tensor gradient_like(const torch::Tensor& x) {
  return x.stride(3) == 1 && x.is_non_overlapping_and_dense() ? torch::empty_like(x) : torch::empty(x.sizes(), x.options());
}

class TrainingAttention : public torch::autograd::Function<TrainingAttention> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, bool causal, double scale) {
    const Layout l = layout_of(q, k, v, mask, scale);
    const float* mask_data = mask.numel() > 0 ? mask.data_ptr<float>() : nullptr;
    const auto visible = visible_columns(l, mask_data, mask_data == nullptr && causal);
    auto out = torch::empty({l.batch, l.rows, l.heads, l.head_dim}, q.options());  // [B, T, H, Dh]
    const float *q_data = q.data_ptr<float>(), *k_data = k.data_ptr<float>(), *v_data = v.data_ptr<float>();
    float* out_data = out.data_ptr<float>();
    const int64_t out_row = l.heads * l.head_dim;
    at::parallel_for(0, l.batch * l.groups, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(static_cast<size_t>(kBlockRows * l.keys));
      RowsOrTransposed keys;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / l.groups, g = task % l.groups;
        keys.take(k_data + b * l.k_batch + g * l.k_group, l.k_row, l.keys, l.head_dim);
        const float* values = v_data + b * l.v_batch + g * l.v_group;
        for (int64_t h = g * l.per_group; h < (g + 1) * l.per_group; ++h) {
          const float* queries = q_data + b * l.q_batch + h * l.q_head;
          for (int64_t first = 0; first < l.rows; first += kBlockRows) {
            const int64_t count = std::min(kBlockRows, l.rows - first);
            const int64_t columns = block_end(visible, l, b, first, first + count);
            block_probabilities(l, visible, queries, keys, mask_data, b, first, count, columns, scores.data());
            product(false, count, l.head_dim, columns, 1.0f, scores.data(), columns, values, l.v_row, false,
                    out_data + ((b * l.rows + first) * l.heads + h) * l.head_dim, out_row);
          }
        }
      }
    });
    context->save_for_backward({q, k, v, mask, out, visible.ends, visible.prefix});
    context->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &mask = saved[3], &out = saved[4];
    const VisibleColumns visible{saved[5], saved[6]};
    const Layout l = layout_of(q, k, v, mask, context->saved_data["scale"].toDouble());
    const float* mask_data = mask.numel() > 0 ? mask.data_ptr<float>() : nullptr;
    const auto gradient = outputs[0].contiguous();                                      // [B, T, H, Dh]
    auto dq = torch::empty({l.batch, l.rows, l.heads, l.head_dim}, q.options());          // [B, T, H, Dh]
    // dK and dV laid out as K and V are (transposed views of the projections in a training pass), so
    // autograd takes them back to the projections' shape without copying; zeroed task by task.
    auto dk = gradient_like(k), dv = gradient_like(v);  // [B, G, S, Dh]
    const float *q_data = q.data_ptr<float>(), *k_data = k.data_ptr<float>(), *v_data = v.data_ptr<float>();
    const float *out_data = out.data_ptr<float>(), *dout = gradient.data_ptr<float>();
    float *dq_data = dq.data_ptr<float>(), *dk_data = dk.data_ptr<float>(), *dv_data = dv.data_ptr<float>();
    const int64_t out_row = l.heads * l.head_dim;
    const int64_t dk_batch = dk.stride(0), dk_group = dk.stride(1), dk_row = dk.stride(2);
    const int64_t dv_batch = dv.stride(0), dv_group = dv.stride(1), dv_row = dv.stride(2);
    at::parallel_for(0, l.batch * l.groups, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> probabilities(static_cast<size_t>(kBlockRows * l.keys)), scores_gradient(probabilities.size());
      RowsOrTransposed keys_read_transposed, values_read_transposed;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / l.groups, g = task % l.groups;
        const float* keys = k_data + b * l.k_batch + g * l.k_group;
        const float* values = v_data + b * l.v_batch + g * l.v_group;
        keys_read_transposed.take(keys, l.k_row, l.keys, l.head_dim);
        values_read_transposed.take(values, l.v_row, l.keys, l.head_dim);
        float* key_gradient = dk_data + b * dk_batch + g * dk_group;
        float* value_gradient = dv_data + b * dv_batch + g * dv_group;
        for (int64_t s = 0; s < l.keys; ++s) {
          std::fill_n(key_gradient + s * dk_row, l.head_dim, 0.0f);
          std::fill_n(value_gradient + s * dv_row, l.head_dim, 0.0f);
        }
        for (int64_t h = g * l.per_group; h < (g + 1) * l.per_group; ++h) {
          const float* queries = q_data + b * l.q_batch + h * l.q_head;
          for (int64_t first = 0; first < l.rows; first += kBlockRows) {
            const int64_t count = std::min(kBlockRows, l.rows - first);
            const int64_t columns = block_end(visible, l, b, first, first + count);
            const int64_t offset = ((b * l.rows + first) * l.heads + h) * l.head_dim;  // row `first` of head h
            float* p = probabilities.data();
            float* ds = scores_gradient.data();
            block_probabilities(l, visible, queries, keys_read_transposed, mask_data, b, first, count, columns, p);
            // dV += P^T dO; dP = dO V^T
            product(true, columns, l.head_dim, count, 1.0f, p, columns, dout + offset, out_row, true, value_gradient, dv_row);
            product_b_transposed(count, columns, l.head_dim, 1.0f, dout + offset, out_row, values_read_transposed, ds, columns);
            // dS = P (dP - rowsum(dO o O))
            for (int64_t i = 0; i < count; ++i) {
              const float *o_row = out_data + offset + i * out_row, *do_row = dout + offset + i * out_row;
              float dot = 0;
              for (int64_t d = 0; d < l.head_dim; ++d) dot += o_row[d] * do_row[d];
              float* __restrict ds_row = ds + i * columns;
              const float* __restrict p_row = p + i * columns;
              for (int64_t c = 0; c < columns; ++c) ds_row[c] = p_row[c] * (ds_row[c] - dot);
            }
            // dQ = scale dS K; dK += scale dS^T Q
            product(false, count, l.head_dim, columns, l.scale, ds, columns, keys, l.k_row, false, dq_data + offset, out_row);
            product(true, columns, l.head_dim, count, l.scale, ds, columns, queries + first * l.q_row, l.q_row, true, key_gradient,
                    dk_row);
          }
        }
      }
    });
    return {dq.transpose(1, 2), dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};  // dq [B, H, T, Dh]
  }
};

bool unit_inner_stride(const torch::Tensor& x) { return x.size(-1) == 1 || x.stride(-1) == 1; }

}  // namespace

bool uses_cpu_training_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& mask) {
  if (sgemm_ == nullptr && !has_avx512f()) return false;
  for (const auto* x : {&q, &k, &v})
    if (!x->device().is_cpu() || x->scalar_type() != torch::kFloat32 || x->dim() != 4 || !unit_inner_stride(*x)) return false;
  if (k.sizes() != v.sizes() || q.size(0) != k.size(0) || q.size(3) != k.size(3) || k.size(1) == 0 || q.size(1) % k.size(1) != 0)
    return false;
  if (!mask.defined()) return true;
  if (!mask.device().is_cpu() || mask.scalar_type() != torch::kFloat32 || mask.dim() != 4 || mask.requires_grad()) return false;
  const std::vector<int64_t> full = {q.size(0), 1, q.size(2), k.size(2)};
  for (int64_t d = 0; d < 4; ++d)
    if (mask.size(d) != full[d] && mask.size(d) != 1) return false;
  return true;
}

torch::Tensor cpu_training_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& mask, bool causal, double scale) {
  TORCH_CHECK(uses_cpu_training_attention(q, k, v, mask), "cpu_training_attention: unsupported arguments");
  TORCH_CHECK(mask.defined() || !causal || q.size(2) == k.size(2), "cpu_training_attention: causal needs as many queries as keys");
  auto full_mask = torch::empty({0}, q.options());  // none (autograd's inputs must be defined)
  if (mask.defined()) {
    full_mask = mask.expand({q.size(0), 1, q.size(2), k.size(2)});  // [B, 1, T, S], 0 strides where broadcast
    if (full_mask.stride(3) != 1) full_mask = full_mask.contiguous();
  }
  return TrainingAttention::apply(q, k, v, full_mask, causal, scale);
}

}  // namespace coconut
