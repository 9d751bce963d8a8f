// Named block barriers (the GEMM task's consumer warpgroups synchronise among themselves while
// the producer warpgroup is elsewhere) and per-warpgroup register reconfiguration.
#pragma once

#if defined(__CUDACC__)

#include <cstdint>

#include "runtime/config.hpp"

namespace loom::tasks::gemm::ptx {

// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for `threads` threads, a multiple of
// 32. Every participating warp calls it with the same arguments; it orders their shared-memory
// accesses like __syncthreads.
LOOM_DEVICE LOOM_INLINE void named_barrier_sync(std::uint32_t id, std::uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive on named barrier `id` for `threads` threads: counts this warp in without waiting; the
// warps that must wait call named_barrier_sync with the same arguments.
LOOM_DEVICE LOOM_INLINE void named_barrier_arrive(std::uint32_t id, std::uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg (sm_90a): this warpgroup's registers per thread become kRegs (a multiple of 8 in
// 24..256); .inc blocks until the block's pool has them, .dec returns them to the pool. Whole
// warpgroup, converged. The pool is first come, first served, per warp: a warpgroup that gives
// registers back and asks for them again before the borrower has taken them can take them back
// first and leave the borrower waiting for ever, so the lender must wait (a barrier) for the
// borrower to return them before it asks again. ptxas honours it only under a launch-bounds register cap, with each role
// one branch of an if/else; elsewhere (no sm_90a) these are no-ops and the cap stays.
template <std::uint32_t kRegs>
LOOM_DEVICE LOOM_INLINE void setmaxnreg_inc() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <std::uint32_t kRegs>
LOOM_DEVICE LOOM_INLINE void setmaxnreg_dec() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace loom::tasks::gemm::ptx

#endif  // __CUDACC__
