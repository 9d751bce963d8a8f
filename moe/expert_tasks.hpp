// The expert GEMM tiles, as tasks/gemm_tile.hpp tiles plus the MoE bookkeeping after them.
// Up: h = act(x_e · W1_eᵀ) for one M-tile x N-tile, the activation applied per expert path in the
// GEMM's epilogue (SwiGLU pairs the gate and up columns a tile holds). Down: y = h · W2_eᵀ
// (fp32 accumulation, bf16 result), each row delivered to y[slot][token] of the token it came
// from (one writer per (slot, token)). The last up tile of an M-tile group emits the group's down
// tiles; the down tile that completes a token block emits that block's combine.
#pragma once

#include <type_traits>

#include "moe/expert_tile.hpp"
#include "tasks/gemm_tile.hpp"

namespace loom::moe {

// Where a down-projection row goes: y[slot][token] of pair `source` (token * k + slot), and of
// the pair pool row `row` came from.
LOOM_HD inline bf16* slot_row_of(MoEView const& v, std::uint32_t source) {
  std::uint32_t const t = source / v.top_k, j = source % v.top_k;
  return v.y + (std::size_t{j} * v.max_tokens + t) * v.hidden;
}
LOOM_HD inline bf16* slot_row(MoEView const& v, std::uint32_t row) {
  return slot_row_of(v, v.row_source[row]);
}

// The down GEMM's sink: rows go to their (slot, token) place instead of a dense C. The tile's tag
// is the MoEView.
struct SlotScatterSink {
  static void deliver_host(tasks::gemm::StagedTile const& t, tasks::gemm::GemmOperands const&,
                           TaskContext&) {
    MoEView const& v = *reinterpret_cast<MoEView const*>(t.tag);
    for (std::uint32_t r = 0; r < t.rows; ++r)
      std::memcpy(slot_row(v, t.c_row0 + r) + t.c_col0, t.data + std::size_t{r} * t.row_stride,
                  std::size_t{t.cols} * t.elem_bytes);
  }
#if defined(__CUDACC__)
  // row_source through L2: the gathers wrote it in this launch.
  __device__ static void deliver(tasks::gemm::StagedTile const& t, tasks::gemm::GemmOperands const&,
                                 TaskContext&, unsigned thread) {
    MoEView const& v = *reinterpret_cast<MoEView const*>(t.tag);
    tasks::gemm::scatter_rows(t, thread, [&](std::uint32_t r) {
      return reinterpret_cast<unsigned char*>(slot_row_of(v, __ldcg(v.row_source + t.c_row0 + r)) +
                                              t.c_col0);
    });
  }
#endif
};

// h's rows: LocalTileSink's stores, as a sink of its own so that an up run stages each finished
// tile in the stage area (GemmTileTask::kStoreBoxes is for LocalTileSink itself: its TMA store
// buffers do not fit beside the MoE kernel's static shared memory).
struct HRowsSink : tasks::gemm::LocalTileSink {};

// Tiles that never split K (the expert GEMMs' configurations have splits = 1): single up and
// down tiles, and runs of up tiles (ExpertUpRun).
using UpGemm = tasks::GemmTileTask<tasks::gemm::LocalTileSink, false, false>;
using UpRunGemm = tasks::GemmTileTask<HRowsSink, true, false>;
using DownGemm = tasks::GemmTileTask<SlotScatterSink, false, false>;

// The GEMM tile of an MoE tile: same rows in A and C (pool row = h row), no split-K.
template <class Gemm>
LOOM_HD inline typename Gemm::Payload gemm_tile(TilePayload const& p,
                                                tasks::gemm::GemmOperands const* ops,
                                                std::uint64_t tag) {
  typename Gemm::Payload g{};
  g.ops = ops;
  g.sink_tag = tag;
  g.expert = p.expert;
  g.a_row0 = p.row0;
  g.c_row0 = p.row0;
  g.n_tile = p.ntile;
  g.count = p.count;
  g.slot = 0;
  g.rows = p.rows;
  g.split = 0;
  g.b_l2 = p.b_l2;
  return g;
}

// The up projection: single tiles (ExpertUp), or runs of MoEView::up_run N-tiles of an M-tile
// (ExpertUpRun), which a view of 64-row tiles takes (expert_gemms.hpp, kShortUpRun): there a
// tile is short, and a run streams its tiles' K blocks without a break, the next tile's first
// stages loading while the previous one is finished. Two task types, so that the single tiles of
// the taller views compile none of the run code.
template <bool kRuns>
struct ExpertUpTask {
  using Gemm = std::conditional_t<kRuns, UpRunGemm, UpGemm>;
  static constexpr char const* name = kRuns ? "moe_up_run" : "moe_up";
  static constexpr unsigned threads = Gemm::threads;
  static constexpr unsigned shared_bytes = Gemm::shared_bytes;
  using Payload = TilePayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    return Gemm::describe_failure(code, a, b);
  }

  // The last up task of an M-tile group to finish: resets the group's counter (of N-tiles) and
  // returns the group's first local M-tile. The counter and the count come from the payload, so
  // the other tasks make one round trip to memory here.
  LOOM_HD static bool completes_group(Payload const& p, std::uint32_t& first) {
    MoEView const& v = *p.view;
    std::uint32_t const slot = p.mtile - p.group_m;
    if (fetch_add_acq_rel(v.up_done[slot], std::uint32_t{p.count}) + p.count !=
        std::uint32_t{p.group_mtiles} * v.up_tiles)
      return false;
    store_relaxed(v.up_done[slot], 0u);
    first = slot - v.tile_base[p.expert];
    return true;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    Gemm::host(gemm_tile<Gemm>(p, p.ops, 0), ctx);
    std::uint32_t first;
    if (completes_group(p, first))
      emit_group_tiles(ctx, p.view->down_type, *p.view, down_tile_ops(*p.view),
                       mtile_group_of(*p.view, p.expert, first), p.view->down_tiles);
  }
#if defined(__CUDACC__)
  // Thread 0 arrives for the tile; the group it completes goes out from the whole block. Always
  // inlined, as is ExpertDown's: a body left as a call holds wgmma of its own, and ptxas then
  // serializes every wgmma of the kernel (C7510; scripts/sass_check.py fails such a build).
  __device__ LOOM_INLINE static void device(Payload const& p, TaskContext& ctx) {
    Gemm::device(gemm_tile<Gemm>(p, p.ops, 0), ctx);
    __shared__ std::uint32_t done, start;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      std::uint32_t first;
      done = completes_group(p, first) ? std::uint32_t{p.expert} << 16 | first : kNoGroup;
    }
    __syncthreads();
    emit_groups_by_block<down_tile_ops>(ctx, p.view->down_type, *p.view, p.view->down_tiles, &done,
                                        &start, 1);
  }
#endif
};

using ExpertUp = ExpertUpTask<false>;
using ExpertUpRun = ExpertUpTask<true>;

struct ExpertDown {
  static constexpr char const* name = "moe_down";
  static constexpr unsigned threads = DownGemm::threads;
  static constexpr unsigned shared_bytes = DownGemm::shared_bytes;
  using Payload = TilePayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    return DownGemm::describe_failure(code, a, b);
  }

  // One arrival per (row, N-tile) on the row's call block, aggregated over runs of rows from the
  // same block; the arrival that completes a block emits its combine.
  LOOM_HD static void finish(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const pairs_per_block = v.top_k * call_block(v);
    std::uint32_t r = 0;
    while (r < p.rows) {
      std::uint32_t const block = v.row_source[p.row0 + r] / pairs_per_block;
      std::uint32_t n = 0;
      while (r < p.rows && v.row_source[p.row0 + r] / pairs_per_block == block) ++r, ++n;
      std::uint32_t const want = v.block_pairs[block] * v.down_tiles;
      if (fetch_add_acq_rel(v.block_done[block], n) + n != want) continue;
      store_relaxed(v.block_done[block], 0u);
      ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
    }
  }

  static void host(Payload const& p, TaskContext& ctx) {
    auto const tag = reinterpret_cast<std::uint64_t>(p.view);
    DownGemm::host(gemm_tile<DownGemm>(p, p.ops, tag), ctx);
    finish(p, ctx);
  }
#if defined(__CUDACC__)
  // The rows of an expert tile come from tokens all over the batch, so their arrivals go out in
  // parallel, one thread per row (after the block's writes are made visible).
  __device__ LOOM_INLINE static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    auto const tag = reinterpret_cast<std::uint64_t>(p.view);
    DownGemm::device(gemm_tile<DownGemm>(p, p.ops, tag), ctx);
    __syncthreads();
    if (threadIdx.x < p.rows) {
      // The fence releases the block's rows; the block's pair count and the arrival then go
      // out together (an acq_rel arrival would wait for the count's load first), and the last
      // arriver acquires the others' rows with its own fence.
      __threadfence();
      std::uint32_t const block = v.row_source[p.row0 + threadIdx.x] / (v.top_k * call_block(v));
      std::uint32_t const want = v.block_pairs[block] * v.down_tiles;
      if (fetch_add_relaxed(v.block_done[block], 1u) + 1 == want) {
        __threadfence();
        store_relaxed(v.block_done[block], 0u);
        ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
      }
    }
  }
#endif
};

}  // namespace loom::moe
