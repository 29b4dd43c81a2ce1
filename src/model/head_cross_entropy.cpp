#include "model/head_cross_entropy.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <stdexcept>

#include "model/autocast.h"

namespace coconut {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class HeadCrossEntropy : public torch::autograd::Function<HeadCrossEntropy> {
 public:
  // Saved: hidden and weight in the product's dtype, targets, each row's log-sum-exp [N] float32.
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, int64_t chunk_rows, c10::ScalarType product_dtype) {
    const AutocastRestore plain(false, hidden.device());  // the casts are this function's own
    const auto x = hidden.to(product_dtype), w = weight.to(product_dtype);
    const int64_t rows = x.size(0);
    auto log_sum_exp = torch::empty({rows}, hidden.options().dtype(torch::kFloat32));
    auto total = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      const int64_t count = std::min(chunk_rows, rows - begin);
      const auto logits = at::linear(x.narrow(0, begin, count), w).to(torch::kFloat32);  // [n, V]
      const auto lse = logits.logsumexp(-1);                                               // [n]
      log_sum_exp.narrow(0, begin, count).copy_(lse);
      total += (lse - logits.gather(1, targets.narrow(0, begin, count).unsqueeze(1)).squeeze(1)).sum();
    }
    context->save_for_backward({x, w, targets, log_sum_exp});
    context->saved_data["chunk_rows"] = chunk_rows;
    context->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    context->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return total / static_cast<double>(rows);
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    const auto saved = context->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &targets = saved[2], &log_sum_exp = saved[3];
    const int64_t chunk_rows = context->saved_data["chunk_rows"].toInt(), rows = x.size(0);
    const AutocastRestore plain(false, x.device());
    // d(mean loss)/d logits = (softmax - one_hot(target)) / N, times the incoming gradient.
    const auto scale = grad_outputs[0].to(torch::kFloat32) / static_cast<double>(rows);
    const bool weight_gradient = context->needs_input_grad(1);
    auto grad_x = torch::empty_like(x);
    torch::Tensor grad_w = weight_gradient ? torch::zeros(w.sizes(), w.options().dtype(torch::kFloat32)) : torch::Tensor();
    for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
      const int64_t count = std::min(chunk_rows, rows - begin);
      const auto rows_x = x.narrow(0, begin, count);
      auto probabilities = (at::linear(rows_x, w).to(torch::kFloat32) - log_sum_exp.narrow(0, begin, count).unsqueeze(1)).exp_();
      probabilities.scatter_add_(1, targets.narrow(0, begin, count).unsqueeze(1),
                                 torch::full({count, 1}, -1.0, probabilities.options()));
      const auto grad_logits = (probabilities * scale).to(x.scalar_type());  // [n, V], as the unfused head's cast passes it
      grad_x.narrow(0, begin, count).copy_(torch::matmul(grad_logits, w));   // [n, V] x [V, D]
      if (weight_gradient) grad_w += torch::matmul(grad_logits.t(), rows_x).to(torch::kFloat32);  // [V, n] x [n, D]
    }
    const auto hidden_dtype = static_cast<c10::ScalarType>(context->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype = static_cast<c10::ScalarType>(context->saved_data["weight_dtype"].toInt());
    return {grad_x.to(hidden_dtype), weight_gradient ? grad_w.to(weight_dtype) : torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor head_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                 int64_t chunk_rows) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1) || targets.dim() != 1 ||
      targets.size(0) != hidden.size(0))
    throw std::invalid_argument("head_cross_entropy: hidden [N, D], weight [V, D] and targets [N] do not agree");
  if (hidden.size(0) == 0) throw std::invalid_argument("head_cross_entropy: no labelled rows");
  if (chunk_rows <= 0) chunk_rows = std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(weight.size(0), 1));
  const auto product_dtype = autocast_enabled(hidden.device())
                                 ? at::autocast::get_autocast_dtype(hidden.device().type())
                                 : hidden.scalar_type();
  return HeadCrossEntropy::apply(hidden, weight, targets, chunk_rows, product_dtype);
}

}  // namespace coconut
