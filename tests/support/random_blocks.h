// Random weights in a block format for tests: random bytes, then scales a model's blocks have.
#pragma once

#include <c10/util/Half.h>
#include <torch/torch.h>

#include <cstring>
#include <random>

#include "model/quantized_linear.h"

namespace coconut::testing {

inline void put_half(uint8_t* at, float value) {
  const uint16_t bits = c10::Half(value).x;
  std::memcpy(at, &bits, 2);
}

// Blocks of `format` for a [rows, columns] weight in ggml's layout: uint8 [rows, columns / block
// values * block bytes].
inline torch::Tensor random_rows(WeightFormat format, int64_t rows, int64_t columns, uint64_t seed) {
  const int64_t per_block = block_values(format), bytes = ggml_block_bytes(format), blocks = rows * columns / per_block;
  auto data = torch::empty({rows, columns / per_block * bytes}, torch::kUInt8);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(2e-4f, 3e-3f);
  uint8_t* p = data.data_ptr<uint8_t>();
  for (int64_t i = 0; i < data.numel(); ++i) p[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = p + b * bytes;
    const float sign = byte(rng) % 2 ? 1.0f : -1.0f;
    if (format == WeightFormat::kQ6_K) {
      put_half(block + 208, sign * scale(rng));
    } else {
      put_half(block, sign * scale(rng) * (format == WeightFormat::kQ5_0 ? 20.0f : 1.0f));
      if (format != WeightFormat::kQ5_0) put_half(block + 2, scale(rng));  // dmin
    }
  }
  return data;
}

}  // namespace coconut::testing
