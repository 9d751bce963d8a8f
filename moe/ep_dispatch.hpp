// The sending side of expert parallelism: RouteBlock routes a token block (the single-GPU
// RouteTokens) and counts what it will send to each rank; PlanDispatch tells every rank how much
// to expect from this one; SendBlocks claims the rows' slots on each rank and sends each token
// once to every rank holding one of its experts. Layout and protocol: moe/ep_view.hpp.
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

// The meta of token t for destination d: its experts there (local ids) and their slots.
LOOM_HD inline RowMeta row_meta_for(EpView const& ep, std::uint32_t token, std::uint32_t d) {
  MoEView const& v = ep.local;
  RowMeta m{};
  m.token = token;
  std::int32_t const* ids = v.topk_ids + std::size_t{token} * v.top_k;
  for (std::uint32_t j = 0; j < v.top_k; ++j) {
    if (ids[j] < 0 || ep.rank_of(ids[j]) != d) continue;
    m.experts[m.count] =
        static_cast<std::uint16_t>(static_cast<std::uint32_t>(ids[j]) % ep.local_experts);
    m.slots[m.count] = static_cast<std::uint8_t>(j);
    ++m.count;
  }
  return m;
}

// Bit d set when token t has an expert on rank d.
LOOM_HD inline std::uint32_t destination_mask(EpView const& ep, std::uint32_t token) {
  MoEView const& v = ep.local;
  std::int32_t const* ids = v.topk_ids + std::size_t{token} * v.top_k;
  std::uint32_t mask = 0;
  for (std::uint32_t j = 0; j < v.top_k; ++j)
    if (ids[j] >= 0) mask |= 1u << ep.rank_of(ids[j]);
  return mask;
}

// How many of the n destination masks (destination_mask) have bit d set: the tokens of a block
// that travel to rank d.
LOOM_HD inline std::uint32_t tokens_for(std::uint32_t const* mask, std::uint32_t n,
                                        std::uint32_t d) {
  std::uint32_t count = 0;
  for (std::uint32_t t = 0; t < n; ++t) count += (mask[t] >> d) & 1u;
  return count;
}

// Routes a token block (RouteTokens), arms its result counter and adds the block's tokens and
// chunk per destination to the rank's totals (send_tokens, send_chunks: the plan's counts); then
// arrives on `routed`. The rows travel later, in SendBlocks, so that every route of the rank (and
// with them the plan's counts) is done before the rows take the links.
struct RouteBlock {
  static constexpr char const* name = "ep_route";
  static constexpr unsigned threads = RouteTokens::threads;
  static constexpr unsigned shared_bytes = RouteTokens::shared_bytes;
  using Payload = EpBlockPayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t token, std::uint64_t id) {
    return RouteTokens::describe_failure(code, token, id);
  }

  // Arms the block's result counter (kBlockComplete) once route has counted its pairs, before
  // any of its rows leaves. A block without pairs stays unarmed: route emitted its combine.
  LOOM_HD static void arm_block(EpView const& ep, std::uint32_t block) {
    std::uint32_t const pairs = ep.local.block_pairs[block];
    if (pairs != 0)
      store_relaxed<std::uint32_t, cuda::thread_scope_system>(
          ep.block_done[block], kBlockComplete - pairs * ep.local.down_tiles);
  }

  // Tokens of `block` in this call.
  LOOM_HD static std::uint32_t block_tokens(MoEView const& v, std::uint32_t block) {
    std::uint32_t const tokens = v.call[0], t0 = block * v.token_block;
    return t0 < tokens ? (tokens - t0 < v.token_block ? tokens - t0 : v.token_block) : 0;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    RouteTokens::route_host(v, p.block, 1, ctx);
    if (ctx.failed()) return;
    std::uint32_t const t0 = p.block * v.token_block, n = block_tokens(v, p.block);
    if (n != 0) arm_block(ep, p.block);
    std::uint32_t mask[kMaxTokenBlock];
    for (std::uint32_t t = 0; t < n; ++t) mask[t] = destination_mask(ep, t0 + t);
    for (std::uint32_t d = 0; d < ep.world; ++d) {
      std::uint32_t const count = tokens_for(mask, n, d);
      if (count == 0) continue;
      fetch_add_acq_rel(ep.send_tokens[d], count);
      fetch_add_acq_rel(ep.send_chunks[d], 1u);
    }
    ctx.arrive(ep.routed_event);
  }

#if defined(__CUDACC__)
  // Route as RouteTokens and arm the block's counter; then thread d < P counts the block's
  // tokens for destination d and adds them to the totals.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    RouteTokens::route_device(v, p.block, 1, ctx);
    __shared__ std::uint32_t mask[kMaxTokenBlock];
    std::uint32_t const world = ep.world, t0 = p.block * v.token_block;
    std::uint32_t const n = block_tokens(v, p.block);
    for (std::uint32_t t = threadIdx.x; t < n; t += blockDim.x)
      mask[t] = destination_mask(ep, t0 + t);
    __syncthreads();
    if (threadIdx.x < world && !ctx.failed()) {
      std::uint32_t const d = threadIdx.x;
      std::uint32_t const count = tokens_for(mask, n, d);
      if (count != 0) {
        atomicAdd(&ep.send_tokens[d], count);
        atomicAdd(&ep.send_chunks[d], 1u);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0 && !ctx.failed()) {
      if (n != 0) arm_block(ep, p.block);  // thread 0 wrote the block's pairs in route
      __threadfence();
      ctx.arrive(ep.routed_event);
    }
  }
#endif
};

// Payload of a send task: own token blocks first, first + send_tasks, ... (strided, so that a call
// with few tokens still spreads its blocks over the tasks).
struct SendPayload {
  EpView const* view;
  std::uint32_t first;
};

// After every route on this rank: sends the rows of its token blocks, each once to every rank
// holding one of its experts. Per (block, destination) one ticket, claimed as the block goes out,
// numbers its rows in the destination's recv area and its chunk record, so the records land about
// in the order of their numbers (the receiver gathers the landed prefix). A few tasks send all
// the blocks: the links, not the processors, bound the copy, and the other processors gather what
// has landed meanwhile. The last send of a call lowers the tickets' counters.
struct SendBlocks {
  static constexpr char const* name = "ep_send";
  static constexpr unsigned threads = RouteTokens::threads;
  static constexpr unsigned shared_bytes = 0;
  using Payload = SendPayload;

  // After a send task's blocks: the last of the call lowers the counters (every other send has
  // claimed its tickets before it counted itself done).
  LOOM_HD static void finish(EpView const& ep) {
    if (fetch_add_acq_rel(*ep.sends_done, 1u) + 1 != ep.send_tasks) return;
    for (std::uint32_t i = 0; i < 2 * ep.world; ++i) ep.send_cursor[i] = 0;
    *ep.sends_done = 0;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (ep.skip_sends) return;
    SymmetricView const& heap = ctx.heap();
    for (std::uint32_t block = p.first; block < v.max_blocks; block += ep.send_tasks) {
      std::uint32_t const t0 = block * v.token_block, n = RouteBlock::block_tokens(v, block);
      if (n == 0) break;
      std::uint32_t mask[kMaxTokenBlock];
      for (std::uint32_t t = 0; t < n; ++t) mask[t] = destination_mask(ep, t0 + t);
      for (std::uint32_t d = 0; d < ep.world; ++d) {
        std::uint32_t const count = tokens_for(mask, n, d);
        if (count == 0) continue;
        std::uint32_t const first = fetch_add_acq_rel(ep.send_cursor[d], count);
        std::uint32_t const chunk = fetch_add_acq_rel(ep.send_cursor[ep.world + d], 1u);
        std::uint32_t slot = first;
        for (std::uint32_t t = t0; t < t0 + n; ++t) {
          if (((mask[t - t0] >> d) & 1u) == 0) continue;
          std::size_t const at = std::size_t{ep.rank} * v.max_tokens + slot++;
          heap.put_serial(d, ep.recv_rows + at * v.hidden, v.x + std::size_t{t} * v.hidden,
                          std::size_t{v.hidden} * sizeof(bf16));
          RowMeta const meta = row_meta_for(ep, t, d);
          heap.put_serial(d, ep.recv_meta + at, &meta, sizeof meta);
        }
        ChunkRecord* record = ep.chunks + std::size_t{ep.rank} * v.max_blocks + chunk;
        std::uint32_t const extent[2] = {first, count};
        heap.put_serial(d, record, extent, sizeof extent);
        heap.signal_set(d, &record->epoch, ctx.epoch());
      }
    }
    finish(ep);
  }

#if defined(__CUDACC__)
  // Per block: thread d < P counts the block's rows for destination d, claims its ticket and
  // numbers them; the block copies the rows into the peers' windows with 16-byte stores, many
  // reads in flight per thread (fan_out_rows_to), then the metas; after a block barrier each
  // chunk record is published with a system-scope release, which covers every thread's stores.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    MoEView const& v = ep.local;
    if (ep.skip_sends) return;
    __shared__ std::uint32_t mask[kMaxTokenBlock];
    __shared__ std::uint32_t slot[kMaxTokenBlock * kMaxRanks];  // [token][destination], ~0u: none
    __shared__ std::uint32_t first[kMaxRanks], count[kMaxRanks], chunk[kMaxRanks];
    __shared__ uint4* dst_of[kMaxTokenBlock * kMaxRanks];  // [token][destination], or null
    std::uint32_t const world = ep.world;
    SymmetricView const& heap = ctx.heap();
    for (std::uint32_t block = p.first; block < v.max_blocks; block += ep.send_tasks) {
      std::uint32_t const t0 = block * v.token_block, n = RouteBlock::block_tokens(v, block);
      if (n == 0) break;
      for (std::uint32_t t = threadIdx.x; t < n; t += blockDim.x)
        mask[t] = destination_mask(ep, t0 + t);
      __syncthreads();
      if (threadIdx.x < world) {
        std::uint32_t const d = threadIdx.x;
        std::uint32_t const c = tokens_for(mask, n, d);
        count[d] = c;
        if (c != 0) {
          first[d] = atomicAdd(&ep.send_cursor[d], c);
          chunk[d] = atomicAdd(&ep.send_cursor[world + d], 1u);
          std::uint32_t at = std::uint32_t{ep.rank} * v.max_tokens + first[d];
          for (std::uint32_t t = 0; t < n; ++t)
            slot[t * world + d] = (mask[t] >> d) & 1u ? at++ : ~0u;
        }
      }
      __syncthreads();
      // Each (token, destination) row's address in that peer's window, resolved once: inside the
      // copy, every store may alias the views, whose fields would then be reloaded per store.
      for (std::uint32_t i = threadIdx.x; i < n * world; i += blockDim.x) {
        std::uint32_t const t = i / world, d = i - t * world;
        dst_of[i] = ((mask[t] >> d) & 1u) == 0
                        ? nullptr
                        : reinterpret_cast<uint4*>(
                              heap.peer(d, ep.recv_rows + std::size_t{slot[i]} * v.hidden));
      }
      __syncthreads();
      std::uint32_t const row_chunks = v.hidden / 8;
      fan_out_rows_to(reinterpret_cast<uint4 const*>(v.x + std::size_t{t0} * v.hidden), n,
                      row_chunks, world,
                      [&](std::uint32_t t, std::uint32_t d) { return dst_of[t * world + d]; });
      for (std::uint32_t i = threadIdx.x; i < n * world; i += blockDim.x) {
        std::uint32_t const t = i / world, d = i - t * world;
        if (((mask[t] >> d) & 1u) == 0) continue;
        RowMeta const meta = row_meta_for(ep, t0 + t, d);
        uint4* const to =
            reinterpret_cast<uint4*>(heap.peer(d, ep.recv_meta + slot[t * world + d]));
        to[0] = reinterpret_cast<uint4 const*>(&meta)[0];
        to[1] = reinterpret_cast<uint4 const*>(&meta)[1];
      }
      // Every thread's stores happen before the barrier; the record's release store (signal_set,
      // system scope) makes them visible with it. One fence per destination, not one per thread.
      __syncthreads();
      if (threadIdx.x < world && count[threadIdx.x] != 0) {
        std::uint32_t const d = threadIdx.x;
        ChunkRecord* record = ep.chunks + std::size_t{ep.rank} * v.max_blocks + chunk[d];
        ChunkRecord* remote = heap.peer(d, record);
        remote->first = first[d];
        remote->rows = count[d];
        heap.signal_set(d, &record->epoch, ctx.epoch());
      }
      __syncthreads();  // the shared words are rewritten for the next block
    }
    if (threadIdx.x == 0) {
      __threadfence();
      finish(ep);
    }
  }
#endif
};

// After every route on this rank: one counts message per destination (tokens and chunks it will
// get from this rank, pairs per local expert), each after that peer has consumed the previous
// one; then lowers the send counters and gives back the combines this call will not run.
struct PlanDispatch {
  static constexpr char const* name = "ep_plan_dispatch";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    EpView const* view;
  };

  // Word i of this rank's counts message to d: tokens, chunks, then pairs per local expert of d.
  LOOM_HD static std::uint32_t message_word(EpView const& ep, std::uint32_t d, std::uint32_t i) {
    return i == 0   ? ep.send_tokens[d]
           : i == 1 ? ep.send_chunks[d]
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

  // The send counters lowered and the unused combines retired (one thread, after the messages).
  LOOM_HD static void finish(EpView const& ep, TaskContext& ctx) {
    MoEView const& v = ep.local;
    for (std::uint32_t d = 0; d < ep.world; ++d) ep.send_tokens[d] = ep.send_chunks[d] = 0;
    std::uint32_t const active_blocks = (v.call[0] + v.token_block - 1) / v.token_block;
    ctx.retire(v.max_blocks - active_blocks);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    SymmetricView const& heap = ctx.heap();
    std::uint32_t const words = ep.inbox_words();
    for (std::uint32_t d = 0; d < ep.world && !ep.skip_sends; ++d) {
      Watchdog dog = ctx.watchdog(WaitSite::signal, d);
      if (!SymmetricView::wait(&ep.ack[d], ep.last_sent[d], dog)) return;
      std::vector<std::uint32_t> message(words);
      for (std::uint32_t i = 0; i < words; ++i) message[i] = message_word(ep, d, i);
      heap.put_serial(d, ep.inbox + std::size_t{ep.rank} * words, message.data(),
                      words * sizeof(std::uint32_t));
      heap.signal_set(d, &ep.inbox_flag[ep.rank], ctx.epoch());
      ep.last_sent[d] = ctx.epoch();
    }
    keep_counts(ep.local, 0, 1);
    finish(ep, ctx);
  }

#if defined(__CUDACC__)
  // Thread 0 waits until every peer has consumed the previous message; the block writes the
  // messages and keeps the counts; thread 0 flags the messages, then finishes.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    EpView const& ep = *p.view;
    __shared__ bool sent;
    std::uint32_t const world = ep.skip_sends ? 0u : ep.world;
    if (threadIdx.x == 0) {
      sent = true;
      for (std::uint32_t d = 0; d < world && sent; ++d) {
        Watchdog dog = ctx.watchdog(WaitSite::signal, d);
        sent = SymmetricView::wait(&ep.ack[d], ep.last_sent[d], dog);
      }
    }
    __syncthreads();
    if (!sent) return;
    std::uint32_t const words = ep.inbox_words();
    SymmetricView const& heap = ctx.heap();
    std::uint32_t* const inbox = ep.inbox + std::size_t{ep.rank} * words;
    for (std::uint32_t j = threadIdx.x; j < world * words; j += blockDim.x) {
      std::uint32_t const d = j / words, i = j - d * words;
      heap.peer(d, inbox)[i] = message_word(ep, d, i);
    }
    __threadfence_system();
    __syncthreads();  // every word is read before the counts are lowered, and fenced
    keep_counts(ep.local, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) {
      for (std::uint32_t d = 0; d < world; ++d) {
        heap.signal_set(d, &ep.inbox_flag[ep.rank], ctx.epoch());
        ep.last_sent[d] = ctx.epoch();
      }
      finish(ep, ctx);
    }
  }
#endif
};

}  // namespace loom::moe
