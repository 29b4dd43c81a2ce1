// Decode's k-quant products alone: one input row times every row of a Q4_K, Q5_K, Q6_K (and Q8_0)
// weight far larger than the last-level cache, one thread and two, the weight on the 4 KiB pages
// the allocator gives it and then moved to 2 MiB pages (model/huge_pages.h), in GB/s of weight
// read; beside each, the rate at which the same memory is only read (a plain sum in integer lanes,
// bench::read_seconds), so that the kernel's share of the machine's read rate shows, measured in
// one run. A small --megabytes (under the caches) shows the kernels' own rate.
//
//   bench_kquant_rows [--megabytes 256] [--repeats 7] [--width 2048]
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <cstring>

#include "bench_support.h"
#include "model/huge_pages.h"
#include "model/quantized_linear.h"

namespace {

using coconut::WeightFormat;

// Random blocks whose float16 factors are small normal numbers (a factor's bits anywhere in the
// block would do for timing, but NaNs would make the sums meaningless to print).
torch::Tensor random_blocks(WeightFormat format, int64_t rows, int64_t width) {
  const int64_t block_bytes = coconut::ggml_block_bytes(format), blocks = width / coconut::block_values(format);
  auto bytes = torch::randint(0, 256, {rows, blocks, block_bytes}, torch::kUInt8);
  const auto factor = torch::full({rows, blocks, 2}, 0.01, torch::kHalf).view(torch::kUInt8);  // [rows, blocks, 4]
  if (format == WeightFormat::kQ6_K)
    bytes.narrow(2, 208, 2).copy_(factor.narrow(2, 0, 2));  // d at the end
  else
    bytes.narrow(2, 0, format == WeightFormat::kQ8_0 ? 2 : 4).copy_(factor.narrow(2, 0, format == WeightFormat::kQ8_0 ? 2 : 4));
  return bytes.reshape({rows, blocks * block_bytes});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_kquant_rows: decode's k-quant row products against the memory's read rate, on 4 KiB and 2 MiB pages"};
  double megabytes = 256;
  int repeats = 7;
  app.add_option("--megabytes", megabytes, "bytes of each weight (MB)");
  app.add_option("--repeats", repeats, "timed products (best of)");
  int64_t width = 2048;
  app.add_option("--width", width, "values a weight row (a multiple of 256)");
  CLI11_PARSE(app, argc, argv);
  torch::NoGradGuard no_grad;
  fmt::print("format kernel   threads pages     product_GB/s  read_GB/s  product/read\n");
  for (const WeightFormat format : {WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K, WeightFormat::kQ8_0}) {
    const int64_t row_bytes = width / coconut::block_values(format) * coconut::ggml_block_bytes(format);
    const int64_t rows = static_cast<int64_t>(megabytes * 1000000) / row_bytes / 16 * 16;
    const auto blocks = random_blocks(format, rows, width);
    const auto x = torch::randn({1, width});
    auto out = torch::empty({1, rows});
    for (const bool huge : {false, true}) {
      auto weight = coconut::from_ggml_blocks(blocks.clone(), rows, width, format);
      if (huge) coconut::move_to_huge_pages({weight.packed});
      const int64_t on_huge = coconut::huge_page_bytes_of_mapping(weight.packed.data_ptr());
      for (const int threads : {1, 2})
      for (const auto& kernel : coconut::available_quantized_kernels()) {
        if (kernel == "portable") continue;
        coconut::force_quantized_kernel(kernel);
        at::set_num_threads(threads);
        const double product = coconut::bench::best_seconds(repeats, [&] {
          coconut::quantized_dense_rows(x.data_ptr<float>(), 1, weight, out.data_ptr<float>(), rows);
        });
        const double read = coconut::bench::read_seconds(weight.packed.data_ptr(), weight.packed.numel(), repeats);
        const double gb = static_cast<double>(weight.packed.numel()) / 1e9;
        fmt::print("{:6} {:8} {:7} {:8} {:12.1f} {:10.1f} {:12.2f}\n", coconut::weight_format_name(format), kernel, threads,
                   huge ? fmt::format("2M({}%)", 100 * on_huge / weight.packed.numel()) : "4K", gb / product, gb / read, read / product);
      }
    }
  }
  coconut::force_quantized_kernel("");
  return 0;
}
