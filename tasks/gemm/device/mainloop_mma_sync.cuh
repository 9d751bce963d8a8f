// The mma.sync fallback mainloop (sm_80+): correct and simple, not fast. Per 32-wide K step, every
// thread of the block stages A (block_m x 32) and B (block_n x 32) into padded shared tiles with
// 16-byte loads (rows past the tile's valid rows, B rows past n and K past the split's end are
// zero-filled, never read), then the 8 consumer warps run ldmatrix + mma.m16n8k16 over their
// 16 x WN fragment. One stage, two block barriers per step; every thread runs the same trip count.
#pragma once

#if defined(__CUDACC__)

#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/ptx/mma_sync.cuh"
#include "tasks/gemm/ptx/tma.cuh"

namespace loom::tasks::gemm::impl {

inline constexpr std::uint32_t kSyncStepK = 32;
// Padded row: 32 bf16 + 8 = 80 bytes, so the 8 row addresses of one ldmatrix fall in distinct
// 16-byte bank groups.
inline constexpr std::uint32_t kSyncRowElems = kSyncStepK + 8;

// Called by every thread of the block: kComputes for the consumer warps (acc receives their
// fragment), !kComputes for the others (they load and join the barriers; acc untouched).
template <int WN, bool kComputes>
__device__ void mma_sync_mainloop(float (&acc)[WN / 2], GemmOperands const& op, TileJob const& job,
                                  unsigned char* smem, WarpTile const& wt, bool active) {
  GemmConfig const cfg = op.config;
  auto* const a_tile = reinterpret_cast<std::uint16_t*>(smem);  // [block_m][kSyncRowElems]
  auto* const b_tile = a_tile + cfg.block_m * kSyncRowElems;    // [block_n][kSyncRowElems]
  auto const* const a = reinterpret_cast<std::uint16_t const*>(op.a);
  auto const* const b =
      reinterpret_cast<std::uint16_t const*>(op.b) + std::size_t{job.expert} * op.n * op.k;
  std::uint32_t const k_begin = job.k_block_begin * kBlockK;
  std::uint32_t const k_end = min(op.k, (job.k_block_begin + job.k_block_count) * kBlockK);
  constexpr std::uint32_t kChunks = kSyncStepK / 8;  // 16-byte chunks per staged row
  unsigned const lane = threadIdx.x % 32u;
  if constexpr (kComputes) {
#pragma unroll
    for (int i = 0; i < WN / 2; ++i) acc[i] = 0.0f;
  }

  for (std::uint32_t k0 = k_begin; k0 < k_end; k0 += kSyncStepK) {
    for (std::uint32_t i = threadIdx.x; i < cfg.block_m * kChunks; i += blockDim.x) {
      std::uint32_t const r = i / kChunks, kk = k0 + (i % kChunks) * 8u;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < job.rows && kk < k_end)
        v = *reinterpret_cast<uint4 const*>(a + std::size_t{job.a_row0 + r} * op.lda + kk);
      *reinterpret_cast<uint4*>(a_tile + r * kSyncRowElems + (i % kChunks) * 8u) = v;
    }
    for (std::uint32_t i = threadIdx.x; i < cfg.block_n * kChunks; i += blockDim.x) {
      std::uint32_t const r = i / kChunks, kk = k0 + (i % kChunks) * 8u;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (job.n0 + r < op.n && kk < k_end)
        v = *reinterpret_cast<uint4 const*>(b + std::size_t{job.n0 + r} * op.k + kk);
      *reinterpret_cast<uint4*>(b_tile + r * kSyncRowElems + (i % kChunks) * 8u) = v;
    }
    __syncthreads();
    if (kComputes && active) {
#pragma unroll
      for (std::uint32_t ks = 0; ks < kSyncStepK; ks += 16u) {
        // A: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15), lane l addresses row l % 8 of matrix l
        // / 8.
        std::uint32_t a_frag[4];
        std::uint32_t const a_row = wt.row_base + lane % 8u + 8u * ((lane / 8u) % 2u);
        ptx::ldmatrix_x4(
            a_frag, ptx::smem_address(a_tile + a_row * kSyncRowElems + ks + 8u * (lane / 16u)));
#pragma unroll
        for (int jj = 0; jj < WN / 16; ++jj) {
          // B^T rows n: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k
          // 8-15).
          std::uint32_t b_frag[4];
          std::uint32_t const b_row = wt.col_base + 16u * jj + lane % 8u + 8u * (lane / 16u);
          ptx::ldmatrix_x4(b_frag, ptx::smem_address(b_tile + b_row * kSyncRowElems + ks +
                                                     8u * ((lane / 8u) % 2u)));
          ptx::mma_m16n8k16_bf16(acc + 4 * (2 * jj), a_frag, b_frag[0], b_frag[1]);
          ptx::mma_m16n8k16_bf16(acc + 4 * (2 * jj + 1), a_frag, b_frag[2], b_frag[3]);
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
