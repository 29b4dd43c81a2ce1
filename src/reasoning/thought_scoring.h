// Scoring a Coconut model's text with its continuous thoughts, for log-likelihood evaluation
// (`coconut eval-lm --choices`, the server's `echo`): where a prompt's ids hold <|start-latent|>
// directly followed by <|end-latent|> (its layout's markers with the thoughts left out), n thoughts
// run between them as generation runs them (each the last hidden state fed back, at the next
// position), and every token is scored as usual. The thoughts are not tokens: nothing scores them,
// and the hidden states returned are the tokens' alone.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "eval/loglikelihood.h"
#include "model/llama.h"

namespace coconut {

struct ThoughtSlot {
  int64_t start_latent = -1, end_latent = -1;  // the markers' ids
  int64_t thoughts = 0;                         // n
  bool bottleneck = false;                      // coconut.json's answer_through_thoughts (reasoning/latent_forward.h)
};

// The column of the first <|start-latent|> whose next id is <|end-latent|>; -1 when there is none.
int64_t thought_slot_column(const std::vector<int64_t>& ids, const ThoughtSlot& slot);

// Hidden states [T, D] after the final norm at the T columns of `ids`, with slot.thoughts thoughts
// run between the markers (their columns left out of the result); one plain forward where the ids
// hold no slot or slot.thoughts is 0. No gradients.
torch::Tensor hidden_with_thoughts(Llama& model, const std::vector<int64_t>& ids, const ThoughtSlot& slot);

// score_choices (eval/loglikelihood.h) with the thoughts: each choice's summed log-probability
// given its context, the context and the choice run together in one row each (the thoughts
// follow the context's slot, before the choice). Where context, thoughts and choice exceed
// `max_length` positions the context loses tokens on the left, as score_choices.
std::vector<double> score_choices_with_thoughts(Llama& model, const EncodedChoices& item, int64_t max_length, const ThoughtSlot& slot);

}  // namespace coconut
