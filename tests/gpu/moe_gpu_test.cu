// The MoE layer in one persistent launch per call on the GPU, against the float64 reference:
// fused router and caller routing, every activation, skewed routings, bad routing, determinism,
// and agreement with the CPU executor's routing decisions.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "moe/gpu_layer.cuh"
#include "moe/pipeline.hpp"
#include "moe/reference.hpp"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/gpu/moe_test_util.cuh"
#include "tests/moe_checks.hpp"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

using moe_test::Case;
using moe_test::config;

class GpuMoE : public ::testing::TestWithParam<Case> {};

// One call of `layer` with the caller's routing (ids, wts: [tokens][top_k]) on tokens x, its
// output poisoned first (NaN): the relative error against the float64 reference.
double given_routing_error(GpuMoELayer& layer, MoEConfig const& c, MoEWeights const& w,
                           std::vector<bf16> const& x, std::uint32_t tokens,
                           std::vector<std::int32_t> const& ids, std::vector<float> const& wts) {
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
  loom::DeviceBuffer<std::int32_t> dids(ids);
  loom::DeviceBuffer<float> dw(wts);
  dout.fill_bytes(0xFF);
  layer.forward(dx.get(), tokens, dids.get(), dw.get(), dout.get());
  layer.check();
  return relative_error(dout.download(),
                        reference_moe(c, w, x.data(), tokens, ids.data(), wts.data()));
}

TEST_P(GpuMoE, FusedRouterMatchesFloat64Reference) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = GetParam().config;
  std::uint32_t const tokens = GetParam().tokens;
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, tokens, seed);
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
  GpuMoELayer layer(c, w);
  std::vector<bf16> first;
  for (int call = 0; call < 3; ++call) {
    dout.fill_bytes(0xFF);  // NaN
    layer.forward(dx.get(), tokens, dout.get());
    layer.check();
    auto const out = dout.download();
    auto const ids = layer.topk_ids();
    auto const wts = layer.topk_weights();
    auto const scores = reference_scores(c, w, x.data(), tokens);
    ASSERT_EQ(check_routing(c, scores, tokens, ids.data(), wts.data(), 1e-3), "");
    auto const ref = reference_moe(c, w, x.data(), tokens, ids.data(), wts.data());
    EXPECT_LT(relative_error(out, ref), 1e-2) << "call " << call;
    std::uint32_t routed = 0;
    for (auto n : layer.expert_tokens()) routed += n;
    EXPECT_EQ(routed, tokens * c.top_k);
    if (call == 0)
      first = out;
    else
      EXPECT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(bf16)))
          << "call " << call << " is not bitwise identical to the first";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, GpuMoE,
    ::testing::Values(
        Case{config(Activation::swiglu, RouterScore::softmax, 256, 256, 16, 2, 512), 512},
        Case{config(Activation::gelu, RouterScore::sigmoid, 128, 192, 8, 1, 300), 257},
        Case{config(Activation::relu, RouterScore::softmax, 192, 128, 6, 6, 100), 77},
        Case{config(Activation::swiglu, RouterScore::sigmoid, 512, 256, 64, 8, 256), 200},
        Case{config(Activation::swiglu, RouterScore::softmax, 128, 128, 4, 2, 64), 1},
        // More experts than the plan has threads: each sums a run of three (the last runs short).
        Case{config(Activation::swiglu, RouterScore::softmax, 128, 128, 160, 4, 300), 257}));

// The router on the tensor cores (a GEMM tile of kRouteTileTokens rows per route task) gives a
// token the same routing whatever its place in its tile and whichever call routes it: a call of
// `tokens` tokens and one of the same tokens after `shift` others (a different x, so a rewritten
// map, and every token at another row of another tile) agree bitwise on ids and weights, and both
// match the float64 scores. x must be 16-byte aligned for the tile's TMA reads.
TEST(GpuMoE, TileRouterRoutesATokenAlikeAtAnyRowOfAnyCall) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 512, 256, 128, 4, 512);
  ASSERT_TRUE(make_view_shape(c, choose_expert_gemms(c)).tile_router);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  GpuMoELayer layer(c, w);
  std::uint32_t const tokens = 300, shift = 37;
  auto const shifted = random_tokens(c, tokens + shift, seed + 1);
  std::vector<bf16> const x(shifted.begin() + std::size_t{shift} * c.hidden, shifted.end());
  loom::DeviceBuffer<bf16> dx(x), dshifted(shifted), dout(shifted.size());
  layer.forward(dx.get(), tokens, dout.get());
  layer.check();
  auto const ids = layer.topk_ids();
  auto const wts = layer.topk_weights();
  ASSERT_EQ(check_routing(c, reference_scores(c, w, x.data(), tokens), tokens, ids.data(),
                          wts.data(), 1e-3),
            "");
  layer.forward(dshifted.get(), tokens + shift, dout.get());
  layer.check();
  auto const ids2 = layer.topk_ids();
  auto const wts2 = layer.topk_weights();
  std::size_t const k = c.top_k, at = std::size_t{shift} * k;
  ASSERT_EQ(check_routing(c, reference_scores(c, w, shifted.data(), tokens + shift), tokens + shift,
                          ids2.data(), wts2.data(), 1e-3),
            "");
  for (std::size_t i = 0; i < std::size_t{tokens} * k; ++i) {
    ASSERT_EQ(ids[i], ids2[at + i]) << "token " << i / k << " slot " << i % k;
    ASSERT_EQ(0, std::memcmp(&wts[i], &wts2[at + i], sizeof(float)))
        << "token " << i / k << " slot " << i % k;
  }
  loom::DeviceBuffer<unsigned char> bytes(shifted.size() * sizeof(bf16) + 16);
  EXPECT_THROW(layer.forward(reinterpret_cast<bf16 const*>(bytes.get() + 2), 8, dout.get()),
               loom::Error);
}

// On the fallback path (mma.sync tiles, the router on mma.sync too), with few route groups each
// group's router slices are spread over several route tasks, the last of which sums them: the
// routing matches the float64 scores, and routing and output are bitwise those of a layer whose
// route tasks each read the whole router.
TEST(GpuMoE, SpreadRouterSlicesGiveTheRoutingOfWholeRouterTasks) {
  LOOM_REQUIRE_GPU();
  using loom::tasks::gemm::MmaPath;
  MoEConfig const few = config(Activation::swiglu, RouterScore::softmax, 1024, 256, 64, 8, 128);
  MoEConfig many = few;
  many.max_tokens = 4096;
  ASSERT_GT(make_view_shape(few, choose_expert_gemms(few, MmaPath::mma_sync)).route_parts, 1u);
  ASSERT_EQ(make_view_shape(many, choose_expert_gemms(many, MmaPath::mma_sync)).route_parts, 1u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(few, seed);
  GpuMoELayer spread(few, w, {}, MmaPath::mma_sync), whole(many, w, {}, MmaPath::mma_sync);
  for (std::uint32_t tokens : {128u, 45u, 1u}) {
    auto const x = random_tokens(few, tokens, seed + tokens);
    loom::DeviceBuffer<bf16> dx(x), da(std::size_t{tokens} * few.hidden), db(da.size());
    da.fill_bytes(0xFF);
    db.fill_bytes(0xFF);
    spread.forward(dx.get(), tokens, da.get());
    spread.check();
    whole.forward(dx.get(), tokens, db.get());
    whole.check();
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    checks::expect_matches_reference(few, w, x, tokens, spread, da.download());
    checks::expect_bitwise_equal(spread, da.download(), whole, db.download());
  }
}

// A layer with more route groups than kRouteTasks gives each route task several groups in turn
// (route_rounds): calls that end in a task's first group, in a later round and at the full size
// match the float64 reference and are bitwise those of layers sized for them.
TEST(GpuMoE, RouteTasksOfSeveralGroupsRouteEveryToken) {
  LOOM_REQUIRE_GPU();
  MoEConfig const big = config(Activation::swiglu, RouterScore::softmax, 256, 128, 8, 2, 8192);
  MoEView const shape = make_view_shape(big, choose_expert_gemms(big));
  ASSERT_GT(shape.route_rounds, 1u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(big, seed);
  GpuMoELayer layer(big, w);
  for (std::uint32_t tokens : checks::route_round_calls(shape, big.max_tokens)) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    MoEConfig fit = big;
    fit.max_tokens = tokens;
    GpuMoELayer exact(fit, w);
    auto const x = random_tokens(big, tokens, seed + tokens);
    loom::DeviceBuffer<bf16> dx(x), da(std::size_t{tokens} * big.hidden), db(da.size());
    da.fill_bytes(0xFF);
    db.fill_bytes(0xFF);
    layer.forward(dx.get(), tokens, da.get());
    layer.check();
    exact.forward(dx.get(), tokens, db.get());
    exact.check();
    checks::expect_matches_reference(big, w, x, tokens, layer, da.download());
    checks::expect_bitwise_equal(layer, da.download(), exact, db.download());
  }
}

// Where every route task has a processor of its own, the route tasks plan and gather the call
// themselves; a layer of fewer processors keeps the plan task and its gathers. Both route and
// compute bitwise alike (fused router and caller routing, a layer of several route rounds with
// calls of every size, skewed routings), and match the float64 reference.
TEST(GpuMoE, RouteTasksThatGatherComputeAsThePlanDoes) {
  LOOM_REQUIRE_GPU();
  MoEConfig const big = config(Activation::swiglu, RouterScore::softmax, 256, 128, 8, 2, 8192);
  MoEView const shape = make_view_shape(big, choose_expert_gemms(big));
  ASSERT_GT(shape.route_rounds, 1u);
  std::uint32_t const processors = loom::GpuExecutor<MoEPipeline>::launch_shape().grid - 1;
  if (processors < route_tasks(shape)) GTEST_SKIP() << processors << " processors";
  ASSERT_NE(
      make_layer_shapes(big, loom::tasks::gemm::MmaPath::wgmma, processors).main.route_gathers, 0u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(big, seed);
  loom::GpuOptions fewer;
  fewer.max_processors = route_tasks(shape) - 1;
  GpuMoELayer gathering(big, w), planned(big, w, fewer);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (std::uint32_t tokens : checks::route_round_calls(shape, big.max_tokens)) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    auto const x = random_tokens(big, tokens, seed + tokens);
    loom::DeviceBuffer<bf16> dx(x), da(std::size_t{tokens} * big.hidden), db(da.size());
    auto const [ids, wts] = checks::skewed_top2_of_8(2, tokens, rng);
    loom::DeviceBuffer<std::int32_t> dids(ids);
    loom::DeviceBuffer<float> dw(wts);
    for (bool given : {false, true}) {
      SCOPED_TRACE(given ? "caller routing" : "fused router");
      da.fill_bytes(0xFF);
      db.fill_bytes(0xFF);
      for (GpuMoELayer* layer : {&gathering, &planned}) {
        loom::DeviceBuffer<bf16>& out = layer == &gathering ? da : db;
        if (given)
          layer->forward(dx.get(), tokens, dids.get(), dw.get(), out.get());
        else
          layer->forward(dx.get(), tokens, out.get());
        layer->check();
      }
      if (given)
        EXPECT_LT(relative_error(da.download(),
                                 reference_moe(big, w, x.data(), tokens, ids.data(), wts.data())),
                  1e-2);
      else
        checks::expect_matches_reference(big, w, x, tokens, gathering, da.download());
      checks::expect_bitwise_equal(gathering, da.download(), planned, db.download());
      EXPECT_EQ(gathering.expert_tokens(), planned.expert_tokens());
    }
  }
}

TEST(GpuMoE, SkewedCallerRoutingMatchesReference) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 128, 8, 2, 400);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::uint32_t const tokens = 333;
  auto const x = random_tokens(c, tokens, seed);
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
  GpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int pattern = 0; pattern < checks::kSkewedPatterns; ++pattern) {
    auto const [ids, wts] = checks::skewed_top2_of_8(pattern, tokens, rng);
    loom::DeviceBuffer<std::int32_t> dids(ids);
    loom::DeviceBuffer<float> dw(wts);
    dout.fill_bytes(0xFF);
    layer.forward(dx.get(), tokens, dids.get(), dw.get(), dout.get());
    layer.check();
    checks::expect_skewed_output(pattern, dout.download(),
                                 reference_moe(c, w, x.data(), tokens, ids.data(), wts.data()));
  }
}

// Experts with more M-tiles than one group (kMTileGroup), the last group and its last tile
// partial: the groups' counters and their emission by the block, several calls in a row.
TEST(GpuMoE, ExpertsOfSeveralMTileGroupsMatchReference) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 128, 4, 2, 1200);
  std::uint32_t const tile_rows = choose_expert_gemms(c).up.block_m, tokens = 1200;
  ASSERT_GT(tokens, kMTileGroup * tile_rows);
  ASSERT_NE(tokens % tile_rows, 0u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, tokens, seed);
  GpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::vector<std::int32_t> ids(tokens * 2);
  std::vector<float> wts(tokens * 2);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    ids[2 * t] = 1;                       // every token: two groups, the last one partial
    ids[2 * t + 1] = t % 7 == 0 ? 3 : 2;  // most tokens, and a few to a third expert
    wts[2 * t] = weight(rng), wts[2 * t + 1] = weight(rng);
  }
  for (int call = 0; call < 3; ++call)
    EXPECT_LT(given_routing_error(layer, c, w, x, tokens, ids, wts), 1e-2) << "call " << call;
}

// A layer built with tall M-tiles runs the calls of few tokens on short ones (the plan picks the
// view per call), alternating with tall calls on the same counters.
TEST(GpuMoE, CallsOfFewTokensOnATallLayerUseShortMTiles) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 128, 4, 2, 1200);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  GpuMoELayer layer(c, w);
  std::uint32_t const short_tokens = kShortMTileRows * c.experts / c.top_k;
  ASSERT_EQ(layer.mtile_rows(c.max_tokens), 128u);
  ASSERT_EQ(layer.mtile_rows(short_tokens), 64u);
  ASSERT_EQ(layer.mtile_rows(short_tokens + 1), 128u);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (std::uint32_t tokens : {short_tokens, 1200u, 5u, short_tokens + 1, short_tokens}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    auto const x = random_tokens(c, tokens, rng());
    auto const [ids, wts] = checks::skewed_top2_of_4(tokens, rng);
    std::uint32_t const rows = layer.mtile_rows(tokens);
    // Caller routing, then the fused router on the same tokens.
    EXPECT_LT(given_routing_error(layer, c, w, x, tokens, ids, wts), 1e-2);
    std::uint32_t expected = 0;
    for (std::uint32_t n : layer.expert_tokens()) expected += (n + rows - 1) / rows;
    EXPECT_EQ(layer.mtiles(), expected) << rows << "-row M-tiles";
    loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
    dout.fill_bytes(0xFF);
    layer.forward(dx.get(), tokens, dout.get());
    layer.check();
    auto const used = layer.topk_ids();
    auto const used_w = layer.topk_weights();
    EXPECT_LT(relative_error(dout.download(),
                             reference_moe(c, w, x.data(), tokens, used.data(), used_w.data())),
              1e-2);
  }
}

// A tall layer's call whose experts end in M-tiles of 62, 65, 2 and 47 rows: three run on the
// short view's operands (64-row tiles), one on the tall ones; against float64.
TEST(GpuMoE, LastMTilesOfFewRowsRunOnTheShortOperands) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 128, 4, 2, 1200);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  GpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uint32_t const tokens = checks::kMixedLastTilesTokens;
  ASSERT_EQ(layer.mtile_rows(tokens), 128u);
  auto const x = random_tokens(c, tokens, rng());
  auto const [ids, wts] = checks::top2_with_counts(checks::kMixedLastTiles, tokens, rng);
  for (int call = 0; call < 3; ++call) {
    EXPECT_LT(given_routing_error(layer, c, w, x, tokens, ids, wts), 1e-2) << "call " << call;
    EXPECT_EQ(layer.expert_tokens(), checks::kMixedLastTiles);
    EXPECT_EQ(layer.mtiles(), 2u + 3u + 2u + 5u);
  }
}

// The error a call with the caller's routing ends in, or "no error".
std::string routing_failure(GpuMoELayer& layer, bf16 const* x, std::uint32_t tokens,
                            std::vector<std::int32_t> const& ids, std::vector<float> const& wts,
                            bf16* out) {
  loom::DeviceBuffer<std::int32_t> dids(ids);
  loom::DeviceBuffer<float> dw(wts);
  try {
    layer.forward(x, tokens, dids.get(), dw.get(), out);
    layer.check();
  } catch (loom::Error const& e) {
    return std::string(e.what());
  }
  return "no error";
}

TEST(GpuMoE, InvalidCallerRoutingEndsTheCallWithItsReason) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 128, 128, 8, 2, 64);
  GpuMoELayer layer(c, random_weights(c, 5));
  auto const x = random_tokens(c, 4, 5);
  loom::DeviceBuffer<bf16> dx(x), dout(4 * c.hidden);
  auto message = [&](std::vector<std::int32_t> const& ids, std::vector<float> const& wts) {
    return routing_failure(layer, dx.get(), 4, ids, wts, dout.get());
  };
  std::vector<float> const w8(8, 0.5f);
  EXPECT_NE(message({0, 1, 2, 8, 0, 1, 2, 3}, w8).find("token 1 names expert 8, outside"),
            std::string::npos);
  EXPECT_NE(message({0, 1, 2, 2, 0, 1, 2, 3}, w8).find("token 1 names expert 2 twice"),
            std::string::npos);
  std::vector<float> bad = w8;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message({0, 1, 2, 3, 4, 5, 6, 7}, bad).find("token 2 has a non-finite weight"),
            std::string::npos);
  // The layer is usable again and correct.
  std::vector<std::int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> wts(8, 0.5f);
  loom::DeviceBuffer<std::int32_t> dids(ids);
  loom::DeviceBuffer<float> dw(wts);
  layer.forward(dx.get(), 4, dids.get(), dw.get(), dout.get());
  layer.check();
  MoEWeights const w = random_weights(c, 5);
  auto const ref = reference_moe(c, w, x.data(), 4, ids.data(), wts.data());
  EXPECT_LT(relative_error(dout.download(), ref), 1e-2);
}

// The slots of a token are checked together on the device; the reason given is still the first
// failing slot's, in top-k order, as the CPU executor reports it.
TEST(GpuMoE, InvalidCallerRoutingNamesTheFirstFailingSlot) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 128, 128, 8, 4, 64);
  GpuMoELayer layer(c, random_weights(c, 6));
  auto const x = random_tokens(c, 2, 6);
  loom::DeviceBuffer<bf16> dx(x), dout(2 * c.hidden);
  float const nan = std::numeric_limits<float>::quiet_NaN();
  auto message = [&](std::vector<std::int32_t> token1, std::vector<float> w1) {
    std::vector<std::int32_t> ids = {0, 1, 2, 3};
    ids.insert(ids.end(), token1.begin(), token1.end());
    std::vector<float> wts(4, 0.25f);
    wts.insert(wts.end(), w1.begin(), w1.end());
    return routing_failure(layer, dx.get(), 2, ids, wts, dout.get());
  };
  std::vector<float> const ok(4, 0.25f);
  EXPECT_NE(message({1, 9, 1, 2}, ok).find("token 1 names expert 9, outside"), std::string::npos);
  EXPECT_NE(message({3, 3, -7, 2}, ok).find("token 1 names expert 3 twice"), std::string::npos);
  EXPECT_NE(message({5, 6, 7, 5}, {0.25f, nan, 0.25f, 0.25f})
                .find("token 1 has a non-finite weight for expert 6"),
            std::string::npos);
  // A repeat before a non-finite weight, and -1 entries that repeat without being an error.
  EXPECT_NE(message({4, 4, 6, 7}, {0.25f, 0.25f, nan, 0.25f}).find("token 1 names expert 4 twice"),
            std::string::npos);
  EXPECT_EQ(message({-1, 2, -1, 5}, {nan, 0.5f, nan, 0.5f}), "no error");
}

// A warp checks several tokens' routing at once (32 / top_k rounded up to a power of two): the
// same experts in different tokens are no repeat, and a bad token among good ones is named alone.
TEST(GpuMoE, CallerRoutingIsCheckedPerTokenWithinAWarp) {
  LOOM_REQUIRE_GPU();
  for (std::uint32_t top_k : {2u, 3u}) {
    MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 128, 128, 8, top_k, 64);
    MoEWeights const w = random_weights(c, 8);
    GpuMoELayer layer(c, w);
    std::uint32_t const tokens = 40;
    auto const x = random_tokens(c, tokens, 8);
    loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
    // Every token names experts 0 .. top_k - 1: one expert's pairs are all of a warp's lanes.
    std::vector<std::int32_t> ids(std::size_t{tokens} * top_k);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % top_k);
    std::vector<float> const wts(ids.size(), 1.0f / static_cast<float>(top_k));
    EXPECT_LT(given_routing_error(layer, c, w, x, tokens, ids, wts), 1e-2) << "top-" << top_k;
    EXPECT_EQ(layer.expert_tokens()[0], tokens);
    for (std::uint32_t bad : {9u, 17u, 39u}) {
      std::vector<std::int32_t> with_repeat = ids;
      with_repeat[std::size_t{bad} * top_k + 1] = with_repeat[std::size_t{bad} * top_k];
      std::string const m = routing_failure(layer, dx.get(), tokens, with_repeat, wts, dout.get());
      EXPECT_NE(m.find("token " + std::to_string(bad) + " names expert 0 twice"), std::string::npos)
          << m;
    }
    EXPECT_LT(given_routing_error(layer, c, w, x, tokens, ids, wts), 1e-2) << "top-" << top_k;
  }
}

// Every path reads x 16 bytes at a time: a misaligned x is refused before the launch, with the
// router fused or the routing given, and the layer goes on.
TEST(GpuMoE, MisalignedTokensAreRefusedBeforeTheLaunch) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 128, 128, 8, 2, 64);
  MoEWeights const w = random_weights(c, 4);
  GpuMoELayer layer(c, w);
  auto const x = random_tokens(c, 5, 4);
  std::vector<bf16> padded(x.size() + 1);  // x one element (2 bytes) in
  for (std::size_t i = 0; i < x.size(); ++i) padded[i + 1] = x[i];
  loom::DeviceBuffer<bf16> dpadded(padded), dout(5 * c.hidden);
  std::vector<std::int32_t> const ids = {0, 1, 2, 3, 4, 5, 6, 7, 0, -1};
  std::vector<float> const wts(10, 0.5f);
  loom::DeviceBuffer<std::int32_t> dids(ids);
  loom::DeviceBuffer<float> dw(wts);
  bf16 const* const misaligned = dpadded.get() + 1;
  for (bool given : {false, true}) {
    try {
      if (given)
        layer.forward(misaligned, 5, dids.get(), dw.get(), dout.get());
      else
        layer.forward(misaligned, 5, dout.get());
      layer.check();
      ADD_FAILURE() << "a misaligned x was taken, given routing " << given;
    } catch (loom::Error const& e) {
      EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(given_routing_error(layer, c, w, x, 5, ids, wts), 1e-2);
}

TEST(GpuMoE, NaNInATokenStaysInItsOwnRow) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 128, 128, 8, 2, 128);
  auto x = random_tokens(c, 100, 9);
  x[42 * c.hidden + 7] = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
  GpuMoELayer layer(c, random_weights(c, 9));
  loom::DeviceBuffer<bf16> dx(x), dout(100 * c.hidden);
  dout.fill_bytes(0xFF);
  layer.forward(dx.get(), 100, dout.get());
  layer.check();
  auto const out = dout.download();
  for (std::uint32_t t = 0; t < 100; ++t) {
    if (t == 42) continue;
    for (std::uint32_t i = 0; i < c.hidden; ++i)
      ASSERT_TRUE(std::isfinite(__bfloat162float(out[t * c.hidden + i]))) << "token " << t;
  }
}

TEST(GpuMoE, CallsReplayFromACudaGraph) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 256, 16, 2, 256);
  MoEWeights const w = random_weights(c, 21);
  auto const x = random_tokens(c, 200, 21);
  loom::DeviceBuffer<bf16> dx(x), dout(200 * c.hidden);
  GpuMoELayer layer(c, w);
  cudaStream_t stream;
  LOOM_CUDA(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  LOOM_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  layer.forward(dx.get(), 200, dout.get(), stream);
  LOOM_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  LOOM_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 20; ++i) {
    dout.fill_bytes(0xFF);
    LOOM_CUDA(cudaGraphLaunch(exec, stream));
    layer.check(stream);
  }
  auto const ref =
      reference_moe(c, w, x.data(), 200, layer.topk_ids().data(), layer.topk_weights().data());
  EXPECT_LT(relative_error(dout.download(), ref), 1e-2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A call that repeats the one before (pointers and token count) replays the layer's own graph of
// its enqueueing, captured at the first repeat, on whatever stream it is given; new contents in
// the same buffers give new results; another token count enqueues directly; a stream the caller
// is capturing takes the call directly.
TEST(GpuMoE, RepeatedCallsReplayTheLayersGraph) {
  LOOM_REQUIRE_GPU();
  MoEConfig const c = config(Activation::swiglu, RouterScore::softmax, 256, 256, 16, 2, 256);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  GpuMoELayer layer(c, w);
  loom::DeviceBuffer<bf16> dx(std::size_t{c.max_tokens} * c.hidden),
      dout(std::size_t{c.max_tokens} * c.hidden);
  cudaStream_t stream;
  LOOM_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Per call: its tokens, its stream, whether the caller captures it, the replays after it.
  struct Step {
    std::uint32_t tokens;
    bool own_stream, captured;
    std::uint64_t replayed;
  };
  Step const steps[] = {{200, false, false, 0}, {200, false, false, 1}, {200, true, false, 2},
                        {150, true, false, 2},  {150, false, false, 3}, {150, true, true, 3}};
  for (int i = 0; i < 6; ++i) {
    Step const& step = steps[i];
    auto const x = random_tokens(c, step.tokens, seed + i);
    dx.upload(x);
    dout.fill_bytes(0xFF);
    cudaStream_t const s = step.own_stream ? stream : nullptr;
    if (!step.captured) {
      layer.forward(dx.get(), step.tokens, dout.get(), s);
    } else {
      cudaGraph_t graph = nullptr;
      LOOM_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      try {
        layer.forward(dx.get(), step.tokens, dout.get(), s);
      } catch (...) {
        cudaStreamEndCapture(s, &graph);  // no capture outlives the test
        throw;
      }
      LOOM_CUDA(cudaStreamEndCapture(s, &graph));
      cudaGraphExec_t exec;
      LOOM_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      LOOM_CUDA(cudaGraphLaunch(exec, s));
      LOOM_CUDA(cudaStreamSynchronize(s));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    layer.check(s);
    EXPECT_EQ(layer.replayed_calls(), step.replayed) << "call " << i;
    auto const out = dout.download();
    auto const ref = reference_moe(c, w, x.data(), step.tokens, layer.topk_ids().data(),
                                   layer.topk_weights().data());
    EXPECT_LT(relative_error({out.begin(), out.begin() + std::size_t{step.tokens} * c.hidden}, ref),
              1e-2)
        << "call " << i;
  }
  cudaStreamDestroy(stream);
}

}  // namespace
