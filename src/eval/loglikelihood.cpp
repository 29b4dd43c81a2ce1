#include "eval/loglikelihood.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/kv_cache.h"

namespace coconut {

std::vector<TextWindow> perplexity_windows(int64_t tokens, int64_t window, int64_t stride) {
  if (window < 2) throw std::invalid_argument("perplexity: the window must hold at least 2 tokens");
  if (stride < 1 || stride > window) throw std::invalid_argument("perplexity: the stride must be in 1..window");
  if (tokens < 2) throw std::invalid_argument("perplexity: the text must hold at least 2 tokens");
  std::vector<TextWindow> windows;
  int64_t previous_end = 0;
  for (int64_t begin = 0; begin < tokens; begin += stride) {
    const int64_t end = std::min(begin + window, tokens);
    // The tokens this window reaches that no earlier one scored; never the window's first position.
    const int64_t first_scored = std::max(previous_end, begin + 1);
    if (first_scored < end) windows.push_back({begin, end, first_scored});
    previous_end = end;
    if (end == tokens) break;
  }
  return windows;
}

std::vector<TextWindow> llama_perplexity_windows(int64_t tokens, int64_t window) {
  if (window < 3) throw std::invalid_argument("perplexity: a llama-perplexity chunk must hold at least 3 tokens");
  if (tokens < window)
    throw std::invalid_argument("perplexity: the text holds " + std::to_string(tokens) + " tokens, less than one chunk of " +
                                std::to_string(window));
  std::vector<TextWindow> windows;
  // llama-perplexity's `first` = window/2 is the first position whose logits count: it predicts the token after it.
  for (int64_t begin = 0; begin + window <= tokens; begin += window) windows.push_back({begin, begin + window, begin + window / 2 + 1});
  return windows;
}

double PerplexityResult::perplexity() const { return scored > 0 ? std::exp(nll / static_cast<double>(scored)) : 0.0; }

namespace {

torch::Device model_device(Llama& model) { return model->embed_tokens->weight.device(); }

// log p(ids[t] | ids[..t]) summed over `targets` [N] at rows `predicting` [N] of `hidden` [T, D].
double summed_log_probability(Llama& model, const torch::Tensor& hidden, const torch::Tensor& predicting,
                              const torch::Tensor& targets) {
  const auto log_probs = torch::log_softmax(model->logits(hidden.index_select(0, predicting)), -1);  // [N, V] float32
  return log_probs.gather(1, targets.view({-1, 1})).to(torch::kFloat64).sum().item<double>();
}

torch::Tensor ids_tensor(const std::vector<int64_t>& ids, torch::Device device) {
  return torch::tensor(ids, torch::kInt64).to(device);
}

}  // namespace

PerplexityResult score_text(Llama& model, const std::vector<int64_t>& ids, int64_t window, int64_t stride, int64_t batch_size,
                            const LoglikelihoodProgress& progress) {
  return score_windows(model, ids, perplexity_windows(static_cast<int64_t>(ids.size()), window, stride), batch_size, -1, progress);
}

PerplexityResult score_windows(Llama& model, const std::vector<int64_t>& ids, const std::vector<TextWindow>& windows,
                               int64_t batch_size, int64_t window_first_token, const LoglikelihoodProgress& progress) {
  if (batch_size < 1) throw std::invalid_argument("perplexity: the batch size must be positive");
  torch::NoGradGuard no_grad;
  const auto device = model_device(model);
  PerplexityResult result;
  result.tokens = static_cast<int64_t>(ids.size());
  result.windows = static_cast<int64_t>(windows.size());
  const auto total = static_cast<int64_t>(windows.size());
  for (int64_t first = 0; first < total; first += batch_size) {
    const int64_t count = std::min(batch_size, total - first);
    int64_t longest = 0;
    for (int64_t w = first; w < first + count; ++w) longest = std::max(longest, windows[w].end - windows[w].begin);
    // [B, L]: each window's ids, a shorter one padded on the right with its own last id (never scored).
    auto batch = torch::empty({count, longest}, torch::kInt64);
    auto rows = batch.accessor<int64_t, 2>();
    for (int64_t b = 0; b < count; ++b) {
      const auto& w = windows[first + b];
      for (int64_t t = 0; t < longest; ++t) rows[b][t] = ids[std::min(w.begin + t, w.end - 1)];
      if (window_first_token >= 0) rows[b][0] = window_first_token;
    }
    const auto hidden = model->forward_ids(batch.to(device)).hidden;  // [B, L, D]
    for (int64_t b = 0; b < count; ++b) {
      const auto& w = windows[first + b];
      const int64_t scored = w.end - w.first_scored;
      // Position t - 1 predicts token t, for t in [first_scored, end), relative to the window.
      const auto predicting = torch::arange(w.first_scored - 1 - w.begin, w.end - 1 - w.begin, torch::kInt64).to(device);
      const std::vector<int64_t> targets(ids.begin() + w.first_scored, ids.begin() + w.end);
      result.nll -= summed_log_probability(model, hidden[b], predicting, ids_tensor(targets, device));
      result.scored += scored;
    }
    if (progress) progress(first + count, total, result.scored);
  }
  return result;
}

EncodedChoices encode_choices(const Tokenizer& tokenizer, const std::string& context, const std::vector<std::string>& choices,
                              int64_t prefix_token) {
  EncodedChoices encoded;
  // Whitespace ending the context belongs to the continuation (lm-evaluation-harness's _encode_pair).
  const size_t kept = context.find_last_not_of(" \t\n\r\f\v");
  const std::string context_text = kept == std::string::npos ? std::string() : context.substr(0, kept + 1);
  const std::string moved = context.substr(context_text.size());
  encoded.context = context_text.empty() ? std::vector<int64_t>{prefix_token} : tokenizer.encode(context_text);
  for (size_t c = 0; c < choices.size(); ++c) {
    const std::string continuation = moved + choices[c];
    std::vector<int64_t> tokens;
    if (context_text.empty()) {
      tokens = tokenizer.encode(continuation);
    } else {
      const auto whole = tokenizer.encode(context_text + continuation);
      const auto split = std::min(encoded.context.size(), whole.size());
      tokens.assign(whole.begin() + static_cast<std::ptrdiff_t>(split), whole.end());
    }
    if (tokens.empty()) throw std::invalid_argument("choice " + std::to_string(c) + " encodes to no token after the context");
    encoded.continuations.push_back(std::move(tokens));
  }
  return encoded;
}

std::vector<double> score_choices(Llama& model, const EncodedChoices& item, int64_t max_length) {
  if (item.context.empty()) throw std::invalid_argument("score_choices: an empty context (give the prefix token)");
  if (item.continuations.empty()) throw std::invalid_argument("score_choices: no choices");
  int64_t longest = 0;
  for (const auto& tokens : item.continuations) {
    if (tokens.empty()) throw std::invalid_argument("score_choices: a choice without tokens");
    longest = std::max(longest, static_cast<int64_t>(tokens.size()));
  }
  if (longest >= max_length)
    throw std::invalid_argument("score_choices: a choice of " + std::to_string(longest) + " tokens leaves no room for its context in " +
                                std::to_string(max_length));
  torch::NoGradGuard no_grad;
  const auto device = model_device(model);
  // The context's last tokens, so that context + the longest continuation minus its last token fit.
  const auto context_kept = std::min(static_cast<int64_t>(item.context.size()), max_length + 1 - longest);
  const std::vector<int64_t> context(item.context.end() - context_kept, item.context.end());
  const auto choices = static_cast<int64_t>(item.continuations.size());
  const auto dtype = attention_dtype(model->embed_tokens->weight.scalar_type(), device);
  KVCache cache = KVCache::preallocated(model->config(), 1, context_kept + longest, dtype, device);
  // The context once; its last position predicts every continuation's first token.
  const auto context_hidden = model->forward_ids(ids_tensor(context, device).view({1, -1}), &cache).hidden;  // [1, C, D]
  const auto first_log_probs = torch::log_softmax(model->logits(context_hidden[0][context_kept - 1]), -1).to(torch::kCPU);  // [V]
  std::vector<double> scores(static_cast<size_t>(choices));
  for (int64_t c = 0; c < choices; ++c)
    scores[c] = first_log_probs[item.continuations[c][0]].item<double>();
  if (longest == 1) return scores;
  // Every continuation but its last token, one row each from the context's cache: [n, longest - 1],
  // padded on the right (causal attention keeps the padding out of every scored position).
  cache.repeat_row(choices);
  auto inputs = torch::zeros({choices, longest - 1}, torch::kInt64);
  auto rows = inputs.accessor<int64_t, 2>();
  std::vector<int64_t> predicting, targets;  // flat positions into [n * (longest - 1)] and their tokens
  for (int64_t c = 0; c < choices; ++c) {
    const auto& tokens = item.continuations[c];
    const auto length = static_cast<int64_t>(tokens.size());
    for (int64_t t = 0; t + 1 < length; ++t) {
      rows[c][t] = tokens[t];
      predicting.push_back(c * (longest - 1) + t);
      targets.push_back(tokens[t + 1]);
    }
  }
  const auto hidden = model->forward_ids(inputs.to(device), &cache).hidden;  // [n, longest - 1, D]
  const auto flat = hidden.reshape({-1, hidden.size(2)});                    // [n * (longest - 1), D]
  const auto log_probs = torch::log_softmax(model->logits(flat.index_select(0, ids_tensor(predicting, device))), -1);  // [N, V]
  const auto picked = log_probs.gather(1, ids_tensor(targets, device).view({-1, 1})).squeeze(1).to(torch::kFloat64).to(torch::kCPU);
  const auto values = picked.accessor<double, 1>();
  size_t next = 0;
  for (int64_t c = 0; c < choices; ++c)
    for (size_t t = 1; t < item.continuations[c].size(); ++t) scores[c] += values[static_cast<int64_t>(next++)];
  return scores;
}

int64_t argmax_choice(const std::vector<double>& scores) {
  if (scores.empty()) throw std::invalid_argument("argmax_choice: no scores");
  return std::distance(scores.begin(), std::max_element(scores.begin(), scores.end()));
}

int64_t argmax_choice_normalized(const std::vector<double>& scores, const std::vector<std::string>& choices) {
  if (scores.size() != choices.size()) throw std::invalid_argument("argmax_choice_normalized: scores and choices differ in count");
  std::vector<double> normalized(scores.size());
  for (size_t c = 0; c < scores.size(); ++c) {
    // Python's len(): code points, the UTF-8 bytes that do not continue a character.
    const auto characters = std::count_if(choices[c].begin(), choices[c].end(), [](char byte) {
      return (static_cast<unsigned char>(byte) & 0xC0) != 0x80;
    });
    normalized[c] = scores[c] / static_cast<double>(std::max<std::ptrdiff_t>(1, characters));
  }
  return argmax_choice(normalized);
}

}  // namespace coconut
