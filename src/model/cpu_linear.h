// y = x W^T + b, the projection every layer uses. On CPU hand-written kernels:
// - one row (decode of a single sequence): a matrix-vector kernel that streams the weights at close
//   to memory bandwidth, which libtorch's BLAS path does not reach for bf16/f16 (about half of it on
//   this machine kind);
// - 2-16 rows (continuous batching): register tiles of 4 rows by 4 weight rows, which load each
//   weight once for all rows of a tile and beat BLAS there;
// - more rows of float32 (prefill, evaluation; weights up to 64 MiB): the same tiles over blocks of
//   16 input rows that stay in cache while the weights stream past, 1.1-2x BLAS's speed up to 1,024
//   rows on this machine (AMD EPYC, where the wheel's MKL takes its generic kernels; bench_linear);
// - float32 training without autocast (autograd): the tiles for the forward and the input
//   gradient, outer-product tiles for the weight gradient.
// Past one row, every float32 product takes the tiles or BLAS by what measured faster on the host
// at hand for its size (model/cpu_product_choice.h: MKL's own kernels win on Intel hosts).
// - bf16 prefill: float32 arithmetic (the rows widened once, the weights as the float32 forward
//   reads them) or libtorch's bf16 product (oneDNN), by what measured faster on the host at hand.
// Everything else (f16 prefill, autocast, GPUs) goes to at::linear.
#pragma once

#include <torch/torch.h>

#include <unordered_map>

#include "model/cpu_product_choice.h"

namespace coconut {

// x [..., K], weight [N, K], bias [N] or undefined -> [..., N] in x's dtype (as at::linear).
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// Whether `dense` would take the hand-written kernel for these arguments (for tests/benchmarks).
bool uses_decode_kernel(const torch::Tensor& x, const torch::Tensor& weight);

// dense's kernel on rows in memory (model/cpu_decode.h): x [rows, K] times weight [N, K] transposed
// -> out [rows, N] in float32, each row `out_stride` values after the last: the same values as
// `dense` of those rows without a bias before it rounds them to x's dtype. Takes a contiguous
// weight of the input's dtype (float32 or bfloat16) on the CPU and 1..kDecodeKernelRowBlock rows,
// float32 where this host's choice for the size is the hand-written kernel (uses_dense_rows;
// otherwise `dense` would call BLAS).
bool uses_dense_rows(int64_t rows, const torch::Tensor& weight, torch::ScalarType input = torch::kFloat32);
void dense_rows(const float* x, int64_t rows, const torch::Tensor& weight, float* out, int64_t out_stride);
void dense_rows(const c10::BFloat16* x, int64_t rows, const torch::Tensor& weight, float* out, int64_t out_stride);

// Whether the one-row kernels read weights of this value width (4: float32, 2: bf16 and f16) one
// row at a time in memory order rather than four rows a pass (ProductKind::kOneRowOrder: measured
// now if this process has not yet); float32 gets the same bits either way, a bf16 row in memory
// order is widened to float32 instead of taking bf16 dot products. `forget_one_row_orders` drops
// what this process holds, so that the next one-row product asks the choices again (tests).
bool one_row_reads_in_memory_order(int64_t value_bytes);
void forget_one_row_orders();

// bf16 rows past a block of rows times bf16 weights (prefill of a bf16 model): whether `dense`
// takes the measured choice between float32 arithmetic and libtorch's bf16 product
// (ProductKind::kBf16Forward), that choice for rows x k x n (measured once per size class and
// host; `weight`, where given, is what the trials read), and the float32 one: rows [M, K] bf16
// times weight [N, K] bf16 transposed -> [M, N] float32, exact products summed in float32, on the
// float32 forward's path given.
bool uses_bf16_prefill_choice(const torch::Tensor& x, const torch::Tensor& weight);
ProductPath bf16_product_path(int64_t rows, int64_t k, int64_t n, const torch::Tensor& weight = {});
torch::Tensor widened_bf16_product(const torch::Tensor& rows, const torch::Tensor& weight, ProductPath float32_path);

// One float32 product of a linear layer on the path given (the measured choice's trials,
// benchmarks, tests). Contiguous float32 operands on the CPU:
// kForward:        a = x [M, K],  b = W [N, K] -> y = x W^T [M, N];
// kInputGradient:  a = dy [M, N], b = W [N, K] -> dx = dy W [M, K] (the tiles copy W^T first);
// kWeightGradient: a = dy [M, N], b = x [M, K] -> dW = dy^T x [N, K] (tiles need AVX-512).
// Without the tile kernels on this CPU every path is BLAS.
torch::Tensor float32_product(ProductKind kind, ProductPath path, const torch::Tensor& a, const torch::Tensor& b);

// The path this host takes for that product with M = `rows` (model/cpu_product_choice.h), measured
// the first time its size class is seen; `weight` [N, K], where given, is what the trials read.
ProductPath float32_product_path(ProductKind kind, int64_t rows, int64_t k, int64_t n, const torch::Tensor& weight = {});

// Weight gradients of many small products taken as one product. Coconut's thought passes run
// every weight on one position per sequence, and each pass's backward would write a whole weight
// gradient (a rank-B update) and add it into .grad: at 25M parameters on this CPU about 25 ms a
// thought, on a GPU 1.8 GB at 1B plus two kernels per projection and pass.
// While a scope is open on this thread, every recorded `dense` with a weight that requires grad
// takes the weight through one gathering node per weight and scope; backward computes each
// product's input gradient at once and keeps its rows and output gradient, and the gathering
// node, which autograd runs after every product that read it, computes the weight gradient as one
// product over all of them. Gradients equal the plain path's up to float summation order. Under
// autocast the products run in its dtype, on autocast's cached cast of the weight.
class DeferredWeightGradients {
 public:
  DeferredWeightGradients();
  ~DeferredWeightGradients();
  DeferredWeightGradients(const DeferredWeightGradients&) = delete;
  DeferredWeightGradients& operator=(const DeferredWeightGradients&) = delete;
  // x [..., K] times weight [N, K] transposed -> [..., N], W's gradient deferred.
  torch::Tensor product(const torch::Tensor& x, const torch::Tensor& weight);

 private:
  struct Gathered {
    torch::Tensor weight;  // keeps the key alive
    torch::Tensor alias;   // the gathering node's output, which the products read
    c10::IValue kept;      // the rows and gradients the products keep for it
  };
  std::unordered_map<const c10::TensorImpl*, Gathered> gathered_;
  DeferredWeightGradients* previous_;
};

// Input rows (B*T) a tile pass covers at once; more rows are taken a block at a time.
constexpr int64_t kDecodeKernelRowBlock = 16;

}  // namespace coconut
