// The K block step of the expert tiles' K loop (tasks/gemm/device/mainloop_wgmma.cuh), as the
// probes wgmma_split_probe.cu and expert_tile_feed_probe.cu issue it for one warpgroup: wgmma N1
// on (da1, db1) and, if N2 > 0, N2 on (da2, db2) for the four k16 steps of a 64-wide K block, one
// commit, then a wait that leaves this block's group in flight. Also the probes' check of a CUDA
// call (CK: prints the failed call and returns 1 from main).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#define CK(x)                                              \
  do {                                                     \
    cudaError_t e_ = (x);                                  \
    if (e_ != cudaSuccess) {                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); \
      return 1;                                            \
    }                                                      \
  } while (0)

#include "tasks/gemm/ptx/wgmma.cuh"

template <int N1, int N2>
__device__ __forceinline__ void wgmma_k_block(float (&acc1)[N1 / 2],
                                              float (&acc2)[N2 > 0 ? N2 / 2 : 1], std::uint64_t da1,
                                              std::uint64_t db1, std::uint64_t da2,
                                              std::uint64_t db2) {
  namespace ptx = loom::tasks::gemm::ptx;
#pragma unroll
  for (int i = 0; i < N1 / 2; ++i) ptx::fence_operand(acc1[i]);
  if constexpr (N2 > 0) {
#pragma unroll
    for (int i = 0; i < N2 / 2; ++i) ptx::fence_operand(acc2[i]);
  }
  ptx::wgmma_fence();
#pragma unroll
  for (std::uint32_t k = 0; k < 4; ++k) {
    ptx::WgmmaBf16<N1>::mma(da1 + 2u * k, db1 + 2u * k, acc1, 1u);
    if constexpr (N2 > 0) ptx::WgmmaBf16<N2>::mma(da2 + 2u * k, db2 + 2u * k, acc2, 1u);
  }
  ptx::wgmma_commit_group();
#pragma unroll
  for (int i = 0; i < N1 / 2; ++i) ptx::fence_operand(acc1[i]);
  if constexpr (N2 > 0) {
#pragma unroll
    for (int i = 0; i < N2 / 2; ++i) ptx::fence_operand(acc2[i]);
  }
  ptx::wgmma_wait_group<1>();
}
