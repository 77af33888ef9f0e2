// Element types of the native kernels: float32 and bfloat16 (stored as its bits),
// and for the KV cache the two fp8 formats (e4m3fn, e5m2).
// Every kernel loads elements to fp32, computes in fp32 and rounds once on store.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace genfleet {

using bf16 = uint16_t;

inline float to_float(float x) { return x; }

inline float to_float(bf16 x) {
  const uint32_t bits = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void store(float x, float* out) { *out = x; }

inline void store(float x, bf16* out) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // to nearest even
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  // A select, not a branch, so that loops of stores vectorise.
  *out = bf16((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// fp8 as torch's float8_e4m3fn (bias 7, no infinities, 0x7f NaN, largest 448) and
// float8_e5m2 (bias 15, IEEE-like: the top byte of a fp16).
struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};

template <int kMantissa, int kBias>
struct Fp8Format {
  static constexpr int kExponentMask = (1 << (7 - kMantissa)) - 1;

  static constexpr float power_of_two(int e) {
    float v = 1.f;
    for (; e > 0; --e) v *= 2.f;
    for (; e < 0; ++e) v *= 0.5f;
    return v;
  }

  static constexpr float decode(int bits) {
    const int exponent = (bits >> kMantissa) & kExponentMask;
    const int mantissa = bits & ((1 << kMantissa) - 1);
    const float sign = bits & 0x80 ? -1.f : 1.f;
    if (kMantissa == 3 && exponent == kExponentMask && mantissa == 7) return __builtin_nanf("");
    if (kMantissa == 2 && exponent == kExponentMask)
      return mantissa ? __builtin_nanf("") : sign * __builtin_inff();
    if (exponent == 0) return sign * float(mantissa) * power_of_two(1 - kBias - kMantissa);
    return sign * (1.f + float(mantissa) / float(1 << kMantissa)) * power_of_two(exponent - kBias);
  }

  struct Table {
    float values[256];
    constexpr Table() : values() {
      for (int i = 0; i < 256; ++i) values[i] = decode(i);
    }
  };
  static constexpr Table kTable{};

  // Round to nearest even; e4m3fn saturates at +-448, e5m2 overflows to infinity (as
  // torch). Selects, not branches, so that loops of stores vectorise.
  static uint8_t encode(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    float size;
    std::memcpy(&size, &magnitude, sizeof size);
    constexpr float kSmallestNormal = power_of_two(1 - kBias);
    // Below the smallest normal: a multiple of the subnormal step (rounding may reach
    // the smallest normal's code, which is the next integer: still right).
    const float steps = std::fmin(size, kSmallestNormal) * power_of_two(kBias - 1 + kMantissa);
    const uint32_t subnormal = uint32_t(__builtin_nearbyintf(steps));
    constexpr int kShift = 23 - kMantissa;
    const uint32_t rounded = magnitude + ((1u << (kShift - 1)) - 1) + ((magnitude >> kShift) & 1u);
    const uint32_t exponent = (rounded >> 23) - 127u + uint32_t(kBias);  // wraps below normals
    const uint32_t code = (exponent << kMantissa) | ((rounded >> kShift) & ((1u << kMantissa) - 1));
    constexpr uint32_t kLargest = kMantissa == 3 ? 0x7e : 0x7b;
    constexpr uint32_t kOverflow = kMantissa == 3 ? 0x7e : 0x7c;  // saturate / infinity
    uint32_t result = code > kLargest ? kOverflow : code;
    result = size < kSmallestNormal ? subnormal : result;
    result = magnitude > 0x7f800000u ? 0x7fu : result;  // NaN
    return uint8_t(sign | result);
  }
};

using E4m3 = Fp8Format<3, 7>;
using E5m2 = Fp8Format<2, 15>;

inline float to_float(fp8_e4m3 x) { return E4m3::kTable.values[x.bits]; }
inline float to_float(fp8_e5m2 x) { return E5m2::kTable.values[x.bits]; }
inline void store(float x, fp8_e4m3* out) { out->bits = E4m3::encode(x); }
inline void store(float x, fp8_e5m2* out) { out->bits = E5m2::encode(x); }

}  // namespace genfleet
