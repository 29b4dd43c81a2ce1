#include "recipes/train.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "data/example.h"
#include "data/prosqa.h"
#include "data/text_documents.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/adamw.h"
#include "model/autocast.h"
#include "model/depth_router.h"
#include "model/device.h"
#include "model/lora.h"
#include "model/vocabulary.h"
#include "reasoning/curriculum.h"
#include "reasoning/evaluate.h"
#include "reasoning/training_loss.h"
#include "reasoning/special_tokens.h"
#include "recipes/checkpoints.h"
#include "recipes/step_paths.h"
#include "text/hf_tokenizer.h"
#include "util/atomic_file.h"

namespace coconut {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Setup

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The first `limit` examples (0 = all).
void keep_first(std::vector<Example>& examples, int64_t limit) {
  if (limit > 0 && static_cast<size_t>(limit) < examples.size()) examples.resize(static_cast<size_t>(limit));
}

// A dataset for training: reasoning examples, or in mode lm the documents of a plain text (each
// one Example whose question is the document).
std::vector<Example> load_training_data(const std::string& path, bool lm) {
  if (!lm) return load_dataset(path);
  if (!is_plain_text_dataset(path))
    throw std::invalid_argument(path + ": mode lm reads plain text (a .txt of documents separated by blank lines, or JSONL "
                                "with a 'text' field); this file holds reasoning examples");
  std::vector<Example> documents;
  for (auto& text : load_text_documents(path)) {
    Example document;
    document.question = std::move(text);
    documents.push_back(std::move(document));
  }
  return documents;
}

std::vector<Example> load_limited(const std::string& path, int64_t limit, bool lm) {
  auto examples = load_training_data(path, lm);
  keep_first(examples, limit);
  return examples;
}

// Mode lm: the documents packed into windows (data/text_documents.h).
std::vector<TokenizedExample> document_windows(const std::vector<Example>& documents, const Tokenizer& tokenizer, int64_t eos,
                                               int64_t window) {
  std::vector<std::string> texts;
  texts.reserve(documents.size());
  for (const auto& document : documents) texts.push_back(document.question);
  return text_windows(texts, tokenizer, eos, window);
}

// A word-level vocabulary over everything the model must read or write in the training set:
// `reasoning` examples (with the reasoning markers and "### " answers), or documents (mode lm).
std::unique_ptr<HfTokenizer> word_level_tokenizer_for(const std::vector<Example>& examples, bool word_forms,
                                                      const std::string& negation, const std::string& articles, bool reasoning) {
  std::vector<std::string> texts;
  for (const auto& example : examples) {
    texts.push_back(example.question);
    for (const auto& step : example.steps) texts.push_back(step);
    if (reasoning) texts.push_back("### " + example.answer);
  }
  std::vector<std::string> specials = {"<pad>", "<unk>", "<s>", "</s>"};
  if (reasoning)
    for (const auto& marker : reasoning_marker_tokens()) specials.push_back(marker);
  WordModifiers modifiers;
  if (negation == "postfix") modifiers.postfix = {"not"};
  if (negation == "fused") modifiers.fused = {"not"};
  if (negation == "fused_marked") modifiers.postfix = modifiers.fused = {"not"};
  if (articles == "joined" || articles == "joined_postfix") modifiers.joined = {"a", "an"};
  if (articles == "joined_postfix") modifiers.postfix.insert(modifiers.postfix.end(), {"a", "an"});
  return build_word_level_tokenizer(texts, specials, "<unk>", word_forms, modifiers);
}

// What a LoRA run's adapter/ is an adapter of: `load_model_path`, or, when that is a folder
// `coconut prune` made by removing whole layers and/or MLP channels only (its pruning.json), the
// unpruned source with what went named (CheckpointWriter::export_adapters), so the adapter ships
// small and loads over the model people have.
struct AdapterBase {
  std::string model;
  BasePruning pruning;
};
AdapterBase adapter_base(const std::string& load_model_path) {
  const fs::path report = fs::path(load_model_path) / "pruning.json";
  if (load_model_path.empty() || !fs::exists(report)) return {load_model_path, {}};
  const json pruning = read_json_file(report.string());
  const BasePruning removed = base_pruning_from_json(pruning, report.string());
  const bool heads_dropped = !pruning.value("dropped_heads", std::string()).empty();
  if (removed.empty() || heads_dropped || !pruning.contains("source") || !pruning["source"].is_string())
    return {load_model_path, {}};
  return {pruning["source"].get<std::string>(), removed};
}

struct Setup {
  std::unique_ptr<HfTokenizer> tokenizer;
  Llama model{nullptr};
  SpecialTokenIds special;
  std::vector<int64_t> new_marker_ids;  // markers this run added or renamed (a loaded model lacked them)
};

}  // namespace

torch::Tensor stochastic_depth_keep(int64_t rows, int64_t layers, const TrainConfig& config, torch::Device device) {
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto keep = torch::ones({rows, layers}, options.dtype(torch::kBool));  // [B, L]
  if (config.layer_drop > 0) {
    const double rate = config.layer_drop;
    auto rates = config.layer_drop_schedule == "flat"
                     ? torch::full({layers}, rate, options)
                     : torch::arange(layers, options) * (rate / static_cast<double>(std::max<int64_t>(layers - 1, 1)));  // [L]
    rates[0] = 0;
    keep = torch::rand({rows, layers}, options) >= rates.view({1, layers});
  }
  if (config.prefix_drop > 0 && layers > 1) {
    const int64_t shallowest = config.prefix_min_layers > 0 ? std::min(config.prefix_min_layers, layers - 1) : (layers + 1) / 2;
    const auto index_options = options.dtype(torch::kInt64);
    auto depth = torch::randint(shallowest, layers, {rows}, index_options);                      // [B] in [min, L - 1]
    auto shallow = torch::rand({rows}, options) < config.prefix_drop;                             // [B]
    depth = torch::where(shallow, depth, torch::full_like(depth, layers));
    keep = keep.logical_and(torch::arange(layers, index_options).view({1, layers}) < depth.view({rows, 1}));  // [B, L]
  }
  if (config.nested_drop > 0 && !config.nested_drop_order.empty()) {
    const auto count = static_cast<int64_t>(config.nested_drop_order.size());
    std::vector<int64_t> rank(static_cast<size_t>(layers), count + 1);  // a layer's place in the order (1-based); past it: kept
    for (int64_t i = 0; i < count; ++i) {
      const int64_t layer = config.nested_drop_order[static_cast<size_t>(i)];
      if (layer >= layers)
        throw std::invalid_argument("nested_drop_order: layer " + std::to_string(layer) + " of a model of " + std::to_string(layers) +
                                    " layers");
      rank[static_cast<size_t>(layer)] = i + 1;
    }
    const auto index_options = options.dtype(torch::kInt64);
    auto dropped = torch::randint(1, count + 1, {rows}, index_options);                       // [B]: k in [1, count]
    dropped = torch::where(torch::rand({rows}, options) < config.nested_drop, dropped, torch::zeros_like(dropped));
    const auto ranks = torch::tensor(rank, torch::kInt64).to(device).view({1, layers});          // [1, L]
    keep = keep.logical_and(ranks > dropped.view({rows, 1}));                                      // [B, L]
  }
  return keep;
}

namespace {

// Seeds the device's default generator for one micro-batch from the run's seed and the
// micro-batch's place in the plan (splitmix64 of each in turn). What a step draws from it (the depth
// router's noise) is then the same on every run and after a resume, whatever else in the process
// drew from it before.
void seed_micro_batch_draws(torch::Device device, uint64_t seed, int64_t epoch, int64_t micro_batch) {
  const auto mix = [](uint64_t value) {
    value += 0x9E3779B97F4A7C15ULL;
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ULL;
    value = (value ^ (value >> 27)) * 0x94D049BB133111EBULL;
    return value ^ (value >> 31);
  };
  const uint64_t derived = mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(micro_batch));
  auto generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(derived);
}

// negation_offset_init: "not~X" = "X" + n for every fused token whose word is in the vocabulary,
// n one seeded vector of standard deviation `scale` (shared by all of them).
void offset_negated_embeddings(const TrainConfig& config, const Tokenizer& tokenizer, Llama& model, double scale) {
  torch::NoGradGuard no_grad;
  auto table = model->embed_tokens->weight;  // [V, D]
  const auto generator = at::detail::createCPUGenerator(config.seed * 2654435761ULL + 97);
  const auto offset = at::normal(0.0, scale, {table.size(1)}, generator).to(table.options());  // [D]
  const std::string prefix = "not~";
  for (int64_t id = 0; id < table.size(0); ++id) {
    const auto token = tokenizer.id_to_token(id);
    if (!token || token->rfind(prefix, 0) != 0) continue;
    if (const auto word = tokenizer.token_to_id(token->substr(prefix.size()))) table[id].copy_(table[*word] + offset);
  }
}

// A new model; `add_markers`: with the reasoning markers in its vocabulary (every mode but lm).
Setup fresh_setup(const TrainConfig& config, const std::vector<Example>& train_set, torch::Device device, bool add_markers) {
  Setup setup;
  setup.tokenizer = config.tokenizer.empty()
                        ? word_level_tokenizer_for(train_set, config.word_forms, config.negation, config.articles, add_markers)
                        : HfTokenizer::load(config.tokenizer);
  if (add_markers) setup.tokenizer->add_special_tokens(reasoning_marker_tokens());
  json fields = config.init.empty() ? config.model : read_json_file(config.init);
  const std::string source = config.init.empty() ? config.source + ": model" : config.init;
  fields["vocab_size"] = setup.tokenizer->vocab_size();
  if (auto bos = setup.tokenizer->token_to_id("<s>"); bos && !fields.contains("bos_token_id")) fields["bos_token_id"] = *bos;
  if (auto eos = setup.tokenizer->token_to_id("</s>"); eos && !fields.contains("eos_token_id")) fields["eos_token_id"] = *eos;
  fields["torch_dtype"] = "float32";
  LlamaConfig model_config = config_from_json(fields, source);
  setup.model = Llama(model_config);
  initialize_weights(setup.model, config.init_std, config.seed);
  if (config.negation_offset_init) offset_negated_embeddings(config, *setup.tokenizer, setup.model, config.init_std);
  setup.model->to(device);
  return setup;
}

Setup checkpoint_setup(const TrainConfig& config, const std::string& directory, torch::Device device, bool add_markers) {
  Setup setup;
  const std::string tokenizer_path = !config.tokenizer.empty() && add_markers ? config.tokenizer : directory + "/tokenizer.json";
  if (!fs::exists(tokenizer_path)) throw std::invalid_argument(tokenizer_path + ": not found (the model needs its tokenizer)");
  setup.tokenizer = HfTokenizer::load(tokenizer_path);
  setup.model = load_model(directory, torch::kFloat32, device);
  if (add_markers) {
    const int64_t before = setup.tokenizer->vocab_size();
    std::vector<std::string> missing;
    for (const auto& marker : reasoning_marker_tokens())
      if (!setup.tokenizer->token_to_id(marker)) missing.push_back(marker);
    // marker_tokens: existing tokens renamed to the markers (those the tokenizer lacks).
    for (size_t i = 0; i < config.marker_tokens.size(); ++i) {
      const std::string marker = reasoning_marker_tokens()[i];
      if (setup.tokenizer->token_to_id(marker)) continue;  // a model trained here before has it
      try {
        setup.tokenizer->rename_added_token(config.marker_tokens[i], marker);
      } catch (const std::invalid_argument& error) {
        throw std::invalid_argument(config.source + ": key 'marker_tokens': " + tokenizer_path + ": " + error.what());
      }
    }
    setup.tokenizer->add_special_tokens(reasoning_marker_tokens());
    const int64_t added = setup.tokenizer->vocab_size() - setup.model->config().vocab_size;
    if (added < 0) throw std::invalid_argument(tokenizer_path + ": the tokenizer has fewer tokens than the model's vocabulary");
    if (added > 0) {
      int64_t init_id = setup.model->config().eos_token_ids.empty() ? 0 : setup.model->config().eos_token_ids.front();
      if (!config.new_token_init.empty()) {
        const auto ids = setup.tokenizer->encode(config.new_token_init);
        if (ids.empty()) throw std::invalid_argument(config.source + ": key 'new_token_init': encodes to no token");
        init_id = ids.front();
      }
      (void)before;
      setup.model = grow_vocabulary(setup.model, std::vector<int64_t>(static_cast<size_t>(added), init_id));
    }
    for (const auto& marker : missing) setup.new_marker_ids.push_back(*setup.tokenizer->token_to_id(marker));
  }
  return setup;
}

// init_adapter: the attached adapters and the trained rows take a PEFT adapter's values; its rank,
// scale, projections and rows must be this run's.
void start_from_adapter(Llama& model, const PeftAdapter& adapter, const std::vector<int64_t>& rows, const TrainConfig& config) {
  const std::string where = config.source + ": key 'init_adapter': " + config.init_adapter;
  if (adapter.rank != config.lora_rank || adapter.scale() != config.lora_alpha / static_cast<double>(config.lora_rank))
    throw std::invalid_argument(where + " has rank " + std::to_string(adapter.rank) + " and scale " + std::to_string(adapter.scale()) +
                                "; this run has lora_rank " + std::to_string(config.lora_rank) + " and lora_alpha " +
                                std::to_string(config.lora_alpha));
  if (adapter.token_indices != rows)
    throw std::invalid_argument(where + ": its trainable tokens are not this run's new markers (another tokenizer or marker_tokens?)");
  load_lora_state(model, adapter.lora, where);
  if (!rows.empty()) set_token_rows(model, rows, adapter.token_rows);
}

// ---------------------------------------------------------------------------------------------
// What the thoughts feed back (TrainConfig::latent_thought_input, when given) and their scale
// (TrainConfig::latent_thought_rms): "auto" measures the token embeddings' mean RMS unless the
// model already has a scale (a resumed or continued Coconut run).
void apply_thought_settings(const TrainConfig& config, Llama& model) {
  if (!config.latent_thought_input.empty()) model->set_latent_thought_input(config.latent_thought_input);
  if (config.latent_thought_rms == TrainConfig::kAutoThoughtRms) {
    if (model->config().latent_thought_rms > 0) return;
    torch::NoGradGuard no_grad;
    const auto rows = model->embed_tokens->weight.to(torch::kFloat32);       // [V, D]
    const double rms = rows.pow(2).mean(1).sqrt().mean().item<double>();  // mean over rows of rms(row)
    model->set_latent_thought_rms(rms);
  } else if (config.latent_thought_rms > 0) {
    model->set_latent_thought_rms(config.latent_thought_rms);
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer and schedule

// One group for the model's trainable parameters (all of them, or only the LoRA adapters), one for
// the embedding table when a LoRA run trains some of its rows (no weight decay: the frozen rows then
// stay exact), and one for the depth router's gates (learning rate x router_lr_scale, no weight
// decay), last.
std::unique_ptr<torch::optim::AdamW> make_optimizer(Llama& model, const TrainConfig& config) {
  torch::optim::AdamWOptions options(config.lr);
  options.betas({config.beta1, config.beta2}).eps(config.eps).weight_decay(config.weight_decay);
  std::set<const void*> gates;
  std::vector<torch::Tensor> router;
  for (const auto& parameter : depth_router_parameters(model))
    if (parameter.requires_grad()) router.push_back(parameter), gates.insert(parameter.unsafeGetTensorImpl());
  const auto& table = model->embed_tokens->weight;
  const bool token_rows = has_lora(model) && table.requires_grad();  // train_token_rows
  std::vector<torch::Tensor> trainable;
  for (const auto& parameter : model->parameters())
    if (parameter.requires_grad() && !gates.count(parameter.unsafeGetTensorImpl()) &&
        !(token_rows && parameter.is_same(table)))
      trainable.push_back(parameter);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!trainable.empty()) groups.emplace_back(trainable, std::make_unique<torch::optim::AdamWOptions>(options));
  if (token_rows) {
    auto rows_options = std::make_unique<torch::optim::AdamWOptions>(options);
    rows_options->weight_decay(0.0);
    groups.emplace_back(std::vector<torch::Tensor>{table}, std::move(rows_options));
  }
  if (!router.empty()) {
    auto router_options = std::make_unique<torch::optim::AdamWOptions>(options);
    router_options->lr(config.lr * config.router_lr_scale).weight_decay(0.0);
    groups.emplace_back(router, std::move(router_options));
  }
  return std::make_unique<torch::optim::AdamW>(groups, options);
}

double learning_rate(const TrainConfig& config, int64_t step, int64_t total_steps) {
  if (config.warmup_steps > 0 && step < config.warmup_steps)
    return config.lr * static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  if (config.schedule == "constant") return config.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - config.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - config.warmup_steps) / span, 0.0, 1.0);
  return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
}

// The router's group (the last, when the model has trainable gates) runs at lr x router_lr_scale.
void set_learning_rate(torch::optim::AdamW& optimizer, double lr, const TrainConfig& config, bool has_router_group) {
  auto& groups = optimizer.param_groups();
  for (size_t index = 0; index < groups.size(); ++index) {
    const bool router_group = has_router_group && index + 1 == groups.size();
    static_cast<torch::optim::AdamWOptions&>(groups[index].options()).lr(router_group ? lr * config.router_lr_scale : lr);
  }
}

// libtorch's clip_grad_norm_ (norm 2) but for its last line: it returns the total norm as a
// 0-dim tensor on the gradients' device instead of reading it into a double (a host
// synchronisation). The same operations in the same order: the same gradients, bit for bit.
torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm) {
  std::vector<torch::Tensor> gradients, norms;
  for (const auto& parameter : parameters)
    if (parameter.grad().defined()) gradients.push_back(parameter.grad().data());
  if (gradients.empty()) return torch::zeros({}, torch::kFloat64);
  for (const auto& gradient : gradients) norms.push_back(gradient.norm(2));
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  const auto coefficient = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& gradient : gradients) gradient.mul_(coefficient);
  return total;
}

// Real tokens of a planned batch (what its collated attention mask sums to), from the host's plan.
int64_t planned_tokens(const EpochPlan& plan, int64_t batch) {
  int64_t tokens = 0;
  for (size_t index : plan.batches[static_cast<size_t>(batch)].rows) tokens += static_cast<int64_t>(plan.sequences[index].ids.size());
  return tokens;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream out;
  if (total >= 3600) out << total / 3600 << "h";
  if (total >= 60) out << (total % 3600) / 60 << "m";
  out << total % 60 << "s";
  return out.str();
}

// Validation: teacher-forced loss in the current layout and greedy accuracy on a prefix.
json validate(Llama& model, const HfTokenizer& tokenizer, const SpecialTokenIds& special, const TrainConfig& config,
              const std::vector<Example>& val_set, const std::vector<TokenizedExample>& val_tokens, int64_t stage,
              torch::Device device) {
  json record = {{"event", "validation"}, {"stage", stage}};
  torch::NoGradGuard no_grad;
  model->eval();
  const SequenceOptions options = config.sequence_options(stage);
  std::map<int64_t, std::vector<Sequence>> by_latents;
  for (const auto& example : val_tokens) {
    auto sequence = build_sequence(example, options, special);
    by_latents[sequence.latent_count].push_back(std::move(sequence));
  }
  double loss_sum = 0;
  int64_t labelled = 0;
  for (const auto& [latents, sequences] : by_latents)
    for (size_t begin = 0; begin < sequences.size(); begin += static_cast<size_t>(config.eval_batch_size)) {
      const size_t end = std::min(sequences.size(), begin + static_cast<size_t>(config.eval_batch_size));
      std::vector<Sequence> chunk(sequences.begin() + static_cast<long>(begin), sequences.begin() + static_cast<long>(end));
      AutocastScope autocast(config.bf16, device);
      const auto step = training_loss(model, collate(chunk, special.pad), device, false);
      loss_sum += step.loss.item<double>() * static_cast<double>(step.labelled);
      labelled += step.labelled;
    }
  record["val_loss"] = labelled > 0 ? loss_sum / static_cast<double>(labelled) : 0.0;
  record["val_tokens"] = labelled;
  if (config.training_mode() == TrainingMode::kLm) {
    record["val_perplexity"] = std::exp(record["val_loss"].get<double>());
  } else if (config.val_generate_limit > 0) {
    const size_t count = std::min(val_set.size(), static_cast<size_t>(config.val_generate_limit));
    std::vector<Example> subset(val_set.begin(), val_set.begin() + static_cast<long>(count));
    std::vector<int64_t> thoughts;
    for (const auto& example : subset)
      thoughts.push_back(config.uses_stages()
                             ? latent_thoughts_for_stage(stage, static_cast<int64_t>(example.steps.size()), options)
                             : 0);
    EvalOptions eval_options;
    eval_options.mode = config.training_mode();
    eval_options.pause_tokens = config.pause_tokens;
    eval_options.batch_size = config.eval_batch_size;
    eval_options.max_new_tokens = config.max_new_tokens;
    eval_options.latent_bottleneck = options.latent_bottleneck;  // the layout's: the model as it is prompted
    const auto summary = evaluate(model, tokenizer, special, subset, thoughts, eval_options);
    record["accuracy"] = summary.accuracy;
    record["generated_tokens"] = summary.mean_generated_tokens;
    record["latent_thoughts"] = summary.mean_latent_thoughts;
    record["questions"] = summary.questions;
    if (model->config().depth_router) record["mean_layers"] = summary.mean_layers;
  }
  model->train();
  return record;
}

}  // namespace


TrainSummary train(const TrainConfig& config, std::ostream& main_progress) {
  config.validate();
  const auto started = std::chrono::steady_clock::now();
  // Data parallelism when the environment says so (torchrun's variables): rank r takes the
  // epoch's micro-batches r, r + W, r + 2W, ...; gradients are averaged before every optimizer
  // step; rank 0 alone writes the output folder and prints progress.
  const DistributedEnvironment environment = distributed_environment_from_env();
  torch::Device device = device_from_name(config.device, config.source + ": key 'device'");
  if (environment.distributed() && device.is_cuda() && !device.has_index())
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(environment.local_rank));
  std::unique_ptr<ProcessGroup> group;
  if (environment.distributed()) group = std::make_unique<ProcessGroup>(environment, device);
  const int world = environment.world_size, rank = environment.rank;
  const bool is_main = rank == 0;
  std::ostream silent(nullptr);
  std::ostream& progress = is_main ? main_progress : silent;
  const TrainingMode mode = config.training_mode();
  const Curriculum curriculum = config.curriculum();
  const fs::path root = config.resolved_output_dir();
  if (is_main) {
    fs::create_directories(root);
    write_file_atomically((root / "train_config.json").string(), config.to_json().dump(2) + "\n");
  }

  // Data: reasoning examples, or (mode lm) plain-text documents.
  const bool lm = mode == TrainingMode::kLm;
  std::vector<Example> train_set, val_set;
  if (config.val_split > 0) {
    train_set = load_training_data(config.train_path, lm);
    if (static_cast<size_t>(config.val_split) >= train_set.size())
      throw std::runtime_error(config.train_path + ": val_split " + std::to_string(config.val_split) +
                               " leaves no training examples (" + std::to_string(train_set.size()) + " in the file)");
    val_set.assign(train_set.end() - config.val_split, train_set.end());
    train_set.resize(train_set.size() - static_cast<size_t>(config.val_split));
    keep_first(train_set, config.train_limit);
    keep_first(val_set, config.val_limit);
  } else {
    train_set = load_limited(config.train_path, config.train_limit, lm);
    if (!config.val_path.empty()) val_set = load_limited(config.val_path, config.val_limit, lm);
  }

  // Tokenizer and model: the last checkpoint when resuming, else the given checkpoint or a fresh model.
  CheckpointWriter checkpoints(config.resolved_output_dir(), config.keep_checkpoints);
  // A run from a model folder keeps its chat template and generation settings in every folder it writes.
  if (!config.load_model_path.empty()) checkpoints.keep_side_files(config.load_model_path);
  const auto resume_from = config.resume ? checkpoints.last_checkpoint() : std::nullopt;
  // With LoRA a checkpoint holds merged weights, so a resumed LoRA run rebuilds the frozen base from
  // its source and loads the adapters saved beside the checkpoint.
  const bool lora = config.lora_rank > 0;
  Setup setup;
  if (resume_from && !lora) {
    setup = checkpoint_setup(config, resume_from->string(), device, false);
  } else if (!config.load_model_path.empty()) {
    setup = checkpoint_setup(config, config.load_model_path, device, !lm);
    // A trained table gets the offset at the scale of its rows (a resumed LoRA run rebuilds the
    // same frozen base: the offset is seeded).
    if (config.negation_offset_init) {
      const double rms = setup.model->embed_tokens->weight.detach().to(torch::kFloat32).pow(2).mean().sqrt().item<double>();
      offset_negated_embeddings(config, *setup.tokenizer, setup.model, rms);
    }
  } else {
    setup = fresh_setup(config, train_set, device, !lm);
  }
  if (config.depth_router && !setup.model->config().depth_router)
    setup.model = attach_depth_router(setup.model, config.router_init_bias, config.router_first_layer);
  Llama& model = setup.model;
  apply_thought_settings(config, model);
  if (config.router_only) {  // only the gates learn
    for (auto& parameter : model->parameters()) parameter.set_requires_grad(false);
    for (auto& parameter : depth_router_parameters(model)) parameter.set_requires_grad(true);
  }
  ForwardOptions forward_options;  // the depth router's training decisions, when there is one
  forward_options.router_straight_through = config.depth_router;
  forward_options.router_noise = config.router_noise;
  forward_options.checkpoint_layers = config.activation_checkpointing;
  if (lora) {
    LoraOptions options;
    options.rank = config.lora_rank;
    options.alpha = config.lora_alpha;
    options.targets = config.lora_targets;
    attach_lora(model, options, config.seed);
    // Markers new to this run (added or renamed) train their rows too: the base never learned them.
    const std::vector<int64_t>& marker_rows = setup.new_marker_ids;
    if (!marker_rows.empty()) train_token_rows(model, marker_rows);
    const AdapterBase base = adapter_base(config.load_model_path);
    checkpoints.export_adapters(config.lora_alpha, marker_rows, base.model, base.pruning);
    if (resume_from) {
      const std::string adapters = (*resume_from / kAdaptersFile).string();
      if (!fs::exists(adapters))
        throw std::invalid_argument(adapters + ": not found (the checkpoint was not written by a LoRA run with these settings)");
      load_lora_checkpoint(model, adapters, marker_rows);
    } else if (!config.init_adapter.empty()) {
      start_from_adapter(model, read_peft_adapter(config.init_adapter), marker_rows, config);
    }
  }
  // The step's paths that compute the same thing (TrainConfig::last_layer_cut, frozen_base_bf16,
  // chunked_head_loss), as configured or, for the first compare_paths rounds, alternated to measure them.
  const bool lora_bf16 = lora && config.bf16;
  const auto chosen = [](const std::string& value, bool automatic) { return value == "auto" ? automatic : value == "true"; };
  const bool chunkable_loss = config.distill_from.empty();  // a teacher reads the student's logits
  const StepPaths configured_paths{chosen(config.last_layer_cut, cuts_last_layer(device)),
                                   lora_bf16 && chosen(config.frozen_base_bf16, false),
                                   chunkable_loss && chosen(config.chunked_head_loss, false)};
  std::optional<PathComparison> comparison;
  if (config.compare_paths > 0) comparison.emplace(comparison_arms(lora_bf16, chunkable_loss), config.compare_paths);
  FrozenBase frozen_base;
  if (lora_bf16 && (comparison || configured_paths.frozen_base_bf16)) {
    frozen_base = FrozenBase(model);
    if (!comparison) frozen_base.keep_only(true);
  }
  StepPaths paths = configured_paths;
  // Validation and the folders written see the base as configured, whichever arm a comparison is at
  // (the next compared step sets its own again).
  const auto configured_base = [&]() {
    if (comparison && comparison->active()) frozen_base.use(configured_paths.frozen_base_bf16);
  };
  HfTokenizer& tokenizer = *setup.tokenizer;
  const SpecialTokenIds special = find_special_tokens(tokenizer, model->config());
  require_markers(special, mode, config.source);

  // Distillation teacher: frozen, same vocabulary.
  Llama teacher{nullptr};
  if (!config.distill_from.empty()) {
    teacher = load_model(config.distill_from, torch::kFloat32, device);
    teacher->eval();
    for (auto& parameter : teacher->parameters()) parameter.set_requires_grad(false);
    if (teacher->config().vocab_size != model->config().vocab_size)
      throw std::invalid_argument(config.source + ": key 'distill_from': the teacher " + config.distill_from + " has " +
                                  std::to_string(teacher->config().vocab_size) + " tokens, the student " +
                                  std::to_string(model->config().vocab_size) + " (they must share a tokenizer)");
  }

  if (config.thought_reachable_loss > 0 &&
      std::none_of(train_set.begin(), train_set.end(), [](const Example& example) { return prosqa_graph(example).has_value(); }))
    throw std::invalid_argument(config.source + ": key 'thought_reachable_loss': no training example of " + config.train_path +
                                " has a graph (ProsQA's idx_to_symbol, edges and root fields)");
  std::vector<TokenizedExample> train_tokens, val_tokens;
  const int64_t text_window = text_window_or_default(config.text_window, model->config().max_position_embeddings);
  if (lm) {
    train_tokens = document_windows(train_set, tokenizer, special.eos, text_window);
    val_tokens = document_windows(val_set, tokenizer, special.eos, text_window);
    if (train_tokens.empty())
      throw std::invalid_argument(config.train_path + ": the text holds fewer than 2 tokens; nothing to learn");
  } else {
    if (!config.shuffle_facts)  // otherwise every epoch tokenizes its own order of the facts
      for (const auto& example : train_set) train_tokens.push_back(tokenize_example(example, tokenizer, special));
    for (const auto& example : val_set) val_tokens.push_back(tokenize_example(example, tokenizer, special));
  }
  // What the epoch plans: the examples, or the text's windows.
  const auto train_rows = static_cast<int64_t>(lm ? train_tokens.size() : train_set.size());

  TrainerState state;
  std::unique_ptr<torch::optim::AdamW> optimizer = make_optimizer(model, config);
  const auto gates = depth_router_parameters(model);  // after LoRA, which freezes them
  const bool trains_gates = !gates.empty() && gates.front().requires_grad();  // make_optimizer's last group
  const int64_t batches_per_epoch = (train_rows + config.batch_size - 1) / config.batch_size;
  const int64_t groups_per_epoch = (batches_per_epoch + world - 1) / world;  // one micro-batch per rank
  const int64_t steps_per_epoch = (groups_per_epoch + config.gradient_accumulation_steps - 1) / config.gradient_accumulation_steps;
  int64_t total_steps = steps_per_epoch * config.num_epochs;
  if (config.max_steps > 0) total_steps = std::min(total_steps, config.max_steps);

  if (resume_from) {
    const std::string state_path = (*resume_from / kTrainerStateFile).string();
    state = TrainerState::from_json(read_json_file(state_path), state_path);
    state.check_against_schedule(state_path, config.num_epochs, batches_per_epoch, steps_per_epoch);
    const bool sharded = fs::exists(*resume_from / kZeroIndexFile);
    if (sharded != (config.zero_stage == 2))
      throw std::invalid_argument(resume_from->string() + ": its optimizer state was written " +
                                  (sharded ? "sharded (zero_stage: 2)" : "whole (zero_stage: 0)") + "; resume with zero_stage: " +
                                  (sharded ? "2" : "0"));
    const std::string optimizer_path = (*resume_from / kOptimizerFile).string();
    if (!sharded) {  // a sharded state is read once the shards are laid out (below)
      try {
        torch::load(*optimizer, optimizer_path);
      } catch (const c10::Error& error) {
        throw std::invalid_argument(optimizer_path + ": unreadable optimizer state (truncated, or written for other "
                                    "parameters): " + first_line(error.what_without_backtrace()));
      }
    }
    const bool reached_max_steps = config.max_steps > 0 && state.global_step >= config.max_steps;
    if (state.epoch >= config.num_epochs || reached_max_steps) {
      progress << "nothing to do: " << resume_from->string() << " has finished this schedule (epoch " << state.epoch
               << " of " << config.num_epochs << ", step " << state.global_step
               << (config.max_steps > 0 ? " of max_steps " + std::to_string(config.max_steps) : std::string()) << ")\n";
      TrainSummary summary;
      summary.steps = state.global_step;
      summary.epochs_completed = state.epoch;
      summary.stopped_at_max_steps = reached_max_steps;
      if (fs::exists(root / "final" / "config.json")) summary.final_dir = (root / "final").string();
      return summary;
    }
    progress << "resuming from " << resume_from->string() << " (epoch " << state.epoch << ", step "
             << state.global_step << ")\n";
  }
  std::optional<MetricsLog> metrics;
  if (is_main)
    metrics.emplace(root / "metrics.jsonl", resume_from ? std::optional<int64_t>(state.global_step) : std::nullopt);
  if (group) broadcast_parameters(*group, model->parameters());
  // ZeRO-2: the AdamW state and averaged gradients sharded over the ranks (the unsharded optimizer
  // above gives the groups and options, and never steps).
  std::unique_ptr<ZeroOptimizer> zero;
  if (config.zero_stage == 2) {
    zero = std::make_unique<ZeroOptimizer>(group.get(), *optimizer);
    if (resume_from) zero->load(*resume_from);
  }
  int64_t parameter_count = 0, trainable_count = 0;
  const auto& table = model->embed_tokens->weight;
  const bool trains_rows = lora && table.requires_grad();  // only the new markers' rows of it learn
  for (const auto& parameter : model->parameters()) {
    parameter_count += parameter.numel();
    if (parameter.requires_grad() && !(trains_rows && parameter.is_same(table))) trainable_count += parameter.numel();
  }
  const std::string rows_note =
      trains_rows ? " and " + std::to_string(setup.new_marker_ids.size()) + " marker rows of " + std::to_string(table.size(1)) : "";
  if (trains_rows) trainable_count += static_cast<int64_t>(setup.new_marker_ids.size()) * table.size(1);
  progress << "training " << training_mode_name(mode) << ": ";
  if (lm)
    progress << train_set.size() << " documents in " << train_tokens.size() << " windows of " << text_window << " tokens, "
             << val_set.size() << " validation documents in " << val_tokens.size() << " windows, ";
  else
    progress << train_set.size() << " examples, " << val_set.size() << " validation, ";
  progress << parameter_count << " parameters"
           << (lora ? " (" + std::to_string(trainable_count) + " trainable: LoRA rank " + std::to_string(config.lora_rank) + rows_note + ")" : "")
           << ", vocabulary " << model->config().vocab_size << ", "
           << config.num_epochs << " epochs x ~" << steps_per_epoch << " steps, device " << device.str()
           << (config.bf16 ? ", bf16 autocast" : "");
  if (group)
    progress << ", " << world << " processes (" << group->backend() << "), global batch "
             << config.batch_size * config.gradient_accumulation_steps * world;
  if (model->config().thought_is_expected_embedding()) progress << ", thoughts fed back as expected embeddings";
  if (model->config().latent_thought_rms > 0) progress << ", thoughts rescaled to RMS " << model->config().latent_thought_rms;
  progress << "\n";

  TrainSummary summary;
  model->train();
  const auto loop_started = std::chrono::steady_clock::now();
  // A compared step is timed from the device's idle to its idle again (reading a value waits for
  // the work queued before it).
  const auto wait_for_device = [&device]() {
    if (!device.is_cpu()) torch::zeros({1}, torch::TensorOptions().device(device)).to(torch::kCPU);
  };
  auto compared_step_started = loop_started;
  int64_t compared_step_tokens = 0;
  const int64_t first_step = state.global_step;
  int64_t window_tokens = 0;
  // The log window's statistics, each a micro-batch group's mean (over ranks), summed on the device:
  // loss, latent norm, embedding norm, router's fraction of layers, step supervision, reachable-set
  // supervision. A step never reads the device (on a GPU that is a host synchronisation): the
  // window is read at log steps, and whether a loss or gradient norm has gone non-finite (the
  // first step it did, -1 none) before anything is saved. Weights a non-finite step updated are
  // never written: require_finite_weights and this check both run before every save.
  const auto float64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  enum Statistic { kLoss, kLatentNorm, kEmbeddingNorm, kRouter, kStepSupervision, kReachableSupervision, kStatistics };
  auto window_sums = torch::zeros({kStatistics}, float64);
  auto first_nonfinite_loss = torch::full({}, -1.0, float64), first_nonfinite_norm = torch::full({}, -1.0, float64);
  // Sets `first` to this step's number (global_step + 1) if `value` is not finite and it is still -1.
  const auto note_if_nonfinite = [&](torch::Tensor& first, const torch::Tensor& value) {
    first = torch::where(first.lt(0) & torch::isfinite(value).logical_not(),
                         torch::full({}, static_cast<double>(state.global_step + 1), float64), first);
  };
  torch::Tensor last_grad_norm = torch::zeros({}, float64);
  int64_t window_micro = 0;
  auto window_started = std::chrono::steady_clock::now();
  int64_t current_stage = curriculum.stage_at(state.epoch);
  // What the written folders say of how to prompt the model (coconut.json): the layout it trained
  // in, or after mode lm (a training objective, not a prompt layout) the settings it came with,
  // less their weight format (its weights are no longer those blocks).
  ReasoningSettings kept_settings;
  if (lm && !config.load_model_path.empty()) kept_settings = load_reasoning_settings(config.load_model_path);
  kept_settings.weights.clear();
  const auto settings_to_save = [&]() { return lm ? kept_settings : config.reasoning_settings(current_stage); };

  // `resume_at` says where a run continuing from this checkpoint starts.
  const auto last_good = [&]() -> std::string {
    const auto last = checkpoints.last_checkpoint();
    return last ? "the last good checkpoint is " + last->string() + " (resume: true continues from it)"
                : "no checkpoint was written yet";
  };
  // Stops on the first non-finite loss or gradient norm since the run started (one small read).
  const auto require_finite_losses = [&]() {
    const auto steps = torch::stack({first_nonfinite_loss, first_nonfinite_norm}).to(torch::kCPU);
    const double loss_step = steps[0].item<double>(), norm_step = steps[1].item<double>();
    if (loss_step >= 0)
      throw TrainingDiverged("step " + std::to_string(static_cast<int64_t>(loss_step)) + " (epoch " + std::to_string(state.epoch) +
                             "): the loss is not finite; stopped without saving; " + last_good());
    if (norm_step >= 0)
      throw TrainingDiverged("step " + std::to_string(static_cast<int64_t>(norm_step)) +
                             ": the gradient norm is not finite; stopped without saving; " + last_good());
  };
  // Weights are checked finite before they are saved: a finite loss does not prove them finite
  // (eps 0 in AdamW writes NaN through a zero second moment), and last_checkpoint must only ever
  // name weights that can be resumed.
  const auto require_finite_weights = [&]() {
    torch::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters())
      if (!torch::isfinite(item.value()).all().item<bool>())
        throw TrainingDiverged("step " + std::to_string(state.global_step) + ": weight " + item.key() +
                               " is no longer finite; stopped without saving; " + last_good());
  };
  const auto save_checkpoint = [&](const TrainerState& resume_at) {
    require_finite_losses();  // every rank: they hold the same flags, so all stop together
    configured_base();
    if (!zero) {
      if (!is_main) return;
      require_finite_weights();
      checkpoints.write_checkpoint(model, tokenizer, settings_to_save(), optimizer.get(), {}, resume_at);
      return;
    }
    // ZeRO: every rank writes its shard beside the others, then rank 0 writes the checkpoint with them.
    const fs::path shards = root / ".zero-shards";
    if (is_main) {
      require_finite_weights();
      fs::remove_all(shards);
      fs::create_directories(shards);
    }
    if (group) group->barrier();
    zero->save(shards);
    if (group) group->barrier();
    if (!is_main) return;
    std::vector<std::string> files = {(shards / kZeroIndexFile).string()};
    for (int r = 0; r < world; ++r) files.push_back((shards / zero_shard_file_name(r, world)).string());
    checkpoints.write_checkpoint(model, tokenizer, settings_to_save(), nullptr, files, resume_at);
    fs::remove_all(shards);
  };
  // The model as it stands, ready for `coconut eval`: at the schedule's end, or at max_steps.
  const auto write_final = [&]() {
    require_finite_losses();
    configured_base();
    if (is_main) {
      require_finite_weights();
      checkpoints.write("final", model, tokenizer, settings_to_save(), nullptr, nullptr);
    }
    summary.final_dir = (root / "final").string();
  };

  // Validation loss (and accuracy, or perplexity in mode lm) in the metrics and the progress.
  const auto run_validation = [&](int64_t stage) {
    if (!is_main || val_set.empty()) return;
    configured_base();
    const auto validation_started = std::chrono::steady_clock::now();
    json record = validate(model, tokenizer, special, config, val_set, val_tokens, stage, device);
    record["step"] = state.global_step;
    record["epoch"] = state.epoch;
    metrics->write(record);
    progress << "validation epoch " << state.epoch + 1 << " step " << state.global_step << " stage " << stage << ": loss "
             << record["val_loss"].get<double>();
    if (record.contains("val_perplexity"))
      progress << ", perplexity " << record["val_perplexity"].get<double>() << " over " << record["val_tokens"].get<int64_t>()
               << " tokens";
    if (record.contains("accuracy"))
      progress << ", accuracy " << record["accuracy"].get<double>() << " on " << record["questions"].get<size_t>() << ", "
               << record["generated_tokens"].get<double>() << " tokens, " << record["latent_thoughts"].get<double>()
               << " thoughts";
    if (record.contains("mean_layers"))
      progress << ", " << record["mean_layers"].get<double>() << " layers per thought/token";
    progress << std::endl;
    summary.last_validation = record;
    window_started += std::chrono::steady_clock::now() - validation_started;  // the log window's tokens/s: training only
  };

  for (; state.epoch < config.num_epochs; ++state.epoch, state.next_batch = 0) {
    const EpochPlan plan = plan_epoch(curriculum, train_set, train_tokens, tokenizer, special, state.epoch);
    current_stage = plan.stage;
    if (state.next_batch == 0) {  // what the epoch's batches pad (group_by_length cuts it)
      const PlanPositions positions = plan_positions(plan);
      char line[160];
      std::snprintf(line, sizeof line, "epoch %lld/%lld: stage %lld, %zu batches, %.1f%% of the positions padding\n",
                    static_cast<long long>(state.epoch + 1), static_cast<long long>(config.num_epochs),
                    static_cast<long long>(plan.stage), plan.batches.size(),
                    100.0 * static_cast<double>(positions.padded - positions.real) / static_cast<double>(std::max<int64_t>(positions.padded, 1)));
      progress << line;
    }
    // A fresh optimizer at every stage switch (icot: every change of the removal schedule).
    const int64_t schedule_key = mode == TrainingMode::kIcot ? plan.removed_tokens : plan.stage;
    if (state.optimizer_stage != schedule_key) {
      if (config.reset_optimizer && state.optimizer_stage >= 0) {
        if (zero)
          zero->reset_state();
        else
          optimizer = make_optimizer(model, config);
      }
      state.optimizer_stage = schedule_key;
    }
    const auto batch_count = static_cast<int64_t>(plan.batches.size());
    int64_t groups_in_step = 0;  // counted from the epoch's start or the resume point (a step boundary)
    // A group is one micro-batch per rank: planned batches next_batch .. next_batch + W - 1.
    for (; state.next_batch < batch_count; state.next_batch += world) {
      const int64_t mine = state.next_batch + rank;
      if (groups_in_step == 0 && comparison && comparison->active()) {  // a compared step starts
        paths = comparison->arm();
        frozen_base.use(paths.frozen_base_bf16);
        wait_for_device();
        reset_peak_device_memory(device);
        compared_step_started = std::chrono::steady_clock::now();
        compared_step_tokens = 0;
      }
      TrainingLoss step;
      // This group's statistics (see window_sums), summed over ranks on the device; the number of
      // micro-batches and their tokens come from the plan every rank holds.
      const int64_t group_micro = std::min<int64_t>(world, batch_count - state.next_batch);
      int64_t group_tokens = 0;
      for (int64_t r = 0; r < group_micro; ++r) group_tokens += planned_tokens(plan, state.next_batch + r);
      auto statistics = torch::zeros({kStatistics}, float64);
      {
        AutocastScope autocast(config.bf16, device);
        if (mine < batch_count) {  // the epoch's last group may leave some ranks without a batch
          const auto& planned = plan.batches[static_cast<size_t>(mine)];
          std::vector<Sequence> rows;
          for (size_t index : planned.rows) rows.push_back(plan.sequences[index]);
          const Batch batch = collate(rows, special.pad);
          seed_micro_batch_draws(device, config.seed, state.epoch, mine);
          ForwardOptions step_options = forward_options;
          if (config.layer_drop > 0 || config.prefix_drop > 0 || config.nested_drop > 0)
            step_options.layer_keep = stochastic_depth_keep(batch.ids.size(0), model->config().num_hidden_layers, config, device);
          step = training_loss(model, batch, device, true, step_options, paths.loss_paths());
          if (teacher) {
            // Soft targets of the teacher at the same labelled positions.
            torch::Tensor teacher_logits;
            {
              torch::NoGradGuard no_grad;
              teacher_logits = training_loss(teacher, batch, device, false).logits;  // [N, V]
            }
            const double w = config.distill_weight;
            step.loss = (1.0 - w) * step.loss + w * distillation_loss(step.logits, teacher_logits, config.distill_temperature);
          }
          torch::Tensor router_fraction;
          if (step.router_fraction.defined()) {  // the compute penalty: expected fraction of layers run
            router_fraction = step.router_fraction.detach();
            step.loss = step.loss + config.router_penalty * step.router_fraction;
          }
          // Supervision of the thoughts, each added with its weight; its value for the log (undefined
          // when the batch gives it nothing to supervise).
          const auto add_weighted = [&step](double weight, const torch::Tensor& auxiliary) {
            if (!auxiliary.defined()) return torch::Tensor();
            step.loss = step.loss + weight * auxiliary;
            return auxiliary.detach();
          };
          torch::Tensor step_supervision, reachable_supervision;
          if (config.thought_step_loss > 0 && step.thoughts.defined())
            step_supervision = add_weighted(config.thought_step_loss, thought_step_loss(model, step.thoughts, batch, device));
          else if (config.thought_step_loss > 0 && batch.thoughts_are_pauses && step.thought_sources.defined())
            step_supervision = add_weighted(config.thought_step_loss,
                                            thought_step_loss(model, model->thought_input(step.thought_sources), batch, device));
          if (config.thought_reachable_loss > 0 && step.thought_sources.defined())
            reachable_supervision = add_weighted(config.thought_reachable_loss,
                                                 thought_reachable_loss(model, step.thought_sources, batch, device,
                                                                        config.thought_reachable_weights));
          // Statistics in Statistic's order; those this batch does not have count 0.
          const auto value = [&](const torch::Tensor& scalar) {
            return scalar.defined() ? scalar.detach().to(float64).reshape({}) : torch::zeros({}, float64);
          };
          statistics = torch::stack({value(step.loss), value(step.latent_norm), value(step.embedding_norm),
                                     value(router_fraction), value(step_supervision), value(reachable_supervision)});
        }
        if (group) {
          std::vector<torch::Tensor> reduced = {statistics};
          group->all_reduce_sum(reduced);
          statistics = reduced[0];
        }
        const auto means = statistics / static_cast<double>(std::max<int64_t>(1, group_micro));  // every rank the same
        window_sums.add_(means);
        note_if_nonfinite(first_nonfinite_loss, means[kLoss]);
        if (mine < batch_count) (step.loss / static_cast<double>(config.gradient_accumulation_steps)).backward();
        if (zero) zero->finish_backward();  // every rank, a batch or not: the same collectives everywhere
        window_tokens += group_tokens;
        compared_step_tokens += group_tokens;
        state.tokens_seen += group_tokens;
      }
      ++window_micro;
      ++groups_in_step;
      const bool last_of_epoch = state.next_batch + world >= batch_count;
      if (groups_in_step < config.gradient_accumulation_steps && !last_of_epoch) continue;
      groups_in_step = 0;

      // Optimizer step.
      const double lr = learning_rate(config, state.global_step, total_steps);
      set_learning_rate(zero ? zero->shard_optimizer() : *optimizer, lr, config, trains_gates);
      if (group && !zero) average_gradients(*group, model->parameters());
      if (config.max_grad_norm > 0) {
        if (zero) {  // ZeRO-2 reads its norm across ranks anyway
          const double grad_norm = zero->clip_grad_norm(config.max_grad_norm);
          if (!std::isfinite(grad_norm))
            throw TrainingDiverged("step " + std::to_string(state.global_step + 1) + ": the gradient norm is " +
                                   std::to_string(grad_norm) + "; stopped without saving; " + last_good());
          last_grad_norm = torch::full({}, grad_norm, float64);
        } else {
          last_grad_norm = clip_gradients(model->parameters(), config.max_grad_norm).to(float64);
          note_if_nonfinite(first_nonfinite_norm, last_grad_norm);
        }
      }
      if (zero) {
        zero->step();
      } else {
        adamw_step(*optimizer);  // libtorch's fused AdamW kernel on the optimizer's own state
        optimizer->zero_grad();
      }
      ++state.global_step;
      const bool stop_now = config.max_steps > 0 && state.global_step >= config.max_steps;
      if (comparison && comparison->active()) {
        wait_for_device();
        comparison->finished_step(std::chrono::duration<double>(std::chrono::steady_clock::now() - compared_step_started).count(),
                                  compared_step_tokens, peak_device_memory_bytes(device));
        if (!comparison->active()) {  // measured: the run goes on as configured
          progress << comparison->summary() << std::endl;
          json record = comparison->report();
          record["step"] = state.global_step;
          record["stage"] = plan.stage;
          if (metrics) metrics->write(record);
          paths = configured_paths;
          frozen_base.keep_only(configured_paths.frozen_base_bf16);
        }
      }

      if (state.global_step % config.log_every == 0 || stop_now || last_of_epoch) {
        require_finite_losses();
        const auto read = torch::cat({window_sums, last_grad_norm.reshape({1})}).to(torch::kCPU);  // the window, once
        const auto sums = read.accessor<double, 1>();
        const double window_loss = sums[kLoss], window_latent_norm = sums[kLatentNorm],
                     window_embedding_norm = sums[kEmbeddingNorm], window_router = sums[kRouter],
                     window_step_supervision = sums[kStepSupervision], window_reachable_supervision = sums[kReachableSupervision],
                     grad_norm = sums[kStatistics];
        const auto now = std::chrono::steady_clock::now();
        const double window_seconds = std::chrono::duration<double>(now - window_started).count();
        const double elapsed = std::chrono::duration<double>(now - loop_started).count();
        const double per_step = elapsed / static_cast<double>(state.global_step - first_step);
        const double eta = per_step * static_cast<double>(std::max<int64_t>(0, total_steps - state.global_step));
        const double micro = static_cast<double>(window_micro);
        json record = {{"event", "train"}, {"step", state.global_step}, {"epoch", state.epoch}, {"stage", plan.stage},
                       {"loss", window_loss / micro}, {"lr", lr}, {"grad_norm", grad_norm},
                       {"tokens_per_second", static_cast<double>(window_tokens) / window_seconds},
                       {"tokens_seen", state.tokens_seen}};
        if (window_latent_norm > 0) {
          record["latent_norm"] = window_latent_norm / micro;
          record["embedding_norm"] = window_embedding_norm / micro;
        }
        if (config.depth_router) record["router_layer_fraction"] = window_router / micro;
        if (config.thought_step_loss > 0) record["thought_step_loss"] = window_step_supervision / micro;
        if (config.thought_reachable_loss > 0) record["thought_reachable_loss"] = window_reachable_supervision / micro;
        if (metrics) metrics->write(record);
        char line[320];
        std::snprintf(line, sizeof line, "stage %lld epoch %lld/%lld step %lld/%lld loss %.4f lr %.2e %.0f tok/s",
                      static_cast<long long>(plan.stage), static_cast<long long>(state.epoch + 1),
                      static_cast<long long>(config.num_epochs), static_cast<long long>(state.global_step),
                      static_cast<long long>(total_steps), window_loss / micro, lr,
                      static_cast<double>(window_tokens) / window_seconds);
        progress << line;
        if (window_latent_norm > 0) {
          std::snprintf(line, sizeof line, " |latent| %.2f |embed| %.2f", window_latent_norm / micro,
                        window_embedding_norm / micro);
          progress << line;
        }
        if (config.depth_router) {
          std::snprintf(line, sizeof line, " layers %.2f/%lld", window_router / micro * static_cast<double>(model->config().num_hidden_layers),
                        static_cast<long long>(model->config().num_hidden_layers));
          progress << line;
        }
        if (config.thought_step_loss > 0) {
          std::snprintf(line, sizeof line, " step-decoding %.4f", window_step_supervision / micro);
          progress << line;
        }
        if (config.thought_reachable_loss > 0) {
          std::snprintf(line, sizeof line, " reachable %.4f", window_reachable_supervision / micro);
          progress << line;
        }
        progress << " ETA " << format_duration(eta) << std::endl;
        window_tokens = 0;
        window_sums.zero_();
        window_micro = 0;
        window_started = now;
      }
      if (config.eval_every_steps > 0 && (stop_now || (state.global_step % config.eval_every_steps == 0 && !last_of_epoch)))
        run_validation(plan.stage);
      if (stop_now || (config.save_every_steps > 0 && state.global_step % config.save_every_steps == 0 && !last_of_epoch)) {
        TrainerState resume_at = state;
        resume_at.next_batch = state.next_batch + world;
        save_checkpoint(resume_at);
      }
      if (stop_now) {
        write_final();  // the checkpoint beside it resumes the run
        summary.steps = state.global_step;
        summary.epochs_completed = state.epoch;
        summary.stopped_at_max_steps = true;
        summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        progress << "stopped at max_steps " << config.max_steps << "; checkpoint and model in " << summary.final_dir << "\n";
        if (group) group->barrier();  // the other ranks return once rank 0 has written
        return summary;
      }
    }
    // End of epoch: validation, then a checkpoint that starts the next epoch.
    if (config.eval_every_epochs > 0 && ((state.epoch + 1) % config.eval_every_epochs == 0 || state.epoch + 1 == config.num_epochs))
      run_validation(plan.stage);
    TrainerState resume_at = state;
    resume_at.epoch = state.epoch + 1;
    resume_at.next_batch = 0;
    save_checkpoint(resume_at);
  }
  write_final();
  if (group) group->barrier();
  summary.steps = state.global_step;
  summary.epochs_completed = state.epoch;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  progress << "done: " << state.global_step << " steps in " << format_duration(summary.seconds) << "; model in "
           << summary.final_dir << std::endl;
  return summary;
}

}  // namespace coconut
