// bfloat16 on the host without CUDA headers: round-to-nearest-even conversion from float and
// exact widening back, for building GPU inputs and checking GPU outputs against references.
#pragma once

#include <cstdint>
#include <cstring>

namespace feplb {

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                   // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The float nearest to f that bf16 represents exactly.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace feplb
