// What a continuous thought says: each group of c thoughts (the thoughts standing for one step)
// read as input embeddings and decoded greedily by the model itself, the decoder that step
// supervision trains (training_loss.h, thought_step_loss). A probe for interpretability and for
// finding which step a curriculum fails to carry in its thoughts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "model/llama.h"
#include "reasoning/evaluate.h"
#include "text/tokenizer.h"

namespace coconut {

// The continuous thoughts of a Coconut prompt (from build_eval_prompt), from one latent forward,
// which both probes below read: `inputs` are what was fed back (thought_input's rescaling
// applied), `sources` the last hidden states they were made of. Both [n, D]; n = 0 (undefined
// tensors) for a prompt without thoughts.
struct PromptThoughts {
  int64_t count = 0;
  torch::Tensor inputs, sources;
};
PromptThoughts prompt_thoughts(Llama& model, const EvalPrompt& prompt);

// One text per group of `thoughts_per_step` thoughts, each at most `max_tokens` tokens, ending at
// the first newline or EOS.
std::vector<std::string> decode_thoughts(Llama& model, const Tokenizer& tokenizer, const PromptThoughts& thoughts,
                                         int64_t thoughts_per_step, int64_t max_tokens, int64_t eos);

// What each thought holds as a distribution: the LM head on the hidden state the thought was made
// of (`sources`, before thought_input's rescaling), its `k` most likely tokens with their
// probabilities, one list per thought. On graph reachability a thought trained with reachable-set supervision
// (training_loss.h) should spread its mass over the nodes reached so far.
std::vector<std::vector<std::pair<std::string, double>>> thought_top_tokens(Llama& model, const Tokenizer& tokenizer,
                                                                            const PromptThoughts& thoughts, int64_t k);

}  // namespace coconut
