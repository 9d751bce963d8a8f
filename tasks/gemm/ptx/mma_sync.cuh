// ldmatrix + mma.sync.m16n8k16 (bf16 x bf16 -> fp32) wrappers: the GEMM task's fallback path on
// GPUs without wgmma (sm_80+). Every call is warp-wide (.sync.aligned: all 32 lanes, converged).
//
// Fragments (PTX ISA, "mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
//                           a[3] = A[g+8][2t+8..]
//   B (16 x 8, "col": stored as B^T, 8 rows of n by 16 k): b[0] = B^T[g][2t..2t+1],
//                           b[1] = B^T[g][2t+8..]
//   C/D (16 x 8, fp32):     d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
#pragma once

#if defined(__CUDACC__)

#include <cstdint>

#include "runtime/config.hpp"

namespace loom::tasks::gemm::ptx {

// Four 8x8 b16 matrices; lane l gives the shared address of row l % 8 of matrix l / 8, and receives
// r[i] = its (g, 2t..2t+1) pair of matrix i.
LOOM_DEVICE LOOM_INLINE void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// d += A * B for one m16n8k16 step.
LOOM_DEVICE LOOM_INLINE void mma_m16n8k16_bf16(float* d, std::uint32_t const (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace loom::tasks::gemm::ptx

#endif  // __CUDACC__
