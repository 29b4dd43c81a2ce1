// A run-time count turned into a compile-time one, for kernels unrolled per tile shape (the
// register tiles of cpu_linear and cpu_training_attention).
#pragma once

#include <cstdint>
#include <type_traits>

namespace coconut {

// call(std::integral_constant<int, rows>{}) for a run-time rows in 1..kRows (nothing otherwise).
template <int kRows, typename Call>
void call_with_rows(int64_t rows, const Call& call) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return call(std::integral_constant<int, kRows>{});
    call_with_rows<kRows - 1>(rows, call);
  }
}

}  // namespace coconut
