// TMA tile loads (and stores) and the mbarriers they complete on, as thin named wrappers over
// libcu++'s cuda::ptx (plus the one instruction it lacks, mbarrier.inval). sm_90.
//
// Contracts:
// - a tensor map may live in global memory (64-byte aligned, written before the launch); the
//   generic address of it is what the copy takes;
// - a bulk tensor copy always writes its whole box to shared memory (out-of-bounds elements as
//   zeros) and always completes box-size bytes on the mbarrier, so expect_tx counts full boxes;
// - the destination of a 128-byte-swizzled box must be 1024-byte aligned.
#pragma once

#if defined(__CUDACC__)

#include <cstdint>
#include <cuda/ptx>

#include "runtime/config.hpp"
#include "tasks/gemm/ptx/smem.cuh"

namespace loom::tasks::gemm::ptx {

// A tensor map rewritten in global memory between launches (by generic stores): the writer
// releases its stores to the tensor-map proxy, and each thread that copies through the map
// acquires it first, so that its copies do not read an older copy of the map.
LOOM_DEVICE LOOM_INLINE void fence_tensormap_release() {
  cuda::ptx::fence_proxy_tensormap_generic(cuda::ptx::sem_release, cuda::ptx::scope_gpu);
}
LOOM_DEVICE LOOM_INLINE void fence_tensormap_acquire(void const* map) {
  cuda::ptx::fence_proxy_tensormap_generic(cuda::ptx::sem_acquire, cuda::ptx::scope_gpu, map,
                                           cuda::ptx::n32_t<128>{});
}

// One thread. The barrier completes a phase after `count` arrivals (and all expected bytes).
LOOM_DEVICE LOOM_INLINE void mbarrier_init(std::uint64_t* bar, std::uint32_t count) {
  cuda::ptx::mbarrier_init(bar, count);
}

// Makes mbarrier initialisations of this thread visible to the async proxy (TMA); follow it with a
// block barrier before other threads use the mbarriers.
LOOM_DEVICE LOOM_INLINE void fence_mbarrier_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// One thread, when no arrival, wait or copy on the barrier is outstanding: returns the memory to
// ordinary use (another task type may reuse this shared memory).
LOOM_DEVICE LOOM_INLINE void mbarrier_inval(std::uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_address(bar)) : "memory");
}

// One arrival with release semantics (orders this thread's earlier shared-memory accesses, and
// its completed wgmma reads, before the phase completes).
// Raw PTX (always inlined): consumers call it while wgmma are in flight, where a call would make
// ptxas serialise them.
LOOM_DEVICE LOOM_INLINE void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                   smem_address(bar))
               : "memory");
}

// One arrival that also announces `bytes` of asynchronous copies completing on this phase.
LOOM_DEVICE LOOM_INLINE void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, bar, bytes);
}

// True once the phase with parity `parity` has completed (acquire: the copies' data is visible).
// May suspend the thread for a hardware-chosen time before returning false.
// Raw PTX (always inlined), for the same reason as mbarrier_arrive.
LOOM_DEVICE LOOM_INLINE bool mbarrier_try_wait_parity(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// cp.async.bulk.tensor.2d: box at coordinates {c0 (innermost), c1} of `tensor_map` into `dst`;
// completes on `bar`. One thread.
LOOM_DEVICE LOOM_INLINE void tma_load_2d(void* dst, void const* tensor_map, std::int32_t c0,
                                         std::int32_t c1, std::uint64_t* bar) {
  std::int32_t const coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst,
                                  tensor_map, coords, bar);
}

// cp.async.bulk.tensor.3d: box at {c0, c1, c2}. One thread.
LOOM_DEVICE LOOM_INLINE void tma_load_3d(void* dst, void const* tensor_map, std::int32_t c0,
                                         std::int32_t c1, std::int32_t c2, std::uint64_t* bar) {
  std::int32_t const coords[3] = {c0, c1, c2};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst,
                                  tensor_map, coords, bar);
}

// A cache policy for `.L2::cache_hint` copies (tma_load_3d_hint): the lines they touch are the
// first to be evicted. One instruction; make it once per tile.
LOOM_DEVICE LOOM_INLINE std::uint64_t l2_policy_evict_first() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// tma_load_3d with an L2 cache policy (l2_policy_evict_first). libcu++'s cuda::ptx has no
// cache-hint form of the tensor copy, hence raw PTX. One thread.
LOOM_DEVICE LOOM_INLINE void tma_load_3d_hint(void* dst, void const* tensor_map, std::int32_t c0,
                                              std::int32_t c1, std::int32_t c2, std::uint64_t* bar,
                                              std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_address(dst)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

// cp.async.bulk global -> shared: `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// `src` into `dst`, completing on `bar` as transaction bytes. One thread.
LOOM_DEVICE LOOM_INLINE void bulk_load(void* dst, void const* src, std::uint32_t bytes,
                                       std::uint64_t* bar) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
}

// cp.async.bulk.tensor.2d shared -> global: the box at shared address `src` (laid out as a load
// of the same map would leave it) to coordinates {c0, c1} of `tensor_map`; elements past the map's
// extents are not written. One thread; joins this thread's open bulk group (bulk_commit_group).
LOOM_DEVICE LOOM_INLINE void tma_store_2d(void const* tensor_map, std::uint32_t src,
                                          std::int32_t c0, std::int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
          tensor_map),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

// Closes this thread's bulk group of stores issued since the last commit.
LOOM_DEVICE LOOM_INLINE void bulk_commit_group() {
  cuda::ptx::cp_async_bulk_commit_group();
}

// Waits until at most kPending of this thread's bulk groups still read their shared memory (the
// older groups' sources may be overwritten).
template <int kPending>
LOOM_DEVICE LOOM_INLINE void bulk_wait_group_read() {
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<kPending>{});
}

// Waits until every bulk group of this thread has completed its writes to global memory, then
// orders them (async proxy) before this thread's later generic-proxy accesses: a release that
// follows makes them visible to whoever acquires it.
LOOM_DEVICE LOOM_INLINE void bulk_wait_all_written() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  cuda::ptx::fence_proxy_async();
}

// Orders this thread's generic-proxy shared-memory accesses before later async-proxy accesses
// (TMA writes, wgmma reads) of the same memory; each writing thread, before the block barrier.
LOOM_DEVICE LOOM_INLINE void fence_proxy_async_shared() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// Orders global-memory accesses this thread has made or acquired through the generic proxy
// (plain loads and stores, other blocks' stores seen through an acquire) before its later
// async-proxy accesses of the same memory (bulk copies).
LOOM_DEVICE LOOM_INLINE void fence_proxy_async_global() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
}

}  // namespace loom::tasks::gemm::ptx

#endif  // __CUDACC__
