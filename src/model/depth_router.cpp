#include "model/depth_router.h"

namespace coconut {

Llama attach_depth_router(Llama& model, double initial_bias, int64_t first_layer) {
  LlamaConfig config = model->config();
  const bool had_router = config.depth_router;
  config.depth_router = true;
  config.depth_router_first_layer = first_layer;
  config.validate();
  Llama routed(config);
  const auto reference = model->parameters().front();
  routed->to(reference.device(), reference.scalar_type());
  torch::NoGradGuard no_grad;
  auto source = model->named_parameters();
  for (auto& named : routed->named_parameters()) {
    if (const auto* found = source.find(named.key())) {
      named.value().copy_(*found);
    } else if (!had_router) {  // a new gate: x . 0 + bias
      named.value().fill_(named.key().size() >= 4 && named.key().compare(named.key().size() - 4, 4, "bias") == 0
                              ? initial_bias
                              : 0.0);
    }
  }
  return routed;
}

std::vector<torch::Tensor> depth_router_parameters(Llama& model) {
  std::vector<torch::Tensor> parameters;
  for (const auto& layer : *model->layers) {
    auto& decoder = *layer->as<DecoderLayer>();
    if (!decoder.router) continue;
    parameters.push_back(decoder.router->weight);
    parameters.push_back(decoder.router->bias);
  }
  return parameters;
}

}  // namespace coconut
