// coconut generate: text or ids in, a continuation out (greedy or sampled, KV-cached); with --chat
// the prompt is a user's message, rendered by the model's chat template, and the reply is printed.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "io/hf_checkpoint.h"
#include "io/peft_adapter.h"
#include "model/generate.h"
#include "model/quantized_linear.h"
#include "reasoning/layout.h"
#include "recipes/evaluate_model.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"

namespace coconut::cli {
namespace {

struct GenerateFlags {
  std::string model, adapter, prompt, ids, dtype, device = "cpu", system, weights = "auto";
  int64_t max_new_tokens = 64;
  double temperature = 0.0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t latents = 0, start_latent_id = -1, end_latent_id = -1;
  bool print_ids = false, ignore_eos = false, allow_nonfinite = false, chat = false;
};

int run_generate(const GenerateFlags& flags) {
  if (flags.prompt.empty() == flags.ids.empty()) throw std::invalid_argument("give exactly one of --prompt and --ids");
  const auto device = parse_device(flags.device);
  const auto weights = resolve_weights(flags.weights, flags.model, !flags.adapter.empty(), device.is_cpu());
  auto model = load_model_variant(flags.model, flags.adapter, parse_optional_dtype(flags.dtype), device, {},
                                  weight_format_from_name(weights), flags.allow_nonfinite);
  const LlamaConfig& config = model->config();
  std::vector<int64_t> prompt;
  std::unique_ptr<HfTokenizer> tokenizer;
  const std::string tokenizer_file = folder_with(flags.model, flags.adapter, "tokenizer.json") + "/tokenizer.json";
  if (std::filesystem::exists(tokenizer_file)) tokenizer = HfTokenizer::load(tokenizer_file);
  if (flags.chat) {
    if (flags.prompt.empty()) throw std::invalid_argument("--chat needs --prompt (the user's message)");
    if (flags.latents > 0) throw std::invalid_argument("--chat and --latents cannot be combined");
    if (!tokenizer) throw std::invalid_argument(tokenizer_file + ": not found; --chat needs it");
    const ModelChatTemplate chat = load_chat_template(folder_with(flags.model, flags.adapter, "tokenizer_config.json"));
    if (!chat.chat) throw std::invalid_argument("--chat: " + chat.problem);
    std::vector<ChatMessage> messages;
    if (!flags.system.empty()) messages.push_back({"system", flags.system});
    messages.push_back({"user", flags.prompt});
    prompt = tokenizer->encode(chat.chat->render(messages, chat.bos_text));  // the template writes BOS where it wants one
  } else if (!flags.system.empty()) {
    throw std::invalid_argument("--system needs --chat");
  } else if (!flags.ids.empty()) {
    prompt = parse_ids(flags.ids, "--ids");
  } else {
    if (!tokenizer) throw std::invalid_argument(tokenizer_file + ": not found; --prompt needs it (or use --ids)");
    prompt = tokenizer->encode_with_special_tokens(flags.prompt);  // BOS as the model was trained
  }
  for (int64_t id : prompt)
    if (id < 0 || id >= config.vocab_size)
      throw std::invalid_argument("--ids: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(config.vocab_size) + ")");
  GenerationOptions options;
  if (flags.latents > 0) {
    // Coconut: <|start-latent|>, K continuous thoughts, <|end-latent|>, then decoding.
    const auto marker = [&](int64_t given, const char* token, const char* flag) {
      if (given >= 0) return given;
      if (tokenizer)
        if (auto id = tokenizer->token_to_id(token)) return *id;
      throw std::invalid_argument(std::string("--latents: the model's tokenizer has no ") + token + "; give " + flag);
    };
    const int64_t start_id = marker(flags.start_latent_id, "<|start-latent|>", "--start-latent-id");
    const int64_t end_id = marker(flags.end_latent_id, "<|end-latent|>", "--end-latent-id");
    for (int64_t id : {start_id, end_id})
      if (id >= config.vocab_size) throw std::invalid_argument("latent marker id " + std::to_string(id) + " is outside the vocabulary");
    prompt.push_back(start_id);
    options.latent_thoughts = flags.latents;
    options.after_latents = {end_id};
    options.latent_bottleneck = load_reasoning_settings(folder_with(flags.model, flags.adapter, "coconut.json")).answer_through_thoughts;
  }
  options.max_new_tokens = flags.max_new_tokens;
  options.sampling = {flags.temperature, flags.top_k, flags.top_p, flags.seed};
  if (!flags.ignore_eos) options.stop_ids = config.eos_token_ids;
  const auto start = std::chrono::steady_clock::now();
  const auto result = generate(model, {prompt}, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Which weights ran: dense in the model's dtype, or ggml blocks (--weights); on the CPU a dense
  // model is told what the blocks would read (a healed or merged folder is dense unless asked).
  const std::string dtype = dtype_name(model->embed_tokens->weight.scalar_type());
  const std::string ran = weights == "dense" ? "dense " + dtype : weights;
  std::fprintf(stderr, "generated %zu tokens in %.3f s (%.1f tokens/s, prompt %zu tokens, %lld continuous thoughts, weights %s)\n",
               result.tokens[0].size(), seconds, static_cast<double>(result.tokens[0].size()) / seconds, prompt.size(),
               static_cast<long long>(result.latent_steps), ran.c_str());
  if (weights == "dense" && device.is_cpu() && flags.weights == "auto")
    std::fprintf(stderr, "note: dense weights; --weights q8_0 reads about half the bytes of bf16 per token, q4_1 about 0.3\n");
  if (tokenizer && flags.chat) {
    std::printf("%s\n", tokenizer->decode(result.tokens[0], true).c_str());  // the reply alone
  } else if (tokenizer) {
    // Without thoughts the answer continues the prompt's text; after them, the <|end-latent|> marker.
    const std::vector<int64_t> context = flags.latents == 0 ? prompt : std::vector<int64_t>{};
    std::printf("%s%s\n", flags.prompt.c_str(), tokenizer->decode_continuation(context, result.tokens[0]).c_str());
  }
  if (flags.print_ids) std::printf("%s\n", join_ids(result.tokens[0]).c_str());
  return 0;
}

const bool registered = register_command({"generate", "continue a prompt with a model (KV-cached decoding)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<GenerateFlags>();
  app.add_option("--model", flags->model, "HF model folder")->required();
  app.add_option("--adapter", flags->adapter, "PEFT LoRA adapter folder merged into --model at load (its tokenizer.json, where present, replaces the model's)");
  app.add_option("--prompt", flags->prompt, "prompt text (needs the model's tokenizer.json)");
  app.add_option("--ids", flags->ids, "prompt token ids, comma-separated (BOS included if wanted)");
  app.add_flag("--chat", flags->chat, "--prompt is a user's message: render it with the model's chat template, print the reply");
  app.add_option("--system", flags->system, "with --chat: a system message first");
  app.add_option("--max-new-tokens", flags->max_new_tokens, "tokens to generate")->capture_default_str()
      ->check(in_range(0, kMaxTokensFlag));
  app.add_option("--temperature", flags->temperature, "0 = greedy")->capture_default_str()
      ->check(in_range(0, 1e6));
  app.add_option("--top-k", flags->top_k, "0 = off")->capture_default_str()
      ->check(in_range(0, 1e9));
  app.add_option("--top-p", flags->top_p, "nucleus mass, 1 = off")->capture_default_str()
      ->check(above_up_to(0, 1));
  app.add_option("--seed", flags->seed, "sampling seed")->capture_default_str();
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--weights", flags->weights, kWeightsHelp)->check(CLI::IsMember(kWeightFormats))->capture_default_str();
  app.add_flag("--allow-nonfinite", flags->allow_nonfinite, "load weights that hold NaN or infinities (to inspect a broken model)");
  app.add_option("--device", flags->device, "cpu | cuda | auto")->capture_default_str();
  app.add_option("--latents", flags->latents, "continuous thoughts after the prompt (Coconut)")->capture_default_str()
      ->check(in_range(0, 4096));
  app.add_option("--start-latent-id", flags->start_latent_id, "id of <|start-latent|> when the tokenizer has none");
  app.add_option("--end-latent-id", flags->end_latent_id, "id of <|end-latent|> when the tokenizer has none");
  app.add_flag("--ignore-eos", flags->ignore_eos, "do not stop at the config's EOS ids");
  app.add_flag("--print-ids", flags->print_ids, "print the generated ids, comma-separated, as the last line");
  return [flags] { return run_generate(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
