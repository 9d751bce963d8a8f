// Route: for each token of a few token blocks (route_blocks of them), the top-k experts and their
// weights (fused router: x·Wgᵀ, scored; or the caller's routing, checked), then the per-expert
// pair counts and each block's pair count. A block with no routed pair emits its combine at once
// (its tokens' outputs are 0).
#pragma once

#include <string>

#include "moe/route_gather.hpp"
#include "moe/routing.hpp"
#include "moe/view.hpp"
#include "runtime/context.hpp"
#include "tasks/gemm/ptx/mma_sync.cuh"
#include "tasks/gemm_tile.hpp"

#if defined(__CUDACC__)
#include <cuda_pipeline.h>
#endif

namespace loom::moe {

// Shared by route bodies: checks one token's caller-supplied routing. Returns 0 when valid, else
// a non-zero code (1: id out of range, 2: id repeated, 3: non-finite weight) and the offender.
LOOM_HD inline std::uint32_t check_given_routing(MoEView const& v, std::uint32_t t,
                                                 std::int32_t& offender) {
  std::int32_t const* ids = v.topk_ids + std::size_t{t} * v.top_k;
  float const* w = v.topk_weights + std::size_t{t} * v.top_k;
  for (std::uint32_t j = 0; j < v.top_k; ++j) {
    offender = ids[j];
    if (ids[j] < -1 || ids[j] >= static_cast<std::int32_t>(v.experts)) return 1;
    if (ids[j] < 0) continue;
    for (std::uint32_t i = 0; i < j; ++i)
      if (ids[i] == ids[j]) return 2;
    if (!(w[j] == w[j]) || w[j] > 3.0e38f || w[j] < -3.0e38f) return 3;
  }
  return 0;
}

struct RouteTokens {
  static constexpr char const* name = "moe_route";
  // Device: 16-byte router loads each lane keeps in flight before it multiplies (16 made ptxas
  // keep them in local memory, which doubled the route task).
  static constexpr std::uint32_t kRouterLoads = 8;
  // Device: 16-byte token-row loads each thread keeps in flight while staging the block's rows.
  static constexpr std::uint32_t kStageLoads = 8;
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = kRouteSharedBytes;  // token rows and logits
  using Payload = BlockPayload;

  // A route task fails with kRoutingFailure + check_given_routing's code (token, offending id).
  static constexpr std::uint32_t kRoutingFailure = 16;

  // Turns a failed routing check (code from check_given_routing, token, offending id) into words.
  static std::string describe_routing(std::uint32_t code, std::uint64_t token, std::uint64_t id) {
    std::string const t = "token " + std::to_string(token);
    std::string const e = std::to_string(static_cast<std::int32_t>(id));
    if (code == 1) return t + " names expert " + e + ", outside [-1, experts)";
    if (code == 2) return t + " names expert " + e + " twice";
    return t + " has a non-finite weight for expert " + e;
  }
  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    return describe_routing(code - kRoutingFailure, a, b);
  }

  // Route task p.block: part p.block % route_parts of route group p.block / route_parts, which
  // covers token blocks [group * route_blocks, ...). A group of one part routes its blocks whole,
  // and a task of whole groups routes those of its route_rounds groups that hold tokens of the
  // call (for_each_group). With the caller's routing the parts of a spread group need none of
  // one another's logits: each checks and counts its share of the group's blocks (part_share).
  static void host(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const group = p.block / v.route_parts, part = p.block % v.route_parts;
    if (v.route_parts > 1 && v.call[1] == 0) {
      route_part_host(v, group, part, ctx);
    } else if (v.route_parts > 1) {
      if (group_holds_tokens(v, group)) {
        Share const s = part_share(v, group, part);
        route_host(v, s.first, s.count, ctx);
      }
    } else {
      for_each_route_group(v, group, [&](std::uint32_t g) {
        route_host(v, g * v.route_blocks, v.route_blocks, ctx);
        return !ctx.failed();
      });
    }
    if (v.route_gathers) gather_after_routes_host(v, p.block, ctx);
  }

  // Whether route group `group` holds tokens of this call.
  LOOM_HD static bool group_holds_tokens(MoEView const& v, std::uint32_t group) {
    return group * v.route_blocks * v.token_block < v.call[0];
  }

  // Routes token blocks [first, first + blocks) (those within this call's tokens).
  static void route_host(MoEView const& v, std::uint32_t first, std::uint32_t blocks,
                         TaskContext& ctx) {
    route_blocks_host(v, first, blocks, ctx, [&](std::uint32_t t, float* out) {
      for (std::uint32_t e = 0; e < v.experts; ++e)
        out[e] = in_segment_order(v, [&](std::uint32_t s) { return slice_dot_host(v, t, e, s); });
    });
  }

  // Blocks [first, first + blocks) that exist, each with logits_of(token, out); stops at the
  // first failed routing check.
  template <class Logits>
  static void route_blocks_host(MoEView const& v, std::uint32_t first, std::uint32_t blocks,
                                TaskContext& ctx, Logits const& logits_of) {
    for (std::uint32_t block = first; block < first + blocks && block < v.max_blocks; ++block)
      if (!route_block_host(v, block, ctx, logits_of)) return;
  }

  // One part of a spread group: its slices' dot products for the group's tokens, then the pick.
  // Where the route tasks gather (each has a processor of its own), every part waits for the
  // others and routes its share of the group's blocks (part_share); elsewhere the last part to
  // finish routes them all. Either way the logits are summed in the order route_host adds them.
  static void route_part_host(MoEView const& v, std::uint32_t group, std::uint32_t part,
                              TaskContext& ctx) {
    std::uint32_t const tokens = v.call[0], first = group * v.route_blocks;
    std::uint32_t const t0 = first * v.token_block;
    if (t0 >= tokens) return;
    std::uint32_t const t1 = std::min(t0 + v.route_blocks * v.token_block, tokens);
    std::uint32_t const s0 = part * v.route_part_slices;
    std::uint32_t const s1 = std::min(s0 + v.route_part_slices, v.route_slices);
    for (std::uint32_t t = t0; t < t1; ++t)
      for (std::uint32_t s = s0; s < s1; ++s)
        for (std::uint32_t e = 0; e < v.experts; ++e)
          v.route_partial[partial_index(v, s, t, e)] = slice_dot_host(v, t, e, s);
    bool const last = fetch_add_acq_rel(v.route_arrived[group], 1u) + 1 == v.route_parts;
    Share blocks{first, v.route_blocks};
    if (v.route_gathers) {
      if (!last && !wait_for_parts(v, group, part, ctx)) return;
      blocks = part_share(v, group, part);
    } else if (last) {
      store_relaxed(v.route_arrived[group], 0u);
    } else {
      return;
    }
    route_blocks_host(v, blocks.first, blocks.count, ctx, [&](std::uint32_t t, float* out) {
      for (std::uint32_t e = 0; e < v.experts; ++e) out[e] = sum_slices(v, t, e);
    });
  }

  // The token blocks part `part` of spread group `group` routes when the parts wait for one
  // another, or with the caller's routing: its share (share_of) of the group's blocks that hold
  // tokens of this call (group_holds_tokens).
  LOOM_HD static Share part_share(MoEView const& v, std::uint32_t group, std::uint32_t part) {
    std::uint32_t const first = group * v.route_blocks, t0 = first * v.token_block;
    std::uint32_t const left = (v.call[0] - t0 + v.token_block - 1) / v.token_block;
    Share const s = share_of(left < v.route_blocks ? left : v.route_blocks, v.route_parts, part);
    return {first + s.first, s.count};
  }

  // Route task p.block of spread group `group`'s part `part`, waiting (bounded) until every part
  // of the group has stored its slices. False when the wait ended on an error.
  LOOM_HD static bool wait_for_parts(MoEView const& v, std::uint32_t group, std::uint32_t part,
                                     TaskContext& ctx) {
    return wait_for_siblings(v.route_arrived[group], v.route_parts, group * v.route_parts + part,
                             ctx);
  }

  LOOM_HD static std::size_t partial_index(MoEView const& v, std::uint32_t s, std::uint32_t t,
                                           std::uint32_t e) {
    return (std::size_t{s} * v.max_tokens + t) * v.experts + e;
  }

  // A logit from its slices' dot products slice(s), summed in segment order (view.hpp).
  template <class Slice>
  LOOM_HD static float in_segment_order(MoEView const& v, Slice const& slice) {
    float logit = 0.0f;
    for (std::uint32_t q = 0; q < v.route_segments; ++q) {
      float segment = 0.0f;
      for (std::uint32_t s = segment_first_slice(v, q); s < segment_first_slice(v, q + 1); ++s)
        segment += slice(s);
      logit = q == 0 ? segment : logit + segment;
    }
    return logit;
  }

  // The logit of (token t, expert e) from the slices spread parts wrote (host; the device sums
  // them in sum_parts, in the same order).
  static float sum_slices(MoEView const& v, std::uint32_t t, std::uint32_t e) {
    return in_segment_order(
        v, [&](std::uint32_t s) { return v.route_partial[partial_index(v, s, t, e)]; });
  }

  static float slice_dot_host(MoEView const& v, std::uint32_t t, std::uint32_t e, std::uint32_t s) {
    bf16 const* x = v.x + std::size_t{t} * v.hidden;
    bf16 const* w = v.router_w + std::size_t{e} * v.hidden;
    float acc = 0.0f;
    for (std::uint32_t c = slice_first_chunk(s) * 32; c < slice_end_chunk(v, s) * 32; ++c)
      acc += __bfloat162float(x[c]) * __bfloat162float(w[c]);
    return acc;
  }

  template <class Logits>
  static bool route_block_host(MoEView const& v, std::uint32_t block, TaskContext& ctx,
                               Logits const& logits_of) {
    std::uint32_t const tokens = v.call[0];
    std::uint32_t const t0 = block * v.token_block;
    if (t0 >= tokens) return true;  // beyond this call's tokens: plan gives the slack back
    std::uint32_t const t1 = t0 + v.token_block < tokens ? t0 + v.token_block : tokens;
    float logits[kMaxExperts];
    std::uint32_t const cb = call_block(v);  // divides token_block: the block holds whole ones
    std::uint32_t pairs = 0;
    for (std::uint32_t t = t0; t < t1; ++t) {
      std::int32_t* ids = v.topk_ids + std::size_t{t} * v.top_k;
      if (v.call[1] == 0) {
        logits_of(t, logits);
        score_logits(logits, v.experts, v.score);
        select_top_k(logits, v.experts, v.top_k, v.renormalize, ids,
                     v.topk_weights + std::size_t{t} * v.top_k);
      } else {
        std::int32_t offender = 0;
        if (std::uint32_t const bad = check_given_routing(v, t, offender)) {
          ctx.fail(kRoutingFailure + bad, t, static_cast<std::uint64_t>(offender));
          return false;
        }
      }
      for (std::uint32_t j = 0; j < v.top_k; ++j) {
        if (ids[j] < 0) continue;
        std::uint32_t const ticket = fetch_add_acq_rel(v.counts[ids[j]], 1u);
        if (v.pair_ticket) v.pair_ticket[std::size_t{t} * v.top_k + j] = ticket;
        ++pairs;
      }
      if ((t + 1) % cb != 0 && t + 1 != t1) continue;  // the call block goes on
      v.block_pairs[t / cb] = pairs;
      if (pairs == 0) emit_combine(v, t / cb, ctx);
      pairs = 0;
    }
    return true;
  }

  // The combine of call block `block`.
  LOOM_HD static void emit_combine(MoEView const& v, std::uint32_t block, TaskContext& ctx) {
    ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
  }

  // Route segments for `warps` warps, within kRouteSplitColumns partial columns: the split of K
  // that gives the busiest warp the least of the router to stream. A warp takes
  // ceil(tiles x k / warps) items of 1/k of K each, so 8 tiles on 12 warps split K in 3 (each warp
  // streams 2/3 of a tile's share), where 1 or 2 leave the busiest warp a whole share.
  LOOM_HD static std::uint32_t split_of(std::uint32_t experts, std::uint32_t warps) {
    std::uint32_t const ntiles = (experts + 7) / 8;
    std::uint32_t const by_space = kRouteSplitColumns / (ntiles * 8);
    std::uint32_t best = 1;
    for (std::uint32_t k = 2; k <= by_space; ++k) {
      // items(k) / k < items(best) / best, in integers
      std::uint32_t const items = (ntiles * k + warps - 1) / warps;
      std::uint32_t const best_items = (ntiles * best + warps - 1) / warps;
      if (items * best < best_items * k) best = k;
    }
    return best;
  }

#if defined(__CUDACC__)
  // Logits on the tensor cores: the block's token rows (the chunks [c_lo, c_hi) it needs) are
  // staged in shared memory, rows padded by kRouteRowPad bytes, and a warp computes an m16n8
  // tile of dot products per 16 tokens for 8 experts over one router slice with
  // mma.m16n8k16, its router fragments loaded straight from global memory (one 16-byte load per
  // lane per 32 columns, a slice's kRouteSliceChunks loads in flight, through L2 only: the
  // processor block's L1 is nearly all shared memory). Slices are summed in the order of
  // view.hpp whoever computes them, so the logits depend neither on timing nor on the spread.
  //
  // Fragment layout: lane (g = lane / 4, c = lane % 4) loads columns 8c .. 8c+7 of a 32-column
  // chunk, of router row g and of token rows g and g + 8. The two k16 steps of the chunk take
  // columns {8c..8c+3} and {8c+4..8c+7}: a permutation of K applied to both operands alike,
  // which leaves each dot product's terms unchanged.
  static_assert(kRouteSliceChunks <= kRouterLoads, "a slice is one batch of router loads");

  struct StagedRows {
    unsigned char* xs;
    std::uint32_t stride;      // bytes per staged row
    std::uint32_t c_lo;        // first chunk staged
    std::uint32_t n, mtiles;   // tokens, and m16 tiles over them (1 or 2)
    std::uint32_t xrow[2][2];  // this lane's bytes in rows g and g + 8 of each m-tile
  };

  __device__ static StagedRows stage_rows(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                          std::uint32_t c_lo, std::uint32_t c_hi,
                                          unsigned char* xs) {
    StagedRows r;
    r.xs = xs;
    r.stride = (c_hi - c_lo) * 64 + kRouteRowPad;
    r.c_lo = c_lo;
    r.n = n;
    r.mtiles = (n + 15) / 16;
    std::uint32_t const row_chunks = (c_hi - c_lo) * 4, staged = n * row_chunks;  // 16-byte chunks
    uint4 const* const src = reinterpret_cast<uint4 const*>(v.x + std::size_t{t0} * v.hidden);
    std::uint32_t const src_stride = v.hidden / 8;
    for (std::uint32_t i0 = threadIdx.x; i0 < staged; i0 += kStageLoads * blockDim.x) {
      uint4 w[kStageLoads];
#pragma unroll
      for (std::uint32_t u = 0; u < kStageLoads; ++u) {
        std::uint32_t const i = i0 + u * blockDim.x < staged ? i0 + u * blockDim.x : staged - 1;
        std::uint32_t const row = i / row_chunks;
        w[u] = __ldcg(src + row * src_stride + c_lo * 4 + (i - row * row_chunks));
      }
#pragma unroll
      for (std::uint32_t u = 0; u < kStageLoads; ++u) {
        std::uint32_t const i = i0 + u * blockDim.x;
        if (i < staged)
          *reinterpret_cast<uint4*>(xs + (i / row_chunks) * r.stride + (i % row_chunks) * 16) =
              w[u];
      }
    }
    // Rows past n repeat row n - 1 (their sums are never stored) so that no load leaves the
    // staged rows.
    std::uint32_t const g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt)
#pragma unroll
      for (std::uint32_t h = 0; h < 2; ++h) {
        std::uint32_t const row = mt * 16 + g + 8 * h;
        r.xrow[mt][h] = (row < n ? row : n - 1) * r.stride + c * 16;
      }
    return r;
  }

  // acc[j] = the dot products of router slice s for expert tile nt0 + j, j < G (this lane's
  // fragments), from zero; each staged-row fragment is read from shared memory once for the G
  // tiles. Every router load is unconditional, so that they go out together: a tile row past the
  // experts reads row 0 (its products are never stored), and a chunk past the slice its last
  // (never multiplied). Warp-uniform.
  template <std::uint32_t G>
  __device__ static void slice_mma(MoEView const& v, StagedRows const& x, std::uint32_t nt0,
                                   std::uint32_t s, float (&acc)[G][2][4]) {
    std::uint32_t const lane = threadIdx.x % 32, experts = v.experts, hidden = v.hidden;
    std::uint32_t const first = slice_first_chunk(s), span = slice_end_chunk(v, s) - first;
    uint4 w[G][kRouteSliceChunks];
#pragma unroll
    for (std::uint32_t j = 0; j < G; ++j) {
      std::uint32_t const e = (nt0 + j) * 8 + lane / 4;
      uint4 const* const wrow =
          reinterpret_cast<uint4 const*>(v.router_w + std::size_t{e < experts ? e : 0} * hidden) +
          lane % 4;
#pragma unroll
      for (std::uint32_t u = 0; u < kRouteSliceChunks; ++u)
        w[j][u] = __ldcg(wrow + 4 * (first + (u < span ? u : span - 1)));
#pragma unroll
      for (std::uint32_t mt = 0; mt < 2; ++mt)
#pragma unroll
        for (std::uint32_t i = 0; i < 4; ++i) acc[j][mt][i] = 0.0f;
    }
#pragma unroll
    for (std::uint32_t u = 0; u < kRouteSliceChunks; ++u) {
      if (u >= span) break;
      unsigned char const* const x0 = x.xs + (first + u - x.c_lo) * 64;
#pragma unroll
      for (std::uint32_t mt = 0; mt < 2; ++mt) {
        if (mt >= x.mtiles) break;
        uint4 const lo = *reinterpret_cast<uint4 const*>(x0 + x.xrow[mt][0]);
        uint4 const hi = *reinterpret_cast<uint4 const*>(x0 + x.xrow[mt][1]);
        std::uint32_t const a0[4] = {lo.x, hi.x, lo.y, hi.y};
        std::uint32_t const a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (std::uint32_t j = 0; j < G; ++j) {
          tasks::gemm::ptx::mma_m16n8k16_bf16(acc[j][mt], a0, w[j][u].x, w[j][u].y);
          tasks::gemm::ptx::mma_m16n8k16_bf16(acc[j][mt], a1, w[j][u].z, w[j][u].w);
        }
      }
    }
  }

  // Stores a warp's m16n8 tiles (rows g and g + 8 of each m-tile, experts nt * 8 + 2c and + 1)
  // at out[row * row_stride + expert].
  __device__ static void store_tile(float const (&acc)[2][4], std::uint32_t nt, std::uint32_t n,
                                    std::uint32_t experts, float* out, std::size_t row_stride) {
    std::uint32_t const lane = threadIdx.x % 32, g = lane / 4, col = nt * 8 + 2 * (lane % 4);
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt)
#pragma unroll
      for (std::uint32_t h = 0; h < 2; ++h) {
        std::uint32_t const row = mt * 16 + g + 8 * h;
        if (row >= n) continue;
        if (col < experts) out[row * row_stride + col] = acc[mt][2 * h];
        if (col + 1 < experts) out[row * row_stride + col + 1] = acc[mt][2 * h + 1];
      }
  }

  // Warp `warp` of `warps` takes items (G consecutive expert tiles, segment): it sums the
  // segment's slices in registers and stores each tile's sums at partial[segment].
  template <std::uint32_t G>
  __device__ static void tile_items(MoEView const& v, StagedRows const& x, std::uint32_t n,
                                    float* partial, std::uint32_t warp, std::uint32_t warps) {
    std::uint32_t const experts = v.experts, ntiles = (experts + 7) / 8;
    std::uint32_t const groups = (ntiles + G - 1) / G, segments = v.route_segments;
    for (std::uint32_t item = warp; item < groups * segments; item += warps) {
      std::uint32_t const nt0 = item % groups * G, q = item / groups;
      float segment[G][2][4] = {};
      for (std::uint32_t s = segment_first_slice(v, q); s < segment_first_slice(v, q + 1); ++s) {
        float dot[G][2][4];
        slice_mma<G>(v, x, nt0, s, dot);
#pragma unroll
        for (std::uint32_t j = 0; j < G; ++j)
#pragma unroll
          for (std::uint32_t mt = 0; mt < 2; ++mt)
#pragma unroll
            for (std::uint32_t i = 0; i < 4; ++i) segment[j][mt][i] += dot[j][mt][i];
      }
#pragma unroll
      for (std::uint32_t j = 0; j < G; ++j)
        if (nt0 + j < ntiles)
          store_tile(segment[j], nt0 + j, n, experts, partial + std::size_t{q} * n * experts,
                     experts);
    }
  }

  // The logits of tokens [t0, t0 + n) into logits[n][experts], the whole router in one task.
  // Warps take (expert tile, segment) items, sum the segment's slices in registers and store the
  // segment's sums at partial[segment]; the segments are then added in order into segment 0.
  __device__ static void router_logits(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                       float* partial, unsigned char* xs) {
    StagedRows const x = stage_rows(v, t0, n, 0, v.hidden / 32, xs);
    __syncthreads();
    std::uint32_t const warp = threadIdx.x / 32, warps = blockDim.x / 32;
    std::uint32_t const experts = v.experts, ntiles = (experts + 7) / 8;
    std::uint32_t const segments = v.route_segments;
    // With more (tile, segment) items than warps, a warp takes two tiles of a segment at once.
    if (ntiles >= 4 && ntiles * segments > warps)
      tile_items<2>(v, x, n, partial, warp, warps);
    else
      tile_items<1>(v, x, n, partial, warp, warps);
    __syncthreads();
    for (std::uint32_t i = threadIdx.x; segments > 1 && i < n * experts; i += blockDim.x) {
      float sum = partial[i];
      for (std::uint32_t q = 1; q < segments; ++q) sum += partial[std::size_t{q} * n * experts + i];
      partial[i] = sum;
    }
  }

  // One part of a spread group: the dot products of its slices for tokens [t0, t0 + n), to
  // route_partial (the token rows staged at xs).
  __device__ static void store_part_slices(MoEView const& v, std::uint32_t part, std::uint32_t t0,
                                           std::uint32_t n, unsigned char* xs) {
    std::uint32_t const s0 = part * v.route_part_slices;
    std::uint32_t const s1 = min(s0 + v.route_part_slices, v.route_slices);
    StagedRows const x =
        stage_rows(v, t0, n, slice_first_chunk(s0), slice_end_chunk(v, s1 - 1), xs);
    __syncthreads();
    std::uint32_t const warp = threadIdx.x / 32, warps = blockDim.x / 32;
    std::uint32_t const experts = v.experts, ntiles = (experts + 7) / 8;
    for (std::uint32_t item = warp; item < ntiles * (s1 - s0); item += warps) {
      std::uint32_t const nt = item % ntiles, s = s0 + item / ntiles;
      float dot[1][2][4];
      slice_mma<1>(v, x, nt, s, dot);
      store_tile(dot[0], nt, n, experts, v.route_partial + partial_index(v, s, t0, 0), experts);
    }
  }

  // A part that picks: logits[n][experts] of tokens [t0, t0 + n) from every slice's dot products,
  // added in the order of in_segment_order. Rounds of as many slices as fit in `scratch` (the rest
  // of the task's shared memory) are copied with all loads in flight, then each thread adds them
  // for its outputs, keeping the open segment's sum in scratch. (Summing straight from memory, each
  // output's slices came one round trip after another.)
  __device__ static void sum_parts(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                   float* logits, unsigned char* scratch_bytes) {
    std::uint32_t const outputs = n * v.experts;
    float* const segment = reinterpret_cast<float*>(scratch_bytes);
    float* const staged = segment + (outputs + 3) / 4 * 4;
    std::size_t const room =
        kRouteSharedBytes -
        (reinterpret_cast<unsigned char*>(staged) - reinterpret_cast<unsigned char*>(logits)) - 16;
    std::uint32_t const per_round = max(1u, static_cast<std::uint32_t>(room / (outputs * 4u)));
    std::size_t const slice_stride = std::size_t{v.max_tokens} * v.experts;
    float const* const first = v.route_partial + partial_index(v, 0, t0, 0);
    // The view's fields in registers: the shared-memory stores below could otherwise alias them.
    std::uint32_t const slices = v.route_slices, segments = v.route_segments;
    bool const by_16 = v.experts % 4 == 0;
    auto const segment_first = [&](std::uint32_t i) {
      return segment_first_slice(slices, segments, i);
    };
    // Each slice's place in its segment, once: bit 0 opens a segment, bit 1 closes it, bit 2
    // closes segment 0.
    __shared__ std::uint8_t role[kMaxRouteSlices];
    for (std::uint32_t s = threadIdx.x; s < slices; s += blockDim.x) {
      std::uint32_t q = 0;
      while (s >= segment_first(q + 1)) ++q;
      role[s] =
          static_cast<std::uint8_t>((s == segment_first(q) ? 1 : 0) |
                                    (s + 1 == segment_first(q + 1) ? 2 : 0) | (q == 0 ? 4 : 0));
    }
    for (std::uint32_t s0 = 0; s0 < slices; s0 += per_round) {
      std::uint32_t const count = min(per_round, slices - s0);
      if (by_16)  // rows of float4: each slice's block is 16-byte aligned
        copy_slices(reinterpret_cast<float4*>(staged),
                    reinterpret_cast<float4 const*>(first + s0 * slice_stride), count, outputs / 4,
                    slice_stride / 4);
      else
        copy_slices(staged, first + s0 * slice_stride, count, outputs, slice_stride);
      __syncthreads();
      // Per output, the round's slices in order with the open segment's sum and the logit in
      // registers (a value left open at the end of a round waits in `segment`).
      for (std::uint32_t i = threadIdx.x; i < outputs; i += blockDim.x) {
        float open = segment[i], logit = logits[i];
        for (std::uint32_t s = s0; s < s0 + count; ++s) {
          std::uint32_t const r = role[s];
          float const sum = ((r & 1) ? 0.0f : open) + staged[(s - s0) * outputs + i];
          if (!(r & 2))
            open = sum;
          else
            logit = (r & 4) ? sum : logit + sum;
        }
        segment[i] = open;
        logits[i] = logit;
      }
      __syncthreads();
    }
  }

  // `count` blocks of `each` elements, `stride` apart in memory, to dst back to back, through L2
  // (other parts wrote them in this launch). 16-byte elements go by cp.async.cg, all in flight
  // at once; loads into registers came back a few at a time (ptxas stored each before the next
  // load). Other elements go through registers.
  template <class T>
  __device__ static void copy_slices(T* dst, T const* src, std::uint32_t count, std::uint32_t each,
                                     std::size_t stride) {
    std::uint32_t const total = count * each;
    for (std::uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
      std::uint32_t const b = i / each;
      T const* const from = src + b * stride + (i - b * each);
      if constexpr (sizeof(T) == 16)
        __pipeline_memcpy_async(dst + i, from, 16);
      else
        dst[i] = __ldcg(from);
    }
    if constexpr (sizeof(T) == 16) {
      __pipeline_commit();
      __pipeline_wait_prior(0);
    }
  }

  // A score's rank in select_top_k's order as an unsigned key, larger first: a number (scores
  // are >= 0: softmax or sigmoid) its bits + 2, NaN 1; 0 is left for none. Among equal keys the
  // lower id ranks first.
  __device__ static std::uint32_t rank_key(float score) {
    return score != score ? 1u : __float_as_uint(score) + 2u;
  }

  // score_logits and select_top_k for one token by one warp (the same order of picks; the
  // softmax sum is added in another order): each lane scores experts lane, lane + 32, ... of the
  // row in shared memory, then k rounds of a warp arg-max. Lane j keeps pick j and writes it,
  // counts it and returns it (-1 past the picks); the renormalising sum is lane 0's, in pick
  // order. (Picks kept in per-lane arrays went to local memory, and lane 0 counted them one
  // atomic after another. One thread per token, with the lanes of a warp on different tokens,
  // took longer still.)
  __device__ static std::int32_t select_warp(MoEView const& v, float* row, std::uint32_t token,
                                             std::int32_t* ids, float* weights) {
    // The view's fields in registers: the stores below could otherwise alias them.
    std::uint32_t const lane = threadIdx.x % 32, experts = v.experts, top_k = v.top_k;
    bool const renormalize = v.renormalize;
    if (v.score == RouterScore::sigmoid) {
      for (std::uint32_t e = lane; e < experts; e += 32) row[e] = 1.0f / (1.0f + expf(-row[e]));
    } else {
      float max = row[0];
      for (std::uint32_t e = lane; e < experts; e += 32) max = fmaxf(max, row[e]);
      for (int offset = 16; offset > 0; offset /= 2)
        max = fmaxf(max, __shfl_xor_sync(0xFFFFFFFFu, max, offset));
      float sum = 0.0f;
      for (std::uint32_t e = lane; e < experts; e += 32) sum += (row[e] = expf(row[e] - max));
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
      for (std::uint32_t e = lane; e < experts; e += 32) row[e] /= sum;
    }
    // k rounds of a warp arg-max over keys in select_top_k's order (rank_key). Lane l owns
    // experts l, l + 32, ...; bit m of `taken` marks expert l + 32m as picked.
    std::uint32_t taken = 0;
    std::int32_t mine = -1;  // lane j: pick j
    float mine_score = 0.0f;
    for (std::uint32_t j = 0; j < top_k; ++j) {
      std::uint32_t best_key = 0, best = ~0u;
      for (std::uint32_t m = 0, e = lane; e < experts; ++m, e += 32) {
        std::uint32_t const key = (taken >> m) & 1u ? 0u : rank_key(row[e]);
        if (key > best_key) best_key = key, best = e;
      }
      std::uint32_t const top = __reduce_max_sync(0xFFFFFFFFu, best_key);
      std::uint32_t const id = __reduce_min_sync(0xFFFFFFFFu, best_key == top ? best : ~0u);
      if (top == 0) break;  // nothing left to pick
      if (id % 32 == lane) taken |= 1u << (id / 32);
      if (lane == j) mine = static_cast<std::int32_t>(id), mine_score = row[id];
    }
    float sum = 0.0f;
    if (renormalize)
      for (std::uint32_t j = 0; j < top_k; ++j) sum += __shfl_sync(0xFFFFFFFFu, mine_score, j);
    if (lane < top_k) {
      ids[lane] = mine;
      weights[lane] = renormalize ? mine_score / sum : mine_score;
      if (mine >= 0) count_pair(v, mine, token * top_k + lane);
    }
    return mine;
  }

  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const group = p.block / v.route_parts, part = p.block % v.route_parts;
    if (v.route_parts > 1 && v.call[1] == 0) {
      route_part_device(v, group, part, ctx);
    } else if (v.route_parts > 1) {
      if (group_holds_tokens(v, group)) {
        Share const s = part_share(v, group, part);
        route_device(v, s.first, s.count, ctx);
      }
    } else {
      for_each_route_group(v, group, [&](std::uint32_t g) {
        // The previous group's shared memory is free. The block stops together once the launch
        // has failed: each thread reads the error word itself, and another block may raise it
        // between two threads' reads.
        if (g != group && __syncthreads_or(ctx.failed())) return false;
        route_device(v, g * v.route_blocks, v.route_blocks, ctx);
        return true;
      });
    }
    if (v.route_gathers) gather_after_routes_device(v, p.block, ctx);
  }

  // Counts pair `pair` (token * top_k + slot) routed to expert e; where the route tasks gather,
  // keeps its ticket among the expert's pairs (the count before it) as its place in the pool.
  __device__ static void count_pair(MoEView const& v, std::int32_t e, std::uint32_t pair) {
    if (v.pair_ticket)
      v.pair_ticket[pair] = atomicAdd(&v.counts[e], 1u);
    else
      atomicAdd(&v.counts[e], 1u);
  }

  // Routes token blocks [first, first + blocks), at most kRouteTileTokens tokens (those within
  // this call's tokens), the whole router in this task. Whole block.
  __device__ static void route_device(MoEView const& v, std::uint32_t first, std::uint32_t blocks,
                                      TaskContext& ctx) {
    std::uint32_t const tokens = v.call[0];
    std::uint32_t const t0 = first * v.token_block;
    if (t0 >= tokens) return;
    std::uint32_t const n = min(tokens - t0, blocks * v.token_block);
    auto* const smem = static_cast<unsigned char*>(ctx.shared_memory());
    // [segment][n][experts] partial logits (segment 0: the logits), then the staged token rows.
    float* const logits = reinterpret_cast<float*>(smem);
    std::size_t const logit_bytes = std::size_t{v.route_segments} * n * v.experts * sizeof(float);
    bool const given = v.call[1] != 0;
    if (!given && v.route_ops)
      tile_logits(v, t0, n, logits);
    else if (!given)
      router_logits(v, t0, n, logits, smem + (logit_bytes + 15) / 16 * 16);
    pick_experts(v, t0, n, logits, ctx);
  }

  // The logits of tokens [t0, t0 + n), n <= kRouteTileTokens, into logits[n][experts] (shared
  // memory), from route_logits, where this group's RouteTile wrote them (it completed before this
  // task started). Whole block.
  __device__ static void tile_logits(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                     float* logits) {
    std::uint32_t const experts = v.experts, columns = route_columns(experts);
    float const* const from = v.route_logits + std::size_t{t0} * columns;
    for (std::uint32_t i = threadIdx.x; i < n * experts; i += blockDim.x) {
      std::uint32_t const t = i / experts;
      logits[i] = __ldcg(from + t * columns + (i - t * experts));
    }
    __syncthreads();
  }

  // A part of a spread group (route_parts > 1, fused router): its slices, then, as
  // route_part_host, the pick of its share of the group's blocks (route tasks that gather) or, in
  // the last part to finish, of them all.
  __device__ static void route_part_device(MoEView const& v, std::uint32_t group,
                                           std::uint32_t part, TaskContext& ctx) {
    std::uint32_t const tokens = v.call[0], first = group * v.route_blocks;
    std::uint32_t const t0 = first * v.token_block;
    if (t0 >= tokens) return;
    auto* const smem = static_cast<unsigned char*>(ctx.shared_memory());
    store_part_slices(v, part, t0, min(tokens - t0, v.route_blocks * v.token_block), smem);
    __shared__ bool pick;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      bool const last = fetch_add_acq_rel(v.route_arrived[group], 1u) + 1 == v.route_parts;
      if (v.route_gathers)
        pick = last || wait_for_parts(v, group, part, ctx);
      else if ((pick = last))
        store_relaxed(v.route_arrived[group], 0u);
    }
    __syncthreads();
    if (!pick) return;
    Share const blocks =
        v.route_gathers ? part_share(v, group, part) : Share{first, v.route_blocks};
    if (blocks.count == 0) return;
    std::uint32_t const p0 = blocks.first * v.token_block;
    std::uint32_t const n = min(tokens - p0, blocks.count * v.token_block);
    float* const logits = reinterpret_cast<float*>(smem);  // [n][experts], then scratch
    std::size_t const logit_bytes = std::size_t{n} * v.experts * sizeof(float);
    sum_parts(v, p0, n, logits, smem + (logit_bytes + 15) / 16 * 16);
    pick_experts(v, p0, n, logits, ctx);
  }

  // Lanes a token takes when a warp checks the caller's routing: top_k rounded up to a power of
  // two, so that a warp takes 32 / slot_lanes tokens at once.
  __device__ static std::uint32_t slot_lanes(std::uint32_t top_k) {
    static_assert(kMaxTopK <= 32);
    std::uint32_t lanes = 1;
    while (lanes < top_k) lanes *= 2;
    return lanes;
  }

  // The caller's routing of tokens t0 + [t, t + 32 / slot_lanes) that are below t0 + n, checked
  // and counted by one warp: lane l takes slot l % slot_lanes of token t + l / slot_lanes, so
  // the slots' loads and the counts' atomics of all those tokens go out together. A token's
  // verdict is check_given_routing's: the first failing slot in top-k order, with that slot's
  // reason (recorded, and `failed` set); a failed token counts nothing. Each token's routed pairs
  // are added to pairs[its call block]. Whole warp.
  __device__ static void check_and_count_given_warp(MoEView const& v, std::uint32_t t0,
                                                    std::uint32_t t, std::uint32_t n,
                                                    std::uint32_t* pairs, TaskContext& ctx,
                                                    bool& failed) {
    std::uint32_t const lane = threadIdx.x % 32, lanes = slot_lanes(v.top_k);
    std::uint32_t const j = lane % lanes, mine = t + lane / lanes, token = t0 + mine;
    unsigned const token_lanes = (lanes == 32 ? ~0u : (1u << lanes) - 1u) << (lane - j);
    bool const slot = j < v.top_k && mine < n;
    std::int32_t id = -1;
    float w = 0.0f;
    if (slot) {
      id = v.topk_ids[std::size_t{token} * v.top_k + j];
      w = v.topk_weights[std::size_t{token} * v.top_k + j];
    }
    bool const outside = slot && (id < -1 || id >= static_cast<std::int32_t>(v.experts));
    bool const routed = slot && !outside && id >= 0;
    // Routed slots of one token with the same expert match; every other lane gets a key of its
    // own (experts < 2^16).
    int const key =
        routed ? static_cast<int>(lane / lanes) << 16 | id : -2 - static_cast<int>(lane);
    unsigned const same = __match_any_sync(0xFFFFFFFFu, key);
    bool const repeated = routed && (same & ((1u << lane) - 1u)) != 0;
    bool const non_finite = routed && !repeated && !(w == w && w <= 3.0e38f && w >= -3.0e38f);
    std::uint32_t const code = outside ? 1u : repeated ? 2u : non_finite ? 3u : 0u;
    unsigned const bad = __ballot_sync(0xFFFFFFFFu, code != 0) & token_lanes;
    if (bad != 0 && lane == static_cast<unsigned>(__ffs(bad) - 1)) {
      ctx.fail(kRoutingFailure + code, token, static_cast<std::uint64_t>(id));
      failed = true;
    }
    bool const counted = routed && bad == 0;
    if (counted) count_pair(v, id, token * v.top_k + j);
    unsigned const routed_here = __popc(__ballot_sync(0xFFFFFFFFu, counted) & token_lanes);
    if (j == 0 && routed_here != 0) atomicAdd(&pairs[mine / call_block(v)], routed_here);
  }

  // Tokens [t0, t0 + n) of this call, n <= kRouteTileTokens, t0 at a token block's start: top-k
  // from logits[n][experts] (fused router) or the caller's routing checked; then the expert
  // counts, each call block's pair count, and the combine of a call block with no pair. Whole
  // block.
  __device__ static void pick_experts(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                      float* logits, TaskContext& ctx) {
    static_assert(kMaxRouteBlocks >= kRouteTileTokens);  // call blocks of one token or more
    std::uint32_t const cb = call_block(v), blocks = (n + cb - 1) / cb;
    __shared__ std::uint32_t pairs[kMaxRouteBlocks];  // per call block
    __shared__ bool failed;
    for (std::uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) pairs[b] = 0;
    if (threadIdx.x == 0) failed = false;
    bool const given = v.call[1] != 0;
    __syncthreads();
    std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (given) {
      std::uint32_t const per_warp = 32 / slot_lanes(v.top_k);
      for (std::uint32_t t = warp * per_warp; t < n; t += warps * per_warp)
        check_and_count_given_warp(v, t0, t, n, pairs, ctx, failed);
    }
    for (std::uint32_t t = warp; !given && t < n; t += warps) {
      std::uint32_t const token = t0 + t;
      std::int32_t* ids = v.topk_ids + std::size_t{token} * v.top_k;
      float* weights = v.topk_weights + std::size_t{token} * v.top_k;
      std::int32_t const picked = select_warp(v, logits + t * v.experts, token, ids, weights);
      std::uint32_t const routed = __popc(__ballot_sync(0xFFFFFFFFu, picked >= 0));
      if (lane == 0) atomicAdd(&pairs[t / cb], routed);
    }
    __syncthreads();
    if (failed) return;
    for (std::uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) {
      v.block_pairs[t0 / cb + b] = pairs[b];
      if (pairs[b] == 0) emit_combine(v, t0 / cb + b, ctx);
    }
  }
#endif
};

// The router on the tensor cores: route group `block`'s tokens times the router as one GEMM tile
// (tasks/gemm_tile.hpp, fp32 into route_logits), ahead of that group's route task, which scores
// the logits and picks the experts. A task type of its own, whose body is the tile alone, as the
// expert tiles' are: inlined in a body that also routes, ptxas reported the kernel's wgmma
// serialized (C7510). On a call with the caller's routing, and on the CPU executor (whose route
// computes the logits itself), it does nothing.
struct RouteTile {
  static constexpr char const* name = "moe_route_tile";
  // Its own instantiation of the GEMM task: sharing the up-projection's, ptxas reported the
  // kernel's wgmma serialized (C7510).
  struct LogitSink : tasks::gemm::LocalTileSink {};
  using RouterGemm = tasks::GemmTileTask<LogitSink, false, false>;
  static constexpr unsigned threads = RouterGemm::threads;
  static constexpr unsigned shared_bytes = RouterGemm::shared_bytes;
  using Payload = BlockPayload;

  static std::string describe_failure(std::uint32_t code, std::uint64_t a, std::uint64_t b) {
    return RouterGemm::describe_failure(code, a, b);
  }

  static void host(Payload const&, TaskContext&) {}
#if defined(__CUDACC__)
  // The call's words rewrote the tile's tensor map of x (LayerBuffers::enqueue_call): each thread
  // orders its TMA reads of the map after those writes before the tile runs. Whole block.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const tokens = v.call[0], t0 = p.block * v.route_blocks * v.token_block;
    if (v.call[1] != 0 || !v.route_ops || t0 >= tokens) return;
    tasks::gemm::GemmOperands const* const ops = v.route_ops;
    tasks::gemm::ptx::fence_tensormap_acquire(&ops->a_map);
    typename RouterGemm::Payload g{};
    g.ops = ops;
    g.a_row0 = t0;
    g.c_row0 = t0;
    g.rows = static_cast<std::uint16_t>(min(tokens - t0, v.route_blocks * v.token_block));
    RouterGemm::device(g, ctx);
  }
#endif
};

}  // namespace loom::moe
