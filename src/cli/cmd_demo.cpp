// coconut demo: the main job. For now it shows what exists: the cost accounting of a real
// pretrained Llama (stories260K, shipped in ../shared/data) and KV-cached greedy generation with it.
#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "model/generate.h"
#include "text/hf_tokenizer.h"

namespace coconut::cli {
namespace {

struct DemoFlags {
  std::string model = "../shared/data/models/stories260K";
  int64_t max_new_tokens = 48;
};

int run_demo(const DemoFlags& flags) {
  if (!std::filesystem::exists(flags.model))
    throw std::runtime_error(flags.model + ": model folder not found (run from the project root, or pass --model)");
  fmt::print("== model: {}\n", flags.model);
  auto model = load_model(flags.model);
  const auto& config = model->config();
  const auto count = count_parameters(config);
  fmt::print("{} layers, width {}, {} heads / {} KV heads, vocab {}: {} parameters, {:.2f} MFLOP per token at context 256\n",
             config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
             config.vocab_size, count.total, flops_per_token(config, 256).total() / 1e6);
  const auto tokenizer = HfTokenizer::load(flags.model + "/tokenizer.json");
  const std::string text = "Lily went";
  const auto prompt = tokenizer->encode_with_special_tokens(text);  // BOS first
  GenerationOptions options;
  options.max_new_tokens = flags.max_new_tokens;
  options.stop_ids = config.eos_token_ids;
  const auto start = std::chrono::steady_clock::now();
  const auto result = generate(model, {prompt}, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("== greedy continuation of \"{}\" (ids {}), {} tokens at {:.0f} tokens/s:\n{}{}\n", text, join_ids(prompt),
             result.tokens[0].size(), static_cast<double>(result.tokens[0].size()) / seconds, text,
             tokenizer->decode(result.tokens[0], true));
  return 0;
}

const bool registered = register_command({"demo", "the main job: show what the toolkit does end to end",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<DemoFlags>();
  app.add_option("--model", flags->model, "model folder")->capture_default_str();
  app.add_option("--max-new-tokens", flags->max_new_tokens, "tokens to generate")->capture_default_str();
  return [flags] { return run_demo(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
