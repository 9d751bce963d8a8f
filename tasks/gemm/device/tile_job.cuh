// What one GEMM tile task computes, decoded once from its payload and operands, and where each
// consumer warp's accumulators sit in the tile. Device only.
#pragma once

#if defined(__CUDACC__)

#include "tasks/gemm/operands.hpp"

namespace loom::tasks::gemm::impl {

struct TileJob {
  std::uint32_t expert, a_row0, c_row0, rows, n_tile, split, slot;
  std::uint32_t n0;             // first B column of the tile
  std::uint32_t k_block_begin;  // this split's K blocks
  std::uint32_t k_block_count;
  std::uint64_t sink_tag;
  L2Hint b_l2;  // how the producer's loads of B rank in L2
};

// Consumer warp `warp` (0..7) of the block holds a 16 x warp_n fragment of the tile: rows
// [row_base, row_base + 16), B columns [col_base, col_base + warp_n) (see config.hpp).
struct WarpTile {
  std::uint32_t row_base;
  std::uint32_t col_base;
};

__device__ LOOM_INLINE WarpTile warp_tile(GemmConfig const& cfg, unsigned warp) {
  unsigned const group = warp / 4u, in_group = warp % 4u;
  if (cfg.split_n()) return WarpTile{16u * in_group, group * cfg.warp_n()};
  return WarpTile{64u * group + 16u * in_group, 0u};
}
// A tall tile's consumer warp also holds a 16 x 128 fragment of the tail block: rows 128 + 16
// (warp % 4) on, columns [128 g, 128 g + 128) of its warpgroup g (its head is warp_tile's).
inline constexpr std::uint32_t kTallHeadRows = 128, kTallTailCols = 128;
__device__ LOOM_INLINE WarpTile tail_warp_tile(unsigned warp) {
  return WarpTile{kTallHeadRows + 16u * (warp % 4u), (warp / 4u) * kTallTailCols};
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
