// The measured choice between the float32 tiles and BLAS (model/cpu_product_choice.h): measured
// once per size class, cached per host in a file that later processes read, followed by every
// product, and harmless to the program's random stream.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>

#include "model/autocast.h"
#include "model/cpu_linear.h"
#include "model/cpu_product_choice.h"
#include "support/temp_dir.h"

namespace coconut {
namespace {

// Each test sets its own choices; afterwards the suite's (COCONUT_CPU_KERNELS=tiles) come back.
class CpuProductChoice : public ::testing::Test {
 protected:
  void TearDown() override { configure_product_choices(product_choice_settings_from_environment()); }
  // Every choice cached, however busy the machine (ctest -j runs other tests beside this one).
  void measure_into(const std::string& file) { configure_product_choices({ProductPolicy::kMeasure, file, 1.0}); }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string key_of(const char* kind, int64_t row_class, int64_t k, int64_t n) {
  return std::string(kind) + " " + std::to_string(row_class) + "x" + std::to_string(k) + "x" + std::to_string(n) + " threads " +
         std::to_string(at::get_num_threads());
}

TEST_F(CpuProductChoice, RowClassesAreOneRowThenPowersOfTwoUpTo1024) {
  EXPECT_EQ(product_row_class(1), 1);  // decode of one sequence: a class of its own
  EXPECT_EQ(product_row_class(2), 2);
  EXPECT_EQ(product_row_class(3), 4);
  EXPECT_EQ(product_row_class(17), 32);
  EXPECT_EQ(product_row_class(1024), 1024);
  EXPECT_EQ(product_row_class(5000), 1024);
}

TEST_F(CpuProductChoice, MeasuresAClassOnceAndTheNextProcessReadsItFromTheCache) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  testing::TempDir folder;
  const auto file = folder.file("cache/cpu_products.json");  // the folder is made
  measure_into(file);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({40, 64}), w = torch::randn({96, 64});
  const auto first = dense(x, w);
  dense(torch::randn({33, 64}), w);  // the same class (64 rows): not measured again
  auto choices = product_choices();
  ASSERT_EQ(choices.size(), 1u);
  const auto key = key_of("forward", 64, 64, 96);
  EXPECT_EQ(choices[0].key, key);
  EXPECT_FALSE(choices[0].from_cache);
  EXPECT_GT(choices[0].tiles_seconds, 0);
  EXPECT_GT(choices[0].blas_seconds, 0);
  const bool blas_faster = choices[0].blas_seconds * 1.02 < choices[0].tiles_seconds;
  EXPECT_EQ(choices[0].path, blas_faster ? ProductPath::kBlas : ProductPath::kTiles);
  EXPECT_EQ(uses_decode_kernel(x, w), !blas_faster);

  const auto written = read_json(file);
  const auto& entry = written.at("hosts").at(product_choice_host()).at(key);
  EXPECT_EQ(entry.at("path"), product_path_name(choices[0].path));
  EXPECT_DOUBLE_EQ(entry.at("tiles_seconds").get<double>(), choices[0].tiles_seconds);

  measure_into(file);  // a new process, as far as the choices go
  const auto again = dense(x, w);
  choices = product_choices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_TRUE(choices[0].from_cache);
  EXPECT_TRUE(torch::equal(first, again));  // the same path: the same bits
}

TEST_F(CpuProductChoice, EveryProductFollowsTheCachedPath) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  const auto write_cache = [&](const char* path) {
    nlohmann::json entries;
    for (const char* kind : {"forward", "input_gradient", "weight_gradient"})
      entries[key_of(kind, 32, 64, 96)] = {{"path", path}, {"tiles_seconds", 1.0}, {"blas_seconds", 1.0}};
    entries[key_of("forward", 1, 64, 96)] = {{"path", path}, {"tiles_seconds", 1.0}, {"blas_seconds", 1.0}};  // one row
    write_text(file, nlohmann::json{{"version", 1}, {"hosts", {{product_choice_host(), entries}}}}.dump());
    measure_into(file);
  };
  const auto x = torch::randn({2, 10, 64}), w = torch::randn({96, 64});  // 20 rows: the 32-row class
  const auto grad_out = torch::randn({2, 10, 96});

  // BLAS: the same products at::linear and its gradients run, so the same bits.
  write_cache("blas");
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(uses_decode_kernel(x, w));
    EXPECT_TRUE(torch::equal(dense(x, w), at::linear(x, w)));
    const auto one_row = x.select(1, 0).select(0, 0).unsqueeze(0);  // one row: BLAS's matrix-vector product too
    EXPECT_FALSE(uses_decode_kernel(one_row, w));
    EXPECT_TRUE(torch::equal(dense(one_row, w), at::linear(one_row, w)));
  }
  const auto gradients = [&](bool ours) {
    auto xg = x.clone().requires_grad_(), wg = w.clone().requires_grad_();
    auto y = ours ? dense(xg, wg) : at::linear(xg, wg);
    y.backward(grad_out);
    return std::make_tuple(y.detach(), xg.grad(), wg.grad());
  };
  const auto [y_ours, dx_ours, dw_ours] = gradients(true);
  const auto [y_ref, dx_ref, dw_ref] = gradients(false);
  EXPECT_TRUE(torch::equal(y_ours, y_ref));
  EXPECT_TRUE(torch::equal(dx_ours, dx_ref));
  EXPECT_TRUE(torch::equal(dw_ours, dw_ref));
  for (const auto& choice : product_choices()) EXPECT_EQ(choice.path, ProductPath::kBlas) << choice.key;
  EXPECT_EQ(product_choices().size(), 4u);  // all four read from the file, none measured
  for (const auto& choice : product_choices()) EXPECT_TRUE(choice.from_cache) << choice.key;

  // Tiles: inference takes them, and the forward's rows each keep the bits they have in any batch.
  write_cache("tiles");
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(uses_decode_kernel(x, w));
  EXPECT_TRUE(uses_decode_kernel(x.select(1, 0).select(0, 0).unsqueeze(0), w));
  const auto rows = dense(x, w).reshape({20, 96});
  const auto pair = dense(x.reshape({20, 64}).narrow(0, 0, 2), w);
  EXPECT_TRUE(torch::equal(rows.narrow(0, 0, 2), pair));
}

TEST_F(CpuProductChoice, ForcedPoliciesNeedNoMeasurement) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({96, 64});
  configure_product_choices({ProductPolicy::kBlas, ""});
  EXPECT_FALSE(uses_decode_kernel(torch::randn({8, 64}), w));
  EXPECT_FALSE(uses_decode_kernel(torch::randn({500, 64}), w));
  EXPECT_FALSE(uses_decode_kernel(torch::randn({1, 64}), w));  // decode too
  EXPECT_TRUE(uses_decode_kernel(torch::randn({8, 64}).to(torch::kBFloat16), w.to(torch::kBFloat16)));  // not float32
  EXPECT_TRUE(uses_decode_kernel(torch::randn({1, 64}).to(torch::kBFloat16), w.to(torch::kBFloat16)));
  configure_product_choices({ProductPolicy::kTiles, ""});
  EXPECT_TRUE(uses_decode_kernel(torch::randn({1, 64}), w));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({8, 64}), w));
  EXPECT_TRUE(uses_decode_kernel(torch::randn({500, 64}), w));
  EXPECT_TRUE(product_choices().empty());
}

// The one-row kernels read the weights four rows a pass (the tiles path of kOneRowOrder) or one row
// at a time in memory order (the BLAS path), over a row count that leaves three rows after the last
// pass of four: float32 the same bits either way, bf16 the same bits where the CPU has no bf16 dot
// products (both widen), all within float32 rounding of the float64 product of the operands.
// Measured, the order is cached under its key like any product's path.
TEST_F(CpuProductChoice, OneRowProductsGiveTheSameBitsInEitherOrderAndTheMeasuredOrderIsCached) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  torch::NoGradGuard no_grad;
  torch::manual_seed(17);
  const int64_t k = 136, n = 203;
  const auto weight = torch::randn({n, k});
  const auto x = torch::randn({1, k});
  const auto reference = x.to(torch::kFloat64).mm(weight.to(torch::kFloat64).t());  // [1, N]
#if defined(__x86_64__)
  const bool bf16_dot_products = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#else
  const bool bf16_dot_products = false;
#endif
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t value_bytes = dtype == torch::kFloat32 ? 4 : 2;
    const auto w = weight.to(dtype), input = x.to(dtype);
    std::vector<torch::Tensor> outputs;
    for (const auto policy : {ProductPolicy::kTiles, ProductPolicy::kBlas}) {
      configure_product_choices({policy, ""});
      forget_one_row_orders();
      auto out = torch::full({1, n}, -1.0f);
      if (dtype == torch::kFloat32)
        dense_rows(input.data_ptr<float>(), 1, w, out.data_ptr<float>(), n);
      else
        dense_rows(input.data_ptr<c10::BFloat16>(), 1, w, out.data_ptr<float>(), n);
      EXPECT_EQ(one_row_reads_in_memory_order(value_bytes), policy == ProductPolicy::kBlas);
      // Against the float64 product of the operands as the kernel saw them (bf16-rounded for bf16).
      const auto seen = input.to(torch::kFloat64).mm(w.to(torch::kFloat64).t());
      EXPECT_LT((out.to(torch::kFloat64) - seen).abs().max().item<double>(), 1e-5 * (seen.abs().max().item<double>() + 1));
      outputs.push_back(out);
    }
    if (dtype == torch::kFloat32 || !bf16_dot_products) {
      EXPECT_TRUE(torch::equal(outputs[0], outputs[1])) << "value bytes " << value_bytes;
    }
  }
  EXPECT_LT((x.mm(weight.t()).to(torch::kFloat64) - reference).abs().max().item<double>(), 1e-3);

  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  measure_into(file);
  forget_one_row_orders();
  one_row_reads_in_memory_order(4);
  const auto choices = product_choices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(choices[0].key.rfind("one_row_order 1x1024x", 0), 0u) << choices[0].key;
  EXPECT_GT(choices[0].tiles_seconds, 0);
  EXPECT_GT(choices[0].blas_seconds, 0);
  EXPECT_TRUE(read_json(file)["hosts"][product_choice_host()].contains(choices[0].key));
  forget_one_row_orders();
}

TEST_F(CpuProductChoice, ADamagedCacheIsMeasuredOverWithAWarningNamingIt) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  write_text(file, "{\"hosts\": [1, 2");
  measure_into(file);
  ::testing::internal::CaptureStderr();
  {
    torch::NoGradGuard no_grad;
    dense(torch::randn({5, 64}), torch::randn({96, 64}));
  }
  const auto warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(file), std::string::npos) << warning;
  ASSERT_EQ(product_choices().size(), 1u);
  EXPECT_FALSE(product_choices()[0].from_cache);
  EXPECT_TRUE(read_json(file).at("hosts").at(product_choice_host()).contains(key_of("forward", 8, 64, 96)));
}

TEST_F(CpuProductChoice, OtherHostsEntriesAreKeptWhenTheFileIsRewritten) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  const nlohmann::json other = {{"forward 64x64x96 threads 2", {{"path", "blas"}, {"tiles_seconds", 2.0}, {"blas_seconds", 1.0}}}};
  write_text(file, nlohmann::json{{"version", 1}, {"hosts", {{"another CPU | libtorch 2.11.0 | kernels 1", other}}}}.dump());
  measure_into(file);
  torch::NoGradGuard no_grad;
  dense(torch::randn({40, 64}), torch::randn({96, 64}));
  const auto written = read_json(file);
  EXPECT_EQ(written.at("hosts").at("another CPU | libtorch 2.11.0 | kernels 1"), other);
  EXPECT_TRUE(written.at("hosts").at(product_choice_host()).contains(key_of("forward", 64, 64, 96)));
  ASSERT_EQ(product_choices().size(), 1u);
  EXPECT_FALSE(product_choices()[0].from_cache);  // another host's entry is not this host's choice
}

TEST_F(CpuProductChoice, AChoiceMeasuredOnABusyMachineHoldsForThisRunOnly) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  int probes = 0;
  const auto configure = [&](double share) {
    ProductChoiceSettings settings{ProductPolicy::kMeasure, file};  // the default limit, 0.25
    settings.others_share = [&probes, share] { return ++probes, share; };
    configure_product_choices(settings);
  };
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({96, 64});
  configure(0.6);  // a training run on the other core, say
  ::testing::internal::CaptureStderr();
  dense(torch::randn({40, 64}), w);
  dense(torch::randn({3, 64}), w);  // a second class: the same probe, within its second
  const auto warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(probes, 1);
  ASSERT_EQ(product_choices().size(), 2u);
  for (const auto& choice : product_choices()) {
    EXPECT_FALSE(choice.cached) << choice.key;
    EXPECT_DOUBLE_EQ(choice.others_share, 0.6);
  }
  EXPECT_FALSE(std::filesystem::exists(file));  // nothing written
  EXPECT_NE(warning.find("60% of the CPU"), std::string::npos) << warning;
  EXPECT_NE(warning.find(file), std::string::npos) << warning;

  configure(0.1);  // a later run on a quiet machine measures again and caches
  dense(torch::randn({40, 64}), w);
  ASSERT_EQ(product_choices().size(), 1u);
  EXPECT_TRUE(product_choices()[0].cached);
  EXPECT_FALSE(product_choices()[0].from_cache);
  EXPECT_TRUE(read_json(file).at("hosts").at(product_choice_host()).contains(key_of("forward", 64, 64, 96)));
}

// The probe counts another process's work (about one CPU's worth for one spinning process).
TEST(OthersCpuShare, SeesAnotherProcessSpinning) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(cpus, 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // spins for 0.6 s, then leaves without running any destructor
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
    volatile unsigned long spins = 0;
    while (std::chrono::steady_clock::now() < end) spins = spins + 1;
    ::_exit(0);
  }
  const double share = others_cpu_share(300);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_GE(share * static_cast<double>(cpus), 0.7) << "a spinning process is about one CPU's worth; share " << share;
  EXPECT_LE(share, 1.0);
}

TEST_F(CpuProductChoice, MeasuringLeavesTheProgramsRandomStreamAsItWas) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  measure_into("");  // in memory only
  const auto x = torch::randn({20, 64}), w = torch::randn({96, 64});
  torch::manual_seed(7);
  const auto expected = torch::randn({8});
  torch::manual_seed(7);
  {
    torch::NoGradGuard no_grad;
    dense(x, w);
  }
  ASSERT_EQ(product_choices().size(), 1u);  // it did measure
  EXPECT_TRUE(torch::equal(torch::randn({8}), expected));
}

TEST_F(CpuProductChoice, TheEnvironmentNamesThePolicyAndTheCacheFile) {
  const auto keep = [](const char* name) {
    const char* value = std::getenv(name);
    return std::make_pair(std::string(name), value ? std::optional<std::string>(value) : std::nullopt);
  };
  const std::vector<std::pair<std::string, std::optional<std::string>>> saved = {
      keep("COCONUT_CPU_KERNELS"), keep("COCONUT_CACHE_DIR"), keep("XDG_CACHE_HOME"), keep("HOME"),
      keep("COCONUT_CPU_BUSY_LIMIT")};
  setenv("COCONUT_CPU_KERNELS", "blas", 1);
  setenv("COCONUT_CACHE_DIR", "/somewhere", 1);
  auto settings = product_choice_settings_from_environment();
  EXPECT_EQ(settings.policy, ProductPolicy::kBlas);
  EXPECT_EQ(settings.cache_file, "/somewhere/cpu_products.json");
  unsetenv("COCONUT_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(product_choice_settings_from_environment().cache_file, "/xdg/coconut/cpu_products.json");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(product_choice_settings_from_environment().cache_file, "/home/someone/.cache/coconut/cpu_products.json");
  unsetenv("COCONUT_CPU_KERNELS");
  EXPECT_EQ(product_choice_settings_from_environment().policy, ProductPolicy::kMeasure);
  setenv("COCONUT_CPU_KERNELS", "fastest", 1);
  try {
    product_choice_settings_from_environment();
    ADD_FAILURE() << "a bad policy was taken";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("COCONUT_CPU_KERNELS=fastest"), std::string::npos) << error.what();
  }
  unsetenv("COCONUT_CPU_KERNELS");
  unsetenv("COCONUT_CPU_BUSY_LIMIT");
  EXPECT_DOUBLE_EQ(product_choice_settings_from_environment().busy_limit, 0.25);
  setenv("COCONUT_CPU_BUSY_LIMIT", "0.5", 1);
  EXPECT_DOUBLE_EQ(product_choice_settings_from_environment().busy_limit, 0.5);
  for (const char* bad : {"1.5", "half", "0.3x", "-0.1"}) {
    setenv("COCONUT_CPU_BUSY_LIMIT", bad, 1);
    try {
      product_choice_settings_from_environment();
      ADD_FAILURE() << "a bad limit was taken: " << bad;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("COCONUT_CPU_BUSY_LIMIT=") + bad), std::string::npos) << error.what();
    }
  }
  for (const auto& [name, value] : saved) value ? setenv(name.c_str(), value->c_str(), 1) : unsetenv(name.c_str());
}

// A bf16 prefill product (more rows than a block) takes the cached choice between float32
// arithmetic and libtorch's bf16 product; the float32 one, on either float32 path and in chunks of
// weight rows, equals the float64 product of the same values up to float32 summation.
TEST_F(CpuProductChoice, Bf16PrefillFollowsTheCachedPathAndItsFloat32ArithmeticAgreesWithFloat64) {
  if (!uses_decode_kernel(torch::randn({1, 64}), torch::randn({96, 64}))) GTEST_SKIP() << "no tile kernels on this CPU";
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const auto x = torch::randn({2, 20, 64}).to(torch::kBFloat16);  // 40 rows: the 64-row class
  const auto w = torch::randn({96, 64}).to(torch::kBFloat16), b = torch::randn({96}).to(torch::kBFloat16);
  const auto rows = x.reshape({40, 64});
  const auto expect_float64 = [](const torch::Tensor& got, const torch::Tensor& a, const torch::Tensor& weight, double bound) {
    const auto exact = a.to(torch::kFloat64).mm(weight.to(torch::kFloat64).t());
    const auto magnitude = a.to(torch::kFloat64).abs().mm(weight.to(torch::kFloat64).abs().t());
    EXPECT_EQ(got.scalar_type(), torch::kFloat32);
    EXPECT_LE(((got.to(torch::kFloat64) - exact).abs() / magnitude).max().item<double>(), bound);
  };
  for (auto float32_path : {ProductPath::kTiles, ProductPath::kBlas})
    expect_float64(widened_bf16_product(rows, w, float32_path), rows, w, 1e-6);
  // BLAS widens 8 MiB of weight rows at a time: 512 rows of 4,096, so 600 take two chunks.
  const auto wide_rows = torch::randn({20, 4096}).to(torch::kBFloat16), wide_weight = torch::randn({600, 4096}).to(torch::kBFloat16);
  expect_float64(widened_bf16_product(wide_rows, wide_weight, ProductPath::kBlas), wide_rows, wide_weight, 2e-6);

  testing::TempDir folder;
  const auto file = folder.file("cpu_products.json");
  const auto write_cache = [&](const char* float32_path, const char* bf16_path) {
    const nlohmann::json entries = {
        {key_of("forward", 64, 64, 96), {{"path", float32_path}, {"tiles_seconds", 1.0}, {"blas_seconds", 1.0}}},
        {key_of("bf16_forward", 64, 64, 96), {{"path", bf16_path}, {"tiles_seconds", 1.0}, {"blas_seconds", 1.0}}}};
    write_text(file, nlohmann::json{{"version", 1}, {"hosts", {{product_choice_host(), entries}}}}.dump());
    measure_into(file);
  };
  ASSERT_TRUE(uses_bf16_prefill_choice(x, w));
  write_cache("tiles", "blas");
  EXPECT_TRUE(torch::equal(dense(x, w, b), at::linear(x, w, b)));  // libtorch's bf16 product itself
  for (const char* float32_path : {"tiles", "blas"}) {
    write_cache(float32_path, "tiles");
    const auto path = std::string(float32_path) == "tiles" ? ProductPath::kTiles : ProductPath::kBlas;
    const auto expected = (widened_bf16_product(rows, w, path) + b.to(torch::kFloat32)).to(torch::kBFloat16).view({2, 20, 96});
    EXPECT_TRUE(torch::equal(dense(x, w, b), expected)) << float32_path;  // rounded once, after the bias
    EXPECT_EQ(product_choices().size(), 2u);  // both read from the file, none measured
  }

  // Not taken: a block of rows or fewer (the bf16 tiles), autograd, float32, autocast.
  EXPECT_FALSE(uses_bf16_prefill_choice(x.reshape({40, 64}).narrow(0, 0, kDecodeKernelRowBlock), w));
  EXPECT_FALSE(uses_bf16_prefill_choice(x, w.to(torch::kFloat32)));
  EXPECT_FALSE(uses_bf16_prefill_choice(x.to(torch::kFloat32), w.to(torch::kFloat32)));
  {
    torch::AutoGradMode grad(true);
    EXPECT_FALSE(uses_bf16_prefill_choice(x, w.clone().requires_grad_()));
  }
  {
    AutocastRestore autocast(true, torch::Device(torch::kCPU));
    EXPECT_FALSE(uses_bf16_prefill_choice(x, w));
  }

  // Unseen, the class is measured, the float32 forward of its size first.
  measure_into(folder.file("measured.json"));
  dense(x, w);
  const auto choices = product_choices();
  ASSERT_EQ(choices.size(), 2u);
  const auto& bf16 = choices[0].key == key_of("bf16_forward", 64, 64, 96) ? choices[0] : choices[1];
  EXPECT_EQ(bf16.key, key_of("bf16_forward", 64, 64, 96));
  EXPECT_GT(bf16.tiles_seconds, 0);
  EXPECT_GT(bf16.blas_seconds, 0);
  EXPECT_EQ(bf16.path, bf16.blas_seconds * 1.02 < bf16.tiles_seconds ? ProductPath::kBlas : ProductPath::kTiles);
}

}  // namespace
}  // namespace coconut
