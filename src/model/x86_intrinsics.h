// x86 intrinsics for the hand-written CPU kernels (cpu_linear, cpu_attention): defines
// COCONUT_X86 where they compile. ISA paths are picked at run time with target attributes, so the
// binary itself needs no AVX.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define COCONUT_X86 1
// GCC 12's AVX-512 headers initialise their "undefined" vectors from themselves, which
// -Wuninitialized reports once the intrinsics are inlined into unrolled loops (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#ifdef COCONUT_X86
// libtorch's own vector exp (SLEEF, exported by libtorch_cpu), what its float32 silu and softmax
// call. sleef.h declares them only where a whole file compiles for AVX / AVX-512, so here with the
// ISA of their callers.
extern "C" {
__attribute__((target("avx512f"))) __m512 Sleef_expf16_u10avx512f(__m512);
__attribute__((target("avx2,fma"))) __m256 Sleef_expf8_u10avx2(__m256);
}
#endif

namespace coconut {

// Whether this CPU runs AVX-512F (asked once); false where the kernels do not compile.
inline bool has_avx512f() {
#ifdef COCONUT_X86
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
#else
  return false;
#endif
}

// Whether this CPU runs AVX-512F with AVX-512BW (asked once).
inline bool has_avx512bw() {
#ifdef COCONUT_X86
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return supported;
#else
  return false;
#endif
}

// Whether this CPU runs AVX2 with FMA (asked once).
inline bool has_avx2_fma() {
#ifdef COCONUT_X86
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

// Whether this CPU runs AVX2 with FMA and F16C, the quantized products' vector kernels (asked once).
inline bool has_avx2_fma_f16c() {
#ifdef COCONUT_X86
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported;
#else
  return false;
#endif
}

}  // namespace coconut
