// Element types of the native kernels: float32 and bfloat16 (stored as its bits).
// Every kernel loads elements to fp32, computes in fp32 and rounds once on store.
#pragma once

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

}  // namespace genfleet
