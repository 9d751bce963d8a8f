// Host: picks a GEMM's tile configuration from its shape and the device, by a small cost model in
// plain arithmetic (every constant below is a measured, datasheet or fitted figure, named and
// commented; docs/gemm.md has the measurements).
//
// For each candidate tile (128x256, 128x128, 64x256, 128x64, 64x128, and 128x224 where the caller
// runs it on the wide task types: GemmDeviceModel::wide_tile) and split-K factor:
//   k-block time = max(MMA time, time to fill the stage from L2)        one SM, one 64-deep K block
//                  (64-column warpgroup tiles at a lower MMA rate; the fill at one SM's rate or
//                  at its share of the whole L2's, whichever is slower)
//   task time    = max(k blocks x k-block time, B bytes / one SM's HBM stream rate) + overhead
//                  (+ writing and re-reading fp32 partial tiles when split)
//   raw          = ceil(tasks / processors) x task time                 waves of tasks
//   score        = max(raw, HBM floor) + 0.1 raw (+ the split-K tail when split)
// HBM floor = (A + B + C bytes) / HBM bandwidth: no tiling beats it, so among configurations under
// it the lower raw time (more SMs streaming, fewer waves) wins the tie. Small-M problems thus get
// narrow N tiles instead of leaving most SMs idle; large ones get 128x256 tiles. Split-K pays a
// tail no streaming hides (the last split waits for the others' partials and sums them), so it is
// chosen only where the unsplit tiles would leave more than 40% of the processors idle and it saves
// more than that tail, never for the 128x224 tile and never in more than two for the 128x256 tile.
// The whole-L2 rate, the partials' rate and the 40% were fitted to a sweep of 16 shapes on an H200
// (docs/gemm.md, "The heuristic's L2 ceiling"); the other figures are measured or datasheet ones.
// The pipeline depth is the most stages of the chosen tile that fit the 208 KB stage area.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "tasks/gemm/config.hpp"

namespace loom::tasks::gemm {

struct GemmShape {
  std::uint32_t m = 0;  // rows of A the GEMM covers (all its tiles)
  std::uint32_t n = 0;  // columns of B (before a swiglu halving)
  std::uint32_t k = 0;
  std::uint32_t out_bytes = 2;
};

struct GemmDeviceModel {
  std::uint32_t processors = 131;         // persistent-kernel processor blocks (SMs - 1)
  double mma_flops_per_us = 6.0e6;        // one SM, bf16 dense: ~800 TFLOP/s / 132 (H100, H200)
  double l2_bytes_per_us = 1.0e5;         // one SM filling shared memory from L2: ~100 GB/s
  double l2_total_bytes_per_us = 1.05e7;  // all SMs filling together: ~10 TB/s (fitted)
  double partial_bytes_per_us = 6.7e4;    // one SM writing and re-reading fp32 partials (fitted)
  // Split K only where the unsplit tiles occupy fewer processors than this share (fitted).
  double split_below_occupancy = 0.6;
  double hbm_bytes_per_us = 3.0e6;        // the whole GPU: 3.0 TB/s (H100 D2D copy; H200 ~4.3)
  double sm_stream_bytes_per_us = 5.0e4;  // one SM streaming from HBM: ~50 GB/s
  double task_overhead_us = 2.0;          // pipeline fill + epilogue per task (dispatch excluded)
  // The split-K tail: a split tile ends when its last split has added the others' partials into
  // its registers, after the other splits' tasks. Since the partials are summed in registers,
  // split tilings run 11-23% faster (H200; docs/gemm.md, "Split-K summed in registers"), and with
  // 1 µs the model picks the fastest measured tiling of every benchmarked skinny shape but
  // 512 x 2048² (1 µs behind).
  double split_tail_us = 1.0;
  // A warpgroup's 64-column wgmma (tiles 128x64 and 64x128) against the wider ones: it reads as
  // many A bytes from shared memory for half the products. The fused MLP's second layer
  // (1024 x 1024, K = 4096) ran 12% slower on 128x64 tiles than on 128x128 split in two.
  double narrow_mma_efficiency = 0.6;
  std::uint32_t max_block_n = 256;  // widest tile to consider (224 and 256 need setmaxnreg)
  // Also consider the 128x224 tile: set by a caller that runs that choice on the wide task types
  // (GemmWideTile, GemmWideRunTile), which take no other tile.
  bool wide_tile = false;
};

inline GemmConfig choose_gemm_config(GemmShape const& s, GemmDeviceModel const& dev = {},
                                     MmaPath path = MmaPath::wgmma) {
  struct Tile {
    std::uint16_t m, n;
  };
  constexpr Tile kTiles[] = {{128, 256}, {128, 224}, {128, 128}, {64, 256}, {128, 64}, {64, 128}};
  std::uint32_t const k_blocks = (s.k + kBlockK - 1) / kBlockK;
  double const floor_us =
      (2.0 * (double(s.m) * s.k + double(s.n) * s.k) + double(s.m) * s.n * s.out_bytes) /
      dev.hbm_bytes_per_us;
  GemmConfig best{};
  double best_score = INFINITY;
  for (Tile const t : kTiles) {
    if (t.n > dev.max_block_n || (t.n == 224 && !dev.wide_tile)) continue;
    double const m_tiles = std::ceil(double(s.m) / t.m), n_tiles = std::ceil(double(s.n) / t.n);
    double const rows_computed = t.m == 128 && s.m <= 64 ? 64.0 : t.m;  // idle warpgroup skips
    double const warp_n = t.m == 64 ? t.n / 2.0 : t.n;                  // GemmConfig::warp_n
    double const mma_rate = dev.mma_flops_per_us * (warp_n == 64 ? dev.narrow_mma_efficiency : 1.0);
    double const mma_us = 2.0 * rows_computed * t.n * kBlockK / mma_rate;
    double const stage_bytes = double(t.m + t.n) * kRowBytes;
    for (std::uint32_t splits = 1; splits <= kMaxSplits && splits <= k_blocks; ++splits) {
      if (splits > 1 && m_tiles * n_tiles >= dev.split_below_occupancy * dev.processors) break;
      // The 128x224 tile serves compute-bound shapes unsplit (32 N-tiles of N = 7168 per M-tile):
      // split in two it ran 1.5 µs behind unsplit 128x128 tiles at 256 x 7168² on an H200, where
      // the model put it ahead. More than two splits of the 128x256 tile: its last split adds the
      // others one vector at a time, a round trip to L2 each (impl::add_partials). The model never
      // picks either.
      if (t.m == 128 && t.n == 224 && splits > 1) break;
      if (t.m == 128 && t.n == 256 && splits > 2) break;
      std::uint32_t const per = split_k_blocks_per(k_blocks, splits);
      if ((splits - 1) * per >= k_blocks) continue;  // the last split would be empty
      double const tasks = m_tiles * n_tiles * splits;
      double const active = tasks < dev.processors ? tasks : double(dev.processors);
      double const fill_us = std::max(stage_bytes / dev.l2_bytes_per_us,
                                      active * stage_bytes / dev.l2_total_bytes_per_us);
      double const k_block_us = mma_us > fill_us ? mma_us : fill_us;
      double const stream_us = double(t.n) * per * kRowBytes / dev.sm_stream_bytes_per_us;
      double task_us =
          (per * k_block_us > stream_us ? per * k_block_us : stream_us) + dev.task_overhead_us;
      if (splits > 1) task_us += (1.0 + splits) * t.m * t.n * 4.0 / dev.partial_bytes_per_us;
      double const raw = std::ceil(tasks / dev.processors) * task_us;
      double const score =
          (raw > floor_us ? raw : floor_us) + 0.1 * raw + (splits > 1 ? dev.split_tail_us : 0.0);
      if (score < best_score) {
        best_score = score;
        best.block_m = t.m;
        best.block_n = t.n;
        best.splits = static_cast<std::uint8_t>(splits);
      }
    }
  }
  best.path = path;
  best.stages = static_cast<std::uint8_t>(best.max_stages());
  return best;
}

// N-tiles per task for a whole GEMM built of run tasks (GemmRunTile, add_gemm_tiles' `run`): of
// runs of 4, 2 and 1, the one whose tasks finish in the fewest tile times,
//   ceil(m_tiles x ceil(n_tiles / run) / processors) x run,
// the longest among equals (a run overlaps each tile's epilogue with the next tile's loads and
// saves a dispatch per tile). 1 with split-K.
inline std::uint32_t choose_gemm_run(GemmConfig const& cfg, std::uint32_t m, std::uint32_t n,
                                     GemmDeviceModel const& dev = {}) {
  if (cfg.splits > 1 || m == 0 || n == 0) return 1;
  std::uint64_t const m_tiles = (m + cfg.block_m - 1) / cfg.block_m;
  std::uint64_t const n_tiles = (n + cfg.block_n - 1) / cfg.block_n;
  std::uint32_t best = 1;
  std::uint64_t best_time = ~std::uint64_t{0};
  for (std::uint32_t run : {4u, 2u, 1u}) {
    if (run > n_tiles) continue;
    std::uint64_t const tasks = m_tiles * ((n_tiles + run - 1) / run);
    std::uint64_t const time = (tasks + dev.processors - 1) / dev.processors * run;
    if (time < best_time) best_time = time, best = run;
  }
  return best;
}

}  // namespace loom::tasks::gemm
