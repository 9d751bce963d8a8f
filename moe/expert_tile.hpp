// The M-tile of an expert GEMM: which rows of the expert's pool it covers, and the payload of
// the up- and down-projection tasks over it.
#pragma once

#include "moe/row_fanout.hpp"
#include "moe/view.hpp"
#include "runtime/context.hpp"

namespace loom::moe {

struct TilePayload {
  MoEView const* view;
  std::uint32_t row0;   // first pool row
  std::uint32_t mtile;  // global M-tile index (arrival counters)
  std::uint16_t rows;   // valid rows, 1 .. tile_rows
  std::uint16_t expert;
  std::uint16_t ntile;  // the first of the task's N-tiles
  std::uint16_t count;  // N-tiles ntile .. ntile + count - 1 (a run; 1 for down tiles)
  // The tile's M-tile group (MTileGroup): this M-tile's place in it and its M-tile count, so
  // that the group's counter (at mtile - group_m) is found without reading the plan's tables.
  std::uint16_t group_m, group_mtiles;
  // The GEMM operands the tile runs on (TileOps::of), chosen when it is emitted, so that the
  // tile's start does not wait for a read of the view.
  tasks::gemm::GemmOperands const* ops;
  // evict_first for the tiles of an expert's only M-tile (MTileGroup::sole): no other tile of
  // the call reads its weight tiles.
  tasks::gemm::L2Hint b_l2 = tasks::gemm::L2Hint::normal;
};

// The GEMM operands of one projection's tiles: the view's, and on a layer with a short view
// (MoEView::short_view) the short view's for an expert's last M-tile of at most short_rows rows:
// the same rows of the same buffers, half the tile height, so half the tensor-core work.
struct TileOps {
  tasks::gemm::GemmOperands const* tall;
  tasks::gemm::GemmOperands const* short_ops;  // null: one height
  std::uint32_t short_rows;
  std::uint32_t run, ntiles;  // N-tiles per task (the last may hold fewer), and in all
  LOOM_HD tasks::gemm::GemmOperands const* of(std::uint32_t rows) const {
    return short_ops && rows <= short_rows ? short_ops : tall;
  }
};
LOOM_HD inline TileOps up_tile_ops(MoEView const& v) {
  return {v.up_ops, v.short_view ? v.short_view->up_ops : nullptr, v.short_rows, v.up_run,
          v.up_tiles};
}
LOOM_HD inline TileOps down_tile_ops(MoEView const& v) {
  return {v.down_ops, v.short_view ? v.short_view->down_ops : nullptr, v.short_rows, 1,
          v.down_tiles};
}

// A group of an expert's M-tiles (MoEView::mtile_group): its first M-tile, how many, the rows
// they hold and the first of them in the pool. `slot` (the group's first global M-tile) indexes
// its arrival counters. `sole`: the expert's only M-tile in the call.
struct MTileGroup {
  std::uint32_t expert, first, mtiles, rows, row0, slot;
  bool sole;
};
// From the plan's offsets and tile_base (the view's, or copies of them).
LOOM_HD inline MTileGroup mtile_group_of(MoEView const& v, std::uint32_t const* offsets,
                                         std::uint32_t const* tile_base, std::uint32_t e,
                                         std::uint32_t local_tile) {
  std::uint32_t const count = offsets[e + 1] - offsets[e];
  std::uint32_t const first = local_tile / v.mtile_group * v.mtile_group;
  std::uint32_t const left = count - first * v.tile_rows, most = v.mtile_group * v.tile_rows;
  std::uint32_t const rows = left < most ? left : most;
  return {e,
          first,
          (rows + v.tile_rows - 1) / v.tile_rows,
          rows,
          offsets[e] + first * v.tile_rows,
          tile_base[e] + first,
          count <= v.tile_rows};
}
LOOM_HD inline MTileGroup mtile_group_of(MoEView const& v, std::uint32_t e,
                                         std::uint32_t local_tile) {
  return mtile_group_of(v, v.offsets, v.tile_base, e, local_tile);
}

// Task i of `type` over a group's tiles, one per (run of ops.run N-tiles, M-tile) in N-tile-major
// order: the group's M-tiles of one run go out next to each other.
LOOM_HD inline Task group_tile(std::uint16_t type, MoEView const& v, TileOps const& ops,
                               MTileGroup const& g, std::uint32_t i) {
  std::uint32_t const n = i / g.mtiles, m = i - n * g.mtiles;
  std::uint32_t const left = g.rows - m * v.tile_rows;
  std::uint32_t const rows = left < v.tile_rows ? left : v.tile_rows;
  std::uint32_t const ntile = n * ops.run, after = ops.ntiles - ntile;
  return encode_task(
      type,
      TilePayload{&v, g.row0 + m * v.tile_rows, g.slot + m, static_cast<std::uint16_t>(rows),
                  static_cast<std::uint16_t>(g.expert), static_cast<std::uint16_t>(ntile),
                  static_cast<std::uint16_t>(after < ops.run ? after : ops.run),
                  static_cast<std::uint16_t>(m), static_cast<std::uint16_t>(g.mtiles), ops.of(rows),
                  g.sole ? tasks::gemm::L2Hint::evict_first : tasks::gemm::L2Hint::normal});
}
// Up task k of the call's up_tasks per M-tile, in the order the M-tile groups' emissions list
// them: the group that holds global M-tile k / up_tasks covers tasks [slot, slot + mtiles) x
// up_tasks, N-tile-major (group_tile). offsets and tile_base: the plan's (or copies of them).
LOOM_HD inline Task up_task_at(MoEView const& v, TileOps const& ops, std::uint32_t const* offsets,
                               std::uint32_t const* tile_base, std::uint32_t k) {
  std::uint32_t const mtile = k / v.up_tasks;
  // The expert whose M-tiles start at or before it, the last of those (an expert without rows
  // shares its base with the next).
  std::uint32_t const e = run_of(tile_base, v.experts, mtile);
  MTileGroup const g = mtile_group_of(v, offsets, tile_base, e, mtile - tile_base[e]);
  return group_tile(v.up_type, v, ops, g, k - g.slot * v.up_tasks);
}

// Emits the group's tasks of `type` (`tasks` per M-tile), on `ops` (one thread); with keep_first
// the first for this processor to run next (TaskContext::emit_many).
LOOM_HD inline bool emit_group_tiles(TaskContext& ctx, std::uint16_t type, MoEView const& v,
                                     TileOps const& ops, MTileGroup const& g, std::uint32_t tasks,
                                     bool keep_first = false) {
  return ctx.emit_many(
      g.mtiles * tasks, [&](std::uint32_t i) { return group_tile(type, v, ops, g, i); },
      keep_first);
}

#if defined(__CUDACC__)
// The tiles of the M-tile groups a task completed, emitted by the whole block under one
// reservation (TaskContext::emit_many_by_block). done[i] for i < n is a completed group's
// (expert << 16 | first local M-tile), or kNoGroup; warp 0 compacts the list in place into
// done[] and starts[] (the group's first task among all of them), which may alias no other
// words the block still reads. The tiles run on OpsOf(v) (up_tile_ops or down_tile_ops), read
// only when some group completed: most calls emit nothing. keep_first: TaskContext::emit_many's.
inline constexpr std::uint32_t kNoGroup = ~0u;
template <TileOps (*OpsOf)(MoEView const&)>
__device__ inline void emit_groups_by_block(TaskContext& ctx, std::uint16_t type, MoEView const& v,
                                            std::uint32_t ntiles, std::uint32_t* done,
                                            std::uint32_t* starts, std::uint32_t n,
                                            bool keep_first = false) {
  __shared__ std::uint32_t groups, tasks;
  if (threadIdx.x < 32) {
    std::uint32_t const lane = threadIdx.x;
    std::uint32_t count = 0, total = 0;
    for (std::uint32_t b = 0; b < n; b += 32) {
      std::uint32_t const key = b + lane < n ? done[b + lane] : kNoGroup;
      std::uint32_t t = 0;
      if (key != kNoGroup) t = mtile_group_of(v, key >> 16, key & 0xffffu).mtiles * ntiles;
      std::uint32_t incl = t;  // inclusive prefix sum of t over the lanes
      for (std::uint32_t o = 1; o < 32; o <<= 1) {
        std::uint32_t const y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += y;
      }
      unsigned const valid = __ballot_sync(0xFFFFFFFFu, key != kNoGroup);
      if (key != kNoGroup) {
        std::uint32_t const c = count + __popc(valid & ((1u << lane) - 1u));  // c <= b + lane
        done[c] = key;
        starts[c] = total + incl - t;
      }
      count += __popc(valid);
      total += __shfl_sync(0xFFFFFFFFu, incl, 31);
      __syncwarp();
    }
    if (lane == 0) groups = count, tasks = total;
  }
  __syncthreads();
  if (tasks == 0) return;  // the same word in every thread
  std::uint32_t const count = groups;
  TileOps const ops = OpsOf(v);
  ctx.emit_many_by_block(
      tasks,
      [&](std::uint32_t k) {
        std::uint32_t const g = run_of(starts, count, k);  // the group whose tiles k is among
        return group_tile(type, v, ops, mtile_group_of(v, done[g] >> 16, done[g] & 0xffffu),
                          k - starts[g]);
      },
      keep_first);
}
#endif

// Gather: copy each routed token row of a block into its expert's pool; the arrival that
// completes an M-tile group emits the group's up-projection tiles.
struct GatherTokens {
  static constexpr char const* name = "moe_gather";
  static constexpr std::uint32_t kCopyLoads = 16;  // device: 16-byte loads in flight per thread
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  using Payload = BlockPayload;

  // Claims the pool row of pair (t, j) routed to expert e. Only a distinct index is needed: the
  // plan's offsets and the zeroed fill came through the ready queue with this task, and the
  // arrival (arrive_on_group) releases the row once it is written.
  LOOM_HD static std::uint32_t claim(MoEView const& v, std::int32_t e, std::uint32_t& index) {
    index = fetch_add_relaxed(v.fill[e], 1u);
    return v.offsets[e] + index;
  }
  // The pool row of pair `pair` (token * top_k + slot) routed to expert e: where the route tasks
  // gather (MoEView::pair_ticket), its route task's ticket past the expert's offset (both written
  // in this launch, the offsets by another route task: read through L2), else claim's.
  LOOM_HD static std::uint32_t claim_pair(MoEView const& v, std::int32_t e, std::uint32_t pair,
                                          std::uint32_t& index) {
    if (!v.pair_ticket) return claim(v, e, index);
    index = written_elsewhere(v.pair_ticket[pair]);
    return written_elsewhere(v.offsets[e]) + index;
  }

  // After the row is written: one arrival on its M-tile group. The arrival that completes the
  // group resets its counter and returns it.
  LOOM_HD static bool arrive_on_group(MoEView const& v, std::int32_t e, std::uint32_t index,
                                      MTileGroup& g) {
    g = mtile_group_of(v, static_cast<std::uint32_t>(e), index / v.tile_rows);
    if (fetch_add_acq_rel(v.rows_arrived[g.slot], 1u) + 1 != g.rows) return false;
    store_relaxed(v.rows_arrived[g.slot], 0u);
    return true;
  }
  // Whether a gather task keeps the first up task a group it completes emits
  // (TaskContext::emit_many): where up tasks are runs of N-tiles (64-row M-tiles), long tasks a
  // gather's processor would otherwise wait for the scheduler to hand out. With single up tiles
  // keeping measured no gain (docs/performance.md, "A body keeps the first task"). Route tasks
  // that gather emit the up tasks otherwise (moe/route_gather.hpp).
  LOOM_HD static bool keeps_up_task(MoEView const& v) { return v.up_run > 1; }

  // The same, emitting the completed group's up-projection tiles (keep_first: the first for
  // this processor, TaskContext::emit_many).
  LOOM_HD static void arrive(MoEView const& v, std::int32_t e, std::uint32_t index,
                             TaskContext& ctx, bool keep_first = false) {
    MTileGroup g;
    if (arrive_on_group(v, e, index, g))
      emit_group_tiles(ctx, v.up_type, v, up_tile_ops(v), g, v.up_tasks, keep_first);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    gather_block_host(*p.view, p.block, ctx, true);
  }
  // Call block `block` (call_block), on view v (host). With arrive_on_groups, each row arrives on
  // its M-tile group and a completed group emits its up tasks, the first kept where keeps_up_task;
  // without (route tasks that gather, which emit the call's up tasks together), neither.
  static void gather_block_host(MoEView const& v, std::uint32_t block, TaskContext& ctx,
                                bool arrive_on_groups) {
    std::uint32_t const tokens = v.call[0], cb = call_block(v);
    for (std::uint32_t t = block * cb; t < tokens && t < (block + 1) * cb; ++t) {
      for (std::uint32_t j = 0; j < v.top_k; ++j) {
        std::int32_t const e = v.topk_ids[std::size_t{t} * v.top_k + j];
        if (e < 0) continue;
        std::uint32_t index;
        std::uint32_t const row = claim_pair(v, e, t * v.top_k + j, index);
        for (std::uint32_t c = 0; c < v.hidden; ++c)
          v.pool[std::size_t{row} * v.hidden + c] = v.x[std::size_t{t} * v.hidden + c];
        v.row_source[row] = t * v.top_k + j;
        if (arrive_on_groups) arrive(v, e, index, ctx, keeps_up_task(v));
      }
    }
  }

#if defined(__CUDACC__)
  // Thread i < pairs claims pair i's row; the block copies each token row to its pool rows
  // (fan_out_rows, kCopyLoads reads in flight per thread); then thread i arrives for pair i, and
  // the block emits the groups those arrivals completed, keeping the first up task to run next
  // where keeps_up_task (the gathers end together, and their processors would otherwise wait for
  // the scheduler to hand out the up tasks they emitted).
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    gather_block_device(*p.view, p.block, ctx, true);
  }
  // Call block `block`, on view v, arrive_on_groups as gather_block_host's. Whole block.
  __device__ static void gather_block_device(MoEView const& v, std::uint32_t block,
                                             TaskContext& ctx, bool arrive_on_groups) {
    std::uint32_t const tokens = v.call[0], cb = call_block(v);  // cb <= kMaxTokenBlock
    std::uint32_t const t0 = block * cb;
    if (t0 >= tokens) return;
    std::uint32_t const n_tokens = tokens - t0 < cb ? tokens - t0 : cb;
    std::uint32_t const pairs = n_tokens * v.top_k;  // <= 32 * 8 = 256
    __shared__ std::uint32_t row_of[kMaxTokenBlock * kMaxTopK], index_of[kMaxTokenBlock * kMaxTopK];
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      std::int32_t const e = v.topk_ids[std::size_t{t0} * v.top_k + i];
      row_of[i] = e < 0 ? ~0u : claim_pair(v, e, t0 * v.top_k + i, index_of[i]);
    }
    __syncthreads();
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x)
      if (row_of[i] != ~0u) v.row_source[row_of[i]] = t0 * v.top_k + i;
    // Each token row is read once and written to each of its experts' pool rows.
    std::uint32_t const row_chunks = v.hidden / 8;
    fan_out_rows<kCopyLoads>(reinterpret_cast<uint4 const*>(v.x + std::size_t{t0} * v.hidden),
                             reinterpret_cast<uint4*>(v.pool), n_tokens, row_chunks, row_of,
                             v.top_k);
    __syncthreads();
    if (!arrive_on_groups) return;
    // row_of[i] becomes the group pair i completed, if any (only thread i touches entry i). Each
    // arrival is a release: it covers the block's pool rows, ordered before it by the barrier
    // above.
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      if (row_of[i] == ~0u) continue;
      std::int32_t const e = v.topk_ids[std::size_t{t0} * v.top_k + i];
      MTileGroup g;
      row_of[i] = arrive_on_group(v, e, index_of[i], g) ? g.expert << 16 | g.first : kNoGroup;
    }
    __syncthreads();
    emit_groups_by_block<up_tile_ops>(ctx, v.up_type, v, v.up_tasks, row_of, index_of, pairs,
                                      keeps_up_task(v));
  }
#endif
};

// Combine: out[t] = sum over j of w[t, j] * y[j][t], in top-k order, accumulated in fp32 from the
// bf16 expert outputs; a token with no expert gets zeros.
struct CombineTokens {
  static constexpr char const* name = "moe_combine";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  // A call, not inlined into the kernel's switch (runtime/pipeline.hpp): inlined, the
  // expert-parallel kernel kept its sums in local memory (about a thousand spill stores in the
  // inner loop, and a combine twice as slow as the one-GPU kernel's).
  static constexpr bool call_body = true;
  using Payload = BlockPayload;

  LOOM_HD static float combine(MoEView const& v, std::uint32_t t, std::uint32_t c) {
    float acc = 0.0f;
    for (std::uint32_t j = 0; j < v.top_k; ++j) {
      if (v.topk_ids[std::size_t{t} * v.top_k + j] < 0) continue;
      acc += v.topk_weights[std::size_t{t} * v.top_k + j] *
             __bfloat162float(v.y[(std::size_t{j} * v.max_tokens + t) * v.hidden + c]);
    }
    return acc;
  }

  // The at most kMaxTokenBlock tokens one combine covers: list[0, n) where a list is given
  // (another actor wrote it: read through L2 on the device), else [first, first + n).
  struct Tokens {
    std::uint32_t const* list;
    std::uint32_t first, n;

    LOOM_HD std::uint32_t at(std::uint32_t i) const {
      return list == nullptr ? first + i : written_elsewhere(list[i]);
    }
  };
  LOOM_HD static Tokens block_tokens(Payload const& p) {
    MoEView const& v = *p.view;
    std::uint32_t const tokens = v.call[0], cb = call_block(v), t0 = p.block * cb;
    return {nullptr, t0, t0 < tokens ? (tokens - t0 < cb ? tokens - t0 : cb) : 0};
  }

  static void combine_host(MoEView const& v, Tokens const& tokens) {
    for (std::uint32_t i = 0; i < tokens.n; ++i) {
      std::uint32_t const t = tokens.at(i);
      for (std::uint32_t c = 0; c < v.hidden; ++c)
        v.out[std::size_t{t} * v.hidden + c] = __float2bfloat16(combine(v, t, c));
    }
  }
  static void host(Payload const& p, TaskContext&) { combine_host(*p.view, block_tokens(p)); }

#if defined(__CUDACC__)
  // The tokens' ids and routing words go to shared memory once. Each thread then combines 8
  // columns of kLoads / K items (token, column group) at a time, where K >= top_k is a
  // compile-time slot count: every 16-byte read of y for those items is issued before the first
  // is used.
  static constexpr std::uint32_t kLoads = 16;
  __device__ static void device(Payload const& p, TaskContext&) {
    combine_device(*p.view, block_tokens(p));
  }
  __device__ static void combine_device(MoEView const& v, Tokens const& tokens) {
    std::uint32_t const k = v.top_k;
    if (k <= 1) return combine_rows<1>(v, tokens);
    if (k <= 2) return combine_rows<2>(v, tokens);
    if (k <= 4) return combine_rows<4>(v, tokens);
    combine_rows<kMaxTopK>(v, tokens);
  }

  template <std::uint32_t K>
  __device__ static void combine_rows(MoEView const& v, Tokens const& tokens) {
    static_assert(K <= kLoads);
    constexpr std::uint32_t kItems = kLoads / K;
    std::uint32_t const top_k = v.top_k, hidden = v.hidden, n = tokens.n;
    std::size_t const slot_stride = std::size_t{v.max_tokens} * hidden;
    bf16 const* const y = v.y;
    bf16* const out = v.out;
    __shared__ std::uint32_t token_of[kMaxTokenBlock];
    __shared__ float weight[kMaxTokenBlock * kMaxTopK];
    __shared__ bool used[kMaxTokenBlock * kMaxTopK];
    for (std::uint32_t i = threadIdx.x; i < n; i += blockDim.x) token_of[i] = tokens.at(i);
    __syncthreads();
    for (std::uint32_t i = threadIdx.x; i < n * top_k; i += blockDim.x) {
      std::uint32_t const r = i / top_k;
      std::size_t const at = std::size_t{token_of[r]} * top_k + (i - r * top_k);
      used[i] = v.topk_ids[at] >= 0;
      weight[i] = used[i] ? v.topk_weights[at] : 0.0f;
    }
    __syncthreads();
    std::uint32_t const octets = hidden / 8, items = n * octets;
    for (std::uint32_t i0 = threadIdx.x; i0 < items; i0 += kItems * blockDim.x) {
      uint4 yv[kItems][K];
#pragma unroll
      for (std::uint32_t u = 0; u < kItems; ++u) {
        std::uint32_t const i = i0 + u * blockDim.x;
        std::uint32_t const t = i / octets, c = (i - t * octets) * 8;
#pragma unroll
        for (std::uint32_t j = 0; j < K; ++j) {
          yv[u][j] = uint4{0u, 0u, 0u, 0u};
          if (i < items && j < top_k && used[t * top_k + j])
            yv[u][j] = __ldcg(reinterpret_cast<uint4 const*>(
                y + j * slot_stride + std::size_t{token_of[t]} * hidden + c));
        }
      }
#pragma unroll
      for (std::uint32_t u = 0; u < kItems; ++u) {
        std::uint32_t const i = i0 + u * blockDim.x;
        if (i >= items) break;
        std::uint32_t const t = i / octets, c = (i - t * octets) * 8;
        float acc[8] = {};
#pragma unroll
        for (std::uint32_t j = 0; j < K; ++j) {
          if (j >= top_k) break;
          if (!used[t * top_k + j]) continue;
          float const w = weight[t * top_k + j];
          auto const* const h = reinterpret_cast<__nv_bfloat162 const*>(&yv[u][j]);
#pragma unroll
          for (std::uint32_t q = 0; q < 4; ++q) {
            float2 const f = __bfloat1622float2(h[q]);
            acc[2 * q] += w * f.x;
            acc[2 * q + 1] += w * f.y;
          }
        }
        uint4 o;
        auto* const ob = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (std::uint32_t q = 0; q < 4; ++q)
          ob[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
        *reinterpret_cast<uint4*>(out + std::size_t{token_of[t]} * hidden + c) = o;
      }
    }
  }
#endif
};

}  // namespace loom::moe
