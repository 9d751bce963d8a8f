// The way back of expert parallelism: the down-projection tile puts each finished row straight
// into its source rank's y[slot][token] (the GEMM sink), then counts one arrival per (row,
// N-tile) on the source's counter of the row's combine group. The source's subscriber emits the
// group's combines when the counter is complete (moe/ep_receive.hpp).
#pragma once

#include "moe/ep_view.hpp"
#include "moe/expert_tasks.hpp"

namespace loom::moe {

// Where a pool row's results go on its source rank, as a pointer into this rank's own window
// (SymmetricView::peer maps it to the source's).
LOOM_HD inline bf16* source_slot_row(EpView const& ep, std::uint32_t row) {
  return slot_row(ep.local, row);  // y is a symmetric region: the same offset on every rank
}

// GEMM sink: each staged row to y[slot][token] of the rank the row came from. Tag: the EpView.
struct RemoteSlotSink {
  static void deliver_host(tasks::gemm::StagedTile const& t, tasks::gemm::GemmOperands const&,
                           TaskContext& ctx) {
    EpView const& ep = *reinterpret_cast<EpView const*>(t.tag);
    for (std::uint32_t r = 0; r < t.rows; ++r) {
      std::uint32_t const row = t.c_row0 + r;
      ctx.heap().put_serial(ep.row_rank[row], source_slot_row(ep, row) + t.c_col0,
                            t.data + std::size_t{r} * t.row_stride,
                            std::size_t{t.cols} * t.elem_bytes);
    }
  }
#if defined(__CUDACC__)
  __device__ static void deliver(tasks::gemm::StagedTile const& t, tasks::gemm::GemmOperands const&,
                                 TaskContext& ctx, unsigned thread) {
    EpView const& ep = *reinterpret_cast<EpView const*>(t.tag);
    tasks::gemm::scatter_rows(t, thread, [&](std::uint32_t r) {
      std::uint32_t const row = t.c_row0 + r;
      return reinterpret_cast<unsigned char*>(
          ctx.heap().peer(ep.row_rank[row], source_slot_row(ep, row) + t.c_col0));
    });
  }
#endif
};

using RemoteDownGemm = tasks::GemmTileTask<RemoteSlotSink, false, false>;

struct ExpertDownRemote {
  static constexpr char const* name = "ep_down";
  static constexpr unsigned threads = RemoteDownGemm::threads;
  static constexpr unsigned shared_bytes = RemoteDownGemm::shared_bytes;
  using Payload = TilePayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    return RemoteDownGemm::describe_failure(code, a, b);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *reinterpret_cast<EpView const*>(p.view);
    auto const tag = reinterpret_cast<std::uint64_t>(&ep);
    RemoteDownGemm::host(gemm_tile<RemoteDownGemm>(p, p.ops, tag), ctx);
    if (ctx.failed()) return;
    // One arrival per row, aggregated over runs of rows bound for the same (rank, group).
    std::uint32_t r = 0;
    while (r < p.rows) {
      std::uint32_t const source = ep.row_rank[p.row0 + r], group = ep.row_group[p.row0 + r];
      std::uint32_t n = 0;
      while (r < p.rows && ep.row_rank[p.row0 + r] == source && ep.row_group[p.row0 + r] == group)
        ++r, ++n;
      fetch_add_acq_rel<std::uint32_t, cuda::thread_scope_system>(
          *ctx.heap().peer(source, &ep.group_done[group]), n);
    }
  }
#if defined(__CUDACC__)
  // After a block barrier (every thread's puts happen before it), one thread per row arrives
  // with a system-scope release add, which makes the whole tile's puts visible with it; threads
  // of a warp bound for the same (rank, group) add together through their lowest lane.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *reinterpret_cast<EpView const*>(p.view);
    auto const tag = reinterpret_cast<std::uint64_t>(&ep);
    RemoteDownGemm::device(gemm_tile<RemoteDownGemm>(p, p.ops, tag), ctx);
    __syncthreads();
    unsigned const rows_mask = __ballot_sync(0xFFFFFFFFu, threadIdx.x < p.rows);
    if (threadIdx.x < p.rows) {
      std::uint32_t const row = p.row0 + threadIdx.x;
      std::uint32_t const source = ep.row_rank[row], group = ep.row_group[row];
      unsigned const same = __match_any_sync(rows_mask, (source << 24) | group);
      if ((threadIdx.x % 32) == static_cast<unsigned>(__ffs(same) - 1))
        fetch_add_release<std::uint32_t, cuda::thread_scope_system>(
            *ctx.heap().peer(source, &ep.group_done[group]),
            static_cast<std::uint32_t>(__popc(same)));
    }
  }
#endif
};

}  // namespace loom::moe
