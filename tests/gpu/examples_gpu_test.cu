// The examples' task types inside the persistent kernel, against float64 references: the fused
// MLP (bf16 GemmTile tasks with tile-level dependencies between the two layers, on the wgmma and
// the mma.sync paths), the fp32 TileMatmul task type, and the user-defined row softmax.
#include <cmath>
#include <cstring>
#include <random>

#include "examples/custom_task/row_softmax.hpp"
#include "examples/fused_mlp/fused_mlp.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "runtime/tiles.hpp"
#include "tasks/gemm/device_gemm.hpp"
#include "tasks/gemm_tile.hpp"
#include "tasks/tile_matmul.hpp"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/seed.hpp"
#include "tests/strided_matmul_check.hpp"

namespace {

namespace g = loom::tasks::gemm;
using g::Bf16;
using g::GemmActivation;
using loom::examples::FusedMlpProblem;
// The pipeline gemm_gpu_test.cu launches too: a pipeline run from two .cu files of one program
// (runtime/cuda/gpu_executor.cuh, kernel()).
using MlpPipeline = loom::Pipeline<loom::tasks::GemmTile>;
using MatmulPipeline = loom::Pipeline<loom::tasks::TileMatmul>;
using SoftmaxPipeline = loom::Pipeline<loom::examples::RowSoftmax>;

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<Bf16> random_bf16(std::size_t n, std::mt19937& rng, float scale) {
  std::vector<Bf16> v(n);
  for (auto& x : v) x = g::to_bf16(std::uniform_real_distribution<float>(-scale, scale)(rng));
  return v;
}

struct MlpCase {
  char const* name;
  FusedMlpProblem problem;
  bool bias;
  loom::SchedulingPolicy policy;
  g::MmaPath path;
};

class GpuFusedMlp : public ::testing::TestWithParam<MlpCase> {};

// Three launches over the same inputs, the hidden layer and Y poisoned before each: every launch
// matches float64, and gives the same bits as the first.
TEST_P(GpuFusedMlp, MatchesFloat64ReferenceOnEveryLaunch) {
  LOOM_REQUIRE_GPU();
  MlpCase const c = GetParam();
  FusedMlpProblem const p = c.problem;
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  auto const x = random_bf16(std::size_t{p.m} * p.k, rng, 1.0f);
  auto const w1 = random_bf16(std::size_t{p.w1_rows()} * p.k, rng, 1.0f / std::sqrt(float(p.k)));
  auto const w2 = random_bf16(std::size_t{p.n} * p.h, rng, 1.0f / std::sqrt(float(p.h)));
  auto const b1 = random_vector(c.bias ? p.w1_rows() : 0, rng, 0.5f);
  auto const ref = loom::examples::reference_fused_mlp(p, x.data(), w1.data(), w2.data(),
                                                       c.bias ? b1.data() : nullptr);

  loom::DeviceBuffer<Bf16> dx(x), dw1(w1), dw2(w2), hidden(std::size_t{p.m} * p.h);
  loom::DeviceBuffer<float> db1(b1), y(std::size_t{p.m} * p.n);
  loom::examples::FusedMlpTensors const t{dx.get(),  dw1.get(),    c.bias ? db1.get() : nullptr,
                                          dw2.get(), hidden.get(), y.get()};
  loom::GpuOptions options;
  options.policy = c.policy;
  auto const tiles = loom::examples::choose_fused_mlp_tiles(
      p, loom::GpuExecutor<MlpPipeline>::launch_shape(options).grid - 1, c.path);
  g::DeviceGemm const layer1(loom::examples::layer1_desc(p, t), tiles.layer1);
  g::DeviceGemm const layer2(loom::examples::layer2_desc(p, t), tiles.layer2);
  loom::GpuExecutor<MlpPipeline> ex(
      loom::examples::build_fused_mlp_graph<MlpPipeline>(layer1.host_view(), layer1.device(),
                                                         layer2.host_view(), layer2.device()),
      options);
  std::vector<float> first;
  for (int launch = 0; launch < 3; ++launch) {
    hidden.fill_bytes(0xFF);  // NaN: an unwritten tile or a read before write shows
    y.fill_bytes(0xFF);
    ex.run();
    std::vector<float> const out = y.download();
    EXPECT_LT(loom::examples::relative_error(out, ref), 1e-2) << "launch " << launch;
    if (launch == 0)
      first = out;
    else
      EXPECT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
          << "launch " << launch << " differs from launch 0";
  }
}

FusedMlpProblem mlp(std::uint32_t m, std::uint32_t k, std::uint32_t h, std::uint32_t n,
                    GemmActivation act, std::uint32_t tile_m = 0) {
  FusedMlpProblem p;
  p.m = m, p.k = k, p.h = h, p.n = n;
  p.tile_m = tile_m;
  p.activation = act;
  return p;
}

using A = GemmActivation;
using S = loom::SchedulingPolicy;
constexpr g::MmaPath kWgmma = g::MmaPath::wgmma, kMmaSync = g::MmaPath::mma_sync;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuFusedMlp,
    ::testing::Values(
        MlpCase{"default_relu", mlp(256, 256, 512, 256, A::relu), false, S::fifo, kWgmma},
        MlpCase{"default_gelu_bias", mlp(256, 256, 512, 256, A::gelu_tanh), true, S::priority,
                kWgmma},
        MlpCase{"clipped_swiglu_tile64", mlp(100, 72, 296, 40, A::swiglu, 64), true, S::fifo,
                kWgmma},
        MlpCase{"clipped_none_tile128", mlp(65, 136, 136, 72, A::none, 128), false, S::priority,
                kWgmma},
        MlpCase{"one_row", mlp(1, 8, 8, 8, A::relu), true, S::fifo, kWgmma},
        MlpCase{"large_swiglu", mlp(1024, 512, 2048, 512, A::swiglu), true, S::fifo, kWgmma},
        MlpCase{"large_gelu_priority", mlp(2048, 1024, 4096, 1024, A::gelu_tanh), false,
                S::priority, kWgmma},
        MlpCase{"mma_sync_clipped_gelu", mlp(100, 72, 296, 40, A::gelu_tanh, 64), true, S::fifo,
                kMmaSync},
        MlpCase{"mma_sync_large_swiglu", mlp(1024, 512, 2048, 512, A::swiglu), true, S::priority,
                kMmaSync}),
    [](::testing::TestParamInfo<MlpCase> const& info) { return std::string(info.param.name); });

// The fp32 SIMT tile task: sub-matrices of larger buffers, bias and activation per column, tiles
// clipped at both edges; the padding columns of C stay untouched.
TEST(GpuTileMatmul, StridedOperandsWithBiasMatchFloat64Reference) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  loom::test::StridedMatmul const mm(rng);
  loom::DeviceBuffer<float> da(mm.a), db(mm.b), dbias(mm.bias), dc(std::size_t{mm.m} * mm.ldc);
  dc.fill_bytes(0xFF);
  loom::tasks::MatmulOperands const op = mm.operands(da.get(), db.get(), dbias.get(), dc.get());
  loom::GraphBuilder builder;
  loom::TileGrid{mm.m, mm.n, 32, 16}.for_each([&](loom::Tile const& tile) {
    builder.add_task(MatmulPipeline::make<loom::tasks::TileMatmul>(
        loom::tasks::TileMatmul::tile_payload(op, tile)));
  });
  loom::GpuExecutor<MatmulPipeline> ex(builder.build());
  ex.run();
  mm.expect_matches_reference(dc.download());
}

TEST(GpuRowSoftmax, MatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
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
