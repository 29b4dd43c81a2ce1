// Products of weights held in ggml's own row layout (model/quantized_linear.h: Q4_K, Q5_K, Q6_K),
// for quantized_linear.cpp. The input rows are quantized as llama.cpp quantizes them for these
// formats (block_q8_K), every block's integer sum is exact, and each super-block adds d_w * d_x * sum (less
// dmin_w * d_x * the sum of its mins times the input's sums) to the row's float32 sum: the portable
// kernel in order, the AVX2 one in 8 float lanes summed at the end of the row (they differ in the
// last bits of the float sums only).
#pragma once

#include <cstdint>

#include "model/quantized_linear.h"

namespace coconut::ggml_rows {

// The ggml type id of a format held as ggml rows (model/ggml_blocks.h GgmlType) and its bytes per block.
uint32_t ggml_type(WeightFormat format);
int64_t block_bytes(WeightFormat format);

// Input rows quantized as block_q8_K: per 256 values d (float32), 256 int8 q and the sums of each 16 q.
struct InputRowsQ8K {
  int64_t rows = 0, width = 0;
  const float* scales = nullptr;    // [rows, width / 256]
  const int8_t* values = nullptr;   // [rows, width]
  const int32_t* sums16 = nullptr;  // [rows, width / 16]
};
// `values` [rows, width] float32 (width a multiple of 256) into the calling thread's buffers.
InputRowsQ8K quantize_q8_k(const float* values, int64_t rows, int64_t width);

// out[m * n_size + n] = row n of `weight_rows` (ggml layout, n in [row_begin, row_end)) times input
// row m. `kernel`: 1 = AVX2 (on a CPU that has it), 2 = portable.
void rows_times_q8_k(const uint8_t* weight_rows, WeightFormat format, int64_t row_begin, int64_t row_end, const InputRowsQ8K& x,
                     int kernel, float* out, int64_t n_size);

}  // namespace coconut::ggml_rows
