// Block-wide row fan-out on the device: each of `rows` source rows goes to up to `fan`
// destination rows. Both gathers (tokens into expert pools, received rows into expert
// pools) and the expert-parallel dispatch (token rows into the peers' windows) are this copy.
#pragma once

#include <cstdint>

namespace loom::moe {

#if defined(__CUDACC__)
// Copies source row s < rows (row_chunks 16-byte chunks at src_row(s)) to dst_row(s, j) for
// every j < fan, a row pointer (a peer's window, for instance) or nullptr to skip. Every chunk is
// read once (through L2: a peer may have written it in this launch) and each thread keeps kLoads
// reads in flight. The loads are unconditional (the index is clamped to the last chunk) so that
// they stay in registers: with a predicated load per slot, ptxas moved the slots to local memory
// and every read waited for the one before it.
template <std::uint32_t kLoads = 16, class SrcRow, class DstRow>
__device__ __forceinline__ void fan_out_rows_from(std::uint32_t rows, std::uint32_t row_chunks,
                                                  std::uint32_t fan, SrcRow const& src_row,
                                                  DstRow const& dst_row) {
  std::uint32_t const chunks = rows * row_chunks;
  if (chunks == 0) return;
  for (std::uint32_t i0 = threadIdx.x; i0 < chunks; i0 += kLoads * blockDim.x) {
    uint4 r[kLoads];
#pragma unroll
    for (std::uint32_t u = 0; u < kLoads; ++u) {
      std::uint32_t const i = min(i0 + u * blockDim.x, chunks - 1);
      std::uint32_t const s = i / row_chunks;
      r[u] = __ldcg(src_row(s) + (i - s * row_chunks));
    }
#pragma unroll
    for (std::uint32_t u = 0; u < kLoads; ++u) {
      std::uint32_t const i = i0 + u * blockDim.x;
      if (i >= chunks) break;
      std::uint32_t const s = i / row_chunks, c = i - s * row_chunks;
      for (std::uint32_t j = 0; j < fan; ++j)
        if (uint4* const row = dst_row(s, j)) row[c] = r[u];
    }
  }
}

// The same from consecutive rows at src into one array: source row s goes to rows
// dst_row[s * fan + j] of dst; an entry of ~0u is skipped.
template <std::uint32_t kLoads = 16>
__device__ __forceinline__ void fan_out_rows(uint4 const* __restrict__ src, uint4* __restrict__ dst,
                                             std::uint32_t rows, std::uint32_t row_chunks,
                                             std::uint32_t const* dst_row, std::uint32_t fan) {
  fan_out_rows_from<kLoads>(
      rows, row_chunks, fan, [&](std::uint32_t s) { return src + std::size_t{s} * row_chunks; },
      [&](std::uint32_t s, std::uint32_t j) -> uint4* {
        std::uint32_t const d = dst_row[s * fan + j];
        return d != ~0u ? dst + std::size_t{d} * row_chunks : nullptr;
      });
}
#endif

}  // namespace loom::moe
