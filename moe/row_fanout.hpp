// Block-wide row fan-out on the device: each of `rows` source rows goes to up to `fan`
// destination rows. Both gathers (tokens into expert pools, received rows into expert
// pools) and the expert-parallel dispatch (token rows into the peers' windows) are this copy.
#pragma once

#include <cstdint>

#include "runtime/config.hpp"

namespace loom::moe {

// A step of a block-wide copy over rows of `row_chunks` 16-byte chunks: unit `row * row_chunks +
// chunk` moves on by `stride` units (the block size) through the quotient and remainder of
// stride / row_chunks, worked out once, so that no step divides.
struct ChunkStep {
  std::uint32_t row_chunks, rows, chunks;

  LOOM_HD static ChunkStep of(std::uint32_t row_chunks, std::uint32_t stride) {
    std::uint32_t const rows = stride / row_chunks;
    return {row_chunks, rows, stride - rows * row_chunks};
  }
  LOOM_HD void advance(std::uint32_t& row, std::uint32_t& chunk) const {
    row += rows;
    chunk += chunks;
    if (chunk >= row_chunks) chunk -= row_chunks, ++row;
  }
};

#if defined(__CUDACC__)
// A 16-byte store to global memory (a peer's window included). Through a generic pointer the
// compiler must assume the store may alias shared memory, so a destination address read from
// shared memory after one store would wait for it; this store names its state space.
__device__ __forceinline__ void st_global_v4(uint4* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}

// Copies source row s < rows (row_chunks 16-byte chunks at src_row(s)) to dst_row(s, j) for
// every j < fan <= kFan, a row pointer (a peer's window, for instance) or nullptr to skip. Every
// chunk is read once (through L2: a peer may have written it in this launch) and each thread
// keeps kLoads reads in flight. The loads are unconditional (the row is clamped to the last) so
// that they stay in registers: with a predicated load per slot, ptxas moved the slots to local
// memory and every read waited for the one before it. Thread t copies the block's chunks t,
// t + blockDim.x, ..., its (row, chunk) position moved on by a ChunkStep: no chunk costs a
// division. The destinations' loop runs to the compile-time kFan, each store predicated on
// j < fan, so the copy is straight-line code: with a loop to the runtime fan, a processor's first
// gather of a call spent 7-10 µs more on its first batch of stores, most likely fetching the
// loop's code (docs/performance.md, "A gather's first batch of stores").
template <std::uint32_t kLoads = 16, std::uint32_t kFan = 1, class SrcRow, class DstRow>
__device__ __forceinline__ void fan_out_rows_from(std::uint32_t rows, std::uint32_t row_chunks,
                                                  std::uint32_t fan, SrcRow const& src_row,
                                                  DstRow const& dst_row) {
  if (rows == 0 || row_chunks == 0) return;
  ChunkStep const step = ChunkStep::of(row_chunks, blockDim.x);
  std::uint32_t s = threadIdx.x / row_chunks, c = threadIdx.x - s * row_chunks;
  while (s < rows) {
    uint4 r[kLoads];
    std::uint32_t ls = s, lc = c;
#pragma unroll
    for (std::uint32_t u = 0; u < kLoads; ++u) {
      r[u] = __ldcg(src_row(min(ls, rows - 1)) + lc);
      step.advance(ls, lc);
    }
    // The stores are predicated, not branched around, so that their addresses can be read ahead.
#pragma unroll
    for (std::uint32_t u = 0; u < kLoads; ++u) {
      bool const valid = s < rows;
      std::uint32_t const at = min(s, rows - 1);
#pragma unroll
      for (std::uint32_t j = 0; j < kFan; ++j) {
        uint4* const row = j < fan ? dst_row(at, j) : nullptr;
        if (valid && row != nullptr) st_global_v4(row + c, r[u]);
      }
      step.advance(s, c);
    }
  }
}

// The same from consecutive rows at src into one array: source row s goes to rows
// dst_row[s * fan + j] of dst (fan <= 8); an entry of ~0u is skipped. The copy is instantiated
// for the fans 1, 2, 4 and 8, and runs the least that covers `fan`.
template <std::uint32_t kLoads = 16>
__device__ __forceinline__ void fan_out_rows(uint4 const* __restrict__ src, uint4* __restrict__ dst,
                                             std::uint32_t rows, std::uint32_t row_chunks,
                                             std::uint32_t const* dst_row, std::uint32_t fan) {
  auto const src_row = [&](std::uint32_t s) { return src + std::size_t{s} * row_chunks; };
  auto const to = [&](std::uint32_t s, std::uint32_t j) -> uint4* {
    std::uint32_t const d = dst_row[s * fan + j];
    return d != ~0u ? dst + std::size_t{d} * row_chunks : nullptr;
  };
  if (fan <= 1) return fan_out_rows_from<kLoads, 1>(rows, row_chunks, fan, src_row, to);
  if (fan <= 2) return fan_out_rows_from<kLoads, 2>(rows, row_chunks, fan, src_row, to);
  if (fan <= 4) return fan_out_rows_from<kLoads, 4>(rows, row_chunks, fan, src_row, to);
  // The widest fan keeps fewer reads in flight: each read feeds more stores, and with 16 reads of
  // eight destinations ptxas kept some of the reads in local memory.
  constexpr std::uint32_t kWideLoads = kLoads < 8 ? kLoads : 8;
  fan_out_rows_from<kWideLoads, 8>(rows, row_chunks, fan, src_row, to);
}
#endif

}  // namespace loom::moe
