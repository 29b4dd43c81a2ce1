#include "data/sequences.h"

#include "data/prosqa.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace coconut {

TrainingMode training_mode_from_name(const std::string& name) {
  if (name == "no_cot") return TrainingMode::kNoCot;
  if (name == "cot") return TrainingMode::kCot;
  if (name == "coconut") return TrainingMode::kCoconut;
  if (name == "no_thoughts") return TrainingMode::kNoThoughts;
  if (name == "pause_as_thought") return TrainingMode::kPauseAsThought;
  if (name == "pause") return TrainingMode::kPause;
  if (name == "icot") return TrainingMode::kIcot;
  if (name == "lm") return TrainingMode::kLm;
  throw std::invalid_argument("unknown training mode '" + name +
                              "' (expected no_cot, cot, coconut, no_thoughts, pause_as_thought, pause, icot or lm)");
}

std::string training_mode_name(TrainingMode mode) {
  switch (mode) {
    case TrainingMode::kNoCot: return "no_cot";
    case TrainingMode::kCot: return "cot";
    case TrainingMode::kCoconut: return "coconut";
    case TrainingMode::kNoThoughts: return "no_thoughts";
    case TrainingMode::kPauseAsThought: return "pause_as_thought";
    case TrainingMode::kPause: return "pause";
    case TrainingMode::kIcot: return "icot";
    case TrainingMode::kLm: return "lm";
  }
  return "?";
}

TokenizedExample tokenize_example(const Example& example, const Tokenizer& tokenizer, const SpecialTokenIds& special) {
  TokenizedExample tokenized;
  if (special.bos) tokenized.question.push_back(*special.bos);
  const auto question = tokenizer.encode(example.question + "\n");
  tokenized.question.insert(tokenized.question.end(), question.begin(), question.end());
  for (const auto& step : example.steps) tokenized.steps.push_back(tokenizer.encode(step + "\n"));
  tokenized.answer = tokenizer.encode("### " + example.answer);
  tokenized.answer.push_back(special.eos);
  if (const auto graph = prosqa_graph(example)) {
    std::vector<int64_t> node_tokens;
    for (const auto& name : graph->names) {
      const auto tokens = tokenizer.encode(name);
      if (tokens.empty()) throw std::invalid_argument("ProsQA node name '" + name + "' encodes to no token");
      node_tokens.push_back(tokens.back());
    }
    for (const auto& within : reachable_within_hops(*graph)) {
      std::vector<int64_t> tokens;
      for (int node : within) tokens.push_back(node_tokens[static_cast<size_t>(node)]);
      std::sort(tokens.begin(), tokens.end());
      tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
      tokenized.reachable.push_back(std::move(tokens));
    }
    tokenized.root_token = node_tokens[static_cast<size_t>(graph->root)];
  }
  return tokenized;
}

int64_t sample_stage(int64_t scheduled_stage, int64_t step_count, double uniform_prob, std::mt19937_64& rng) {
  if (uniform_prob <= 0.0) return scheduled_stage;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  if (coin(rng) >= uniform_prob) return scheduled_stage;
  std::uniform_int_distribution<int64_t> stage(0, step_count);
  return stage(rng);
}

int64_t latent_thoughts_for_stage(int64_t stage, int64_t step_count, const SequenceOptions& options) {
  int64_t thoughts = stage;
  if (stage > options.max_latent_stage)
    thoughts = options.pad_latent_to_max ? options.max_latent_stage : std::min(step_count, options.max_latent_stage);
  return thoughts * options.c_thought;
}

Sequence build_sequence(const TokenizedExample& example, const SequenceOptions& options, const SpecialTokenIds& special) {
  Sequence sequence;
  const auto append = [&](const std::vector<int64_t>& tokens, bool learn) {
    sequence.ids.insert(sequence.ids.end(), tokens.begin(), tokens.end());
    for (int64_t token : tokens) sequence.labels.push_back(learn ? token : kIgnoreLabel);
  };
  const auto append_steps = [&](size_t from) {
    for (size_t i = from; i < example.steps.size(); ++i) append(example.steps[i], true);
  };
  if (options.mode == TrainingMode::kLm) {  // a window of text: every token is learned
    append(example.question, true);
    return sequence;
  }
  append(example.question, false);
  const int64_t step_count = static_cast<int64_t>(example.steps.size());
  switch (options.mode) {
    case TrainingMode::kNoCot:
      break;
    case TrainingMode::kCot:
      append_steps(0);
      break;
    case TrainingMode::kCoconut:
    case TrainingMode::kNoThoughts:
    case TrainingMode::kPauseAsThought: {
      // Stage k replaces the first k steps by k * c thoughts; beyond max_latent_stage every step
      // goes and the thoughts stay at the maximum (or at the chain's length without padding).
      const int64_t skipped = options.stage > options.max_latent_stage ? step_count : options.stage;
      int64_t thoughts = latent_thoughts_for_stage(options.stage, step_count, options);
      if (options.mode == TrainingMode::kNoThoughts) thoughts = 0;
      append({special.start_latent}, false);
      const bool pauses = options.mode == TrainingMode::kPauseAsThought;
      if (thoughts > 0) {
        sequence.first_latent = static_cast<int64_t>(sequence.ids.size());
        sequence.latent_count = thoughts;
        sequence.thoughts_are_pauses = pauses;
        append(std::vector<int64_t>(static_cast<size_t>(thoughts), pauses ? special.pause : special.latent), false);
      }
      if (options.mode == TrainingMode::kCoconut || pauses) {
        // The steps the thoughts (or the pause columns' states) stand for: step supervision decodes them.
        sequence.thoughts_per_step = options.c_thought;
        const int64_t described = std::min({skipped, step_count, thoughts / options.c_thought});
        sequence.latent_steps.assign(example.steps.begin(), example.steps.begin() + described);
      }
      if (options.mode == TrainingMode::kCoconut) {
        const int64_t described = static_cast<int64_t>(sequence.latent_steps.size());
        if (options.answer_in_last_thought && described > 0 && described == step_count)
          sequence.latent_steps.back().insert(sequence.latent_steps.back().end(), example.answer.begin(), example.answer.end());
        sequence.latent_bottleneck = options.latent_bottleneck && thoughts > 0 && skipped >= step_count;
      }
      if (options.mode == TrainingMode::kCoconut || pauses) {
        if (!example.reachable.empty())
          for (int64_t thought = 0; thought < thoughts; ++thought) {
            const auto hops = static_cast<size_t>(thought / options.c_thought) + (options.reachable_from_root ? 0 : 1);
            std::vector<int64_t> set;
            if (hops > 0) set = example.reachable[std::min(hops, example.reachable.size()) - 1];
            if (options.reachable_from_root) {
              set.insert(std::lower_bound(set.begin(), set.end(), example.root_token), example.root_token);
              set.erase(std::unique(set.begin(), set.end()), set.end());
            }
            sequence.latent_reachable.push_back(std::move(set));
          }
      }
      append({special.end_latent}, false);
      append_steps(static_cast<size_t>(std::min(skipped, step_count)));
      break;
    }
    case TrainingMode::kPause:
      append(std::vector<int64_t>(static_cast<size_t>(options.pause_tokens), special.pause), false);
      break;
    case TrainingMode::kIcot: {
      std::vector<int64_t> chain;
      for (const auto& step : example.steps) chain.insert(chain.end(), step.begin(), step.end());
      const auto removed = static_cast<size_t>(std::min<int64_t>(options.removed_tokens, static_cast<int64_t>(chain.size())));
      append(std::vector<int64_t>(chain.begin() + static_cast<long>(removed), chain.end()), true);
      break;
    }
    case TrainingMode::kLm:
      break;  // returned above
  }
  append(example.answer, true);
  return sequence;
}

Batch collate(const std::vector<Sequence>& sequences, int64_t pad_id) {
  if (sequences.empty()) throw std::invalid_argument("collate: empty batch");
  int64_t latent_column = -1, latent_count = -1;
  bool pauses = false;
  for (const auto& sequence : sequences) {
    if (sequence.latent_count == 0) continue;
    if (latent_count >= 0 && sequence.latent_count != latent_count)
      throw std::invalid_argument("collate: rows have " + std::to_string(latent_count) + " and " +
                                  std::to_string(sequence.latent_count) + " latents; bucket batches by latent count");
    if (latent_count >= 0 && sequence.thoughts_are_pauses != pauses)
      throw std::invalid_argument("collate: rows mix continuous thoughts and pause tokens");
    latent_count = sequence.latent_count;
    pauses = sequence.thoughts_are_pauses;
    latent_column = std::max(latent_column, sequence.first_latent);
  }
  std::vector<int64_t> left(sequences.size(), 0);
  int64_t width = 0;
  for (size_t row = 0; row < sequences.size(); ++row) {
    if (sequences[row].latent_count > 0) left[row] = latent_column - sequences[row].first_latent;
    width = std::max(width, left[row] + static_cast<int64_t>(sequences[row].ids.size()));
  }
  const auto batch_size = static_cast<int64_t>(sequences.size());
  Batch batch;
  batch.ids = torch::full({batch_size, width}, pad_id, torch::kInt64);
  batch.labels = torch::full({batch_size, width}, kIgnoreLabel, torch::kInt64);
  batch.attention_mask = torch::zeros({batch_size, width}, torch::kInt64);
  batch.positions = torch::zeros({batch_size, width}, torch::kInt64);
  auto ids = batch.ids.accessor<int64_t, 2>();
  auto labels = batch.labels.accessor<int64_t, 2>();
  auto mask = batch.attention_mask.accessor<int64_t, 2>();
  auto positions = batch.positions.accessor<int64_t, 2>();
  for (size_t row = 0; row < sequences.size(); ++row) {
    const auto& sequence = sequences[row];
    const auto r = static_cast<int64_t>(row);
    for (size_t i = 0; i < sequence.ids.size(); ++i) {
      const int64_t column = left[row] + static_cast<int64_t>(i);
      ids[r][column] = sequence.ids[i];
      labels[r][column] = sequence.labels[i];
      mask[r][column] = 1;
      positions[r][column] = static_cast<int64_t>(i);
    }
  }
  batch.first_latent = latent_column;
  batch.latent_count = std::max<int64_t>(latent_count, 0);
  batch.thoughts_are_pauses = pauses;
  std::vector<uint8_t> bottleneck;
  for (const auto& sequence : sequences) {
    batch.latent_steps.push_back(sequence.latent_steps);
    batch.latent_reachable.push_back(sequence.latent_reachable);
    if (!sequence.latent_steps.empty()) batch.thoughts_per_step = sequence.thoughts_per_step;
    bottleneck.push_back(sequence.latent_bottleneck);  // set only on rows with thoughts (build_sequence)
  }
  if (std::find(bottleneck.begin(), bottleneck.end(), 1) != bottleneck.end())
    batch.bottleneck_rows = torch::tensor(bottleneck).to(torch::kBool);
  return batch;
}

std::vector<size_t> epoch_order(size_t size, uint64_t seed, int64_t epoch) {
  std::vector<size_t> order(size);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

}  // namespace coconut
