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

// One warpgroup's 64 x WN block of a tile: its accumulators and the shared addresses of its A
// rows and B rows in stage 0. issue(offset) issues the block's wgmma for the four k16 steps of the
// K block `offset` bytes further on.
template <int WN>
struct WgmmaBlock {
  float (&acc)[WN / 2];
  std::uint32_t a_base, b_base;

  __device__ LOOM_INLINE void fence() {
#pragma unroll
    for (int r = 0; r < WN / 2; ++r) ptx::fence_operand(acc[r]);
  }
  __device__ LOOM_INLINE void issue(std::uint32_t offset) {
    std::uint64_t const desc_a = ptx::smem_desc_k_major_sw128(a_base + offset);
    std::uint64_t const desc_b = ptx::smem_desc_k_major_sw128(b_base + offset);
#pragma unroll
    for (std::uint32_t k = 0; k < kBlockK / 16u; ++k)  // 16 elements = 32 bytes = 2 units of 16
      ptx::WgmmaBf16<WN>::mma(desc_a + 2u * k, desc_b + 2u * k, acc, 1u);
  }
};

// A tall tile's two blocks of one warpgroup g (config.hpp), both issued in each K block, one
// group. The stage layout is fixed (kTallStageBytes, kTallStages), so the four operand descriptors
// are one descriptor of the stage plus constants and g: in the 232 registers the consumers hold,
// 192 are accumulators, and four operand addresses kept apart took two more than were left (loads
// from local memory in the K loop). A descriptor's start address counts 16-byte units (the low
// bits), and no operand of a stage ends past the stage area, so the additions never carry out of
// it.
inline constexpr std::uint32_t kTallABytes = 192u * kRowBytes;
inline constexpr std::uint32_t kTallStageBytes = kTallABytes + 256u * kRowBytes;
static_assert(GemmConfig{192, 256}.stage_bytes() == kTallStageBytes);
struct TallBlocks {
  float (&head)[128];
  float (&tail)[kTallTailCols / 2];
  std::uint32_t base;   // shared address of stage 0
  std::uint32_t group;  // the warpgroup, 0 or 1

  __device__ LOOM_INLINE void fence() {
#pragma unroll
    for (int r = 0; r < 128; ++r) ptx::fence_operand(head[r]);
#pragma unroll
    for (int r = 0; r < kTallTailCols / 2; ++r) ptx::fence_operand(tail[r]);
  }
  __device__ LOOM_INLINE void issue(std::uint32_t offset) {
    constexpr std::uint32_t kUnit = 16;  // bytes of a descriptor's address unit
    std::uint64_t const stage = ptx::smem_desc_k_major_sw128(base + offset);
    std::uint64_t const head_a = stage + group * (64u * kRowBytes / kUnit);
    std::uint64_t const b = stage + kTallABytes / kUnit;
    std::uint64_t const tail_a = stage + kTallHeadRows * kRowBytes / kUnit;
    std::uint64_t const tail_b = b + group * (kTallTailCols * kRowBytes / kUnit);
#pragma unroll
    for (std::uint32_t k = 0; k < kBlockK / 16u; ++k)
      ptx::WgmmaBf16<256>::mma(head_a + 2u * k, b + 2u * k, head, 1u);
#pragma unroll
    for (std::uint32_t k = 0; k < kBlockK / 16u; ++k)
      ptx::WgmmaBf16<kTallTailCols>::mma(tail_a + 2u * k, tail_b + 2u * k, tail, 1u);
  }
};

// The K loop of one active consumer warpgroup over its block(s) (WgmmaBlock or TallBlocks).
// kOverlap: the group of K block i stays in flight while block i + 1 is issued, and a stage is
// released once wgmma.wait_group says the group that read it has completed; otherwise each
// block's group is waited for before its stage is released. Straight-line around the wgmma (no
// divergent paths), so ptxas keeps them asynchronous. `stage` and `phase` carry the stream's
// position from one tile of a run to the next.
template <bool kOverlap, class Blocks>
__device__ void wgmma_k_loop(Blocks& blocks, TileJob const& job, PipelineSmem const& sm,
                             TaskContext const& ctx, std::uint32_t stage_bytes,
                             std::uint32_t stages, std::uint32_t& stage, std::uint32_t& phase) {
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
    blocks.fence();
    ptx::wgmma_fence();
    blocks.issue(stage * stage_bytes);
    ptx::wgmma_commit_group();
    blocks.fence();
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
    blocks.fence();
    __syncwarp();
    if (lane0 && job.k_block_count > 0) ptx::mbarrier_arrive(sm.empty + previous);
  }
}

template <class Blocks>
__device__ LOOM_INLINE void run_k_loop(Blocks& blocks, GemmConfig const& cfg, TileJob const& job,
                                       PipelineSmem const& sm, TaskContext const& ctx,
                                       std::uint32_t& stage, std::uint32_t& phase) {
  if (cfg.overlap)
    wgmma_k_loop<true>(blocks, job, sm, ctx, cfg.stage_bytes(), cfg.stages, stage, phase);
  else
    wgmma_k_loop<false>(blocks, job, sm, ctx, cfg.stage_bytes(), cfg.stages, stage, phase);
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
  unsigned const group = warp / 4u;
  // This warpgroup's operands inside a stage: its 64 rows of A (M split) or its WN rows of B.
  std::uint32_t const a_offset = cfg.split_n() ? 0u : group * 64u * kRowBytes;
  std::uint32_t const b_offset = cfg.split_n() ? group * WN * kRowBytes : 0u;
  std::uint32_t const base = ptx::smem_address(sm.stages);
#pragma unroll
  for (int i = 0; i < WN / 2; ++i) acc[i] = 0.0f;
  if (!active) {
    for (std::uint32_t i = 0; i < job.k_block_count; ++i) {
      if (!wait_barrier(sm.full + stage, phase, ctx, stage)) return;
      __syncwarp();
      if (threadIdx.x % 32u == 0) ptx::mbarrier_arrive(sm.empty + stage);
      if (++stage == cfg.stages) stage = 0, phase ^= 1u;
    }
    return;
  }
  WgmmaBlock<WN> block{acc, base + a_offset, base + cfg.a_stage_bytes() + b_offset};
  run_k_loop(block, cfg, job, sm, ctx, stage, phase);
}

// The tall tile's consumer warpgroups: head = the warp's 16 x 256 fragment of rows [64 g, 64 g +
// 64), tail = its 16 x 128 fragment of rows [128, 192) and columns [128 g, 128 g + 128) (warp_tile
// and tail_warp_tile). One tile, from stage 0; `base`: the shared address of sm.stages, best a
// constant (ptx::dynamic_smem_address).
__device__ inline void consume_tall_tile(float (&head)[128], float (&tail)[kTallTailCols / 2],
                                         GemmOperands const& op, TileJob const& job,
                                         PipelineSmem const& sm, std::uint32_t base,
                                         TaskContext const& ctx, unsigned warp) {
  GemmConfig const cfg = op.config;
#pragma unroll
  for (int i = 0; i < 128; ++i) head[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kTallTailCols / 2; ++i) tail[i] = 0.0f;
  TallBlocks blocks{head, tail, base, warp / 4u};
  std::uint32_t stage = 0, phase = 0;
  if (cfg.overlap)
    wgmma_k_loop<true>(blocks, job, sm, ctx, kTallStageBytes, kTallStages, stage, phase);
  else
    wgmma_k_loop<false>(blocks, job, sm, ctx, kTallStageBytes, kTallStages, stage, phase);
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
