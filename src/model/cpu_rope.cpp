#include "model/cpu_rope.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace coconut {

namespace {

// One row of Dh values, x's values `x_stride` apart: y = x * c + rotate_half(x) * s, each product
// rounded to T.
template <typename T>
inline void rope_row(const T* row, int64_t x_stride, const T* c, const T* s, int64_t head_dim, T* y) {
  const int64_t half = head_dim / 2;
  const auto round = [](float value) { return static_cast<float>(static_cast<T>(value)); };
  for (int64_t i = 0; i < head_dim; ++i) {
    const float value = static_cast<float>(row[i * x_stride]);
    // rotate_half: [-x2, x1]
    const float rotated = i < half ? -static_cast<float>(row[(i + half) * x_stride]) : static_cast<float>(row[(i - half) * x_stride]);
    const float product = round(value * static_cast<float>(c[i]));
    const float rotated_product = round(rotated * static_cast<float>(s[i]));
    y[i] = static_cast<T>(product + rotated_product);
  }
}

template <typename T>
void rope_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out) {
  const int64_t batch = x.size(0), heads = x.size(1), time = x.size(2), head_dim = x.size(3);
  const T* x_data = x.data_ptr<T>();
  const T *cos_data = cos.data_ptr<T>(), *sin_data = sin.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);  // out.stride(3) == 1
  const int64_t table_batch_stride = cos.size(0) == 1 ? 0 : time * head_dim;  // cos/sin contiguous [B or 1, 1, T, Dh]
  at::parallel_for(0, batch * heads * time, std::max<int64_t>(1, 8192 / std::max<int64_t>(head_dim, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / (heads * time), h = index / time % heads, t = index % time;
      const T* row = x_data + b * xs0 + h * xs1 + t * xs2;
      const T* c = cos_data + b * table_batch_stride + t * head_dim;
      const T* s = sin_data + b * table_batch_stride + t * head_dim;
      rope_row<T>(row, xs3, c, s, head_dim, out_data + b * os0 + h * os1 + t * os2);
    }
  });
}

// Everything uses_cpu_rope asks but autograd's absence.
bool kernel_takes(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto dtype = x.scalar_type();
  if (!x.device().is_cpu() || !cos.device().is_cpu() || !sin.device().is_cpu()) return false;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  if (cos.scalar_type() != dtype || sin.scalar_type() != dtype || x.dim() != 4 || x.size(3) % 2 != 0) return false;
  for (const auto* table : {&cos, &sin}) {
    if (table->dim() != 4 || !table->is_contiguous() || table->size(1) != 1 || table->size(2) != x.size(2) ||
        table->size(3) != x.size(3) || (table->size(0) != 1 && table->size(0) != x.size(0)))
      return false;
  }
  return cos.size(0) == sin.size(0);
}

// With `keep_layout`, the result is laid out as x is where x's rows are dense (training's q and k are
// transposed views of [B, T, H, Dh] projections: so are their rotations and gradients, and autograd
// reshapes them to the projections' shape without copying); otherwise contiguous [B, H, T, Dh].
torch::Tensor rope_kernel(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool keep_layout = false) {
  const bool dense_rows = x.stride(3) == 1 && x.is_non_overlapping_and_dense();
  auto out = keep_layout && dense_rows ? torch::empty_like(x) : torch::empty(x.sizes(), x.options());  // [B, H, T, Dh]
  switch (x.scalar_type()) {
    case torch::kFloat32: rope_rows<float>(x, cos, sin, out); break;
    case torch::kBFloat16: rope_rows<c10::BFloat16>(x, cos, sin, out); break;
    default: rope_rows<c10::Half>(x, cos, sin, out); break;
  }
  return out;
}

// The kernel forward; backward the rotation's transpose, a rotation by the opposite angle:
// dx = dy * cos + rotate_half^T(dy * sin) = rope(dy, cos, -sin) where sin repeats over the two
// halves. One operator each way where the eager chain records five and a concatenation and
// backward runs about eight.
class RecordedRope : public torch::autograd::Function<RecordedRope> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    context->save_for_backward({cos, sin});
    return rope_kernel(x, cos, sin, /*keep_layout=*/true);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    return {rope_kernel(outputs[0], saved[0], saved[1].neg(), /*keep_layout=*/true), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void cpu_rope_rows(const float* x, int64_t rows, const float* cos, const float* sin, int64_t head_dim, float* out) {
  for (int64_t row = 0; row < rows; ++row) rope_row<float>(x + row * head_dim, 1, cos, sin, head_dim, out + row * head_dim);
}

void cpu_rope_rows(const c10::BFloat16* x, int64_t rows, const c10::BFloat16* cos, const c10::BFloat16* sin, int64_t head_dim,
                   c10::BFloat16* out) {
  for (int64_t row = 0; row < rows; ++row) rope_row<c10::BFloat16>(x + row * head_dim, 1, cos, sin, head_dim, out + row * head_dim);
}

bool uses_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return kernel_takes(x, cos, sin) &&
         !(torch::GradMode::is_enabled() && (x.requires_grad() || cos.requires_grad() || sin.requires_grad()));
}

torch::Tensor cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(uses_cpu_rope(x, cos, sin), "cpu_rope: unsupported arguments");
  return rope_kernel(x, cos, sin);
}

bool uses_recorded_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return kernel_takes(x, cos, sin) && torch::GradMode::is_enabled() && x.requires_grad() && !cos.requires_grad() &&
         !sin.requires_grad();
}

torch::Tensor recorded_cpu_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(uses_recorded_cpu_rope(x, cos, sin), "recorded_cpu_rope: unsupported arguments");
  return RecordedRope::apply(x, cos, sin);
}

}  // namespace coconut
