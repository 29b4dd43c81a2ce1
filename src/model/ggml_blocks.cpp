#include "model/ggml_blocks.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <stdexcept>

namespace coconut {

namespace {

constexpr int kBlock = 32;    // QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0
constexpr int kSuper = 256;   // QK_K

// Q4_0: d (f16), 16 bytes of 4-bit values; element j is the low nibble of byte j, element j + 16
// its high nibble; value (q - 8) d.
void q4_0(const uint8_t* block, float* y) {
  const float d = ggml_half(block);
  const uint8_t* qs = block + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m (f16), 16 bytes of nibbles as Q4_0; value q d + m.
void q4_1(const uint8_t* block, float* y) {
  const float d = ggml_half(block), m = ggml_half(block + 2);
  const uint8_t* qs = block + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the nibbles of Q4 plus a fifth bit per element from a 32-bit mask (bit j for
// element j); Q5_0's value (q - 16) d, Q5_1's q d + m.
void q5(const uint8_t* block, float* y, bool with_min) {
  const float d = ggml_half(block), m = with_min ? ggml_half(block + 2) : 0.0f;
  const uint8_t* rest = block + (with_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, rest, 4);
  const uint8_t* qs = rest + 4;
  const int offset = with_min ? 0 : 16;
  for (int j = 0; j < 16; ++j) {
    const int high0 = ((qh >> j) << 4) & 0x10, high1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>(((qs[j] & 0x0F) | high0) - offset) * d + m;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | high1) - offset) * d + m;
  }
}

// Q8_0: d (f16), 32 signed bytes; value q d.
void q8_0(const uint8_t* block, float* y) {
  const float d = ggml_half(block);
  const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
  for (int j = 0; j < kBlock; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q2_K: 16 bytes of (4-bit scale, 4-bit min) per 16 elements, 64 bytes of 2-bit values, d, dmin.
// Each 128 elements read 32 bytes of values four times, two bits further each time; value
// d scale q - dmin min.
void q2_k(const uint8_t* block, float* y) {
  const uint8_t* scales = block;
  const uint8_t* q = block + 16;
  const float d = ggml_half(block + 80), dmin = ggml_half(block + 82);
  int scale = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part) {
        const uint8_t packed = scales[scale++];
        const float dl = d * static_cast<float>(packed & 0x0F), ml = dmin * static_cast<float>(packed >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
}

// Q3_K: 32 bytes of high bits (hmask), 64 bytes of 2-bit low parts, 12 bytes holding sixteen
// 6-bit scales, d. Sub-block s (16 elements): low 4 bits of its scale in byte s % 8 (low nibble for
// s < 8, high for s >= 8), high 2 bits in byte 8 + s % 4 at bit 2 (s / 4); scale - 32. The
// element's low part as Q2_K's, its high bit in hmask bit s / 2 of byte (s % 2) 16 + l, and a
// clear high bit subtracts 4.
void q3_k(const uint8_t* block, float* y) {
  const uint8_t* hmask = block;
  const uint8_t* qs = block + 32;
  const uint8_t* scales = block + 96;
  const float d = ggml_half(block + 108);
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? scales[s] & 0x0F : scales[s - 8] >> 4;
    const int high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    const uint8_t* q = qs + 32 * (s / 8) + 16 * (s % 2);
    const int shift = 2 * ((s % 8) / 2), bit = s / 2;
    for (int l = 0; l < 16; ++l) {
      const int lane = 16 * (s % 2) + l;
      const int value = ((q[l] >> shift) & 3) - (((hmask[lane] >> bit) & 1) ? 0 : 4);
      *y++ = dl * static_cast<float>(value);
    }
  }
}

// Q4_K: d, dmin, 12 bytes of scales/mins, 128 bytes of nibbles. Each 64 elements: the low nibbles
// of 32 bytes (sub-block 2i), then their high nibbles (2i + 1); value d scale q - dmin min.
// Q5_K adds 32 bytes of high bits (qh) before the nibbles: bit 2i of qh[l] for sub-block 2i.
void q45_k(const uint8_t* block, float* y, bool five_bit) {
  const float d = ggml_half(block), dmin = ggml_half(block + 2);
  const uint8_t* packed_scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* ql = block + (five_bit ? 48 : 16);
  int16_t scale[8], min[8];
  k4_scales_mins(packed_scales, scale, min);
  for (int i = 0; i < 4; ++i, ql += 32) {
    for (int part = 0; part < 2; ++part) {
      const float dl = d * static_cast<float>(scale[2 * i + part]), ml = dmin * static_cast<float>(min[2 * i + part]);
      const uint8_t high_bit = static_cast<uint8_t>(1u << (2 * i + part));
      for (int l = 0; l < 32; ++l) {
        int q = part == 0 ? ql[l] & 0x0F : ql[l] >> 4;
        if (five_bit && (qh[l] & high_bit)) q += 16;
        *y++ = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q6_K: 128 bytes of low nibbles (ql), 64 bytes of 2-bit high parts (qh), 16 signed scales, d.
// Each 128 elements, for l < 32: four values at l, l + 32, l + 64, l + 96 from ql[l] / ql[l + 32]
// (low then high nibbles) and the four 2-bit fields of qh[l]; value d scale (q - 32), the scale of
// each 16 elements.
void q6_k(const uint8_t* block, float* y) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
  const float d = ggml_half(block + 208);
  for (int n = 0; n < kSuper; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

using BlockFunction = void (*)(const uint8_t*, float*);

BlockFunction block_function(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ4_0: return q4_0;
    case GgmlType::kQ4_1: return q4_1;
    case GgmlType::kQ5_0: return [](const uint8_t* b, float* y) { q5(b, y, false); };
    case GgmlType::kQ5_1: return [](const uint8_t* b, float* y) { q5(b, y, true); };
    case GgmlType::kQ8_0: return q8_0;
    case GgmlType::kQ2_K: return q2_k;
    case GgmlType::kQ3_K: return q3_k;
    case GgmlType::kQ4_K: return [](const uint8_t* b, float* y) { q45_k(b, y, false); };
    case GgmlType::kQ5_K: return [](const uint8_t* b, float* y) { q45_k(b, y, true); };
    case GgmlType::kQ6_K: return q6_k;
    case GgmlType::kF32: return [](const uint8_t* b, float* y) { std::memcpy(y, b, 4); };
    case GgmlType::kF16: return [](const uint8_t* b, float* y) { *y = ggml_half(b); };
    case GgmlType::kBF16:
      return [](const uint8_t* b, float* y) {
        uint16_t bits;
        std::memcpy(&bits, b, 2);
        *y = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
      };
    default: return nullptr;
  }
}

struct TypeInfo {
  uint32_t id;
  const char* name;
  BlockLayout layout;
};

// ggml.c's type traits (ids 4, 5 and 31-33 are retired there).
constexpr TypeInfo kTypes[] = {
    {0, "F32", {1, 4}},           {1, "F16", {1, 2}},          {2, "Q4_0", {32, 18}},       {3, "Q4_1", {32, 20}},
    {6, "Q5_0", {32, 22}},        {7, "Q5_1", {32, 24}},       {8, "Q8_0", {32, 34}},       {9, "Q8_1", {32, 36}},
    {10, "Q2_K", {256, 84}},      {11, "Q3_K", {256, 110}},    {12, "Q4_K", {256, 144}},    {13, "Q5_K", {256, 176}},
    {14, "Q6_K", {256, 210}},     {15, "Q8_K", {256, 292}},    {16, "IQ2_XXS", {256, 66}},  {17, "IQ2_XS", {256, 74}},
    {18, "IQ3_XXS", {256, 98}},   {19, "IQ1_S", {256, 50}},    {20, "IQ4_NL", {32, 18}},    {21, "IQ3_S", {256, 110}},
    {22, "IQ2_S", {256, 82}},     {23, "IQ4_XS", {256, 136}},  {24, "I8", {1, 1}},          {25, "I16", {1, 2}},
    {26, "I32", {1, 4}},          {27, "I64", {1, 8}},         {28, "F64", {1, 8}},         {29, "IQ1_M", {256, 56}},
    {30, "BF16", {1, 2}},         {34, "TQ1_0", {256, 54}},    {35, "TQ2_0", {256, 66}},    {39, "MXFP4", {32, 17}},
};

const TypeInfo* type_info(uint32_t type) {
  for (const auto& info : kTypes)
    if (info.id == type) return &info;
  return nullptr;
}

}  // namespace

float ggml_half(const uint8_t* bytes) {
  uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

std::optional<BlockLayout> ggml_block_layout(uint32_t type) {
  const TypeInfo* info = type_info(type);
  if (!info) return std::nullopt;
  return info->layout;
}

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* info = type_info(type);
  return info ? info->name : "type " + std::to_string(type);
}

bool ggml_type_dequantizable(uint32_t type) { return block_function(type) != nullptr; }

void dequantize_ggml(uint32_t type, const uint8_t* blocks, int64_t elements, float* out) {
  const BlockFunction convert = block_function(type);
  if (!convert) throw std::invalid_argument("ggml type " + ggml_type_name(type) + " cannot be converted to float32 here");
  const BlockLayout layout = *ggml_block_layout(type);
  const auto per_block = static_cast<int64_t>(layout.elements);
  if (elements < 0 || elements % per_block != 0)
    throw std::invalid_argument(std::to_string(elements) + " elements are not whole blocks of " + ggml_type_name(type));
  const int64_t block_count = elements / per_block;
  const int64_t grain = std::max<int64_t>(1, 16384 / per_block);
  at::parallel_for(0, block_count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      convert(blocks + b * static_cast<int64_t>(layout.bytes), out + b * per_block);
  });
}

}  // namespace coconut
