// The training configuration: one YAML file (keys named as in the reference Coconut configs where
// they exist) plus `key=value` overrides from the command line. Unknown keys and ill-typed values
// are errors naming the file and the key.
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "data/sequences.h"
#include "reasoning/curriculum.h"
#include "reasoning/layout.h"

namespace coconut {

struct TrainConfig {
  std::string source = "<defaults>";  // where the config came from (for messages)
  std::set<std::string> given_keys;   // keys the file or the overrides set

  // Run and data.
  std::string name = "run";
  std::string mode = "cot";           // cot | no_cot | coconut | no_thoughts | pause_as_thought | pause | icot | lm
  // Mode lm reads plain text (data/text_documents.h: a .txt of blank-line separated documents, or
  // JSONL with a `text` field), packs it into windows of text_window tokens (0: the model's
  // context, at most kDefaultTextWindow) and learns every token: no markers are added, the
  // validation reports perplexity, and the model keeps the reasoning settings it came with.
  // train_limit, val_limit and val_split then count documents.
  int64_t text_window = 0;
  std::string train_path, val_path;
  int64_t train_limit = 0, val_limit = 0;  // first N examples (0 = all)
  // The last N examples of train_path are held out as the validation set (and left out of
  // training), so that a test set (e.g. ProntoQA's released validation file) stays out of every
  // training run and model choice. Exclusive with val_path.
  int64_t val_split = 0;
  std::string output_dir;             // default: runs/<name>

  // Model: a checkpoint to continue from (e.g. the CoT stage), or a fresh one.
  std::string load_model_path;        // HF folder
  std::string init;                   // config.json of a model to train from scratch
  nlohmann::json model = nlohmann::json::object();  // or its fields inline (vocab_size: from the tokenizer)
  std::string tokenizer;              // tokenizer.json; default: load_model_path's, else word-level from the data
  bool word_forms = false;            // the word-level tokenizer built from the data normalises case and plurals
  std::string negation = "separate";  // ... and "not": a token of its own, postfix ("brown ~not"), fused ("not~brown")
                                      // or fused_marked ("not~brown ~not")
  std::string articles = "separate";  // ... and "a"/"an": tokens of their own, joined to the word before ("is~a"),
                                      // or joined_postfix: that piece behind the next word ("wumpus ~is~a")
  bool shuffle_facts = false;         // every epoch, the question's sentences but the last in a new (seeded) order
  // With shuffle_facts: each fact no step quotes is left out with this probability; one per epoch (a list,
  // in YAML or "0.9,0.5,0" on the command line), the last for every epoch after: a distractor curriculum.
  std::vector<double> drop_unused_facts = {0.0};
  bool keep_query_distractors = false;  // ... except facts sharing a rare word with the query (hard distractors)
  std::string new_token_init;         // token whose embedding initialises added markers (default: EOS)
  // The markers (start-latent, end-latent, latent, pause, in that order) as existing added tokens of
  // load_model_path's tokenizer, renamed, instead of new rows: the vocabulary keeps its size, so a
  // LoRA adapter (with those rows) applies to the unchanged base anywhere, PEFT and llama.cpp
  // included. Their rows start as the model had them. Empty: the markers are added as new tokens.
  std::vector<std::string> marker_tokens;
  double init_std = 0.02;
  // Word-level models with fused negation: each fused token's embedding is set to its word's plus
  // one shared random vector ("not~brown" = "brown" + n), so polarity starts as one direction common
  // to every property instead of a difference each pair of tokens must learn on its own. A fresh
  // model gets n at init_std; a loaded one (load_model_path, not on resume) at its table's RMS.
  bool negation_offset_init = false;
  std::string device = "cpu";         // cpu | cuda | cuda:N | auto
  bool bf16 = false;                  // autocast matrix products to bfloat16 (float32 master weights)

  // Curriculum (the reference's names).
  int64_t num_epochs = 1;
  int64_t c_thought = 1, epochs_per_stage = 1, max_latent_stage = 3;
  int64_t first_stage = 0;            // the curriculum starts here: stage = first_stage + epoch / epochs_per_stage
  bool pad_latent_to_max = false;
  double uniform_prob = 0.0;
  bool reset_optimizer = true;        // a fresh optimizer at every stage switch
  // Thoughts rescaled to this RMS before they are fed back (LlamaConfig::latent_thought_rms):
  // 0 = as in the paper, a number, or kAutoThoughtRms ("auto" in YAML): the mean RMS of the token
  // embeddings when training starts (kept from the model when it already has one).
  static constexpr double kAutoThoughtRms = -1;
  double latent_thought_rms = 0;
  // What a thought feeds back (LlamaConfig::latent_thought_input): "last_hidden" or
  // "expected_embedding"; empty keeps the model's own (last_hidden for a new model).
  std::string latent_thought_input;
  // Step supervision (coconut or pause_as_thought mode): loss += weight x the cross-entropy of
  // decoding each replaced step from its thoughts (reasoning/training_loss.h, thought_step_loss); in
  // pause_as_thought, from what Coconut would have fed back in each pause column (thought_input of
  // the hidden state before it), which nothing then reads. 0 = off (the paper).
  double thought_step_loss = 0;
  // Reachable-set supervision (coconut or pause_as_thought mode, data with ProsQA graphs): loss +=
  // weight x each thought's KL divergence from the uniform distribution over the nodes within its
  // hop count of the root (reasoning/training_loss.h, thought_reachable_loss); in pause_as_thought,
  // the hidden state before each pause token (where Coconut's thought comes from). 0 = off.
  double thought_reachable_loss = 0;
  // ... and each thought's divergence weighted by thought index (a list, in YAML or "4,1" on the
  // command line; the last weight for every later thought): {4, 1} asks the first thought, the
  // root's children, to be learned four times as hard as the deeper sets. {1} = all alike.
  std::vector<double> thought_reachable_weights = {1.0};
  // ... and where the sets start: "children" (thought j: within j + 1 edges, the root left out) or
  // "root" (thought j: within j edges, the root included; the first thought names the root).
  std::string thought_reachable_start = "children";
  // Probability, per training sequence with every step in thoughts, that the answer sees the
  // question only through the thoughts (SequenceOptions::latent_bottleneck). 0 = never.
  double latent_bottleneck = 0.0;
  bool thought_step_answer = false;   // ... and the last thoughts decode the answer too (SequenceOptions)
  int64_t pause_tokens = 0;           // pause mode
  int64_t remove_per_epoch = 8;       // icot: CoT tokens removed per epoch
  double removal_smoothing_lambda = 0;  // icot: extra removal o ~ exp(-lambda o); 0 = off

  // Knowledge distillation (healing a pruned model): loss = (1 - w) CE + w T^2 KL(teacher_T || student_T)
  // on the labelled tokens, the teacher (e.g. the unpruned model) run on the same batch.
  std::string distill_from;           // teacher HF folder (same tokenizer); empty = off
  double distill_weight = 0.5, distill_temperature = 1.0;

  // LoRA (parameter-efficient fine-tuning, e.g. healing): lora_rank > 0 freezes the model and
  // trains rank-r adapters on `lora_targets` with scale lora_alpha / lora_rank; checkpoints hold
  // the merged weights (plus the adapters, for resume). The defaults are LLM-Pruner's.
  int64_t lora_rank = 0;              // 0 = full fine-tuning
  double lora_alpha = 16;
  std::vector<std::string> lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  // A PEFT adapter (same rank and targets) the adapters and trained token rows start from instead
  // of PEFT's initialisation: a run continued from shipped adapters alone, e.g. on another machine
  // (the optimizer starts afresh). Ignored on resume, which has the run's own state.
  std::string init_adapter;

  // Depth router (compute-adaptive depth): depth_router gives the model one gate per layer (when
  // it has none) and trains it with straight-through Gumbel-sigmoid decisions on the positions
  // generation runs one at a time; loss += router_penalty * expected fraction of layers run there.
  bool depth_router = false;
  double router_penalty = 0.1;
  double router_noise = 1.0;          // logistic noise scale of the decisions (0 = deterministic)
  double router_init_bias = 3.0;      // new gates start at sigmoid(bias): every layer runs
  bool router_only = false;           // train the gates alone, the model frozen
  double router_lr_scale = 10;        // the gates learn at lr x this (no weight decay)
  int64_t router_first_layer = 0;     // layers before it always run

  // Stochastic depth (LayerDrop / LayerSkip), for a model meant to run sub-stacks at test time:
  // each example of a step drops layer l with probability layer_drop * l / (L - 1) (none for the
  // first layer, layer_drop for the last), the same layers in all its passes (ForwardOptions::
  // layer_keep); the draws are seeded per micro-batch from `seed`. 0 = off.
  // layer_drop_schedule "flat": every layer but the first with probability layer_drop (LayerDrop's).
  double layer_drop = 0;
  std::string layer_drop_schedule = "rising";  // rising | flat
  // Sampled prefixes (LayerSkip's early exit through the shared head, per example): with probability
  // prefix_drop an example runs only its first K layers, K uniform in [prefix_min_layers (0:
  // ceil(L / 2)), L - 1], and its loss reads the head from there: what a depth cascade's shallow
  // levels run. On top of layer_drop's mask. 0 = off.
  double prefix_drop = 0;
  int64_t prefix_min_layers = 0;
  // Nested sub-stacks (the static pruning order, e.g. [1, 5, 3, 7]: the layers a static model loses
  // first): with probability nested_drop an example drops the first k layers of nested_drop_order,
  // k uniform in [1, its length], so each sub-stack a static ranking would keep trains as one.
  // On top of the masks above. 0 = off.
  double nested_drop = 0;
  std::vector<int64_t> nested_drop_order;

  // Optimisation.
  double lr = 1e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::string schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;          // cosine floor as a fraction of lr
  double max_grad_norm = 1.0;         // 0 = no clipping
  int64_t batch_size = 16, gradient_accumulation_steps = 1;
  int64_t group_by_length = 0;        // windows of this many batches sorted by length (Curriculum), 0 = off
  uint64_t seed = 0;
  int64_t max_steps = 0;              // stop after this many optimizer steps (0 = run every epoch)
  // Data parallelism: 0 = every rank holds the whole AdamW state; 2 = ZeRO stage 2, each rank keeps
  // the moments, master values and averaged gradients of 1/W of the parameters (distributed/zero.h).
  int64_t zero_stage = 0;
  // Activation checkpointing of the decoder layers (ForwardOptions::checkpoint_layers): passes
  // without a KV cache keep only each layer's input and recompute the rest in backward.
  bool activation_checkpointing = false;
  // Paths of a step that compute the same thing (issue 70: a GPU path stays as it was until a lease
  // has compared the two; "auto" is each one's rule):
  // - last_layer_cut: the last layer runs only the columns the loss reads (cuts_last_layer: the CPU);
  // - frozen_base_bf16: under LoRA with bf16 autocast, the frozen projections held in bf16
  //   (frozen_projection_weights), the same products without a copy per pass; auto: off until a
  //   lease has compared it (a run's merged checkpoints then start from the bf16 base).
  // - chunked_head_loss: the head's cross-entropy a chunk of rows at a time, its [N, V] logits never
  //   kept (head_cross_entropy; not with distill_from); auto: off until measured.
  std::string last_layer_cut = "auto";     // auto | true | false
  std::string frozen_base_bf16 = "auto";   // auto | true | false
  std::string chunked_head_loss = "auto";  // auto | true | false
  // The first compare_paths x (arms + 1) optimizer steps alternate the step's paths (the old one, each
  // new one alone, all new ones) a step at a time, the first round unmeasured, and log each arm's
  // tokens/s (an event "path_comparison" in metrics.jsonl); then the run goes on as configured. 0: off.
  int64_t compare_paths = 0;

  // Bookkeeping.
  int64_t log_every = 10;             // optimizer steps between progress lines
  int64_t save_every_steps = 0;       // 0 = at the end of each epoch only
  int64_t keep_checkpoints = 2;
  bool resume = false;
  int64_t eval_every_epochs = 1;      // validation loss and accuracy (0 = never)
  // ... also every N optimizer steps and, then, where max_steps stops a run (0: at epochs' ends only).
  int64_t eval_every_steps = 0;
  int64_t val_generate_limit = 200;   // examples decoded for validation accuracy
  int64_t max_new_tokens = 128;
  int64_t eval_batch_size = 32;

  TrainingMode training_mode() const { return training_mode_from_name(mode); }
  // Modes whose layout follows the stage curriculum (Curriculum::staged).
  bool uses_stages() const;
  // How training plans its epochs (stages, fact shuffling, distractor dropping, batches).
  Curriculum curriculum() const;
  // What the model trained to `stage` is saved with (coconut.json), and its sequence layout.
  ReasoningSettings reasoning_settings(int64_t stage) const;
  SequenceOptions sequence_options(int64_t stage) const;
  std::string resolved_output_dir() const { return output_dir.empty() ? "runs/" + name : output_dir; }
  void validate() const;  // throws std::invalid_argument naming source and key
  nlohmann::json to_json() const;
};

// Reads a YAML file; then applies overrides "key=value" (value parsed as YAML).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});
TrainConfig train_config_from_yaml_text(const std::string& text, const std::string& source,
                                        const std::vector<std::string>& overrides = {});

}  // namespace coconut
