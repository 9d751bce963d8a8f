// A non-MoE fused pipeline: the two-layer MLP Y = act(X · W1ᵀ + b1) · W2ᵀ as one graph of bf16
// tile GEMM tasks (tasks/gemm_tile.hpp: wgmma + TMA on sm_90a, mma.sync elsewhere), with
// tile-level dependencies instead of a barrier between the layers.
//
//   hidden tile (i, j) = act(X[row tile i] · W1[hidden cols j]ᵀ + b1)   completes event i
//   output tile (i, j) = hidden[row tile i] · W2[output cols j]ᵀ        gated on event i
//
// Event i expects one arrival per first-layer task of row tile i (column tiles x K splits), so
// the output tiles of row tile i start as soon as that row of the hidden layer is complete, while
// other row tiles are still in layer one. Output tiles carry priority 1 (hidden tiles 0): under
// the priority policy a ready second-layer tile runs before more first-layer work. Both layers
// use the same tile height, so a row tile means the same rows in both.
//
// Precision: X, W1, W2 and the hidden layer in bf16, fp32 accumulation, Y in fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"
#include "tasks/gemm/operands.hpp"
#include "tasks/gemm_tile.hpp"

namespace loom::examples {

using tasks::gemm::Bf16;
using tasks::gemm::GemmActivation;

struct FusedMlpProblem {
  std::uint32_t m = 256, k = 256, h = 512, n = 256;  // k, h and n: multiples of 8
  GemmActivation activation = GemmActivation::relu;
  std::uint32_t tile_m = 0;  // rows per tile in both layers, 64 or 128; 0: chosen by the heuristic

  // Rows of W1: 2h for swiglu (gate and up rows), else h.
  std::uint32_t w1_rows() const { return activation == GemmActivation::swiglu ? 2 * h : h; }
  // Multiply-adds of both layers, counted as two flops each.
  double flops() const { return 2.0 * m * (double(w1_rows()) * k + double(h) * n); }
};

// Throws loom::Error naming the first violated constraint: a zero extent, k, h or n not a
// multiple of 8 (16-byte rows for TMA), tile_m other than 0, 64 or 128.
void validate(FusedMlpProblem const& problem);

// The tensors, row-major and dense: host memory for the CPU executor, device memory for the GPU
// (only the pointers are recorded). The weights are stored the way the GEMM task reads B: one row
// per output column.
struct FusedMlpTensors {
  Bf16 const* x = nullptr;    // [m][k]
  Bf16 const* w1 = nullptr;   // [w1_rows][k]; swiglu: gate and up rows interleaved in blocks of
                              // 8 (tasks/gemm/config.hpp, swiglu_gate_column)
  float const* b1 = nullptr;  // [w1_rows] in W1's row order, or null
  Bf16 const* w2 = nullptr;   // [n][h]
  Bf16* hidden = nullptr;     // [m][h]
  float* y = nullptr;         // [m][n]
};

// The two GEMMs as the tile task describes them.
tasks::gemm::GemmDesc layer1_desc(FusedMlpProblem const& problem, FusedMlpTensors const& t);
tasks::gemm::GemmDesc layer2_desc(FusedMlpProblem const& problem, FusedMlpTensors const& t);

// Operands of one layer for the CPU executor: make_operands, with split-K slots numbered as on the
// GPU (tasks/gemm/device_gemm.hpp; the host body sums a tile's splits itself, no workspace).
tasks::gemm::GemmOperands host_operands(tasks::gemm::GemmDesc const& desc,
                                        tasks::gemm::GemmConfig const& config);

// Tile configurations of both layers for `processors` processor blocks, from the GEMM heuristic
// (tasks/gemm/heuristic.hpp). The first layer's choice (or problem.tile_m) sets the tile height
// of both; the second layer keeps its own width and split-K where they fit that height.
struct FusedMlpTiles {
  tasks::gemm::GemmConfig layer1, layer2;
};
FusedMlpTiles choose_fused_mlp_tiles(FusedMlpProblem const& problem, std::uint32_t processors,
                                     tasks::gemm::MmaPath path);

// The graph over both layers' operands: `layer1` and `layer2` are host copies to cut tiles from,
// `layer1_at` and `layer2_at` where the tasks find them (the same on the CPU, device copies on the
// GPU: tasks/gemm/device_gemm.hpp). `gemm_type` is GemmTile's type id in the pipeline that runs
// the graph; the template below derives it. Throws loom::Error if the layers' tile heights differ
// or the second layer does not read the first one's rows.
Graph build_fused_mlp_graph(std::uint16_t gemm_type, tasks::gemm::GemmOperands const& layer1,
                            tasks::gemm::GemmOperands const* layer1_at,
                            tasks::gemm::GemmOperands const& layer2,
                            tasks::gemm::GemmOperands const* layer2_at);

template <class Pipeline>
Graph build_fused_mlp_graph(tasks::gemm::GemmOperands const& layer1,
                            tasks::gemm::GemmOperands const* layer1_at,
                            tasks::gemm::GemmOperands const& layer2,
                            tasks::gemm::GemmOperands const* layer2_at) {
  return build_fused_mlp_graph(Pipeline::template id<tasks::GemmTile>, layer1, layer1_at, layer2,
                               layer2_at);
}

// Y in float64 from the same bf16 inputs (b1 may be null), the hidden layer kept in float64.
// Rows in parallel. Returns [m][n].
std::vector<double> reference_fused_mlp(FusedMlpProblem const& problem, Bf16 const* x,
                                        Bf16 const* w1, Bf16 const* w2, float const* b1 = nullptr);

// ||out - ref||_2 / ||ref||_2 over `count` elements (a NaN in `out` gives NaN).
double relative_error(float const* out, double const* ref, std::size_t count);
double relative_error(std::vector<float> const& out, std::vector<double> const& ref);

}  // namespace loom::examples
