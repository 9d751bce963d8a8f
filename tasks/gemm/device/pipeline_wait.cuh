// Bounded mbarrier waits for the GEMM task's pipeline: a wait that outlives the launch's watchdog
// records a task failure (naming the barrier) instead of hanging the GPU, and a failure elsewhere
// ends it early. Device only.
#pragma once

#if defined(__CUDACC__)

#include "runtime/context.hpp"
#include "tasks/gemm/ptx/tma.cuh"

namespace loom::tasks::gemm::impl {

// Codes a GEMM task records through TaskContext::fail (its `line` field).
enum class GemmFailure : std::uint32_t {
  bad_tile = 1,         // payload outside the operands (a: rows, b: expert << 32 | n_tile)
  barrier_timeout = 2,  // pipeline mbarrier never completed (a: barrier index, b: parity)
  no_wgmma = 3,         // wgmma path on a GPU (or build target) without wgmma
  block_size = 4,       // the block is not GemmTileTask::threads (a: blockDim, b: expected)
  shared_memory = 5,    // a tall tile's shared memory is not the block's dynamic shared memory
                        // (a: its shared address, b: the dynamic one's)
};

// Returns true once phase `parity` of `bar` completed; false when the launch failed (this wait
// timed out and recorded it, or another actor failed). `which` names the barrier in the error.
__device__ __forceinline__ bool wait_barrier(std::uint64_t* bar, std::uint32_t parity,
                                             TaskContext const& ctx, std::uint32_t which) {
  if (ptx::mbarrier_try_wait_parity(bar, parity)) return true;
  Watchdog dog = ctx.watchdog(WaitSite::none, which);
  for (;;) {
    if (ptx::mbarrier_try_wait_parity(bar, parity)) return true;
    Watchdog::Poll const poll = dog.poll();
    if (poll == Watchdog::Poll::failed_elsewhere) return false;
    if (poll == Watchdog::Poll::expired) {
      ctx.fail(static_cast<std::uint32_t>(GemmFailure::barrier_timeout), which, parity);
      return false;
    }
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
