// Route: for each token of a few token blocks (route_blocks of them), the top-k experts and their
// weights (fused router: x·Wgᵀ, scored; or the caller's routing, checked), then the per-expert
// pair counts and each block's pair count. A block with no routed pair emits its combine at once
// (its tokens' outputs are 0).
#pragma once

#include <string>

#include "moe/routing.hpp"
#include "moe/view.hpp"
#include "runtime/context.hpp"
#include "tasks/gemm/ptx/mma_sync.cuh"

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

  // Turns a failed routing check (code from check_given_routing, token, offending id) into words.
  static std::string describe_failure(std::uint32_t code, std::uint64_t token, std::uint64_t id) {
    std::string const t = "token " + std::to_string(token);
    std::string const e = std::to_string(static_cast<std::int32_t>(id));
    if (code == 1) return t + " names expert " + e + ", outside [-1, experts)";
    if (code == 2) return t + " names expert " + e + " twice";
    return t + " has a non-finite weight for expert " + e;
  }

  // Route task p.block covers token blocks [p.block * route_blocks, ...).
  static void host(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    route_host(v, p.block * v.route_blocks, v.route_blocks, ctx);
  }

  // Routes token blocks [first, first + blocks) (those within this call's tokens).
  static void route_host(MoEView const& v, std::uint32_t first, std::uint32_t blocks,
                         TaskContext& ctx) {
    for (std::uint32_t block = first; block < first + blocks && block < v.max_blocks; ++block)
      if (!route_block_host(v, block, ctx)) return;
  }

  static bool route_block_host(MoEView const& v, std::uint32_t block, TaskContext& ctx) {
    std::uint32_t const tokens = v.call[0];
    std::uint32_t const t0 = block * v.token_block;
    if (t0 >= tokens) return true;  // beyond this call's tokens: plan gives the slack back
    std::uint32_t const t1 = t0 + v.token_block < tokens ? t0 + v.token_block : tokens;
    float logits[kMaxExperts];
    std::uint32_t pairs = 0;
    for (std::uint32_t t = t0; t < t1; ++t) {
      std::int32_t* ids = v.topk_ids + std::size_t{t} * v.top_k;
      if (v.call[1] == 0) {
        for (std::uint32_t e = 0; e < v.experts; ++e) {
          float acc = 0.0f;
          for (std::uint32_t c = 0; c < v.hidden; ++c)
            acc += __bfloat162float(v.x[std::size_t{t} * v.hidden + c]) *
                   __bfloat162float(v.router_w[std::size_t{e} * v.hidden + c]);
          logits[e] = acc;
        }
        score_logits(logits, v.experts, v.score);
        select_top_k(logits, v.experts, v.top_k, v.renormalize, ids,
                     v.topk_weights + std::size_t{t} * v.top_k);
      } else {
        std::int32_t offender = 0;
        if (std::uint32_t const bad = check_given_routing(v, t, offender)) {
          ctx.fail(bad, t, static_cast<std::uint64_t>(offender));
          return false;
        }
      }
      for (std::uint32_t j = 0; j < v.top_k; ++j) {
        if (ids[j] < 0) continue;
        fetch_add_acq_rel(v.counts[ids[j]], 1u);
        ++pairs;
      }
    }
    v.block_pairs[block] = pairs;
    if (pairs == 0) emit_combine(v, block, ctx);
    return true;
  }

  LOOM_HD static void emit_combine(MoEView const& v, std::uint32_t block, TaskContext& ctx) {
    ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
  }

#if defined(__CUDACC__)
  // Logits on the tensor cores: the block's token rows are staged in shared memory (rows padded
  // by kRouteRowPad bytes), and each warp computes an m16n8 tile of logits per 16 tokens for 8
  // experts over a range of K with mma.m16n8k16, its router fragments loaded straight from
  // global memory (one 16-byte load per lane per 32 columns, kRouterLoads of them in flight,
  // through L2 only: the processor block's L1 is nearly all shared memory).
  // The warps split K when there are fewer 8-expert tiles than warps; the partial sums are
  // added in split order, so the logits do not depend on timing. One warp per token then
  // scores and picks the top k (select_warp).
  //
  // Fragment layout: lane (g = lane / 4, c = lane % 4) loads columns 8c .. 8c+7 of a 32-column
  // chunk, of router row g and of token rows g and g + 8. The two k16 steps of the chunk take
  // columns {8c..8c+3} and {8c+4..8c+7}: a permutation of K applied to both operands alike,
  // which leaves each dot product's terms unchanged.
  __device__ static void router_logits(MoEView const& v, std::uint32_t t0, std::uint32_t n,
                                       float* partial, unsigned char* xs) {
    std::uint32_t const hidden = v.hidden, experts = v.experts;
    std::uint32_t const stride = hidden * 2 + kRouteRowPad;  // bytes per staged row
    bf16 const* __restrict__ const router_w = v.router_w;
    uint4 const* src = reinterpret_cast<uint4 const*>(v.x + std::size_t{t0} * hidden);
    std::uint32_t const row_chunks = hidden / 8, staged = n * row_chunks;
    for (std::uint32_t i0 = threadIdx.x; i0 < staged; i0 += kStageLoads * blockDim.x) {
      uint4 r[kStageLoads];
#pragma unroll
      for (std::uint32_t u = 0; u < kStageLoads; ++u)
        if (i0 + u * blockDim.x < staged) r[u] = __ldcg(src + i0 + u * blockDim.x);
#pragma unroll
      for (std::uint32_t u = 0; u < kStageLoads; ++u) {
        std::uint32_t const i = i0 + u * blockDim.x;
        if (i < staged)
          *reinterpret_cast<uint4*>(xs + (i / row_chunks) * stride + (i % row_chunks) * 16) = r[u];
      }
    }
    __syncthreads();

    std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    std::uint32_t const g = lane / 4, c = lane % 4;
    std::uint32_t const ntiles = (experts + 7) / 8;
    std::uint32_t const ksplit = split_of(experts, warps);
    std::uint32_t const chunks = hidden / 32;
    std::uint32_t const per_split = (chunks + ksplit - 1) / ksplit;
    std::uint32_t const mtiles = (n + 15) / 16;  // 1 or 2
    // This lane's bytes in token rows g and g + 8 of each m-tile. Rows past n repeat row n - 1
    // (their sums are never stored) so that no load leaves the staged rows.
    std::uint32_t xrow[2][2];
#pragma unroll
    for (std::uint32_t mt = 0; mt < 2; ++mt)
#pragma unroll
      for (std::uint32_t h = 0; h < 2; ++h) {
        std::uint32_t const row = mt * 16 + g + 8 * h;
        xrow[mt][h] = (row < n ? row : n - 1) * stride + c * 16;
      }
    std::uint32_t const items = ntiles * ksplit;
    for (std::uint32_t item = warp; item < items; item += warps) {
      std::uint32_t const nt = item % ntiles, ks = item / ntiles;
      std::uint32_t const e = nt * 8 + g;
      std::uint32_t const c_begin = ks * per_split;
      std::uint32_t const c_end = c_begin + per_split < chunks ? c_begin + per_split : chunks;
      std::uint32_t const span = c_end > c_begin ? c_end - c_begin : 0;
      uint4 const* const wrow =
          reinterpret_cast<uint4 const*>(router_w + std::size_t{e < experts ? e : 0} * hidden) + c;
      float acc[2][4] = {};
      for (std::uint32_t j0 = 0; j0 < span; j0 += kRouterLoads) {
        uint4 w[kRouterLoads];
        std::uint32_t chunk[kRouterLoads];
#pragma unroll
        for (std::uint32_t u = 0; u < kRouterLoads; ++u) {
          chunk[u] = c_begin + j0 + u;
          w[u] = e < experts && j0 + u < span ? __ldcg(wrow + 4 * chunk[u]) : uint4{};
        }
#pragma unroll
        for (std::uint32_t u = 0; u < kRouterLoads; ++u) {
          if (j0 + u >= span) break;  // warp-uniform
#pragma unroll
          for (std::uint32_t mt = 0; mt < 2; ++mt) {
            if (mt >= mtiles) break;
            unsigned char const* const x0 = xs + chunk[u] * 64;
            uint4 const lo = *reinterpret_cast<uint4 const*>(x0 + xrow[mt][0]);
            uint4 const hi = *reinterpret_cast<uint4 const*>(x0 + xrow[mt][1]);
            std::uint32_t const a0[4] = {lo.x, hi.x, lo.y, hi.y};
            std::uint32_t const a1[4] = {lo.z, hi.z, lo.w, hi.w};
            tasks::gemm::ptx::mma_m16n8k16_bf16(acc[mt], a0, w[u].x, w[u].y);
            tasks::gemm::ptx::mma_m16n8k16_bf16(acc[mt], a1, w[u].z, w[u].w);
          }
        }
      }
      // Lane (g, c) holds rows g and g + 8 of each m-tile, experts nt * 8 + 2c and + 1.
      float* const out = partial + std::size_t{ks} * n * experts;
      std::uint32_t const col = nt * 8 + 2 * c;
#pragma unroll
      for (std::uint32_t mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (std::uint32_t h = 0; h < 2; ++h) {
          std::uint32_t const row = mt * 16 + g + 8 * h;
          if (mt >= mtiles || row >= n) continue;
          if (col < experts) out[row * experts + col] = acc[mt][2 * h];
          if (col + 1 < experts) out[row * experts + col + 1] = acc[mt][2 * h + 1];
        }
      }
    }
    __syncthreads();
    if (ksplit > 1) {
      for (std::uint32_t i = threadIdx.x; i < n * experts; i += blockDim.x) {
        float sum = partial[i];
        for (std::uint32_t ks = 1; ks < ksplit; ++ks) sum += partial[std::size_t{ks} * n * experts + i];
        partial[i] = sum;
      }
    }
  }

  // True when (a, ia) ranks before (b, ib) in select_top_k's order: a real id before none, a
  // number before NaN, the larger score first, the lower id among equals.
  __device__ static bool ranks_before(float a, std::int32_t ia, float b, std::int32_t ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    bool const na = a != a, nb = b != b;
    if (na != nb) return nb;
    if (!na && a != b) return a > b;
    return ia < ib;
  }

  // score_logits and select_top_k for one token by one warp (the same order of picks; the
  // softmax sum is added in another order): each lane scores experts lane, lane + 32, ... of the
  // row in shared memory, then k rounds of a warp arg-max. Lane 0 writes ids and weights. (One
  // thread per token would take most of the route task: k passes over E scores, each checking
  // its candidates against the picks so far.)
  __device__ static void select_warp(MoEView const& v, float* row, std::int32_t* ids,
                                     float* weights) {
    std::uint32_t const lane = threadIdx.x % 32, experts = v.experts;
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
    std::int32_t picked[kMaxTopK];
    float picked_score[kMaxTopK];
#pragma unroll
    for (std::uint32_t j = 0; j < kMaxTopK; ++j) {
      if (j >= v.top_k) break;
      std::int32_t best = -1;
      float best_score = 0.0f;
      for (std::uint32_t e = lane; e < experts; e += 32) {
        bool taken = false;
#pragma unroll
        for (std::uint32_t i = 0; i < kMaxTopK; ++i)
          taken |= i < j && picked[i] == static_cast<std::int32_t>(e);
        if (!taken && ranks_before(row[e], static_cast<std::int32_t>(e), best_score, best)) {
          best = static_cast<std::int32_t>(e);
          best_score = row[e];
        }
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        std::int32_t const other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
        float const other_score = __shfl_xor_sync(0xFFFFFFFFu, best_score, offset);
        if (ranks_before(other_score, other, best_score, best)) {
          best = other;
          best_score = other_score;
        }
      }
      picked[j] = best;
      picked_score[j] = best_score;
    }
    if (lane != 0) return;
    float sum = 0.0f;
    if (v.renormalize)
      for (std::uint32_t j = 0; j < v.top_k; ++j) sum += picked_score[j];
    for (std::uint32_t j = 0; j < v.top_k; ++j) {
      ids[j] = picked[j];
      weights[j] = v.renormalize ? picked_score[j] / sum : picked_score[j];
    }
  }

  // K-splits of the router for `warps` warps, within kRouteSplitColumns partial columns: the
  // split that gives the busiest warp the least of the router to stream. A warp takes
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

  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    route_device(v, p.block * v.route_blocks, v.route_blocks, ctx);
  }

  // Routes token blocks [first, first + blocks), at most kMaxTokenBlock tokens (those within
  // this call's tokens). Whole block.
  __device__ static void route_device(MoEView const& v, std::uint32_t first, std::uint32_t blocks,
                                      TaskContext& ctx) {
    std::uint32_t const tokens = v.call[0], token_block = v.token_block;
    std::uint32_t const t0 = first * token_block;
    if (t0 >= tokens) return;
    std::uint32_t const span = blocks * token_block;
    std::uint32_t const n = tokens - t0 < span ? tokens - t0 : span;
    auto* const smem = static_cast<unsigned char*>(ctx.shared_memory());
    // [split][n][experts] partial logits (split 0: the logits), then the staged token rows.
    float* const logits = reinterpret_cast<float*>(smem);
    std::size_t const logit_bytes =
        std::size_t{split_of(v.experts, blockDim.x / 32)} * n * v.experts * sizeof(float);
    unsigned char* const xs = smem + (logit_bytes + 15) / 16 * 16;
    __shared__ std::uint32_t pairs[kMaxTokenBlock];  // per token block
    __shared__ bool failed;
    for (std::uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) pairs[b] = 0;
    if (threadIdx.x == 0) failed = false;
    bool const given = v.call[1] != 0;
    if (!given) router_logits(v, t0, n, logits, xs);
    __syncthreads();
    std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    std::uint32_t* const counts = v.counts;
    for (std::uint32_t t = warp; t < n; t += blockDim.x / 32) {
      std::uint32_t const token = t0 + t;
      std::int32_t* ids = v.topk_ids + std::size_t{token} * v.top_k;
      float* weights = v.topk_weights + std::size_t{token} * v.top_k;
      if (!given) select_warp(v, logits + t * v.experts, ids, weights);
      __syncwarp();
      if (lane != 0) continue;
      if (given) {
        std::int32_t offender = 0;
        if (std::uint32_t const bad = check_given_routing(v, token, offender)) {
          ctx.fail(bad, token, static_cast<std::uint64_t>(offender));
          failed = true;
          continue;
        }
      }
      std::uint32_t routed = 0;
      for (std::uint32_t j = 0; j < v.top_k; ++j) {
        if (ids[j] < 0) continue;
        atomicAdd(&counts[ids[j]], 1u);
        ++routed;
      }
      atomicAdd(&pairs[t / token_block], routed);
    }
    __syncthreads();
    if (failed) return;
    for (std::uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) {
      std::uint32_t const block = first + b;
      if (block * token_block >= tokens) break;
      v.block_pairs[block] = pairs[b];
      if (pairs[b] == 0) emit_combine(v, block, ctx);
    }
  }
#endif
};

// Plan: offsets and M-tiles per expert from this call's counts; lowers the counters route and
// gather raise; gives back the part of the dynamic bound this call will not use.
struct PlanExperts {
  static constexpr char const* name = "moe_plan";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = kMaxExperts * sizeof(std::uint32_t);  // device: counts
  struct Payload {
    MoEView const* view;
  };

  LOOM_HD static void plan(MoEView const& v, TaskContext& ctx) {
    std::uint32_t rows = 0, tiles = 0;
    for (std::uint32_t e = 0; e < v.experts; ++e) {
      std::uint32_t const c = load_relaxed(v.counts[e]);
      v.expert_tokens[e] = c;
      v.offsets[e] = rows;
      v.tile_base[e] = tiles;
      rows += c;
      tiles += (c + v.tile_rows - 1) / v.tile_rows;
      v.counts[e] = 0;
      v.fill[e] = 0;
    }
    v.offsets[v.experts] = rows;
    v.tile_base[v.experts] = tiles;
    std::uint32_t const active_blocks = (v.call[0] + v.token_block - 1) / v.token_block;
    ctx.retire((v.max_mtiles - tiles) * (v.up_tiles + v.down_tiles) +
               (v.max_blocks - active_blocks));
  }

  static void host(Payload const& p, TaskContext& ctx) { plan(*p.view, ctx); }
#if defined(__CUDACC__)
  // The same plan, with the counts read by the whole block at once and the offsets summed in
  // shared memory (one thread, no memory round trip per expert).
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    auto* const count = static_cast<std::uint32_t*>(ctx.shared_memory());  // [experts]
    __shared__ std::uint32_t tiles;
    for (std::uint32_t e = threadIdx.x; e < v.experts; e += blockDim.x)
      count[e] = load_relaxed(v.counts[e]);
    __syncthreads();
    if (threadIdx.x == 0) {
      // The view's fields in registers: the stores below could otherwise alias them, and each
      // expert would wait for a reload.
      std::uint32_t* const offsets = v.offsets;
      std::uint32_t* const tile_base = v.tile_base;
      std::uint32_t const experts = v.experts, tile_rows = v.tile_rows;
      std::uint32_t rows = 0, t = 0;
      for (std::uint32_t e = 0; e < experts; ++e) {
        offsets[e] = rows;
        tile_base[e] = t;
        rows += count[e];
        t += (count[e] + tile_rows - 1) / tile_rows;
      }
      offsets[experts] = rows;
      tile_base[experts] = t;
      tiles = t;
    }
    std::uint32_t* const expert_tokens = v.expert_tokens;
    std::uint32_t* const counts = v.counts;
    std::uint32_t* const fill = v.fill;
    for (std::uint32_t e = threadIdx.x; e < v.experts; e += blockDim.x) {
      expert_tokens[e] = count[e];
      counts[e] = 0;
      fill[e] = 0;
    }
    __threadfence();  // before thread 0's arrival releases the gathers that claim from fill
    __syncthreads();
    if (threadIdx.x == 0) {
      std::uint32_t const active_blocks = (v.call[0] + v.token_block - 1) / v.token_block;
      ctx.retire((v.max_mtiles - tiles) * (v.up_tiles + v.down_tiles) +
                 (v.max_blocks - active_blocks));
    }
  }
#endif
};

}  // namespace loom::moe
