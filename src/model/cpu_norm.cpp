#include "model/cpu_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace coconut {

namespace {

// A row's float32 statistics as HF computes them: 1 / sqrt(mean of squares + eps).
template <typename T>
float inverse_rms(const T* x, int64_t width, float eps) {
  float partial[8] = {};  // eight running sums: independent chains the compiler can vectorise
  int64_t i = 0;
  for (; i + 8 <= width; i += 8)
    for (int lane = 0; lane < 8; ++lane) {
      const float value = static_cast<float>(x[i + lane]);
      partial[lane] += value * value;
    }
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < width; ++i) sum += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  return 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
}

// Rows per parallel task: about 16K values.
int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)); }

// One row: the product with 1 / rms rounded to T, then weight * it in float32 rounded to T again
// (as libtorch's T * T does).
template <typename T>
void normalize_row(const T* x, const T* weight, int64_t width, float eps, T* out) {
  const float scale = inverse_rms(x, width, eps);
  for (int64_t j = 0; j < width; ++j) {
    const T normalised = static_cast<T>(static_cast<float>(x[j]) * scale);
    out[j] = static_cast<T>(static_cast<float>(weight[j]) * static_cast<float>(normalised));
  }
}

template <typename T>
void normalize_rows(const T* x, int64_t count, const T* w, int64_t width, float eps, T* y) {
  at::parallel_for(0, count, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) normalize_row<T>(x + row * width, w, width, eps, y + row * width);
  });
}

template <typename T>
void normalize_rows(const torch::Tensor& rows, const torch::Tensor& weight, float eps, torch::Tensor& out) {
  normalize_rows<T>(rows.data_ptr<T>(), rows.size(0), weight.data_ptr<T>(), rows.size(1), eps, out.data_ptr<T>());
}

// Training in float32: one row's normalised values and their 1 / rms, and its input gradient
// dx = r (dn - n mean(dn n)) with dn = dy w and n = x r (the derivative of n through r).
float normalize_training_row(const float* x, const float* weight, int64_t width, float eps, float* out) {
  const float scale = inverse_rms(x, width, eps);
  for (int64_t j = 0; j < width; ++j) out[j] = weight[j] * (x[j] * scale);
  return scale;
}

void input_gradient_row(const float* x, const float* weight, const float* dy, float scale, int64_t width, float* dx) {
  float dot = 0;
  for (int64_t j = 0; j < width; ++j) dot += dy[j] * weight[j] * (x[j] * scale);
  const float mean = dot / static_cast<float>(width);
  for (int64_t j = 0; j < width; ++j) dx[j] = scale * (dy[j] * weight[j] - x[j] * scale * mean);
}

// RMSNorm recorded by autograd on the CPU in float32: one pass forward (keeping 1 / rms per row),
// one pass backward for x, and the weight's gradient sum(dy n) over the rows.
class RecordedRmsNorm : public torch::autograd::Function<RecordedRmsNorm> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x, const torch::Tensor& weight,
                               double eps) {
    const int64_t width = x.size(-1);
    auto rows = x.reshape({-1, width}).contiguous();  // [N, D]
    auto w = weight.contiguous();
    auto out = torch::empty_like(rows);                                // [N, D]
    auto scales = torch::empty({rows.size(0)}, rows.options());        // [N]
    const float *x_data = rows.data_ptr<float>(), *w_data = w.data_ptr<float>();
    float *y_data = out.data_ptr<float>(), *s_data = scales.data_ptr<float>();
    at::parallel_for(0, rows.size(0), row_grain(width), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        s_data[row] = normalize_training_row(x_data + row * width, w_data, width, static_cast<float>(eps), y_data + row * width);
    });
    context->save_for_backward({rows, w, scales});
    return out.view(x.sizes());  // [..., D]
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    const auto &rows = saved[0], &w = saved[1], &scales = saved[2];
    const int64_t width = rows.size(1);
    const auto gradient = outputs[0].reshape({-1, width}).contiguous();  // [N, D]
    const bool wants_input = context->needs_input_grad(0), wants_weight = context->needs_input_grad(1);
    // One pass over the rows for both: dx row by row, and the weight's gradient sum(dy n) as one
    // partial sum per chunk of rows (fixed chunks, so the same bits at any thread count).
    const int64_t count = rows.size(0), grain = row_grain(width), chunks = (count + grain - 1) / grain;
    auto dx = wants_input ? torch::empty_like(rows) : torch::Tensor();             // [N, D]
    auto partial = wants_weight ? torch::zeros({chunks, width}, rows.options()) : torch::Tensor();  // [chunks, D]
    const float *x_data = rows.data_ptr<float>(), *w_data = w.data_ptr<float>(), *dy_data = gradient.data_ptr<float>();
    const float* s_data = scales.data_ptr<float>();
    float* dx_data = wants_input ? dx.data_ptr<float>() : nullptr;
    float* partial_data = wants_weight ? partial.data_ptr<float>() : nullptr;
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        for (int64_t row = chunk * grain; row < std::min(count, (chunk + 1) * grain); ++row) {
          const float *x_row = x_data + row * width, *dy_row = dy_data + row * width;
          if (wants_input) input_gradient_row(x_row, w_data, dy_row, s_data[row], width, dx_data + row * width);
          if (wants_weight) {
            float* __restrict sums = partial_data + chunk * width;
            for (int64_t j = 0; j < width; ++j) sums[j] += dy_row[j] * (x_row[j] * s_data[row]);
          }
        }
      }
    });
    torch::Tensor input_gradient = wants_input ? dx.view(outputs[0].sizes()) : torch::Tensor();
    torch::Tensor weight_gradient = wants_weight ? partial.sum(0) : torch::Tensor();  // [D]
    return {input_gradient, weight_gradient, torch::Tensor()};
  }
};

// Everything uses_cpu_rms_norm asks but autograd's absence.
bool kernel_takes(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto dtype = x.scalar_type();
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.scalar_type() != dtype || x.dim() < 1) return false;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  return weight.dim() == 1 && weight.size(0) == x.size(-1);
}

bool recorded(const torch::Tensor& x, const torch::Tensor& weight) {
  return torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
}

}  // namespace

bool uses_recorded_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight) {
  return kernel_takes(x, weight) && x.scalar_type() == torch::kFloat32 && recorded(x, weight);
}

torch::Tensor recorded_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(uses_recorded_cpu_rms_norm(x, weight), "recorded_cpu_rms_norm: unsupported arguments");
  return RecordedRmsNorm::apply(x, weight, eps);
}

void cpu_rms_norm_rows(const float* x, int64_t rows, const float* weight, int64_t width, double eps, float* out) {
  normalize_rows<float>(x, rows, weight, width, static_cast<float>(eps), out);
}

void cpu_rms_norm_rows(const c10::BFloat16* x, int64_t rows, const c10::BFloat16* weight, int64_t width, double eps,
                       c10::BFloat16* out) {
  normalize_rows<c10::BFloat16>(x, rows, weight, width, static_cast<float>(eps), out);
}

bool uses_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight) {
  return kernel_takes(x, weight) && !recorded(x, weight);
}

torch::Tensor cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(uses_cpu_rms_norm(x, weight), "cpu_rms_norm: unsupported arguments");
  const int64_t width = x.size(-1);
  auto rows = x.reshape({-1, width}).contiguous();  // [N, D]
  auto contiguous_weight = weight.contiguous();
  auto out = torch::empty_like(rows);               // [N, D]
  const auto epsilon = static_cast<float>(eps);
  switch (x.scalar_type()) {
    case torch::kFloat32: normalize_rows<float>(rows, contiguous_weight, epsilon, out); break;
    case torch::kBFloat16: normalize_rows<c10::BFloat16>(rows, contiguous_weight, epsilon, out); break;
    default: normalize_rows<c10::Half>(rows, contiguous_weight, epsilon, out); break;
  }
  return out.view(x.sizes());  // [..., D]
}

}  // namespace coconut
