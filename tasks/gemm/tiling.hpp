// Host: cutting a GEMM's rows into tile tasks. No CUDA needed (the CPU executor uses it too).
#pragma once

#include <algorithm>
#include <vector>

#include "tasks/gemm_tile.hpp"

namespace loom::tasks::gemm {

// Rows of A that one expert multiplies, and where their results go in C.
struct GemmRowBlock {
  std::uint32_t expert = 0;
  std::uint32_t a_row0 = 0;
  std::uint32_t c_row0 = 0;
  std::uint32_t rows = 0;
};

inline constexpr std::uint32_t kRasterGroupM = 16;  // row tiles swept together (L2 reuse)

// Payloads of the tiles of `block`: ceil(rows / block_m) row tiles x n tiles x splits, in grouped
// raster order (groups of `group_m` row tiles; within a group n outer, rows inner; the splits of a
// tile adjacent), so the tiles running at once share A and B panels in L2; with a single row
// tile, B is read once and its loads are evict_first (L2Hint). Split tiles take
// workspace slots from `next_slot` on. run > 1 (no split-K): each task takes a run of up to `run`
// consecutive n tiles of its row tile.
template <class Task = GemmTile>
std::vector<typename Task::Payload> gemm_tile_payloads(
    GemmOperands const& op, GemmOperands const* device_op, GemmRowBlock const& block,
    std::uint32_t& next_slot, std::uint32_t group_m = kRasterGroupM, std::uint32_t run = 1) {
  GemmConfig const& cfg = op.config;
  std::uint32_t const m_tiles = (block.rows + cfg.block_m - 1) / cfg.block_m;
  std::vector<typename Task::Payload> out;
  out.reserve(std::size_t{m_tiles} * op.n_tiles() * cfg.splits);
  if (group_m == 0) group_m = 1;
  if (run == 0) run = 1;
  // With one row tile, each tile's columns of B are read by that tile alone.
  L2Hint const b_l2 = m_tiles == 1 ? L2Hint::evict_first : L2Hint::normal;
  for (std::uint32_t g0 = 0; g0 < m_tiles; g0 += group_m) {
    std::uint32_t const g1 = std::min(m_tiles, g0 + group_m);
    for (std::uint32_t nt = 0; nt < op.n_tiles(); nt += run) {
      for (std::uint32_t mt = g0; mt < g1; ++mt) {
        GemmTileCoord c;
        c.expert = block.expert;
        c.a_row0 = block.a_row0 + mt * cfg.block_m;
        c.c_row0 = block.c_row0 + mt * cfg.block_m;
        c.rows = std::min<std::uint32_t>(cfg.block_m, block.rows - mt * cfg.block_m);
        c.n_tile = nt;
        c.count = std::min(run, op.n_tiles() - nt);
        c.slot = cfg.splits > 1 ? next_slot++ : 0;
        c.b_l2 = b_l2;
        for (std::uint32_t s = 0; s < cfg.splits; ++s) {
          c.split = s;
          out.push_back(Task::payload(op, device_op, c));
        }
      }
    }
  }
  return out;
}

}  // namespace loom::tasks::gemm
