// What a continuous thought says: each group of c thoughts (the thoughts standing for one step)
// read as input embeddings and decoded greedily by the model itself, the decoder that step
// supervision trains (training_loss.h, thought_step_loss). A probe for interpretability and for
// finding which step a curriculum fails to carry in its thoughts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/llama.h"
#include "reasoning/evaluate.h"
#include "text/tokenizer.h"

namespace coconut {

// One text per group of `thoughts_per_step` thoughts of `prompt` (a Coconut prompt from
// build_eval_prompt), each at most `max_tokens` tokens, ending at the first newline or EOS.
std::vector<std::string> decode_thoughts(Llama& model, const Tokenizer& tokenizer, const EvalPrompt& prompt,
                                         int64_t thoughts_per_step, int64_t max_tokens, int64_t eos);

// What each thought holds as a distribution: the LM head on the hidden state the thought was made
// of (before thought_input's rescaling), its `k` most likely tokens with their probabilities, one
// list per thought. On graph reachability a thought trained with reachable-set supervision
// (training_loss.h) should spread its mass over the nodes reached so far.
std::vector<std::vector<std::pair<std::string, double>>> thought_top_tokens(Llama& model, const Tokenizer& tokenizer,
                                                                            const EvalPrompt& prompt, int64_t k);

}  // namespace coconut
