// A non-MoE fused pipeline: the two-layer MLP Y = act(X · W1 + b1) · W2 as one graph of TileMatmul
// tasks, with tile-level dependencies instead of a barrier between the layers.
//
//   hidden tile (i, j) = act(X[row block i] · W1[:, hidden cols j] + b1)   completes event i
//   output tile (i, j) = hidden[row block i] · W2[:, output cols j]        gated on event i
//
// Event i expects one arrival per hidden column tile, so the output tiles of row block i start as
// soon as that block's hidden row is complete, while other row blocks are still in layer one.
// Output tiles carry priority 1 (hidden tiles 0): under the priority policy a ready second-layer
// tile runs before more first-layer work.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"
#include "tasks/tile_matmul.hpp"

namespace loom::examples {

// X [m][k], W1 [k][h], b1 [h] (optional), W2 [h][n], hidden [m][h], Y [m][n]; all row-major and
// dense (leading dimension = row length).
struct FusedMlpProblem {
  std::uint32_t m = 256, k = 256, h = 512, n = 256;
  std::uint32_t tile_m = 64;  // rows per tile, both layers
  std::uint32_t tile_h = 64;  // hidden columns per first-layer tile
  std::uint32_t tile_n = 64;  // output columns per second-layer tile
  tasks::Activation activation = tasks::Activation::relu;

  // Multiply-adds of both layers, counted as two flops each.
  double flops() const { return 2.0 * m * h * (double(k) + double(n)); }
};

// Throws loom::Error naming the first zero extent or tile size.
void validate(FusedMlpProblem const& problem);

// The graph over the given buffers (host memory for the CPU executor, device memory for the GPU:
// only the pointers are recorded). `matmul_type` is TileMatmul's type id in the pipeline that
// will run the graph; the template below derives it.
Graph build_fused_mlp_graph(std::uint16_t matmul_type, FusedMlpProblem const& problem,
                            float const* x, float const* w1, float const* w2, float* hidden,
                            float* y, float const* b1 = nullptr);

template <class Pipeline>
Graph build_fused_mlp_graph(FusedMlpProblem const& problem, float const* x, float const* w1,
                            float const* w2, float* hidden, float* y, float const* b1 = nullptr) {
  return build_fused_mlp_graph(Pipeline::template id<tasks::TileMatmul>, problem, x, w1, w2, hidden,
                               y, b1);
}

// Y in float64 from the same float inputs (b1 may be null), rows in parallel. Returns [m][n].
std::vector<double> reference_fused_mlp(FusedMlpProblem const& problem, float const* x,
                                        float const* w1, float const* w2,
                                        float const* b1 = nullptr);

// ||out - ref||_2 / ||ref||_2 over `count` elements (a NaN in `out` gives NaN).
double relative_error(float const* out, double const* ref, std::size_t count);
double relative_error(std::vector<float> const& out, std::vector<double> const& ref);

}  // namespace loom::examples
