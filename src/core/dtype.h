// Element types of tensors and the scalar conversions between them (bf16, fp16, fp8 e4m3 <-> fp32).
// fp8 e4m3 is the "fn" variant of the OCP spec (as in DeepSeek/GLM checkpoints): no infinities,
// 0x7F/0xFF are NaN, largest finite value 448.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dsi {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
// Parses a safetensors dtype string; returns false for a type dsinfer does not handle.
bool dtype_from_name(std::string_view name, DType* out);

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

// Round to nearest even, NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even

// fp8 e4m3fn decode through a 256-entry table (exact).
float e4m3_to_f32(uint8_t v);
// fp8 e4m3fn encode: round to nearest even, saturating to +-448 (finite inputs), NaN -> 0x7F.
uint8_t f32_to_e4m3(float f);

inline constexpr float kE4M3Max = 448.0f;

// Elements [begin, begin + n) of an array of a float dtype (F32, BF16, F16, F8_E4M3) as fp32 into out
// (exact), the dtype read once for the span.
void load_span_as_f32(const void* base, DType dtype, int64_t begin, int64_t n, float* out);

}  // namespace dsi
