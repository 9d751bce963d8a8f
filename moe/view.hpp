// Everything the MoE task types read and write during one call, as plain pointers (host memory on
// the CPU executor, device memory on the GPU) plus the shape. Tasks carry a pointer to it.
//
// Data flow of one call (T tokens, E experts, top-k):
//   route   (per block of token_block tokens): top-k ids and weights, per-expert counts, pair
//           counts per call block (call_block(v) tokens, a divisor of token_block: the gathers'
//           and combines' unit); a call block with no routed pair emits its combine at once
//   plan    (one task, after every route): offsets, tiles per expert; gives back unused bound
//   gather  (per call block, after plan): copies each token row to its expert's pool rows; the
//           last row of an M-tile to arrive emits that tile's up-projection tasks
//           Where every route task has a processor of its own (route_gathers), there is no plan
//           task and no gather task: the last route task to count works out the plan, and each
//           route task then gathers its own blocks (moe/route_gather.hpp).
//   up      (per M-tile x N-tile, a tensor-core GEMM tile; on 64-row M-tiles a run of up_run
//           N-tiles): act(x_e · W1_e) into h; the last N-tile of an M-tile group emits the
//           group's down-projection tasks
//   down    (per M-tile x N-tile): h · W2_e into y[slot j][token t] (fp32 accumulation, stored
//           as bf16); the last arrival for a call block emits its combine
//   combine (per call block): out[t] = sum_j w[t,j] y[j][t] in top-k order, accumulated in fp32
// Counters that a call raises are lowered again by the task that consumes them, so the next
// call starts clean without the host touching anything.
#pragma once

#include <cuda_bf16.h>

#include "moe/config.hpp"
#include "runtime/atomic.hpp"
#include "runtime/config.hpp"
#include "tasks/gemm/operands.hpp"

namespace loom {
struct SharedEmission;  // runtime/protocol.hpp
}  // namespace loom

namespace loom::moe {

using bf16 = __nv_bfloat16;

// The route task's shared memory per token: the token's row, padded by kRouteRowPad bytes so that
// the tensor-core fragment loads of consecutive rows fall in different banks, and its logits,
// once per route segment (at most kRouteSplitColumns partial columns in all).
inline constexpr std::uint32_t kRouteRowPad = 64;
inline constexpr std::uint32_t kRouteSplitColumns = 192;
inline constexpr std::uint32_t kRouteSharedBytes = 160 * 1024;
inline constexpr std::uint32_t kRouteSyncWords = 4;  // MoEView::route_sync
inline constexpr std::uint32_t kCallWords = 3;       // MoEView::call
inline std::size_t route_bytes_per_token(std::uint32_t hidden, std::uint32_t experts) {
  return std::size_t{hidden} * 2 + kRouteRowPad +
         4 * std::size_t{experts > kRouteSplitColumns ? experts : kRouteSplitColumns};
}

// Tokens per route / gather / combine task: at most kMaxTokenBlock, fewer for small batches so
// that there are still kMinTokenBlocks of those tasks (about one per SM: a second wave of short
// gathers costs more in scheduling than it spreads), and few enough that a block's staging fits
// the route task's shared memory (kRouteSharedBytes, less 16 bytes of alignment).
inline constexpr std::uint32_t kMaxTokenBlock = 32;
inline constexpr std::uint32_t kMinTokenBlocks = 128;
inline std::uint32_t token_block_for(std::uint32_t max_tokens, std::uint32_t hidden,
                                     std::uint32_t experts) {
  std::size_t const per_token_bytes = route_bytes_per_token(hidden, experts);
  std::uint32_t b = 1;
  while (b < kMaxTokenBlock && max_tokens / (2 * b) >= kMinTokenBlocks &&
         2 * b * per_token_bytes + 16 <= kRouteSharedBytes)
    b *= 2;
  return b;
}

// Token blocks per route task. Each route task streams the whole router from L2 whatever its
// token count, so small blocks make that read the route phase's cost: a route task takes blocks
// together up to kMaxTokenBlock tokens (the most its staging and two m16 tiles hold) while there
// are more than kRouteTasks of them.
inline constexpr std::uint32_t kRouteTasks = 128;
inline std::uint32_t route_blocks_for(std::uint32_t max_tokens, std::uint32_t token_block,
                                      std::uint32_t hidden, std::uint32_t experts) {
  std::size_t const per_token_bytes = route_bytes_per_token(hidden, experts);
  std::uint32_t tokens = token_block;
  while (2 * tokens <= kMaxTokenBlock && max_tokens / tokens > kRouteTasks &&
         2 * tokens * per_token_bytes + 16 <= kRouteSharedBytes)
    tokens *= 2;
  return tokens / token_block;
}

// The router's K in slices of kRouteSliceChunks 32-column chunks, and the slices in
// route_segments runs of consecutive slices. A logit is the in-order sum of its segments' sums,
// each the in-order sum of its slices' dot products (each from zero). That order depends on
// hidden and experts alone, so the routing is bitwise the same whichever tasks compute which
// slices: one route task per token group, or (few groups) a group's slices spread over parts.
inline constexpr std::uint32_t kRouteSliceChunks = 8;
inline constexpr std::uint32_t kMaxRouteSlices = 256;  // spread groups: hidden up to 65536
inline constexpr std::uint32_t kRouteWarps = 12;  // warps of a route task's block (the pipeline's)
// A spread route group: 32 tokens (two m16 tiles of logits).
inline constexpr std::uint32_t kRouteGroupTokens = 32;

// The router on the tensor cores (MoEView::route_ops): each route group's tokens, up to
// kRouteTileTokens, times the router as one GEMM tile (RouteTile: tasks/gemm_tile.hpp, wgmma +
// TMA, 64 rows by 128 or 256 columns), for layers of kMinTileRouterExperts to
// kMaxTileRouterExperts experts and a hidden size up to kMaxTileRouterHidden: where it was
// measured faster than the mma.sync route tasks (docs/moe.md, "The router on the tensor cores";
// below 128 experts they were as fast or faster, and at hidden = 7168 the tile's long K on one SM
// made decode slower). The tile's configuration depends on hidden and experts alone, and a row's
// sums do not depend on the other rows of its tile, so the routing is bitwise the same whichever
// tasks route which tokens (and on every rank count of an expert-parallel layer).
inline constexpr std::uint32_t kRouteTileTokens = 64;
inline constexpr std::uint32_t kMinTileRouterExperts = 128;
inline constexpr std::uint32_t kMaxTileRouterExperts = 256;
inline constexpr std::uint32_t kMaxTileRouterHidden = 4096;
// Whether a layer of wgmma tiles routes on the tensor cores: by its hidden size and experts
// alone, so that every rank count of an expert-parallel layer routes alike.
inline constexpr bool routes_on_tile(std::uint32_t hidden, std::uint32_t experts) {
  return experts >= kMinTileRouterExperts && experts <= kMaxTileRouterExperts &&
         hidden <= kMaxTileRouterHidden;
}
// Token blocks one route task may cover: kRouteTileTokens of one-token blocks.
inline constexpr std::uint32_t kMaxRouteBlocks = kRouteTileTokens;
// Token blocks per route task with the router on the tensor cores: as route_blocks_for, while
// there are more than kRouteTasks route tasks, but up to a whole tile of tokens (the tile reads
// the router once for all of them; its rows past the tokens cost no memory traffic).
inline std::uint32_t tile_route_blocks_for(std::uint32_t max_tokens, std::uint32_t token_block) {
  std::uint32_t tokens = token_block;
  while (2 * tokens <= kRouteTileTokens && max_tokens / tokens > kRouteTasks) tokens *= 2;
  return tokens / token_block;
}
// The router's columns as the tile computes them: experts rounded up to 8 (zero rows of the
// router past the experts).
inline constexpr std::uint32_t route_columns(std::uint32_t experts) {
  return (experts + 7) / 8 * 8;
}

// M-tiles per group (MoEView::mtile_group): with N-tiles 256 wide, 8 M-tiles of an
// up-projection are 8 x (up columns / 256) tiles, about one wave of processors at ffn = 2048.
inline constexpr std::uint32_t kMTileGroup = 8;

struct MoEView {
  // Shape (fixed at construction).
  std::uint32_t hidden, ffn, experts, top_k;
  std::uint32_t up_cols;               // columns of W1 as packed (2*ffn for SwiGLU)
  std::uint32_t up_tiles, down_tiles;  // N-tiles of the two GEMMs
  // An up task computes a run of up_run N-tiles over its M-tile (the last run of an M-tile may be
  // shorter): up_tasks = ceil(up_tiles / up_run) tasks per M-tile. Down tasks are single tiles.
  // up_tasks_bound: the up tasks per M-tile the layer's dynamic bound counts (the most of its
  // views': a call on a view of fewer retires the difference).
  std::uint32_t up_run, up_tasks, up_tasks_bound;
  std::uint32_t tile_rows;  // rows per expert M-tile: both GEMMs' block_m
  // An expert's M-tiles in groups of mtile_group: a group's tiles are emitted together when its
  // last row (up) or last up tile (down) is in, N-tile-major, so the group's M-tiles read each
  // weight tile at about the same time (once from HBM, the others from L2). 1: each M-tile as
  // soon as it is full. Both layers use kMTileGroup; on an expert-parallel rank a group waits
  // for rows from every peer that sends to it.
  std::uint32_t mtile_group;
  // A layer whose M-tiles are tall also holds a view with short ones (moe/expert_gemms.hpp), the
  // same in every other field: the plan runs a call of at most short_tokens tokens on it (it
  // emits the gathers with that view, and everything after them follows). Null: one height.
  // On the main view, an expert's last M-tile of at most short_rows rows (the short view's
  // tile_rows) runs on the short view's GEMM operands (moe/expert_tasks.hpp). 0 on a short view
  // and without one.
  MoEView const* short_view;
  std::uint32_t short_tokens, short_rows;
  // Tokens per token block: a route task routes route_blocks of them. Gathers and combines take
  // the call's blocks (call_block), token_block or a divisor of it.
  std::uint32_t token_block;
  std::uint32_t route_blocks;  // token blocks per route task
  std::uint32_t max_tokens, max_blocks, max_mtiles;
  std::uint32_t max_call_blocks;    // the most call blocks of any call (call_blocks_capacity)
  std::uint32_t max_routes;         // route groups: max_blocks / route_blocks, rounded up
  std::uint32_t route_slices;       // router K slices (kRouteSliceChunks chunks each)
  std::uint32_t route_segments;     // runs of slices summed apart, then in order
  std::uint32_t route_parts;        // route tasks per group: 1, or parts that split its slices
  std::uint32_t route_part_slices;  // slices per part (route_parts > 1)
  // Route groups one route task takes in turn (route_tasks(v) tasks; task r takes groups r,
  // r + route_tasks(v), ...): 1, or more where a layer sized for many tokens would otherwise
  // have more than kRouteTasks route tasks, most of them without a token of a small call.
  std::uint32_t route_rounds;
  // 0, or the number of route tasks when each has a processor of its own from the launch's start
  // (runtime: a root per processor), so that they can wait for one another: then the route tasks
  // gather their own token blocks once the last of them has planned the call (route_sync), and
  // the graph has neither a plan task nor gather tasks. Set by the layer (make_layer_shapes).
  std::uint32_t route_gathers;
  // Routes on the tensor cores (routes_on_tile; route_ops on a GPU): route groups of up to
  // kRouteTileTokens tokens (tile_route_blocks_for), each a RouteTile before its route task.
  bool tile_router;
  Activation activation;
  RouterScore score;
  bool renormalize;
  // Task type ids in the pipeline that runs the layer (for dynamic emission).
  std::uint16_t gather_type, up_type, down_type, combine_type;

  // Per call, in executor memory: tokens this call, 1 when the caller supplied the routing, and
  // the tokens per gather and combine (call_block_for).
  std::uint32_t const* call;  // [kCallWords]: [0] tokens, [1] routing given, [2] call block

  // Inputs and output.
  bf16 const* x;         // [T][H]
  bf16* out;             // [T][H]
  bf16 const* router_w;  // [E][H]
  bf16 const* w1;        // [E][up_cols][H], gate/up interleaved per N-tile for SwiGLU
  bf16 const* w2;        // [E][H][ffn]
  // The expert GEMMs (tasks/gemm_tile.hpp): up = pool · W1ᵀ with the activation into h; down =
  // h · W2ᵀ, accumulated in fp32 and stored as bf16, delivered row by row to y[slot][token].
  tasks::gemm::GemmOperands const* up_ops;
  tasks::gemm::GemmOperands const* down_ops;

  // Routing.
  std::int32_t* topk_ids;        // [T][k], -1: no expert
  float* topk_weights;           // [T][k]
  std::uint32_t* counts;         // [E] pairs per expert, raised by route, lowered by plan
  std::uint32_t* expert_tokens;  // [E] this call's counts, kept for the caller
  std::uint32_t* offsets;        // [E + 1] first pool row of each expert
  std::uint32_t* tile_base;      // [E + 1] first M-tile of each expert
  std::uint32_t* fill;           // [E] rows gathered so far; lowered by plan
  // route_gathers: each routed pair's place among its expert's pairs (the ticket its count's
  // increment returned), written by its route task; null otherwise.
  std::uint32_t* pair_ticket;  // [T*k]
  // route_gathers: [0] route tasks that counted this call (the plan, once written, sets it to
  // route_gathers + 1), [1] route tasks that saw the plan (the last lowers both); [2] route tasks
  // that gathered, [3] route tasks that saw every gather done (the last lowers [2] and [3]).
  std::uint32_t* route_sync;  // [kRouteSyncWords]
  // route_gathers: the call's up tasks, reserved by the route task that writes the plan.
  SharedEmission* up_emission;
  std::uint32_t* block_pairs;  // [max_call_blocks] routed pairs per call block
  // Spread route groups (route_parts > 1): each slice's dot products, and the parts finished
  // per group. Where the route tasks gather, every part waits for the others and picks the experts
  // of its share of the group's blocks, and part 0 lowers the word once it has seen the plan;
  // elsewhere the last part lowers it and picks them all.
  float* route_partial;          // [route_slices][max_tokens][experts]
  std::uint32_t* route_arrived;  // [max_routes]
  // The router on the tensor cores (GPU layers whose shape has tile_router; null otherwise): a
  // GEMM of A = x (its tensor map rewritten for each call), B = the router padded to
  // route_columns(experts) rows, C = route_logits (fp32, [max_tokens][route_columns(experts)]).
  tasks::gemm::GemmOperands const* route_ops;
  float* route_logits;

  // Expert pools.
  bf16* pool;                 // [T*k][H] gathered token rows
  std::uint32_t* row_source;  // [T*k] token * k + slot of each pool row
  bf16* h;                    // [T*k][ffn] activations after the up-projection
  bf16* y;                    // [k][T][H] expert outputs at [slot][token]

  // Arrival counters, lowered by their last arriver.
  std::uint32_t* rows_arrived;  // [max_mtiles] gathered rows per M-tile group (at its first)
  std::uint32_t* up_done;       // [max_mtiles] finished up-projection tiles per M-tile group
  std::uint32_t* block_done;  // [max_call_blocks] finished (row, down N-tile) pairs per call block
};

// Slices [first, end) of route segment q, and the chunks [first, end) of slice s.
LOOM_HD inline std::uint32_t segment_first_slice(std::uint32_t slices, std::uint32_t segments,
                                                 std::uint32_t q) {
  return q * slices / segments;
}
LOOM_HD inline std::uint32_t segment_first_slice(MoEView const& v, std::uint32_t q) {
  return segment_first_slice(v.route_slices, v.route_segments, q);
}
LOOM_HD inline std::uint32_t slice_first_chunk(std::uint32_t s) {
  return s * kRouteSliceChunks;
}
LOOM_HD inline std::uint32_t slice_end_chunk(MoEView const& v, std::uint32_t s) {
  std::uint32_t const end = (s + 1) * kRouteSliceChunks, chunks = v.hidden / 32;
  return end < chunks ? end : chunks;
}
// A word another actor wrote during this call, ordered before this read by an acquire: read
// through L2 on the device (this SM's L1 may hold the line from an earlier read).
LOOM_HD inline std::uint32_t written_elsewhere(std::uint32_t const& word) {
#if LOOM_DEVICE_PASS
  return __ldcg(&word);
#else
  return load_relaxed(word);
#endif
}
// Items [first, first + count) of `items` shared out over `parts` parts: part `part`'s, contiguous
// and in part order, the first items % parts parts taking one more.
struct Share {
  std::uint32_t first, count;
};
LOOM_HD inline Share share_of(std::uint32_t items, std::uint32_t parts, std::uint32_t part) {
  std::uint32_t const each = items / parts, extra = items % parts;
  return {part * each + (part < extra ? part : extra), each + (part < extra ? 1u : 0u)};
}
// Runs of emitted items: run i starts at item starts[i] (ascending, starts[0] == 0, `runs` of
// them). The run that item k belongs to: the last start at or before k, by binary search.
LOOM_HD inline std::uint32_t run_of(std::uint32_t const* starts, std::uint32_t runs,
                                    std::uint32_t k) {
  std::uint32_t lo = 0, hi = runs;  // starts[lo] <= k < starts[hi] (hi == runs: past the last)
  while (hi - lo > 1) {
    std::uint32_t const mid = (lo + hi) / 2;
    if (starts[mid] <= k)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
// Elements of the spread route's slice sums (0 when routes are not spread).
inline std::size_t route_partial_size(MoEView const& v) {
  return v.route_parts > 1 ? std::size_t{v.route_slices} * v.max_tokens * v.experts : 0;
}

// Route tasks per part of a group: each takes route_rounds groups in turn (route_rounds is 1 where
// a group has several parts, so then one task a group).
LOOM_HD inline std::uint32_t route_tasks(MoEView const& v) {
  return (v.max_routes + v.route_rounds - 1) / v.route_rounds;
}

// f(g) for the route groups route task `first` takes in turn (first, first + route_tasks(v), ...;
// one on a layer of route_rounds = 1) that hold tokens of this call, while f returns true.
template <class F>
LOOM_HD void for_each_route_group(MoEView const& v, std::uint32_t first, F const& f) {
  std::uint32_t const step = route_tasks(v);
  std::uint32_t const tokens = v.call[0], group_tokens = v.route_blocks * v.token_block;
  for (std::uint32_t g = first; g < v.max_routes && g * group_tokens < tokens; g += step)
    if (!f(g)) return;
}

// The call's blocks: call_block(v) tokens each (the last may hold fewer), the unit of a gather and
// of a combine.
LOOM_HD inline std::uint32_t call_block(MoEView const& v) {
  return v.call[2];
}
LOOM_HD inline std::uint32_t call_blocks(MoEView const& v) {
  return (v.call[0] + v.call[2] - 1) / v.call[2];
}
// The call block of a call of `tokens` tokens: the token block of a layer sized for the call, so
// that a small call on a layer sized for many tokens still spreads its gathers and combines over
// about kMinTokenBlocks blocks (a call of 1024 tokens on a layer for 16384: 128 blocks of 8 tokens
// rather than 32 of 32). A power of two that divides token_block (token_block_for grows with the
// tokens).
inline std::uint32_t call_block_for(MoEView const& v, std::uint32_t tokens) {
  std::uint32_t const b = token_block_for(tokens, v.hidden, v.experts);
  return b < v.token_block ? b : v.token_block;
}
// The most call blocks of any call of up to max_tokens tokens: max_blocks, or fewer than
// 2 * kMinTokenBlocks where the call block is below the layer's token block (token_block_for
// stops doubling only there, or where the staging limit stops it for every call alike).
inline std::uint32_t call_blocks_capacity(std::uint32_t max_blocks) {
  return max_blocks > 2 * kMinTokenBlocks ? max_blocks : 2 * kMinTokenBlocks;
}

// Payload of the per-block tasks: route (a route task's index), gather and combine (tokens
// [block * call_block(v), ...)).
struct BlockPayload {
  MoEView const* view;
  std::uint32_t block;
};

// Bounds the graph declares for dynamic emission.
inline std::uint32_t max_mtiles(std::uint32_t max_tokens, std::uint32_t top_k,
                                std::uint32_t experts, std::uint32_t tile_rows) {
  return (max_tokens * top_k) / tile_rows + experts;
}

}  // namespace loom::moe
