// A user-defined task type, written outside the runtime: numerically stable softmax over each row
// of a block of rows of a row-major float matrix,
//
//   out[r][c] = exp(in[r][c] - max_c' in[r][c']) / sum_c'' exp(in[r][c''] - max_c' in[r][c'])
//
// Adding it to a program is this one struct plus one entry in the program's pipeline list,
// loom::Pipeline<RowSoftmax, ...>; nothing in runtime/ changes. `in` and `out` may alias (each
// element is read before it is written, by the same thread).
#pragma once

#include <cmath>
#include <cstddef>

#include "runtime/context.hpp"

namespace loom::examples {

struct RowSoftmax {
  static constexpr char const* name = "row_softmax";
  static constexpr unsigned threads = 128;     // four warps; each reduces one row at a time
  static constexpr unsigned shared_bytes = 0;  // warp shuffles only

  struct Payload {
    float const* in;     // first row of this task's block; rows are ld_in floats apart
    float* out;          // first row of this task's block; rows are ld_out floats apart
    std::uint32_t rows;  // rows in the block
    std::uint32_t cols;  // softmax length (> 0)
    std::uint32_t ld_in;
    std::uint32_t ld_out;
  };

  // Three passes per row in float: max, sum of exp(x - max), normalise.
  static void host(Payload const& p, TaskContext&) {
    for (std::uint32_t r = 0; r < p.rows; ++r) {
      float const* in = p.in + std::size_t{r} * p.ld_in;
      float* out = p.out + std::size_t{r} * p.ld_out;
      float max = in[0];
      for (std::uint32_t c = 1; c < p.cols; ++c) max = std::fmax(max, in[c]);
      float sum = 0.0f;
      for (std::uint32_t c = 0; c < p.cols; ++c) sum += std::exp(in[c] - max);
      float const inv_sum = 1.0f / sum;
      for (std::uint32_t c = 0; c < p.cols; ++c) out[c] = std::exp(in[c] - max) * inv_sum;
    }
  }

#if defined(__CUDACC__)
  // Called by every thread of the processor block. Warp w handles rows w, w + warps, ...; its
  // lanes stride over the columns and combine with butterfly shuffles, so every lane ends with
  // the row's max and sum. No shared memory and no block barrier.
  __device__ static void device(Payload const& p, TaskContext&) {
    unsigned const lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (std::uint32_t r = warp; r < p.rows; r += warps) {
      float const* in = p.in + std::size_t{r} * p.ld_in;
      float* out = p.out + std::size_t{r} * p.ld_out;
      float max = -INFINITY;
      for (std::uint32_t c = lane; c < p.cols; c += 32) max = fmaxf(max, in[c]);
      for (int offset = 16; offset > 0; offset /= 2)
        max = fmaxf(max, __shfl_xor_sync(0xFFFFFFFFu, max, offset));
      float sum = 0.0f;
      for (std::uint32_t c = lane; c < p.cols; c += 32) sum += expf(in[c] - max);
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
      float const inv_sum = 1.0f / sum;
      for (std::uint32_t c = lane; c < p.cols; c += 32) out[c] = expf(in[c] - max) * inv_sum;
    }
  }
#endif
};

}  // namespace loom::examples
