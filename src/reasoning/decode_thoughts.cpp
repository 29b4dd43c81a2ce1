#include "reasoning/decode_thoughts.h"

#include <torch/torch.h>

#include "reasoning/latent_forward.h"

namespace coconut {

PromptThoughts prompt_thoughts(Llama& model, const EvalPrompt& prompt) {
  PromptThoughts thoughts;
  thoughts.count = prompt.latent_thoughts;
  if (thoughts.count <= 0) return thoughts;
  torch::NoGradGuard no_grad;
  // One row, no padding; the thoughts' placeholder ids are never read.
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(model->embed_tokens->weight.device());
  std::vector<int64_t> ids = prompt.prompt;
  ids.resize(ids.size() + static_cast<size_t>(thoughts.count), prompt.prompt.back());
  LatentBatch batch;
  batch.embeddings = model->embed(torch::tensor(ids, long_options).unsqueeze(0));                 // [1, T, D]
  batch.positions = torch::arange(static_cast<int64_t>(ids.size()), long_options).unsqueeze(0);  // [1, T]
  batch.first_latent = static_cast<int64_t>(prompt.prompt.size());
  batch.latent_count = thoughts.count;
  const LatentForwardResult result = latent_forward(model, batch);
  thoughts.inputs = result.latent_inputs[0];  // [n, D]
  // Thought j is made of the hidden state at column (prompt length - 1) + j.
  thoughts.sources = result.hidden[0].narrow(0, batch.first_latent - 1, thoughts.count);  // [n, D]
  return thoughts;
}

std::vector<std::string> decode_thoughts(Llama& model, const Tokenizer& tokenizer, const PromptThoughts& thoughts,
                                         int64_t thoughts_per_step, int64_t max_tokens, int64_t eos) {
  torch::NoGradGuard no_grad;
  const auto device = model->embed_tokens->weight.device();
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const int64_t n = thoughts.count;
  if (n <= 0 || thoughts_per_step <= 0) return {};

  std::vector<std::string> texts;
  for (int64_t first = 0; first + thoughts_per_step <= n; first += thoughts_per_step) {
    const torch::Tensor prefix = thoughts.inputs.narrow(0, first, thoughts_per_step);  // [c, D]
    std::vector<int64_t> decoded;
    std::string text;
    while (static_cast<int64_t>(decoded.size()) < max_tokens) {
      torch::Tensor inputs = prefix;
      if (!decoded.empty())
        inputs = torch::cat({prefix, model->embed(torch::tensor(decoded, long_options)).to(prefix.scalar_type())});  // [c + t, D]
      const auto length = inputs.size(0);
      const auto hidden = model->forward(inputs.unsqueeze(0), torch::arange(length, long_options).unsqueeze(0)).hidden;  // [1, c + t, D]
      const int64_t next = model->logits(hidden[0][length - 1]).argmax().item<int64_t>();
      if (next == eos) break;
      decoded.push_back(next);
      text = tokenizer.decode(decoded, /*skip_special_tokens=*/true);
      if (text.find('\n') != std::string::npos) break;
    }
    const auto newline = text.find('\n');
    texts.push_back(newline == std::string::npos ? text : text.substr(0, newline));
  }
  return texts;
}

std::vector<std::vector<std::pair<std::string, double>>> thought_top_tokens(Llama& model, const Tokenizer& tokenizer,
                                                                            const PromptThoughts& thoughts, int64_t k) {
  torch::NoGradGuard no_grad;
  const int64_t n = thoughts.count;
  if (n <= 0 || k <= 0) return {};
  const auto probabilities = torch::softmax(model->logits(thoughts.sources), -1).to(torch::kCPU);  // [n, V]
  const auto [values, indices] = probabilities.topk(std::min(k, probabilities.size(1)), -1);           // [n, k]
  std::vector<std::vector<std::pair<std::string, double>>> tops(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < values.size(1); ++i)
      tops[static_cast<size_t>(j)].emplace_back(tokenizer.decode({indices[j][i].item<int64_t>()}, /*skip_special_tokens=*/false),
                                                values[j][i].item<double>());
  return tops;
}

}  // namespace coconut
