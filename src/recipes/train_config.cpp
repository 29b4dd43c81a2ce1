#include "recipes/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model/config.h"
#include "model/device.h"
#include "model/lora.h"
#include "reasoning/special_tokens.h"

namespace coconut {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& problem) {
  throw std::invalid_argument(source + ": " + (key.empty() ? "" : "key '" + key + "': ") + problem);
}

template <typename T>
T scalar(const YAML::Node& node, const std::string& source, const std::string& key, const char* expected) {
  if (!node.IsScalar()) fail(source, key, std::string("expected ") + expected);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    fail(source, key, std::string("expected ") + expected + ", got '" + node.Scalar() + "'");
  }
}

// YAML -> JSON for the inline model config (numbers stay numbers, true/false stay booleans).
json yaml_to_json(const YAML::Node& node) {
  if (node.IsMap()) {
    json object = json::object();
    for (const auto& item : node) object[item.first.as<std::string>()] = yaml_to_json(item.second);
    return object;
  }
  if (node.IsSequence()) {
    json array = json::array();
    for (const auto& item : node) array.push_back(yaml_to_json(item));
    return array;
  }
  if (node.IsNull()) return nullptr;
  const std::string text = node.Scalar();
  if (node.Tag() != "!") {  // unquoted: try the YAML core schema types
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
    try {
      size_t used = 0;
      const long long integer = std::stoll(text, &used);
      if (used == text.size()) return integer;
    } catch (const std::exception&) {
    }
    try {
      size_t used = 0;
      const double real = std::stod(text, &used);
      if (used == text.size()) return real;
    } catch (const std::exception&) {
    }
  }
  return text;
}

using Setter = std::function<void(TrainConfig&, const YAML::Node&, const std::string& source, const std::string& key)>;

template <typename T>
Setter field(T TrainConfig::*member, const char* expected) {
  return [member, expected](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
    config.*member = scalar<T>(node, source, key, expected);
  };
}

// A number, a YAML list of numbers, or one comma-separated string (key=value overrides).
// A YAML list of strings, or one comma-separated string (handy in key=value overrides).
Setter string_list(std::vector<std::string> TrainConfig::*member, const char* what) {
  return [member, what](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
    std::vector<std::string> names;
    if (node.IsSequence()) {
      for (const auto& item : node) names.push_back(scalar<std::string>(item, source, key, what));
    } else {
      std::stringstream list(scalar<std::string>(node, source, key, ("a list of " + std::string(what)).c_str()));
      for (std::string name; std::getline(list, name, ',');)
        if (!name.empty()) names.push_back(name);
    }
    config.*member = names;
  };
}

// A YAML list of integers, or one comma-separated string.
Setter integer_list(std::vector<int64_t> TrainConfig::*member) {
  return [member](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
    std::vector<int64_t> values;
    if (node.IsSequence()) {
      for (const auto& item : node) values.push_back(scalar<int64_t>(item, source, key, "integers"));
    } else {
      std::stringstream list(scalar<std::string>(node, source, key, "a list of integers"));
      for (std::string item; std::getline(list, item, ',');)
        values.push_back(scalar<int64_t>(YAML::Node(item), source, key, "a list of integers"));
    }
    config.*member = values;
  };
}

Setter number_list(std::vector<double> TrainConfig::*member) {
  return [member](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
    std::vector<double> values;
    if (node.IsSequence()) {
      for (const auto& item : node) values.push_back(scalar<double>(item, source, key, "numbers"));
    } else {
      std::stringstream list(scalar<std::string>(node, source, key, "a number or a list of numbers"));
      for (std::string item; std::getline(list, item, ',');) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        values.push_back(scalar<double>(YAML::Node(item), source, key, "a number or a list of numbers"));
      }
    }
    config.*member = values;
  };
}

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"name", field(&TrainConfig::name, "a string")},
      {"mode", field(&TrainConfig::mode, "a string")},
      {"text_window", field(&TrainConfig::text_window, "an integer")},
      {"train_path", field(&TrainConfig::train_path, "a path")},
      {"val_path", field(&TrainConfig::val_path, "a path")},
      {"train_limit", field(&TrainConfig::train_limit, "an integer")},
      {"val_limit", field(&TrainConfig::val_limit, "an integer")},
      {"val_split", field(&TrainConfig::val_split, "an integer")},
      {"output_dir", field(&TrainConfig::output_dir, "a path")},
      {"load_model_path", field(&TrainConfig::load_model_path, "a path")},
      {"init", field(&TrainConfig::init, "a path")},
      {"model",
       [](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
         if (!node.IsMap()) fail(source, key, "expected a map of config.json fields");
         config.model = yaml_to_json(node);
       }},
      {"tokenizer", field(&TrainConfig::tokenizer, "a path")},
      {"word_forms", field(&TrainConfig::word_forms, "true or false")},
      {"negation", field(&TrainConfig::negation, "separate, postfix, fused or fused_marked")},
      {"articles", field(&TrainConfig::articles, "separate, joined or joined_postfix")},
      {"shuffle_facts", field(&TrainConfig::shuffle_facts, "true or false")},
      {"drop_unused_facts", number_list(&TrainConfig::drop_unused_facts)},
      {"keep_query_distractors", field(&TrainConfig::keep_query_distractors, "true or false")},
      {"new_token_init", field(&TrainConfig::new_token_init, "a token")},
      {"init_std", field(&TrainConfig::init_std, "a number")},
      {"negation_offset_init", field(&TrainConfig::negation_offset_init, "true or false")},
      {"device", field(&TrainConfig::device, "a device name")},
      {"bf16", field(&TrainConfig::bf16, "true or false")},
      {"num_epochs", field(&TrainConfig::num_epochs, "an integer")},
      {"c_thought", field(&TrainConfig::c_thought, "an integer")},
      {"epochs_per_stage", field(&TrainConfig::epochs_per_stage, "an integer")},
      {"max_latent_stage", field(&TrainConfig::max_latent_stage, "an integer")},
      {"first_stage", field(&TrainConfig::first_stage, "an integer")},
      {"distill_from", field(&TrainConfig::distill_from, "a path")},
      {"distill_weight", field(&TrainConfig::distill_weight, "a number")},
      {"distill_temperature", field(&TrainConfig::distill_temperature, "a number")},
      {"depth_router", field(&TrainConfig::depth_router, "true or false")},
      {"router_penalty", field(&TrainConfig::router_penalty, "a number")},
      {"router_noise", field(&TrainConfig::router_noise, "a number")},
      {"layer_drop", field(&TrainConfig::layer_drop, "a number")},
      {"layer_drop_schedule", field(&TrainConfig::layer_drop_schedule, "a string")},
      {"prefix_drop", field(&TrainConfig::prefix_drop, "a number")},
      {"prefix_min_layers", field(&TrainConfig::prefix_min_layers, "an integer")},
      {"nested_drop", field(&TrainConfig::nested_drop, "a number")},
      {"nested_drop_order", integer_list(&TrainConfig::nested_drop_order)},
      {"router_init_bias", field(&TrainConfig::router_init_bias, "a number")},
      {"router_only", field(&TrainConfig::router_only, "true or false")},
      {"router_lr_scale", field(&TrainConfig::router_lr_scale, "a number")},
      {"router_first_layer", field(&TrainConfig::router_first_layer, "an integer")},
      {"lora_rank", field(&TrainConfig::lora_rank, "an integer")},
      {"lora_alpha", field(&TrainConfig::lora_alpha, "a number")},
      {"lora_targets", string_list(&TrainConfig::lora_targets, "projection names")},
      {"marker_tokens", string_list(&TrainConfig::marker_tokens, "token names")},
      {"init_adapter", field(&TrainConfig::init_adapter, "a path")},
      {"pad_latent_to_max", field(&TrainConfig::pad_latent_to_max, "true or false")},
      {"uniform_prob", field(&TrainConfig::uniform_prob, "a number")},
      {"reset_optimizer", field(&TrainConfig::reset_optimizer, "true or false")},
      {"thought_step_loss", field(&TrainConfig::thought_step_loss, "a number")},
      {"thought_step_answer", field(&TrainConfig::thought_step_answer, "true or false")},
      {"thought_reachable_loss", field(&TrainConfig::thought_reachable_loss, "a number")},
      {"thought_reachable_weights", number_list(&TrainConfig::thought_reachable_weights)},
      {"thought_reachable_start", field(&TrainConfig::thought_reachable_start, "children or root")},
      {"latent_bottleneck", field(&TrainConfig::latent_bottleneck, "a number")},
      {"latent_thought_rms",
       [](TrainConfig& config, const YAML::Node& node, const std::string& source, const std::string& key) {
         const auto text = scalar<std::string>(node, source, key, "auto or a number >= 0");
         config.latent_thought_rms = text == "auto" ? TrainConfig::kAutoThoughtRms
                                                    : scalar<double>(node, source, key, "auto or a number >= 0");
       }},
      {"latent_thought_input", field(&TrainConfig::latent_thought_input, "last_hidden or expected_embedding")},
      {"pause_tokens", field(&TrainConfig::pause_tokens, "an integer")},
      {"remove_per_epoch", field(&TrainConfig::remove_per_epoch, "an integer")},
      {"removal_smoothing_lambda", field(&TrainConfig::removal_smoothing_lambda, "a number")},
      {"lr", field(&TrainConfig::lr, "a number")},
      {"weight_decay", field(&TrainConfig::weight_decay, "a number")},
      {"beta1", field(&TrainConfig::beta1, "a number")},
      {"beta2", field(&TrainConfig::beta2, "a number")},
      {"eps", field(&TrainConfig::eps, "a number")},
      {"schedule", field(&TrainConfig::schedule, "constant or cosine")},
      {"warmup_steps", field(&TrainConfig::warmup_steps, "an integer")},
      {"min_lr_ratio", field(&TrainConfig::min_lr_ratio, "a number")},
      {"max_grad_norm", field(&TrainConfig::max_grad_norm, "a number")},
      {"batch_size", field(&TrainConfig::batch_size, "an integer")},
      {"group_by_length", field(&TrainConfig::group_by_length, "an integer")},
      {"gradient_accumulation_steps", field(&TrainConfig::gradient_accumulation_steps, "an integer")},
      {"zero_stage", field(&TrainConfig::zero_stage, "an integer")},
      {"activation_checkpointing", field(&TrainConfig::activation_checkpointing, "true or false")},
      {"last_layer_cut", field(&TrainConfig::last_layer_cut, "auto, true or false")},
      {"frozen_base_bf16", field(&TrainConfig::frozen_base_bf16, "auto, true or false")},
      {"chunked_head_loss", field(&TrainConfig::chunked_head_loss, "auto, true or false")},
      {"compare_paths", field(&TrainConfig::compare_paths, "an integer")},
      {"seed", field(&TrainConfig::seed, "a non-negative integer")},
      {"max_steps", field(&TrainConfig::max_steps, "an integer")},
      {"log_every", field(&TrainConfig::log_every, "an integer")},
      {"save_every_steps", field(&TrainConfig::save_every_steps, "an integer")},
      {"keep_checkpoints", field(&TrainConfig::keep_checkpoints, "an integer")},
      {"resume", field(&TrainConfig::resume, "true or false")},
      {"eval_every_epochs", field(&TrainConfig::eval_every_epochs, "an integer")},
      {"eval_every_steps", field(&TrainConfig::eval_every_steps, "an integer")},
      {"val_generate_limit", field(&TrainConfig::val_generate_limit, "an integer")},
      {"max_new_tokens", field(&TrainConfig::max_new_tokens, "an integer")},
      {"eval_batch_size", field(&TrainConfig::eval_batch_size, "an integer")},
  };
  return table;
}

void apply(TrainConfig& config, const std::string& key, const YAML::Node& value, const std::string& source) {
  const auto& table = setters();
  const auto setter = table.find(key);
  if (setter == table.end()) fail(source, "", "unknown key '" + key + "'");
  setter->second(config, value, source, key);
  config.given_keys.insert(key);
}

}  // namespace

bool TrainConfig::uses_stages() const { return curriculum().staged(); }

Curriculum TrainConfig::curriculum() const {
  Curriculum curriculum;
  curriculum.layout = reasoning_settings(0);
  curriculum.answer_in_last_thought = thought_step_answer;
  curriculum.reachable_from_root = thought_reachable_start == "root";
  curriculum.first_stage = first_stage;
  curriculum.epochs_per_stage = epochs_per_stage;
  curriculum.uniform_prob = uniform_prob;
  curriculum.latent_bottleneck = latent_bottleneck;
  curriculum.shuffle_facts = shuffle_facts;
  curriculum.drop_unused_facts = drop_unused_facts;
  curriculum.keep_query_distractors = keep_query_distractors;
  curriculum.remove_per_epoch = remove_per_epoch;
  curriculum.removal_smoothing_lambda = removal_smoothing_lambda;
  curriculum.batch_size = batch_size;
  curriculum.group_by_length = group_by_length;
  curriculum.seed = seed;
  return curriculum;
}

ReasoningSettings TrainConfig::reasoning_settings(int64_t stage) const {
  ReasoningSettings settings;
  settings.mode = mode;
  settings.stage = stage;
  settings.c_thought = c_thought;
  settings.max_latent_stage = max_latent_stage;
  settings.pad_latent_to_max = pad_latent_to_max;
  settings.pause_tokens = pause_tokens;
  settings.answer_through_thoughts = latent_bottleneck >= 1.0;
  return settings;
}

SequenceOptions TrainConfig::sequence_options(int64_t stage) const {
  SequenceOptions options = reasoning_settings(stage).sequence_options();
  options.answer_in_last_thought = thought_step_answer;
  return options;
}

void TrainConfig::validate() const {
  try {
    training_mode();
  } catch (const std::exception&) {
    fail(source, "mode", "'" + mode + "' is not one of cot, no_cot, coconut, no_thoughts, pause_as_thought, pause, icot, lm");
  }
  if (train_path.empty()) fail(source, "train_path", "missing");
  if (!load_model_path.empty() && (!init.empty() || !model.empty()))
    fail(source, "load_model_path", "give either load_model_path or init/model, not both");
  if (load_model_path.empty() && init.empty() && model.empty())
    fail(source, "", "no model: give load_model_path, init (a config.json) or model (its fields)");
  if (!init.empty() && !model.empty()) fail(source, "init", "give either init or model, not both");
  const auto positive = [&](int64_t value, const char* key) {
    if (value < 1) fail(source, key, "must be at least 1, got " + std::to_string(value));
  };
  const auto non_negative = [&](int64_t value, const char* key) {
    if (value < 0) fail(source, key, "must not be negative, got " + std::to_string(value));
  };
  positive(num_epochs, "num_epochs");
  positive(c_thought, "c_thought");
  positive(epochs_per_stage, "epochs_per_stage");
  non_negative(max_latent_stage, "max_latent_stage");
  non_negative(first_stage, "first_stage");
  if (distill_weight < 0 || distill_weight > 1) fail(source, "distill_weight", "must be in [0, 1]");
  if (!(distill_temperature > 0)) fail(source, "distill_temperature", "must be positive");
  non_negative(lora_rank, "lora_rank");
  if (!marker_tokens.empty() && marker_tokens.size() != reasoning_marker_tokens().size())
    fail(source, "marker_tokens", "names " + std::to_string(marker_tokens.size()) + " tokens; it takes one for each of the " +
                                      std::to_string(reasoning_marker_tokens().size()) +
                                      " markers (start-latent, end-latent, latent, pause), in that order");
  if (!init_adapter.empty() && lora_rank == 0) fail(source, "init_adapter", "needs LoRA (lora_rank > 0)");
  if (!marker_tokens.empty() && load_model_path.empty())
    fail(source, "marker_tokens", "needs load_model_path (the tokens are taken from that model's tokenizer)");
  if (lora_rank > 0) {
    LoraOptions lora;
    lora.rank = lora_rank;
    lora.alpha = lora_alpha;
    lora.targets = lora_targets;
    try {
      validate_lora_options(lora);
    } catch (const std::invalid_argument& error) {
      fail(source, lora_alpha > 0 ? "lora_targets" : "lora_alpha", error.what());
    }
  }
  if (router_penalty < 0) fail(source, "router_penalty", "must not be negative");
  if (router_noise < 0) fail(source, "router_noise", "must not be negative");
  if (!(layer_drop >= 0 && layer_drop < 1)) fail(source, "layer_drop", "must be in [0, 1)");
  if (layer_drop > 0 && depth_router) fail(source, "layer_drop", "cannot be combined with depth_router");
  if (layer_drop_schedule != "rising" && layer_drop_schedule != "flat")
    fail(source, "layer_drop_schedule", "'" + layer_drop_schedule + "' is not rising or flat");
  for (const auto& [key, value] : {std::pair{"last_layer_cut", &last_layer_cut}, std::pair{"frozen_base_bf16", &frozen_base_bf16},
                                   std::pair{"chunked_head_loss", &chunked_head_loss}})
    if (*value != "auto" && *value != "true" && *value != "false") fail(source, key, "'" + *value + "' is not auto, true or false");
  if (frozen_base_bf16 == "true" && (lora_rank == 0 || !bf16))
    fail(source, "frozen_base_bf16", "needs LoRA (lora_rank > 0) and bf16: true (the frozen base is what autocast casts)");
  if (chunked_head_loss == "true" && !distill_from.empty())
    fail(source, "chunked_head_loss", "cannot be combined with distill_from (distillation reads the logits)");
  non_negative(compare_paths, "compare_paths");
  non_negative(group_by_length, "group_by_length");
  if (!(prefix_drop >= 0 && prefix_drop <= 1)) fail(source, "prefix_drop", "must be in [0, 1]");
  if (prefix_drop > 0 && depth_router) fail(source, "prefix_drop", "cannot be combined with depth_router");
  non_negative(prefix_min_layers, "prefix_min_layers");
  if (!(nested_drop >= 0 && nested_drop <= 1)) fail(source, "nested_drop", "must be in [0, 1]");
  if (nested_drop > 0 && nested_drop_order.empty()) fail(source, "nested_drop_order", "needs the layers to drop, in order");
  if (nested_drop > 0 && depth_router) fail(source, "nested_drop", "cannot be combined with depth_router");
  for (size_t i = 0; i < nested_drop_order.size(); ++i) {
    if (nested_drop_order[i] < 0) fail(source, "nested_drop_order", "layer indices must not be negative");
    if (std::find(nested_drop_order.begin(), nested_drop_order.begin() + static_cast<std::ptrdiff_t>(i), nested_drop_order[i]) !=
        nested_drop_order.begin() + static_cast<std::ptrdiff_t>(i))
      fail(source, "nested_drop_order", "layer " + std::to_string(nested_drop_order[i]) + " is listed twice");
  }
  if (!(router_lr_scale > 0)) fail(source, "router_lr_scale", "must be positive");
  non_negative(router_first_layer, "router_first_layer");
  if (router_only && !depth_router) fail(source, "router_only", "needs depth_router: true");
  if (depth_router && lora_rank > 0) fail(source, "depth_router", "cannot be combined with LoRA (lora_rank > 0)");
  non_negative(pause_tokens, "pause_tokens");
  non_negative(remove_per_epoch, "remove_per_epoch");
  positive(batch_size, "batch_size");
  positive(gradient_accumulation_steps, "gradient_accumulation_steps");
  if (zero_stage != 0 && zero_stage != 2)
    fail(source, "zero_stage", "must be 0 (unsharded) or 2 (sharded optimizer state and gradients); got " +
                                   std::to_string(zero_stage) + " (stages 1 and 3 are not offered)");
  non_negative(warmup_steps, "warmup_steps");
  non_negative(max_steps, "max_steps");
  positive(log_every, "log_every");
  non_negative(save_every_steps, "save_every_steps");
  positive(keep_checkpoints, "keep_checkpoints");
  non_negative(eval_every_epochs, "eval_every_epochs");
  non_negative(val_generate_limit, "val_generate_limit");
  positive(max_new_tokens, "max_new_tokens");
  positive(eval_batch_size, "eval_batch_size");
  non_negative(train_limit, "train_limit");
  non_negative(val_limit, "val_limit");
  non_negative(val_split, "val_split");
  if (val_split > 0 && !val_path.empty()) fail(source, "val_split", "give either val_split or val_path, not both");
  // Written so that NaN fails too. Each value reaches libtorch only after these checks.
  if (!(std::isfinite(lr) && lr > 0)) fail(source, "lr", "must be a positive finite number");
  if (!(std::isfinite(weight_decay) && weight_decay >= 0)) fail(source, "weight_decay", "must be a finite number >= 0");
  if (!(beta1 >= 0 && beta1 < 1)) fail(source, "beta1", "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) fail(source, "beta2", "must be in [0, 1)");
  if (!(std::isfinite(eps) && eps > 0)) fail(source, "eps", "must be a positive finite number (0 divides by zero in AdamW)");
  if (!(std::isfinite(init_std) && init_std >= 0)) fail(source, "init_std", "must be a finite number >= 0");
  if (negation_offset_init && negation != "fused" && negation != "fused_marked")
    fail(source, "negation_offset_init", "needs negation: fused or fused_marked (the tokens it initialises)");
  if (negation_offset_init && !tokenizer.empty())
    fail(source, "negation_offset_init", "sets the word-level vocabulary's fused tokens (no tokenizer)");
  if (!is_device_name(device)) fail(source, "device", "'" + device + "' is not one of cpu, cuda, cuda:N, auto");
  // The model's own fields: vocab_size comes from the tokenizer; any other key is a typo.
  if (model.is_object()) {
    static const std::set<std::string> known = {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
        "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "torch_dtype", "model_type", "hidden_act",
        "layer_num_attention_heads", "layer_num_key_value_heads", "layer_intermediate_size", "depth_router",
        "depth_router_first_layer"};
    for (const auto& item : model.items()) {
      if (item.key() == "vocab_size")
        fail(source, "model.vocab_size", "is set from the tokenizer's vocabulary; remove it");
      if (!known.count(item.key())) fail(source, "model." + item.key(), "unknown key");
    }
  }
  if (uniform_prob < 0 || uniform_prob > 1) fail(source, "uniform_prob", "must be in [0, 1]");
  if (latent_bottleneck < 0 || latent_bottleneck > 1) fail(source, "latent_bottleneck", "must be in [0, 1]");
  if (latent_bottleneck > 0 && training_mode() != TrainingMode::kCoconut)
    fail(source, "latent_bottleneck", "is for mode coconut (the answer reads continuous thoughts)");
  if (latent_thought_rms != kAutoThoughtRms && !(std::isfinite(latent_thought_rms) && latent_thought_rms >= 0))
    fail(source, "latent_thought_rms", "must be auto or a finite number >= 0");
  if (!(std::isfinite(thought_step_loss) && thought_step_loss >= 0))
    fail(source, "thought_step_loss", "must be a finite number >= 0");
  if (thought_step_loss > 0 && training_mode() != TrainingMode::kCoconut && training_mode() != TrainingMode::kPauseAsThought)
    fail(source, "thought_step_loss", "supervises the thought positions: needs mode coconut or pause_as_thought");
  if (thought_step_answer && training_mode() != TrainingMode::kCoconut)
    fail(source, "thought_step_answer", "is for mode coconut (the last thought decodes the answer the model reads from it)");
  if (!latent_thought_input.empty() && !LlamaConfig::is_latent_thought_input(latent_thought_input))
    fail(source, "latent_thought_input", "'" + latent_thought_input + "' is not last_hidden or expected_embedding");
  if (!(std::isfinite(thought_reachable_loss) && thought_reachable_loss >= 0))
    fail(source, "thought_reachable_loss", "must be a finite number >= 0");
  if (thought_reachable_loss > 0 && training_mode() != TrainingMode::kCoconut &&
      training_mode() != TrainingMode::kPauseAsThought)
    fail(source, "thought_reachable_loss", "supervises the thought positions: needs mode coconut or pause_as_thought");
  if (thought_reachable_weights.empty()) fail(source, "thought_reachable_weights", "needs at least one number");
  for (double weight : thought_reachable_weights)
    if (!(std::isfinite(weight) && weight >= 0)) fail(source, "thought_reachable_weights", "every value must be a finite number >= 0");
  if (thought_reachable_weights != std::vector<double>{1.0} && thought_reachable_loss <= 0)
    fail(source, "thought_reachable_weights", "weights reachable-set supervision: needs thought_reachable_loss > 0");
  if (thought_reachable_start != "children" && thought_reachable_start != "root")
    fail(source, "thought_reachable_start", "'" + thought_reachable_start + "' is not children or root");
  if (thought_reachable_start != "children" && thought_reachable_loss <= 0)
    fail(source, "thought_reachable_start", "places reachable-set supervision: needs thought_reachable_loss > 0");
  if (thought_step_answer && thought_step_loss <= 0)
    fail(source, "thought_step_answer", "extends step supervision: needs thought_step_loss > 0");
  if (drop_unused_facts.empty()) fail(source, "drop_unused_facts", "needs at least one number");
  for (double probability : drop_unused_facts)
    if (!(probability >= 0 && probability <= 1)) fail(source, "drop_unused_facts", "every value must be in [0, 1]");
  if (negation != "separate" && negation != "postfix" && negation != "fused" && negation != "fused_marked")
    fail(source, "negation", "'" + negation + "' is not separate, postfix, fused or fused_marked");
  if (negation != "separate" && !word_forms) fail(source, "negation", "'" + negation + "' needs word_forms: true");
  if (articles != "separate" && articles != "joined" && articles != "joined_postfix")
    fail(source, "articles", "'" + articles + "' is not separate, joined or joined_postfix");
  if (articles != "separate" && !word_forms) fail(source, "articles", "'" + articles + "' needs word_forms: true");
  if (std::any_of(drop_unused_facts.begin(), drop_unused_facts.end(), [](double p) { return p > 0; }) && !shuffle_facts)
    fail(source, "drop_unused_facts", "needs shuffle_facts: true");
  if (max_grad_norm < 0) fail(source, "max_grad_norm", "must not be negative");
  if (min_lr_ratio < 0 || min_lr_ratio > 1) fail(source, "min_lr_ratio", "must be in [0, 1]");
  if (removal_smoothing_lambda < 0) fail(source, "removal_smoothing_lambda", "must not be negative");
  if (schedule != "constant" && schedule != "cosine") fail(source, "schedule", "'" + schedule + "' is not constant or cosine");
  if (training_mode() == TrainingMode::kPause && pause_tokens < 1) fail(source, "pause_tokens", "pause mode needs at least 1");
  if (text_window < 0 || text_window == 1) fail(source, "text_window", "must be 0 (the model's context) or at least 2");
  if (eval_every_steps < 0) fail(source, "eval_every_steps", "must not be negative");
  if (training_mode() == TrainingMode::kLm) {
    if (shuffle_facts) fail(source, "shuffle_facts", "reorders a question's facts; mode lm reads plain text");
    if (!marker_tokens.empty()) fail(source, "marker_tokens", "names reasoning markers; mode lm adds none");
  }
}

json TrainConfig::to_json() const {
  return {{"name", name}, {"mode", mode}, {"text_window", text_window}, {"train_path", train_path}, {"val_path", val_path},
          {"train_limit", train_limit}, {"val_limit", val_limit}, {"val_split", val_split}, {"output_dir", resolved_output_dir()},
          {"load_model_path", load_model_path}, {"init", init}, {"model", model}, {"tokenizer", tokenizer},
          {"word_forms", word_forms}, {"negation", negation}, {"articles", articles},
          {"shuffle_facts", shuffle_facts},
          {"drop_unused_facts", drop_unused_facts.size() == 1 ? json(drop_unused_facts[0]) : json(drop_unused_facts)},
          {"keep_query_distractors", keep_query_distractors},
          {"new_token_init", new_token_init}, {"marker_tokens", marker_tokens}, {"init_adapter", init_adapter}, {"init_std", init_std},
          {"negation_offset_init", negation_offset_init}, {"device", device}, {"bf16", bf16},
          {"num_epochs", num_epochs}, {"c_thought", c_thought},
          {"latent_thought_rms", latent_thought_rms == kAutoThoughtRms ? json("auto") : json(latent_thought_rms)},
          {"latent_thought_input", latent_thought_input},
          {"thought_step_loss", thought_step_loss}, {"thought_step_answer", thought_step_answer},
          {"thought_reachable_loss", thought_reachable_loss},
          {"thought_reachable_weights", thought_reachable_weights.size() == 1 ? json(thought_reachable_weights[0])
                                                                              : json(thought_reachable_weights)},
          {"thought_reachable_start", thought_reachable_start},
          {"latent_bottleneck", latent_bottleneck}, {"epochs_per_stage", epochs_per_stage},
          {"max_latent_stage", max_latent_stage}, {"first_stage", first_stage}, {"pad_latent_to_max", pad_latent_to_max},
          {"distill_from", distill_from}, {"distill_weight", distill_weight}, {"distill_temperature", distill_temperature},
          {"lora_rank", lora_rank}, {"lora_alpha", lora_alpha}, {"lora_targets", lora_targets},
          {"depth_router", depth_router}, {"router_penalty", router_penalty}, {"router_noise", router_noise},
          {"router_init_bias", router_init_bias}, {"router_only", router_only},
          {"router_lr_scale", router_lr_scale}, {"router_first_layer", router_first_layer}, {"layer_drop", layer_drop},
          {"layer_drop_schedule", layer_drop_schedule}, {"prefix_drop", prefix_drop}, {"prefix_min_layers", prefix_min_layers},
          {"nested_drop", nested_drop}, {"nested_drop_order", nested_drop_order},
          {"uniform_prob", uniform_prob}, {"reset_optimizer", reset_optimizer}, {"pause_tokens", pause_tokens},
          {"remove_per_epoch", remove_per_epoch}, {"removal_smoothing_lambda", removal_smoothing_lambda},
          {"lr", lr}, {"weight_decay", weight_decay}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps},
          {"schedule", schedule}, {"warmup_steps", warmup_steps}, {"min_lr_ratio", min_lr_ratio},
          {"max_grad_norm", max_grad_norm}, {"batch_size", batch_size}, {"group_by_length", group_by_length},
          {"gradient_accumulation_steps", gradient_accumulation_steps}, {"zero_stage", zero_stage},
          {"activation_checkpointing", activation_checkpointing}, {"last_layer_cut", last_layer_cut},
          {"frozen_base_bf16", frozen_base_bf16}, {"chunked_head_loss", chunked_head_loss}, {"compare_paths", compare_paths}, {"seed", seed}, {"max_steps", max_steps},
          {"log_every", log_every}, {"save_every_steps", save_every_steps}, {"keep_checkpoints", keep_checkpoints},
          {"resume", resume}, {"eval_every_epochs", eval_every_epochs}, {"eval_every_steps", eval_every_steps}, {"val_generate_limit", val_generate_limit},
          {"max_new_tokens", max_new_tokens}, {"eval_batch_size", eval_batch_size}};
}

TrainConfig train_config_from_yaml_text(const std::string& text, const std::string& source,
                                        const std::vector<std::string>& overrides) {
  TrainConfig config;
  config.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    fail(source, "", std::string("malformed YAML: ") + error.what());
  }
  if (!root.IsNull()) {
    if (!root.IsMap()) fail(source, "", "expected a map of keys at the top level");
    for (const auto& item : root) apply(config, item.first.as<std::string>(), item.second, source);
  }
  for (const auto& override_text : overrides) {
    const auto equals = override_text.find('=');
    if (equals == std::string::npos || equals == 0)
      throw std::invalid_argument("override '" + override_text + "': expected key=value");
    const std::string key = override_text.substr(0, equals);
    YAML::Node value;
    try {
      value = YAML::Load(override_text.substr(equals + 1));
    } catch (const YAML::Exception& error) {
      throw std::invalid_argument("override '" + override_text + "': " + error.what());
    }
    apply(config, key, value, "override " + key);
  }
  config.validate();
  return config;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream file(path);
  if (!file) throw std::invalid_argument(path + ": cannot open");
  std::stringstream text;
  text << file.rdbuf();
  return train_config_from_yaml_text(text.str(), path, overrides);
}

}  // namespace coconut
