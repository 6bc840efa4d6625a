// Scalar dtype conversions; see dtype.h.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "dsinfer/error.h"

namespace dsi {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::I16: return 2;
    case DType::I8: return 1;
    case DType::U8: return 1;
    case DType::BOOL: return 1;
  }
  return 0;
}

namespace {
struct DTypeName {
  DType type;
  std::string_view name;
};
constexpr std::array<DTypeName, 10> kNames = {{{DType::F32, "F32"},
                                              {DType::F16, "F16"},
                                              {DType::BF16, "BF16"},
                                              {DType::F8_E4M3, "F8_E4M3"},
                                              {DType::I64, "I64"},
                                              {DType::I32, "I32"},
                                              {DType::I16, "I16"},
                                              {DType::I8, "I8"},
                                              {DType::U8, "U8"},
                                              {DType::BOOL, "BOOL"}}};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.name;
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (const auto& n : kNames) {
    if (n.name == name) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < 6.103515625e-05f) {               // subnormal range: quantum 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // default rounding mode is to-nearest-even
    return sign | uint16_t(q);
  }
  const uint32_t au = f32_to_bits(a);
  uint32_t rounded = au + 0xfffu + ((au >> 13) & 1u);
  return sign | uint16_t(((rounded >> 13) - (112u << 10)) & 0x7fff);
}

namespace {
std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float x;
    if (exp == 15 && man == 7) {
      x = std::nanf("");
    } else if (exp == 0) {
      x = std::ldexp(float(man) / 8.0f, -6);
    } else {
      x = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    }
    t[v] = sign ? -x : x;
  }
  return t;
}
const std::array<float, 256> kE4M3Table = make_e4m3_table();
}  // namespace

float e4m3_to_f32(uint8_t v) { return kE4M3Table[v]; }

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= kE4M3Max) return sign | 0x7e;  // saturate to 448
  // Find the binade; subnormals (exp field 0) have quantum 2^-9.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_field = e - 1 + 7;
  float quantum = exp_field <= 0 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, e - 1 - 3);
  float q = std::nearbyint(a / quantum);  // to nearest even
  float r = q * quantum;
  // r is exactly representable; encode by searching the (monotone) positive half of the table.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (kE4M3Table[mid] < r)
      lo = mid + 1;
    else
      hi = mid;
  }
  return sign | uint8_t(lo);
}

void load_span_as_f32(const void* base, DType dtype, int64_t begin, int64_t n, float* out) {
  switch (dtype) {
    case DType::F32: {
      const float* src = static_cast<const float*>(base) + begin;
      std::copy(src, src + n, out);
      return;
    }
    case DType::BF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(src[i]);
      return;
    }
    case DType::F8_E4M3: {
      const uint8_t* src = static_cast<const uint8_t*>(base) + begin;
      const float* table = kE4M3Table.data();
      for (int64_t i = 0; i < n; ++i) out[i] = table[src[i]];
      return;
    }
    default: fail("load_span_as_f32: {} is not a float dtype", dtype_name(dtype));
  }
}

}  // namespace dsi
