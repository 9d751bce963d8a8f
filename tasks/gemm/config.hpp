// The GEMM task's vocabulary: epilogue choices, the tile configuration of one GEMM, and the
// SwiGLU column interleave. Host and device; no CUDA header needed.
//
// Tile configurations (block_m x block_n, in rows of A x rows of B):
//
//   block_m = 128: "M split"  - consumer warpgroup g takes rows [64 g, 64 g + 64), all block_n
//                               columns; block_n in {64, 128, 224, 256}
//   block_m =  64: "N split"  - both warpgroups take the 64 rows, warpgroup g columns
//                               [g block_n/2, (g+1) block_n/2); block_n in {128, 256}
//   block_m = 192: "tall"     - warpgroup g takes rows [64 g, 64 g + 64) and all 256 columns
//                               (its head block), and rows [128, 192) with columns
//                               [128 g, 128 g + 128) (its tail block); block_n = 256
//
// so one warpgroup always computes a 64 x warp_n block with warp_n in {64, 128, 224, 256}: the
// template instantiations of the mainloops (a tall tile's warpgroup two of them, 256 and 128,
// both issued in each K block: the tensor cores run this even split at their full rate,
// docs/performance.md). Single-tile task types built for it compile the tall tile (GemmTallTile;
// tasks/gemm_tile.hpp); it takes no split-K. The 128x224 tile ("wide") runs on task types of its
// own (tasks/gemm_tile.hpp, kWide), the others on the rest. K advances in blocks of 64 (128 bytes
// of bf16, one 128-byte swizzle row); stages and split-K are run-time values.
#pragma once

#include <cstdint>

#include "runtime/config.hpp"

namespace loom::tasks::gemm {

enum class OutputType : std::uint8_t { bf16 = 0, fp32 = 1 };

// The epilogue's activation. swiglu pairs columns of B (see swiglu_gate_column) and halves the
// output width: out = silu(gate) * up.
enum class GemmActivation : std::uint8_t { none = 0, relu = 1, gelu_tanh = 2, swiglu = 3 };

// Which tensor-core instruction computes the tile. wgmma (sm_90a): TMA loads into a multi-stage
// mbarrier pipeline, one producer warp, two consumer warpgroups. mma_sync: any sm_80+ GPU, plain
// 16-byte loads, one stage, ldmatrix + mma.sync.m16n8k16; the correctness fallback.
enum class MmaPath : std::uint8_t { wgmma = 0, mma_sync = 1 };

// How a tile's TMA loads of B rank their lines in L2 (PTX createpolicy). evict_first: no other
// tile of the GEMM reads these columns of B (a GEMM of one M-tile, an expert's only M-tile), so
// their lines go before those other tiles still read (A rows, outputs, weights an expert's other
// M-tiles share). A hint that never changes a result; the mma.sync path has no TMA and ignores it.
enum class L2Hint : std::uint8_t { normal = 0, evict_first = 1 };

inline constexpr std::uint32_t kBlockK = 64;             // bf16 elements per K block
inline constexpr std::uint32_t kRowBytes = kBlockK * 2;  // one swizzle row: 128 bytes
inline constexpr std::uint32_t kMaxStages = 8;
// The pipeline barrier numbers a failed wait reports: full[s] is s, empty[s] is kMaxStages + s,
// and this one the barrier on which the consumers say a run's staged tile is delivered.
inline constexpr std::uint32_t kDrainedBarrier = 2 * kMaxStages;
// Stages, reused for the epilogue (a staged tile covers whole stages): 208 KB holds five 64x256
// stages (40 KB each: one more in flight for the memory-bound short tiles than 192 KB) and leaves
// the runtime and L1 the rest of the 227.
inline constexpr std::uint32_t kStageAreaBytes = 208 * 1024;
// A run task may store its finished bf16 tiles with TMA instead (tasks/gemm_tile.hpp): each
// consumer warpgroup fills boxes of 64 rows x 64 columns (one 128-byte swizzle row per tile row)
// in turn in its two buffers, placed after the stages, while the previous box is being stored.
inline constexpr std::uint32_t kStoreBoxCols = 64;
inline constexpr std::uint32_t kStoreBoxRows = 64;
inline constexpr std::uint32_t kStoreBoxBytes = kStoreBoxCols * 2 * kStoreBoxRows;
inline constexpr std::uint32_t kStoreBufferBytes = 2 * 2 * kStoreBoxBytes;  // 2 per warpgroup
// The run task's area: the stages the heuristic picks for 128-row tiles (at most 192 KB) and the
// store buffers; a deeper pipeline that leaves no room for them stages its tiles as single tiles
// do.
inline constexpr std::uint32_t kRunAreaBytes = 192 * 1024 + kStoreBufferBytes;
inline constexpr std::uint32_t kConsumerThreads = 256;                 // warpgroups 0 and 1
inline constexpr std::uint32_t kProducerWarp = kConsumerThreads / 32;  // warp 8: warpgroup 2
inline constexpr std::uint32_t kThreads = kConsumerThreads + 128;
// Registers per thread: what __launch_bounds__(384, 1) gives every warp at entry (65536 / 384,
// rounded down to 8), and the split the 128x256 tile moves to with setmaxnreg. The block's pool
// holds only what it started with, 384 x 168: the consumers' increase must be covered by the
// producer warpgroup's decrease (2 x 208 + 88 = 3 x 168), or setmaxnreg.inc waits forever.
inline constexpr std::uint32_t kEntryRegs = 168;
inline constexpr std::uint32_t kConsumerRegs = 208;
inline constexpr std::uint32_t kProducerRegs = 88;
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * kEntryRegs,
              "the register split must fit the block's pool at entry");
// The tall tile's split: its consumers hold 192 accumulators a thread (128 of the head block, 64
// of the tail), and the producer warpgroup keeps what its one TMA thread needs.
inline constexpr std::uint32_t kTallConsumerRegs = 232;
inline constexpr std::uint32_t kTallProducerRegs = 40;
// The tall tile's pipeline depth: the three 56 KB stages the stage area holds, a compile-time
// count in its K loop (one register fewer beside the accumulators).
inline constexpr std::uint32_t kTallStages = 3;
static_assert(2 * kTallConsumerRegs + kTallProducerRegs <= 3 * kEntryRegs,
              "the tall tile's register split must fit the block's pool at entry");
inline constexpr std::uint32_t kMaxSplits = 16;

struct GemmConfig {
  std::uint16_t block_m = 128;  // rows of A per tile: 64, 128 or 192
  std::uint16_t block_n = 256;  // rows of B (columns of the product) per tile: 64..256
  std::uint8_t stages = 4;      // shared-memory pipeline depth (wgmma path), 2..kMaxStages
  std::uint8_t splits = 1;      // split-K factor: tiles are summed by the last split to finish
  MmaPath path = MmaPath::wgmma;
  std::uint8_t overlap = 1;  // wgmma: keep one K block's MMAs in flight while issuing the next

  LOOM_HD constexpr bool split_n() const { return block_m == 64; }
  // The 192x256 tile: two blocks per consumer warpgroup (see above).
  LOOM_HD constexpr bool tall() const { return block_m == 192; }
  // The 128x224 tile, which only the wide task types run (GemmWideTile, GemmWideRunTile).
  LOOM_HD constexpr bool wide() const { return block_n == 224; }
  // Columns one consumer warpgroup computes: the wgmma instruction's N.
  LOOM_HD constexpr std::uint32_t warp_n() const { return split_n() ? block_n / 2u : block_n; }
  LOOM_HD constexpr std::uint32_t a_stage_bytes() const { return block_m * kRowBytes; }
  LOOM_HD constexpr std::uint32_t b_stage_bytes() const { return block_n * kRowBytes; }
  LOOM_HD constexpr std::uint32_t stage_bytes() const { return a_stage_bytes() + b_stage_bytes(); }
  LOOM_HD constexpr bool shape_supported() const {
    return (block_m == 128 &&
            (block_n == 64 || block_n == 128 || block_n == 224 || block_n == 256)) ||
           (block_m == 64 && (block_n == 128 || block_n == 256)) ||
           (block_m == 192 && block_n == 256);
  }
  // The deepest pipeline that fits the stage area.
  LOOM_HD constexpr std::uint32_t max_stages() const {
    std::uint32_t const s = kStageAreaBytes / stage_bytes();
    return s < kMaxStages ? s : kMaxStages;
  }
};
static_assert(sizeof(GemmConfig) == 8);

// K blocks of split `split` out of `splits` over k_blocks blocks: [begin, end). Every split is
// non-empty when splits <= ceil(k_blocks / ceil(k_blocks / splits)) (checked on the host).
LOOM_HD LOOM_INLINE std::uint32_t split_k_blocks_per(std::uint32_t k_blocks, std::uint32_t splits) {
  return (k_blocks + splits - 1) / splits;
}

// SwiGLU interleave. B's N dimension holds gate and up rows in alternating blocks of 8:
//
//   B rows 16 j + 0 .. 16 j + 7  = gate rows 8 j .. 8 j + 7
//   B rows 16 j + 8 .. 16 j + 15 = up   rows 8 j .. 8 j + 7
//
// The wgmma (and mma.sync) accumulator gives each thread columns 8 c + 2 (lane % 4) + {0, 1} of
// every 8-column chunk c, so chunk 2 j (gate) and chunk 2 j + 1 (up) of a thread hold matching
// gate/up pairs in its own registers: the epilogue pairs them without any data movement, for any
// tile width that is a multiple of 16. Output column o = 8 j + i reads B rows 16 j + i and
// 16 j + 8 + i.
LOOM_HD constexpr std::uint32_t swiglu_gate_column(std::uint32_t out_col) {
  return 16u * (out_col / 8u) + out_col % 8u;
}
LOOM_HD constexpr std::uint32_t swiglu_up_column(std::uint32_t out_col) {
  return swiglu_gate_column(out_col) + 8u;
}

}  // namespace loom::tasks::gemm
