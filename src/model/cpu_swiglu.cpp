#include "model/cpu_swiglu.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "model/x86_intrinsics.h"

namespace coconut {

namespace {

// Values per parallel task.
constexpr int64_t kGrain = 32768;

// The scalar forms every path computes, in libtorch's order: with d = 1 + exp(-g),
// silu(g) = g / d and sigmoid(g) = 1 / d; silu'(g) = sigmoid (1 + g (1 - sigmoid)).
void forward_scalar(const float* g, const float* u, float* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void backward_scalar(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float d = 1.0f + std::exp(-g[i]), silu = g[i] / d, sigmoid = 1.0f / d;
    du[i] = dy[i] * silu;
    dg[i] = dy[i] * u[i] * sigmoid * (1.0f + g[i] * (1.0f - sigmoid));
  }
}

#ifdef COCONUT_X86
__attribute__((target("avx512f"))) void forward_avx512(const float* g, const float* u, float* out, int64_t begin, int64_t end) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 gate = _mm512_loadu_ps(g + i);
    const __m512 d = _mm512_add_ps(one, Sleef_expf16_u10avx512f(_mm512_sub_ps(zero, gate)));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(gate, d), _mm512_loadu_ps(u + i)));
  }
  forward_scalar(g, u, out, i, end);
}

__attribute__((target("avx512f"))) void backward_avx512(const float* g, const float* u, const float* dy, float* dg, float* du,
                                                        int64_t begin, int64_t end) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 gate = _mm512_loadu_ps(g + i), gradient = _mm512_loadu_ps(dy + i);
    const __m512 d = _mm512_add_ps(one, Sleef_expf16_u10avx512f(_mm512_sub_ps(zero, gate)));
    const __m512 silu = _mm512_div_ps(gate, d), sigmoid = _mm512_div_ps(one, d);
    _mm512_storeu_ps(du + i, _mm512_mul_ps(gradient, silu));
    const __m512 slope = _mm512_add_ps(one, _mm512_mul_ps(gate, _mm512_sub_ps(one, sigmoid)));
    const __m512 gate_gradient = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(gradient, _mm512_loadu_ps(u + i)), sigmoid), slope);
    _mm512_storeu_ps(dg + i, gate_gradient);
  }
  backward_scalar(g, u, dy, dg, du, i, end);
}

__attribute__((target("avx2,fma"))) void forward_avx2(const float* g, const float* u, float* out, int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 gate = _mm256_loadu_ps(g + i);
    const __m256 d = _mm256_add_ps(one, Sleef_expf8_u10avx2(_mm256_sub_ps(zero, gate)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gate, d), _mm256_loadu_ps(u + i)));
  }
  forward_scalar(g, u, out, i, end);
}

__attribute__((target("avx2,fma"))) void backward_avx2(const float* g, const float* u, const float* dy, float* dg, float* du,
                                                       int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 gate = _mm256_loadu_ps(g + i), gradient = _mm256_loadu_ps(dy + i);
    const __m256 d = _mm256_add_ps(one, Sleef_expf8_u10avx2(_mm256_sub_ps(zero, gate)));
    const __m256 silu = _mm256_div_ps(gate, d), sigmoid = _mm256_div_ps(one, d);
    _mm256_storeu_ps(du + i, _mm256_mul_ps(gradient, silu));
    const __m256 slope = _mm256_add_ps(one, _mm256_mul_ps(gate, _mm256_sub_ps(one, sigmoid)));
    const __m256 gate_gradient = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(gradient, _mm256_loadu_ps(u + i)), sigmoid), slope);
    _mm256_storeu_ps(dg + i, gate_gradient);
  }
  backward_scalar(g, u, dy, dg, du, i, end);
}
#endif

SwigluKernel resolve(SwigluKernel kernel) {
  TORCH_CHECK(cpu_runs(kernel), "cpu_swiglu: this CPU does not run the kernel asked for");
  if (kernel != SwigluKernel::kBest) return kernel;
  if (cpu_runs(SwigluKernel::kAvx512)) return SwigluKernel::kAvx512;
  return cpu_runs(SwigluKernel::kAvx2) ? SwigluKernel::kAvx2 : SwigluKernel::kPortable;
}

void forward_values(const float* g, const float* u, int64_t count, SwigluKernel kernel, float* y) {
  at::parallel_for(0, count, kGrain, [&](int64_t begin, int64_t end) {
#ifdef COCONUT_X86
    if (kernel == SwigluKernel::kAvx512) return forward_avx512(g, u, y, begin, end);
    if (kernel == SwigluKernel::kAvx2) return forward_avx2(g, u, y, begin, end);
#endif
    forward_scalar(g, u, y, begin, end);
  });
}

torch::Tensor forward_values(const torch::Tensor& gate, const torch::Tensor& up, SwigluKernel kernel) {
  auto out = torch::empty_like(gate);
  forward_values(gate.data_ptr<float>(), up.data_ptr<float>(), gate.numel(), kernel, out.data_ptr<float>());
  return out;
}

class RecordedSwiglu : public torch::autograd::Function<RecordedSwiglu> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& gate, const torch::Tensor& up,
                               SwigluKernel kernel) {
    context->save_for_backward({gate, up});
    context->saved_data["kernel"] = static_cast<int64_t>(kernel);
    return forward_values(gate, up, kernel);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context, torch::autograd::tensor_list outputs) {
    const auto saved = context->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1];
    const auto kernel = static_cast<SwigluKernel>(context->saved_data["kernel"].toInt());
    const auto gradient = outputs[0].contiguous();
    auto gate_gradient = torch::empty_like(gate), up_gradient = torch::empty_like(up);
    const float *g = gate.data_ptr<float>(), *u = up.data_ptr<float>(), *dy = gradient.data_ptr<float>();
    float *dg = gate_gradient.data_ptr<float>(), *du = up_gradient.data_ptr<float>();
    at::parallel_for(0, gate.numel(), kGrain, [&](int64_t begin, int64_t end) {
#ifdef COCONUT_X86
      if (kernel == SwigluKernel::kAvx512) return backward_avx512(g, u, dy, dg, du, begin, end);
      if (kernel == SwigluKernel::kAvx2) return backward_avx2(g, u, dy, dg, du, begin, end);
#endif
      backward_scalar(g, u, dy, dg, du, begin, end);
    });
    return {gate_gradient, up_gradient, torch::Tensor()};
  }
};

}  // namespace

bool cpu_runs(SwigluKernel kernel) {
  switch (kernel) {
#ifdef COCONUT_X86
    case SwigluKernel::kAvx512: return has_avx512f();
    case SwigluKernel::kAvx2: return has_avx2_fma();
#else
    case SwigluKernel::kAvx512:
    case SwigluKernel::kAvx2: return false;
#endif
    default: return true;
  }
}

bool uses_cpu_swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.device().is_cpu() && up.device().is_cpu() && gate.scalar_type() == torch::kFloat32 &&
         up.scalar_type() == torch::kFloat32 && gate.sizes() == up.sizes() && gate.is_contiguous() && up.is_contiguous();
}

torch::Tensor cpu_swiglu(const torch::Tensor& gate, const torch::Tensor& up, SwigluKernel kernel) {
  TORCH_CHECK(uses_cpu_swiglu(gate, up), "cpu_swiglu: expected float32 CPU tensors of one shape, contiguous");
  kernel = resolve(kernel);
  if (torch::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad())) return RecordedSwiglu::apply(gate, up, kernel);
  return forward_values(gate, up, kernel);
}

void cpu_swiglu_values(const float* gate, const float* up, int64_t count, float* out) {
  forward_values(gate, up, count, resolve(SwigluKernel::kBest), out);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  return uses_cpu_swiglu(gate, up) ? cpu_swiglu(gate, up) : torch::silu(gate) * up;
}

}  // namespace coconut
