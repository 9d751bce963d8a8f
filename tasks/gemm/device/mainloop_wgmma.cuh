// The wgmma path's mainloop (sm_90a). Shared memory (1024-byte aligned `stages` area):
//
//   [A 0 | B 0][A 1 | B 1] .. [A S-1 | B S-1]    A: block_m x 64 bf16, B: block_n x 64
//
// each box a TMA box with 128-byte swizzle, each stage contiguous (a staged tile may cover
// several). full[s] completes when a stage's two boxes have landed (1 arrival + transaction
// bytes); empty[s] completes when the 8 consumer warps have finished reading it (one arrival per
// warp after wgmma.wait_group). The producer is lane 0 of warp kProducerWarp; warps 0..7 are the
// two consumer warpgroups.
//
// A task may compute a run of N-tiles over the same rows. The K blocks of all its tiles go through
// the stages as one stream, and tile t's finished values are staged in the stages its own last K
// blocks used (StagingPlan). While the consumers finish and deliver tile t, the producer fills the
// other stages with tile t + 1's first K blocks; it loads into the staging stages only once every
// consumer warp has arrived on `drained` after delivering tile t.
#pragma once

#if defined(__CUDACC__)

#include "tasks/gemm/device/pipeline_wait.cuh"
#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/ptx/tma.cuh"
#include "tasks/gemm/ptx/wgmma.cuh"

namespace loom::tasks::gemm::impl {

struct PipelineSmem {
  std::uint64_t* full;     // [stages]
  std::uint64_t* empty;    // [stages]
  std::uint64_t* drained;  // one; 8 arrivals: the consumer warps have delivered a staged tile
  unsigned char* stages;   // 1024-byte aligned
};

// Which stages tile t of a run stages its finished values in: `span` consecutive stages (enough
// for `bytes`) ending with the stage of the tile's last K block, or the last `span` stages when
// those would wrap around. All of them are free once both warpgroups have finished the tile, and
// the next tile's K blocks reach them last. A span of every stage starts at stage 0 (the staged
// tile may then use the whole stage area).
struct StagingPlan {
  std::uint32_t stages;    // pipeline depth S
  std::uint32_t k_blocks;  // K blocks per tile
  std::uint32_t span;      // 1 .. S

  __device__ LOOM_INLINE static StagingPlan make(GemmConfig const& cfg, std::uint32_t k_blocks,
                                                 std::uint32_t bytes) {
    std::uint32_t const span = (bytes + cfg.stage_bytes() - 1) / cfg.stage_bytes();
    return StagingPlan{cfg.stages, k_blocks, span < cfg.stages ? span : cfg.stages};
  }
  __device__ LOOM_INLINE std::uint32_t first(std::uint32_t tile) const {
    if (span >= stages) return 0;
    std::uint32_t const last = ((tile + 1u) * k_blocks - 1u) % stages;
    return last + 1u >= span ? last + 1u - span : stages - span;
  }
};

// Lane 0 of the producer warp: streams the K blocks of this split, or of each of `tiles` N-tiles
// of a run (B rows job.n0 + t block_n), through the stages.
__device__ inline void produce_tiles(GemmOperands const& op, TileJob const& job,
                                     std::uint32_t tiles, StagingPlan const& plan,
                                     PipelineSmem const& sm, TaskContext const& ctx) {
  GemmConfig const cfg = op.config;
  std::uint32_t const a_bytes = cfg.a_stage_bytes(), stage_bytes = cfg.stage_bytes();
  std::uint32_t stage = 0, phase = 0;
  bool const b_hinted = job.b_l2 == L2Hint::evict_first;
  std::uint64_t const b_policy = b_hinted ? ptx::l2_policy_evict_first() : 0;
  std::int32_t const expert = static_cast<std::int32_t>(job.expert);
  std::int32_t const a_row0 = static_cast<std::int32_t>(job.a_row0);
  for (std::uint32_t t = 0; t < tiles; ++t) {
    std::int32_t const n0 = static_cast<std::int32_t>(job.n0 + t * cfg.block_n);
    // Tile t - 1's staged values, in stages [staged, staged + span), may still be being delivered.
    // Waiting no later than this tile's last K block keeps `drained` at most one phase ahead of
    // this wait's parity.
    bool staged_pending = t > 0;
    std::uint32_t const staged = staged_pending ? plan.first(t - 1u) : 0u;
    for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
      // A fresh barrier counts as having completed the phase before phase 0: parity 1 passes.
      if (!wait_barrier(sm.empty + stage, phase ^ 1u, ctx, kMaxStages + stage)) return;
      bool const into_staged = stage >= staged && stage < staged + plan.span;
      if (staged_pending && (into_staged || i + 1u == job.k_block_count)) {
        if (!wait_barrier(sm.drained, (t - 1u) & 1u, ctx, kDrainedBarrier)) return;
        staged_pending = false;
      }
      unsigned char* const box = sm.stages + stage * stage_bytes;
      ptx::mbarrier_arrive_expect_tx(sm.full + stage, stage_bytes);
      std::int32_t const k0 = static_cast<std::int32_t>((job.k_block_begin + i) * kBlockK);
      ptx::tma_load_2d(box, &op.a_map, k0, a_row0, sm.full + stage);
      if (b_hinted)
        ptx::tma_load_3d_hint(box + a_bytes, &op.b_map, k0, n0, expert, sm.full + stage, b_policy);
      else
        ptx::tma_load_3d(box + a_bytes, &op.b_map, k0, n0, expert, sm.full + stage);
      if (++stage == cfg.stages) stage = 0, phase ^= 1u;
    }
  }
}

// The K loop of one active consumer warpgroup. kOverlap: the group of K block i stays in flight
// while block i + 1 is issued, and a stage is released once wgmma.wait_group says the group that
// read it has completed; otherwise each block's group is waited for before its stage is released.
// Straight-line around the wgmma (no divergent paths), so ptxas keeps them asynchronous.
// `stage` and `phase` carry the stream's position from one tile of a run to the next.
template <int WN, bool kOverlap>
__device__ void wgmma_k_loop(float (&acc)[WN / 2], TileJob const& job, PipelineSmem const& sm,
                             TaskContext const& ctx, std::uint32_t a_base, std::uint32_t b_base,
                             std::uint32_t stage_bytes, std::uint32_t stages, std::uint32_t& stage,
                             std::uint32_t& phase) {
  bool const lane0 = threadIdx.x % 32u == 0;
  std::uint32_t previous = 0;
  for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
    // Slow path (data not there yet): drain the group in flight first, so that no wgmma is
    // outstanding across the bounded wait's calls; a failed wait (the launch is failing) leaves
    // through the common tail.
    if (!ptx::mbarrier_try_wait_parity(sm.full + stage, phase)) {
      if constexpr (kOverlap) ptx::wgmma_wait_group<0>();
      if (!wait_barrier(sm.full + stage, phase, ctx, stage)) break;
    }
    std::uint64_t const desc_a = ptx::smem_desc_k_major_sw128(a_base + stage * stage_bytes);
    std::uint64_t const desc_b = ptx::smem_desc_k_major_sw128(b_base + stage * stage_bytes);
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
// A_tile * B_tile^T over the split's K blocks, taken from the stream at (stage, phase), which it
// advances. `active` is false for a warpgroup whose rows are all past the tile's valid rows: it
// computes nothing but still releases every stage.
template <int WN>
__device__ void consume_tiles(float (&acc)[WN / 2], GemmOperands const& op, TileJob const& job,
                              PipelineSmem const& sm, TaskContext const& ctx, unsigned warp,
                              bool active, std::uint32_t& stage, std::uint32_t& phase) {
  GemmConfig const cfg = op.config;
  std::uint32_t const stage_bytes = cfg.stage_bytes();
  unsigned const group = warp / 4u;
  // This warpgroup's operands inside a stage: its 64 rows of A (M split) or its WN rows of B.
  std::uint32_t const a_offset = cfg.split_n() ? 0u : group * 64u * kRowBytes;
  std::uint32_t const b_offset = cfg.split_n() ? group * WN * kRowBytes : 0u;
  std::uint32_t const a_base = ptx::smem_address(sm.stages) + a_offset;
  std::uint32_t const b_base = ptx::smem_address(sm.stages) + cfg.a_stage_bytes() + b_offset;
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc[i] = 0.0f;
  if (!active) {
    for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
      if (!wait_barrier(sm.full + stage, phase, ctx, stage)) return;
      __syncwarp();
      if (threadIdx.x % 32u == 0) ptx::mbarrier_arrive(sm.empty + stage);
      if (++stage == cfg.stages) stage = 0, phase ^= 1u;
    }
  } else if (cfg.overlap) {
    wgmma_k_loop<WN, true>(acc, job, sm, ctx, a_base, b_base, stage_bytes, cfg.stages, stage,
                           phase);
  } else {
    wgmma_k_loop<WN, false>(acc, job, sm, ctx, a_base, b_base, stage_bytes, cfg.stages, stage,
                            phase);
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
