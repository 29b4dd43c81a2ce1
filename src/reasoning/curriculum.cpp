#include "reasoning/curriculum.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace coconut {

bool Curriculum::staged() const {
  const TrainingMode m = mode();
  return m == TrainingMode::kCoconut || m == TrainingMode::kNoThoughts || m == TrainingMode::kPauseAsThought;
}

int64_t Curriculum::stage_at(int64_t epoch) const { return staged() ? first_stage + epoch / epochs_per_stage : 0; }

double Curriculum::drop_unused_facts_at(int64_t epoch) const {
  return drop_unused_facts[std::min(static_cast<size_t>(std::max<int64_t>(epoch, 0)), drop_unused_facts.size() - 1)];
}

EpochPlan plan_epoch(const Curriculum& curriculum, const std::vector<Example>& raw_examples,
                     const std::vector<TokenizedExample>& examples, const Tokenizer& tokenizer,
                     const SpecialTokenIds& special, int64_t epoch) {
  const TrainingMode mode = curriculum.mode();
  const uint64_t seed = curriculum.seed;
  EpochPlan plan;
  plan.stage = curriculum.stage_at(epoch);
  plan.removed_tokens = mode == TrainingMode::kIcot ? epoch * curriculum.remove_per_epoch : 0;
  std::mt19937_64 rng(seed * 7919ULL + static_cast<uint64_t>(epoch) * 104729ULL + 17);
  SequenceOptions scheduled = curriculum.layout.sequence_options(plan.stage);
  scheduled.answer_in_last_thought = curriculum.answer_in_last_thought;
  scheduled.reachable_from_root = curriculum.reachable_from_root;
  const size_t count = curriculum.shuffle_facts ? raw_examples.size() : examples.size();
  for (size_t position : epoch_order(count, seed, epoch)) {
    TokenizedExample reordered;
    if (curriculum.shuffle_facts) {
      std::mt19937_64 fact_rng(seed * 15485863ULL + static_cast<uint64_t>(epoch) * 32452843ULL + position);
      reordered = tokenize_example(shuffle_question_sentences(raw_examples[position], fact_rng,
                                                              curriculum.drop_unused_facts_at(epoch),
                                                              curriculum.keep_query_distractors),
                                   tokenizer, special);
    }
    const auto& example = curriculum.shuffle_facts ? reordered : examples[position];
    SequenceOptions options = scheduled;
    if (curriculum.staged())
      options.stage = sample_stage(plan.stage, static_cast<int64_t>(example.steps.size()), curriculum.uniform_prob, rng);
    if (curriculum.latent_bottleneck > 0)  // drawn only when asked for, so other runs keep their random stream
      options.latent_bottleneck = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < curriculum.latent_bottleneck;
    options.removed_tokens = plan.removed_tokens;
    if (mode == TrainingMode::kIcot && curriculum.removal_smoothing_lambda > 0) {
      // Removal smoothing: o extra tokens with P(o) proportional to exp(-lambda o).
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      options.removed_tokens += static_cast<int64_t>(std::floor(-std::log1p(-u) / curriculum.removal_smoothing_lambda));
    }
    plan.sequences.push_back(build_sequence(example, options, special));
  }
  std::vector<int64_t> latents;  // per sequence, in epoch order
  for (const auto& sequence : plan.sequences) latents.push_back(sequence.latent_count);
  // Each thought count's rows in windows (epoch order): a batch each, or with length grouping
  // group_by_length batches sorted by length, then cut.
  const int64_t window = curriculum.group_by_length * curriculum.batch_size;
  const auto size = static_cast<size_t>(curriculum.batch_size);
  for (auto& rows : batches_of_equal_keys(latents, window > 0 ? window : curriculum.batch_size)) {
    if (window > 0)
      std::stable_sort(rows.begin(), rows.end(),
                       [&](size_t a, size_t b) { return plan.sequences[a].ids.size() < plan.sequences[b].ids.size(); });
    for (size_t begin = 0; begin < rows.size(); begin += size)
      plan.batches.push_back({std::vector<size_t>(rows.begin() + static_cast<std::ptrdiff_t>(begin),
                                                  rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), begin + size)))});
  }
  // Batches of several thought counts are interleaved, and grouped batches (short to long within a
  // window otherwise); one count in epoch order keeps it.
  const bool mixed = std::any_of(latents.begin(), latents.end(), [&](int64_t count) { return count != latents.front(); });
  if (mixed || window > 0) std::shuffle(plan.batches.begin(), plan.batches.end(), rng);
  return plan;
}

PlanPositions plan_positions(const EpochPlan& plan) {
  PlanPositions positions;
  for (const auto& batch : plan.batches) {
    int64_t before = 0, from = 0;  // the most columns before the first thought, and from it on
    for (size_t row : batch.rows) {
      const auto& sequence = plan.sequences[row];
      const auto length = static_cast<int64_t>(sequence.ids.size());
      const int64_t first = sequence.latent_count > 0 ? sequence.first_latent : 0;
      before = std::max(before, first);
      from = std::max(from, length - first);
      positions.real += length;
    }
    positions.padded += (before + from) * static_cast<int64_t>(batch.rows.size());
  }
  return positions;
}

}  // namespace coconut
