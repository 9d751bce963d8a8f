// The sending side of expert parallelism: RouteBlock routes a token block (the single-GPU
// RouteTokens) and puts its tokens in the bins of the send order; PlanDispatch tells every rank
// how much to expect from this one; SendBlocks sends the bins in expert order, each token once to
// every rank holding one of its experts. Layout and protocol: moe/ep_view.hpp.
#pragma once

#include <vector>

#include "moe/ep_view.hpp"
#include "moe/route_task.hpp"
#include "moe/row_fanout.hpp"

namespace loom::moe {

struct EpBlockPayload {
  EpView const* view;
  std::uint32_t block;
};

// The meta of token t for destination d: its experts there (local ids) and their slots, and its
// combine group (combine_group, in the same pass over its ids).
LOOM_HD inline RowMeta row_meta_for(EpView const& ep, std::uint32_t token, std::uint32_t d) {
  MoEView const& v = ep.local;
  RowMeta m{};
  m.token = token;
  std::uint32_t group = 0;
  std::int32_t const* ids = v.topk_ids + std::size_t{token} * v.top_k;
  for (std::uint32_t j = 0; j < v.top_k; ++j) {
    if (ids[j] < 0) continue;
    std::uint32_t const e = static_cast<std::uint32_t>(ids[j]) % ep.local_experts;
    group = e > group ? e : group;
    if (ep.rank_of(ids[j]) != d) continue;
    m.experts[m.count] = static_cast<std::uint16_t>(e);
    m.slots[m.count] = static_cast<std::uint8_t>(j);
    ++m.count;
  }
  m.group = static_cast<std::uint16_t>(group);
  return m;
}

// Puts token t in its bins: once per destination rank d holding one of its experts, in the bin of
// its lowest local expert there (ep_view.hpp, the send order). Ids were checked by the route.
LOOM_HD inline void bin_token(EpView const& ep, std::uint32_t token) {
  MoEView const& v = ep.local;
  std::int32_t const* ids = v.topk_ids + std::size_t{token} * v.top_k;
  for (std::uint32_t j = 0; j < v.top_k; ++j) {
    if (ids[j] < 0) continue;
    std::uint32_t const d = ep.rank_of(ids[j]);
    bool lowest = true;
    for (std::uint32_t i = 0; i < v.top_k; ++i)
      if (i != j && ids[i] >= 0 && ep.rank_of(ids[i]) == d &&
          (ids[i] < ids[j] || (ids[i] == ids[j] && i < j)))
        lowest = false;
    if (!lowest) continue;
    std::uint32_t const bin =
        d * ep.local_experts + static_cast<std::uint32_t>(ids[j]) % ep.local_experts;
    std::uint32_t const at = fetch_add_relaxed(ep.bin_rows[bin], 1u);
    ep.bin_tokens[std::size_t{bin} * v.max_tokens + at] = token;
  }
}

// Puts token t, of a token block with pairs, in its combine group: a ticket for its place in
// the group's tokens, and its pairs added to the group's.
LOOM_HD inline void group_token(EpView const& ep, std::uint32_t token) {
  CombineGroup const g = combine_group(ep, token);
  std::uint32_t const at = fetch_add_relaxed(ep.group_rows[g.group], 1u);
  ep.group_tokens[std::size_t{g.group} * ep.local.max_tokens + at] = token;
  if (g.pairs != 0) fetch_add_relaxed(ep.group_pairs[g.group], g.pairs);
}

// Tokens and chunks rank d gets from this one: the sums over its bins. A share sums bins lane,
// lane + lanes, ... (one thread: lanes = 1, all of them; a warp sums its lanes' shares).
struct DestinationTotals {
  std::uint32_t rows, chunks;
};
LOOM_HD inline DestinationTotals totals_share(EpView const& ep, std::uint32_t d, std::uint32_t lane,
                                              std::uint32_t lanes) {
  DestinationTotals t{0, 0};
  for (std::uint32_t e = lane; e < ep.local_experts; e += lanes) {
    std::uint32_t const rows = load_relaxed(ep.bin_rows[d * ep.local_experts + e]);
    t.rows += rows;
    t.chunks += chunks_of(ep, rows);
  }
  return t;
}

// Routes a route group (RouteTokens: route_blocks token blocks, payload `block` numbering the
// groups) and puts the group's tokens in their bins (bin_token: the plan's counts and the sends'
// order) and, those of blocks with pairs, in their combine groups (group_token; a block without
// pairs has its combine from the route); then arrives on `routed`. The rows travel
// later, in SendBlocks, so that every route of the rank (and with them the bins) is done before
// the rows take the links.
struct RouteBlock {
  static constexpr char const* name = "ep_route";
  static constexpr unsigned threads = RouteTokens::threads;
  static constexpr unsigned shared_bytes = RouteTokens::shared_bytes;
  using Payload = EpBlockPayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t token, std::uint64_t id) {
    return RouteTokens::describe_failure(code, token, id);
  }

  // Tokens of `block` in this call.
  LOOM_HD static std::uint32_t block_tokens(MoEView const& v, std::uint32_t block) {
    std::uint32_t const tokens = v.call[0], t0 = block * v.token_block;
    return t0 < tokens ? (tokens - t0 < v.token_block ? tokens - t0 : v.token_block) : 0;
  }

  // Token blocks [first, end) of route group `group` (those past max_blocks excluded).
  LOOM_HD static std::uint32_t first_block(MoEView const& v, std::uint32_t group) {
    return group * v.route_blocks;
  }
  LOOM_HD static std::uint32_t end_block(MoEView const& v, std::uint32_t group) {
    std::uint32_t const end = (group + 1) * v.route_blocks;
    return end < v.max_blocks ? end : v.max_blocks;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    std::uint32_t const first = first_block(v, p.block), end = end_block(v, p.block);
    RouteTokens::route_host(v, first, end - first, ctx);
    if (ctx.failed()) return;
    for (std::uint32_t block = first; block < end; ++block) {
      std::uint32_t const t0 = block * v.token_block, n = block_tokens(v, block);
      bool const pairs = v.block_pairs[block] != 0;
      for (std::uint32_t t = t0; t < t0 + n; ++t) {
        bin_token(ep, t);
        if (pairs) group_token(ep, t);
      }
    }
    ctx.arrive(ep.routed_event);
  }

#if defined(__CUDACC__)
  // Route as RouteTokens; thread i bins the group's token i and puts it in its combine group.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    std::uint32_t const first = first_block(v, p.block), end = end_block(v, p.block);
    RouteTokens::route_device(v, first, end - first, ctx);
    std::uint32_t const t0 = first * v.token_block, tokens = v.call[0];
    std::uint32_t const t1 = min(end * v.token_block, tokens);
    __syncthreads();  // the route's ids and the blocks' pairs are written
    if (!ctx.failed()) {
      for (std::uint32_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        bin_token(ep, t);
        if (v.block_pairs[t / v.token_block] != 0) group_token(ep, t);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && !ctx.failed()) {
      __threadfence();
      ctx.arrive(ep.routed_event);
    }
  }
#endif
};

// Payload of a send task (the tasks are alike: each claims the next chunk of the order).
struct SendPayload {
  EpView const* view;
};

// After every route on this rank: the bins' rows go out in the send order (ep_view.hpp), each
// token once to every rank holding one of its experts. A task claims the next kSendClaim
// chunks of the order (send_next) until none is left, so the chunks leave about in order and a
// destination's pools fill expert by expert. Per claim: the chunks' rows into their
// destinations' recv areas (consecutive slots per chunk), their metas, and then each chunk's
// record with a system-scope release. A few tasks send everything: the links bound the copy, and
// the other processors gather and multiply what has landed meanwhile. A claim of several chunks
// keeps more rows in flight per task and pays the fixed costs of a claim (its tokens, the
// barriers, the fence that waits for the rows to land) once. The last of the sends and the plan
// lowers the bins' and claims' counters.
struct SendBlocks {
  static constexpr char const* name = "ep_send";
  static constexpr unsigned threads = RouteTokens::threads;

  // Device, in shared memory: the claim's chunks, then the send order's tables (rows, row_base,
  // chunk_base, start).
  struct Claim {
    uint4* to[kSendClaim];                  // each chunk's first row in its destination's window
    std::uint32_t const* from[kSendClaim];  // each chunk's tokens in bin_tokens
    std::uint32_t dest[kSendClaim], first[kSendClaim], record[kSendClaim];
    std::uint32_t base[kSendClaim + 1];  // the claim's rows before each chunk (then all)
    // The claim's rows, chunk by chunk: each row's token and where it is copied from and to.
    uint4 const* src[kSendClaim * kMaxTokenBlock];
    uint4* dst[kSendClaim * kMaxTokenBlock];
    std::uint32_t tokens[kSendClaim * kMaxTokenBlock];
    std::uint8_t chunk[kSendClaim * kMaxTokenBlock];  // the claim's chunk each row is of
    std::uint32_t claimed;                            // the first chunk of the next claim
  };
  static constexpr unsigned shared_bytes =
      sizeof(Claim) + (4 * kMaxExperts + 1) * sizeof(std::uint32_t);
  static_assert(kSendClaim * kMaxTokenBlock <= threads, "a thread per row of a claim");
  using Payload = SendPayload;

  // After a send task's chunks, and after the plan's messages: the last of the call lowers the
  // counters (each has read what it needs of them before it counts itself done).
  LOOM_HD static void finish(EpView const& ep) {
    if (fetch_add_acq_rel(*ep.sends_done, 1u) + 1 != ep.send_tasks + 1) return;
    for (std::uint32_t b = 0; b < ep.bins(); ++b) ep.bin_rows[b] = 0;
    *ep.send_next = 0;
    *ep.sends_done = 0;
  }

  // Chunk `c` of the order: destination, its tokens in bin_tokens, rows, first slot and record.
  struct Chunk {
    std::uint32_t dest, bin, rows, first, record;
    std::uint32_t const* tokens;
  };
  LOOM_HD static Chunk chunk_at(EpView const& ep, SendOrder const& order, std::uint32_t c) {
    std::uint32_t const q = order.position_of(ep, c), bin = bin_at(ep, q);
    std::uint32_t const i = c - order.start[q], block = ep.local.token_block;
    std::uint32_t const left = order.rows[bin] - i * block;
    return {bin / ep.local_experts,
            bin,
            left < block ? left : block,
            order.row_base[bin] + i * block,
            order.chunk_base[bin] + i,
            ep.bin_tokens + std::size_t{bin} * ep.local.max_tokens + i * block};
  }

  LOOM_HD static std::size_t recv_slot(EpView const& ep, std::uint32_t row) {
    return std::size_t{ep.rank} * ep.local.max_tokens + row;
  }
  LOOM_HD static ChunkRecord* record_of(EpView const& ep, std::uint32_t chunk) {
    return ep.chunks + std::size_t{ep.rank} * ep.chunk_capacity() + chunk;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (!ep.skip_sends) {
      std::uint32_t const bins = ep.bins();
      std::vector<std::uint32_t> words(4 * std::size_t{bins} + 1);
      for (std::uint32_t b = 0; b < bins; ++b) words[b] = load_relaxed(ep.bin_rows[b]);
      SendOrder const order{words.data(), words.data() + bins, words.data() + 2 * bins,
                            words.data() + 3 * bins};
      order.number_bins(ep, 0, 1);
      order.start_positions(ep, 0, 1);
      SymmetricView const& heap = ctx.heap();
      std::uint32_t const total = order.start[bins];
      for (std::uint32_t c0; (c0 = fetch_add_relaxed(*ep.send_next, kSendClaim)) < total;) {
        std::uint32_t const n = std::min(kSendClaim, total - c0);
        Chunk claimed[kSendClaim];
        for (std::uint32_t q = 0; q < n; ++q) claimed[q] = chunk_at(ep, order, c0 + q);
        for (std::uint32_t q = 0; q < n; ++q) {
          Chunk const& ch = claimed[q];
          for (std::uint32_t r = 0; r < ch.rows; ++r) {
            std::uint32_t const token = ch.tokens[r];
            std::size_t const at = recv_slot(ep, ch.first + r);
            heap.put_serial(ch.dest, ep.recv_rows + at * v.hidden,
                            v.x + std::size_t{token} * v.hidden,
                            std::size_t{v.hidden} * sizeof(bf16));
            RowMeta const meta = row_meta_for(ep, token, ch.dest);
            heap.put_serial(ch.dest, ep.recv_meta + at, &meta, sizeof meta);
          }
        }
        for (std::uint32_t q = 0; q < n; ++q) {
          Chunk const& ch = claimed[q];
          ChunkRecord* const record = record_of(ep, ch.record);
          std::uint32_t const extent[2] = {ch.first, ch.rows};
          heap.put_serial(ch.dest, record, extent, sizeof extent);
          // Marked before the epoch's store: a receiver may take the record as soon as it lands,
          // and its mark must not come first.
          ctx.trace_mark(kMarkRecordPublished, ch.dest, ch.record);
          heap.signal_set(ch.dest, &record->epoch, ctx.epoch());
        }
      }
    }
    finish(ep);
  }

#if defined(__CUDACC__)
  // The block loads the bins' sizes and builds the order's tables in shared memory; then per
  // claim: thread q < chunks places chunk q, thread r < rows reads the claim's token r and puts
  // row r's source and destination addresses in shared memory, the block copies the rows into
  // the peers' windows with 16-byte stores, many reads in flight per thread (fan_out_rows_from,
  // one shared-memory load per address), thread r writes row r's meta, and after a block barrier
  // thread 0 publishes the records: one system-scope fence, which covers every thread's stores,
  // then a relaxed store of each record's epoch.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (!ep.skip_sends) send_chunks(ep, v, ctx);
    if (threadIdx.x == 0) {
      __threadfence();
      finish(ep);
    }
  }

  __device__ static void send_chunks(EpView const& ep, MoEView const& v, TaskContext& ctx) {
    Claim& cl = *static_cast<Claim*>(ctx.shared_memory());
    auto* const words = reinterpret_cast<std::uint32_t*>(&cl + 1);
    std::uint32_t const bins = ep.bins();
    std::uint32_t* const rows = words;
    SendOrder const order{rows, rows + bins, rows + 2 * bins, rows + 3 * bins};
    // The first claim goes out before the tables are built; its answer is needed only after.
    std::uint32_t first = 0;
    if (threadIdx.x == 0) first = atomicAdd(ep.send_next, kSendClaim);
    for (std::uint32_t b = threadIdx.x; b < bins; b += blockDim.x)
      rows[b] = load_relaxed(ep.bin_rows[b]);
    __syncthreads();
    order.number_bins(ep, threadIdx.x, blockDim.x);
    __syncthreads();
    order.start_positions(ep, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) cl.claimed = first;
    __syncthreads();
    std::uint32_t const total = order.start[bins];
    SymmetricView const& heap = ctx.heap();
    std::uint32_t const row_chunks = v.hidden / 8, block = v.token_block;
    auto const* const x = reinterpret_cast<uint4 const*>(v.x);
    for (;;) {
      std::uint32_t const c0 = cl.claimed;
      if (c0 >= total) break;
      std::uint32_t const n = min(kSendClaim, total - c0);
      std::uint32_t chunk_rows = 0;
      if (threadIdx.x < n) {
        Chunk const ch = chunk_at(ep, order, c0 + threadIdx.x);
        cl.to[threadIdx.x] = reinterpret_cast<uint4*>(
            heap.peer(ch.dest, ep.recv_rows + recv_slot(ep, ch.first) * v.hidden));
        cl.from[threadIdx.x] = ch.tokens;
        cl.dest[threadIdx.x] = ch.dest;
        cl.first[threadIdx.x] = ch.first;
        cl.record[threadIdx.x] = ch.record;
        chunk_rows = ch.rows;
      }
      // Warp 0 numbers the claim's rows chunk by chunk (n <= kSendClaim <= 32).
      if (threadIdx.x < 32) {
        std::uint32_t incl = chunk_rows;
#pragma unroll
        for (std::uint32_t d = 1; d < kSendClaim; d *= 2) {
          std::uint32_t const up = __shfl_up_sync(0xFFFFFFFFu, incl, d);
          if (threadIdx.x >= d) incl += up;
        }
        std::uint32_t const all = __shfl_sync(0xFFFFFFFFu, incl, n - 1);
        if (threadIdx.x <= kSendClaim)
          cl.base[threadIdx.x] = threadIdx.x < n ? incl - chunk_rows : all;
      }
      __syncthreads();  // every thread has read the claim; the chunks are placed
      std::uint32_t const claim_rows = cl.base[kSendClaim];
      if (threadIdx.x < kSendClaim * kMaxTokenBlock) {
        std::uint32_t const q = threadIdx.x / block, r = threadIdx.x - q * block;
        if (q < n && cl.base[q] + r < cl.base[q + 1]) {
          std::uint32_t const s = cl.base[q] + r, token = __ldcg(cl.from[q] + r);
          cl.tokens[s] = token;
          cl.chunk[s] = static_cast<std::uint8_t>(q);
          cl.src[s] = x + std::size_t{token} * row_chunks;
          cl.dst[s] = cl.to[q] + std::size_t{r} * row_chunks;
        }
      }
      __syncthreads();  // the rows are placed
      // The next claim goes out now; its answer is needed only after this claim's copy.
      std::uint32_t next = 0;
      if (threadIdx.x == 0) next = atomicAdd(ep.send_next, kSendClaim);
      fan_out_rows_from(
          claim_rows, row_chunks, 1, [&](std::uint32_t s) { return cl.src[s]; },
          [&](std::uint32_t s, std::uint32_t) { return cl.dst[s]; });
      if (threadIdx.x < claim_rows) {
        std::uint32_t const q = cl.chunk[threadIdx.x];
        RowMeta const meta = row_meta_for(ep, cl.tokens[threadIdx.x], cl.dest[q]);
        auto* const at = reinterpret_cast<uint4*>(heap.peer(
            cl.dest[q], ep.recv_meta + recv_slot(ep, cl.first[q] + threadIdx.x - cl.base[q])));
        at[0] = reinterpret_cast<uint4 const*>(&meta)[0];
        at[1] = reinterpret_cast<uint4 const*>(&meta)[1];
      }
      // Every thread's stores happen before the barrier; thread 0's system-scope fence makes
      // them visible before any of the records' epochs.
      __syncthreads();
      if (threadIdx.x == 0) {
        for (std::uint32_t q = 0; q < n; ++q) {
          ChunkRecord* const remote = heap.peer(cl.dest[q], record_of(ep, cl.record[q]));
          remote->first = cl.first[q];
          remote->rows = cl.base[q + 1] - cl.base[q];
        }
        fence_release<cuda::thread_scope_system>();
        for (std::uint32_t q = 0; q < n; ++q) {
          ChunkRecord* const record = record_of(ep, cl.record[q]);
          // Marked before the epoch's store, as on the host path.
          ctx.trace_mark(kMarkRecordPublished, cl.dest[q], cl.record[q]);
          store_relaxed<std::uint64_t, cuda::thread_scope_system>(
              *heap.peer(cl.dest[q], &record->epoch), ctx.epoch());
        }
        cl.claimed = next;
      }
      __syncthreads();  // the next claim is in, and this claim's tokens are read
    }
  }
#endif
};

// After every route on this rank: one counts message per destination (tokens and chunks it will
// get from this rank, pairs per local expert), each after that peer has consumed the previous
// one; then gives back the combines this call will not run.
struct PlanDispatch {
  static constexpr char const* name = "ep_plan_dispatch";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    EpView const* view;
  };

  // Word i of this rank's counts message to d (its totals `t`): tokens, chunks, then pairs per
  // local expert of d.
  LOOM_HD static std::uint32_t message_word(EpView const& ep, std::uint32_t d, std::uint32_t i,
                                            DestinationTotals const& t) {
    return i == 0   ? t.rows
           : i == 1 ? t.chunks
                    : load_relaxed(ep.local.counts[d * ep.local_experts + i - 2]);
  }

  // After the messages: this call's counts kept for the caller and lowered, expert e by thread
  // `lane` of `lanes`.
  LOOM_HD static void keep_counts(MoEView const& v, std::uint32_t lane, std::uint32_t lanes) {
    std::uint32_t* const counts = v.counts;
    std::uint32_t* const kept = v.expert_tokens;
    for (std::uint32_t e = lane; e < v.experts; e += lanes) {
      kept[e] = load_relaxed(counts[e]);
      counts[e] = 0;
    }
  }

  // Arms combine group g's counter for the call (kBlockComplete less the arrivals its pairs
  // bring; a group without tokens stays unarmed), keeps its size and lowers the routes' counters.
  // Returns the combine tasks the group takes: a token block's worth of its tokens each.
  LOOM_HD static std::uint32_t arm_group(EpView const& ep, std::uint32_t g) {
    std::uint32_t const size = load_relaxed(ep.group_rows[g]);
    std::uint32_t const pairs = load_relaxed(ep.group_pairs[g]);
    ep.group_size[g] = size;
    ep.group_rows[g] = 0;
    ep.group_pairs[g] = 0;
    if (size == 0) return 0;
    store_release<std::uint32_t, cuda::thread_scope_system>(
        ep.group_done[g], kBlockComplete - pairs * ep.local.down_tiles);
    return (size + ep.local.token_block - 1) / ep.local.token_block;
  }
  // Combines of the call's token blocks without pairs (their routes emitted them), block
  // `lane`, `lane + lanes`, ...
  LOOM_HD static std::uint32_t pairless_blocks(MoEView const& v, std::uint32_t lane,
                                               std::uint32_t lanes) {
    std::uint32_t const blocks = (v.call[0] + v.token_block - 1) / v.token_block;
    std::uint32_t n = 0;
    for (std::uint32_t b = lane; b < blocks; b += lanes) n += v.block_pairs[b] == 0 ? 1u : 0u;
    return n;
  }

  // The unused combines retired (of `combines`, the call's: ep_dynamic_bound), and the plan
  // counted with the sends (SendBlocks::finish: the last lowers the bins). One thread, after the
  // messages.
  LOOM_HD static void finish(EpView const& ep, std::uint32_t combines, TaskContext& ctx) {
    SendBlocks::finish(ep);
    ctx.retire(ep.local.max_blocks + ep.local_experts - combines);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    SymmetricView const& heap = ctx.heap();
    std::uint32_t const words = ep.inbox_words();
    std::uint32_t combines = pairless_blocks(ep.local, 0, 1);
    for (std::uint32_t g = 0; g < ep.local_experts; ++g) combines += arm_group(ep, g);
    for (std::uint32_t d = 0; d < ep.world && !ep.skip_sends; ++d) {
      Watchdog dog = ctx.watchdog(WaitSite::signal, d);
      if (!SymmetricView::wait(&ep.ack[d], ep.last_sent[d], dog)) return;
      std::vector<std::uint32_t> message(words);
      DestinationTotals const totals = totals_share(ep, d, 0, 1);
      for (std::uint32_t i = 0; i < words; ++i) message[i] = message_word(ep, d, i, totals);
      heap.put_serial(d, ep.inbox + std::size_t{ep.rank} * words, message.data(),
                      words * sizeof(std::uint32_t));
      heap.signal_set(d, &ep.inbox_flag[ep.rank], ctx.epoch());
      ep.last_sent[d] = ctx.epoch();
    }
    keep_counts(ep.local, 0, 1);
    finish(ep, combines, ctx);
  }

#if defined(__CUDACC__)
  // Warp w sums the bins of destinations w, w + warps, ... (a lane per bin); thread 0 waits until
  // every peer has consumed the previous message; the block arms the combine groups, writes the
  // messages and keeps the counts; thread 0 flags the messages, then finishes.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    __shared__ bool sent;
    __shared__ std::uint32_t combines;
    __shared__ DestinationTotals totals[kMaxRanks];
    if (threadIdx.x == 0) combines = 0;
    std::uint32_t const world = ep.skip_sends ? 0u : ep.world;
    std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (std::uint32_t d = warp; d < world; d += blockDim.x / 32) {
      DestinationTotals const t = totals_share(ep, d, lane, 32);
      std::uint32_t const rows = __reduce_add_sync(0xFFFFFFFFu, t.rows);
      std::uint32_t const chunks = __reduce_add_sync(0xFFFFFFFFu, t.chunks);
      if (lane == 0) totals[d] = {rows, chunks};
    }
    if (threadIdx.x == 0) {
      sent = true;
      for (std::uint32_t d = 0; d < world && sent; ++d) {
        Watchdog dog = ctx.watchdog(WaitSite::signal, d);
        sent = SymmetricView::wait(&ep.ack[d], ep.last_sent[d], dog);
      }
    }
    __syncthreads();
    if (!sent) return;
    std::uint32_t mine = pairless_blocks(ep.local, threadIdx.x, blockDim.x);
    for (std::uint32_t g = threadIdx.x; g < ep.local_experts; g += blockDim.x)
      mine += arm_group(ep, g);
    if (mine != 0) atomicAdd(&combines, mine);
    std::uint32_t const words = ep.inbox_words();
    SymmetricView const& heap = ctx.heap();
    std::uint32_t* const inbox = ep.inbox + std::size_t{ep.rank} * words;
    for (std::uint32_t j = threadIdx.x; j < world * words; j += blockDim.x) {
      std::uint32_t const d = j / words, i = j - d * words;
      heap.peer(d, inbox)[i] = message_word(ep, d, i, totals[d]);
    }
    __threadfence_system();
    __syncthreads();  // every word is read before the counts are lowered, and fenced
    keep_counts(ep.local, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) {
      for (std::uint32_t d = 0; d < world; ++d) {
        heap.signal_set(d, &ep.inbox_flag[ep.rank], ctx.epoch());
        ep.last_sent[d] = ctx.epoch();
      }
      finish(ep, combines, ctx);
    }
  }
#endif
};

}  // namespace loom::moe
