// TileMatmul: one output tile of an fp32 matrix product with a fused epilogue,
//
//   C[tile] = act(A[rows of tile] · B[:, cols of tile] + bias[cols of tile])
//
// for row-major A [M][K], B [K][N], C [M][N] with arbitrary leading dimensions (elements between
// consecutive rows). One task = one tile; a graph over a matrix is a TileGrid of these tasks
// (see examples/fused_mlp). Tiles clipped at the matrix edge are handled by both bodies.
//
// The payload carries pointers already offset to the tile, so a task needs no matrix extents
// beyond the tile's own: k, the three leading dimensions, the tile's rows and cols, and the
// activation, bit-packed into two words. Build payloads with tile_payload(), which checks the
// packing limits on the host.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>

#include "runtime/context.hpp"
#include "runtime/error.hpp"
#include "runtime/tiles.hpp"

namespace loom::tasks {

enum class Activation : std::uint8_t { none = 0, relu = 1, gelu_tanh = 2, silu = 3 };

// The epilogue's activation; the same formula on host, device and in float64 references.
// gelu_tanh is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class Real>
LOOM_HD LOOM_INLINE Real activate(Activation act, Real x) {
  switch (act) {
    case Activation::relu:
      return x > Real(0) ? x : Real(0);
    case Activation::gelu_tanh: {
      Real const sqrt_2_over_pi = Real(0.79788456080286535588);
      return Real(0.5) * x *
             (Real(1) + std::tanh(sqrt_2_over_pi * (x + Real(0.044715) * x * x * x)));
    }
    case Activation::silu:
      return x / (Real(1) + std::exp(-x));
    case Activation::none:
      break;
  }
  return x;
}

inline char const* to_string(Activation act) {
  switch (act) {
    case Activation::relu:
      return "relu";
    case Activation::gelu_tanh:
      return "gelu";
    case Activation::silu:
      return "silu";
    case Activation::none:
      break;
  }
  return "none";
}

// "none", "relu", "gelu" (tanh form) or "silu"; throws loom::Error naming the choices otherwise.
inline Activation parse_activation(std::string const& name) {
  for (Activation a : {Activation::none, Activation::relu, Activation::gelu_tanh, Activation::silu})
    if (name == to_string(a)) return a;
  throw Error("loom: unknown activation '" + name + "' (choose none, relu, gelu or silu)");
}

// Whole-matrix operands of one product; tile_payload() cuts a task's payload out of them.
struct MatmulOperands {
  float const* a = nullptr;     // [m][k], row stride lda
  float const* b = nullptr;     // [k][n], row stride ldb
  float* c = nullptr;           // [m][n], row stride ldc
  float const* bias = nullptr;  // [n], or null for no bias
  std::uint32_t m = 0, n = 0, k = 0;
  std::uint32_t lda = 0, ldb = 0, ldc = 0;
  Activation activation = Activation::none;
};

struct TileMatmul {
  static constexpr char const* name = "tile_matmul";
  static constexpr unsigned threads = 128;

  // Device tiling: the block computes the tile in 64 x 64 sub-tiles, each thread an 8 x 4 register
  // block of it (rows ty + 8 i, cols tx + 16 j: conflict-free shared reads, coalesced writes),
  // stepping through k 16 at a time through two shared staging tiles. A is staged transposed
  // (k-major) with one column of padding so its transposing stores spread over the banks.
  static constexpr unsigned kSubRows = 64, kSubCols = 64, kStepK = 16;
  static constexpr unsigned kThreadRows = 8, kThreadCols = 4;
  static constexpr unsigned kThreadGridCols = kSubCols / kThreadCols;  // 16
  static constexpr unsigned kThreadGridRows = kSubRows / kThreadRows;  // 8
  static_assert(kThreadGridCols * kThreadGridRows == threads);
  static_assert((kSubRows * kStepK) % threads == 0 && (kStepK * kSubCols) % threads == 0,
                "each thread stages the same number of elements");
  static constexpr unsigned kStageAFloats = kStepK * (kSubRows + 1);
  static constexpr unsigned kStageBFloats = kStepK * kSubCols;
  static constexpr unsigned shared_bytes = (kStageAFloats + kStageBFloats) * sizeof(float);

  // Packing limits of the payload's fields.
  static constexpr std::uint32_t kMaxExtent = (1u << 24) - 1;      // k, lda, ldb, ldc
  static constexpr std::uint32_t kMaxTileExtent = (1u << 12) - 1;  // rows and cols of one tile

  struct Payload {
    float const* a;                // row 0 of the tile's A panel: A + row0 * lda, [rows][k]
    float const* b;                // column 0 of the tile's B panel: B + col0, [k][cols]
    float* c;                      // the tile's first element: C + row0 * ldc + col0, [rows][cols]
    float const* bias;             // bias + col0, [cols]; null: no bias
    std::uint64_t k_lda_rows_act;  // k (24 bits) | lda (24) | rows (12) | activation (4)
    std::uint64_t ldb_ldc_cols;    // ldb (24) | ldc (24) | cols (12) | unused (4)

    LOOM_HD std::uint32_t k() const { return field(k_lda_rows_act, 0, 24); }
    LOOM_HD std::uint32_t lda() const { return field(k_lda_rows_act, 24, 24); }
    LOOM_HD std::uint32_t rows() const { return field(k_lda_rows_act, 48, 12); }
    LOOM_HD Activation activation() const {
      return static_cast<Activation>(field(k_lda_rows_act, 60, 4));
    }
    LOOM_HD std::uint32_t ldb() const { return field(ldb_ldc_cols, 0, 24); }
    LOOM_HD std::uint32_t ldc() const { return field(ldb_ldc_cols, 24, 24); }
    LOOM_HD std::uint32_t cols() const { return field(ldb_ldc_cols, 48, 12); }

   private:
    LOOM_HD static std::uint32_t field(std::uint64_t word, unsigned shift, unsigned bits) {
      return static_cast<std::uint32_t>((word >> shift) & ((std::uint64_t{1} << bits) - 1));
    }
  };
  static_assert(sizeof(Payload) == 48);

  // The payload of tile `t` of the product described by `op`. Throws loom::Error when the tile
  // lies outside C, the operands are inconsistent, or a field exceeds its packing limit.
  static Payload tile_payload(MatmulOperands const& op, Tile const& t) {
    auto const fail = [&](std::string const& what) {
      throw Error("loom: tile_matmul tile (" + std::to_string(t.row_tile) + ", " +
                  std::to_string(t.col_tile) + "): " + what);
    };
    if (!op.a || !op.b || !op.c) fail("A, B and C must all be given");
    if (t.rows == 0 || t.cols == 0 || t.row0 + t.rows > op.m || t.col0 + t.cols > op.n)
      fail("rows [" + std::to_string(t.row0) + ", " + std::to_string(t.row0 + t.rows) +
           ") x cols [" + std::to_string(t.col0) + ", " + std::to_string(t.col0 + t.cols) +
           ") is empty or outside C [" + std::to_string(op.m) + "][" + std::to_string(op.n) + "]");
    if (op.k == 0) fail("k = 0");
    if (op.lda < op.k || op.ldb < op.n || op.ldc < op.n)
      fail("leading dimensions lda=" + std::to_string(op.lda) + ", ldb=" + std::to_string(op.ldb) +
           ", ldc=" + std::to_string(op.ldc) + " are shorter than the rows they stride over (k=" +
           std::to_string(op.k) + ", n=" + std::to_string(op.n) + ")");
    if (op.k > kMaxExtent || op.lda > kMaxExtent || op.ldb > kMaxExtent || op.ldc > kMaxExtent)
      fail("k and the leading dimensions must be at most " + std::to_string(kMaxExtent));
    if (t.rows > kMaxTileExtent || t.cols > kMaxTileExtent)
      fail("a tile of " + std::to_string(t.rows) + " x " + std::to_string(t.cols) +
           " exceeds the limit of " + std::to_string(kMaxTileExtent) + " per side");
    Payload p{};
    p.a = op.a + std::size_t{t.row0} * op.lda;
    p.b = op.b + t.col0;
    p.c = op.c + std::size_t{t.row0} * op.ldc + t.col0;
    p.bias = op.bias ? op.bias + t.col0 : nullptr;
    p.k_lda_rows_act = std::uint64_t{op.k} | std::uint64_t{op.lda} << 24 |
                       std::uint64_t{t.rows} << 48 |
                       std::uint64_t{static_cast<std::uint8_t>(op.activation)} << 60;
    p.ldb_ldc_cols =
        std::uint64_t{op.ldb} | std::uint64_t{op.ldc} << 24 | std::uint64_t{t.cols} << 48;
    return p;
  }

  // Plain loops; fp32 accumulation over k in increasing order, as each device thread sums.
  static void host(Payload const& p, TaskContext&) {
    constexpr std::uint32_t kChunkCols = 256;
    float acc[kChunkCols];
    std::uint32_t const rows = p.rows(), cols = p.cols(), k = p.k();
    std::uint32_t const lda = p.lda(), ldb = p.ldb(), ldc = p.ldc();
    for (std::uint32_t r = 0; r < rows; ++r) {
      float const* a_row = p.a + std::size_t{r} * lda;
      for (std::uint32_t c0 = 0; c0 < cols; c0 += kChunkCols) {
        std::uint32_t const width = cols - c0 < kChunkCols ? cols - c0 : kChunkCols;
        for (std::uint32_t j = 0; j < width; ++j) acc[j] = 0.0f;
        for (std::uint32_t kk = 0; kk < k; ++kk) {
          float const a = a_row[kk];
          float const* b_row = p.b + std::size_t{kk} * ldb + c0;
          for (std::uint32_t j = 0; j < width; ++j) acc[j] += a * b_row[j];
        }
        float* c_row = p.c + std::size_t{r} * ldc + c0;
        for (std::uint32_t j = 0; j < width; ++j)
          c_row[j] = activate(p.activation(), p.bias ? acc[j] + p.bias[c0 + j] : acc[j]);
      }
    }
  }

#if defined(__CUDACC__)
  // Called by every thread of the processor block (blockDim.x >= threads; threads past `threads`
  // only join the barriers). Uses kStageAFloats + kStageBFloats floats of ctx.shared_memory().
  // Every thread runs the same loop trip counts, so the __syncthreads() calls stay balanced.
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    float* const stage_a = static_cast<float*>(ctx.shared_memory());  // [kStepK][kSubRows + 1]
    float* const stage_b = stage_a + kStageAFloats;                   // [kStepK][kSubCols]
    unsigned const tid = threadIdx.x;
    bool const computes = tid < threads;
    unsigned const tx = tid % kThreadGridCols, ty = tid / kThreadGridCols;
    std::uint32_t const rows = p.rows(), cols = p.cols(), k = p.k();
    std::uint32_t const lda = p.lda(), ldb = p.ldb(), ldc = p.ldc();
    float const* __restrict__ const a = p.a;
    float const* __restrict__ const b = p.b;

    for (std::uint32_t m0 = 0; m0 < rows; m0 += kSubRows) {
      for (std::uint32_t n0 = 0; n0 < cols; n0 += kSubCols) {
        float acc[kThreadRows][kThreadCols];
#pragma unroll
        for (unsigned i = 0; i < kThreadRows; ++i)
#pragma unroll
          for (unsigned j = 0; j < kThreadCols; ++j) acc[i][j] = 0.0f;

        for (std::uint32_t k0 = 0; k0 < k; k0 += kStepK) {
          if (computes) {
            // A: 16 consecutive threads read 16 consecutive k of one row (coalesced), stored
            // transposed. B: consecutive threads read consecutive columns of one k row.
#pragma unroll
            for (unsigned l = 0; l < kSubRows * kStepK / threads; ++l) {
              unsigned const e = tid + l * threads;
              unsigned const r = e / kStepK, kk = e % kStepK;
              bool const inside = m0 + r < rows && k0 + kk < k;
              stage_a[kk * (kSubRows + 1) + r] =
                  inside ? a[std::size_t{m0 + r} * lda + k0 + kk] : 0.0f;
            }
#pragma unroll
            for (unsigned l = 0; l < kStepK * kSubCols / threads; ++l) {
              unsigned const e = tid + l * threads;
              unsigned const kk = e / kSubCols, c = e % kSubCols;
              bool const inside = k0 + kk < k && n0 + c < cols;
              stage_b[kk * kSubCols + c] = inside ? b[std::size_t{k0 + kk} * ldb + n0 + c] : 0.0f;
            }
          }
          __syncthreads();
          if (computes) {
#pragma unroll
            for (unsigned kk = 0; kk < kStepK; ++kk) {
              float a_frag[kThreadRows], b_frag[kThreadCols];
#pragma unroll
              for (unsigned i = 0; i < kThreadRows; ++i)
                a_frag[i] = stage_a[kk * (kSubRows + 1) + ty + kThreadGridRows * i];
#pragma unroll
              for (unsigned j = 0; j < kThreadCols; ++j)
                b_frag[j] = stage_b[kk * kSubCols + tx + kThreadGridCols * j];
#pragma unroll
              for (unsigned i = 0; i < kThreadRows; ++i)
#pragma unroll
                for (unsigned j = 0; j < kThreadCols; ++j) acc[i][j] += a_frag[i] * b_frag[j];
            }
          }
          __syncthreads();
        }

        if (computes) {
#pragma unroll
          for (unsigned i = 0; i < kThreadRows; ++i) {
            std::uint32_t const r = m0 + ty + kThreadGridRows * i;
#pragma unroll
            for (unsigned j = 0; j < kThreadCols; ++j) {
              std::uint32_t const c = n0 + tx + kThreadGridCols * j;
              if (r < rows && c < cols) {
                float const v = p.bias ? acc[i][j] + p.bias[c] : acc[i][j];
                p.c[std::size_t{r} * ldc + c] = activate(p.activation(), v);
              }
            }
          }
        }
      }
    }
  }
#endif
};

}  // namespace loom::tasks
