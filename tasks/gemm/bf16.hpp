// bfloat16 as the GEMM task stores it: the upper 16 bits of an IEEE-754 float. A plain struct, so
// host-only code (the CPU executor, the CPU tests) needs no CUDA header; device code reinterprets
// it as __nv_bfloat16 where an intrinsic wants that type. Conversions round to nearest even, the
// same rounding as __float2bfloat16_rn, so host and device outputs agree bit for bit on the same
// float.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/config.hpp"

namespace loom::tasks::gemm {

struct Bf16 {
  std::uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

LOOM_HD LOOM_INLINE float to_float(Bf16 x) {
  std::uint32_t const u = std::uint32_t{x.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
LOOM_HD LOOM_INLINE Bf16 to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  std::uint32_t const rounding = 0x7FFFu + ((u >> 16) & 1u);
  return Bf16{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

}  // namespace loom::tasks::gemm
