// The plan task of the one-GPU layer: after every route task, this call's offsets and M-tiles
// per expert, the gathers of its call blocks, and the part of the dynamic bound it will not use.
// Where the route tasks gather (MoEView::route_gathers), the last of them writes the same plan
// (write_plan) and the graph has no plan task (moe/route_gather.hpp).
#pragma once

#include "moe/view.hpp"
#include "runtime/context.hpp"

#if defined(__CUDACC__)
#include <cub/warp/warp_scan.cuh>
#endif

namespace loom::moe {

// Plan: offsets and M-tiles per expert from this call's counts; lowers the counters route and
// gather raise; emits the gathers of this call's blocks and gives back the part of the
// dynamic bound this call will not use. A call of few tokens on a layer that has short M-tiles
// (MoEView::short_view) runs on that view from here on: the plan counts its tiles and emits its
// gathers with it. (As static successors of the plan, the gathers of every
// block up to max_tokens went out through the scheduler's fan-out, one gate each: the first
// started 13-16 µs after the plan ended.)
struct PlanExperts {
  static constexpr char const* name = "moe_plan";
  static constexpr unsigned threads = 32;  // the scan's warp; the other loops take any block
  // Device: the counts, then the scan's temporary storage.
  static constexpr unsigned kScanBytes = 16;
  static constexpr unsigned shared_bytes = kMaxExperts * sizeof(std::uint32_t) + kScanBytes;
  struct Payload {
    MoEView const* view;
  };

  // The view this call's expert tiles use.
  LOOM_HD static MoEView const& tiles_view(MoEView const& v) {
    return v.short_view && v.call[0] <= v.short_tokens ? *v.short_view : v;
  }

  static void plan(MoEView const& main, TaskContext& ctx) {
    MoEView const& v = tiles_view(main);
    retire_unused(v, write_plan(v), ctx);
    ctx.emit_many(call_blocks(v), [&](std::uint32_t b) { return gather(v.gather_type, &v, b); });
  }

  // The call's offsets, M-tiles and token counts per expert from its counts, which it lowers
  // with the pool's fill; returns the call's M-tiles. Host.
  static std::uint32_t write_plan(MoEView const& v) {
    std::uint32_t rows = 0, tiles = 0;
    for (std::uint32_t e = 0; e < v.experts; ++e) {
      std::uint32_t const c = load_relaxed(v.counts[e]);
      v.expert_tokens[e] = c;
      v.offsets[e] = rows;
      v.tile_base[e] = tiles;
      rows += c;
      tiles += (c + v.tile_rows - 1) / v.tile_rows;
      v.counts[e] = 0;
      v.fill[e] = 0;
    }
    v.offsets[v.experts] = rows;
    v.tile_base[v.experts] = tiles;
    return tiles;
  }

  // The GEMM tasks the dynamic bound counts and this call does not emit (M-tiles it does not
  // have; up tasks a view of longer runs leaves out); the combines of the call blocks it does not
  // have, and their gathers where gathers are tasks.
  LOOM_HD static void retire_unused(MoEView const& v, std::uint32_t tiles, TaskContext& ctx) {
    ctx.retire(v.max_mtiles * (v.up_tasks_bound + v.down_tiles) -
               tiles * (v.up_tasks + v.down_tiles) +
               block_tasks(v) * (v.max_call_blocks - call_blocks(v)));
  }
  // Dynamic tasks per call block: its combine, and its gather unless the route tasks gather.
  LOOM_HD static std::uint32_t block_tasks(MoEView const& v) { return v.route_gathers ? 1 : 2; }
  LOOM_HD static Task gather(std::uint16_t type, MoEView const* v, std::uint32_t block) {
    return encode_task(type, BlockPayload{v, block});
  }

  static void host(Payload const& p, TaskContext& ctx) { plan(*p.view, ctx); }
#if defined(__CUDACC__)
  // An expert's rows and M-tiles, or the sums of several: what the block's scan adds up.
  struct RowsAndTiles {
    std::uint32_t rows, tiles;
  };
  struct AddRowsAndTiles {
    __device__ RowsAndTiles operator()(RowsAndTiles a, RowsAndTiles b) const {
      return {a.rows + b.rows, a.tiles + b.tiles};
    }
  };
  // One warp scans: every thread of the processor's block (the pipeline's widest type's count)
  // runs the body, and a block-wide scan is sized for one block size.
  using Scan = cub::WarpScan<RowsAndTiles>;
  static_assert(sizeof(typename Scan::TempStorage) <= kScanBytes);

  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = tiles_view(*p.view);
    std::uint32_t const tiles = write_plan_device(v, ctx.shared_memory());
    std::uint32_t const blocks = call_blocks(v);
    if (threadIdx.x == 0) retire_unused(v, tiles, ctx);
    // The type and the view in registers: read through v, each descriptor would wait for a
    // reload after the previous one's stores.
    std::uint16_t const type = v.gather_type;
    MoEView const* const view = &v;
    ctx.emit_many_by_block(blocks, [&](std::uint32_t b) { return gather(type, view, b); });
  }

  // write_plan by the whole block, with the counts read at once and the offsets summed by a
  // scan over warp 0, each lane taking a run of consecutive experts (one thread's loop over the
  // experts took 4.7 us for 64 of them, at the head of every call). `shared`: shared_bytes of
  // the block's shared memory. The M-tiles are returned to every thread; the plan's stores are
  // fenced before the block's barrier at the end.
  __device__ static std::uint32_t write_plan_device(MoEView const& v, void* shared) {
    auto* const count = static_cast<std::uint32_t*>(shared);  // [kMaxExperts]
    auto& scan = *reinterpret_cast<typename Scan::TempStorage*>(count + kMaxExperts);
    __shared__ std::uint32_t tiles;
    std::uint32_t const experts = v.experts, tile_rows = v.tile_rows;
    for (std::uint32_t e = threadIdx.x; e < experts; e += blockDim.x)
      count[e] = load_relaxed(v.counts[e]);
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l's run: experts [e0, e1). Its counts are read from shared memory twice, once to
      // sum and once to place, rather than kept in registers.
      std::uint32_t const per = (experts + 31) / 32, e0 = min(threadIdx.x * per, experts),
                          e1 = min(e0 + per, experts);
      auto rows_and_tiles = [&](std::uint32_t e) {
        return RowsAndTiles{count[e], (count[e] + tile_rows - 1) / tile_rows};
      };
      RowsAndTiles sum{0, 0};
      for (std::uint32_t e = e0; e < e1; ++e) sum = AddRowsAndTiles{}(sum, rows_and_tiles(e));
      RowsAndTiles before, all;
      Scan(scan).ExclusiveScan(sum, before, RowsAndTiles{0, 0}, AddRowsAndTiles{}, all);
      std::uint32_t* const offsets = v.offsets;
      std::uint32_t* const tile_base = v.tile_base;
      for (std::uint32_t e = e0; e < e1; ++e) {
        offsets[e] = before.rows;
        tile_base[e] = before.tiles;
        before = AddRowsAndTiles{}(before, rows_and_tiles(e));
      }
      if (threadIdx.x == 0) {
        offsets[experts] = all.rows;
        tile_base[experts] = all.tiles;
        tiles = all.tiles;
      }
    }
    std::uint32_t* const expert_tokens = v.expert_tokens;
    std::uint32_t* const counts = v.counts;
    std::uint32_t* const fill = v.fill;
    for (std::uint32_t e = threadIdx.x; e < v.experts; e += blockDim.x) {
      expert_tokens[e] = count[e];
      counts[e] = 0;
      fill[e] = 0;
    }
    __threadfence();  // before the gathers that read the offsets and claim from fill start
    __syncthreads();
    return tiles;
  }
#endif
};

}  // namespace loom::moe
