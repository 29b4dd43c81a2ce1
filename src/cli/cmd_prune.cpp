// coconut score-layers / score-heads / prune / expand: redundancy scores of layers and heads
// measured on reasoning data or plain text, structural pruning (layers, heads, MLP channels) into a
// physically smaller HF folder, and depth expansion into a deeper one that computes the same function.
#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "data/example.h"
#include "eval/cost.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "pruning/scores.h"
#include "pruning/selection.h"
#include "pruning/surgery.h"
#include "reasoning/evaluate.h"
#include "reasoning/special_tokens.h"
#include "recipes/evaluate_model.h"
#include "recipes/pruning.h"
#include "recipes/train.h"
#include "text/hf_tokenizer.h"
#include "util/atomic_file.h"
#include "util/output_path.h"
#include "util/gnuplot.h"

namespace coconut::cli {
namespace {

namespace fs = std::filesystem;

// What every scoring command shares: the model with its tokenizer and settings, and the data.
struct DataFlags {
  std::string model, data, mode, dtype, device = "cpu";
  int64_t latents = -1, samples = 64, batch_size = 8, max_new_tokens = 128, window = 0;
  bool force = false;  // replace --out / --plot whatever they are
};

ScoringData load_context(const DataFlags& flags, bool need_data) {
  if (need_data && flags.data.empty()) throw std::invalid_argument("--data is required for this score");
  ScoringDataOptions options{flags.mode, flags.latents, flags.samples, flags.batch_size, flags.window};
  return load_scoring_data(flags.model, need_data ? flags.data : "", options, parse_optional_dtype(flags.dtype),
                           parse_device(flags.device));
}

// Greedy accuracy of `model` on the context's examples, with the thoughts its settings give.
double accuracy_of(Llama& model, const ScoringData& context, const DataFlags& flags) {
  ModelEvalOptions options;
  options.mode = flags.mode;
  options.latents = flags.latents;
  options.batch_size = flags.batch_size;
  options.max_new_tokens = flags.max_new_tokens;
  return evaluate_with_settings(model, *context.tokenizer, context.special, context.settings, context.examples, options).accuracy;
}

LayerScore layer_score_flag(const std::string& name) {
  try {
    return layer_score_from_name(name);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("--metric must be angular, bi or ablation, got '" + name + "'");
  }
}

// The metric layer ablation measures: "loss" (mean loss on the batches) or "accuracy".
std::function<double(Llama&)> ablation_metric(const ScoringData& context, const DataFlags& flags, const std::string& name) {
  if (name == "loss") return [&context](Llama& model) { return mean_loss(model, context.batches, context.device); };
  if (name == "accuracy") {
    if (context.plain_text) throw std::invalid_argument(flags.data + ": plain text has no answers; ablate by --ablation-metric loss");
    return [&context, &flags](Llama& model) { return accuracy_of(model, context, flags); };
  }
  throw std::invalid_argument("--ablation-metric must be loss or accuracy, got '" + name + "'");
}

void add_data_flags(CLI::App& app, DataFlags& flags, bool data_required) {
  app.add_option("--model", flags.model, "HF model folder (tokenizer.json and coconut.json beside the weights)")->required();
  auto data = app.add_option("--data", flags.data,
                             "dataset the scores are measured on: reasoning examples (.json, .jsonl, .txt) or plain text "
                             "(.txt documents separated by blank lines, .jsonl with a 'text' field)");
  if (data_required) data->required();
  app.add_option("--mode", flags.mode, "sequence layout (default: the mode the model was trained in)");
  app.add_option("--latents", flags.latents, "Coconut: continuous thoughts per example (default: the trained stage's)")
      ->check(in_range(0, 4096));
  app.add_option("--samples", flags.samples, "examples (or windows of plain text) to measure on (0 = all)")->capture_default_str()
      ->check(in_range(0, 1e9));
  app.add_option("--window", flags.window, "plain text: tokens a window (default: the model's context, at most 1024)")
      ->check(in_range(2, 1e6));
  app.add_option("--batch-size", flags.batch_size, "examples per forward pass")->capture_default_str()
      ->check(in_range(1, 4096));
  app.add_option("--max-new-tokens", flags.max_new_tokens, "decoding limit of accuracy scores")->capture_default_str()
      ->check(in_range(1, kMaxTokensFlag));
  app.add_option("--dtype", flags.dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_option("--device", flags.device, "cpu | cuda | auto")->capture_default_str();
  app.add_flag("--force", flags.force, "replace --out (and --plot) even when not a regular file / an earlier model folder");
}

// "runs/x/final" -> "x/final"; "models/y" -> "y".
std::string model_name(const std::string& directory) {
  auto path = fs::path(directory).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  const std::string name = path.filename().string();
  const bool generic = name == "final" || name.rfind("checkpoint-", 0) == 0;
  return generic && path.has_parent_path() ? path.parent_path().filename().string() + "/" + name : name;
}

std::string format_score(double value) { return std::isnan(value) ? "" : fmt::format("{:.6g}", value); }

void plot_per_layer(const std::vector<BlockScore>& scores, const std::string& png, const std::string& title,
                    const std::string& ylabel, double baseline) {
  Figure figure{title, "first layer of the removed block", ylabel};
  std::map<int64_t, PlotSeries> by_size;
  for (const auto& score : scores) {
    auto& series = by_size[score.size];
    series.title = std::to_string(score.size) + (score.size == 1 ? " layer" : " layers");
    series.points.push_back({static_cast<double>(score.start), score.score});
  }
  for (auto& [size, series] : by_size) figure.series.push_back(std::move(series));
  if (!std::isnan(baseline)) {
    figure.baseline = baseline;
    figure.baseline_title = "unpruned";
  }
  plot_figure(figure, png);
}

// ---------------------------------------------------------------------------------------------
// score-layers

struct LayerFlags {
  DataFlags data;
  std::string metric = "angular", ablation_metric = "loss", positions = "last", out, plot;
  int64_t block = 1;
  bool all_blocks = false;
};

int run_score_layers(const LayerFlags& flags) {
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.data.force);
  check_output_path(flags.plot, OutputKind::kFile, "--plot", flags.data.force);
  const LayerScore score = layer_score_flag(flags.metric);
  auto context = load_context(flags.data, true);
  const int64_t layers = context.model->config().num_hidden_layers;
  std::vector<int64_t> sizes;
  if (flags.all_blocks)
    for (int64_t n = 1; n < layers; ++n) sizes.push_back(n);
  else
    sizes.push_back(flags.block);
  for (int64_t n : sizes)
    if (n < 1 || n >= layers) throw std::invalid_argument("--block must be in 1.." + std::to_string(layers - 1));
  const auto positions = score_positions_from_name(flags.positions);

  LayerScoreRequest request;
  request.scores = {score};
  request.positions = positions;
  request.ablation_sizes = sizes;
  request.device = context.device;
  std::string score_name = flags.metric;
  if (score == LayerScore::kAblation) {
    score_name = "ablation_" + flags.ablation_metric;
    request.ablation_metric = ablation_metric(context, flags.data, flags.ablation_metric);
    request.ablation_higher_is_better = flags.ablation_metric == "accuracy";
    request.on_ablated_block = [](const BlockScore& block) {
      fmt::print("  layers {}..{}: {}\n", block.start, block.start + block.size - 1, format_score(block.score));
    };
  }
  const LayerScores measured = measure_layer_scores(context.model, context.batches, request);
  std::vector<BlockScore> scores;
  const double baseline = measured.ablation_baseline;
  switch (score) {
    case LayerScore::kAngular: scores = blocks_from_angular(measured.angular, sizes); break;
    case LayerScore::kBlockInfluence:
      for (int64_t l = 0; l < layers; ++l) scores.push_back({l, 1, measured.influence[l].item<double>()});
      break;
    case LayerScore::kAblation:
      scores = measured.ablation;
      fmt::print("unpruned {}: {:.4f}\n", flags.ablation_metric, baseline);
      break;
  }

  std::ostringstream csv;
  csv << "metric,positions,start_layer,block_size,score,baseline\n";
  for (const auto& s : scores)
    csv << score_name << "," << flags.positions << "," << s.start << "," << s.size << "," << format_score(s.score) << ","
        << format_score(baseline) << "\n";
  fmt::print("{}", csv.str());
  if (!flags.out.empty()) write_file_atomically(flags.out, csv.str());
  if (!flags.plot.empty()) {
    const std::string where = flags.positions == "latents" ? "latent thoughts" : "last token";
    if (score == LayerScore::kAngular)
      plot_heatmap(tensor_rows(measured.angular), flags.plot, "angular distance d(x_l, x_l+n) at the " + where + " (" + model_name(flags.data.model) + ")",
                   "first layer l", "block size n", 1, "distance");
    else
      plot_per_layer(scores, flags.plot, score_name + " per layer (" + model_name(flags.data.model) + ")", score_name, baseline);
    fmt::print("plot: {}\n", flags.plot);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// score-heads

struct HeadFlags {
  DataFlags data;
  std::string metric = "grad", out, plot;
};

// [L, H_max] or [L, G_max] scores -> CSV rows for the units each layer has.
void append_head_rows(std::ostringstream& csv, const std::string& metric, const std::string& granularity,
                      const torch::Tensor& values, const LlamaConfig& config) {
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const int64_t units = granularity == "query" ? config.heads(l) : config.kv_heads(l);
    for (int64_t u = 0; u < units; ++u)
      csv << metric << "," << granularity << "," << l << "," << u << "," << format_score(values[l][u].item<double>()) << "\n";
  }
}

int run_score_heads(const HeadFlags& flags) {
  check_output_path(flags.out, OutputKind::kFile, "--out", flags.data.force);
  check_output_path(flags.plot, OutputKind::kFile, "--plot", flags.data.force);
  auto context = load_context(flags.data, true);
  const auto& config = context.model->config();
  const auto scores = measure_head_scores(context.model, context.batches, context.device, flags.metric);
  if (!std::isnan(scores.baseline)) fmt::print("unpruned loss: {:.4f}\n", scores.baseline);
  const std::string name = flags.metric == "grad" ? "grad_importance" : "ablation_loss_increase";
  std::ostringstream csv;
  csv << "metric,granularity,layer,index,score\n";
  append_head_rows(csv, name, "query", scores.query, config);
  append_head_rows(csv, name, "kv-group", scores.groups, config);
  fmt::print("{}", csv.str());
  if (!flags.out.empty()) write_file_atomically(flags.out, csv.str());
  if (!flags.plot.empty()) {
    auto cells = scores.query.clone();  // [L, H_max]
    for (int64_t l = 0; l < config.num_hidden_layers; ++l)
      if (config.heads(l) < cells.size(1)) cells[l].narrow(0, config.heads(l), cells.size(1) - config.heads(l)).fill_(std::nan(""));
    plot_heatmap(tensor_rows(cells), flags.plot, name + " per query head (" + model_name(flags.data.model) + ")", "query head",
                 "layer", 0, name);
    fmt::print("plot: {}\n", flags.plot);
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// prune

struct PruneFlags {
  DataFlags data;
  std::string out, drop_layers, drop_heads, drop_groups, metric = "angular", ablation_metric = "loss",
                                                        positions = "last", granularity = "query", head_metric = "grad",
                                                        channel_metric = "activation";
  int64_t drop_block = 0, context_length = 256, mlp_width = 0;
  double head_fraction = 0, mlp_flops_ratio = 0;
};

std::string describe_heads(const HeadSelection& heads) {
  std::vector<std::string> items;
  for (const auto& [layer, removed] : heads)
    for (int64_t head : removed) items.push_back(fmt::format("{}:{}", layer, head));
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) text += (i ? "," : "") + items[i];
  return text;
}

int run_prune(const PruneFlags& flags) {
  // A model folder made earlier (config.json) is replaced; any other existing path is not ours.
  check_output_path(flags.out, OutputKind::kFolder, "--out", flags.data.force, "config.json");
  const int width_choices = (flags.mlp_width > 0) + (flags.mlp_flops_ratio > 0);
  const bool scores_needed = flags.drop_block > 0 || flags.head_fraction > 0 || width_choices > 0;
  const int choices = !flags.drop_layers.empty() + (flags.drop_block > 0);
  const int head_choices = !flags.drop_heads.empty() + !flags.drop_groups.empty() + (flags.head_fraction > 0);
  if (choices > 1) throw std::invalid_argument("give --drop-layers or --drop-block, not both");
  if (head_choices > 1) throw std::invalid_argument("give one of --drop-heads, --drop-groups, --head-fraction");
  if (width_choices > 1) throw std::invalid_argument("give --mlp-width or --mlp-flops-ratio, not both");
  if (choices + head_choices + width_choices == 0)
    throw std::invalid_argument("nothing to prune: give --drop-layers, --drop-block, --drop-heads, --drop-groups, "
                                "--head-fraction, --mlp-width or --mlp-flops-ratio");
  auto context = load_context(flags.data, scores_needed);
  const LlamaConfig original = context.model->config();

  PruneRequest request;
  if (!flags.drop_heads.empty()) request.heads = parse_layer_index_pairs(flags.drop_heads);
  if (!flags.drop_groups.empty()) request.heads = heads_of_groups(original, parse_layer_index_pairs(flags.drop_groups));
  if (!flags.drop_layers.empty()) request.layers = parse_index_list(flags.drop_layers);
  request.head_fraction = flags.head_fraction;
  request.head_granularity = flags.granularity;
  request.head_metric = flags.head_metric;
  request.drop_block = flags.drop_block;
  request.mlp_width = flags.mlp_width;
  request.mlp_flops_ratio = flags.mlp_flops_ratio;
  request.flops_context = flags.context_length;
  request.channel_metric = flags.channel_metric;
  if (flags.drop_block > 0) {
    const LayerScore score = layer_score_flag(flags.metric);
    request.layer_score.scores = {score};
    request.layer_score.positions = score_positions_from_name(flags.positions);
    if (score == LayerScore::kAblation) {
      request.layer_score.ablation_metric = ablation_metric(context, flags.data, flags.ablation_metric);
      request.layer_score.ablation_higher_is_better = flags.ablation_metric == "accuracy";
    }
  }
  const PruneResult pruning = prune_model(context, request);
  for (const auto& note : pruning.notes) fmt::print("note: {}\n", note);
  Llama pruned = pruning.model;
  const auto& layers = pruning.layers;
  const auto& heads = pruning.heads;
  const LlamaConfig& result = pruned->config();
  BasePruning channels;
  channels.mlp_channels = pruning.mlp_channels;
  int64_t channels_removed = 0;
  for (const auto& [layer, removed] : pruning.mlp_channels) channels_removed += static_cast<int64_t>(removed.size());

  save_derived_model(pruned, flags.data.model, flags.out);

  const auto before = count_parameters(original), after = count_parameters(result);
  const double flops_before = flops_per_token(original, flags.context_length).total(),
               flops_after = flops_per_token(result, flags.context_length).total();
  const auto kv_before = kv_cache_bytes_per_token(original), kv_after = kv_cache_bytes_per_token(result);
  std::string removed_layers;
  for (int64_t l : layers) removed_layers += (removed_layers.empty() ? "" : ",") + std::to_string(l);
  nlohmann::json report = {
      {"source", flags.data.model},
      {"dropped_layers", std::vector<int64_t>(layers.begin(), layers.end())},
      {"dropped_heads", describe_heads(heads)},
      {"uniform", result.is_uniform()},
      {"parameters", {{"before", before.total}, {"after", after.total}, {"removed", before.total - after.total}}},
      {"flops_per_token", {{"context", flags.context_length}, {"before", flops_before}, {"after", flops_after},
                           {"ratio", flops_after / flops_before}}},
      {"kv_cache_bytes_per_token", {{"before", kv_before}, {"after", kv_after}}}};
  if (!channels.empty()) {
    write_base_pruning(report, channels);  // "dropped_mlp_channels": {"layer": [channels of the source]}
    report["mlp_channel_metric"] = flags.channel_metric;
  }
  write_file_atomically((fs::path(flags.out) / "pruning.json").string(), report.dump(2) + "\n");
  fmt::print("pruned {} -> {}\n", flags.data.model, flags.out);
  if (!layers.empty()) fmt::print("  layers removed: {} ({} -> {} layers)\n", removed_layers, original.num_hidden_layers,
                                  result.num_hidden_layers);
  if (!heads.empty()) fmt::print("  query heads removed: {} ({})\n", describe_heads(heads),
                                 result.is_uniform() ? "uniform result" : "per-layer head counts in config.json");
  if (channels_removed > 0) {
    fmt::print("  MLP channels removed: {} of {} by {} ({})\n", channels_removed, original.mlp_channels(), flags.channel_metric,
               result.is_uniform() ? "uniform result, intermediate_size " + std::to_string(result.intermediate_size)
                                   : "per-layer widths in config.json");
  }
  fmt::print("  parameters: {} -> {} ({:+d}, {:.2f}%)\n", before.total, after.total, after.total - before.total,
             100.0 * static_cast<double>(after.total - before.total) / static_cast<double>(before.total));
  fmt::print("  FLOPs per token at context {}: {:.0f} -> {:.0f} (x{:.4f})\n", flags.context_length, flops_before,
             flops_after, flops_after / flops_before);
  fmt::print("  KV cache per token: {} -> {} bytes\n", kv_before, kv_after);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// expand

struct ExpandFlags {
  std::string model, out, dtype;
  std::vector<int64_t> after;
  bool force = false;
};

int run_expand(const ExpandFlags& flags) {
  check_output_path(flags.out, OutputKind::kFolder, "--out", flags.force, "config.json");
  Llama model = load_model(flags.model, parse_optional_dtype(flags.dtype));
  Llama expanded = expand_layers(model, flags.after);
  save_derived_model(expanded, flags.model, flags.out);
  const auto before = count_parameters(model->config()), after = count_parameters(expanded->config());
  const nlohmann::json report = {{"source", flags.model},
                                 {"copied_after", flags.after},
                                 {"layers", {{"before", model->config().num_hidden_layers},
                                             {"after", expanded->config().num_hidden_layers}}},
                                 {"parameters", {{"before", before.total}, {"after", after.total}}}};
  write_file_atomically((fs::path(flags.out) / "expansion.json").string(), report.dump(2) + "\n");
  fmt::print("expanded {} -> {}: {} -> {} layers, {} -> {} parameters; the copies' output projections are zero, "
             "so it computes what the original does until trained\n",
             flags.model, flags.out, model->config().num_hidden_layers, expanded->config().num_hidden_layers,
             before.total, after.total);
  return 0;
}

const bool registered_layers = register_command({"score-layers", "redundancy of layers and blocks: angular distance, block influence, ablation",
                                                 [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<LayerFlags>();
  add_data_flags(app, flags->data, true);
  app.add_option("--metric", flags->metric, "angular | bi | ablation")->capture_default_str();
  app.add_option("--ablation-metric", flags->ablation_metric, "ablation: loss | accuracy")->capture_default_str();
  app.add_option("--positions", flags->positions, "angular: last (token) | latents (the continuous thoughts)")->capture_default_str();
  app.add_option("--block", flags->block, "block size n (layers removed together)")->capture_default_str()
      ->check(in_range(1, 1e6));
  app.add_flag("--all-blocks", flags->all_blocks, "every block size 1..L-1");
  app.add_option("--out", flags->out, "scores CSV");
  app.add_option("--plot", flags->plot, "PNG: the heatmap (angular) or score per layer");
  return [flags] { return run_score_layers(*flags); };
}});

const bool registered_heads = register_command({"score-heads", "importance of attention heads: gradient of head masks (Michel et al.) or ablation",
                                                [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<HeadFlags>();
  add_data_flags(app, flags->data, true);
  flags->data.batch_size = 1;
  app.add_option("--metric", flags->metric, "grad | ablation")->capture_default_str();
  app.add_option("--out", flags->out, "scores CSV (query heads and KV groups)");
  app.add_option("--plot", flags->plot, "PNG heatmap layer x head");
  return [flags] { return run_score_heads(*flags); };
}});

const bool registered_prune = register_command({"prune", "remove layers, attention heads and/or MLP channels into a smaller HF folder",
                                                [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<PruneFlags>();
  add_data_flags(app, flags->data, false);
  app.add_option("--out", flags->out, "output HF folder")->required();
  app.add_option("--drop-layers", flags->drop_layers, "layers to remove, e.g. 5,6,7");
  app.add_option("--drop-block", flags->drop_block, "remove the best block of N layers by --metric (needs --data)")
      ->check(in_range(1, 1e6));
  app.add_option("--metric", flags->metric, "layer score: angular | bi | ablation")->capture_default_str();
  app.add_option("--ablation-metric", flags->ablation_metric, "loss | accuracy")->capture_default_str();
  app.add_option("--positions", flags->positions, "angular: last | latents")->capture_default_str();
  app.add_option("--drop-heads", flags->drop_heads, "query heads to remove as layer:head, e.g. 3:0,3:5");
  app.add_option("--drop-groups", flags->drop_groups, "KV groups to remove (with their query heads) as layer:group");
  app.add_option("--head-fraction", flags->head_fraction, "remove this fraction of all query heads, least important first (needs --data)")
      ->check(in_range(0, 0.99));
  app.add_option("--granularity", flags->granularity, "query | kv-group")->capture_default_str();
  app.add_option("--head-metric", flags->head_metric, "grad | ablation")->capture_default_str();
  app.add_option("--mlp-width", flags->mlp_width, "cut every layer's MLP to its N most important channels (needs --data)")
      ->check(in_range(1, 1e9));
  app.add_option("--mlp-flops-ratio", flags->mlp_flops_ratio,
                 "cut every layer's MLP to the widest width whose FLOPs per token at --context are at most this fraction "
                 "of the model's (needs --data)")
      ->check(in_range(1e-6, 1));
  app.add_option("--channel-metric", flags->channel_metric,
                 "MLP channel importance: activation (Minitron) | wanda (Wanda-sp) | taylor (first-order loss change)")->capture_default_str();
  app.add_option("--context", flags->context_length, "context length of the printed FLOPs per token (and of --mlp-flops-ratio)")->capture_default_str()
      ->check(in_range(1, 16 * kMaxTokensFlag));
  return [flags] { return run_prune(*flags); };
}});

const bool registered_expand = register_command({"expand", "insert zero-output copies of layers into a deeper HF folder that computes the same function (LLaMA Pro), to train on",
                                                 [](CLI::App& app) -> std::function<int()> {
  auto flags = std::make_shared<ExpandFlags>();
  app.add_option("--model", flags->model, "HF model folder (tokenizer.json and coconut.json are carried over)")->required();
  app.add_option("--out", flags->out, "output HF folder")->required();
  app.add_option("--after", flags->after, "layers to insert a copy after, e.g. 0,1 (a layer listed twice gets two)")
      ->required()->delimiter(',');
  app.add_option("--dtype", flags->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's)");
  app.add_flag("--force", flags->force, "replace --out even when it is not an earlier model folder");
  return [flags] { return run_expand(*flags); };
}});

}  // namespace
}  // namespace coconut::cli
