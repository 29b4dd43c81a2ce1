// Training sequences for every mode, following the reference Coconut implementation's layout:
//   question: encode(question + "\n") with BOS first when the tokenizer has one
//   step i:   encode(step + "\n")
//   answer:   encode("### " + answer) + [EOS]
//   coconut stage k, c thoughts per step:
//     question <bot> <latent> x (k*c) <eot> steps[k:] answer      (labels: -100 up to <eot>)
// Loss only on what must be predicted: never on the question, markers, latents or padding.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/example.h"
#include "text/tokenizer.h"

namespace coconut {

constexpr int64_t kIgnoreLabel = -100;

// kLm: plain language modelling (data/text_documents.h): a sequence is one window of packed
// documents in TokenizedExample::question, and every token is learned (no markers, no answer).
enum class TrainingMode { kNoCot, kCot, kCoconut, kNoThoughts, kPauseAsThought, kPause, kIcot, kLm };
TrainingMode training_mode_from_name(const std::string& name);  // "no_cot", "cot", "coconut", ..., "lm"
std::string training_mode_name(TrainingMode mode);

struct SpecialTokenIds {
  std::optional<int64_t> bos;
  int64_t eos = -1;
  int64_t start_latent = -1;  // <|start-latent|>
  int64_t end_latent = -1;    // <|end-latent|>
  int64_t latent = -1;        // <|latent|>
  int64_t pause = -1;         // <|pause|> (pause modes)
  int64_t pad = 0;
};

struct TokenizedExample {
  std::vector<int64_t> question;               // BOS + question + "\n"
  std::vector<std::vector<int64_t>> steps;     // each step + "\n"
  std::vector<int64_t> answer;                 // "### " + answer + EOS
  // ProsQA-format graphs only (data/prosqa.h): reachable[h - 1] holds the token of every node within
  // h edges of the root (a name's last token: the word itself with a word-level vocabulary); empty
  // for examples without a graph.
  std::vector<std::vector<int64_t>> reachable;
  int64_t root_token = -1;  // the root's token (-1 without a graph)
};

TokenizedExample tokenize_example(const Example& example, const Tokenizer& tokenizer, const SpecialTokenIds& special);

struct SequenceOptions {
  TrainingMode mode = TrainingMode::kCot;
  int64_t stage = 0;              // coconut / no_thoughts / pause_as_thought: steps replaced
  int64_t c_thought = 1;          // thoughts per replaced step
  int64_t max_latent_stage = 3;   // stages beyond it drop every step and keep max latents
  bool pad_latent_to_max = false; // beyond max: max_latent_stage thoughts even for short chains
  int64_t pause_tokens = 0;       // pause mode
  int64_t removed_tokens = 0;     // icot: CoT tokens removed from the front
  // Coconut step supervision: when every step is in thoughts, the last group of thoughts decodes
  // its step and then the answer (so the answer is computed into the thoughts, where the question
  // is in view, instead of read off them afterwards).
  bool answer_in_last_thought = false;
  // Coconut on graphs: thought j's reachable set is the nodes within j / c edges of the root, the
  // root included (the first thoughts hold the root alone), in place of within 1 + j / c edges
  // without the root. Then a thought that names the root is fed back as the next one's input, and
  // the next hop matches facts against that input instead of finding the root in the question first.
  bool reachable_from_root = false;
  // Coconut latent bottleneck (reasoning/latent_forward.h): when every step is in thoughts, the
  // answer sees the question only through them. Drawn per sequence in training (latent_bottleneck).
  bool latent_bottleneck = false;
};

struct Sequence {
  std::vector<int64_t> ids;
  std::vector<int64_t> labels;     // kIgnoreLabel where no loss
  int64_t first_latent = -1;       // column of the first latent (-1: none)
  int64_t latent_count = 0;
  // pause_as_thought: the thought columns hold <|pause|> tokens, read as plain inputs (nothing is
  // fed back); they are laid out, batched and supervised (latent_reachable) as Coconut's thoughts
  // are, so the two modes differ only in what a thought column's input is.
  bool thoughts_are_pauses = false;
  // Coconut and pause_as_thought: the steps the thoughts (pause columns) stand for, in order, thoughts [i*c, (i+1)*c) for step i (c =
  // c_thought); what step supervision decodes each group of thoughts into. Steps beyond the last
  // thought (stages past max_latent_stage) have none. With answer_in_last_thought and every step in
  // thoughts, the last entry is that step followed by the answer.
  std::vector<std::vector<int64_t>> latent_steps;
  int64_t thoughts_per_step = 1;
  bool latent_bottleneck = false;  // the columns after the thoughts see no column before <bot>
  // Coconut on graphs (TokenizedExample::reachable): per thought, the tokens of the nodes within h
  // edges of the root, h = 1 + (thought index) / c (the last set for thoughts beyond the graph's
  // depth; with SequenceOptions::reachable_from_root h = (thought index) / c and the root
  // included); what the reachable-set supervision puts each thought's probability mass on. Empty
  // without a graph.
  std::vector<std::vector<int64_t>> latent_reachable;
};

Sequence build_sequence(const TokenizedExample& example, const SequenceOptions& options, const SpecialTokenIds& special);

// The thoughts a Coconut model gets at curriculum stage `stage` for an example with `step_count`
// steps (the training layout's rule: stage k -> k * c; beyond max_latent_stage -> the maximum,
// or min(steps, maximum) without padding).
int64_t latent_thoughts_for_stage(int64_t stage, int64_t step_count, const SequenceOptions& options);

// The reference's uniform_prob mixing: with probability p a random stage in [0, steps] instead.
int64_t sample_stage(int64_t scheduled_stage, int64_t step_count, double uniform_prob, std::mt19937_64& rng);

struct Batch {
  torch::Tensor ids;             // [B, T] int64, pad where padded
  torch::Tensor labels;          // [B, T] int64, kIgnoreLabel where no loss
  torch::Tensor attention_mask;  // [B, T] int64, 1 real, 0 padding
  torch::Tensor positions;       // [B, T] int64, 0 at each row's first real token
  int64_t first_latent = -1;     // same column in every row (-1: no latents)
  int64_t latent_count = 0;
  bool thoughts_are_pauses = false;  // Sequence::thoughts_are_pauses (every row with thoughts agrees)
  std::vector<std::vector<std::vector<int64_t>>> latent_steps;  // per row: Sequence::latent_steps
  int64_t thoughts_per_step = 1;
  torch::Tensor bottleneck_rows;  // [B] bool: Sequence::latent_bottleneck; undefined when no row has it
  std::vector<std::vector<std::vector<int64_t>>> latent_reachable;  // per row: Sequence::latent_reachable
};

// Left-pads rows so that the first latent sits in the same column in every row (as the reference
// collator does), then right-pads to the longest row. Rows must agree on the number of latents
// (bucket them first); rows without latents are only right-padded.
Batch collate(const std::vector<Sequence>& sequences, int64_t pad_id);

// Rows 0..keys.size()-1 in batches of at most `batch_size` rows that share a key (collate needs
// equal thought counts; generation, equal thoughts and tokens after them): the groups in
// ascending key order, the rows of a group in index order. Training, scoring and evaluation all
// batch this way.
template <typename Key>
std::vector<std::vector<size_t>> batches_of_equal_keys(const std::vector<Key>& keys, int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument("batch size must be at least 1, got " + std::to_string(batch_size));
  std::map<Key, std::vector<size_t>> groups;
  for (size_t row = 0; row < keys.size(); ++row) groups[keys[row]].push_back(row);
  std::vector<std::vector<size_t>> batches;
  const auto size = static_cast<size_t>(batch_size);
  for (const auto& [key, rows] : groups)
    for (size_t begin = 0; begin < rows.size(); begin += size)
      batches.emplace_back(rows.begin() + static_cast<std::ptrdiff_t>(begin),
                           rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), begin + size)));
  return batches;
}

// Seeded epoch order: a permutation of [0, size) that depends only on (seed, epoch).
std::vector<size_t> epoch_order(size_t size, uint64_t seed, int64_t epoch);

}  // namespace coconut
