// Products of weights held in ggml's own row layout (model/quantized_linear.h: Q4_K, Q5_K, Q6_K),
// for quantized_linear.cpp. The input rows are quantized as llama.cpp quantizes them for these
// formats (block_q8_K), every block's integer sum is exact, and each super-block adds d_w * d_x * sum
// (less dmin_w * d_x * the sum of its mins times the input's sums) to the row's float32 sum: the
// portable kernel in order, the AVX2 one in 8 float lanes summed at the end of the row, the VNNI
// tiles of a prompt (16 weight rows unpacked once for every input row) in one lane a row, their
// sub-blocks scaled in float32 where every partial sum is an integer below 2^24 (they differ in the
// last bits of the float sums only).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "model/quantized_linear.h"

namespace coconut::ggml_rows {

// The ggml type id of a format held as ggml rows (model/ggml_blocks.h GgmlType) and its bytes per block.
uint32_t ggml_type(WeightFormat format);
int64_t block_bytes(WeightFormat format);

// Input rows quantized as block_q8_K: per 256 values d (float32), 256 int8 q and the sums of each 16 q;
// for the VNNI tiles and the AVX2 row kernels also those sums in int16 pairs (sums j and j + 1 in the low and high half of
// an int32), of each 16 and of each 32 values.
struct InputRowsQ8K {
  int64_t rows = 0, width = 0;
  const float* scales = nullptr;     // [rows, width / 256]
  const int8_t* values = nullptr;    // [rows, width]
  const int32_t* sums16 = nullptr;   // [rows, width / 16]
  const int32_t* pairs16 = nullptr;  // [rows, width / 32]: sums of 16 values, 2j and 2j + 1
  const int32_t* pairs32 = nullptr;  // [rows, width / 64]: sums of 32 values, 2j and 2j + 1
  // For fewer than 4 rows (decode): `values` with each super-block's groups of 32 in the order 0, 2,
  // 1, 3, 4, 6, 5, 7, the order in which a 64-byte load of Q5_K nibbles holds them (low nibbles:
  // groups 0 and 2, high: 1 and 3); null for more rows.
  const int8_t* values_paired = nullptr;  // [rows, width]
  // For fewer than 4 rows: `values` with vector v (0..3) of each super-block's four of 64 holding,
  // in its 128-bit lane j, values 64j + 16v .. 64j + 16v + 15: the order in which the two vectors of
  // Q4_K nibbles that hold each group's first and second 16 bytes in lane j (two 128-bit shuffles
  // of the block's 64-byte loads) hold their low and high nibbles; null for more rows.
  const int8_t* values_lanes = nullptr;  // [rows, width]
};
// `values` [rows, width] float32 (width a multiple of 256) into the calling thread's buffers.
// `vectors`: in AVX-512 where the CPU has it (the same values and sums), else the scalar loop.
InputRowsQ8K quantize_q8_k(const float* values, int64_t rows, int64_t width, bool vectors = true);

// The weight rows a task of a product of `input_rows` rows should take a multiple of: 16 where it
// takes the VNNI tiles (kernel 0, at least 4 input rows: weight rows 16 at a time, each group's
// blocks unpacked once for every input row), else 1 (fewer input rows take the row kernels).
int64_t task_rows(int kernel, int64_t input_rows);

// Where a product's results go: element [m, n] of a contiguous [M, n_size] float32, bfloat16 or
// float16 array, narrowed (to nearest even, as a torch cast) where the task that computed it stores
// it: no float32 copy of a bf16 product's output is written and read again.
struct ProductOut {
  enum Type { kFloat32, kBFloat16, kHalf };
  void* data = nullptr;
  int64_t n_size = 0;
  Type type = kFloat32;
  void put(int64_t m, int64_t n, float value) const {
    const int64_t at = m * n_size + n;
    if (type == kFloat32)
      static_cast<float*>(data)[at] = value;
    else if (type == kBFloat16)
      static_cast<c10::BFloat16*>(data)[at] = c10::BFloat16(value);
    else
      static_cast<c10::Half*>(data)[at] = c10::Half(value);
  }
  // values[0, count) into out[m, first + i]: float32 copied, bf16 rounded in vectors where the CPU
  // has AVX2 or AVX-512BW (the same bits as put), float16 one by one.
  void put_row(int64_t m, int64_t first, const float* values, int64_t count) const;
};

// out[m, n] = row n of `weight_rows` (ggml layout, n in [row_begin, row_end)) times input row m.
// `kernel`: 0 = AVX-512 VNNI, 1 = AVX2 (each on a CPU that has it), 2 = portable. With the tiles,
// rows go 16 at a time from row_begin (task_rows); VNNI with fewer input rows reads each weight row
// once for each input row, in 512-bit vectors, asking for the weights 16 KiB ahead to the
// second-level cache with `far_prefetch`, else 4 KiB ahead to the first (the same bits either way;
// ProductKind::kKQuantPrefetch measures which a host and thread count read faster).
void rows_times_q8_k(const uint8_t* weight_rows, WeightFormat format, int64_t row_begin, int64_t row_end, const InputRowsQ8K& x,
                     int kernel, const ProductOut& out, bool far_prefetch = false);

}  // namespace coconut::ggml_rows
