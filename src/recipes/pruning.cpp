#include "recipes/pruning.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "data/example.h"
#include "data/text_documents.h"
#include "io/hf_checkpoint.h"
#include "reasoning/evaluate.h"
#include "reasoning/layout.h"
#include "util/atomic_file.h"
#include "reasoning/special_tokens.h"

namespace coconut {

ScoringData load_scoring_data(const std::string& model_dir, const std::string& data_path, const ScoringDataOptions& options,
                              std::optional<torch::ScalarType> dtype, torch::Device device) {
  ScoringData scoring;
  scoring.device = device;
  scoring.settings = load_reasoning_settings(model_dir);
  scoring.model = load_model(model_dir, dtype, device);
  scoring.model->eval();
  if (data_path.empty()) return scoring;
  const std::string tokenizer_path = model_dir + "/tokenizer.json";
  if (!std::filesystem::exists(tokenizer_path)) throw std::invalid_argument(tokenizer_path + ": not found");
  scoring.tokenizer = HfTokenizer::load(tokenizer_path);
  scoring.special = find_special_tokens(*scoring.tokenizer, scoring.model->config());
  if (is_plain_text_dataset(data_path)) {
    if (!options.mode.empty() && options.mode != "lm")
      throw std::invalid_argument(data_path + ": plain text is scored in mode lm (every token), not " + options.mode);
    const int64_t window = text_window_or_default(options.window, scoring.model->config().max_position_embeddings);
    auto windows = text_windows(load_text_documents(data_path), *scoring.tokenizer, scoring.special.eos, window);
    if (windows.empty()) throw std::invalid_argument(data_path + ": the text holds fewer than 2 tokens");
    if (options.samples > 0 && static_cast<size_t>(options.samples) < windows.size())
      windows.resize(static_cast<size_t>(options.samples));
    scoring.plain_text = true;
    scoring.batches = text_batches(windows, scoring.special.pad, options.batch_size);
    return scoring;
  }
  require_markers(scoring.special, training_mode_from_name(options.mode.empty() ? scoring.settings.mode : options.mode),
                  tokenizer_path);
  scoring.examples = load_dataset(data_path);
  if (scoring.examples.empty()) throw std::invalid_argument(data_path + ": no examples");
  if (options.samples > 0 && static_cast<size_t>(options.samples) < scoring.examples.size())
    scoring.examples.resize(static_cast<size_t>(options.samples));
  scoring.batches = scoring_batches(scoring.examples, *scoring.tokenizer, scoring.special, scoring.settings, options);
  return scoring;
}

PruneResult prune_model(ScoringData& source, const PruneRequest& request) {
  const LlamaConfig& original = source.model->config();
  PruneResult result;
  result.heads = request.heads;
  if (request.head_fraction > 0) {
    const auto scores = measure_head_scores(source.model, source.batches, source.device, request.head_metric);
    result.heads = choose_heads(original, request.head_granularity == "query" ? scores.query : scores.groups,
                                request.head_fraction, request.head_granularity);
    if (result.heads.empty())
      result.notes.push_back(fmt::format("no head can go at fraction {} under the GQA rules", request.head_fraction));
  }
  result.layers = request.layers;
  if (request.drop_block > 0) {
    if (request.layer_score.scores.size() != 1) throw std::invalid_argument("prune: give one layer score to choose by");
    LayerScoreRequest scoring = request.layer_score;
    scoring.ablation_sizes = {request.drop_block};
    scoring.device = source.device;
    result.layers = choose_layers(measure_layer_scores(source.model, source.batches, scoring), scoring.scores.front(),
                                  request.drop_block);
  }
  if (request.mlp_width > 0 && request.mlp_flops_ratio > 0)
    throw std::invalid_argument("prune: give an MLP width or a FLOPs ratio, not both");
  int64_t width = request.mlp_width;
  if (request.mlp_flops_ratio > 0) {
    width = mlp_width_for_flops_ratio(original, request.mlp_flops_ratio, request.flops_context);
    result.notes.push_back(fmt::format("MLP width {}: the widest whose FLOPs per token at context {} are at most {} of the model's",
                                       width, request.flops_context, request.mlp_flops_ratio));
  }
  if (width > 0)
    result.mlp_channels = choose_mlp_channels(
        original, mlp_channel_importance(source.model, source.batches, source.device, request.channel_metric), width);
  for (int64_t layer : result.layers) {
    if (result.heads.erase(layer) > 0)
      result.notes.push_back("layer " + std::to_string(layer) + " is removed whole, so its head removals are moot");
    result.mlp_channels.erase(layer);
  }
  result.model = source.model;
  if (!result.heads.empty()) result.model = drop_heads(result.model, result.heads);
  if (!result.mlp_channels.empty()) result.model = drop_mlp_channels(result.model, result.mlp_channels);
  if (!result.layers.empty()) result.model = drop_layers(result.model, result.layers);
  return result;
}

void save_derived_model(Llama& model, const std::string& source_dir, const std::string& out) {
  SaveOptions save;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "coconut.json",
                           "generation_config.json"})
    if (std::filesystem::exists(std::filesystem::path(source_dir) / file))
      save.extra_files.push_back((std::filesystem::path(source_dir) / file).string());
  save_hf_folder(out, model, save);
  // A folder that ran on its GGUF file's blocks (--weights gguf) does not pass them on (their layers
  // and rows are the unpruned file's): the derived folder runs the file's values re-quantized to Q8_0.
  ReasoningSettings settings = load_reasoning_settings(out);
  if (settings.weights == "gguf") {
    settings.weights = "q8_0";
    write_file_atomically(out + "/coconut.json", reasoning_settings_to_json(settings).dump(2) + "\n");
  }
}

std::vector<std::vector<double>> tensor_rows(const torch::Tensor& values) {
  const auto cpu = values.to(torch::kCPU, torch::kFloat64).contiguous();
  std::vector<std::vector<double>> rows(static_cast<size_t>(cpu.size(0)));
  for (int64_t r = 0; r < cpu.size(0); ++r)
    rows[static_cast<size_t>(r)].assign(cpu[r].data_ptr<double>(), cpu[r].data_ptr<double>() + cpu.size(1));
  return rows;
}

torch::Tensor tensor_from_rows(const std::vector<std::vector<double>>& rows) {
  size_t columns = 0;
  for (const auto& row : rows) columns = std::max(columns, row.size());
  auto tensor = torch::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(columns)}, std::nan(""), torch::kFloat64);
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t c = 0; c < rows[r].size(); ++c) tensor[static_cast<int64_t>(r)][static_cast<int64_t>(c)] = rows[r][c];
  return tensor;
}

std::vector<Batch> scoring_batches(const std::vector<Example>& examples, const Tokenizer& tokenizer,
                                   const SpecialTokenIds& special, const ReasoningSettings& settings,
                                   const ScoringDataOptions& options) {
  if (examples.empty()) throw std::invalid_argument("scoring needs examples, the dataset is empty");
  if (options.batch_size <= 0) throw std::invalid_argument("batch size must be positive");
  SequenceOptions layout = settings.sequence_options();
  if (!options.mode.empty()) layout.mode = training_mode_from_name(options.mode);
  if (options.latents >= 0) {
    // K thoughts for every example: stage K with one thought per step, padded to K.
    layout.stage = options.latents;
    layout.c_thought = 1;
    layout.max_latent_stage = options.latents;
    layout.pad_latent_to_max = true;
  }
  const size_t count = options.samples > 0 ? std::min(examples.size(), static_cast<size_t>(options.samples)) : examples.size();
  std::vector<Sequence> sequences;
  std::vector<int64_t> thoughts;
  for (size_t i = 0; i < count; ++i) {
    sequences.push_back(build_sequence(tokenize_example(examples[i], tokenizer, special), layout, special));
    thoughts.push_back(sequences.back().latent_count);
  }
  std::vector<Batch> batches;
  for (const auto& rows : batches_of_equal_keys(thoughts, options.batch_size)) {
    std::vector<Sequence> members;
    for (size_t row : rows) members.push_back(sequences[row]);
    batches.push_back(collate(members, special.pad));
  }
  return batches;
}

std::vector<Batch> text_batches(const std::vector<TokenizedExample>& windows, int64_t pad, int64_t batch_size) {
  if (batch_size <= 0) throw std::invalid_argument("batch size must be positive");
  SequenceOptions layout;
  layout.mode = TrainingMode::kLm;
  std::vector<Batch> batches;
  for (size_t begin = 0; begin < windows.size(); begin += static_cast<size_t>(batch_size)) {
    std::vector<Sequence> rows;
    for (size_t i = begin; i < std::min(windows.size(), begin + static_cast<size_t>(batch_size)); ++i)
      rows.push_back(build_sequence(windows[i], layout, SpecialTokenIds{}));
    batches.push_back(collate(rows, pad));
  }
  return batches;
}

}  // namespace coconut
