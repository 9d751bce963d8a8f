// Shared memory by address (the 32-bit shared window). The epilogue and the sinks reach the
// staging tile through these: through a generic pointer the compiler cannot tell the tile is
// shared memory and emits generic loads and stores.
#pragma once

#if defined(__CUDACC__)

#include <cstdint>

#include "runtime/config.hpp"

namespace loom::tasks::gemm::ptx {

LOOM_DEVICE LOOM_INLINE std::uint32_t smem_address(void const* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// The shared address of the block's dynamic shared memory: a constant ptxas knows (the kernel's
// extern shared array starts after its static shared memory), where an address read from a
// pointer takes a register.
LOOM_DEVICE LOOM_INLINE std::uint32_t dynamic_smem_address() {
  extern __shared__ uint4 loom_gemm_dynamic_smem[];
  return smem_address(loom_gemm_dynamic_smem);
}

LOOM_DEVICE LOOM_INLINE uint4 ld_shared_v4(std::uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

LOOM_DEVICE LOOM_INLINE void st_shared_v4(std::uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

LOOM_DEVICE LOOM_INLINE void st_shared_b32(std::uint32_t addr, std::uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}

LOOM_DEVICE LOOM_INLINE void st_shared_v2_f32(std::uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y));
}

}  // namespace loom::tasks::gemm::ptx

#endif  // __CUDACC__
