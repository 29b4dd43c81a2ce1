// Which path a float32 product takes on this host: the hand-written tiles (model/cpu_linear) or
// libtorch's BLAS (and, the same way, whether a bf16 prefill product runs in float32 arithmetic or
// on libtorch's bf16 product: kBf16Forward below). Neither wins everywhere. On AMD hosts the
// wheel's MKL takes generic kernels and the tiles ran 1.0-4.8x faster (bench_linear, Zen 5); on an
// Intel Xeon with AVX-512 MKL's own kernels ran about 1.4x faster than the tiles at 1,024 rows, and
// a float32 training step lost 0.72-0.78x against PyTorch eager. So the choice is measured on the
// host itself: the first product of a kind and size class times both paths on random inputs of
// that size (alternating, best of a few rounds, well under a second per class) and keeps the
// faster. Choices are cached per host (CPU model, libtorch version, kernel version) and thread
// count in a JSON file, so that later runs take the same paths without measuring, and give the
// same bits.
//
// A choice measured while other processes kept the CPU busy is not written to the cache: the 2-core
// Xeon's file held choices made beside a training run (MKL's 6.2 ms for a 512 x 576 x 1,536 product
// measured as 24.6 and lost to the tiles' 10.6), and SmolLM2's float32 prefill ran on the slower path
// in every later run (259 against 350-385 tokens/s). Before measuring, the other processes' share of
// the machine's CPU time is sampled from /proc/stat (50 ms, at most once a second); above the limit
// the choice holds for this process only, and a later quiet run measures and caches it.
//
// COCONUT_CPU_KERNELS: `measure` (default), `tiles` or `blas` (every float32 product on one path).
// COCONUT_CPU_BUSY_LIMIT: the share of the machine's CPU time (0 to 1, default 0.25) other processes
// may use while a choice is measured for it to be cached; 1 caches every choice.
// The cache: $COCONUT_CACHE_DIR/cpu_products.json, else $XDG_CACHE_HOME/coconut/, else
// ~/.cache/coconut/; without any of them choices are kept in memory only. Delete the file to
// measure again (after a BIOS or microcode change, say).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace coconut {

// The three float32 products of a linear layer: y = x W^T (inference and training forward),
// dx = dy W and dW = dy^T x. For all three, `rows` is the number of input rows (M), `k` the
// input width and `n` the output width: W is [n, k].
// kBf16Forward: y = x W^T with bf16 rows and weights past a block of rows (prefill of a bf16
// model), where the tiles path is the product in float32 arithmetic (rows widened once, weights
// widened as the float32 forward of that size reads them: in registers on the tiles, a chunk at a
// time for BLAS) and the BLAS path is libtorch's bf16 product (oneDNN). On the 2-core Xeon of
// docs/real-models.md, whose bf16 dot products run at about half its float32 FMA rate, oneDNN's
// bf16 product ran 138-149 GFLOP/s at SmolLM2's 512-row shapes and the widened float32 one 205-218.
// kOneRowOrder: how the matrix-vector kernels of one input row (decoding one sequence) walk the
// weights, measured once per host and value width on a buffer twice the last-level cache: the tiles
// path reads four weight rows a pass with each row's lines requested 4 KiB ahead, the BLAS path one
// row at a time in memory order. Float32 weights get the same bits either way; bf16 rows take bf16
// dot products four rows a pass where the CPU has them, and in memory order are widened to float32
// (within float32 rounding of each other). On the 2-core Xeon of docs/real-models.md four rows a pass
// read 13.1 GB/s against 9.2 at K = 576 (bf16, one thread); on a Zen 4 EPYC 11.6 against 16.3 (dot
// products) or 22 (widened), and 11.5 against 21-23 at K = 1,536: its prefetchers follow one
// stream, not four interleaved ones.
// kKQuantPrefetch: how far ahead and to which cache level the VNNI k-quant decode kernels (one to
// three input rows, ggml's Q4_K / Q5_K / Q6_K rows) ask for the weights, measured once per host and
// thread count on Q4_K rows twice the last-level cache on 2 MiB pages: the tiles path 4 KiB ahead to
// the first level, the BLAS path 16 KiB ahead to the second; the same bits either way. On the 2-core
// Zen 4 EPYC of docs/performance.md the second read Q4_K 24.9-26.3 GB/s at one thread against
// 20.0-20.4, and decoded the 1B-shaped Q4_K_M file about 9% slower at two (138 against 152 tokens/s).
enum class ProductKind { kForward, kInputGradient, kWeightGradient, kBf16Forward, kOneRowOrder, kKQuantPrefetch };
enum class ProductPath { kTiles, kBlas };
enum class ProductPolicy { kMeasure, kTiles, kBlas };

struct ProductChoiceSettings {
  ProductPolicy policy = ProductPolicy::kMeasure;
  std::string cache_file;  // empty: keep choices in memory only
  double busy_limit = 0.25;  // cache a choice only if other processes used at most this share of the CPU
  // The other processes' share of the machine's CPU time now (0 to 1); empty: others_cpu_share().
  std::function<double()> others_share;
};

// The share of the machine's CPU time (all CPUs, steal included) that other processes used over
// the next `milliseconds`, from /proc/stat less this process's own CPU time; 0 where /proc/stat
// cannot be read.
double others_cpu_share(int milliseconds = 50);

// COCONUT_CPU_KERNELS, COCONUT_CPU_BUSY_LIMIT and the cache folder variables above. A bad value
// throws, naming it.
ProductChoiceSettings product_choice_settings_from_environment();

// Replaces the settings and forgets every choice held in memory (the next product reads the cache
// file again). Programs need not call it: the first product reads the environment.
void configure_product_choices(const ProductChoiceSettings& settings);

// Runs the product of `kind` once on `path` for `rows` x k x n inputs prepared by the caller, and
// returns after it finished (the measurement times this call).
using ProductTrial = std::function<void(ProductPath path)>;

// The path for a float32 product of this kind and size at the current intra-op thread count.
// Rows are taken in classes (one row, the decode of one sequence; then powers of two from 2, 1,024
// and more as one): a class unseen on this host is measured with `trial` at the class's row count
// (`make_trial(rows)` builds the trial for that many rows) and written to the cache.
ProductPath choose_product_path(ProductKind kind, int64_t rows, int64_t k, int64_t n,
                                const std::function<ProductTrial(int64_t rows)>& make_trial);

// The rows a class is measured at: 1 for one row, else the next power of two from 2, at most 1,024.
int64_t product_row_class(int64_t rows);
// The key a choice is kept under at the current thread count, e.g. "forward 1024x512x2048 threads 2".
std::string product_choice_key(ProductKind kind, int64_t rows, int64_t k, int64_t n);

// What this process decided so far, for benchmarks and tests.
struct ProductChoice {
  std::string key;                     // e.g. "forward 1024x512x2048 threads 2"
  ProductPath path = ProductPath::kTiles;
  double tiles_seconds = 0, blas_seconds = 0;  // the best measured time of each (0: forced)
  bool from_cache = false;
  double others_share = 0;  // what other processes used of the CPU when it was measured
  bool cached = false;      // read from or written to the cache file (false: this process only)
};
std::vector<ProductChoice> product_choices();
// What the cache file holds for this host (`coconut cpu-kernels`), without measuring anything; and
// the file without this host's entries, so that the next run measures again. A file that cannot be
// read holds nothing.
std::vector<ProductChoice> cached_product_choices(const ProductChoiceSettings& settings);
void forget_cached_product_choices(const ProductChoiceSettings& settings);
std::string product_choice_host();  // the host key choices are cached under
const char* product_path_name(ProductPath path);
const char* product_policy_name(ProductPolicy policy);
const char* product_kind_name(ProductKind kind);

}  // namespace coconut
