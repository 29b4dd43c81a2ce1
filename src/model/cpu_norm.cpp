#include "model/cpu_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace coconut {

namespace {

// One row: float32 statistics as HF computes them (mean of squares, + eps, 1 / sqrt), the product
// rounded to T, then weight * it in float32 rounded to T again (as libtorch's T * T does).
template <typename T>
void normalize_row(const T* x, const T* weight, int64_t width, float eps, T* out) {
  float partial[8] = {};  // eight running sums: independent chains the compiler can vectorise
  int64_t i = 0;
  for (; i + 8 <= width; i += 8)
    for (int lane = 0; lane < 8; ++lane) {
      const float value = static_cast<float>(x[i + lane]);
      partial[lane] += value * value;
    }
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < width; ++i) sum += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
  for (int64_t j = 0; j < width; ++j) {
    const T normalised = static_cast<T>(static_cast<float>(x[j]) * scale);
    out[j] = static_cast<T>(static_cast<float>(weight[j]) * static_cast<float>(normalised));
  }
}

template <typename T>
void normalize_rows(const torch::Tensor& rows, const torch::Tensor& weight, float eps, torch::Tensor& out) {
  const int64_t count = rows.size(0), width = rows.size(1);
  const T* x = rows.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* y = out.data_ptr<T>();
  at::parallel_for(0, count, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) normalize_row<T>(x + row * width, w, width, eps, y + row * width);
  });
}

}  // namespace

bool uses_cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto dtype = x.scalar_type();
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.scalar_type() != dtype || x.dim() < 1) return false;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  if (weight.dim() != 1 || weight.size(0) != x.size(-1)) return false;
  return !(torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()));
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
