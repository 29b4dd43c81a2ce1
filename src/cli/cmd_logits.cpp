// coconut logits: one forward over given ids; writes tensor `logits` [T, V] float32.
#include <cstdio>
#include <memory>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "io/hf_checkpoint.h"
#include "model/quantize_model.h"
#include "reasoning/layout.h"
#include "recipes/evaluate_model.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct LogitsFlags {
  std::string model, ids, out, dtype, device = "cpu", weights = "auto";
  bool force = false, allow_nonfinite = false;
};

int run_logits(const LogitsFlags& flags) {
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.force);
  const auto device = parse_device(flags.device);
  auto model = load_model_variant(flags.model, "", parse_optional_dtype(flags.dtype), device, {},
                                  weight_format_from_name(resolve_weights(flags.weights, flags.model, false, device.is_cpu())),
                                  flags.allow_nonfinite);
  const auto ids = parse_ids(flags.ids, "--ids");
  for (int64_t id : ids)
    if (id < 0 || id >= model->config().vocab_size)
      throw std::invalid_argument("--ids: id " + std::to_string(id) + " is outside the vocabulary");
  torch::NoGradGuard no_grad;
  auto input = torch::tensor(ids).view({1, -1}).to(model->embed_tokens->weight.device());
  auto logits = model->logits(model->forward_ids(input).hidden)[0];  // [T, V] float32
  write_safetensors(flags.out, {{"logits", logits.to(torch::kCPU).contiguous()}});
  std::fprintf(stderr, "wrote logits [%lld, %lld] to %s\n", static_cast<long long>(logits.size(0)),
               static_cast<long long>(logits.size(1)), flags.out.c_str());
  return 0;
}

const bool registered = register_command({"logits", "write the logits of one forward pass to a safetensors file",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<LogitsFlags>();
  app.add_option("--model", flags->model, "HF model folder")->required();
  app.add_option("--ids", flags->ids, "token ids, comma-separated")->required();
  app.add_option("--out", flags->out, "output .safetensors file (tensor 'logits', float32 [T, V])")->required();
  app.add_flag("--force", flags->force, "replace --out even when it is not a regular file");
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--weights", flags->weights, kWeightsHelp)->check(CLI::IsMember(kWeightFormats))->capture_default_str();
  app.add_flag("--allow-nonfinite", flags->allow_nonfinite, "load weights that hold NaN or infinities (to inspect a broken model)");
  app.add_option("--device", flags->device, "cpu | cuda | auto")->capture_default_str();
  return [flags] { return run_logits(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
