// Log-likelihood evaluation of a language model, as the field measures one: perplexity of a text
// scored in windows (HF transformers' perplexity guide) and zero-shot multiple choice scored as
// lm-evaluation-harness scores it (the sum of a continuation's token log-probabilities given the
// context; acc and acc_norm). Model code only: the CLI (coconut eval-lm) reads files and writes
// results.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "text/tokenizer.h"

namespace coconut {

// One window of a text's token ids: positions [begin, end) run together, and the tokens at
// [first_scored, end) are scored (each predicted from the positions before it in the window).
struct TextWindow {
  int64_t begin = 0, end = 0, first_scored = 0;
};

// HF's perplexity guide: windows of `window` tokens every `stride`; each window scores the tokens
// the previous one did not reach, so with stride < window every token after the first is scored
// once, with up to window - stride tokens of left context. A window's first position is never
// scored (nothing in the window predicts it): with stride == window (non-overlapping) each window's
// first token goes unscored, as in the guide. Throws std::invalid_argument for window < 2, stride
// < 1, stride > window or fewer than 2 tokens.
std::vector<TextWindow> perplexity_windows(int64_t tokens, int64_t window, int64_t stride);

// llama.cpp's llama-perplexity: the text in whole chunks of `window` tokens (a shorter rest is
// left out), each scoring its second half, the tokens at window/2 + 1 .. window - 1 of the chunk,
// so every scored token has at least window/2 tokens of context. Throws std::invalid_argument for
// window < 3 (nothing to score) or fewer than `window` tokens.
std::vector<TextWindow> llama_perplexity_windows(int64_t tokens, int64_t window);

struct PerplexityResult {
  int64_t tokens = 0;   // the text's tokens
  int64_t scored = 0;   // the tokens scored
  int64_t windows = 0;
  double nll = 0;       // summed negative log-likelihood of the scored tokens, in nats
  double perplexity() const;  // exp(nll / scored)
};

// Called after each batch of windows with the windows and tokens scored so far.
using LoglikelihoodProgress = std::function<void(int64_t done, int64_t total, int64_t scored)>;

// The text's perplexity under `model` (no gradients), `batch_size` windows a forward (a shorter last
// window padded on the right: causal attention keeps the padding out of every scored position).
PerplexityResult score_text(Llama& model, const std::vector<int64_t>& ids, int64_t window, int64_t stride, int64_t batch_size,
                            const LoglikelihoodProgress& progress = {});
// The same over any windows; `window_first_token` >= 0 takes the place of the id at every window's
// first position (llama-perplexity puts the BOS token there, when the tokenizer adds one).
PerplexityResult score_windows(Llama& model, const std::vector<int64_t>& ids, const std::vector<TextWindow>& windows,
                               int64_t batch_size, int64_t window_first_token = -1, const LoglikelihoodProgress& progress = {});

// A context and its choices as token ids, split as lm-evaluation-harness splits them
// (`_encode_pair`): whitespace at the end of the context moves to the front of each continuation,
// context + continuation is encoded as one text, and the continuation's tokens are those after the
// context's own encoding. An empty context becomes `prefix_token` alone.
struct EncodedChoices {
  std::vector<int64_t> context;
  std::vector<std::vector<int64_t>> continuations;
};
// Throws std::invalid_argument when a choice encodes to no token.
EncodedChoices encode_choices(const Tokenizer& tokenizer, const std::string& context, const std::vector<std::string>& choices,
                              int64_t prefix_token);

// Each continuation's summed log-probability given the context: the context is run once into a
// KV cache, then every continuation as one row of a batch from it. Where context + continuation
// exceeds `max_length` tokens the context loses tokens on the left, as lm-evaluation-harness does.
std::vector<double> score_choices(Llama& model, const EncodedChoices& item, int64_t max_length);

// The predictions of lm-evaluation-harness's multiple-choice metrics: acc (argmax of the scores)
// and acc_norm (argmax of each score divided by its choice's length in characters: Unicode code
// points, as Python's len()).
// Ties go to the first.
int64_t argmax_choice(const std::vector<double>& scores);
int64_t argmax_choice_normalized(const std::vector<double>& scores, const std::vector<std::string>& choices);

}  // namespace coconut
