// The unfused baseline of bench/moe_bench.cu computes the same function as the fused layer: on
// the fused layer's routing, with its own router, and on skewed routings with gaps, against the
// float64 reference, for both ways of dispatching the expert GEMMs.
#include <random>
#include <string>
#include <tuple>

#include "bench/moe_baseline.cuh"
#include "moe/gpu_layer.cuh"
#include "moe/reference.hpp"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/gpu/moe_test_util.cuh"
#include "tests/moe_checks.hpp"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

using moe_test::Case;
using moe_test::config;

class UnfusedBaseline : public ::testing::TestWithParam<std::tuple<Case, ExpertGemmDispatch>> {};

TEST_P(UnfusedBaseline, OnTheFusedLayersRoutingMatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  auto const [tc, dispatch] = GetParam();
  MoEConfig const& c = tc.config;
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, tc.tokens, seed);
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tc.tokens} * c.hidden);

  GpuMoELayer fused(c, w);
  fused.forward(dx.get(), tc.tokens, dout.get());
  fused.check();
  auto const ids = fused.topk_ids();
  auto const wts = fused.topk_weights();
  loom::DeviceBuffer<std::int32_t> dids(ids);
  loom::DeviceBuffer<float> dw(wts);
  auto const ref = reference_moe(c, w, x.data(), tc.tokens, ids.data(), wts.data());

  UnfusedMoELayer baseline(c, w, dispatch);
  for (int call = 0; call < 2; ++call) {
    dout.fill_bytes(0xFF);  // NaN
    baseline.forward(dx.get(), tc.tokens, dids.get(), dw.get(), dout.get());
    LOOM_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(relative_error(dout.download(), ref), 1e-2) << "call " << call;
    std::uint32_t routed = 0;
    for (auto n : baseline.expert_tokens()) routed += n;
    EXPECT_EQ(routed, tc.tokens * c.top_k);
  }
}

TEST_P(UnfusedBaseline, OwnRouterPicksTheReferenceTopKAndMatchesReference) {
  LOOM_REQUIRE_GPU();
  auto const [tc, dispatch] = GetParam();
  MoEConfig const& c = tc.config;
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, tc.tokens, seed);
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tc.tokens} * c.hidden);
  dout.fill_bytes(0xFF);
  UnfusedMoELayer baseline(c, w, dispatch);
  baseline.forward(dx.get(), tc.tokens, dout.get());
  LOOM_CUDA(cudaDeviceSynchronize());
  auto const ids = baseline.topk_ids();
  auto const wts = baseline.topk_weights();
  auto const scores = reference_scores(c, w, x.data(), tc.tokens);
  ASSERT_EQ(check_routing(c, scores, tc.tokens, ids.data(), wts.data(), 1e-3), "");
  auto const ref = reference_moe(c, w, x.data(), tc.tokens, ids.data(), wts.data());
  EXPECT_LT(relative_error(dout.download(), ref), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, UnfusedBaseline,
    ::testing::Combine(
        ::testing::Values(
            Case{config(Activation::swiglu, RouterScore::softmax, 256, 256, 16, 2, 512), 512},
            Case{config(Activation::gelu, RouterScore::sigmoid, 128, 192, 8, 1, 300), 257},
            Case{config(Activation::relu, RouterScore::softmax, 192, 128, 6, 6, 100), 77},
            Case{config(Activation::swiglu, RouterScore::sigmoid, 512, 256, 64, 8, 256), 200},
            Case{config(Activation::swiglu, RouterScore::softmax, 128, 128, 4, 2, 64), 1}),
        ::testing::Values(ExpertGemmDispatch::per_expert, ExpertGemmDispatch::grouped)),
    [](auto const& info) {
      Case const& tc = std::get<0>(info.param);
      MoEConfig const& c = tc.config;
      return std::string(to_string(c.activation)) + "_" + to_string(c.router) + "_H" +
             std::to_string(c.hidden) + "_D" + std::to_string(c.ffn) + "_E" +
             std::to_string(c.experts) + "_k" + std::to_string(c.top_k) + "_T" +
             std::to_string(tc.tokens) + "_" + to_string(std::get<1>(info.param));
    });

TEST(UnfusedBaseline, SkewedRoutingWithGapsMatchesReference) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 128, 8, 2, 400);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::uint32_t const tokens = 333;
  auto const x = random_tokens(c, tokens, seed);
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (auto dispatch : {ExpertGemmDispatch::per_expert, ExpertGemmDispatch::grouped}) {
    UnfusedMoELayer baseline(c, w, dispatch);
    for (int pattern = 0; pattern < checks::kSkewedPatterns; ++pattern) {
      auto const [ids, wts] = checks::skewed_top2_of_8(pattern, tokens, rng);
      loom::DeviceBuffer<std::int32_t> dids(ids);
      loom::DeviceBuffer<float> dw(wts);
      dout.fill_bytes(0xFF);
      baseline.forward(dx.get(), tokens, dids.get(), dw.get(), dout.get());
      LOOM_CUDA(cudaDeviceSynchronize());
      SCOPED_TRACE(to_string(dispatch));
      checks::expect_skewed_output(pattern, dout.download(),
                                   reference_moe(c, w, x.data(), tokens, ids.data(), wts.data()));
    }
  }
}

}  // namespace
