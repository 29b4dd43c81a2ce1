// coconut eval-lm: a language model measured as the field measures one: the perplexity of a text
// (--text) and zero-shot multiple-choice accuracy as lm-evaluation-harness scores it (--choices).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "eval/choice_items.h"
#include "eval/loglikelihood.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "reasoning/layout.h"
#include "reasoning/special_tokens.h"
#include "reasoning/thought_scoring.h"
#include "recipes/evaluate_model.h"
#include "text/hf_tokenizer.h"
#include "util/atomic_file.h"
#include "util/output_path.h"

namespace coconut::cli {
namespace {

struct EvalLmFlags {
  std::string model, adapter, text, choices, out, summary, dtype, device = "cpu", weights = "auto", drop_layers, depth;
  std::string protocol = "hf";  // hf | llama-perplexity
  int64_t window = 0, stride = 0, batch_size = 4, limit = 0, latents = -1;
  bool force = false;
};

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::invalid_argument(path + ": cannot open the text file");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// "12/140 windows, 24576 tokens, 3100 tokens/s, ETA 1m5s" on one line of stderr, rewritten.
class ProgressLine {
 public:
  explicit ProgressLine(std::string unit) : unit_(std::move(unit)), started_(std::chrono::steady_clock::now()) {}
  void update(int64_t done, int64_t total, int64_t tokens) {
    const double seconds = elapsed();
    const double eta = done > 0 ? seconds * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    std::fprintf(stderr, "\r%lld/%lld %s, %lld tokens, %.0f tokens/s, ETA %.0f s   ", static_cast<long long>(done),
                 static_cast<long long>(total), unit_.c_str(), static_cast<long long>(tokens),
                 seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0, eta);
    if (done == total) std::fprintf(stderr, "\n");
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(); }

 private:
  std::string unit_;
  std::chrono::steady_clock::time_point started_;
};

int run_eval_lm(const EvalLmFlags& flags) {
  if (flags.text.empty() == flags.choices.empty()) throw std::invalid_argument("give --text FILE or --choices FILE.jsonl (one of them)");
  if (!flags.text.empty() && !flags.out.empty()) throw std::invalid_argument("--out is per item: for --choices");
  if (!flags.choices.empty() && (flags.window > 0 || flags.stride > 0 || flags.protocol != "hf"))
    throw std::invalid_argument("--window, --stride and --protocol are for --text");
  if (flags.protocol == "llama-perplexity" && flags.stride > 0)
    throw std::invalid_argument("--stride: llama-perplexity's chunks do not overlap (each scores its second half)");
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.force);
  check_output_path(flags.summary, OutputKind::kFile, "--summary", flags.force);
  // Inputs first: a bad file fails before the model loads.
  std::vector<ChoiceItem> items;
  std::string text;
  if (!flags.choices.empty()) {
    items = load_choice_items(flags.choices);
    if (flags.limit > 0 && static_cast<size_t>(flags.limit) < items.size()) items.resize(static_cast<size_t>(flags.limit));
  } else {
    text = read_text(flags.text);
  }

  const auto device = parse_device(flags.device);
  const LlamaConfig config = load_config(flags.model + "/config.json");
  const std::set<int64_t> removed = layers_to_remove(flags.drop_layers, flags.depth, config.num_hidden_layers);
  const std::string weights = resolve_weights(flags.weights, flags.model, !flags.adapter.empty(), device.is_cpu());
  Llama model = load_model_variant(flags.model, flags.adapter, parse_optional_dtype(flags.dtype), device, removed,
                                   weight_format_from_name(weights));
  model->eval();
  const std::string tokenizer_path = folder_with(flags.model, flags.adapter, "tokenizer.json") + "/tokenizer.json";
  const auto tokenizer = HfTokenizer::load(tokenizer_path);
  const int64_t context = model->config().max_position_embeddings;
  // A Coconut model's thoughts run where a --choices context holds <|start-latent|><|end-latent|>
  // (a --text is plain text: no thoughts).
  const std::string settings_dir = folder_with(flags.model, flags.adapter, "coconut.json");
  const ReasoningSettings settings = load_reasoning_settings(settings_dir);
  ThoughtSlot slot;
  if (training_mode_from_name(settings.mode) == TrainingMode::kCoconut) {
    const SpecialTokenIds special = find_special_tokens(*tokenizer, model->config());
    slot = {special.start_latent, special.end_latent, flags.latents >= 0 ? flags.latents : settings.trained_latent_thoughts(),
            settings.answer_through_thoughts};
  } else if (flags.latents >= 0) {
    throw std::invalid_argument("--latents: " + settings_dir + " is a " + settings.mode + " model, not a Coconut one (no thoughts)");
  }

  // Layers gone: those the adapter was trained without (removed from the base before it merged),
  // then --drop-layers / --depth of what that gave; MLP channels left, summed over the layers (a
  // width cut's adapter names the channels its base loses, coconut.json dropped_mlp_channels).
  nlohmann::json result = {{"model", flags.model}, {"adapter", flags.adapter},
                           {"adapter_dropped_layers", flags.adapter.empty() ? std::vector<int64_t>{} : adapter_dropped_layers(flags.adapter)},
                           {"dropped_layers", removed},
                           {"layers", model->config().num_hidden_layers}, {"mlp_channels", model->config().mlp_channels()},
                           {"weights", weights},
                           {"dtype", dtype_name(model->embed_tokens->weight.scalar_type())}};
  if (!flags.text.empty()) {
    auto ids = tokenizer->encode_with_special_tokens(text);
    if (flags.limit > 0 && static_cast<size_t>(flags.limit) < ids.size()) ids.resize(static_cast<size_t>(flags.limit));
    if (ids.size() < 2)
      throw std::invalid_argument(flags.text + ": the text holds " + std::to_string(ids.size()) + " token(s); perplexity needs at least 2");
    const int64_t window = flags.window > 0 ? flags.window : context;
    if (window > context)
      throw std::invalid_argument("--window " + std::to_string(window) + " exceeds the model's context of " + std::to_string(context));
    const int64_t stride = flags.stride > 0 ? flags.stride : window;
    if (stride > window) throw std::invalid_argument("--stride must be at most --window");
    // llama-perplexity puts the token the tokenizer adds first (BOS) at the start of every chunk.
    const bool llama_chunks = flags.protocol == "llama-perplexity";
    const auto added = tokenizer->encode_with_special_tokens("x"), plain = tokenizer->encode("x");
    const bool adds_first = added.size() > plain.size() && std::equal(plain.rbegin(), plain.rend(), added.rbegin());
    const int64_t chunk_first_token = llama_chunks && adds_first ? added.front() : -1;
    if (llama_chunks && static_cast<int64_t>(ids.size()) < window)
      throw std::invalid_argument(flags.text + ": the text holds " + std::to_string(ids.size()) +
                                  " tokens, less than one llama-perplexity chunk of --window " + std::to_string(window));
    const auto windows = llama_chunks ? llama_perplexity_windows(static_cast<int64_t>(ids.size()), window)
                                      : perplexity_windows(static_cast<int64_t>(ids.size()), window, stride);
    ProgressLine progress("windows");
    const auto scored = score_windows(model, ids, windows, flags.batch_size, chunk_first_token,
                                      [&](int64_t done, int64_t total, int64_t tokens) { progress.update(done, total, tokens); });
    result.update({{"text", flags.text}, {"protocol", flags.protocol}, {"tokens", scored.tokens}, {"scored_tokens", scored.scored},
                   {"windows", scored.windows}, {"window", window}, {"stride", llama_chunks ? window : stride}, {"nll", scored.nll},
                   {"nll_per_token", scored.nll / static_cast<double>(scored.scored)}, {"perplexity", scored.perplexity()},
                   {"seconds", progress.elapsed()}});
  } else {
    const auto prefix = !config.bos_token_ids.empty() ? config.bos_token_ids.front()
                        : !config.eos_token_ids.empty() ? config.eos_token_ids.front() : 0;
    ProgressLine progress("items");
    int64_t right = 0, right_norm = 0, tokens = 0, thought_items = 0;
    std::vector<nlohmann::json> records;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& item = items[i];
      EncodedChoices encoded;
      try {
        encoded = encode_choices(*tokenizer, item.context, item.choices, prefix);
      } catch (const std::invalid_argument& error) {
        throw std::invalid_argument(flags.choices + ": item " + item.id.dump() + ": " + error.what());
      }
      const bool thinks = slot.thoughts > 0 && thought_slot_column(encoded.context, slot) >= 0;
      const auto scores = thinks ? score_choices_with_thoughts(model, encoded, context, slot) : score_choices(model, encoded, context);
      thought_items += thinks;
      const int64_t pred = argmax_choice(scores), pred_norm = argmax_choice_normalized(scores, item.choices);
      right += pred == item.label;
      right_norm += pred_norm == item.label;
      tokens += static_cast<int64_t>(encoded.context.size());
      for (const auto& continuation : encoded.continuations) tokens += static_cast<int64_t>(continuation.size());
      records.push_back({{"id", item.id}, {"scores", scores}, {"label", item.label}, {"pred", pred}, {"pred_norm", pred_norm}});
      progress.update(static_cast<int64_t>(i + 1), static_cast<int64_t>(items.size()), tokens);
    }
    const auto count = static_cast<double>(items.size());
    result.update({{"choices", flags.choices}, {"items", items.size()}, {"acc", static_cast<double>(right) / count},
                   {"acc_norm", static_cast<double>(right_norm) / count}, {"tokens", tokens},
                   {"latent_thoughts", slot.thoughts}, {"items_with_thoughts", thought_items}, {"seconds", progress.elapsed()}});
    if (!flags.out.empty())
      write_file_atomically(flags.out, [&](std::ostream& out) {
        for (const auto& record : records) out << record.dump() << "\n";
      });
  }
  if (!flags.summary.empty()) write_file_atomically(flags.summary, result.dump(2) + "\n");
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}

const bool registered = register_command({"eval-lm", "perplexity of a text and zero-shot multiple-choice accuracy (lm-evaluation-harness's scoring)",
                                          [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<EvalLmFlags>();
  app.add_option("--model", flags->model, "HF model folder (with tokenizer.json)")->required();
  app.add_option("--adapter", flags->adapter, "PEFT LoRA adapter folder merged into --model at load");
  app.add_option("--text", flags->text, "UTF-8 text: its perplexity, tokenized as a whole (BOS only where the tokenizer adds one)");
  app.add_option("--choices", flags->choices, "JSONL, one item a line: {\"id\": ..., \"context\": str, \"choices\": [str, ...], "
                 "\"label\": int} (id optional); a choice's score is the sum of its tokens' log-probabilities after the context, "
                 "split as lm-evaluation-harness splits context and continuation (whitespace ending the context moves to the "
                 "choice)");
  app.add_option("--latents", flags->latents, "a Coconut model's continuous thoughts, run where a context holds "
                 "<|start-latent|><|end-latent|> (between them, before the choice; default: the trained stage's; 0: none)")
      ->check(in_range(0, 4096));
  app.add_option("--window", flags->window, "--text: tokens a window (default: the model's context)")->check(in_range(2, kMaxTokensFlag));
  app.add_option("--stride", flags->stride, "--text: tokens between window starts (default: the window, non-overlapping; less "
                 "scores each token once with up to window - stride tokens of left context)")->check(in_range(1, kMaxTokensFlag));
  app.add_option("--protocol", flags->protocol, "--text: hf (windows and --stride as in HF's perplexity guide) | llama-perplexity "
                 "(as llama.cpp's llama-perplexity: whole chunks of --window tokens, the first of each the token the tokenizer "
                 "adds first (BOS) if it adds one, each chunk's second half scored; a shorter rest left out)")
      ->check(CLI::IsMember({"hf", "llama-perplexity"}))->capture_default_str();
  app.add_option("--batch-size", flags->batch_size, "--text: windows a forward (--choices runs an item's choices as one batch "
                 "after one pass of its context)")->capture_default_str()->check(in_range(1, 4096));
  app.add_option("--limit", flags->limit, "--choices: the first N items only; --text: the first N tokens (0 = all)")->capture_default_str()->check(in_range(0, 1e15));
  app.add_option("--out", flags->out, "--choices: per item, one JSON object a line (id, scores, label, pred, pred_norm)");
  app.add_option("--summary", flags->summary, "also write the summary JSON here");
  app.add_flag("--force", flags->force, "replace --out / --summary even when they are not regular files");
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--weights", flags->weights, kWeightsHelp)->check(CLI::IsMember(kWeightFormats))->capture_default_str();
  app.add_option("--drop-layers", flags->drop_layers, "these layers (e.g. 1,5) removed at load, unhealed");
  app.add_option("--depth", flags->depth, "K: run the first K layers only (the others removed at load); full: all");
  app.add_option("--device", flags->device, "cpu | cuda | auto")->capture_default_str();
  return [flags] { return run_eval_lm(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
