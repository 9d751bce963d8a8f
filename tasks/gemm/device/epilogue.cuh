// Device epilogue of the GEMM task, common to the wgmma and mma.sync paths (both give a warp the
// same m16n8 fragment layout, ptx/wgmma.cuh).
//
// finish_fragments finishes each thread's accumulators where they are (bias, activation, row
// scale, conversion; SwiGLU pairs a gate chunk with the up chunk the same thread holds) and
// stores the finished values into a row-major staging tile in shared memory.
//
// Split-K first sums the raw accumulators in registers: every split stores its fragments to its
// workspace partial in the fragments' own order and counts itself in (publish_partial); the split
// that arrives last adds the others' partials into its accumulators in split order
// (add_partials) and finishes them like an unsplit tile.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>

#include <type_traits>

#include "runtime/atomic.hpp"
#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/epilogue_math.hpp"
#include "tasks/gemm/ptx/smem.cuh"
#include "tasks/gemm/ptx/sync.cuh"
#include "tasks/gemm/ptx/tma.cuh"

namespace loom::tasks::gemm::impl {

inline constexpr std::uint32_t kEpilogueBarrier = 1;  // named barrier of the consumer threads
// Named barrier of the whole block: the consumers have given back the registers they borrowed.
inline constexpr std::uint32_t kRegisterBarrier = 3;

// Two floats as bf16 (round to nearest even), the first in the low half.
__device__ LOOM_INLINE std::uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 const h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t const*>(&h);
}

// Bytes between the rows of a tile finished by finish_fragments: its output columns plus 16 (32
// for fp32), so that the 8 rows a warp's fragment store touches start in different banks.
__device__ LOOM_INLINE std::uint32_t finished_row_stride(GemmOperands const& op) {
  return op.out_tile_cols() * op.out_bytes() + (op.output == OutputType::fp32 ? 32u : 16u);
}

// Two finished values at column `col` of the staged row at shared address `row`.
__device__ LOOM_INLINE void store_pair(std::uint32_t row, std::uint32_t col, float x, float y,
                                       bool bf16_out) {
  if (bf16_out)
    ptx::st_shared_b32(row + 2u * col, pack_bf16x2(x, y));
  else
    ptx::st_shared_v2_f32(row + 4u * col, x, y);
}

// The two bias values of B columns col, col + 1 (zero past the matrix's n columns).
__device__ LOOM_INLINE float2 bias_pair(float const* bias, std::uint32_t col,
                                        std::uint32_t bias_cols) {
  if (!bias || col >= bias_cols) return make_float2(0.0f, 0.0f);
  return __ldg(reinterpret_cast<float2 const*>(bias + col));
}

// A thread's finished values without split-K (bias, activation, row scale), one chunk of 8
// output columns of its warp's 16 x WN fragment at a time. A thread holds rows lane/4 and
// lane/4 + 8 of the fragment and columns 8 j + 2 (lane % 4) + {0, 1} of B chunk j: acc[4j],
// acc[4j+1] on the first row, acc[4j+2], acc[4j+3] on the second. Output chunk o is B chunk o,
// or for SwiGLU gate chunk 2o with up chunk 2o + 1 (same thread). Rows past the valid count are
// finished too (never delivered), but their row scale is not read.
template <int WN, GemmActivation kAct>
struct FragmentFinisher {
  static constexpr int kChunks = kAct == GemmActivation::swiglu ? WN / 16 : WN / 8;
  // The warp's first output column (of the tile's output columns).
  __device__ LOOM_INLINE static std::uint32_t out_col_base(WarpTile const& wt) {
    return kAct == GemmActivation::swiglu ? wt.col_base / 2u : wt.col_base;
  }
  // The row scales of the thread's two rows (1 without row_scale or past the valid rows).
  __device__ LOOM_INLINE static float2 scales(GemmOperands const& op, TileJob const& job,
                                              WarpTile const& wt, unsigned lane) {
    std::uint32_t const row_lo = wt.row_base + lane / 4u, row_hi = row_lo + 8u;
    float2 s = make_float2(1.0f, 1.0f);
    if (float const* const row_scale = op.row_scale) {
      if (row_lo < job.rows) s.x = row_scale[job.a_row0 + row_lo];
      if (row_hi < job.rows) s.y = row_scale[job.a_row0 + row_hi];
    }
    return s;
  }
  // Chunk o: store(h, x, y) with the values of the first row (h = 0), then of the second (h = 1),
  // at output columns out_col_base + 8 o + pair + {0, 1} (pair = 2 (lane % 4)). `bias` points at
  // the tile's first B column (or is null).
  template <class Store>
  __device__ LOOM_INLINE static void chunk(float const (&acc)[WN / 2], int o, float const* bias,
                                           std::uint32_t bias_cols, std::uint32_t col_base,
                                           std::uint32_t pair, float2 scale, Store const& store) {
    if constexpr (kAct == GemmActivation::swiglu) {
      std::uint32_t const gate_col = col_base + 16u * o + pair;
      float2 const gb = bias_pair(bias, gate_col, bias_cols);
      float2 const ub = bias_pair(bias, gate_col + 8u, bias_cols);
      float const* const g = acc + 8 * o;
      store(0, fast::swiglu(g[0] + gb.x, g[4] + ub.x) * scale.x,
            fast::swiglu(g[1] + gb.y, g[5] + ub.y) * scale.x);
      store(1, fast::swiglu(g[2] + gb.x, g[6] + ub.x) * scale.y,
            fast::swiglu(g[3] + gb.y, g[7] + ub.y) * scale.y);
    } else {
      float2 const b = bias_pair(bias, col_base + 8u * o + pair, bias_cols);
      float const* const c = acc + 4 * o;
      store(0, fast::activate(kAct, c[0] + b.x) * scale.x,
            fast::activate(kAct, c[1] + b.y) * scale.x);
      store(1, fast::activate(kAct, c[2] + b.x) * scale.y,
            fast::activate(kAct, c[3] + b.y) * scale.y);
    }
  }
};

// The tile's bias at its first B column, or null.
__device__ LOOM_INLINE float const* tile_bias(GemmOperands const& op, TileJob const& job) {
  return op.bias ? op.bias + std::size_t{job.expert} * op.n + job.n0 : nullptr;
}

// No split-K, one consumer warp, after a consumer barrier (the stage area is free): its 16 x WN
// fragment, finished in registers, into the staging tile at shared address `staging`, row stride
// finished_row_stride(op).
template <int WN, GemmActivation kAct>
__device__ LOOM_INLINE void finish_fragments(float const (&acc)[WN / 2], GemmOperands const& op,
                                             TileJob const& job, WarpTile const& wt, unsigned lane,
                                             std::uint32_t staging) {
  using Finisher = FragmentFinisher<WN, kAct>;
  std::uint32_t const stride = finished_row_stride(op);
  std::uint32_t const pair = 2u * (lane % 4u);
  float2 const scale = Finisher::scales(op, job, wt, lane);
  float const* const bias = tile_bias(op, job);
  std::uint32_t const bias_cols = op.n - job.n0;
  bool const bf16_out = op.output == OutputType::bf16;
  std::uint32_t const lo = staging + (wt.row_base + lane / 4u) * stride, hi = lo + 8u * stride;
  std::uint32_t const col0 = Finisher::out_col_base(wt) + pair;
#pragma unroll
  for (int o = 0; o < Finisher::kChunks; ++o)
    Finisher::chunk(acc, o, bias, bias_cols, wt.col_base, pair, scale,
                    [&](int h, float x, float y) {
                      store_pair(h == 0 ? lo : hi, col0 + 8u * o, x, y, bf16_out);
                    });
}

// f(std::integral_constant<GemmActivation, act>{}): the run-time activation as a template
// argument, so that each epilogue compiles its formulas once per activation.
template <class F>
__device__ LOOM_INLINE void with_activation(GemmActivation act, F const& f) {
  switch (act) {
    case GemmActivation::swiglu:
      return f(std::integral_constant<GemmActivation, GemmActivation::swiglu>{});
    case GemmActivation::relu:
      return f(std::integral_constant<GemmActivation, GemmActivation::relu>{});
    case GemmActivation::gelu_tanh:
      return f(std::integral_constant<GemmActivation, GemmActivation::gelu_tanh>{});
    default:
      return f(std::integral_constant<GemmActivation, GemmActivation::none>{});
  }
}

template <int WN>
__device__ LOOM_INLINE void finish_fragments(float const (&acc)[WN / 2], GemmOperands const& op,
                                             TileJob const& job, WarpTile const& wt, unsigned lane,
                                             std::uint32_t staging) {
  with_activation(op.activation, [&](auto act) {
    finish_fragments<WN, decltype(act)::value>(acc, op, job, wt, lane, staging);
  });
}

// Whether a run task's tiles of this width and activation can be stored with TMA: a warpgroup's
// output columns must be whole boxes of kStoreBoxCols.
template <int WN>
__device__ LOOM_INLINE bool store_boxes_fit(GemmActivation act) {
  std::uint32_t const cols = act == GemmActivation::swiglu ? WN / 2 : WN;
  return cols % kStoreBoxCols == 0;
}

// Named barriers of consumer warpgroup 0 and 1 while they store boxes.
inline constexpr std::uint32_t kStoreBarrier = 4;

// A whole tile (all block_m rows valid, bf16 C with op.c_map) without split-K, one consumer
// warpgroup (`group_thread` 0..127), right after its K loop: its 64 rows, finished in registers,
// box by box into its two buffers at shared address `buffers` (1024-byte aligned) and from there
// to C by TMA. Thread 0 of the warpgroup issues the stores; before a buffer is written again it
// waits until the store that last used it has read it. `boxes` counts the warpgroup's boxes over
// the task (it picks the buffer); bulk_wait_all_written ends the task's stores.
//
// A box row is one 128-byte swizzle row: 16-byte chunk q of row r sits at chunk q ^ (r % 8), so
// the four lanes of each of the warp's 8 rows write to different banks.
template <int WN, GemmActivation kAct>
__device__ void store_tile_boxes(float const (&acc)[WN / 2], GemmOperands const& op,
                                 TileJob const& job, WarpTile const& wt, unsigned lane,
                                 unsigned group_thread, std::uint32_t buffers,
                                 std::uint32_t& boxes) {
  using Finisher = FragmentFinisher<WN, kAct>;
  constexpr int kBoxChunks = kStoreBoxCols / 8, kBoxes = Finisher::kChunks / kBoxChunks;
  std::uint32_t const pair = 2u * (lane % 4u);
  float2 const scale = Finisher::scales(op, job, wt, lane);
  float const* const bias = tile_bias(op, job);
  std::uint32_t const bias_cols = op.n - job.n0;
  std::uint32_t const group_row0 = wt.row_base / kStoreBoxRows * kStoreBoxRows;
  std::uint32_t const row = wt.row_base - group_row0 + lane / 4u, swizzle = lane / 4u;
  std::uint32_t const barrier = kStoreBarrier + wt.row_base / kStoreBoxRows + wt.col_base / WN;
  std::int32_t const c_row = static_cast<std::int32_t>(job.c_row0 + group_row0);
  std::int32_t const c_col =
      static_cast<std::int32_t>(job.n_tile * op.out_tile_cols() + Finisher::out_col_base(wt));
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) {
    std::uint32_t const buffer = buffers + (boxes & 1u) * kStoreBoxBytes;
    if (group_thread == 0) ptx::bulk_wait_group_read<1>();
    ptx::named_barrier_sync(barrier, 128);
    std::uint32_t const lo = buffer + row * 128u + 2u * pair;
#pragma unroll
    for (int q = 0; q < kBoxChunks; ++q) {
      std::uint32_t const at = lo + ((q ^ swizzle) * 16u);
      Finisher::chunk(acc, b * kBoxChunks + q, bias, bias_cols, wt.col_base, pair, scale,
                      [&](int h, float x, float y) {
                        ptx::st_shared_b32(at + h * 8u * 128u, pack_bf16x2(x, y));
                      });
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(barrier, 128);
    if (group_thread == 0) {
      ptx::tma_store_2d(&op.c_map, buffer, c_col + b * static_cast<std::int32_t>(kStoreBoxCols),
                        c_row);
      ptx::bulk_commit_group();
    }
    ++boxes;
  }
}

template <int WN>
__device__ LOOM_INLINE void store_tile_boxes(float const (&acc)[WN / 2], GemmOperands const& op,
                                             TileJob const& job, WarpTile const& wt, unsigned lane,
                                             unsigned group_thread, std::uint32_t buffers,
                                             std::uint32_t& boxes) {
  with_activation(op.activation, [&](auto act) {
    store_tile_boxes<WN, decltype(act)::value>(acc, op, job, wt, lane, group_thread, buffers,
                                               boxes);
  });
}

// Split-K's workspace: per slot, `splits` partials of block_m x block_n floats, each in the
// consumers' fragment order: float4 j of consumer thread t (its accumulators 4 j .. 4 j + 3) at
// vector j * kConsumerThreads + t, so that each warp's access to a vector is 512 contiguous bytes.
__device__ LOOM_INLINE float4* partial_tiles(GemmOperands const& op, TileJob const& job) {
  GemmConfig const& cfg = op.config;
  return reinterpret_cast<float4*>(op.workspace +
                                   std::size_t{job.slot} * cfg.splits * cfg.block_m * cfg.block_n);
}

// Split-K, all consumer threads: stores this split's accumulators to its partial (warps whose
// rows are all past the valid ones skip it: nobody reads those), counts the split in, and returns
// true in the split that arrives last (the counter is reset there for the next launch). `flag`:
// a shared word. Thread 0 alone releases and acquires for the tile: the barriers order every
// consumer's accesses around its own (fences are cumulative), where a fence in each thread would
// cost the tile 256 device-scope fences.
template <int WN>
__device__ LOOM_INLINE bool publish_partial(float const (&acc)[WN / 2], GemmOperands const& op,
                                            TileJob const& job, WarpTile const& wt, unsigned thread,
                                            std::uint32_t* flag) {
  constexpr int kVectors = WN / 8;
  if (wt.row_base < job.rows) {
    float4* const mine =
        partial_tiles(op, job) + std::size_t{job.split} * kVectors * kConsumerThreads + thread;
#pragma unroll
    for (int j = 0; j < kVectors; ++j)
      __stcg(mine + j * kConsumerThreads,
             make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  }
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  if (thread == 0) {
    std::uint32_t& counter = op.counters[job.slot];
    bool const last = fetch_add_release(counter, 1u) == op.config.splits - 1u;
    if (last) {
      store_relaxed(counter, 0u);
      fence_acquire();  // the other splits' partials, for every consumer past the barrier below
    }
    *flag = last ? 1u : 0u;
  }
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  return *flag != 0u;
}

// Adds x to accumulators 4 j .. 4 j + 3 (a float4 of a partial).
template <int N>
__device__ LOOM_INLINE void add_vector(float (&acc)[N], int j, float4 x) {
  acc[4 * j] += x.x, acc[4 * j + 1] += x.y, acc[4 * j + 2] += x.z, acc[4 * j + 3] += x.w;
}

// Split-K, the last split: vectors [j0, j0 + kBatch) of its accumulators become the sum of
// every split's partial, added in split order (the same bits whichever split finishes last; an
// addition of two terms is the same either way round): the splits before this one summed apart
// and added to its own, then each later one added in place.
template <int WN, int kBatch>
__device__ LOOM_INLINE void add_partial_batch(float (&acc)[WN / 2], float4 const* tiles,
                                              std::uint32_t splits, std::uint32_t split, int j0) {
  std::size_t const partial = std::size_t{WN / 8} * kConsumerThreads;
  auto const load = [&](std::uint32_t s, int b) {
    return __ldcg(tiles + s * partial + (j0 + b) * kConsumerThreads);
  };
  if (split > 0) {
    float4 sum[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) sum[b] = load(0, b);
#pragma unroll 1
    for (std::uint32_t s = 1; s < split; ++s) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        float4 const x = load(s, b);
        sum[b].x += x.x, sum[b].y += x.y, sum[b].z += x.z, sum[b].w += x.w;
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) add_vector(acc, j0 + b, sum[b]);
  }
#pragma unroll 1
  for (std::uint32_t s = split + 1; s < splits; ++s) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) add_vector(acc, j0 + b, load(s, b));
  }
}

// Split-K, the last split, after publish_partial: every vector of its accumulators. Two splits
// (the common case) add the other's partial in place, kBatch vectors' loads in flight at a time;
// more splits go through add_partial_batch, whose run-time loops over the splits hold the 128x224
// and 128x256 tiles' accumulators beside one vector at a time (any more, and ptxas spilled values
// the K loops read at 128x256).
template <int WN>
__device__ LOOM_INLINE void add_partials(float (&acc)[WN / 2], GemmOperands const& op,
                                         TileJob const& job, WarpTile const& wt, unsigned thread) {
  constexpr int kVectors = WN / 8, kBatch = kVectors % 8 == 0 ? 8 : 4;  // 4 of 224's 28
  static_assert(kVectors % kBatch == 0);
  if (wt.row_base >= job.rows) return;
  float4 const* const tiles = partial_tiles(op, job) + thread;
  std::uint32_t const splits = op.config.splits, split = job.split;
  if (splits == 2) {
    float4 const* const other = tiles + (1u - split) * std::size_t{kVectors} * kConsumerThreads;
#pragma unroll
    for (int j0 = 0; j0 < kVectors; j0 += kBatch) {
      float4 x[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) x[b] = __ldcg(other + (j0 + b) * kConsumerThreads);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) add_vector(acc, j0 + b, x[b]);
    }
    return;
  }
  constexpr int kSplitBatch = WN >= 224 ? 1 : kBatch;
#pragma unroll
  for (int j0 = 0; j0 < kVectors; j0 += kSplitBatch)
    add_partial_batch<WN, kSplitBatch>(acc, tiles, splits, split, j0);
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
