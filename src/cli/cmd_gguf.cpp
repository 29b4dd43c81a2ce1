// coconut export-gguf: an HF folder as a GGUF file llama.cpp loads; coconut import-gguf: a GGUF
// file (quantized or not) as an HF folder every command reads; coconut gguf-info: what a GGUF file
// holds (any GGUF v2/v3 file, ours or another tool's).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <memory>
#include <utility>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "io/gguf.h"
#include "io/gguf_export.h"
#include "io/gguf_import.h"
#include "model/llama.h"
#include "reasoning/layout.h"
#include "util/atomic_file.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct ExportFlags {
  std::string model, out, dtype = "float16";
  bool force = false;
};

int run_export(const ExportFlags& flags) {
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.force);
  const auto dtype = flags.dtype == "f32" ? torch::kFloat32
                     : flags.dtype == "f16" ? torch::kFloat16
                     : flags.dtype == "bf16" ? torch::kBFloat16
                                             : dtype_from_name(flags.dtype);
  const auto report = export_gguf(flags.model, flags.out, dtype);
  fmt::print("wrote {}: arch {}, {} tensors, tokenizer {}, {:.2f} MB\n", flags.out, report.architecture, report.tensors,
             report.tokenizer_model, static_cast<double>(report.bytes) / 1e6);
  if (report.router_dropped)
    fmt::print("note: the depth router's gates are not exported (llama.cpp has none): llama.cpp runs every layer\n");
  return 0;
}

struct ImportFlags {
  std::string file, out, dtype = "float32";
  bool force = false;
};

int run_import(const ImportFlags& flags) {
  check_output_path(flags.out, OutputKind::kFolder, "--out", flags.force, "config.json");
  const auto report = import_gguf(flags.file, flags.out, dtype_from_name(flags.dtype));
  std::string types;
  for (const auto& [type, count] : report.tensor_types) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + type;
  const LlamaConfig& c = report.config;
  fmt::print("wrote {}: {} layers, width {}, {} heads / {} KV heads, FFN {}, vocabulary {}{}, {} (tensors: {})\n", flags.out,
             c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size,
             c.tie_word_embeddings ? ", tied embeddings" : "", flags.dtype, types);
  fmt::print("tokenizer: {}{}{}\n", report.tokenizer_model, report.tokenizer_pre.empty() ? "" : " (pre-tokenizer " + report.tokenizer_pre + ")",
             report.has_chat_template ? ", with a chat template" : "");
  // The folder's default weights (`--weights auto` reads coconut.json's "weights"). Q8_0, Q4_0 and
  // Q4_1 alone: quantizing the imported values again gives the file's blocks back. A mix of the
  // formats the products run (the k-quants, Q5_0, ...: what most GGUF files hold) runs on the bytes
  // the folder kept (ggml_blocks.safetensors, `--weights gguf`). Other block formats (Q2_K, Q3_K,
  // Q5_1) run re-quantized to Q8_0: 8-bit blocks of values that came from at most 8 bits. Files of
  // float projections stay dense.
  std::string format, said;
  const auto& projection_types = report.projection_types;
  for (const auto& [type, name] : {std::pair{"Q8_0", "q8_0"}, std::pair{"Q4_0", "q4_0"}, std::pair{"Q4_1", "q4_1"}})
    if (projection_types.size() == 1 && *projection_types.begin() == type) {
      format = name;
      said = fmt::format("every projection is {}: eval, generate, serve and logits run on the file's own blocks", type);
    }
  if (format.empty() && report.keeps_file_blocks) {
    format = "gguf";
    said = fmt::format("the projections are {}: eval, generate, serve and logits run on the file's own blocks, which {}/{} "
                       "keeps", fmt::join(projection_types, ", "), flags.out, kFileBlocksFile);
  }
  if (format.empty() && report.projections_in_blocks) {
    format = "q8_0";
    said = fmt::format("the projections are {}, blocks these kernels do not keep as they are: eval, generate, serve and logits "
                       "run them re-quantized to Q8_0",
                       fmt::join(projection_types, ", "));
  }
  if (!format.empty()) {
    ReasoningSettings settings;
    settings.weights = format;
    write_file_atomically(flags.out + "/" + kReasoningSettingsFile, reasoning_settings_to_json(settings).dump(2) + "\n");
    fmt::print("{} (`--weights {}`, the default from {}/{}; `--weights dense` for {})\n", said, format, flags.out,
               kReasoningSettingsFile, flags.dtype);
  }
  return 0;
}

std::string describe_value(const GgufMetadata& entry) {
  if (entry.type != GgufValueType::kArray) return entry.value.dump();
  const size_t count = entry.value.size();
  std::string text = "[" + std::to_string(count) + " x type " + std::to_string(static_cast<uint32_t>(entry.element_type)) + "]";
  if (count > 0) {
    text += " ";
    for (size_t i = 0; i < std::min<size_t>(count, 8); ++i) text += (i ? ", " : "") + entry.value[i].dump();
    if (count > 8) text += ", ...";
  }
  return text;
}

int run_info(const std::string& path, bool all_tensors) {
  const auto file = read_gguf(path);
  fmt::print("{}: GGUF v{}, {} metadata entries, {} tensors, alignment {}, data at byte {}\n", path, file.version,
             file.metadata.size(), file.tensors.size(), file.alignment, file.data_offset);
  for (const auto& entry : file.metadata) fmt::print("  {} = {}\n", entry.key, describe_value(entry));
  size_t shown = 0;
  for (const auto& tensor : file.tensors) {
    if (!all_tensors && shown == 12) {
      fmt::print("  ... {} more tensors (--all)\n", file.tensors.size() - shown);
      break;
    }
    std::string dims;
    for (size_t d = 0; d < tensor.dims.size(); ++d) dims += (d ? " x " : "") + std::to_string(tensor.dims[d]);
    fmt::print("  tensor {} [{}] type {} offset {}\n", tensor.name, dims, tensor.type, tensor.offset);
    ++shown;
  }
  return 0;
}

const bool registered_export = register_command({"export-gguf", "write an HF model folder as GGUF v3 (llama, or deci when pruned non-uniformly)",
                                                 [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<ExportFlags>();
  app.add_option("--model", flags->model, "HF model folder")->required();
  app.add_option("--out", flags->out, "output .gguf file")->required();
  app.add_flag("--force", flags->force, "replace --out even when it is not a regular file");
  app.add_option("--dtype", flags->dtype, "f32 | f16 | bf16 (matrices; norms stay f32)")->capture_default_str();
  return [flags] { return run_export(*flags); };
}});

const bool registered_import = register_command({"import-gguf", "read a GGUF model (llama; F32/F16/BF16 or quantized) into an HF folder",
                                                 [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<ImportFlags>();
  app.add_option("file", flags->file, "GGUF file")->required();
  app.add_option("--out", flags->out, "output HF model folder")->required();
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 (the weights as stored in the folder)")->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_flag("--force", flags->force, "replace --out even when it is not a model folder");
  return [flags] { return run_import(*flags); };
}});

const bool registered_info = register_command({"gguf-info", "print a GGUF file's metadata and tensors",
                                               [](CLI::App& app) -> std::function<int()> {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  app.add_option("file", *path, "GGUF file")->required();
  app.add_flag("--all", *all, "list every tensor");
  return [path, all] { return run_info(*path, *all); };
}});

}  // namespace
}  // namespace coconut::cli
