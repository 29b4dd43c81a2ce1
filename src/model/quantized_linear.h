// Projection weights kept quantized for inference, in ggml's block formats, per 32 weights of a row:
//  - Q8_0: a float16 scale d and 32 int8 values q, weight = d * q (34 bytes, ggml's block_q8_0);
//  - Q4_0: a float16 d and 32 4-bit values q, weight = d * (q - 8) (18 bytes, block_q4_0);
//  - Q4_1: a float16 d, a float16 m and 32 4-bit values q, weight = d * q + m (20 bytes, block_q4_1);
// so a GGUF tensor's bytes are such a weight as they are. A product quantizes its input rows to 8
// bits (d = max|x| / 127 per 32 values), sums the integer products of each block exactly in int32,
// then scales them by d_w * d_x in float32 (Q4_1 adds m_w * d_x * sum(q_x); Q4_0 is held as Q4_1
// with m = -8 d, exact in float16): the scheme of llama.cpp's Q8_0 / Q4_0 / Q4_1 paths.
// The blocks a GGUF file may hold beside these, run as the file holds them (no quantizer from float
// here: they come from a file, model/ggml_blocks.h):
//  - Q5_0: a float16 d, 32 high bits, 32 4-bit values; weight = d * (q - 16) (22 bytes per 32);
//  - Q4_K, Q5_K, Q6_K: super-blocks of 256 weights in sub-blocks with 6- or 8-bit scales (ggml's
//    block_q4_K, block_q5_K, block_q6_K: 144, 176 and 210 bytes).
// Their products quantize the input as llama.cpp does for them: Q5_0 to 8 bits per 32 values with a
// float16 scale (block_q8_0; the integer sum of (q - 16) q_x is exact, as llama.cpp's), the k-quants
// per 256 values (block_q8_K: d = -max / 127 for the value of largest magnitude, sums of each 16
// values), and sum the integer products exactly.
// Kernels: AVX-512 VNNI (256-bit, VL, BW), AVX2, and portable C++ for other CPUs (the k-quants'
// VNNI kernels: for prefill, tiles of 16 weight rows unpacked once for every input row; for decode,
// one weight row at a time in 512-bit vectors); non-CPU devices dequantize and use at::linear.
// Inference only (no gradients).
#pragma once

#include <torch/torch.h>

#include <string>

namespace coconut {

// kGguf is a choice for a whole model, not a block format: each projection on the blocks of the GGUF
// file the folder was imported from, in whatever format the file gives it (model/quantize_model.h).
enum class WeightFormat { kDense, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ4_K, kQ5_K, kQ6_K, kGguf };

// "dense" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q4_k" | "q5_k" | "q6_k" | "gguf"; throws
// std::invalid_argument naming the accepted values.
WeightFormat weight_format_from_name(const std::string& name);
std::string weight_format_name(WeightFormat format);
// Whether weights of `format` are held in ggml's own row layout (the k-quants) rather than
// the interleaved groups of 8 rows below; and the values per block of a block format (32 or 256).
bool held_as_ggml_rows(WeightFormat format);
int64_t block_values(WeightFormat format);

constexpr int64_t kQ8_0BlockValues = 32;  // values per block, every format
constexpr int64_t kQ8_0BlockBytes = 34;   // float16 d, then int8 q[32]
constexpr int64_t kQ4_0BlockBytes = 18;   // float16 d, then q[32] as nibbles: byte i holds value i (low) and i + 16 (high)
constexpr int64_t kQ4_1BlockBytes = 20;   // float16 d, float16 m, then the nibbles as Q4_0's
constexpr int64_t kQ5_0BlockBytes = 22;   // float16 d, uint32 qh (bit i: value i's fifth bit), then the nibbles as Q4_0's
// ggml's bytes per block of a quantized format (std::invalid_argument for kDense).
int64_t ggml_block_bytes(WeightFormat format);

// A linear weight [out_features, in_features] in blocks of `format`, held interleaved for the
// kernels as llama.cpp's repacked CPU buffers are, per group of 8 rows and block:
//  - Q8_0: `packed` [ceil(N/8), K/32, 272] uint8: the 8 rows' float16 scales (16 bytes), then for
//    each 4-value chunk c of the block the 8 rows' 4 values (32 bytes), each stored as q + 128 (an
//    unsigned byte, which VNNI's byte product takes);
//  - Q4_0 and Q4_1: [ceil(N/8), K/32, 160]: the 8 rows' float16 d (16 bytes), their float16 m (16
//    bytes; Q4_0: -8 d), then 4 vectors of 32 bytes, vector j holding each row's ggml bytes 4j..4j+3
//    (low nibbles: values 4j..4j+3 of the block; high nibbles: values 16 + 4j..16 + 4j + 3).
//  - Q5_0: [ceil(N/8), K/32, 176]: the 8 rows' float16 d (16 bytes), their 32 high bits qh (32
//    bytes, a uint32 per row), then the nibbles as Q4's (the file's 22 bytes a block per row).
//  - the k-quants: ggml's own layout, [N, K / block values * block bytes], each row its blocks in
//    order.
// The same bytes a block per row as ggml's layout, into which `ggml_blocks` turns it back bit for
// bit; rows past N in the last group are zeros. Undefined for a dense projection.
struct QuantizedWeight {
  torch::Tensor packed;
  int64_t in_features = 0, out_features = 0;
  WeightFormat format = WeightFormat::kQ8_0;
  bool defined() const { return packed.defined(); }
};

constexpr int64_t kQ8_0GroupRows = 8;  // rows per group, every format
constexpr int64_t kQ8_0GroupBlockBytes = kQ8_0GroupRows * kQ8_0BlockBytes;  // 272
constexpr int64_t kQ4GroupBlockBytes = kQ8_0GroupRows * kQ4_1BlockBytes;    // 160 (Q4_0 too)
constexpr int64_t kQ5_0GroupBlockBytes = kQ8_0GroupRows * kQ5_0BlockBytes;  // 176

// Rows of a float weight [N, K] (any float dtype; K a multiple of 32) quantized as ggml's reference
// quantizer does (quantize_row_q8_0_ref): d = max|w| / 127 in float32, q = roundf(w / d) computed
// as w * (1/d), d stored as float16. The blocks of a Q8_0 GGUF tensor come back bit for bit from
// its dequantized float32 values. Throws std::invalid_argument when K is not a multiple of 32.
QuantizedWeight quantize_q8_0(const torch::Tensor& weight);
// The same in Q8_0, Q4_0 or Q4_1 (Q5_0 and the k-quants come from files: std::invalid_argument), each
// as ggml's reference quantizer: Q8_0 as above; Q4_0
// (quantize_row_q4_0_ref) d = v / -8 for the v of largest magnitude, q = min(15, trunc(w / d +
// 8.5)); Q4_1 (quantize_row_q4_1_ref) d = (max - min) / 15, m = min, q = min(15, trunc((w - min) /
// d + 0.5)); d and m stored as float16.
QuantizedWeight quantize_weight(const torch::Tensor& weight, WeightFormat format);

// ggml's layout [N, K/32 * block bytes] (uint8, each row its blocks in order) to the held one and back.
QuantizedWeight from_ggml_blocks(const torch::Tensor& blocks, int64_t out_features, int64_t in_features,
                                 WeightFormat format = WeightFormat::kQ8_0);
torch::Tensor ggml_blocks(const QuantizedWeight& weight);

// Rows [first, first + count) of a weight, sharing its blocks: `first` a multiple of 8, and
// `count` too unless the rows run to the last (any rows of a weight held as ggml rows). Throws
// std::invalid_argument otherwise.
QuantizedWeight weight_rows(const QuantizedWeight& weight, int64_t first, int64_t count);

// The float32 weight [N, K] the blocks stand for (d * q, d * (q - 8), d * q + m, ...), as ggml dequantizes.
torch::Tensor dequantize(const QuantizedWeight& weight);
// Rows `ids` (int64, any shape, flattened) of that weight: [n, K] float32 on the CPU, the same
// values; blocks on the CPU only. Throws std::out_of_range for an id outside [0, N). (An embedding
// table kept in a file's blocks is looked up by it.)
torch::Tensor dequantize_rows(const QuantizedWeight& weight, const torch::Tensor& ids);

// x [..., K] times the weight transposed, plus bias [N] when defined -> [..., N] in x's dtype.
torch::Tensor quantized_dense(const torch::Tensor& x, const QuantizedWeight& weight, const torch::Tensor& bias = {});

// The same product on rows in memory (model/cpu_decode.h), blocks on the CPU: x [rows, K]
// -> out [rows, N], each row `out_stride` values after the last, without a bias; the same bits as
// quantized_dense of those rows.
void quantized_dense_rows(const float* x, int64_t rows, const QuantizedWeight& weight, float* out, int64_t out_stride);
// bfloat16 rows in and out (the products store their sums rounded, as quantized_dense's output).
void quantized_dense_rows(const c10::BFloat16* x, int64_t rows, const QuantizedWeight& weight, c10::BFloat16* out,
                          int64_t out_stride);

// Input rows [M, K] (float) quantized to blocks as the products do: {scales [M, K/32] float32,
// values [M, K] int8}, d = max|x| / 127 per block (kept in float32), q = x * (1/d) rounded to
// nearest, ties to even (as llama.cpp's vectorized quantize_row_q8_0). Exposed for tests, which
// rebuild the product from it.
std::pair<torch::Tensor, torch::Tensor> quantize_rows_q8_0(const torch::Tensor& rows);
// The same as the k-quant products quantize them (llama.cpp's quantize_row_q8_K_ref): per 256
// values d = -max / 127 for the value of largest magnitude (d = 0 for zeros), q = x * (-127 / max)
// rounded to nearest even, at most 127: {scales [M, K/256] float32, values [M, K] int8}.
std::pair<torch::Tensor, torch::Tensor> quantize_rows_q8_k(const torch::Tensor& rows);

// The dot-product kernels, for tests: "vnni", "avx2", "portable" (each for every format). Each is
// the one a product would use on a CPU that has it; `force_quantized_kernel` picks one for the
// whole process until reset ("" = by CPU features; "portable" also makes quantize_q8_0 use its
// scalar loop), throwing std::invalid_argument for one this CPU lacks.
std::vector<std::string> available_quantized_kernels();
void force_quantized_kernel(const std::string& name);

}  // namespace coconut
