// Growing a model's vocabulary for new special tokens (Coconut's <|start-latent|>, <|end-latent|>,
// <|latent|>): a transform that builds a new model; the input model is left unchanged.
#pragma once

#include <vector>

#include "model/llama.h"

namespace coconut {

// Returns a model with `new_rows` more vocabulary entries. Row i of the new entries (in the
// embeddings, and in the head when untied) is a copy of row `initialize_from[i]` (Coconut
// initialises its new tokens from an existing token's embedding, e.g. "<<").
Llama grow_vocabulary(Llama& model, const std::vector<int64_t>& initialize_from);

}  // namespace coconut
