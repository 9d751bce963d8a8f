// The GEMM task's output hook. The epilogue finishes a tile (bias, activation, row scale,
// conversion) into a row-major staging buffer, then hands it to a TileSink, which decides where it
// goes. LocalTileSink stores it into C; a sink that `put`s rows into a peer's buffer over the
// symmetric heap (ctx.heap()) is the same shape with a different deliver.
//
// A sink is a type with
//   static void deliver_host(StagedTile const&, GemmOperands const&, TaskContext&);
//   __device__ static void deliver(StagedTile const&, GemmOperands const&, TaskContext&,
//                                  unsigned thread);   // thread in [0, kConsumerThreads)
// deliver is called by the kConsumerThreads consumer threads of the block together (and by no
// other thread), after a barrier that makes the staged tile visible to all of them; it may use
// ptx::named_barrier_sync(kSinkBarrier, kConsumerThreads) among them. The tile's rows past
// `rows` and columns past `cols` hold garbage and must not be delivered.
#pragma once

#include <cstring>

#include "runtime/context.hpp"
#include "tasks/gemm/operands.hpp"
#if defined(__CUDACC__)
#include "tasks/gemm/ptx/smem.cuh"
#endif

namespace loom::tasks::gemm {

// A finished tile. Device: `data` is shared memory, 16-byte aligned, row_stride a multiple of 16.
struct StagedTile {
  unsigned char const* data;  // element (r, c) at data + r * row_stride + c * elem_bytes
  std::uint32_t row_stride;   // bytes
  std::uint32_t rows;         // valid rows: the task's row count
  std::uint32_t cols;         // valid columns, clipped at n_out; a multiple of 8
  std::uint32_t elem_bytes;   // 2 (bf16) or 4 (fp32)
  std::uint32_t c_row0;       // the tile's first row and column in C
  std::uint32_t c_col0;
  std::uint64_t tag;  // the payload's sink_tag (routing for non-local sinks)
};

inline constexpr std::uint32_t kSinkBarrier = 2;  // named barrier id a sink may use

#if defined(__CUDACC__)
// For a sink's deliver (all kConsumerThreads threads): copies each valid row of the staged tile,
// its valid columns, to row_dst(r), a device pointer (16-byte aligned) to where row r goes. Warp
// w takes rows w, w + 8, ...: lane i first resolves the warp's i-th row (all those lookups in
// flight together), then the warp walks its rows' 16-byte chunks in order, kBatch loads a lane
// before their stores, so that a row's destination lookup and the copies do not serialise.
template <class RowDst>
__device__ void scatter_rows(StagedTile const& t, unsigned thread, RowDst const& row_dst) {
  constexpr std::uint32_t kWarps = kConsumerThreads / 32u, kBatch = 8;
  static_assert(kWarps * 32u >= 128u, "a lane resolves at most one row of its warp");
  std::uint32_t const warp = thread / 32u, lane = thread % 32u;
  std::uint32_t const count = t.rows > warp ? (t.rows - warp + kWarps - 1u) / kWarps : 0u;
  unsigned char* const dst = lane < count ? row_dst(warp + kWarps * lane) : nullptr;
  std::uint32_t const per_row = t.cols * t.elem_bytes / 16u, total = count * per_row;
  std::uint32_t const src = ptx::smem_address(t.data) + warp * t.row_stride;
  std::uint32_t const src_step = kWarps * t.row_stride;
  for (std::uint32_t q0 = 0; q0 < total; q0 += 32u * kBatch) {
    uint4 v[kBatch];
    unsigned char* at[kBatch];
#pragma unroll
    for (std::uint32_t b = 0; b < kBatch; ++b) {
      std::uint32_t const q = q0 + 32u * b + lane;
      std::uint32_t const qq = q < total ? q : 0u;  // loads stay unconditional (registers)
      std::uint32_t const i = qq / per_row, c = qq - i * per_row;
      v[b] = ptx::ld_shared_v4(src + i * src_step + c * 16u);
      at[b] = reinterpret_cast<unsigned char*>(
                  __shfl_sync(0xFFFFFFFFu, reinterpret_cast<unsigned long long>(dst), i)) +
              c * 16u;
    }
#pragma unroll
    for (std::uint32_t b = 0; b < kBatch; ++b)
      if (q0 + 32u * b + lane < total) *reinterpret_cast<uint4*>(at[b]) = v[b];
  }
}
#endif

// Stores the tile into C at (c_row0, c_col0) with leading dimension ldc.
struct LocalTileSink {
  static void deliver_host(StagedTile const& t, GemmOperands const& op, TaskContext&) {
    auto* const c = static_cast<unsigned char*>(op.c);
    for (std::uint32_t r = 0; r < t.rows; ++r)
      std::memcpy(c + (std::size_t{t.c_row0 + r} * op.ldc + t.c_col0) * t.elem_bytes,
                  t.data + std::size_t{r} * t.row_stride, std::size_t{t.cols} * t.elem_bytes);
  }

#if defined(__CUDACC__)
  __device__ static void deliver(StagedTile const& t, GemmOperands const& op, TaskContext&,
                                 unsigned thread) {
    unsigned char* const c = static_cast<unsigned char*>(op.c) +
                             (std::size_t{t.c_row0} * op.ldc + t.c_col0) * t.elem_bytes;
    std::size_t const ldc_bytes = std::size_t{op.ldc} * t.elem_bytes;
    scatter_rows(t, thread, [&](std::uint32_t r) { return c + r * ldc_bytes; });
  }
#endif
};

}  // namespace loom::tasks::gemm
