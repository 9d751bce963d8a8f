// GemmOperands: everything one batched GEMM's tile tasks share, kept in device memory (the task
// payload holds a pointer to it). The product, for expert e and a row r of the A pool:
//
//   acc[r][j] = sum_k A[r][k] * B[e][j][k]                        (bf16 in, fp32 accumulate)
//   y[r][j]   = act(acc[r][j] + bias[e][j])                       (none, relu, gelu_tanh)
//   y[r][o]   = silu(acc[r][g] + bias[e][g]) * (acc[r][u] + bias[e][u])        (swiglu, with
//               g = swiglu_gate_column(o), u = swiglu_up_column(o); see config.hpp)
//   C[r][o]   = row_scale[r] * y[r][o]      (row_scale optional: applied after the activation)
//
// stored as bf16 or fp32. A is a row-major [a_rows][lda] pool; B is [experts][n][k], each matrix
// n x k row-major (K-major), all experts covered by one 3-D tensor map; bias is [experts][n] in
// B's column order; C is [rows][ldc] with n_out = n (n / 2 for swiglu) columns.
//
// make_operands() validates a GemmDesc on the host and throws loom::Error with a message naming the
// offending field; the tensor maps are encoded separately (tensor_map.hpp), so the CPU executor
// and host tests use this header without CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/error.hpp"
#include "tasks/gemm/bf16.hpp"
#include "tasks/gemm/config.hpp"

namespace loom::tasks::gemm {

// Opaque storage of a CUtensorMap (128 bytes, 64-byte aligned in global memory).
struct alignas(64) TensorMapBytes {
  unsigned char bytes[128];
};

// A GEMM as the caller describes it (host pointers for the CPU executor, device pointers for the
// GPU). Unset leading dimensions default to the packed ones.
struct GemmDesc {
  Bf16 const* a = nullptr;  // [a_rows][lda]
  std::uint32_t a_rows = 0;
  std::uint32_t lda = 0;    // 0: k
  Bf16 const* b = nullptr;  // [experts][n][k]
  std::uint32_t experts = 1;
  std::uint32_t n = 0;
  std::uint32_t k = 0;
  void* c = nullptr;         // [c_rows][ldc] of bf16 or float
  std::uint32_t ldc = 0;     // 0: n_out
  std::uint32_t c_rows = 0;  // 0: a_rows
  OutputType output = OutputType::bf16;
  float const* bias = nullptr;       // [experts][n], or null
  float const* row_scale = nullptr;  // [a_rows], or null
  GemmActivation activation = GemmActivation::none;
};

struct alignas(64) GemmOperands {
  TensorMapBytes a_map;  // 2-D {k, a_rows}, box {64, block_m}, 128-byte swizzle
  TensorMapBytes b_map;  // 3-D {k, n, experts}, box {64, block_n, 1}, 128-byte swizzle
  // bf16 C only: 2-D {n_out, c_rows}, box {64, 64}, 128-byte swizzle, for the stores of whole
  // tiles that a run task makes with TMA (c_map_ready = 1 once encoded).
  TensorMapBytes c_map;
  Bf16 const* a;
  Bf16 const* b;
  void* c;
  float const* bias;
  float const* row_scale;
  float* workspace;         // split-K partial tiles: [slots][splits][block_m * block_n]
  std::uint32_t* counters;  // split-K arrivals per slot; zero between launches
  std::uint32_t a_rows, lda, k, n, experts, ldc, n_out, slots, c_rows;
  GemmConfig config;
  OutputType output;
  GemmActivation activation;
  std::uint8_t c_map_ready;

  LOOM_HD std::uint32_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  LOOM_HD std::uint32_t n_tiles() const { return (n + config.block_n - 1) / config.block_n; }
  LOOM_HD std::uint32_t out_tile_cols() const {
    return activation == GemmActivation::swiglu ? config.block_n / 2u : config.block_n;
  }
  LOOM_HD std::uint32_t out_bytes() const { return output == OutputType::bf16 ? 2u : 4u; }
  // Split-K slots enough for any row layout of the A pool over the experts: one per tile of
  // ceil(a_rows / block_m) + experts row tiles (each expert's last one partial) and every n tile.
  std::uint32_t slots_for_any_rows() const {
    return ((a_rows + config.block_m - 1) / config.block_m + experts) * n_tiles();
  }
};

inline char const* to_string(GemmActivation a) {
  switch (a) {
    case GemmActivation::relu:
      return "relu";
    case GemmActivation::gelu_tanh:
      return "gelu";
    case GemmActivation::swiglu:
      return "swiglu";
    case GemmActivation::none:
      break;
  }
  return "none";
}

// "none", "relu", "gelu" (tanh form) or "swiglu"; throws loom::Error naming the choices otherwise.
inline GemmActivation parse_gemm_activation(std::string const& name) {
  for (GemmActivation a : {GemmActivation::none, GemmActivation::relu, GemmActivation::gelu_tanh,
                           GemmActivation::swiglu})
    if (name == to_string(a)) return a;
  throw Error("loom: unknown activation '" + name + "' (choose none, relu, gelu or swiglu)");
}

inline char const* to_string(MmaPath p) {
  return p == MmaPath::wgmma ? "wgmma" : "mma_sync";
}

// Checks a configuration on its own; "" when valid, else why not.
inline std::string config_problem(GemmConfig const& cfg, std::uint32_t k) {
  if (!cfg.shape_supported())
    return "tile " + std::to_string(cfg.block_m) + "x" + std::to_string(cfg.block_n) +
           " is not one of 128x64, 128x128, 128x224, 128x256, 64x128, 64x256, 192x256";
  if (cfg.path == MmaPath::wgmma && (cfg.stages < 2 || cfg.stages > cfg.max_stages()))
    return std::to_string(cfg.stages) + " stages of " + std::to_string(cfg.stage_bytes()) +
           " bytes: the wgmma pipeline needs 2.." + std::to_string(cfg.max_stages());
  std::uint32_t const k_blocks = (k + kBlockK - 1) / kBlockK;
  if (cfg.tall() && cfg.path == MmaPath::wgmma && cfg.stages != kTallStages)
    return std::to_string(cfg.stages) + " stages: the 192x256 tile's pipeline has " +
           std::to_string(kTallStages);
  if (cfg.tall() && cfg.splits != 1)
    return "split-K " + std::to_string(cfg.splits) + " with the 192x256 tile: it takes no split";
  if (cfg.splits < 1 || cfg.splits > kMaxSplits || cfg.splits > k_blocks)
    return "split-K " + std::to_string(cfg.splits) + " must be 1.." + std::to_string(kMaxSplits) +
           " and at most the " + std::to_string(k_blocks) + " K blocks of 64";
  std::uint32_t const per = split_k_blocks_per(k_blocks, cfg.splits);
  if ((cfg.splits - 1u) * per >= k_blocks)
    return "split-K " + std::to_string(cfg.splits) + " over " + std::to_string(k_blocks) +
           " K blocks leaves the last split empty; use " +
           std::to_string((k_blocks + per - 1) / per);
  return {};
}

// Validates `d` with configuration `cfg` and returns the operands with every field but the tensor
// maps, the workspace and the counters filled. Throws loom::Error naming what is wrong.
inline GemmOperands make_operands(GemmDesc const& d, GemmConfig const& cfg) {
  auto const fail = [](std::string const& what) { throw Error("loom: gemm: " + what); };
  auto const misaligned = [](void const* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 != 0;
  };
  if (!d.a || !d.b || !d.c) fail("A, B and C must all be given");
  if (d.a_rows == 0 || d.n == 0 || d.k == 0 || d.experts == 0)
    fail("empty problem: a_rows=" + std::to_string(d.a_rows) + ", n=" + std::to_string(d.n) +
         ", k=" + std::to_string(d.k) + ", experts=" + std::to_string(d.experts));
  if (d.k % 8 != 0)
    fail("k=" + std::to_string(d.k) +
         " is not a multiple of 8: TMA needs 16-byte row strides (pad K with zeros)");
  std::uint32_t const lda = d.lda ? d.lda : d.k;
  if (lda < d.k || lda % 8 != 0)
    fail("lda=" + std::to_string(lda) + " must be >= k=" + std::to_string(d.k) +
         " and a multiple of 8");
  bool const swiglu = d.activation == GemmActivation::swiglu;
  if (d.n % (swiglu ? 16u : 8u) != 0)
    fail("n=" + std::to_string(d.n) + " must be a multiple of " + (swiglu ? "16 for swiglu" : "8"));
  std::uint32_t const n_out = swiglu ? d.n / 2 : d.n;
  std::uint32_t const ldc = d.ldc ? d.ldc : n_out;
  std::uint32_t const out_bytes = d.output == OutputType::bf16 ? 2 : 4;
  if (ldc < n_out || (std::size_t{ldc} * out_bytes) % 16 != 0)
    fail("ldc=" + std::to_string(ldc) + " must be >= " + std::to_string(n_out) +
         " output columns and a whole number of 16-byte chunks");
  if (misaligned(d.a) || misaligned(d.b) || misaligned(d.c) || misaligned(d.bias))
    fail("A, B, C and bias must be 16-byte aligned");
  if (std::string const why = config_problem(cfg, d.k); !why.empty()) fail(why);
  if (cfg.path == MmaPath::wgmma && (d.a_rows >= (1u << 31) || d.experts >= (1u << 31)))
    fail("a_rows and experts must be below 2^31 (TMA coordinates are signed)");

  GemmOperands op{};
  op.a = d.a;
  op.b = d.b;
  op.c = d.c;
  op.bias = d.bias;
  op.row_scale = d.row_scale;
  op.a_rows = d.a_rows;
  op.lda = lda;
  op.k = d.k;
  op.n = d.n;
  op.experts = d.experts;
  op.ldc = ldc;
  op.n_out = n_out;
  op.c_rows = d.c_rows ? d.c_rows : d.a_rows;
  op.config = cfg;
  op.output = d.output;
  op.activation = d.activation;
  return op;
}

}  // namespace loom::tasks::gemm
