// The training curriculum, one epoch at a time: the stage the epoch trains, the examples in a seeded
// order (their facts reshuffled and distractors dropped where asked), each laid out at its own
// sampled stage, and the batches, each of one thought count. Every random choice derives from
// (seed, epoch), so a run resumed in the middle of an epoch rebuilds the plan it was following.
// Training plans its epochs here; TrainConfig::curriculum() says how.
#pragma once

#include <cstdint>
#include <vector>

#include "data/example.h"
#include "data/sequences.h"
#include "reasoning/layout.h"
#include "text/tokenizer.h"

namespace coconut {

struct Curriculum {
  ReasoningSettings layout;             // mode, c_thought, max_latent_stage, padding, pause tokens (its stage unused)
  bool answer_in_last_thought = false;  // the last thoughts also decode the answer (SequenceOptions)
  bool reachable_from_root = false;     // reachable sets start at the root itself (SequenceOptions)
  int64_t first_stage = 0;              // stage = first_stage + epoch / epochs_per_stage (staged modes)
  int64_t epochs_per_stage = 1;
  double uniform_prob = 0.0;            // chance that a sequence is laid out at a random earlier stage
  double latent_bottleneck = 0.0;       // chance that a sequence's answer sees the question only through the thoughts
  bool shuffle_facts = false;           // every epoch the question's sentences, but the query, in a new order
  std::vector<double> drop_unused_facts = {0.0};  // per epoch (the last for every later one): chance of leaving a distractor out
  bool keep_query_distractors = false;  // ... except facts sharing a rare word with the query
  int64_t remove_per_epoch = 0;         // icot: chain-of-thought tokens removed per epoch
  double removal_smoothing_lambda = 0;  // icot: o extra tokens removed with P(o) ~ exp(-lambda o); 0 = off
  int64_t batch_size = 1;
  // Length grouping (as HF's group_by_length and fairseq's batching): within a thought count, windows
  // of group_by_length x batch_size sequences in epoch order are sorted by length before they are cut
  // into batches, and the batches are then shuffled; 0 keeps the epoch order. Rows of a batch then
  // have near lengths, so collate pads little (ProsQA at 128 rows: 28-29% padding -> 1-4%).
  int64_t group_by_length = 0;
  uint64_t seed = 0;

  TrainingMode mode() const { return training_mode_from_name(layout.mode); }
  bool staged() const;  // coconut, no_thoughts, pause_as_thought: the stage grows with the epochs
  int64_t stage_at(int64_t epoch) const;
  double drop_unused_facts_at(int64_t epoch) const;  // epoch counts from 0
};

struct PlannedBatch {
  std::vector<size_t> rows;  // indices into EpochPlan::sequences
};

struct EpochPlan {
  int64_t stage = 0;
  int64_t removed_tokens = 0;  // icot
  std::vector<Sequence> sequences;
  std::vector<PlannedBatch> batches;  // one thought count each; interleaved when the epoch mixes counts
};

// The positions collate makes of a plan's batches: the real tokens, and all of them with the
// padding (a batch with thoughts is left-padded to align them, then right-padded to its longest row).
struct PlanPositions {
  int64_t real = 0, padded = 0;
};
PlanPositions plan_positions(const EpochPlan& plan);

// `examples` are `raw_examples` tokenized once (in mode lm, windows of text: their own count, and
// raw_examples unread). With shuffle_facts they are not read (may be empty): each epoch tokenizes
// raw_examples anew, their facts in an order that depends only on (seed, epoch, example).
EpochPlan plan_epoch(const Curriculum& curriculum, const std::vector<Example>& raw_examples,
                     const std::vector<TokenizedExample>& examples, const Tokenizer& tokenizer,
                     const SpecialTokenIds& special, int64_t epoch);

}  // namespace coconut
