// The MoE layer with its experts spread over P ranks (expert parallelism): what one rank's tasks
// read and write, and the symmetric-heap layout every rank shares.
//
// Expert e lives on rank e / E_local as local expert e % E_local. Each rank routes its own tokens
// and keeps them; a call on rank r runs, in one launch:
//   route   (per token block of r): top-k routing (as the single-GPU layer); each token placed,
//           once per destination rank d holding one of its experts, in the bin of its lowest
//           local expert there
//   plan    (after every route on r): arms the combine groups' counters; then a counts message
//           to each rank: tokens and chunks it will get from r, pairs per local expert;
//           release-flagged with the epoch
//   send    (after every route on r): the bins in expert order (local expert 0 of every rank,
//           then 1, ...), a chunk of at most one token block's rows at a time: every token goes
//           once to each rank that holds one of its experts: its row and a RowMeta (token, local
//           experts, slots) into that rank's recv area for source r, at slots that follow from
//           the bins' sizes; a ChunkRecord tagged with the launch's epoch publishes the chunk's
//           rows there (release). A destination's pools so fill expert by expert, and an
//           expert's up tiles can start while the rows of later experts are on the links
//   receive (subscriber on every rank): once every source's counts message is in, the expert
//           pool's layout (offsets, M-tiles), then one gather task per ChunkRecord as it lands
//   gather  (per chunk): recv rows into the expert pools; the last row of an M-tile emits its
//           up-projection row (as the single-GPU layer)
//   up / down (GEMM tiles): down rows are put straight into the source rank's y[slot][token]
//           (bf16), then one remote arrival per (row, N-tile) on the source's counter of the
//           token's combine group, which the plan armed at kBlockComplete minus the arrivals it
//           expects
//   combine (per combine group, on the source rank, emitted by its subscriber when the group's
//           counter reads kBlockComplete): out[t] = sum_j w[t,j] y[j][t] in top-k order, a
//           token block's worth of the group's tokens a task. A token's combine group is the
//           highest local expert index among its experts: every rank computes its experts in
//           that order, so group g is complete once the ranks are past their local expert g,
//           and the combines run beside the later experts' down tiles
//
// Every remote byte has exactly one writer (docs/ep.md states the layout; a property test checks
// it): recv areas, meta and chunk records are indexed by source rank, then by a slot that source
// claimed; y[slot][token] belongs to the one (token, slot) pair; counts messages by source rank.
#pragma once

#include <iterator>

#include "moe/view.hpp"
#include "runtime/symmetric_layout.hpp"

namespace loom::moe {

// What travels with each dispatched row: the token it is (on the source rank) and which of the
// destination's local experts it goes to, with the top-k slot of each.
struct RowMeta {
  std::uint32_t token;
  std::uint16_t experts[kMaxTopK];  // local expert ids on the destination
  std::uint8_t slots[kMaxTopK];     // top-k slot of each
  std::uint8_t count;
  std::uint8_t pad_;
  std::uint16_t group;  // the token's combine group on its source (combine_group)
};
static_assert(sizeof(RowMeta) == 32);

// A block of rows a source has finished writing: rows [first, first + rows) of its recv area.
// `epoch` is stored last, with release, and names the launch the rows belong to.
struct ChunkRecord {
  std::uint32_t first;
  std::uint32_t rows;
  std::uint64_t epoch;
};
static_assert(sizeof(ChunkRecord) == 16);

// Offsets of the symmetric regions (the same on every rank).
struct EpHeapRegions {
  Region inbox;       // [P][2 + E_local] u32: tokens, chunks, pairs per local expert, per source
  Region inbox_flag;  // [P] u64: epoch of each source's counts message
  Region ack;         // [P] u64: epoch of this rank's counts message each peer has consumed
  Region chunks;      // [P][max_blocks + E_local] ChunkRecord, per source
  Region recv_meta;   // [P][max_tokens] RowMeta, per source
  Region recv_rows;   // [P][max_tokens][H] bf16, per source
  Region y;           // [k][max_tokens][H] bf16: expert outputs for this rank's own tokens
  Region group_done;  // [E_local] u32: per combine group of own tokens, armed by the plan
};

// A combine group's counter (EpHeapRegions::group_done) reads this once every (row, down
// N-tile) result of its tokens is back: the plan arms it at kBlockComplete - pairs x N-tiles
// before any row leaves, each arrival adds, and the subscriber lowers it to 0 when it emits the
// group's combines. A group without tokens is never armed; one whose tokens have no pairs is
// armed complete. No armed count reaches the value: pairs x N-tiles is far below 2^31.
inline constexpr std::uint32_t kBlockComplete = 0x80000000u;

struct EpView {
  // Must stay the first member: the expert-side task types (ExpertUp, CombineTokens) receive
  // &local, and the EP types cast it back. Its expert-side fields (offsets, tile_base, fill,
  // pool, h, rows_arrived, up_done, the GEMM operands) index this rank's local experts; its
  // routing fields (experts, counts, topk_*) index all E experts.
  MoEView local;

  std::uint32_t rank, world;
  std::uint32_t local_experts;       // E_local = E / P
  std::uint32_t pool_rows;           // capacity of the expert pool
  std::uint16_t gather_type;         // task type id of GatherArrivals
  std::uint16_t combine_batch_type;  // task type id of CombineArrived
  std::uint16_t combine_tile_type;   // task type id of CombineGroupTile
  std::uint32_t routed_event;        // fires when every route on this rank is done
  std::uint32_t skip_sends;          // test hook: 1 = this rank never sends (a silent peer)
  std::uint32_t send_tasks;          // ep_send tasks: each sends the next chunks of the order

  // Symmetric regions, as pointers into this rank's own window (peers via SymmetricView::peer).
  std::uint32_t* inbox;
  std::uint64_t* inbox_flag;
  std::uint64_t* ack;
  ChunkRecord* chunks;
  RowMeta* recv_meta;
  bf16* recv_rows;
  std::uint32_t* group_done;

  // Rank-local.
  std::uint32_t* bin_rows;      // [P][E_local] tokens of each bin this call (routes add)
  std::uint32_t* bin_tokens;    // [P][E_local][max_tokens] the tokens of each bin
  std::uint32_t* send_next;     // [1] the next chunk of the send order to claim
  std::uint32_t* sends_done;    // [1] send tasks and plan of this call that have finished
  std::uint64_t* last_sent;     // [P] epoch of the last counts message sent to each peer
  std::uint32_t* row_rank;      // [pool_rows] source rank of each pool row
  std::uint32_t* row_group;     // [pool_rows] combine group of each pool row's token on its source
  std::uint32_t* local_tokens;  // [E_local] pairs each local expert got this call (all sources)
  // Combine groups of own tokens (combine_group). Routes add to group_rows (a ticket per token,
  // its place in group_tokens) and group_pairs; the plan keeps the call's sizes in group_size
  // and lowers the two.
  std::uint32_t* group_rows;    // [E_local]
  std::uint32_t* group_pairs;   // [E_local]
  std::uint32_t* group_size;    // [E_local]
  std::uint32_t* group_tokens;  // [E_local][max_tokens]
  std::uint32_t* combine_list;  // [E_local] own combine groups in the order their combines went

  LOOM_HD std::uint32_t rank_of(std::int32_t expert) const {
    return static_cast<std::uint32_t>(expert) / local_experts;
  }
  LOOM_HD std::uint32_t inbox_words() const { return 2 + local_experts; }
  // Chunk records per source: a destination's chunks are its bins' rows in token blocks, at
  // most max_blocks + E_local - 1 of them.
  LOOM_HD std::uint32_t chunk_capacity() const { return local.max_blocks + local_experts; }
  LOOM_HD std::uint32_t bins() const { return world * local_experts; }
};

// Token t's combine group: the highest local expert index among its experts on any rank (0 for
// a token without experts), and its pairs (ids not -1), found in one pass. Ids were checked by
// the route.
struct CombineGroup {
  std::uint32_t group, pairs;
};
LOOM_HD inline CombineGroup combine_group(EpView const& ep, std::uint32_t token) {
  std::int32_t const* ids = ep.local.topk_ids + std::size_t{token} * ep.local.top_k;
  CombineGroup g{0, 0};
  for (std::uint32_t j = 0; j < ep.local.top_k; ++j) {
    if (ids[j] < 0) continue;
    std::uint32_t const e = static_cast<std::uint32_t>(ids[j]) % ep.local_experts;
    g.group = e > g.group ? e : g.group;
    ++g.pairs;
  }
  return g;
}

// Chunks one claim of a send task takes (fewer at the end of the order): copied together,
// published after one fence.
inline constexpr std::uint32_t kSendClaim = 4;
static_assert(kSendClaim >= 1 && kSendClaim <= 32, "warp 0 numbers a claim's chunks");

// The send order. Bin d * E_local + e holds this rank's tokens whose lowest local expert on rank
// d is e (each token is in one bin per destination). The sends take the bins expert by expert:
// position q of the order is local expert q / P of rank (rank + 1 + q % P) % P, the peers first.
// Bin rows go out in chunks of at most one token block; a destination numbers a source's rows
// and chunks bin by bin in expert order (row_base, chunk_base), so every slot follows from the
// bins' sizes and no two chunks share one.
LOOM_HD inline std::uint32_t bin_at(EpView const& ep, std::uint32_t q) {
  std::uint32_t const e = q / ep.world, i = q - e * ep.world;
  return (ep.rank + 1 + i) % ep.world * ep.local_experts + e;
}
LOOM_HD inline std::uint32_t chunks_of(EpView const& ep, std::uint32_t rows) {
  return (rows + ep.local.token_block - 1) / ep.local.token_block;
}

// Where the chunks of this call go, from the bins' sizes (`rows`, [bins]): per bin its first row
// and chunk on its destination (row_base, chunk_base), and per position q of the order its first
// chunk of the whole order (start, [bins + 1]: start[bins] is the number of chunks). Every array
// is the caller's (shared memory on the device); one lane of `lanes` fills its share, and the
// block waits between the two steps.
struct SendOrder {
  std::uint32_t const* rows;
  std::uint32_t* row_base;
  std::uint32_t* chunk_base;
  std::uint32_t* start;

  // Step 1: lane d < P numbers destination d's bins.
  LOOM_HD void number_bins(EpView const& ep, std::uint32_t lane, std::uint32_t lanes) const {
    for (std::uint32_t d = lane; d < ep.world; d += lanes) {
      std::uint32_t row = 0, chunk = 0;
      for (std::uint32_t e = 0; e < ep.local_experts; ++e) {
        std::uint32_t const b = d * ep.local_experts + e;
        row_base[b] = row;
        chunk_base[b] = chunk;
        row += rows[b];
        chunk += chunks_of(ep, rows[b]);
      }
    }
  }
  // Step 2: the first chunk of each position: every chunk of the experts before it, then those of
  // the destinations before it at its expert; start[bins] counts every chunk.
  LOOM_HD void start_positions(EpView const& ep, std::uint32_t lane, std::uint32_t lanes) const {
    std::uint32_t const world = ep.world, experts = ep.local_experts, bins = ep.bins();
    for (std::uint32_t q = lane; q <= bins; q += lanes) {
      std::uint32_t first = 0;
      if (q == bins) {
        for (std::uint32_t b = experts - 1; b < bins; b += experts)
          first += chunk_base[b] + chunks_of(ep, rows[b]);
      } else {
        std::uint32_t const e = q / world, i = q - e * world;
        for (std::uint32_t d = 0; d < world; ++d) first += chunk_base[d * experts + e];
        for (std::uint32_t j = 0; j < i; ++j) first += chunks_of(ep, rows[bin_at(ep, q - i + j)]);
      }
      start[q] = first;
    }
  }
  // The position of chunk `c` of the order (start[q] <= c < start[q + 1]).
  LOOM_HD std::uint32_t position_of(EpView const& ep, std::uint32_t c) const {
    return run_of(start, ep.bins(), c);
  }
};

// Marks of a traced launch (TaskContext::trace_mark): a send task published a chunk record
// (a: the destination, b: the record), and the receiving subscriber took landed records of a
// source into one gather task (a: source << 24 | records taken, b: the first of them).
enum EpMark : std::uint16_t { kMarkRecordPublished = 0, kMarkRecordsTaken = 1 };
inline constexpr char const* kEpMarkNames[] = {"ep_record_published", "ep_records_taken"};
inline constexpr std::uint32_t kEpMarkCount = static_cast<std::uint32_t>(std::size(kEpMarkNames));

// The symmetric layout for `world` ranks of a layer with this shape.
inline EpHeapRegions ep_heap_layout(MoEView const& shape, std::uint32_t world,
                                    std::uint32_t local_experts, SymmetricLayout& layout) {
  EpHeapRegions r;
  std::uint64_t const p = world;
  r.inbox = layout.add_array<std::uint32_t>("ep.inbox", p * (2 + local_experts));
  r.inbox_flag = layout.add_array<std::uint64_t>("ep.inbox_flag", p);
  r.ack = layout.add_array<std::uint64_t>("ep.ack", p);
  r.chunks = layout.add_array<ChunkRecord>("ep.chunks",
                                           p * (shape.max_blocks + std::uint64_t{local_experts}));
  r.recv_meta = layout.add_array<RowMeta>("ep.recv_meta", p * shape.max_tokens);
  r.recv_rows =
      layout.add_array<bf16>("ep.recv_rows", p * shape.max_tokens * std::uint64_t{shape.hidden});
  r.y =
      layout.add_array<bf16>("ep.y", std::uint64_t{shape.top_k} * shape.max_tokens * shape.hidden);
  r.group_done = layout.add_array<std::uint32_t>("ep.group_done", local_experts);
  return r;
}

// Payload of a gather task: chunk records [chunk, chunk + chunks) of `source`, all landed. The
// task gathers the rows of the first and emits one gather for each of the others.
struct ChunkPayload {
  EpView const* view;
  std::uint32_t source;
  std::uint32_t chunk;
  std::uint32_t chunks;
};

}  // namespace loom::moe
