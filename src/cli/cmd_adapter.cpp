// coconut merge-adapter: a base model folder plus a PEFT LoRA adapter as one plain HF folder;
// coconut extract-adapter: a fine-tuned model as a low-rank PEFT adapter over its base (truncated
// SVD of each projection's difference), for shipping a full fine-tune small.
#include <fmt/core.h>

#include <filesystem>
#include <memory>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "io/hf_checkpoint.h"
#include "io/peft_adapter.h"
#include "model/lora.h"
#include "recipes/evaluate_model.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

namespace fs = std::filesystem;

// The side files a model folder carries (each from the adapter when it has one, else the base).
const std::vector<std::string> kSideFiles = {"tokenizer.json", "tokenizer_config.json", "coconut.json", "generation_config.json"};

struct MergeFlags {
  std::string model, adapter, out, dtype;
  bool force = false;
};

int run_merge(const MergeFlags& flags) {
  check_output_path(flags.out, OutputKind::kFolder, "--out", flags.force, "config.json");
  const PeftAdapter adapter = read_peft_adapter(flags.adapter);
  Llama merged = load_model_variant(flags.model, flags.adapter, parse_optional_dtype(flags.dtype), torch::kCPU, {}, WeightFormat::kDense);
  SaveOptions options;
  for (const auto& file : kSideFiles) {
    const fs::path path = fs::path(folder_with(flags.model, flags.adapter, file)) / file;
    if (fs::exists(path)) options.extra_files.push_back(path.string());
  }
  save_hf_folder(flags.out, merged, options);
  fmt::print("wrote {}: {} merged, LoRA rank {} (scale {:.4g}) on {} projections{}\n", flags.out, flags.adapter, adapter.rank,
             adapter.scale(), adapter.lora.size() / 2,
             adapter.token_indices.empty() ? "" : fmt::format(", {} embedding rows replaced", adapter.token_indices.size()));
  return 0;
}

struct ExtractFlags {
  std::string model, base, out;
  int64_t rank = 16;
  std::vector<std::string> targets = lora_target_names();
  double row_tolerance = 1e-3;
  bool force = false;
};

int run_extract(const ExtractFlags& flags) {
  check_output_path(flags.out, OutputKind::kFolder, "--out", flags.force, "adapter_config.json");
  const Llama tuned = load_model(flags.model, torch::kFloat32);
  const Llama base = load_model(flags.base, torch::kFloat32);
  const auto extracted = extract_peft_adapter(tuned, base, flags.rank, flags.targets, flags.row_tolerance, flags.base);
  std::vector<std::string> extra;
  for (const auto& file : kSideFiles)
    if (fs::exists(fs::path(flags.model) / file)) extra.push_back((fs::path(flags.model) / file).string());
  write_peft_adapter(flags.out, extracted.adapter, extra);
  const auto bytes = fs::file_size(fs::path(flags.out) / kAdapterWeightsFile);
  fmt::print("wrote {}: rank {} over {} projections keeps {:.1f}% of the weight change's energy on average ({:.1f}% at the "
             "least), {} embedding rows carried, {:.2f} MB\n",
             flags.out, flags.rank, extracted.adapter.lora.size() / 2, 100 * extracted.kept_energy_mean,
             100 * extracted.kept_energy_min, extracted.adapter.token_indices.size(), static_cast<double>(bytes) / 1e6);
  if (extracted.changed_other_parameters > 0)
    fmt::print("note: {} other tensors (norms, untargeted projections or an untied head) changed too and are not carried\n",
               extracted.changed_other_parameters);
  return 0;
}

const bool registered_merge = register_command({"merge-adapter", "merge a PEFT LoRA adapter into its base model: one plain HF folder",
                                                [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<MergeFlags>();
  app.add_option("--model", flags->model, "base HF model folder")->required();
  app.add_option("--adapter", flags->adapter, "PEFT adapter folder (adapter_config.json, adapter_model.safetensors)")->required();
  app.add_option("--out", flags->out, "output HF model folder (the adapter's tokenizer and coconut.json carried over)")->required();
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the base's)");
  app.add_flag("--force", flags->force, "replace --out even when it is not a model folder");
  return [flags] { return run_merge(*flags); };
}});

const bool registered_extract = register_command({"extract-adapter", "a fine-tuned model as a low-rank PEFT adapter over its base (truncated SVD)",
                                                  [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<ExtractFlags>();
  app.add_option("--model", flags->model, "fine-tuned HF model folder")->required();
  app.add_option("--base", flags->base, "the HF model folder it was fine-tuned from (same config)")->required();
  app.add_option("--out", flags->out, "output PEFT adapter folder")->required();
  app.add_option("--rank", flags->rank, "LoRA rank")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--targets", flags->targets, "projections to carry")->capture_default_str()
      ->check(CLI::IsMember(lora_target_names()));
  app.add_option("--row-tolerance", flags->row_tolerance, "embedding rows that moved by more than this (relative) are carried whole")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_flag("--force", flags->force, "replace --out even when it is not an adapter folder");
  return [flags] { return run_extract(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
