// The receiving side of expert parallelism: the subscriber's decoder turns what peers publish
// into tasks (a gather per run of landed chunks; a combine per batch of own combine groups whose
// results are all back), and GatherArrivals moves a chunk's rows into the expert pools. Protocol:
// moe/ep_view.hpp.
#pragma once

#include <cstddef>
#include <vector>

#include "moe/ep_dispatch.hpp"
#include "moe/expert_tile.hpp"

#if defined(__CUDACC__)
#include <cub/warp/warp_scan.cuh>
#endif

namespace loom::moe {

// Gather: the rows of one chunk record from `source`, each into the pool of every local expert it
// is routed to; the arrival that completes an M-tile emits its up-projection row (GatherTokens).
// A task given several landed records first emits one gather for each of the others: the
// subscriber that found them landed publishes one descriptor, and the block emits the rest
// under one reservation.
struct GatherArrivals {
  static constexpr char const* name = "ep_gather";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  using Payload = ChunkPayload;

  LOOM_HD static ChunkRecord const& record(EpView const& ep, std::uint32_t source,
                                           std::uint32_t chunk) {
    return ep.chunks[std::size_t{source} * ep.chunk_capacity() + chunk];
  }
  // Gather i of the records after the first, as a task of its own.
  LOOM_HD static Task rest(Payload const& p, std::uint32_t i) {
    return encode_task(p.view->gather_type, ChunkPayload{p.view, p.source, p.chunk + 1 + i, 1});
  }

  // The record's epoch read again with acquire (the subscriber saw it with a relaxed load): it
  // synchronizes with the sender's release, so the record's rows and metas are visible after it.
  // One load per gather, on its own processor; the subscriber runs no system-scope fence, which
  // would wait for the links to drain while the sends stream.
  LOOM_HD static void acquire_record(ChunkRecord const& rec) {
    (void)load_acquire<std::uint64_t, cuda::thread_scope_system>(rec.epoch);
  }

  LOOM_HD static std::size_t recv_index(EpView const& ep, std::uint32_t source, std::uint32_t first,
                                        std::uint32_t i) {
    return std::size_t{source} * ep.local.max_tokens + first + i;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (!ctx.emit_many(p.chunks - 1, [&](std::uint32_t i) { return rest(p, i); })) return;
    ChunkRecord const& rec = record(ep, p.source, p.chunk);
    acquire_record(rec);
    std::uint32_t const first = load_relaxed(rec.first), rows = load_relaxed(rec.rows);
    for (std::uint32_t i = 0; i < rows; ++i) {
      std::size_t const at = recv_index(ep, p.source, first, i);
      RowMeta const meta = ep.recv_meta[at];
      for (std::uint32_t c = 0; c < meta.count; ++c) {
        std::uint32_t index;
        std::uint32_t const row = GatherTokens::claim(v, meta.experts[c], index);
        std::memcpy(v.pool + std::size_t{row} * v.hidden, ep.recv_rows + at * v.hidden,
                    std::size_t{v.hidden} * sizeof(bf16));
        v.row_source[row] = meta.token * v.top_k + meta.slots[c];
        ep.row_rank[row] = p.source;
        ep.row_group[row] = meta.group;
        GatherTokens::arrive(v, meta.experts[c], index, ctx);
      }
    }
  }

#if defined(__CUDACC__)
  // Slot c of a received row's RowMeta, from the meta's two 16-byte halves loaded at once (a peer
  // wrote them: through L2), fields taken by shifts so that nothing is indexed in local memory.
  struct MetaSlot {
    std::uint32_t token, expert, slot, count, group;
  };
  __device__ static MetaSlot meta_slot(RowMeta const* meta, std::uint32_t c) {
    static_assert(offsetof(RowMeta, token) == 0 && offsetof(RowMeta, experts) == 4 &&
                  offsetof(RowMeta, slots) == 20 && offsetof(RowMeta, count) == 28 &&
                  offsetof(RowMeta, group) == 30 && kMaxTopK == 8);
    uint4 const lo = __ldcg(reinterpret_cast<uint4 const*>(meta));
    uint4 const hi = __ldcg(reinterpret_cast<uint4 const*>(meta) + 1);
    std::uint32_t const experts = c < 2 ? lo.y : c < 4 ? lo.z : c < 6 ? lo.w : hi.x;
    std::uint32_t const slots = c < 4 ? hi.y : hi.z;
    return {lo.x, (experts >> (16 * (c & 1u))) & 0xFFFFu, (slots >> (8 * (c & 3u))) & 0xFFu,
            hi.w & 0xFFu, hi.w >> 16};
  }

  // Thread i < rows * k claims the pool row of (row i / k, its i % k-th expert); the block copies
  // each received row once to its pool rows (fan_out_rows reads through L2: a peer wrote them);
  // then each claimant arrives, and the block emits the groups those arrivals completed.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (p.chunks > 1 &&
        !ctx.emit_many_by_block(p.chunks - 1, [&](std::uint32_t i) { return rest(p, i); }))
      return;
    constexpr std::uint32_t kMaxPairs = kMaxTokenBlock * kMaxTopK;
    __shared__ std::uint32_t row_of[kMaxPairs], index_of[kMaxPairs];
    __shared__ std::uint16_t expert_of[kMaxPairs];
    // A peer wrote the record (read through L2), acquired by thread 0 for the block.
    ChunkRecord const& rec = record(ep, p.source, p.chunk);
    if (threadIdx.x == 0) acquire_record(rec);
    __syncthreads();
    std::uint32_t const first = __ldcg(&rec.first), rows = __ldcg(&rec.rows);
    std::uint32_t const pairs = rows * v.top_k;
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      std::uint32_t const r = i / v.top_k, c = i - r * v.top_k;
      MetaSlot const m = meta_slot(ep.recv_meta + recv_index(ep, p.source, first, r), c);
      if (c >= m.count) {
        row_of[i] = ~0u;
        continue;
      }
      expert_of[i] = static_cast<std::uint16_t>(m.expert);
      row_of[i] = GatherTokens::claim(v, static_cast<std::int32_t>(m.expert), index_of[i]);
      v.row_source[row_of[i]] = m.token * v.top_k + m.slot;
      ep.row_rank[row_of[i]] = p.source;
      ep.row_group[row_of[i]] = m.group;
    }
    __syncthreads();
    fan_out_rows(reinterpret_cast<uint4 const*>(ep.recv_rows +
                                                recv_index(ep, p.source, first, 0) * v.hidden),
                 reinterpret_cast<uint4*>(v.pool), rows, v.hidden / 8, row_of, v.top_k);
    __syncthreads();
    // row_of[i] becomes the group pair i completed, if any (kNoGroup is ~0u, an unused pair's).
    // Each arrival is a release: it covers the block's pool rows, ordered before it by the
    // barrier above.
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      if (row_of[i] == ~0u) continue;
      MTileGroup g;
      row_of[i] = GatherTokens::arrive_on_group(v, expert_of[i], index_of[i], g)
                      ? g.expert << 16 | g.first
                      : kNoGroup;
    }
    __syncthreads();
    emit_groups_by_block<up_tile_ops>(ctx, v.up_type, v, v.up_tasks, row_of, index_of, pairs);
  }
#endif
};

// Payload of a combine task: tokens [tile * token_block, ...) of combine group `group`.
struct GroupTilePayload {
  EpView const* view;
  std::uint32_t group;
  std::uint32_t tile;
};

// A combine of a token block's worth of one complete combine group's tokens (CombineTokens over
// the group's list).
struct CombineGroupTile {
  static constexpr char const* name = "ep_combine_tile";
  static constexpr unsigned threads = CombineTokens::threads;
  static constexpr unsigned shared_bytes = CombineTokens::shared_bytes;
  static constexpr bool call_body = true;  // as CombineTokens
  using Payload = GroupTilePayload;

  // The plan kept the group's size, and the routes wrote its tokens, before the group was
  // complete (read through L2 on the device: another actor wrote them this call).
  LOOM_HD static std::uint32_t group_size(EpView const& ep, std::uint32_t group) {
    return written_elsewhere(ep.group_size[group]);
  }
  LOOM_HD static std::uint32_t tiles(EpView const& ep, std::uint32_t group) {
    return (group_size(ep, group) + ep.local.token_block - 1) / ep.local.token_block;
  }
  LOOM_HD static CombineTokens::Tokens tokens(Payload const& p) {
    EpView const& ep = *p.view;
    std::uint32_t const block = ep.local.token_block, first = p.tile * block;
    std::uint32_t const left = group_size(ep, p.group) - first;
    return {ep.group_tokens + std::size_t{p.group} * ep.local.max_tokens + first, 0,
            left < block ? left : block};
  }

  static void host(Payload const& p, TaskContext&) {
    CombineTokens::combine_host(p.view->local, tokens(p));
  }
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext&) {
    CombineTokens::combine_device(p.view->local, tokens(p));
  }
#endif
};

// Payload of a combine batch: the combine groups at combine_list[first, first + groups), all
// complete, at most kBatchGroups of them.
inline constexpr std::uint32_t kBatchGroups = 32;
struct CombineBatchPayload {
  EpView const* view;
  std::uint32_t first;
  std::uint32_t groups;
};

// The combines of the complete groups the subscriber found together: the task emits a
// CombineGroupTile for each of their tiles but the first, under one reservation, then combines
// that one itself.
struct CombineArrived {
  static constexpr char const* name = "ep_combine";
  static constexpr unsigned threads = CombineTokens::threads;
  static constexpr unsigned shared_bytes = CombineTokens::shared_bytes;
  // A call, for the combine it runs inline (CombineTokens::call_body says why).
  static constexpr bool call_body = true;
  using Payload = CombineBatchPayload;

  // Listed group i of the batch. The subscriber wrote the list before it emitted the task (read
  // through L2 on the device: an earlier batch may have brought the line into this SM's L1).
  LOOM_HD static std::uint32_t listed(Payload const& p, std::uint32_t i) {
    return written_elsewhere(p.view->combine_list[p.first + i]);
  }
  // Tile i of the batch (its groups' tiles in list order), given the listed groups (group,
  // [groups]) and each one's first tile (start, [groups + 1]).
  LOOM_HD static GroupTilePayload tile(Payload const& p, std::uint32_t const* group,
                                       std::uint32_t const* start, std::uint32_t i) {
    std::uint32_t const g = run_of(start, p.groups, i);
    return {p.view, group[g], i - start[g]};
  }
  LOOM_HD static Task rest(Payload const& p, std::uint32_t const* group, std::uint32_t const* start,
                           std::uint32_t i) {
    return encode_task(p.view->combine_tile_type, tile(p, group, start, i + 1));
  }

  static void host(Payload const& p, TaskContext& ctx) {
    std::vector<std::uint32_t> group(p.groups), start(p.groups + 1, 0);
    for (std::uint32_t g = 0; g < p.groups; ++g) {
      group[g] = listed(p, g);
      start[g + 1] = start[g] + CombineGroupTile::tiles(*p.view, group[g]);
    }
    if (!ctx.emit_many(start[p.groups] - 1,
                       [&](std::uint32_t i) { return rest(p, group.data(), start.data(), i); }))
      return;
    CombineGroupTile::host(tile(p, group.data(), start.data(), 0), ctx);
  }
#if defined(__CUDACC__)
  // Warp 0 reads the listed groups and their sizes, a lane a group (two round trips to L2 for
  // the batch, where one thread took two a group), and sums their tiles.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    using Scan = cub::WarpScan<std::uint32_t>;
    static_assert(kBatchGroups <= 32, "a lane a listed group");
    __shared__ std::uint32_t group[kBatchGroups], start[kBatchGroups + 1];
    __shared__ typename Scan::TempStorage scan;
    if (threadIdx.x < 32) {
      std::uint32_t const lane = threadIdx.x;
      std::uint32_t tiles = 0;
      if (lane < p.groups) {
        std::uint32_t const g = listed(p, lane);
        group[lane] = g;
        tiles = CombineGroupTile::tiles(*p.view, g);
      }
      std::uint32_t end = 0;
      Scan(scan).InclusiveSum(tiles, end);
      if (lane < p.groups) start[lane + 1] = end;
      if (lane == 0) start[0] = 0;
    }
    __syncthreads();
    std::uint32_t const tiles = start[p.groups];
    if (tiles > 1 && !ctx.emit_many_by_block(
                         tiles - 1, [&](std::uint32_t i) { return rest(p, group, start, i); }))
      return;
    CombineGroupTile::device(tile(p, group, start, 0), ctx);
  }
#endif
};

// The subscriber's decoder. Role 0 (subscriber 0) receives: it waits for every source's counts
// message, lays out the expert pools (offsets, M-tiles), gives back the unused dynamic bound,
// and then, as chunk records land, emits one gather task per run of landed records of a source;
// once all are taken, it acknowledges the messages. Role 1 (subscriber 1, or subscriber 0 too when
// it is alone) emits the combines of the own combine groups whose (row, N-tile) arrivals are all
// in, a task per kBatchGroups of those that one pass over the counters finds. A wait on one peer
// that makes no progress for half the watchdog bound is reported naming that peer.
//
// One thread decodes, and each of its round trips to memory costs about a microsecond while the
// GEMMs stream: it reads many words per round trip and publishes one descriptor per batch,
// whose task emits the rest of the batch with the whole block (GatherArrivals, CombineArrived).
//
// State lives in the decoder and is reset when a new launch (epoch) is seen, so the same object
// serves every launch; each role has its own state (one subscriber each).
class EpDecoder {
  // Words read together by the one thread that decodes (see receive, plan and combine).
  static constexpr std::uint32_t kLandBatch = 32;
  static constexpr std::uint32_t kPlanBatch = 8;
  static constexpr std::uint32_t kCombineBatch = 32;

 public:
  EpDecoder() = default;
  explicit EpDecoder(EpView const* view) : view_(view) {}

  LOOM_HD bool poll(TaskContext& ctx, std::uint32_t index, std::uint32_t subscribers) {
    bool progress = false;
    if (index == 0) progress |= receive(ctx);
    if (index == 1 % subscribers) progress |= combine(ctx);
    return progress;
  }

 private:
  struct ReceiveState {
    std::uint64_t epoch = 0;
    std::uint64_t since = 0;  // time of the last progress
    bool planned = false;
    bool acknowledged = false;
    std::uint32_t next_chunk[kMaxRanks] = {};
    std::uint32_t chunks[kMaxRanks] = {};
  };

  struct CombineState {
    std::uint64_t epoch = 0;
    std::uint32_t listed = 0;  // groups in combine_list this call
  };

  LOOM_HD bool receive(TaskContext& ctx) {
    EpView const& ep = *view_;
    ReceiveState& st = receive_;
    std::uint64_t const epoch = ctx.epoch();
    if (st.epoch != epoch) {
      st = ReceiveState{};
      st.epoch = epoch;
      st.since = now_ns();
    }
    if (!st.planned) {
      for (std::uint32_t s = 0; s < ep.world; ++s) {
        std::uint64_t const seen =
            load_acquire<std::uint64_t, cuda::thread_scope_system>(ep.inbox_flag[s]);
        if (seen != epoch) return stalled(ctx, s, epoch, seen);
      }
      plan(ctx);
      st.planned = true;
      st.since = now_ns();
      return true;
    }
    bool progress = false;
    ChunkRecord const* const records = ep.chunks;
    std::uint32_t const world = ep.world, capacity = ep.chunk_capacity();
    std::uint16_t const gather = ep.gather_type;
    for (std::uint32_t s = 0; s < world; ++s) {
      // The landed prefix of s's records from next_chunk, kLandBatch epochs read together, then
      // one gather task for all of it (it emits the others, GatherArrivals).
      ChunkRecord const* const from = records + std::size_t{s} * capacity;
      std::uint32_t const next = st.next_chunk[s], end = st.chunks[s];
      std::uint32_t landed = next;
      std::uint64_t blocking = epoch;
      while (landed < end && blocking == epoch) {
        std::uint64_t seen[kLandBatch] = {};
        LOOM_UNROLL
        for (std::uint32_t i = 0; i < kLandBatch; ++i)
          if (landed + i < end)
            seen[i] =
                load_relaxed<std::uint64_t, cuda::thread_scope_system>(from[landed + i].epoch);
        std::uint32_t run = 0;
        LOOM_UNROLL
        for (std::uint32_t i = 0; i < kLandBatch; ++i) {
          if (landed + i >= end || run != i) continue;
          if (seen[i] == epoch)
            run = i + 1;
          else
            blocking = seen[i];
        }
        landed += run;
      }
      if (landed == next) {
        if (next < end && !progress) stalled(ctx, s, epoch, blocking);
        continue;
      }
      // Each gather acquires its record itself (GatherArrivals::acquire_record).
      if (!ctx.emit(encode_task(gather, ChunkPayload{view_, s, next, landed - next}))) return false;
      ctx.trace_mark(kMarkRecordsTaken, s << 24 | (landed - next), next);
      st.next_chunk[s] = landed;
      progress = true;
    }
    if (progress) st.since = now_ns();
    acknowledge(ctx);
    return progress;
  }

  // Once every record of the call has been taken, each source learns that its counts message was
  // consumed (it may then send the next call's). Late on purpose: each acknowledgement is a
  // system-scope release, whose fence waits for the links to drain while the rows stream.
  LOOM_HD void acknowledge(TaskContext& ctx) {
    EpView const& ep = *view_;
    ReceiveState& st = receive_;
    if (st.acknowledged) return;
    for (std::uint32_t s = 0; s < ep.world; ++s)
      if (st.next_chunk[s] != st.chunks[s]) return;
    for (std::uint32_t s = 0; s < ep.world; ++s)
      ctx.heap().signal_set(s, &ep.ack[ep.rank], ctx.epoch());
    st.acknowledged = true;
  }

  // Still waiting on peer s: past half the watchdog bound without progress, report it. Returns
  // false (no progress).
  LOOM_HD bool stalled(TaskContext& ctx, std::uint32_t s, std::uint64_t expected,
                       std::uint64_t seen) {
    std::uint64_t const bound = ctx.watchdog_ns() / 2;
    if (bound != 0 && now_ns() - receive_.since > bound)
      ctx.report_stalled_wait(WaitSite::signal, s, expected, seen);
    return false;
  }

  // The pool layout from every source's counts, then the bound. View
  // fields are held in locals (the stores below would make the compiler reload them), and the
  // counts of kPlanBatch experts are read together.
  LOOM_HD void plan(TaskContext& ctx) {
    EpView const& ep = *view_;
    MoEView const& v = ep.local;
    std::uint32_t const words = ep.inbox_words(), world = ep.world, experts = ep.local_experts;
    std::uint32_t const tile_rows = v.tile_rows;
    std::uint32_t const* const inbox = ep.inbox;
    std::uint32_t* const local_tokens = ep.local_tokens;
    std::uint32_t* const offsets = v.offsets;
    std::uint32_t* const tile_base = v.tile_base;
    std::uint32_t* const fill = v.fill;
    std::uint32_t rows = 0, tiles = 0, chunks = 0;
    for (std::uint32_t e0 = 0; e0 < experts; e0 += kPlanBatch) {
      std::uint32_t c[kPlanBatch] = {};
      for (std::uint32_t s = 0; s < world; ++s) {
        LOOM_UNROLL
        for (std::uint32_t i = 0; i < kPlanBatch; ++i)
          if (e0 + i < experts)
            c[i] += written_elsewhere(inbox[std::size_t{s} * words + 2 + e0 + i]);
      }
      LOOM_UNROLL
      for (std::uint32_t i = 0; i < kPlanBatch; ++i) {
        std::uint32_t const e = e0 + i;
        if (e >= experts) continue;
        local_tokens[e] = c[i];
        offsets[e] = rows;
        tile_base[e] = tiles;
        fill[e] = 0;
        rows += c[i];
        tiles += (c[i] + tile_rows - 1) / tile_rows;
      }
    }
    offsets[experts] = rows;
    tile_base[experts] = tiles;
    for (std::uint32_t s = 0; s < world; ++s) {
      receive_.chunks[s] = written_elsewhere(inbox[std::size_t{s} * words + 1]);
      chunks += receive_.chunks[s];
    }
    if (rows > ep.pool_rows) {
      ctx.fail(ep.gather_type, 1, rows, ep.pool_rows);  // cannot happen within max_tokens
      return;
    }
    // Offsets and fill are published to gathers through the ready queue (release).
    ctx.retire(world * ep.chunk_capacity() - chunks +
               (v.max_mtiles - tiles) * (v.up_tasks + v.down_tiles));
  }

  // Emits the combines of the own combine groups whose counters read kBlockComplete, up to
  // kBatchGroups of them per CombineArrived task, and lowers their counters. The counters are
  // read kCombineBatch at a time, the next batch's loads issued before this batch is looked at,
  // so a pass costs about one round trip to memory per kCombineBatch groups; the complete groups
  // are appended to combine_list, and one acquire fence covers them all.
  LOOM_HD bool combine(TaskContext& ctx) {
    EpView const& ep = *view_;
    CombineState& st = combine_;
    std::uint64_t const epoch = ctx.epoch();
    if (st.epoch != epoch) {
      st = CombineState{};
      st.epoch = epoch;
    }
    std::uint32_t* const done_words = ep.group_done;
    std::uint32_t* const list = ep.combine_list;
    std::uint32_t const groups = ep.local_experts;
    std::uint32_t const first = st.listed;
    std::uint32_t listed = first;
    std::uint32_t next[kCombineBatch];
    load_counters(done_words, 0, groups, next);
    for (std::uint32_t g0 = 0; g0 < groups; g0 += kCombineBatch) {
      std::uint32_t done[kCombineBatch];
      LOOM_UNROLL
      for (std::uint32_t i = 0; i < kCombineBatch; ++i) done[i] = next[i];
      load_counters(done_words, g0 + kCombineBatch, groups, next);
      LOOM_UNROLL
      for (std::uint32_t i = 0; i < kCombineBatch; ++i) {
        if (done[i] != kBlockComplete) continue;
        store_relaxed<std::uint32_t, cuda::thread_scope_system>(done_words[g0 + i], 0u);
        list[listed++] = g0 + i;
      }
    }
    if (listed == first) return false;
    // The results of the listed groups came with the arrivals that completed them (release):
    // acquired here, released to the combines by the queue.
    fence_acquire<cuda::thread_scope_system>();
    for (std::uint32_t b = first; b < listed; b += kBatchGroups) {
      std::uint32_t const n = listed - b < kBatchGroups ? listed - b : kBatchGroups;
      if (!ctx.emit(encode_task(ep.combine_batch_type, CombineBatchPayload{view_, b, n})))
        return false;
    }
    st.listed = listed;
    return true;
  }

  // Counters [g0, g0 + kCombineBatch) into `done` (0 past `groups`), every load issued before
  // any is used.
  LOOM_HD static void load_counters(std::uint32_t* done_words, std::uint32_t g0,
                                    std::uint32_t groups, std::uint32_t (&done)[kCombineBatch]) {
    LOOM_UNROLL
    for (std::uint32_t i = 0; i < kCombineBatch; ++i)
      done[i] = g0 + i < groups
                    ? load_relaxed<std::uint32_t, cuda::thread_scope_system>(done_words[g0 + i])
                    : 0u;
  }

  EpView const* view_ = nullptr;
  ReceiveState receive_;
  CombineState combine_;
};

}  // namespace loom::moe
