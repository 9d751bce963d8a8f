// Device epilogue of the GEMM task, common to the wgmma and mma.sync paths (both give a warp the
// same m16n8 fragment layout, ptx/wgmma.cuh).
//
// Without split-K, finish_fragments finishes each thread's accumulators where they are (bias,
// activation, row scale, conversion; SwiGLU pairs a gate chunk with the up chunk the same thread
// holds) and stores the finished values into a row-major staging tile in shared memory.
//
// Split-K sums raw tiles first, in two passes:
//   1. stage_accumulators: each consumer warp stores its fragments as raw fp32 into the staging
//      tile; publish_partial copies a split's raw tile to the workspace and counts it; the split
//      that arrives last replaces its staged tile by the sum of all partials in split order
//      (sum_partials_bulk: bulk copies into shared memory; sum_partials on the mma.sync path);
//   2. finish_rows: warps sweep the summed tile row by row (16-byte accesses) with the same
//      formulas and write each finished row in place at the start of its staging row.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>

#include <type_traits>

#include "runtime/atomic.hpp"
#include "tasks/gemm/device/pipeline_wait.cuh"
#include "tasks/gemm/device/tile_job.cuh"
#include "tasks/gemm/epilogue_math.hpp"
#include "tasks/gemm/ptx/smem.cuh"
#include "tasks/gemm/ptx/sync.cuh"
#include "tasks/gemm/ptx/tma.cuh"

namespace loom::tasks::gemm::impl {

inline constexpr std::uint32_t kEpilogueBarrier = 1;  // named barrier of the consumer threads
// Named barrier of the whole block: the consumers have given back the registers they borrowed.
inline constexpr std::uint32_t kRegisterBarrier = 3;

// Bytes between staged rows: block_n fp32 plus 16, so that the 8 rows one fragment store touches
// spread over the banks. The finished row (block_n or block_n / 2 outputs) fits at its start.
__device__ LOOM_INLINE std::uint32_t staging_row_stride(GemmConfig const& cfg) {
  return cfg.block_n * 4u + 16u;
}

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

// Split-K pass 1, one consumer warp: its 16 x WN fragment as fp32 into the staging tile.
template <int WN>
__device__ LOOM_INLINE void stage_accumulators(float const (&acc)[WN / 2], GemmConfig const& cfg,
                                               WarpTile const& wt, unsigned lane,
                                               unsigned char* staging) {
  std::uint32_t const stride = staging_row_stride(cfg);
  std::uint32_t const row = ptx::smem_address(staging) + (wt.row_base + lane / 4u) * stride +
                            (wt.col_base + 2u * (lane % 4u)) * 4u;
#pragma unroll
  for (int j = 0; j < WN / 8; ++j) {
    ptx::st_shared_v2_f32(row + j * 32, acc[4 * j], acc[4 * j + 1]);
    ptx::st_shared_v2_f32(row + 8u * stride + j * 32, acc[4 * j + 2], acc[4 * j + 3]);
  }
}

__device__ LOOM_INLINE float4 as_float4(uint4 v) {
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                     __uint_as_float(v.w));
}
__device__ LOOM_INLINE uint4 as_uint4(float4 v) {
  return make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z),
                    __float_as_uint(v.w));
}

// The staged raw tile of split-K, through the shared window: row r at base + r * stride, block_n
// fp32 each. The consumer threads walk it by 16-byte vectors without dividing: thread t takes
// vector column t % row_vectors of rows t / row_vectors, + 256 / row_vectors, ..., where
// row_vectors = block_n / 4 = 1 << shift (16, 32 or 64). These passes run with 8 warps on the
// SM, so every instruction of a pass's loop is paid in latency.
struct RawTile {
  std::uint32_t base, stride, shift;

  __device__ LOOM_INLINE static RawTile of(GemmConfig const& cfg, unsigned char const* staging) {
    return {ptx::smem_address(staging), staging_row_stride(cfg),
            31u - static_cast<std::uint32_t>(__clz(cfg.block_n / 4u))};
  }
  __device__ LOOM_INLINE std::uint32_t at(std::uint32_t r, std::uint32_t v) const {
    return base + r * stride + v * 16u;
  }
  // f(r, v, i) for this thread's vectors of rows [0, rows); i = (r << shift) + v, the vector's
  // index in the packed layout of the workspace (block_n floats per row).
  template <class F>
  __device__ LOOM_INLINE void for_each(std::uint32_t rows, unsigned thread, F const& f) const {
    std::uint32_t const v = thread & ((1u << shift) - 1u);
    for (std::uint32_t r = thread >> shift; r < rows; r += kConsumerThreads >> shift)
      f(r, v, (r << shift) + v);
  }
};

// The workspace slot of a split-K tile: splits partials of block_m x block_n floats.
__device__ LOOM_INLINE float* partial_tiles(GemmOperands const& op, TileJob const& job) {
  GemmConfig const& cfg = op.config;
  return op.workspace + std::size_t{job.slot} * cfg.splits * cfg.block_m * cfg.block_n;
}

// Split-K, all consumer threads after pass 1 and a consumer barrier: copies the valid rows of the
// raw tile to this split's workspace slot, counts the split in, and returns true in the split
// that arrives last (the counter is reset there for the next launch). `flag`: a shared word.
// Thread 0 alone releases and acquires for the tile: the barriers order every consumer's accesses
// around its own (fences are cumulative), where a fence in each thread would cost the tile
// 256 device-scope fences.
__device__ inline bool publish_partial(GemmOperands const& op, TileJob const& job,
                                       unsigned char const* staging, unsigned thread,
                                       std::uint32_t* flag) {
  GemmConfig const cfg = op.config;
  RawTile const raw = RawTile::of(cfg, staging);
  auto* const mine = reinterpret_cast<uint4*>(partial_tiles(op, job) +
                                              std::size_t{job.split} * cfg.block_m * cfg.block_n);
  raw.for_each(job.rows, thread, [&](std::uint32_t r, std::uint32_t v, std::uint32_t i) {
    __stcg(mine + i, ptx::ld_shared_v4(raw.at(r, v)));
  });
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  if (thread == 0) {
    std::uint32_t& counter = op.counters[job.slot];
    bool const last = fetch_add_release(counter, 1u) == cfg.splits - 1u;
    if (last) {
      store_relaxed(counter, 0u);
      fence_acquire();  // the other splits' partials, for every consumer past the barrier below
    }
    *flag = last ? 1u : 0u;
  }
  ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  return *flag != 0u;
}

// Split-K, the last split, all consumer threads: rows [row0, row0 + rows) of the raw tile become
// the sum of every split's partial, added in split order (the same bits whichever split finishes
// last). Its own partial is the staged one; `other(s, i)` gives vector i (packed from row0) of
// split s's.
template <class Other>
__device__ LOOM_INLINE void add_partials(std::uint32_t splits, std::uint32_t split,
                                         RawTile const& raw, std::uint32_t row0, std::uint32_t rows,
                                         unsigned thread, Other const& other) {
  raw.for_each(rows, thread, [&](std::uint32_t r, std::uint32_t v, std::uint32_t i) {
    std::uint32_t const at = raw.at(row0 + r, v);
    float4 const own = as_float4(ptx::ld_shared_v4(at));
    float4 sum = split == 0 ? own : other(0u, i);
    for (std::uint32_t s = 1; s < splits; ++s) {
      float4 const x = s == split ? own : other(s, i);
      sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
    }
    ptx::st_shared_v4(at, as_uint4(sum));
  });
}

// Split-K, the last split on the mma.sync path, after publish_partial: the other partials read
// from the workspace by the consumer threads.
__device__ inline void sum_partials(GemmOperands const& op, TileJob const& job,
                                    unsigned char* staging, unsigned thread) {
  GemmConfig const cfg = op.config;
  std::uint32_t const tile_vectors = std::uint32_t{cfg.block_m} * cfg.block_n / 4u;
  auto const* const tiles = reinterpret_cast<float4 const*>(partial_tiles(op, job));
  add_partials(
      cfg.splits, job.split, RawTile::of(cfg, staging), 0u, job.rows, thread,
      [&](std::uint32_t s, std::uint32_t i) { return __ldcg(tiles + s * tile_vectors + i); });
}

// Split-K, the last split on the wgmma path, after publish_partial: thread 0 brings the other
// partials into `scratch` (shared memory beside the staged tile) with one bulk copy per split, as
// many rows at a time as fit, and the consumers add them from there: one round trip to L2 per
// pass instead of one per few loads. Returns false when the copies' wait failed (recorded).
__device__ inline bool sum_partials_bulk(GemmOperands const& op, TileJob const& job,
                                         unsigned char* staging, unsigned char* scratch,
                                         std::uint32_t scratch_bytes, std::uint64_t* bar,
                                         TaskContext const& ctx, unsigned thread) {
  GemmConfig const cfg = op.config;
  RawTile const raw = RawTile::of(cfg, staging);
  std::uint32_t const row_bytes = cfg.block_n * 4u, others = cfg.splits - 1u;
  std::uint32_t const pass_rows = min(job.rows, scratch_bytes / (others * row_bytes));
  std::uint32_t const loaded = ptx::smem_address(scratch), split = job.split;
  float const* const tiles = partial_tiles(op, job);
  std::uint32_t phase = 0;
  for (std::uint32_t row0 = 0; row0 < job.rows; row0 += pass_rows, phase ^= 1u) {
    std::uint32_t const rows = min(pass_rows, job.rows - row0), bytes = rows * row_bytes;
    if (thread == 0) {
      // The partials were stored by other blocks (generic proxy) and acquired by publish_partial.
      ptx::fence_proxy_async_global();
      ptx::mbarrier_arrive_expect_tx(bar, others * bytes);
      for (std::uint32_t s = 0, into = 0; s < cfg.splits; ++s) {
        if (s == split) continue;
        ptx::bulk_load(scratch + into++ * bytes,
                       tiles + (std::size_t{s} * cfg.block_m + row0) * cfg.block_n, bytes, bar);
      }
    }
    if (!wait_barrier(bar, phase, ctx, kPartialsBarrier)) return false;
    add_partials(cfg.splits, split, raw, row0, rows, thread, [&](std::uint32_t s, std::uint32_t i) {
      return as_float4(ptx::ld_shared_v4(loaded + (s < split ? s : s - 1u) * bytes + i * 16u));
    });
    // Every thread's reads of the scratch come before the next pass's copies overwrite it.
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  }
  return true;
}

// Eight consecutive raw values at shared address `addr`.
__device__ LOOM_INLINE void load8(float (&v)[8], std::uint32_t addr) {
  float4 const x = as_float4(ptx::ld_shared_v4(addr)), y = as_float4(ptx::ld_shared_v4(addr + 16u));
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
}

__device__ LOOM_INLINE void add_bias8(float (&v)[8], float const* bias, std::uint32_t c,
                                      std::uint32_t bias_cols) {
  if (!bias || c >= bias_cols) return;
  float4 const x = *reinterpret_cast<float4 const*>(bias + c);
  float4 const y = *reinterpret_cast<float4 const*>(bias + c + 4);
  v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w, v[4] += y.x, v[5] += y.y, v[6] += y.z,
      v[7] += y.w;
}

// Split-K pass 2, all consumer threads (warp = 0..7) after a consumer barrier: finishes rows
// [0, job.rows). A row's lanes each take 8 output columns (B columns 8 l.. for plain epilogues,
// gate 16 l.. and up 16 l + 8.. for SwiGLU); they read before any of them writes (__syncwarp),
// so the finished row can overwrite the start of its own staging row. Bias needs 16-byte
// alignment of bias + expert * n + n0, which n % 8 == 0 gives for a cudaMalloc'd bias.
__device__ inline void finish_rows(GemmOperands const& op, TileJob const& job,
                                   unsigned char* staging, unsigned warp, unsigned lane) {
  // The operand fields in registers before the loop, which runs on 8 warps.
  GemmConfig const cfg = op.config;
  GemmActivation const act = op.activation;
  float const* const row_scale = op.row_scale;
  bool const swiglu = act == GemmActivation::swiglu;
  std::uint32_t const stride = staging_row_stride(cfg), base = ptx::smem_address(staging);
  std::uint32_t const lanes_per_row = cfg.block_n / (swiglu ? 16u : 8u);  // 4 .. 32
  std::uint32_t const rows_per_pass = 32u / lanes_per_row;
  std::uint32_t const sub = lane / lanes_per_row, l = lane % lanes_per_row;
  float const* const bias = tile_bias(op, job);
  std::uint32_t const bias_cols = op.n - job.n0;
  bool const bf16_out = op.output == OutputType::bf16;
  for (std::uint32_t r0 = warp * rows_per_pass; r0 < job.rows; r0 += 8u * rows_per_pass) {
    std::uint32_t const r = r0 + sub, row = base + r * stride;
    bool const live = r < job.rows;
    // The finished outputs, packed before the warp's reads end: bf16 in lo, fp32 in lo and hi.
    uint4 lo{}, hi{};
    if (live) {
      float out[8];
      float const scale = row_scale ? row_scale[job.a_row0 + r] : 1.0f;
      if (swiglu) {
        float gate[8], up[8];
        load8(gate, row + 64u * l);
        load8(up, row + 64u * l + 32u);
        add_bias8(gate, bias, 16u * l, bias_cols);
        add_bias8(up, bias, 16u * l + 8u, bias_cols);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = fast::swiglu(gate[i], up[i]) * scale;
      } else {
        load8(out, row + 32u * l);
        add_bias8(out, bias, 8u * l, bias_cols);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = fast::activate(act, out[i]) * scale;
      }
      if (bf16_out) {
        lo = make_uint4(pack_bf16x2(out[0], out[1]), pack_bf16x2(out[2], out[3]),
                        pack_bf16x2(out[4], out[5]), pack_bf16x2(out[6], out[7]));
      } else {
        lo = as_uint4(make_float4(out[0], out[1], out[2], out[3]));
        hi = as_uint4(make_float4(out[4], out[5], out[6], out[7]));
      }
    }
    __syncwarp();
    if (live) {
      if (bf16_out) {
        ptx::st_shared_v4(row + l * 16u, lo);
      } else {
        ptx::st_shared_v4(row + l * 32u, lo);
        ptx::st_shared_v4(row + l * 32u + 16u, hi);
      }
    }
    __syncwarp();
  }
}

}  // namespace loom::tasks::gemm::impl

#endif  // __CUDACC__
