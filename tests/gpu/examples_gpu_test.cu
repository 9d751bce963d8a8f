// The examples' task types inside the persistent kernel, against float64 references: the fused
// MLP (tile-level dependencies between the two layers) and the user-defined row softmax.
#include <cmath>
#include <random>

#include "examples/custom_task/row_softmax.hpp"
#include "examples/fused_mlp/fused_mlp.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "tasks/tile_matmul.hpp"
#include "tests/gpu/gpu_test_util.cuh"

namespace {

using loom::examples::FusedMlpProblem;
using loom::tasks::Activation;
using MlpPipeline = loom::Pipeline<loom::tasks::TileMatmul>;
using SoftmaxPipeline = loom::Pipeline<loom::examples::RowSoftmax>;

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct MlpCase {
  FusedMlpProblem problem;
  loom::SchedulingPolicy policy;
};

class GpuFusedMlp : public ::testing::TestWithParam<MlpCase> {};

TEST_P(GpuFusedMlp, MatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  FusedMlpProblem const p = GetParam().problem;
  unsigned const seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto const x = random_vector(std::size_t{p.m} * p.k, rng, 1.0f);
  auto const w1 = random_vector(std::size_t{p.k} * p.h, rng, 1.0f / std::sqrt(float(p.k)));
  auto const w2 = random_vector(std::size_t{p.h} * p.n, rng, 1.0f / std::sqrt(float(p.h)));
  auto const ref = loom::examples::reference_fused_mlp(p, x.data(), w1.data(), w2.data());

  loom::DeviceBuffer<float> dx(x), dw1(w1), dw2(w2);
  loom::DeviceBuffer<float> hidden(std::size_t{p.m} * p.h), y(std::size_t{p.m} * p.n);
  loom::GpuOptions options;
  options.policy = GetParam().policy;
  loom::GpuExecutor<MlpPipeline> ex(loom::examples::build_fused_mlp_graph<MlpPipeline>(
                                        p, dx.get(), dw1.get(), dw2.get(), hidden.get(), y.get()),
                                    options);
  for (int launch = 0; launch < 3; ++launch) {
    hidden.fill_bytes(0xFF);  // NaN: an unwritten tile or a read before write shows
    y.fill_bytes(0xFF);
    ex.run();
    double const err = loom::examples::relative_error(y.download(), ref);
    EXPECT_LT(err, 1e-5) << "launch " << launch;
  }
}

FusedMlpProblem mlp(std::uint32_t m, std::uint32_t k, std::uint32_t h, std::uint32_t n,
                    std::uint32_t tile, Activation act) {
  FusedMlpProblem p;
  p.m = m, p.k = k, p.h = h, p.n = n;
  p.tile_m = p.tile_h = p.tile_n = tile;
  p.activation = act;
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuFusedMlp,
    ::testing::Values(
        MlpCase{mlp(256, 256, 512, 256, 64, Activation::relu), loom::SchedulingPolicy::fifo},
        MlpCase{mlp(256, 256, 512, 256, 64, Activation::gelu_tanh),
                loom::SchedulingPolicy::priority},
        MlpCase{mlp(100, 70, 300, 33, 32, Activation::silu), loom::SchedulingPolicy::fifo},
        MlpCase{mlp(65, 129, 130, 67, 64, Activation::none), loom::SchedulingPolicy::priority},
        MlpCase{mlp(1, 5, 7, 3, 64, Activation::relu), loom::SchedulingPolicy::fifo},
        MlpCase{mlp(1024, 512, 2048, 512, 128, Activation::gelu_tanh),
                loom::SchedulingPolicy::fifo}));

TEST(GpuRowSoftmax, MatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  unsigned const seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (auto [rows, cols, block] :
       {std::tuple{1000u, 777u, 16u}, std::tuple{37u, 4096u, 5u}, std::tuple{513u, 1u, 64u}}) {
    auto const in = random_vector(std::size_t{rows} * cols, rng, 60.0f);
    std::vector<double> ref(in.size());
    for (std::uint32_t r = 0; r < rows; ++r) {
      double max = -INFINITY, sum = 0;
      for (std::uint32_t c = 0; c < cols; ++c) max = std::fmax(max, in[r * cols + c]);
      for (std::uint32_t c = 0; c < cols; ++c) sum += std::exp(in[r * cols + c] - max);
      for (std::uint32_t c = 0; c < cols; ++c)
        ref[r * cols + c] = std::exp(in[r * cols + c] - max) / sum;
    }
    loom::DeviceBuffer<float> din(in), dout(in.size());
    dout.fill_bytes(0xFF);
    loom::GraphBuilder b;
    for (std::uint32_t r0 = 0; r0 < rows; r0 += block) {
      loom::examples::RowSoftmax::Payload pl{din.get() + std::size_t{r0} * cols,
                                             dout.get() + std::size_t{r0} * cols,
                                             std::min(block, rows - r0),
                                             cols,
                                             cols,
                                             cols};
      b.add_task(SoftmaxPipeline::make<loom::examples::RowSoftmax>(pl));
    }
    loom::GpuExecutor<SoftmaxPipeline> ex(b.build());
    ex.run();
    EXPECT_LT(loom::examples::relative_error(dout.download(), ref), 1e-5)
        << rows << "x" << cols << " in blocks of " << block;
  }
}

}  // namespace
