#include "model/cpu_product_choice.h"

#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <torch/version.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace coconut {

namespace {

// Bump when a kernel changes enough that cached choices no longer hold. 2: the one-row class, and
// files of version 1 may hold choices measured on a busy machine.
constexpr int kKernelsVersion = 2;

// The CPU as /proc/cpuinfo names it: vendor, family, model, stepping, model name and the vector
// features the kernels use (a VM may hide some of a CPU's).
std::string read_host_key() {
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    const auto value = colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
    fields.emplace(name, value);
  }
  std::string features;
  std::istringstream flags(fields["flags"]);
  for (std::string flag; flags >> flag;)
    if (flag == "avx2" || flag == "fma" || flag == "avx512f" || flag == "avx512_vnni" || flag == "avx512_bf16" || flag == "amx_tile")
      features += (features.empty() ? "" : ",") + flag;
  const std::string cpu = fields.empty() ? std::string("unknown CPU")
                                         : fmt::format("{} family {} model {} stepping {} ({}) [{}]", fields["vendor_id"],
                                                       fields["cpu family"], fields["model"], fields["stepping"],
                                                       fields["model name"], features);
  return fmt::format("{} | libtorch {} | kernels {}", cpu, TORCH_VERSION, kKernelsVersion);
}

ProductPolicy policy_named(const std::string& text) {
  for (auto policy : {ProductPolicy::kMeasure, ProductPolicy::kTiles, ProductPolicy::kBlas})
    if (text == product_policy_name(policy)) return policy;
  throw std::invalid_argument("COCONUT_CPU_KERNELS=" + text + ": expected measure, tiles or blas");
}

ProductPath path_named(const std::string& text) {
  if (text == "tiles") return ProductPath::kTiles;
  if (text == "blas") return ProductPath::kBlas;
  throw std::invalid_argument("path \"" + text + "\" is neither tiles nor blas");
}

// The choices of this process, and the cache file behind them.
class ProductChoices {
 public:
  ProductPath choose(ProductKind kind, int64_t rows, int64_t k, int64_t n, const std::function<ProductTrial(int64_t)>& make_trial) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!configured_) configure_locked(product_choice_settings_from_environment());
    if (settings_.policy == ProductPolicy::kTiles) return ProductPath::kTiles;
    if (settings_.policy == ProductPolicy::kBlas) return ProductPath::kBlas;
    const std::string key = product_choice_key(kind, rows, k, n);
    if (!loaded_) load_locked();
    if (const auto found = choices_.find(key); found != choices_.end()) return found->second.path;
    const double others = others_share_locked();
    ProductChoice choice = measure(key, make_trial(product_row_class(rows)));
    choice.others_share = others;
    choice.cached = !settings_.cache_file.empty() && others <= settings_.busy_limit;
    if (choice.cached) {
      save_locked(choice);
    } else if (!settings_.cache_file.empty() && !warned_busy_) {
      std::fprintf(stderr,
                   "coconut: other processes used %.0f%% of the CPU while CPU product paths were measured: these "
                   "choices hold for this run only, not cached in %s (COCONUT_CPU_BUSY_LIMIT=%g)\n",
                   100 * others, settings_.cache_file.c_str(), settings_.busy_limit);
      warned_busy_ = true;
    }
    choices_.emplace(key, choice);
    return choice.path;
  }

  void configure(const ProductChoiceSettings& settings) {
    std::lock_guard<std::mutex> lock(mutex_);
    configure_locked(settings);
  }

  std::vector<ProductChoice> choices() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ProductChoice> out;
    for (const auto& [key, choice] : choices_) out.push_back(choice);
    return out;
  }

  // The file's choices for this host, read now.
  std::vector<ProductChoice> load() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      load_locked();
    }
    return choices();
  }

  // Rewrites the file without this host's entries (nothing to do without a file).
  void forget_host() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.cache_file.empty() || !std::filesystem::exists(settings_.cache_file)) return;
    auto file = read_file_locked();
    if (file.contains("hosts")) file["hosts"].erase(host_);
    write_file_locked(file);
  }

 private:
  void configure_locked(const ProductChoiceSettings& settings) {
    settings_ = settings;
    configured_ = true;
    loaded_ = false;
    choices_.clear();
    last_probe_.reset();
  }

  // The other processes' share of the CPU, sampled at most once a second (a model's first pass
  // measures a dozen classes in a row); not sampled where every choice is cached or none is.
  double others_share_locked() {
    if (settings_.cache_file.empty() || settings_.busy_limit >= 1) return 0;
    const auto now = std::chrono::steady_clock::now();
    if (!last_probe_ || now - *last_probe_ > std::chrono::seconds(1)) {
      last_share_ = settings_.others_share ? settings_.others_share() : others_cpu_share();
      last_probe_ = std::chrono::steady_clock::now();
    }
    return last_share_;
  }

  // Both paths alternately, one warm-up each, then rounds until each has run 5 times or, past 2
  // rounds, 0.25 s went by; the best time of each decides. Ties (within 2%) keep the tiles, which
  // give the same bits for a row in any batch (cpu_linear.h).
  static ProductChoice measure(const std::string& key, const ProductTrial& trial) {
    using Clock = std::chrono::steady_clock;
    const auto time_once = [&](ProductPath path) {
      const auto start = Clock::now();
      trial(path);
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    time_once(ProductPath::kTiles);
    time_once(ProductPath::kBlas);
    ProductChoice choice;
    choice.key = key;
    choice.tiles_seconds = choice.blas_seconds = 1e30;
    const auto begin = Clock::now();
    for (int round = 0; round < 5; ++round) {
      choice.tiles_seconds = std::min(choice.tiles_seconds, time_once(ProductPath::kTiles));
      choice.blas_seconds = std::min(choice.blas_seconds, time_once(ProductPath::kBlas));
      if (round >= 1 && std::chrono::duration<double>(Clock::now() - begin).count() > 0.25) break;
    }
    choice.path = choice.blas_seconds * 1.02 < choice.tiles_seconds ? ProductPath::kBlas : ProductPath::kTiles;
    return choice;
  }

  // The file's entries for this host; a file that cannot be read is measured over (and replaced at
  // the next save), with a warning naming it.
  nlohmann::json read_file_locked() {
    nlohmann::json file = nlohmann::json::object();
    if (settings_.cache_file.empty()) return file;
    std::ifstream in(settings_.cache_file);
    if (!in) return file;
    try {
      in >> file;
      if (!file.is_object() || !file.value("hosts", nlohmann::json::object()).is_object())
        throw std::runtime_error("not an object with \"hosts\"");
    } catch (const std::exception& error) {
      if (!warned_) std::fprintf(stderr, "coconut: ignoring %s (%s): CPU product paths are measured again\n",
                                 settings_.cache_file.c_str(), error.what());
      warned_ = true;
      file = nlohmann::json::object();
    }
    return file;
  }

  void load_locked() {
    loaded_ = true;
    const auto file = read_file_locked();
    const auto hosts = file.value("hosts", nlohmann::json::object());
    const auto found = hosts.find(host_);
    if (found == hosts.end() || !found->is_object()) return;
    for (const auto& [key, entry] : found->items()) {
      try {
        ProductChoice choice;
        choice.key = key;
        choice.path = path_named(entry.at("path").get<std::string>());
        choice.tiles_seconds = entry.value("tiles_seconds", 0.0);
        choice.blas_seconds = entry.value("blas_seconds", 0.0);
        choice.from_cache = choice.cached = true;
        choices_.emplace(key, choice);
      } catch (const std::exception&) {  // an entry of a later format or damaged: measured again
      }
    }
  }

  // Reads the file again (other processes may have added entries), adds this choice and replaces
  // the file through a temporary of this process's own. A cache that cannot be written leaves
  // the choice in memory.
  void save_locked(const ProductChoice& choice) {
    if (settings_.cache_file.empty()) return;
    auto file = read_file_locked();
    file["version"] = 1;
    file["hosts"][host_][choice.key] = {{"path", product_path_name(choice.path)},
                                        {"tiles_seconds", choice.tiles_seconds},
                                        {"blas_seconds", choice.blas_seconds}};
    write_file_locked(file);
  }

  void write_file_locked(const nlohmann::json& file) {
    std::error_code error;
    std::filesystem::create_directories(std::filesystem::path(settings_.cache_file).parent_path(), error);
    const std::string temporary = settings_.cache_file + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << file.dump(1) << '\n';
      if (!out.flush()) {
        std::filesystem::remove(temporary, error);
        return;
      }
    }
    std::filesystem::rename(temporary, settings_.cache_file, error);
    if (error) std::filesystem::remove(temporary, error);
  }

  std::mutex mutex_;
  ProductChoiceSettings settings_;
  bool configured_ = false, loaded_ = false, warned_ = false, warned_busy_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_probe_;
  double last_share_ = 0;
  const std::string host_ = read_host_key();
  std::map<std::string, ProductChoice> choices_;
};

ProductChoices& product_choices_of_process() {
  static ProductChoices choices;
  return choices;
}

}  // namespace

ProductChoiceSettings product_choice_settings_from_environment() {
  ProductChoiceSettings settings;
  const auto variable = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::string(value) : std::string();
  };
  if (const auto policy = variable("COCONUT_CPU_KERNELS"); !policy.empty()) settings.policy = policy_named(policy);
  if (const auto limit = variable("COCONUT_CPU_BUSY_LIMIT"); !limit.empty()) {
    char* end = nullptr;
    settings.busy_limit = std::strtod(limit.c_str(), &end);
    if (end == limit.c_str() || *end != '\0' || !(settings.busy_limit >= 0 && settings.busy_limit <= 1))
      throw std::invalid_argument("COCONUT_CPU_BUSY_LIMIT=" + limit + ": expected a share of the CPU from 0 to 1");
  }
  if (const auto folder = variable("COCONUT_CACHE_DIR"); !folder.empty())
    settings.cache_file = folder + "/cpu_products.json";
  else if (const auto xdg = variable("XDG_CACHE_HOME"); !xdg.empty())
    settings.cache_file = xdg + "/coconut/cpu_products.json";
  else if (const auto home = variable("HOME"); !home.empty())
    settings.cache_file = home + "/.cache/coconut/cpu_products.json";
  return settings;
}

void configure_product_choices(const ProductChoiceSettings& settings) { product_choices_of_process().configure(settings); }

double others_cpu_share(int milliseconds) {
  // /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ... (clock ticks, all CPUs).
  const auto read_ticks = [](double& busy, double& total) {
    std::ifstream in("/proc/stat");
    std::string label;
    double user, nice, system, idle, iowait, irq, softirq, steal;
    if (!(in >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || label != "cpu") return false;
    busy = user + nice + system + irq + softirq + steal;
    total = busy + idle + iowait;
    return true;
  };
  const auto own_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  double busy0 = 0, total0 = 0, busy1 = 0, total1 = 0;
  const double own0 = own_seconds();
  if (!read_ticks(busy0, total0)) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  if (!read_ticks(busy1, total1) || total1 <= total0) return 0;
  const double ticks_per_second = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double others = (busy1 - busy0) - (own_seconds() - own0) * ticks_per_second;
  return std::clamp(others / (total1 - total0), 0.0, 1.0);
}

int64_t product_row_class(int64_t rows) {
  if (rows <= 1) return 1;  // decode: the one-row kernel against BLAS's matrix-vector product
  int64_t row_class = 2;
  while (row_class < rows && row_class < 1024) row_class *= 2;
  return row_class;
}

std::string product_choice_key(ProductKind kind, int64_t rows, int64_t k, int64_t n) {
  return fmt::format("{} {}x{}x{} threads {}", product_kind_name(kind), product_row_class(rows), k, n, at::get_num_threads());
}

ProductPath choose_product_path(ProductKind kind, int64_t rows, int64_t k, int64_t n,
                                const std::function<ProductTrial(int64_t rows)>& make_trial) {
  return product_choices_of_process().choose(kind, rows, k, n, make_trial);
}

std::vector<ProductChoice> product_choices() { return product_choices_of_process().choices(); }

std::vector<ProductChoice> cached_product_choices(const ProductChoiceSettings& settings) {
  ProductChoices file;
  file.configure({ProductPolicy::kMeasure, settings.cache_file});
  return file.load();
}

void forget_cached_product_choices(const ProductChoiceSettings& settings) {
  ProductChoices file;
  file.configure({ProductPolicy::kMeasure, settings.cache_file});
  file.forget_host();
}

std::string product_choice_host() { return read_host_key(); }

const char* product_path_name(ProductPath path) { return path == ProductPath::kTiles ? "tiles" : "blas"; }

const char* product_policy_name(ProductPolicy policy) {
  switch (policy) {
    case ProductPolicy::kMeasure: return "measure";
    case ProductPolicy::kTiles: return "tiles";
    case ProductPolicy::kBlas: return "blas";
  }
  return "?";
}

const char* product_kind_name(ProductKind kind) {
  switch (kind) {
    case ProductKind::kForward: return "forward";
    case ProductKind::kInputGradient: return "input_gradient";
    case ProductKind::kWeightGradient: return "weight_gradient";
    case ProductKind::kBf16Forward: return "bf16_forward";
    case ProductKind::kOneRowOrder: return "one_row_order";
    case ProductKind::kKQuantPrefetch: return "kquant_prefetch";
  }
  return "?";
}

}  // namespace coconut
