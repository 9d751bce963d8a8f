// The expert GEMM tiles. Up: h = act(x_e · W1_eᵀ) for one M-tile x N-tile, the activation applied
// per expert path in the epilogue (SwiGLU pairs the gate and up columns a tile holds). Down:
// y = h · W2_eᵀ, each row written to y[slot][token] of the token it came from (one writer per
// (slot, token)). The last N-tile of an up row emits the down row; the down tile that completes a
// token block emits that block's combine.
//
// The device bodies are a plain SIMT tile GEMM over shared memory: correct at every shape the
// layer accepts; the tensor-core tile GEMM (tasks/) takes their place for speed.
#pragma once

#include "moe/expert_tile.hpp"
#include "moe/routing.hpp"

namespace loom::moe {

// W1 packing for SwiGLU: N-tile n of the packed matrix holds gate columns [32n, 32n + 32) in its
// first half and the matching up columns in its second half, so one tile emits 32 outputs.
inline constexpr std::uint32_t kSwigluHalf = kTileCols / 2;

// acc[r][c] = sum_k A[r][k] * B[c][k] for r < rows, c < kTileCols (A row-major [rows][K] with lda,
// B row-major [kTileCols][K] with ldb). Host reference of the tile product.
inline void host_tile_product(bf16 const* a, std::uint32_t lda, std::uint32_t rows, bf16 const* b,
                              std::uint32_t ldb, std::uint32_t k, float (*acc)[kTileCols]) {
  for (std::uint32_t r = 0; r < rows; ++r)
    for (std::uint32_t c = 0; c < kTileCols; ++c) {
      float s = 0.0f;
      for (std::uint32_t i = 0; i < k; ++i)
        s += __bfloat162float(a[std::size_t{r} * lda + i]) *
             __bfloat162float(b[std::size_t{c} * ldb + i]);
      acc[r][c] = s;
    }
}

LOOM_HD inline float activate(Activation act, float v) {
  return act == Activation::gelu ? gelu_tanh(v) : relu(v);
}

#if defined(__CUDACC__)
// The same product by a block of 128 threads: thread (rg, cg) = (tid / 16, tid % 16) holds rows
// 8rg .. 8rg+7 and columns cg + 16c (c < 4), so a SwiGLU gate column and its up column (32 apart)
// sit in the same thread. `smem` holds 2 x 32 x 64 floats. Rows past `rows` are read as zeros.
__device__ inline void device_tile_product(bf16 const* a, std::uint32_t lda, std::uint32_t rows,
                                           bf16 const* b, std::uint32_t ldb, std::uint32_t k,
                                           float* smem, float (&acc)[8][4]) {
  constexpr std::uint32_t kStep = 32;
  float* as = smem;                      // [kStep][64], k-major
  float* bs = smem + kStep * kTileRows;  // [kStep][64]
  std::uint32_t const tid = threadIdx.x, rg = tid / 16, cg = tid % 16;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
  for (std::uint32_t k0 = 0; k0 < k; k0 += kStep) {
    for (std::uint32_t v = tid; v < kTileRows * kStep / 8; v += blockDim.x) {
      std::uint32_t const row = v / 4, kq = (v % 4) * 8;
      uint4 av = make_uint4(0, 0, 0, 0);
      if (row < rows) av = *reinterpret_cast<uint4 const*>(a + std::size_t{row} * lda + k0 + kq);
      uint4 const bv = *reinterpret_cast<uint4 const*>(b + std::size_t{row} * ldb + k0 + kq);
      bf16 const* ae = reinterpret_cast<bf16 const*>(&av);
      bf16 const* be = reinterpret_cast<bf16 const*>(&bv);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        as[(kq + i) * kTileRows + row] = __bfloat162float(ae[i]);
        bs[(kq + i) * kTileCols + row] = __bfloat162float(be[i]);
      }
    }
    __syncthreads();
#pragma unroll 4
    for (std::uint32_t kk = 0; kk < kStep; ++kk) {
      float av[8], bv[4];
#pragma unroll
      for (int i = 0; i < 8; ++i) av[i] = as[kk * kTileRows + rg * 8 + i];
#pragma unroll
      for (int c = 0; c < 4; ++c) bv[c] = bs[kk * kTileCols + cg + 16 * c];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] += av[i] * bv[c];
    }
    __syncthreads();
  }
}
#endif

struct ExpertUp {
  static constexpr char const* name = "moe_up";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 2 * 32 * kTileCols * sizeof(float);
  using Payload = TilePayload;

  LOOM_HD static void finish(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    if (fetch_add_acq_rel(v.up_done[p.mtile], 1u) + 1 != v.up_tiles) return;
    store_relaxed(v.up_done[p.mtile], 0u);
    TilePayload down = p;
    emit_row_of_tiles(ctx, v.down_type, down, v.down_tiles);
  }

  static void host(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    static thread_local float acc[kTileRows][kTileCols];
    host_tile_product(v.pool + std::size_t{p.row0} * v.hidden, v.hidden, p.rows,
                      v.w1 + (std::size_t{p.expert} * v.up_cols + p.ntile * kTileCols) * v.hidden,
                      v.hidden, v.hidden, acc);
    for (std::uint32_t r = 0; r < p.rows; ++r) {
      bf16* out = v.h + std::size_t{p.row0 + r} * v.ffn;
      if (v.activation == Activation::swiglu) {
        for (std::uint32_t c = 0; c < kSwigluHalf; ++c)
          out[p.ntile * kSwigluHalf + c] =
              __float2bfloat16(silu(acc[r][c]) * acc[r][c + kSwigluHalf]);
      } else {
        for (std::uint32_t c = 0; c < kTileCols; ++c)
          out[p.ntile * kTileCols + c] = __float2bfloat16(activate(v.activation, acc[r][c]));
      }
    }
    finish(p, ctx);
  }

#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    float acc[8][4];
    device_tile_product(v.pool + std::size_t{p.row0} * v.hidden, v.hidden, p.rows,
                        v.w1 + (std::size_t{p.expert} * v.up_cols + p.ntile * kTileCols) * v.hidden,
                        v.hidden, v.hidden, static_cast<float*>(ctx.shared_memory()), acc);
    std::uint32_t const rg = threadIdx.x / 16, cg = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      std::uint32_t const r = rg * 8 + i;
      if (r >= p.rows) continue;
      bf16* out = v.h + std::size_t{p.row0 + r} * v.ffn;
      if (v.activation == Activation::swiglu) {
        // columns cg, cg+16 are gate; cg+32, cg+48 the matching up columns
#pragma unroll
        for (int c = 0; c < 2; ++c)
          out[p.ntile * kSwigluHalf + cg + 16 * c] =
              __float2bfloat16(silu(acc[i][c]) * acc[i][c + 2]);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          out[p.ntile * kTileCols + cg + 16 * c] =
              __float2bfloat16(activate(v.activation, acc[i][c]));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      finish(p, ctx);
    }
  }
#endif
};

struct ExpertDown {
  static constexpr char const* name = "moe_down";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 2 * 32 * kTileCols * sizeof(float);
  using Payload = TilePayload;

  // One arrival per (row, N-tile) on the row's token block, aggregated over runs of rows from the
  // same block; the arrival that completes a block emits its combine.
  LOOM_HD static void finish(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    std::uint32_t r = 0;
    while (r < p.rows) {
      std::uint32_t const block = v.row_source[p.row0 + r] / v.top_k / kTokenBlock;
      std::uint32_t n = 0;
      while (r < p.rows && v.row_source[p.row0 + r] / v.top_k / kTokenBlock == block) ++r, ++n;
      std::uint32_t const want = v.block_pairs[block] * v.down_tiles;
      if (fetch_add_acq_rel(v.block_done[block], n) + n != want) continue;
      store_relaxed(v.block_done[block], 0u);
      ctx.emit(encode_task(v.combine_type, BlockPayload{&v, block}));
    }
  }

  LOOM_HD static float* destination(MoEView const& v, std::uint32_t row) {
    std::uint32_t const source = v.row_source[row];
    std::uint32_t const t = source / v.top_k, j = source % v.top_k;
    return v.y + (std::size_t{j} * v.max_tokens + t) * v.hidden;
  }

  static void host(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    static thread_local float acc[kTileRows][kTileCols];
    host_tile_product(v.h + std::size_t{p.row0} * v.ffn, v.ffn, p.rows,
                      v.w2 + (std::size_t{p.expert} * v.hidden + p.ntile * kTileCols) * v.ffn,
                      v.ffn, v.ffn, acc);
    for (std::uint32_t r = 0; r < p.rows; ++r) {
      float* out = destination(v, p.row0 + r) + p.ntile * kTileCols;
      for (std::uint32_t c = 0; c < kTileCols; ++c) out[c] = acc[r][c];
    }
    finish(p, ctx);
  }

#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    MoEView const& v = *p.view;
    float acc[8][4];
    device_tile_product(v.h + std::size_t{p.row0} * v.ffn, v.ffn, p.rows,
                        v.w2 + (std::size_t{p.expert} * v.hidden + p.ntile * kTileCols) * v.ffn,
                        v.ffn, v.ffn, static_cast<float*>(ctx.shared_memory()), acc);
    std::uint32_t const rg = threadIdx.x / 16, cg = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      std::uint32_t const r = rg * 8 + i;
      if (r >= p.rows) continue;
      float* out = destination(v, p.row0 + r) + p.ntile * kTileCols;
#pragma unroll
      for (int c = 0; c < 4; ++c) out[cg + 16 * c] = acc[i][c];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      finish(p, ctx);
    }
  }
#endif
};

}  // namespace loom::moe
