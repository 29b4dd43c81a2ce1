// Walking the autograd graph behind a tensor, for tests that check how a result was recorded.
#pragma once

#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace coconut::testing {

// The nodes autograd reaches from `output`'s grad_fn, each once.
inline std::set<const torch::autograd::Node*> graph_nodes(const torch::Tensor& output) {
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> pending = {output.grad_fn().get()};
  while (!pending.empty()) {
    auto* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return seen;
}

// How many of them have `name` in their name (AccumulateGrad, ToCopyBackward0, a custom Function).
inline int64_t count_graph_nodes(const torch::Tensor& output, const std::string& name) {
  int64_t count = 0;
  for (const auto* node : graph_nodes(output)) count += node->name().find(name) != std::string::npos;
  return count;
}

}  // namespace coconut::testing
