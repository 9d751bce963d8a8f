// Device epilogue of the GEMM task, common to the wgmma and mma.sync paths. Two passes, so that
// the accumulators (up to 128 registers a thread) never meet the epilogue's arithmetic:
//
//   1. stage_accumulators: each consumer warp stores its m16n8 fragments (layout in
//      ptx/wgmma.cuh) as raw fp32 into a row-major staging tile in shared memory;
//   2. finish_rows: warps sweep the tile row by row (run-time loops, 16-byte accesses): add bias,
//      apply the activation (SwiGLU pairs the 8-column gate/up blocks), scale the row, convert,
//      and write the finished row in place at the start of its staging row.
//
// Split-K: between the passes, publish_partial copies a split's raw tile to the workspace and
// counts it; the split that arrives last replaces its staged tile by the sum of all partials in
// split order (sum_partials) and runs pass 2.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>

#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/epilogue_math.hpp"
#include "tasks/gemm/ptx/sync.cuh"

namespace loom::tasks::gemm::impl {

inline constexpr std::uint32_t kEpilogueBarrier = 1;  // named barrier of the consumer threads
// Named barrier of the whole block: the consumers have given back the registers they borrowed.
inline constexpr std::uint32_t kRegisterBarrier = 3;

// Bytes between staged rows: block_n fp32 plus 16, so that the 8 rows one fragment store touches
// spread over the banks. The finished row (block_n or block_n / 2 outputs) fits at its start.
__device__ LOOM_INLINE std::uint32_t staging_row_stride(GemmConfig const& cfg) {
  return cfg.block_n * 4u + 16u;
}

// Pass 1, one consumer warp: its 16 x WN fragment as fp32 into the staging tile.
template <int WN>
__device__ LOOM_INLINE void stage_accumulators(float const (&acc)[WN / 2], GemmConfig const& cfg,
                                               WarpTile const& wt, unsigned lane,
                                               unsigned char* staging) {
  std::uint32_t const stride = staging_row_stride(cfg);
  unsigned char* const row =
      staging + (wt.row_base + lane / 4u) * stride + (wt.col_base + 2u * (lane % 4u)) * 4u;
#pragma unroll
  for (int j = 0; j < WN / 8; ++j) {
    *reinterpret_cast<float2*>(row + j * 32) = make_float2(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<float2*>(row + 8u * stride + j * 32) =
        make_float2(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// Split-K, all consumer threads after pass 1 and a consumer barrier: copies the valid rows of the
// raw tile to this split's workspace slot, counts the split in, and returns true in the split
// that arrives last (the counter is reset there for the next launch). `flag`: a shared word.
__device__ inline bool publish_partial(GemmOperands const& op, TileJob const& job,
                                       unsigned char const* staging, unsigned thread,
                                       std::uint32_t* flag) {
  GemmConfig const& cfg = op.config;
  std::uint32_t const stride = staging_row_stride(cfg), row_vectors = cfg.block_n / 4u;
  float4* const mine = reinterpret_cast<float4*>(
      op.workspace + (std::size_t{job.slot} * cfg.splits + job.split) * cfg.block_m * cfg.block_n);
  for (std::uint32_t i = thread; i < job.rows * row_vectors; i += kConsumerThreads) {
    std::uint32_t const r = i / row_vectors, v = i - r * row_vectors;
    __stcg(mine + i, *reinterpret_cast<float4 const*>(staging + r * stride + v * 16u));
  }
  __threadfence();
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  if (thread == 0) {
    std::uint32_t const before = atomicAdd(op.counters + job.slot, 1u);
    bool const last = before == cfg.splits - 1u;
    if (last) atomicExch(op.counters + job.slot, 0u);
    *flag = last ? 1u : 0u;
  }
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  bool const last = *flag != 0u;
  if (last) __threadfence();
  return last;
}

// Split-K, the last split, all consumer threads after publish_partial: the staging tile's valid
// rows become the sum of every split's partial, added in split order (the same bits whichever
// split finishes last). One flat, coalesced pass with independent 16-byte loads in flight.
__device__ inline void sum_partials(GemmOperands const& op, TileJob const& job,
                                    unsigned char* staging, unsigned thread) {
  GemmConfig const& cfg = op.config;
  std::uint32_t const stride = staging_row_stride(cfg), row_vectors = cfg.block_n / 4u;
  std::size_t const tile_vectors = std::size_t{cfg.block_m} * cfg.block_n / 4u;
  float4 const* const base = reinterpret_cast<float4 const*>(
      op.workspace + std::size_t{job.slot} * cfg.splits * cfg.block_m * cfg.block_n);
#pragma unroll 2
  for (std::uint32_t i = thread; i < job.rows * row_vectors; i += kConsumerThreads) {
    float4 sum = __ldcg(base + i);
#pragma unroll 4
    for (std::uint32_t s = 1; s < cfg.splits; ++s) {
      float4 const v = __ldcg(base + s * tile_vectors + i);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    std::uint32_t const r = i / row_vectors, v = i - r * row_vectors;
    *reinterpret_cast<float4*>(staging + r * stride + v * 16u) = sum;
  }
}

// Eight consecutive raw values of staged row r, columns c..c+7.
__device__ LOOM_INLINE void load8(float (&v)[8], GemmConfig const& cfg,
                                  unsigned char const* staging, std::uint32_t r, std::uint32_t c) {
  auto const* p = reinterpret_cast<float4 const*>(staging + r * staging_row_stride(cfg) + c * 4u);
  float4 const x = p[0], y = p[1];
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
}

// Two floats as bf16 (round to nearest even), the first in the low half.
__device__ LOOM_INLINE std::uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 const h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t const*>(&h);
}

__device__ LOOM_INLINE void add_bias8(float (&v)[8], float const* bias, std::uint32_t c,
                                      std::uint32_t bias_cols) {
  if (!bias || c >= bias_cols) return;
  float4 const x = *reinterpret_cast<float4 const*>(bias + c);
  float4 const y = *reinterpret_cast<float4 const*>(bias + c + 4);
  v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w, v[4] += y.x, v[5] += y.y, v[6] += y.z,
      v[7] += y.w;
}

// Pass 2, all consumer threads (warp = 0..7) after a consumer barrier: finishes rows
// [0, job.rows). A row's lanes each take 8 output columns (B columns 8 l.. for plain epilogues,
// gate 16 l.. and up 16 l + 8.. for SwiGLU); they read before any of them writes (__syncwarp),
// so the finished row can overwrite the start of its own staging row. Bias needs 16-byte
// alignment of bias + expert * n + n0, which n % 8 == 0 gives for a cudaMalloc'd bias.
__device__ inline void finish_rows(GemmOperands const& op, TileJob const& job,
                                   unsigned char* staging, unsigned warp, unsigned lane) {
  GemmConfig const& cfg = op.config;
  bool const swiglu = op.activation == GemmActivation::swiglu;
  std::uint32_t const stride = staging_row_stride(cfg);
  std::uint32_t const lanes_per_row = cfg.block_n / (swiglu ? 16u : 8u);  // 4 .. 32
  std::uint32_t const rows_per_pass = 32u / lanes_per_row;
  std::uint32_t const sub = lane / lanes_per_row, l = lane % lanes_per_row;
  float const* const bias = op.bias ? op.bias + std::size_t{job.expert} * op.n + job.n0 : nullptr;
  std::uint32_t const bias_cols = op.n - job.n0;
  bool const bf16_out = op.output == OutputType::bf16;
  for (std::uint32_t r0 = warp * rows_per_pass; r0 < job.rows; r0 += 8u * rows_per_pass) {
    std::uint32_t const r = r0 + sub;
    bool const live = r < job.rows;
    float out[8];
    if (live) {
      float const scale = op.row_scale ? op.row_scale[job.a_row0 + r] : 1.0f;
      if (swiglu) {
        float gate[8], up[8];
        load8(gate, cfg, staging, r, 16u * l);
        load8(up, cfg, staging, r, 16u * l + 8u);
        add_bias8(gate, bias, 16u * l, bias_cols);
        add_bias8(up, bias, 16u * l + 8u, bias_cols);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = gemm::swiglu(gate[i], up[i]) * scale;
      } else {
        load8(out, cfg, staging, r, 8u * l);
        add_bias8(out, bias, 8u * l, bias_cols);
        GemmActivation const act = op.activation;
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = activate(act, out[i]) * scale;
      }
    }
    __syncwarp();
    if (live) {
      unsigned char* const dst = staging + r * stride;
      if (bf16_out) {
        uint4 const packed = make_uint4(pack_bf16x2(out[0], out[1]), pack_bf16x2(out[2], out[3]),
                                        pack_bf16x2(out[4], out[5]), pack_bf16x2(out[6], out[7]));
        *reinterpret_cast<uint4*>(dst + l * 16u) = packed;
      } else {
        auto* const d = reinterpret_cast<float4*>(dst + l * 32u);
        d[0] = make_float4(out[0], out[1], out[2], out[3]);
        d[1] = make_float4(out[4], out[5], out[6], out[7]);
      }
    }
    __syncwarp();
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
