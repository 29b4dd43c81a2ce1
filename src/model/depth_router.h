// The learned depth router (compute-adaptive depth): a transform that gives a plain model one gate
// per layer, and the accounting of what a routed model spent. The gates themselves run inside
// LlamaImpl::forward (ForwardOptions::router_threshold, router_straight_through).
#pragma once

#include <torch/torch.h>

#include "model/llama.h"

namespace coconut {

// A new model equal to `model` plus a depth router whose gates start at weight 0 and bias
// `initial_bias` (sigmoid(3) = 0.95: every layer runs until training says otherwise); layers before
// `first_layer` always run. Same device and dtype; the original is untouched. A model that already
// has a router keeps its gates (and takes the new first_layer).
Llama attach_depth_router(Llama& model, double initial_bias = 3.0, int64_t first_layer = 0);

// The router's parameters (one [1, D] weight and one bias per layer), e.g. to train only them.
std::vector<torch::Tensor> depth_router_parameters(Llama& model);

}  // namespace coconut
