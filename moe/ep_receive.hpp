// The receiving side of expert parallelism: the subscriber's decoder turns what peers publish
// into tasks (one gather per landed chunk; one combine per own token block whose results are all
// back), and GatherArrivals moves a chunk's rows into the expert pools. Protocol: moe/ep_view.hpp.
#pragma once

#include "moe/ep_dispatch.hpp"
#include "moe/expert_tile.hpp"

namespace loom::moe {

// Gather: the rows of one chunk from `source`, each into the pool of every local expert it is
// routed to; the arrival that completes an M-tile emits its up-projection row (GatherTokens).
struct GatherArrivals {
  static constexpr char const* name = "ep_gather";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  using Payload = ChunkPayload;

  LOOM_HD static std::size_t recv_index(EpView const& ep, Payload const& p, std::uint32_t i) {
    return std::size_t{p.source} * ep.local.max_tokens + p.first + i;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    for (std::uint32_t i = 0; i < p.rows; ++i) {
      std::size_t const at = recv_index(ep, p, i);
      RowMeta const meta = ep.recv_meta[at];
      for (std::uint32_t c = 0; c < meta.count; ++c) {
        std::uint32_t index;
        std::uint32_t const row = GatherTokens::claim(v, meta.experts[c], index);
        std::memcpy(v.pool + std::size_t{row} * v.hidden, ep.recv_rows + at * v.hidden,
                    std::size_t{v.hidden} * sizeof(bf16));
        v.row_source[row] = meta.token * v.top_k + meta.slots[c];
        ep.row_rank[row] = p.source;
        GatherTokens::arrive(v, meta.experts[c], index, ctx);
      }
    }
  }

#if defined(__CUDACC__)
  // Thread i < rows * k claims the pool row of (row i / k, its i % k-th expert); the block copies
  // each received row once to its pool rows (fan_out_rows reads through L2: a peer wrote them);
  // then each claimant arrives.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    constexpr std::uint32_t kMaxPairs = kMaxTokenBlock * kMaxTopK;
    __shared__ std::uint32_t row_of[kMaxPairs], index_of[kMaxPairs];
    __shared__ std::uint16_t expert_of[kMaxPairs];
    std::uint32_t const pairs = p.rows * v.top_k;
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      std::uint32_t const r = i / v.top_k, c = i - r * v.top_k;
      RowMeta const* meta = ep.recv_meta + recv_index(ep, p, r);
      std::uint32_t const count = __ldcg(reinterpret_cast<unsigned char const*>(&meta->count));
      if (c >= count) {
        row_of[i] = ~0u;
        continue;
      }
      std::uint16_t const e = __ldcg(&meta->experts[c]);
      std::uint32_t const slot = __ldcg(reinterpret_cast<unsigned char const*>(&meta->slots[c]));
      expert_of[i] = e;
      row_of[i] = GatherTokens::claim(v, e, index_of[i]);
      v.row_source[row_of[i]] = __ldcg(&meta->token) * v.top_k + slot;
      ep.row_rank[row_of[i]] = p.source;
    }
    __syncthreads();
    fan_out_rows(reinterpret_cast<uint4 const*>(ep.recv_rows + recv_index(ep, p, 0) * v.hidden),
                 reinterpret_cast<uint4*>(v.pool), p.rows, v.hidden / 8, row_of, v.top_k);
    __syncthreads();
    for (std::uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      if (row_of[i] == ~0u) continue;
      __threadfence();
      GatherTokens::arrive(v, expert_of[i], index_of[i], ctx);
    }
  }
#endif
};

// The subscriber's decoder. Role 0 (subscriber 0) receives: it waits for every source's counts
// message, lays out the expert pools (offsets, M-tiles), acknowledges the messages, gives back
// the unused dynamic bound, and then emits one gather per chunk record as each lands. Role 1
// (subscriber 1, or subscriber 0 too when it is alone) emits the combine of each own token block
// whose (row, N-tile) arrivals are all in. A wait on one peer that makes no progress for half the
// watchdog bound is reported naming that peer.
//
// State lives in the decoder and is reset when a new launch (epoch) is seen, so the same object
// serves every launch; each role has its own state (one subscriber each).
class EpDecoder {
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
    std::uint32_t next_chunk[kMaxRanks] = {};
    std::uint32_t chunks[kMaxRanks] = {};
  };

  LOOM_HD bool receive(TaskContext& ctx) {
    EpView const& ep = *view_;
    MoEView const& v = ep.local;
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
    for (std::uint32_t s = 0; s < ep.world; ++s) {
      while (st.next_chunk[s] < st.chunks[s]) {
        ChunkRecord const* record =
            ep.chunks + std::size_t{s} * v.max_blocks + st.next_chunk[s];
        std::uint64_t const seen =
            load_acquire<std::uint64_t, cuda::thread_scope_system>(record->epoch);
        if (seen != epoch) {
          if (!progress) stalled(ctx, s, epoch, seen);
          break;
        }
        ChunkPayload const chunk{&ep, s, load_relaxed<std::uint32_t, cuda::thread_scope_system>(record->first),
                                 load_relaxed<std::uint32_t, cuda::thread_scope_system>(record->rows)};
        if (!ctx.emit(encode_task(ep.gather_type, chunk))) return false;
        ++st.next_chunk[s];
        progress = true;
      }
    }
    if (progress) st.since = now_ns();
    return progress;
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

  // The pool layout from every source's counts, then the acknowledgements and the bound.
  LOOM_HD void plan(TaskContext& ctx) {
    EpView const& ep = *view_;
    MoEView const& v = ep.local;
    std::uint32_t const words = ep.inbox_words();
    std::uint32_t rows = 0, tiles = 0, chunks = 0;
    for (std::uint32_t e = 0; e < ep.local_experts; ++e) {
      std::uint32_t c = 0;
      for (std::uint32_t s = 0; s < ep.world; ++s)
        c += peer_written(ep.inbox[std::size_t{s} * words + 2 + e]);
      ep.local_tokens[e] = c;
      v.offsets[e] = rows;
      v.tile_base[e] = tiles;
      v.fill[e] = 0;
      rows += c;
      tiles += (c + v.tile_rows - 1) / v.tile_rows;
    }
    v.offsets[ep.local_experts] = rows;
    v.tile_base[ep.local_experts] = tiles;
    for (std::uint32_t s = 0; s < ep.world; ++s) {
      receive_.chunks[s] = peer_written(ep.inbox[std::size_t{s} * words + 1]);
      chunks += receive_.chunks[s];
    }
    if (rows > ep.pool_rows) {
      ctx.fail(ep.gather_type, 1, rows, ep.pool_rows);  // cannot happen within max_tokens
      return;
    }
    // Offsets and fill are published to gathers through the ready queue (release).
    for (std::uint32_t s = 0; s < ep.world; ++s)
      ctx.heap().signal_set(s, &ep.ack[ep.rank], ctx.epoch());
    ctx.retire(ep.world * v.max_blocks - chunks +
               (v.max_mtiles - tiles) * (v.up_tiles + v.down_tiles));
  }

  // Emits the combine of every own token block whose arrivals are complete, and lowers its counter.
  LOOM_HD bool combine(TaskContext& ctx) {
    EpView const& ep = *view_;
    MoEView const& v = ep.local;
    std::uint32_t const blocks = (v.call[0] + v.token_block - 1) / v.token_block;
    bool progress = false;
    // Counters are read eight at a time (independent loads in flight together).
    constexpr std::uint32_t kBatch = 8;
    for (std::uint32_t b0 = 0; b0 < blocks; b0 += kBatch) {
      std::uint32_t done[kBatch];
      for (std::uint32_t i = 0; i < kBatch; ++i)
        done[i] = b0 + i < blocks ? load_relaxed<std::uint32_t, cuda::thread_scope_system>(
                                        ep.block_done[b0 + i])
                                  : 0u;
      for (std::uint32_t i = 0; i < kBatch; ++i) {
        if (done[i] == 0) continue;
        // A non-zero count means a result for this block came back, which happened after route
        // wrote block_pairs: after the fence, the read below sees this call's value.
        fence_acquire<cuda::thread_scope_system>();
        std::uint32_t const b = b0 + i;
        if (done[i] != v.block_pairs[b] * v.down_tiles) continue;
        store_relaxed<std::uint32_t, cuda::thread_scope_system>(ep.block_done[b], 0u);
        if (!ctx.emit(encode_task(v.combine_type, BlockPayload{&v, b}))) return false;
        progress = true;
      }
    }
    return progress;
  }

  // A word a peer wrote before a release this thread has acquired (read from L2 on the device).
  LOOM_HD static std::uint32_t peer_written(std::uint32_t const& word) {
#if LOOM_DEVICE_PASS
    return __ldcg(&word);
#else
    return load_relaxed(word);
#endif
  }

  EpView const* view_ = nullptr;
  ReceiveState receive_;
};

}  // namespace loom::moe
