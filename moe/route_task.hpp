// Route: for each token of a block, the top-k experts and their weights (fused router: x·Wgᵀ,
// scored; or the caller's routing, checked), then the per-expert pair counts and the block's
// pair count. A block with no routed pair emits its combine at once (its tokens' outputs are 0).
#pragma once

#include <string>

#include "moe/routing.hpp"
#include "moe/view.hpp"
#include "runtime/context.hpp"

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

  static void host(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const tokens = v.call[0];
    std::uint32_t const t0 = p.block * v.token_block;
    if (t0 >= tokens) return;  // beyond this call's tokens: plan gives the slack back
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
          return;
        }
      }
      for (std::uint32_t j = 0; j < v.top_k; ++j) {
        if (ids[j] < 0) continue;
        fetch_add_acq_rel(v.counts[ids[j]], 1u);
        ++pairs;
      }
    }
    v.block_pairs[p.block] = pairs;
    if (pairs == 0) emit_combine(v, p.block, ctx);
  }

  LOOM_HD static void emit_combine(MoEView const& v, std::uint32_t block, TaskContext& ctx) {
    ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
  }

#if defined(__CUDACC__)
  // The block's token rows are staged in shared memory; each warp then takes one expert at a
  // time and streams its router row once (16 bytes a lane, coalesced) against every token of the
  // block, keeping one partial sum per token in registers. One lane per token then scores and
  // picks the top k.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t const tokens = v.call[0];
    std::uint32_t const t0 = p.block * v.token_block;
    if (t0 >= tokens) return;
    std::uint32_t const n = tokens - t0 < v.token_block ? tokens - t0 : v.token_block;
    std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    auto* const smem = static_cast<unsigned char*>(ctx.shared_memory());
    float* const logits = reinterpret_cast<float*>(smem);  // [n][experts]
    bf16* const xs = reinterpret_cast<bf16*>(
        smem + (std::size_t{n} * v.experts * sizeof(float) + 15) / 16 * 16);  // [n][hidden]
    __shared__ std::uint32_t pairs;
    __shared__ bool failed;
    if (threadIdx.x == 0) pairs = 0, failed = false;
    bool const given = v.call[1] != 0;
    if (!given) {
      uint4 const* src = reinterpret_cast<uint4 const*>(v.x + std::size_t{t0} * v.hidden);
      for (std::uint32_t i = threadIdx.x; i < n * v.hidden / 8; i += blockDim.x)
        reinterpret_cast<uint4*>(xs)[i] = src[i];
      __syncthreads();
      for (std::uint32_t e = warp; e < v.experts; e += warps) {
        float acc[kMaxTokenBlock];
#pragma unroll
        for (std::uint32_t t = 0; t < kMaxTokenBlock; ++t) acc[t] = 0.0f;
        bf16 const* wr = v.router_w + std::size_t{e} * v.hidden;
        for (std::uint32_t c = lane * 8; c < v.hidden; c += 256) {
          uint4 const wv = *reinterpret_cast<uint4 const*>(wr + c);
          __nv_bfloat162 const* ws = reinterpret_cast<__nv_bfloat162 const*>(&wv);
          float2 w[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) w[i] = __bfloat1622float2(ws[i]);
#pragma unroll
          for (std::uint32_t t = 0; t < kMaxTokenBlock; ++t) {
            if (t < n) {  // a predicate, not a break: acc stays in registers
              uint4 const xv =
                  *reinterpret_cast<uint4 const*>(xs + std::size_t{t} * v.hidden + c);
              __nv_bfloat162 const* xh = reinterpret_cast<__nv_bfloat162 const*>(&xv);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                float2 const a = __bfloat1622float2(xh[i]);
                acc[t] += a.x * w[i].x + a.y * w[i].y;
              }
            }
          }
        }
#pragma unroll
        for (std::uint32_t t = 0; t < kMaxTokenBlock; ++t) {
          if (t < n) {
            float s = acc[t];
            for (int offset = 16; offset > 0; offset /= 2)
              s += __shfl_xor_sync(0xFFFFFFFFu, s, offset);
            if (lane == 0) logits[t * v.experts + e] = s;
          }
        }
      }
    }
    __syncthreads();
    for (std::uint32_t t = threadIdx.x; t < n; t += blockDim.x) {
      std::uint32_t const token = t0 + t;
      std::int32_t* ids = v.topk_ids + std::size_t{token} * v.top_k;
      if (!given) {
        float* row = logits + t * v.experts;
        score_logits(row, v.experts, v.score);
        select_top_k(row, v.experts, v.top_k, v.renormalize, ids,
                     v.topk_weights + std::size_t{token} * v.top_k);
      } else {
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
        atomicAdd(&v.counts[ids[j]], 1u);
        ++routed;
      }
      atomicAdd(&pairs, routed);
    }
    __syncthreads();
    if (threadIdx.x == 0 && !failed) {
      v.block_pairs[p.block] = pairs;
      if (pairs == 0) emit_combine(v, p.block, ctx);
    }
  }
#endif
};

// Plan: offsets and M-tiles per expert from this call's counts; lowers the counters route and
// gather raise; gives back the part of the dynamic bound this call will not use.
struct PlanExperts {
  static constexpr char const* name = "moe_plan";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
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
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    if (threadIdx.x == 0) plan(*p.view, ctx);
  }
#endif
};

}  // namespace loom::moe
