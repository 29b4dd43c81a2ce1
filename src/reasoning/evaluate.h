// Evaluation of a reasoning model on question / steps / answer examples: batched greedy decoding
// with a KV cache (continuous thoughts included), the reference's accuracy rule, and cost per
// question (generated tokens, latent thoughts, FLOPs from the exact accounting, latency).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "data/example.h"
#include "data/sequences.h"
#include "model/llama.h"
#include "reasoning/layout.h"
#include "reasoning/thought_control.h"
#include "text/tokenizer.h"

namespace coconut {

// The reference's rule: the text after the last '#', commas removed, surrounding spaces trimmed.
std::string extract_answer(const std::string& generated_text);
bool answer_matches(const std::string& generated_text, const std::string& expected_answer);

struct EvalOptions {
  TrainingMode mode = TrainingMode::kCot;
  int64_t pause_tokens = 0;     // pause mode: pause tokens after the question
  int64_t batch_size = 16;
  int64_t max_new_tokens = 128;
  DepthPolicy depth;            // early exit / router gate in thoughts and decoded tokens
  bool latent_bottleneck = false;  // the answer reads the question through the thoughts only (GenerationOptions)
  DepthCascade cascade;            // prefixes of the model, deeper where the answer is not confident (layout.h)
  // Thoughts per question, decided by peeking at its answer (model/generate.h): its counts replace
  // the examples' own; coconut mode, every layer, no depth cascade.
  ThoughtHalting halting;
  // A thought control (reasoning/thought_control.h): coconut mode, no depth cascade or halting.
  ThoughtReplacement replaced_thoughts;
  // Keep each question's fed-back thought inputs (Prediction::thought_inputs); no depth cascade.
  bool record_thoughts = false;
};

// What the model is given for one example: the prompt, then (Coconut) `latent_thoughts`
// continuous thoughts and the tokens after them (<|end-latent|>), then it decodes.
struct EvalPrompt {
  std::vector<int64_t> prompt;
  int64_t latent_thoughts = 0;
  std::vector<int64_t> after_latents;
};

// BOS + question + "\n", then per mode: coconut <bot> [K thoughts] <eot>; pause_as_thought
// <bot> K x <|pause|> <eot>; no_thoughts <bot><eot>; pause P x <|pause|>; others nothing.
EvalPrompt build_eval_prompt(const TokenizedExample& example, TrainingMode mode, int64_t latent_thoughts,
                             int64_t pause_tokens, const SpecialTokenIds& special);

// One level of a depth cascade an example ran: its answer there and what the level cost. Halting:
// one per thought count it peeked at, the answer kept last.
struct CascadeLevel {
  int64_t layers = 0;
  int64_t thoughts = 0;
  double confidence = 0;  // the lowest probability among the level's generated tokens (halting: its first peek_tokens)
  std::string generated_text;
  int64_t generated_tokens = 0;
  double flops = 0;       // this level alone: the prompt above the previous level's depth, thoughts, answer
                          // (halting: an undone peek its tokens after the thoughts and its answer; the kept
                          // answer the prompt, its thoughts and itself)
};

struct Prediction {
  size_t index = 0;
  std::string question, expected, generated_text, predicted;
  bool correct = false;
  int64_t generated_tokens = 0;  // language tokens, EOS included
  int64_t latent_thoughts = 0;
  int64_t prompt_tokens = 0;
  int64_t unknown_tokens = 0;    // prompt words the vocabulary does not know (encoded as its unknown token)
  double flops = 0;              // prompt prefill + thoughts + decoding (eval/cost.h), less early-exit savings
  double mean_layers = 0;        // layers run per thought / decoded position (all of them without early exit;
                                 // a cascade: the depth of the level whose answer is kept)
  double latency_seconds = 0;    // wall time of its batch divided by the batch's rows
  std::vector<std::string> thought_texts;  // decode_thoughts.h, when asked for: one per step's thoughts
  std::vector<std::vector<std::pair<std::string, double>>> thought_tops;  // thought_top_tokens, when asked for
  std::vector<CascadeLevel> cascade;  // a depth cascade or halting: each level run (flops and latency count them all)
  torch::Tensor thought_inputs;       // EvalOptions::record_thoughts: [n, D] float32 on the CPU, the inputs fed back
};

struct EvalSummary {
  std::string mode;  // the prompt layout evaluated (training_mode_name)
  size_t questions = 0;
  double accuracy = 0, mean_generated_tokens = 0, mean_latent_thoughts = 0, mean_flops = 0,
         mean_latency_seconds = 0, seconds = 0, mean_layers = 0;
  DepthCascade cascade;              // the depth cascade run (inactive: none)
  ThoughtHalting halting;            // the halting run (inactive: none)
  double deepened = 0;               // a depth cascade or halting: the fraction of questions that went past its first level
  int64_t unknown_tokens = 0;        // over all prompts
  size_t questions_with_unknown = 0; // questions whose prompt has at least one
  int64_t weight_bytes_per_step = 0; // what one batched decoding step reads of the weights (eval/cost.h)
  std::optional<ThoughtControlReport> thought_control;  // evaluate_with_thought_control: against the normal run
  std::vector<Prediction> predictions;
};

// `latent_thoughts[i]` is example i's thought count (coconut / pause_as_thought; ignored by other
// modes). Batches group examples of equal thought counts; within a batch prompts are left-padded.
// With options.cascade, each batch runs its first level, then the rows at or below the confidence
// the next level from their prompts' prefixes, and so on (no early exit or router with it).
EvalSummary evaluate(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                     const std::vector<Example>& examples, const std::vector<int64_t>& latent_thoughts,
                     const EvalOptions& options);

// A thought control's run: which, its seed, and (mean) the questions whose normal runs give the
// mean thoughts, with their thought counts (empty: the evaluated questions).
struct ThoughtControlRun {
  ThoughtControl control = ThoughtControl::kNone;
  uint64_t seed = 0;
  std::vector<Example> calibration;
  std::vector<int64_t> calibration_thoughts;
};

// The questions evaluated normally, then under `run`'s control (coconut mode; options' own
// replacement and recording are not used): the controlled summary, with thought_control comparing
// it to the normal run question by question (McNemar's exact test).
EvalSummary evaluate_with_thought_control(Llama& model, const Tokenizer& tokenizer, const SpecialTokenIds& special,
                                          const std::vector<Example>& examples, const std::vector<int64_t>& latent_thoughts,
                                          EvalOptions options, const ThoughtControlRun& run);

}  // namespace coconut
