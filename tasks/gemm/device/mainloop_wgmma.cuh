// The wgmma path's mainloop (sm_90a). Shared memory (1024-byte aligned `stages` area):
//
//   [A stage 0 .. A stage S-1][B stage 0 .. B stage S-1]    A: block_m x 64 bf16, B: block_n x 64
//
// each stage a TMA box with 128-byte swizzle. full[s] completes when a stage's two boxes have
// landed (1 arrival + transaction bytes); empty[s] completes when the 8 consumer warps have
// finished reading it (one arrival per warp after wgmma.wait_group). The producer is lane 0 of
// warp kProducerWarp; warps 0..7 are the two consumer warpgroups.
#pragma once

#if defined(__CUDACC__)

#include "tasks/gemm/device/pipeline_wait.cuh"
#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/ptx/tma.cuh"
#include "tasks/gemm/ptx/wgmma.cuh"

namespace loom::tasks::gemm::impl {

struct PipelineSmem {
  std::uint64_t* full;    // [stages]
  std::uint64_t* empty;   // [stages]
  unsigned char* stages;  // 1024-byte aligned
};

// Lane 0 of the producer warp: streams this split's K blocks through the stages.
__device__ inline void produce_tiles(GemmOperands const& op, TileJob const& job,
                                     PipelineSmem const& sm, TaskContext const& ctx) {
  GemmConfig const cfg = op.config;
  std::uint32_t const a_bytes = cfg.a_stage_bytes(), b_bytes = cfg.b_stage_bytes();
  unsigned char* const b_stages = sm.stages + cfg.stages * a_bytes;
  std::uint32_t stage = 0, phase = 0;
  for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
    // A fresh barrier counts as having completed the phase before phase 0: parity 1 passes.
    if (!wait_barrier(sm.empty + stage, phase ^ 1u, ctx, cfg.stages + stage)) return;
    ptx::mbarrier_arrive_expect_tx(sm.full + stage, a_bytes + b_bytes);
    std::int32_t const k0 = static_cast<std::int32_t>((job.k_block_begin + i) * kBlockK);
    ptx::tma_load_2d(sm.stages + stage * a_bytes, &op.a_map, k0,
                     static_cast<std::int32_t>(job.a_row0), sm.full + stage);
    ptx::tma_load_3d(b_stages + stage * b_bytes, &op.b_map, k0, static_cast<std::int32_t>(job.n0),
                     static_cast<std::int32_t>(job.expert), sm.full + stage);
    if (++stage == cfg.stages) stage = 0, phase ^= 1u;
  }
}

// The K loop of one active consumer warpgroup. kOverlap: the group of K block i stays in flight
// while block i + 1 is issued, and a stage is released once wgmma.wait_group says the group that
// read it has completed; otherwise each block's group is waited for before its stage is released.
// Straight-line around the wgmma (no divergent paths), so ptxas keeps them asynchronous.
template <int WN, bool kOverlap>
__device__ void wgmma_k_loop(float (&acc)[WN / 2], TileJob const& job, PipelineSmem const& sm,
                             TaskContext const& ctx, std::uint32_t a_base, std::uint32_t b_base,
                             std::uint32_t a_bytes, std::uint32_t b_bytes, std::uint32_t stages) {
  bool const lane0 = threadIdx.x % 32u == 0;
  std::uint32_t stage = 0, phase = 0, previous = 0;
  for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
    // Slow path (data not there yet): drain the group in flight first, so that no wgmma is
    // outstanding across the bounded wait's calls; a failed wait (the launch is failing) leaves
    // through the common tail.
    if (!ptx::mbarrier_try_wait_parity(sm.full + stage, phase)) {
      if constexpr (kOverlap) ptx::wgmma_wait_group<0>();
      if (!wait_barrier(sm.full + stage, phase, ctx, stage)) break;
    }
    std::uint64_t const desc_a = ptx::smem_desc_k_major_sw128(a_base + stage * a_bytes);
    std::uint64_t const desc_b = ptx::smem_desc_k_major_sw128(b_base + stage * b_bytes);
#pragma unroll
    for (int r = 0; r < WN / 2; ++r) ptx::fence_operand(acc[r]);
    ptx::wgmma_fence();
#pragma unroll
    for (std::uint32_t k = 0; k < kBlockK / 16u; ++k)  // 16 elements = 32 bytes = 2 units of 16
      ptx::WgmmaBf16<WN>::mma(desc_a + 2u * k, desc_b + 2u * k, acc, 1u);
    ptx::wgmma_commit_group();
#pragma unroll
    for (int r = 0; r < WN / 2; ++r) ptx::fence_operand(acc[r]);
    ptx::wgmma_wait_group<kOverlap ? 1 : 0>();
    __syncwarp();
    if constexpr (kOverlap) {
      if (lane0 && i > 0) ptx::mbarrier_arrive(sm.empty + previous);
    } else {
      if (lane0) ptx::mbarrier_arrive(sm.empty + stage);
    }
    previous = stage;
    if (++stage == stages) stage = 0, phase ^= 1u;
  }
  if constexpr (kOverlap) {
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < WN / 2; ++r) ptx::fence_operand(acc[r]);
    __syncwarp();
    if (lane0 && job.k_block_count > 0) ptx::mbarrier_arrive(sm.empty + previous);
  }
}

// Consumer warpgroups (warps 0..7, all 256 threads): acc = this warp's 16 x WN fragment of
// A_tile * B_tile^T over the split's K blocks. `active` is false for a warpgroup whose rows are all
// past the tile's valid rows: it computes nothing but still releases every stage.
template <int WN>
__device__ void consume_tiles(float (&acc)[WN / 2], GemmOperands const& op, TileJob const& job,
                              PipelineSmem const& sm, TaskContext const& ctx, unsigned warp,
                              bool active) {
  GemmConfig const cfg = op.config;
  std::uint32_t const a_bytes = cfg.a_stage_bytes(), b_bytes = cfg.b_stage_bytes();
  unsigned const group = warp / 4u;
  // This warpgroup's operands inside a stage: its 64 rows of A (M split) or its WN rows of B.
  std::uint32_t const a_offset = cfg.split_n() ? 0u : group * 64u * kRowBytes;
  std::uint32_t const b_offset = cfg.split_n() ? group * WN * kRowBytes : 0u;
  std::uint32_t const a_base = ptx::smem_address(sm.stages) + a_offset;
  std::uint32_t const b_base = ptx::smem_address(sm.stages + cfg.stages * a_bytes) + b_offset;
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc[i] = 0.0f;
  if (!active) {
    std::uint32_t stage = 0, phase = 0;
    for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
      if (!wait_barrier(sm.full + stage, phase, ctx, stage)) return;
      __syncwarp();
      if (threadIdx.x % 32u == 0) ptx::mbarrier_arrive(sm.empty + stage);
      if (++stage == cfg.stages) stage = 0, phase ^= 1u;
    }
  } else if (cfg.overlap) {
    wgmma_k_loop<WN, true>(acc, job, sm, ctx, a_base, b_base, a_bytes, b_bytes, cfg.stages);
  } else {
    wgmma_k_loop<WN, false>(acc, job, sm, ctx, a_base, b_base, a_bytes, b_bytes, cfg.stages);
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
