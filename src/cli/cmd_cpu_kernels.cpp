// coconut cpu-kernels: which path (hand-written tiles or BLAS) this host's float32 products take, as
// measured and cached (model/cpu_product_choice.h); --forget drops the host's entries so that the
// next run measures again.
#include <fmt/core.h>

#include <memory>
#include <string>

#include "cli/command.h"
#include "model/cpu_product_choice.h"

namespace coconut::cli {
namespace {

int run_cpu_kernels(bool forget) {
  const ProductChoiceSettings settings = product_choice_settings_from_environment();
  const std::string cache = settings.cache_file.empty()
                                ? "none (no HOME, XDG_CACHE_HOME or COCONUT_CACHE_DIR): choices kept in memory"
                                : settings.cache_file;
  fmt::print("host: {}\npolicy: {} (COCONUT_CPU_KERNELS)\ncache: {}\n", product_choice_host(),
             product_policy_name(settings.policy), cache);
  fmt::print("cached only when other processes use at most {:.0f}% of the CPU while measuring (COCONUT_CPU_BUSY_LIMIT)\n",
             100 * settings.busy_limit);
  if (forget) {
    forget_cached_product_choices(settings);
    fmt::print("forgot this host's choices: the next run measures them again\n");
    return 0;
  }
  const auto choices = cached_product_choices(settings);
  if (choices.empty()) {
    fmt::print("no choices cached for this host yet (the first float32 product of each size measures its own)\n");
    return 0;
  }
  fmt::print("{:<44} {:>6} {:>12} {:>12}\n", "product (rows x K x N, threads)", "path", "tiles us", "blas us");
  for (const auto& choice : choices)
    fmt::print("{:<44} {:>6} {:>12.1f} {:>12.1f}\n", choice.key, product_path_name(choice.path), choice.tiles_seconds * 1e6,
               choice.blas_seconds * 1e6);
  return 0;
}

const bool registered = register_command({"cpu-kernels",
                                          "which path (tiles or BLAS) this host's float32 products take, as measured and cached",
                                          [](CLI::App& app) -> std::function<int()> {
  auto forget = std::make_shared<bool>(false);
  app.add_flag("--forget", *forget, "drop this host's cached choices: the next run measures them again");
  return [forget] { return run_cpu_kernels(*forget); };
}});

}  // namespace
}  // namespace coconut::cli
