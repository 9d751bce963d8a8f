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

// Stores the tile into C at (c_row0, c_col0) with leading dimension ldc.
struct LocalTileSink {
  static void deliver_host(StagedTile const& t, GemmOperands const& op, TaskContext&) {
    auto* const c = static_cast<unsigned char*>(op.c);
    for (std::uint32_t r = 0; r < t.rows; ++r)
      std::memcpy(c + (std::size_t{t.c_row0 + r} * op.ldc + t.c_col0) * t.elem_bytes,
                  t.data + std::size_t{r} * t.row_stride, std::size_t{t.cols} * t.elem_bytes);
  }

#if defined(__CUDACC__)
  // 16-byte chunks, consecutive threads along a row: each warp writes 512 contiguous bytes.
  __device__ static void deliver(StagedTile const& t, GemmOperands const& op, TaskContext&,
                                 unsigned thread) {
    std::uint32_t const chunks_per_row = t.cols * t.elem_bytes / 16u;
    std::uint32_t const chunks = t.rows * chunks_per_row;
    auto* const c = static_cast<unsigned char*>(op.c) +
                    (std::size_t{t.c_row0} * op.ldc + t.c_col0) * t.elem_bytes;
    std::size_t const ldc_bytes = std::size_t{op.ldc} * t.elem_bytes;
    for (std::uint32_t i = thread; i < chunks; i += kConsumerThreads) {
      std::uint32_t const r = i / chunks_per_row, chunk = i - r * chunks_per_row;
      uint4 const v = *reinterpret_cast<uint4 const*>(t.data + r * t.row_stride + chunk * 16u);
      *reinterpret_cast<uint4*>(c + r * ldc_bytes + chunk * 16u) = v;
    }
  }
#endif
};

}  // namespace loom::tasks::gemm
