// Controls that show what Coconut's continuous thoughts carry (the question a 2026 re-evaluation of
// latent-reasoning models asked, arXiv 2602.22441: does the accuracy survive without them?). Each
// evaluates the same questions with every thought's fed-back input replaced:
//   zero     no thoughts, the markers kept (the same run as --latents 0)
//   noise    Gaussian noise of the replaced input's RMS, seeded per (seed, question, thought)
//   shuffle  the inputs the normal run of another question (of the same thought count) fed back
//   mean     thought k's mean input over the normal runs of a calibration set
//   token    the embedding of the thought's likeliest token under the LM head (a hard, one-token thought)
// evaluate (reasoning/evaluate.h) applies them; evaluate_with_thought_control runs the normal and
// the controlled evaluation and compares them question by question.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "eval/paired_test.h"

namespace coconut {

enum class ThoughtControl { kNone, kZero, kNoise, kShuffle, kMean, kToken };

// "none", "zero", "noise", "shuffle", "mean", "token"; anything else throws std::invalid_argument
// listing them.
ThoughtControl thought_control_from_name(const std::string& name);
const char* thought_control_name(ThoughtControl control);

// What evaluate feeds instead of the model's thoughts.
struct ThoughtReplacement {
  ThoughtControl control = ThoughtControl::kNone;
  uint64_t seed = 0;                  // noise
  torch::Tensor mean_thoughts;        // mean: [n, D], row k fed as thought k
  std::vector<torch::Tensor> donors;  // shuffle: per question, [n_i, D] the inputs fed as its thoughts
};

// Gaussian noise [D] with exactly the root-mean-square of `input` [D] (in its dtype and device),
// drawn from a generator seeded by (seed, question, thought): the same whatever the batching.
torch::Tensor noise_like_thought(const torch::Tensor& input, uint64_t seed, size_t question, int64_t thought);

// Shuffle: for each question, the question whose thoughts it is fed. Among the questions of one
// thought count, a random cycle (Sattolo's algorithm, seeded): none keeps its own unless it is alone
// in its count.
std::vector<size_t> thought_donors(const std::vector<int64_t>& thought_counts, uint64_t seed);

// Mean: row k the mean of the questions' k-th thoughts (over those that have one), from per-question
// inputs [n_i, D]; n the most thoughts any question has. Throws when none has a thought.
torch::Tensor mean_of_thoughts(const std::vector<torch::Tensor>& recorded);

// A controlled run against the normal one, on the same questions.
struct ThoughtControlReport {
  ThoughtControl control = ThoughtControl::kNone;
  uint64_t seed = 0;
  double uncontrolled_accuracy = 0;
  std::vector<bool> uncontrolled_correct;  // per question, the normal run
  McNemarTest test;                        // first: the normal run; second: the controlled one
  size_t mean_over_questions = 0;          // mean: the calibration questions averaged
};

}  // namespace coconut
