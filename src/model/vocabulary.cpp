#include "model/vocabulary.h"

#include <stdexcept>
#include <string>

namespace coconut {

Llama grow_vocabulary(Llama& model, const std::vector<int64_t>& initialize_from) {
  LlamaConfig config = model->config();
  const int64_t old_vocab = config.vocab_size;
  for (int64_t source : initialize_from)
    if (source < 0 || source >= old_vocab)
      throw std::out_of_range("grow_vocabulary: source token " + std::to_string(source) + " outside [0, " +
                              std::to_string(old_vocab) + ")");
  config.vocab_size = old_vocab + static_cast<int64_t>(initialize_from.size());
  Llama grown(config);
  torch::NoGradGuard no_grad;
  const auto weight = model->embed_tokens->weight;
  grown->to(weight.device(), weight.scalar_type());
  auto sources = torch::tensor(initialize_from, torch::TensorOptions().dtype(torch::kInt64).device(weight.device()));
  const auto grow = [&](const torch::Tensor& old_rows) {  // [V, D] -> [V + n, D]
    return torch::cat({old_rows, old_rows.index_select(0, sources)}, 0);
  };
  auto old_parameters = model->named_parameters();
  for (auto& named : grown->named_parameters()) {
    const std::string& name = named.key();
    if (name == "embed_tokens.weight" || name == "lm_head.weight") {
      named.value().copy_(grow(old_parameters[name]));
    } else {
      named.value().copy_(old_parameters[name]);
    }
  }
  grown->train(model->is_training());
  return grown;
}

}  // namespace coconut
