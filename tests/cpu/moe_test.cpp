// The MoE layer on the CPU executor against the float64 reference: fused router and caller
// routing, every activation, skewed routings; bad input rejected; determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "moe/cpu_layer.hpp"
#include "moe/ep_pipeline.hpp"
#include "moe/expert_gemms.hpp"
#include "moe/expert_tasks.hpp"
#include "moe/pipeline.hpp"
#include "moe/reference.hpp"
#include "moe/row_fanout.hpp"
#include "moe/view.hpp"
#include "tests/cpu/test_support.hpp"
#include "tests/moe_checks.hpp"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

MoEConfig small_config(Activation act, std::uint32_t experts, std::uint32_t top_k) {
  MoEConfig c;
  c.hidden = 128;
  c.ffn = 128;
  c.experts = experts;
  c.top_k = top_k;
  c.activation = act;
  c.max_tokens = 100;
  return c;
}

// Four experts, top-2, sized for 1100 tokens: 128-row M-tiles, and a short view of 64-row ones.
MoEConfig tall_config() {
  MoEConfig c = small_config(Activation::swiglu, 4, 2);
  c.max_tokens = 1100;
  return c;
}

std::vector<bf16> poisoned(std::size_t n) {
  return std::vector<bf16>(n, __float2bfloat16(std::numeric_limits<float>::quiet_NaN()));
}

struct Case {
  Activation act;
  RouterScore score;
  std::uint32_t experts, top_k, tokens;
};

class CpuMoE : public ::testing::TestWithParam<Case> {};

// Only the combines run as calls on the device (their sums need the registers to themselves);
// every other body, the GEMM tiles' wgmma pipelines among them, is inlined into the kernel.
TEST(CpuMoE, OnlyTheCombinesRunAsCalls) {
  EXPECT_FALSE(MoEPipeline::called<RouteTile>);
  EXPECT_FALSE(MoEPipeline::called<RouteTokens>);
  EXPECT_FALSE(MoEPipeline::called<PlanExperts>);
  EXPECT_FALSE(MoEPipeline::called<GatherTokens>);
  EXPECT_FALSE(MoEPipeline::called<ExpertUp>);
  EXPECT_FALSE(MoEPipeline::called<ExpertDown>);
  EXPECT_TRUE(MoEPipeline::called<CombineTokens>);
  EXPECT_FALSE(EpPipeline::called<RouteTile>);
  EXPECT_FALSE(EpPipeline::called<RouteBlock>);
  EXPECT_FALSE(EpPipeline::called<PlanDispatch>);
  EXPECT_FALSE(EpPipeline::called<SendBlocks>);
  EXPECT_FALSE(EpPipeline::called<GatherArrivals>);
  EXPECT_FALSE(EpPipeline::called<ExpertUp>);
  EXPECT_FALSE(EpPipeline::called<ExpertDownRemote>);
  EXPECT_TRUE(EpPipeline::called<CombineTokens>);
  EXPECT_TRUE(EpPipeline::called<CombineArrived>);
}

TEST_P(CpuMoE, FusedRouterMatchesFloat64Reference) {
  Case const k = GetParam();
  MoEConfig c = small_config(k.act, k.experts, k.top_k);
  c.router = k.score;
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, k.tokens, seed);
  CpuMoELayer layer(c, w);
  for (int call = 0; call < 2; ++call) {
    auto out = poisoned(std::size_t{k.tokens} * c.hidden);
    layer.forward(x.data(), k.tokens, out.data());
    auto const ids = layer.topk_ids();
    auto const wts = layer.topk_weights();
    auto const scores = reference_scores(c, w, x.data(), k.tokens);
    EXPECT_EQ(check_routing(c, scores, k.tokens, ids.data(), wts.data(), 1e-3), "");
    auto const ref = reference_moe(c, w, x.data(), k.tokens, ids.data(), wts.data());
    EXPECT_LT(relative_error(out, ref), 1e-2) << "call " << call;
    std::uint32_t routed = 0;
    for (auto n : layer.expert_tokens()) routed += n;
    EXPECT_EQ(routed, k.tokens * c.top_k);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CpuMoE,
    ::testing::Values(Case{Activation::swiglu, RouterScore::softmax, 8, 2, 100},
                      Case{Activation::gelu, RouterScore::sigmoid, 4, 1, 37},
                      Case{Activation::relu, RouterScore::softmax, 6, 6, 64},  // top-k = experts
                      Case{Activation::swiglu, RouterScore::sigmoid, 16, 4, 1}));

// A route task covers several token blocks once there are more than kRouteTasks blocks; the
// call's tokens end inside a route task's span, and a block with only -1 routing (no pair) sits
// among routed ones.
TEST(CpuMoE, RouteTasksSpanningSeveralBlocksMatchReference) {
  MoEConfig c = small_config(Activation::swiglu, 8, 2);
  c.max_tokens = 600;
  std::uint32_t const token_block = token_block_for(c.max_tokens, c.hidden, c.experts);
  ASSERT_GT(route_blocks_for(c.max_tokens, token_block, c.hidden, c.experts), 1u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::uint32_t const tokens = 301;
  auto const x = random_tokens(c, tokens, seed);
  CpuMoELayer layer(c, w);
  auto out = poisoned(std::size_t{tokens} * c.hidden);
  layer.forward(x.data(), tokens, out.data());
  auto const ids = layer.topk_ids();
  auto const wts = layer.topk_weights();
  auto const scores = reference_scores(c, w, x.data(), tokens);
  EXPECT_EQ(check_routing(c, scores, tokens, ids.data(), wts.data(), 1e-3), "");
  auto ref = reference_moe(c, w, x.data(), tokens, ids.data(), wts.data());
  EXPECT_LT(relative_error(out, ref), 1e-2);

  std::vector<std::int32_t> given(ids.begin(), ids.end());
  std::vector<float> given_w(wts.begin(), wts.end());
  for (std::uint32_t t = 40; t < 48; ++t) given[2 * t] = given[2 * t + 1] = -1;
  out = poisoned(std::size_t{tokens} * c.hidden);
  layer.forward(x.data(), tokens, given.data(), given_w.data(), out.data());
  ref = reference_moe(c, w, x.data(), tokens, given.data(), given_w.data());
  EXPECT_LT(relative_error(out, ref), 1e-2);
  for (std::uint32_t t = 40; t < 48; ++t)
    for (std::uint32_t col = 0; col < c.hidden; ++col)
      ASSERT_EQ(__bfloat162float(out[std::size_t{t} * c.hidden + col]), 0.0f);
}

// Caller routing: all tokens to one expert, empty experts, -1 entries, nothing routed.
TEST(CpuMoE, SkewedCallerRoutingMatchesReference) {
  MoEConfig const c = small_config(Activation::swiglu, 8, 2);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::uint32_t const tokens = 97;
  auto const x = random_tokens(c, tokens, seed);
  CpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int pattern = 0; pattern < checks::kSkewedPatterns; ++pattern) {
    auto const [ids, wts] = checks::skewed_top2_of_8(pattern, tokens, rng);
    auto out = poisoned(std::size_t{tokens} * c.hidden);
    layer.forward(x.data(), tokens, ids.data(), wts.data(), out.data());
    checks::expect_skewed_output(pattern, out,
                                 reference_moe(c, w, x.data(), tokens, ids.data(), wts.data()));
    if (pattern == 0) {
      auto const counts = layer.expert_tokens();
      EXPECT_EQ(counts[3], tokens);
      EXPECT_EQ(counts[0], 0u);
    }
  }
}

// Experts with more M-tiles than one group (kMTileGroup), the last group and its last tile
// partial: the groups' arrival counters and their N-tile-major emission.
TEST(CpuMoE, ExpertsOfSeveralMTileGroupsMatchReference) {
  MoEConfig c = tall_config();
  std::uint32_t const tile_rows = choose_expert_gemms(c).up.block_m;
  std::uint32_t const tokens = 1100;
  ASSERT_GT(tokens, kMTileGroup * tile_rows);
  ASSERT_NE(tokens % tile_rows, 0u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  auto const x = random_tokens(c, tokens, seed);
  CpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::vector<std::int32_t> ids(tokens * 2);
  std::vector<float> wts(tokens * 2);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    ids[2 * t] = 1;                       // every token: 9 M-tiles, two groups
    ids[2 * t + 1] = t % 7 == 0 ? 3 : 2;  // most tokens, and a few to a third expert
    wts[2 * t] = weight(rng), wts[2 * t + 1] = weight(rng);
  }
  auto out = poisoned(std::size_t{tokens} * c.hidden);
  layer.forward(x.data(), tokens, ids.data(), wts.data(), out.data());
  auto const ref = reference_moe(c, w, x.data(), tokens, ids.data(), wts.data());
  EXPECT_LT(relative_error(out, ref), 1e-2);
  EXPECT_EQ(layer.expert_tokens()[1], tokens);
}

void calls_of_few_tokens_on_a_tall_layer(std::uint32_t ffn);

// A layer built with tall M-tiles runs the calls of few tokens on short ones (the plan picks the
// view per call), and the two alternate on the same counters without a trace left behind. With
// ffn = 640 an M-tile has 5 up N-tiles: one task each on the tall view, runs of 4 and 1 on the
// short one, whose calls retire the up tasks the dynamic bound counts beyond theirs.
TEST(CpuMoE, CallsOfFewTokensOnATallLayerUseShortMTiles) {
  for (std::uint32_t ffn : {128u, 640u}) {
    SCOPED_TRACE("ffn " + std::to_string(ffn));
    calls_of_few_tokens_on_a_tall_layer(ffn);
  }
}

void calls_of_few_tokens_on_a_tall_layer(std::uint32_t ffn) {
  MoEConfig c = tall_config();
  c.ffn = ffn;
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuMoELayer layer(c, w);
  std::uint32_t const short_tokens = kShortMTileRows * c.experts / c.top_k;
  ASSERT_EQ(layer.mtile_rows(c.max_tokens), 128u);
  ASSERT_EQ(layer.mtile_rows(short_tokens), 64u);
  ASSERT_EQ(layer.mtile_rows(short_tokens + 1), 128u);
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (std::uint32_t tokens : {short_tokens, 1100u, 5u, short_tokens + 1, short_tokens}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    auto const x = random_tokens(c, tokens, rng());
    auto const [ids, wts] = checks::skewed_top2_of_4(tokens, rng);
    auto out = poisoned(std::size_t{tokens} * c.hidden);
    layer.forward(x.data(), tokens, ids.data(), wts.data(), out.data());
    auto const ref = reference_moe(c, w, x.data(), tokens, ids.data(), wts.data());
    EXPECT_LT(relative_error(out, ref), 1e-2);
    std::uint32_t const rows = layer.mtile_rows(tokens);
    std::uint32_t expected = 0;
    for (std::uint32_t n : layer.expert_tokens()) expected += (n + rows - 1) / rows;
    EXPECT_EQ(layer.mtiles(), expected) << rows << "-row M-tiles";
  }
}

// The rule: on a layer with tall M-tiles, a tile of at most short_rows rows takes the short view's
// GEMM operands, any other tile its own view's; the short view has no short view of its own.
// The emitted tile carries its operands and its place in its M-tile group.
TEST(CpuMoE, LastMTilesOfFewRowsTakeTheShortOperands) {
  MoEConfig c = tall_config();
  LayerShapes shapes = make_layer_shapes(c, loom::tasks::gemm::MmaPath::wgmma);
  ASSERT_TRUE(shapes.has_short);
  ASSERT_EQ(shapes.main.tile_rows, 128u);
  EXPECT_EQ(shapes.main.short_rows, 64u);
  EXPECT_EQ(shapes.short_tiles.short_rows, 0u);
  loom::tasks::gemm::GemmOperands up_tall, up_short, down_tall, down_short;
  shapes.main.up_ops = &up_tall;
  shapes.main.down_ops = &down_tall;
  shapes.short_tiles.up_ops = &up_short;
  shapes.short_tiles.down_ops = &down_short;
  shapes.main.short_view = &shapes.short_tiles;
  TileOps const up = up_tile_ops(shapes.main), down = down_tile_ops(shapes.main);
  EXPECT_EQ(up.of(1), &up_short);
  EXPECT_EQ(up.of(64), &up_short);
  EXPECT_EQ(up.of(65), &up_tall);
  EXPECT_EQ(up.of(128), &up_tall);
  EXPECT_EQ(down.of(64), &down_short);
  EXPECT_EQ(down.of(65), &down_tall);
  EXPECT_EQ(up_tile_ops(shapes.short_tiles).of(64), &up_short);
  // A group of 175 rows of expert 2, whose pool rows start at 300, from global M-tile 7: task 3
  // is N-tile 1 of its second M-tile, which holds the last 47 rows.
  std::uint32_t offsets[] = {0, 120, 300, 475};
  shapes.main.offsets = offsets;
  loom::Task const task =
      group_tile(5, shapes.main, up, MTileGroup{2, 0, 2, 175, 300, 7, false}, 3);
  TilePayload p;
  std::memcpy(&p, task.payload, sizeof p);
  EXPECT_EQ(task.header.type, 5u);
  EXPECT_EQ(p.view, &shapes.main);
  EXPECT_EQ(p.row0, 428u);
  EXPECT_EQ(p.mtile, 8u);
  EXPECT_EQ(p.rows, 47u);
  EXPECT_EQ(p.expert, 2u);
  EXPECT_EQ(p.ntile, 1u);
  EXPECT_EQ(p.group_m, 1u);
  EXPECT_EQ(p.group_mtiles, 2u);
  EXPECT_EQ(p.ops, &up_short);
  EXPECT_EQ(p.b_l2, loom::tasks::gemm::L2Hint::normal);  // the first M-tile reads the same weights
  // An expert's only M-tile streams its weights: its B loads are evict_first.
  std::uint32_t tile_base[] = {0, 1, 3, 5};
  shapes.main.tile_base = tile_base;
  ASSERT_EQ(shapes.main.tile_rows, 128u);
  MTileGroup const sole = mtile_group_of(shapes.main, 0, 0);  // 120 rows
  EXPECT_TRUE(sole.sole);
  EXPECT_FALSE(mtile_group_of(shapes.main, 1, 1).sole);  // 180 rows: two M-tiles
  EXPECT_FALSE(mtile_group_of(shapes.main, 2, 0).sole);
  std::memcpy(&p, group_tile(5, shapes.main, up, sole, 0).payload, sizeof p);
  EXPECT_EQ(p.rows, 120u);
  EXPECT_EQ(p.b_l2, loom::tasks::gemm::L2Hint::evict_first);
  MoEConfig small = small_config(Activation::swiglu, 4, 2);
  small.max_tokens = 40;  // 64-row tiles: no short view
  LayerShapes const one = make_layer_shapes(small, loom::tasks::gemm::MmaPath::wgmma);
  EXPECT_EQ(one.main.tile_rows, 64u);
  EXPECT_FALSE(one.has_short);
  EXPECT_EQ(one.main.short_rows, 0u);

  // A call whose experts end in M-tiles of 62, 65, 2 and 47 rows, against float64.
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuMoELayer layer(c, w);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uint32_t const tokens = checks::kMixedLastTilesTokens;
  auto const x = random_tokens(c, tokens, rng());
  auto const [ids, wts] = checks::top2_with_counts(checks::kMixedLastTiles, tokens, rng);
  auto out = poisoned(std::size_t{tokens} * c.hidden);
  layer.forward(x.data(), tokens, ids.data(), wts.data(), out.data());
  EXPECT_LT(relative_error(out, reference_moe(c, w, x.data(), tokens, ids.data(), wts.data())),
            1e-2);
  EXPECT_EQ(layer.expert_tokens(), checks::kMixedLastTiles);
  EXPECT_EQ(layer.mtiles(), 2u + 3u + 2u + 5u);
}

// Up tasks as runs of N-tiles (MoEView::up_run) on views of 64-row tiles, through their own task
// type: task i of a group is the run i / M-tiles of its M-tile i % M-tiles; the last run of an odd
// N-tile count holds one N-tile. Down tasks stay single.
// up_task_at lists a call's up tasks as the M-tile groups' emissions do, group after group in
// expert order (experts without rows among them), bit for bit, on runs of N-tiles and on single
// tiles, with several M-tiles to a group.
TEST(CpuMoE, UpTaskAtListsTheGroupsTasksInOrder) {
  loom::test::TracedSeed const seed;
  std::mt19937 rng(static_cast<unsigned>(seed));
  MoEConfig c = tall_config();
  LayerShapes shapes = make_layer_shapes(c, loom::tasks::gemm::MmaPath::wgmma);
  loom::tasks::gemm::GemmOperands ops;
  for (MoEView* v : {&shapes.main, &shapes.short_tiles}) {
    v->up_ops = &ops;
    v->short_view = nullptr;
    v->mtile_group = 1 + rng() % 3;
    for (int round = 0; round < 20; ++round) {
      std::vector<std::uint32_t> offsets(v->experts + 1, 0), tile_base(v->experts + 1, 0);
      for (std::uint32_t e = 0; e < v->experts; ++e) {
        std::uint32_t const rows = rng() % 3 == 0 ? 0 : rng() % (5 * v->tile_rows);
        offsets[e + 1] = offsets[e] + rows;
        tile_base[e + 1] = tile_base[e] + (rows + v->tile_rows - 1) / v->tile_rows;
      }
      v->offsets = offsets.data();
      v->tile_base = tile_base.data();
      TileOps const up = up_tile_ops(*v);
      std::uint32_t k = 0;
      for (std::uint32_t e = 0; e < v->experts; ++e)
        for (std::uint32_t m = 0; m < tile_base[e + 1] - tile_base[e]; m += v->mtile_group) {
          MTileGroup const g = mtile_group_of(*v, e, m);
          for (std::uint32_t i = 0; i < g.mtiles * v->up_tasks; ++i, ++k) {
            loom::Task const want_task = group_tile(v->up_type, *v, up, g, i);
            loom::Task const got_task = up_task_at(*v, up, offsets.data(), tile_base.data(), k);
            TilePayload want, got;
            std::memcpy(&want, want_task.payload, sizeof want);
            std::memcpy(&got, got_task.payload, sizeof got);
            auto const fields = [](TilePayload const& p) {
              return std::vector<std::uint64_t>{reinterpret_cast<std::uintptr_t>(p.view),
                                                p.row0,
                                                p.mtile,
                                                p.rows,
                                                p.expert,
                                                p.ntile,
                                                p.count,
                                                p.group_m,
                                                p.group_mtiles,
                                                reinterpret_cast<std::uintptr_t>(p.ops),
                                                static_cast<std::uint64_t>(p.b_l2)};
            };
            ASSERT_EQ(got_task.header.type, want_task.header.type);
            ASSERT_EQ(fields(got), fields(want))
                << "round " << round << ", task " << k << " (expert " << e << ", group tile " << i
                << ", M-tiles per group " << v->mtile_group << ", up tasks " << v->up_tasks << ")";
          }
        }
      ASSERT_EQ(k, tile_base[v->experts] * v->up_tasks);
    }
  }
}

TEST(CpuMoE, UpTasksAreRunsOfNTiles) {
  MoEConfig c = tall_config();
  LayerShapes shapes = make_layer_shapes(c, loom::tasks::gemm::MmaPath::wgmma);
  ASSERT_TRUE(shapes.has_short);
  EXPECT_EQ(shapes.main.up_run, 1u);
  EXPECT_EQ(shapes.main.up_type, MoEPipeline::id<ExpertUp>);
  EXPECT_EQ(shapes.short_tiles.up_run, kShortUpRun);
  EXPECT_EQ(shapes.short_tiles.up_type, MoEPipeline::id<ExpertUpRun>);
  EXPECT_EQ(shapes.short_tiles.up_tasks,
            (shapes.short_tiles.up_tiles + kShortUpRun - 1) / kShortUpRun);
  MoEConfig small = c;
  small.max_tokens = 40;  // 64-row tiles throughout
  EXPECT_EQ(make_layer_shapes(small, loom::tasks::gemm::MmaPath::wgmma).main.up_run, kShortUpRun);
  MoEView& v = shapes.main;
  v.up_tiles = 5, v.up_run = 2, v.up_tasks = 3;
  loom::tasks::gemm::GemmOperands up_ops, down_ops;
  v.up_ops = &up_ops, v.down_ops = &down_ops;
  v.short_view = nullptr;
  std::uint32_t offsets[] = {0, 200, 500, 700, 900};
  v.offsets = offsets;
  MTileGroup const g{1, 0, 3, 300, 200, 4, false};  // M-tiles of 128, 128 and 44 rows
  auto const task = [&](TileOps const& ops, std::uint32_t i) {
    TilePayload p;
    std::memcpy(&p, group_tile(5, v, ops, g, i).payload, sizeof p);
    return p;
  };
  TilePayload p = task(up_tile_ops(v), 4);  // run 1 (N-tiles 2, 3) of M-tile 1
  EXPECT_EQ(p.ntile, 2u);
  EXPECT_EQ(p.count, 2u);
  EXPECT_EQ(p.row0, 328u);
  EXPECT_EQ(p.group_m, 1u);
  p = task(up_tile_ops(v), 8);  // run 2 (N-tile 4 alone) of M-tile 2
  EXPECT_EQ(p.ntile, 4u);
  EXPECT_EQ(p.count, 1u);
  EXPECT_EQ(p.rows, 44u);
  ASSERT_EQ(v.down_tiles, 1u);
  p = task(down_tile_ops(v), 1);  // down: N-tile 0 of M-tile 1
  EXPECT_EQ(p.ntile, 0u);
  EXPECT_EQ(p.count, 1u);
  EXPECT_EQ(p.group_m, 1u);
  // 9 up tasks carry 3 x 5 N-tiles: the group's counter target.
  std::uint32_t tiles = 0;
  for (std::uint32_t i = 0; i < g.mtiles * v.up_tasks; ++i) tiles += task(up_tile_ops(v), i).count;
  EXPECT_EQ(tiles, g.mtiles * v.up_tiles);
}

TEST(CpuMoE, TokensWithNoExpertGetZeros) {
  MoEConfig const c = small_config(Activation::relu, 4, 2);
  MoEWeights const w = random_weights(c, 7);
  auto const x = random_tokens(c, 40, 7);
  std::vector<std::int32_t> ids(80, -1);
  std::vector<float> wts(80, 1.0f);
  CpuMoELayer layer(c, w);
  auto out = poisoned(40 * c.hidden);
  layer.forward(x.data(), 40, ids.data(), wts.data(), out.data());
  for (auto v : out) ASSERT_EQ(__bfloat162float(v), 0.0f);
}

TEST(CpuMoE, InvalidCallerRoutingIsRejectedWithItsReason) {
  MoEConfig const c = small_config(Activation::swiglu, 8, 2);
  CpuMoELayer layer(c, random_weights(c, 1));
  auto const x = random_tokens(c, 4, 1);
  auto out = poisoned(4 * c.hidden);
  std::vector<float> wts(8, 0.5f);
  auto message = [&](std::vector<std::int32_t> ids, std::vector<float> w) {
    try {
      layer.forward(x.data(), 4, ids.data(), w.data(), out.data());
    } catch (loom::Error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0, 1, 2, 8, 0, 1, 2, 3}, wts).find("token 1 names expert 8, outside"),
            std::string::npos);
  EXPECT_NE(message({0, 1, 2, 2, 0, 1, 2, 3}, wts).find("token 1 names expert 2 twice"),
            std::string::npos);
  std::vector<float> bad = wts;
  bad[5] = std::numeric_limits<float>::infinity();
  EXPECT_NE(message({0, 1, 2, 3, 4, 5, 6, 7}, bad).find("token 2 has a non-finite weight"),
            std::string::npos);
  // The layer still works afterwards.
  std::vector<std::int32_t> good = {0, 1, 2, 3, 4, 5, 6, 7};
  layer.forward(x.data(), 4, good.data(), wts.data(), out.data());
}

// A layer of tall M-tiles runs an expert's last M-tile on the short configuration but emits it
// with the layer's N-tile counts: short configurations that cut N otherwise are refused at
// construction (they would leave columns uncomputed and over-retire the dynamic bound).
TEST(CpuMoE, ShortMTilesThatCutNOtherwiseAreRefused) {
  MoEConfig c = tall_config();
  ExpertGemmConfigs const tall = choose_expert_gemms(c);
  ExpertGemmConfigs narrow;
  ASSERT_TRUE(short_expert_gemms(c, loom::tasks::gemm::MmaPath::wgmma, narrow));
  EXPECT_NO_THROW(check_short_gemms(tall, narrow));
  narrow.down.block_n = tall.down.block_n / 2;
  try {
    check_short_gemms(tall, narrow);
    ADD_FAILURE() << "no error";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("the down GEMM's short M-tiles must use the tall ones' "
                                         "N-tiles (128 columns against 256)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuMoE, TooManyTokensIsRejected) {
  MoEConfig const c = small_config(Activation::gelu, 4, 1);
  CpuMoELayer layer(c, random_weights(c, 1));
  auto const x = random_tokens(c, 101, 1);
  auto out = poisoned(101 * c.hidden);
  EXPECT_THROW(layer.forward(x.data(), 101, out.data()), loom::Error);
}

TEST(CpuMoE, NaNInATokenStaysInItsOwnRow) {
  MoEConfig const c = small_config(Activation::swiglu, 8, 2);
  MoEWeights const w = random_weights(c, 3);
  std::uint32_t const tokens = 50;
  auto x = random_tokens(c, tokens, 3);
  x[17 * c.hidden + 5] = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
  CpuMoELayer layer(c, w);
  auto out = poisoned(tokens * c.hidden);
  layer.forward(x.data(), tokens, out.data());
  for (std::uint32_t t = 0; t < tokens; ++t)
    for (std::uint32_t i = 0; i < c.hidden; ++i)
      if (t != 17) {
        ASSERT_TRUE(std::isfinite(__bfloat162float(out[t * c.hidden + i]))) << t;
      }
}

TEST(CpuMoE, SameInputsGiveBitwiseSameOutput) {
  MoEConfig const c = small_config(Activation::swiglu, 8, 2);
  MoEWeights const w = random_weights(c, 11);
  auto const x = random_tokens(c, 100, 11);
  loom::CpuOptions chaos;
  chaos.chaos_seed = 99;
  CpuMoELayer calm(c, w), stirred(c, w, chaos);
  auto a = poisoned(100 * c.hidden), b = poisoned(100 * c.hidden);
  calm.forward(x.data(), 100, a.data());
  for (int i = 0; i < 3; ++i) {
    stirred.forward(x.data(), 100, b.data());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16))) << "call " << i;
  }
}

// On the decomposition of the mma.sync layers, with few route groups, each group's router slices
// are spread over several route tasks and the last one sums them. The routing matches the float64
// scores, and routing and output are bitwise those of a layer whose route tasks each read the
// whole router (many groups).
TEST(CpuMoE, SpreadRouterSlicesGiveTheRoutingOfWholeRouterTasks) {
  using loom::tasks::gemm::MmaPath;
  MoEConfig few = small_config(Activation::swiglu, 16, 4);
  few.hidden = 1024;
  few.max_tokens = 96;
  MoEConfig many = few;
  many.max_tokens = 4096;
  ASSERT_GT(make_view_shape(few, choose_expert_gemms(few, MmaPath::mma_sync)).route_parts, 1u);
  ASSERT_EQ(make_view_shape(many, choose_expert_gemms(many, MmaPath::mma_sync)).route_parts, 1u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(few, seed);
  CpuMoELayer spread(few, w, {}, MmaPath::mma_sync), whole(many, w, {}, MmaPath::mma_sync);
  for (std::uint32_t tokens : {90u, 1u, 96u}) {
    auto const x = random_tokens(few, tokens, seed + tokens);
    auto a = poisoned(std::size_t{tokens} * few.hidden), b = a;
    spread.forward(x.data(), tokens, a.data());
    whole.forward(x.data(), tokens, b.data());
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    checks::expect_matches_reference(few, w, x, tokens, spread, a);
    checks::expect_bitwise_equal(spread, a, whole, b);
  }
}

// A layer sized for more route groups than kRouteTasks gives each route task several groups in
// turn (route_rounds), so that a small call does not run a route task per group of the layer.
// Calls that end in a task's first group, in its second round, and the layer's full size match
// the reference and are bitwise those of a layer sized for the call.
TEST(CpuMoE, RouteTasksOfSeveralGroupsRouteEveryToken) {
  MoEConfig big = small_config(Activation::swiglu, 8, 2);
  big.max_tokens = 8192;
  MoEView const shape = make_view_shape(big, choose_expert_gemms(big));
  ASSERT_GT(shape.route_rounds, 1u);
  ASSERT_LE(route_tasks(shape), kRouteTasks);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(big, seed);
  CpuMoELayer layer(big, w);
  for (std::uint32_t tokens : checks::route_round_calls(shape, big.max_tokens)) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    MoEConfig fit = big;
    fit.max_tokens = tokens;
    CpuMoELayer exact(fit, w);
    // Gathers and combines in blocks of the layer sized for the call.
    EXPECT_EQ(call_block_for(shape, tokens),
              make_view_shape(fit, choose_expert_gemms(fit)).token_block);
    auto const x = random_tokens(big, tokens, seed + tokens);
    auto a = poisoned(std::size_t{tokens} * big.hidden), b = a;
    layer.forward(x.data(), tokens, a.data());
    exact.forward(x.data(), tokens, b.data());
    checks::expect_matches_reference(big, w, x, tokens, layer, a);
    checks::expect_bitwise_equal(layer, a, exact, b);
  }
}

// A call's block (its gathers' and combines' tokens) divides the layer's token block, is the
// layer's at max_tokens, and its blocks fit the per-block words (max_call_blocks) at every call
// size: over hidden sizes where the route staging caps the token block and where it does not,
// and layers from a few tokens to many.
TEST(CpuMoE, CallBlocksDivideTheTokenBlockAndFitTheirWords) {
  for (std::uint32_t hidden : {128u, 2048u, 7168u})
    for (std::uint32_t experts : {8u, 64u, 256u})
      for (std::uint32_t max_tokens : {1u, 100u, 255u, 256u, 1040u, 4101u, 16384u}) {
        MoEConfig c = small_config(Activation::swiglu, experts, 2);
        c.hidden = hidden;
        c.ffn = 128;
        c.max_tokens = max_tokens;
        MoEView const v = make_view_shape(c, choose_expert_gemms(c));
        SCOPED_TRACE(std::to_string(hidden) + " x " + std::to_string(experts) + ", " +
                     std::to_string(max_tokens) + " tokens");
        EXPECT_EQ(call_block_for(v, max_tokens), v.token_block);
        for (std::uint32_t tokens = 1; tokens <= max_tokens; tokens += 1 + tokens / 64) {
          std::uint32_t const cb = call_block_for(v, tokens);
          ASSERT_EQ(v.token_block % cb, 0u) << tokens << " tokens";
          ASSERT_EQ(cb & (cb - 1), 0u) << tokens << " tokens";
          ASSERT_LE((tokens + cb - 1) / cb, v.max_call_blocks) << tokens << " tokens";
        }
      }
}

// Where route tasks gather, the parts of a spread route group each pick the experts of a share of
// the group's blocks (RouteTokens::part_share): over every call size, the shares of a group's
// parts are contiguous, in part order, cover exactly the group's blocks that hold tokens of the
// call, and differ by at most one block, with more parts than blocks and fewer.
TEST(CpuMoE, SpreadGroupPartsShareOutTheirBlocks) {
  struct Shape {
    std::uint32_t hidden, experts, top_k, max_tokens;
  };
  bool fewer = false, not_fewer = false;  // blocks in the call than the group's parts
  for (Shape const s : {Shape{1024, 16, 4, 96}, Shape{2048, 64, 2, 1024}, Shape{7168, 64, 8, 128},
                        Shape{7168, 64, 8, 1000}, Shape{4096, 32, 2, 300}}) {
    MoEConfig c = small_config(Activation::swiglu, s.experts, s.top_k);
    c.hidden = s.hidden;
    c.max_tokens = s.max_tokens;
    MoEView v = make_view_shape(c, choose_expert_gemms(c, loom::tasks::gemm::MmaPath::mma_sync));
    SCOPED_TRACE(std::to_string(s.hidden) + " x " + std::to_string(s.experts) + ", " +
                 std::to_string(s.max_tokens) + " tokens");
    ASSERT_GT(v.route_parts, 1u);
    std::uint32_t call[kCallWords] = {};
    v.call = call;
    for (std::uint32_t tokens = 1; tokens <= s.max_tokens; tokens += 1 + tokens / 16) {
      call[0] = tokens;
      std::uint32_t const blocks = (tokens + v.token_block - 1) / v.token_block;
      for (std::uint32_t group = 0; group * v.route_blocks < blocks; ++group) {
        std::uint32_t const first = group * v.route_blocks;
        std::uint32_t const end = std::min(first + v.route_blocks, blocks);
        std::uint32_t next = first, least = ~0u, most = 0;
        for (std::uint32_t part = 0; part < v.route_parts; ++part) {
          Share const r = RouteTokens::part_share(v, group, part);
          ASSERT_EQ(r.first, next) << tokens << " tokens, group " << group << ", part " << part;
          next += r.count;
          least = std::min(least, r.count);
          most = std::max(most, r.count);
        }
        ASSERT_EQ(next, end) << tokens << " tokens, group " << group;
        ASSERT_LE(most - least, 1u) << tokens << " tokens, group " << group;
        (end - first < v.route_parts ? fewer : not_fewer) = true;
      }
    }
  }
  EXPECT_TRUE(fewer);
  EXPECT_TRUE(not_fewer);
}

// The wgmma layers of 128 to 256 experts route up to kRouteTileTokens tokens per route task (the
// router tile) while keeping kRouteTasks of them, the mma.sync layers at most kMaxTokenBlock;
// fewer or more experts, or a larger hidden size, keep the router on mma.sync. A call whose
// tokens end inside a route group matches the reference.
TEST(CpuMoE, TileRouterShapeRoutesATileOfTokensPerTask) {
  using loom::tasks::gemm::MmaPath;
  MoEConfig c = small_config(Activation::swiglu, kMinTileRouterExperts, 2);
  c.max_tokens = 600;
  MoEView const tiled = make_view_shape(c, choose_expert_gemms(c));
  ASSERT_TRUE(tiled.tile_router);
  EXPECT_LE(tiled.route_blocks * tiled.token_block, kRouteTileTokens);
  EXPECT_EQ(tiled.max_routes, (tiled.max_blocks + tiled.route_blocks - 1) / tiled.route_blocks);
  EXPECT_EQ(tile_route_blocks_for(16384, 32) * 32, kRouteTileTokens);
  EXPECT_EQ(tile_route_blocks_for(4096, 32), 1u);  // 128 route tasks of 32 tokens
  EXPECT_EQ(tile_route_blocks_for(128, 1), 1u);
  MoEView const fallback = make_view_shape(c, choose_expert_gemms(c, MmaPath::mma_sync));
  EXPECT_FALSE(fallback.tile_router);
  EXPECT_LE(fallback.route_blocks * fallback.token_block, kMaxTokenBlock);
  MoEConfig other = c;
  for (std::uint32_t experts : {kMinTileRouterExperts - 8, kMaxTileRouterExperts + 8}) {
    other.experts = experts;
    EXPECT_FALSE(make_view_shape(other, choose_expert_gemms(other)).tile_router) << experts;
  }
  other = c;
  other.hidden = kMaxTileRouterHidden + 1024;
  EXPECT_FALSE(make_view_shape(other, choose_expert_gemms(other)).tile_router);

  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuMoELayer layer(c, w);
  for (std::uint32_t tokens : {1u, 63u, 65u, 301u, 600u}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    auto const x = random_tokens(c, tokens, seed + tokens);
    auto out = poisoned(std::size_t{tokens} * c.hidden);
    layer.forward(x.data(), tokens, out.data());
    checks::expect_matches_reference(c, w, x, tokens, layer, out);
  }
}

using loom::test::options_with;  // tests/cpu/test_support.hpp

// Route tasks gather where each can have a processor of its own from the launch's start: then the
// graph is the route tasks alone, and the dynamic bound counts no gathers. Route groups whose
// router slices are spread over parts count every part; a router on tiles (route tasks that are
// not the launch's roots) keeps the plan task.
TEST(CpuMoE, RouteTasksGatherWhereEachHasAProcessor) {
  using loom::tasks::gemm::MmaPath;
  MoEConfig c = small_config(Activation::swiglu, 8, 2);
  c.max_tokens = 24;
  std::uint32_t const routes = route_tasks(make_view_shape(c, choose_expert_gemms(c)));
  LayerShapes const planned = make_layer_shapes(c, MmaPath::wgmma, routes - 1);
  LayerShapes const gathering = make_layer_shapes(c, MmaPath::wgmma, routes);
  EXPECT_EQ(planned.main.route_gathers, 0u);
  EXPECT_EQ(gathering.main.route_gathers, routes);
  EXPECT_EQ(make_layer_shapes(c, MmaPath::wgmma).main.route_gathers, 0u);
  MoEView const p = planned.main, g = gathering.main;
  loom::Graph const with_plan = build_moe_graph(p, nullptr), alone = build_moe_graph(g, nullptr);
  EXPECT_EQ(with_plan.tasks.size(), routes + 1);
  EXPECT_EQ(alone.tasks.size(), routes);
  EXPECT_EQ(alone.roots.size(), routes);
  EXPECT_TRUE(alone.events.empty());
  EXPECT_EQ(dynamic_bound(p) - dynamic_bound(g), g.max_call_blocks);

  MoEConfig tall = tall_config();
  LayerShapes const both = make_layer_shapes(tall, MmaPath::wgmma, 1000);
  ASSERT_TRUE(both.has_short);
  EXPECT_EQ(both.main.route_gathers, route_tasks(both.main));
  EXPECT_EQ(both.short_tiles.route_gathers, both.main.route_gathers);

  MoEConfig tiled = small_config(Activation::swiglu, kMinTileRouterExperts, 2);
  tiled.max_tokens = 600;
  LayerShapes const tile_router = make_layer_shapes(tiled, MmaPath::wgmma, 1000);
  ASSERT_TRUE(tile_router.main.tile_router);
  EXPECT_EQ(tile_router.main.route_gathers, 0u);
  MoEConfig few = small_config(Activation::swiglu, 16, 4);
  few.hidden = 2048;
  few.max_tokens = 64;
  LayerShapes const spread = make_layer_shapes(few, MmaPath::mma_sync, 1000);
  ASSERT_GT(spread.main.route_parts, 1u);
  EXPECT_EQ(spread.main.route_gathers, route_tasks(spread.main) * spread.main.route_parts);
}

// One call of x (tokens rows) on a layer whose route tasks gather and on one with the plan task,
// with the fused router or, given ids and wts, the caller's routing: bitwise the same routing,
// output and expert counts, the first against the float64 reference (zeros where nothing is
// routed).
void expect_gathering_as_planned(MoEConfig const& c, MoEWeights const& w,
                                 std::vector<bf16> const& x, std::uint32_t tokens,
                                 CpuMoELayer& gathering, CpuMoELayer& planned,
                                 checks::Top2Routing const* given = nullptr) {
  auto a = poisoned(std::size_t{tokens} * c.hidden), b = a;
  for (auto [layer, out] : {std::pair{&gathering, &a}, std::pair{&planned, &b}}) {
    if (given)
      layer->forward(x.data(), tokens, given->ids.data(), given->weights.data(), out->data());
    else
      layer->forward(x.data(), tokens, out->data());
  }
  if (!given) {
    checks::expect_matches_reference(c, w, x, tokens, gathering, a);
  } else {
    bool const routed =
        std::any_of(given->ids.begin(), given->ids.end(), [](std::int32_t id) { return id >= 0; });
    checks::expect_skewed_output(
        routed ? 0 : 3, a,
        reference_moe(c, w, x.data(), tokens, given->ids.data(), given->weights.data()));
  }
  checks::expect_bitwise_equal(gathering, a, planned, b);
  EXPECT_EQ(gathering.expert_tokens(), planned.expert_tokens());
}

// Route tasks that gather (a processor each) and the plan task with its gathers (fewer
// processors) route and compute bitwise alike, on the fused router and on skewed caller routings,
// over calls of every size. The tall layer's route tasks each take two token blocks, its calls of
// few tokens run on short M-tiles, and its experts of many rows on several M-tile groups; the
// spread layer's groups share out their blocks over the parts their router slices are spread on.
TEST(CpuMoE, RouteTasksThatGatherComputeAsThePlanDoes) {
  using loom::tasks::gemm::MmaPath;
  loom::test::TracedSeed const seed;
  std::mt19937 rng(static_cast<unsigned>(seed));
  {
    MoEConfig c = small_config(Activation::swiglu, 8, 2);
    c.max_tokens = 24;
    MoEWeights const w = random_weights(c, seed);
    std::uint32_t const routes = route_tasks(make_view_shape(c, choose_expert_gemms(c)));
    CpuMoELayer gathering(c, w, options_with(routes)), planned(c, w);
    for (std::uint32_t tokens : {1u, 17u, 24u}) {
      SCOPED_TRACE("tokens " + std::to_string(tokens));
      expect_gathering_as_planned(c, w, random_tokens(c, tokens, seed + tokens), tokens, gathering,
                                  planned);
    }
    auto const x = random_tokens(c, 24, seed);
    for (int pattern = 0; pattern < checks::kSkewedPatterns; ++pattern) {
      SCOPED_TRACE("pattern " + std::to_string(pattern));
      auto const given = checks::skewed_top2_of_8(pattern, 24, rng);
      expect_gathering_as_planned(c, w, x, 24, gathering, planned, &given);
    }
  }
  {
    MoEConfig few = small_config(Activation::swiglu, 16, 4);
    few.hidden = 1024;
    few.max_tokens = 96;
    MoEView const shape = make_view_shape(few, choose_expert_gemms(few, MmaPath::mma_sync));
    ASSERT_GT(shape.route_parts, 1u);
    MoEWeights const w = random_weights(few, seed);
    CpuMoELayer gathering(few, w, options_with(route_tasks(shape) * shape.route_parts),
                          MmaPath::mma_sync),
        planned(few, w, {}, MmaPath::mma_sync);
    // The caller's routing (top-4 of 16, some slots -1): each part checks and counts its share
    // of its group's blocks.
    std::uniform_real_distribution<float> weight(0.1f, 1.0f);
    checks::Top2Routing given{std::vector<std::int32_t>(96 * 4), std::vector<float>(96 * 4)};
    for (std::uint32_t t = 0; t < 96; ++t) {
      std::uint32_t const first = t % 7 == 0 ? 0 : static_cast<std::uint32_t>(rng() % 16);
      for (std::uint32_t j = 0; j < 4; ++j) {
        given.ids[4 * t + j] = t % 5 == j ? -1 : static_cast<std::int32_t>((first + 3 * j) % 16);
        given.weights[4 * t + j] = weight(rng);
      }
    }
    for (std::uint32_t tokens : {90u, 1u, 96u}) {
      SCOPED_TRACE("spread, tokens " + std::to_string(tokens));
      auto const x = random_tokens(few, tokens, seed + tokens);
      expect_gathering_as_planned(few, w, x, tokens, gathering, planned);
      expect_gathering_as_planned(few, w, x, tokens, gathering, planned, &given);
    }
  }
  MoEConfig const c = tall_config();
  MoEView const shape = make_view_shape(c, choose_expert_gemms(c));
  ASSERT_GT(shape.route_blocks, 1u);
  MoEWeights const w = random_weights(c, seed);
  CpuMoELayer gathering(c, w, options_with(route_tasks(shape))), planned(c, w);
  for (std::uint32_t tokens : {50u, 333u, 1100u}) {
    SCOPED_TRACE("tall, tokens " + std::to_string(tokens));
    auto const x = random_tokens(c, tokens, seed + tokens);
    auto const given = checks::skewed_top2_of_4(tokens, rng);
    expect_gathering_as_planned(c, w, x, tokens, gathering, planned, &given);
    expect_gathering_as_planned(c, w, x, tokens, gathering, planned);
  }
}

// Route tasks that take several route groups in turn (route_rounds > 1) gather every group they
// routed, and interleavings stirred by the executor's chaos change no bit.
TEST(CpuMoE, RouteTasksOfSeveralGroupsGatherEveryGroup) {
  MoEConfig big = small_config(Activation::swiglu, 8, 2);
  big.max_tokens = 8192;
  MoEView const shape = make_view_shape(big, choose_expert_gemms(big));
  ASSERT_GT(shape.route_rounds, 1u);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(big, seed);
  CpuMoELayer gathering(big, w, options_with(route_tasks(shape))),
      chaotic(big, w, options_with(route_tasks(shape), static_cast<std::uint64_t>(seed) + 1)),
      planned(big, w);
  for (std::uint32_t tokens : checks::route_round_calls(shape, big.max_tokens)) {
    if (tokens == big.max_tokens) continue;  // the rounds are covered by the call before
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    auto const x = random_tokens(big, tokens, seed + tokens);
    expect_gathering_as_planned(big, w, x, tokens, gathering, planned);
    expect_gathering_as_planned(big, w, x, tokens, chaotic, planned);
  }
}

// run_of (the run an emitted item belongs to, as the tile emission and the send order use it):
// against a linear scan, over random runs with empty ones (repeated starts) among them.
TEST(RunOf, FindsTheLastRunStartingAtOrBeforeEachItem) {
  loom::test::TracedSeed const seed;
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int round = 0; round < 200; ++round) {
    std::uint32_t const runs = 1 + rng() % 40;
    std::vector<std::uint32_t> starts(runs + 1, 0);
    for (std::uint32_t i = 1; i <= runs; ++i) starts[i] = starts[i - 1] + rng() % 4;  // 0: empty
    for (std::uint32_t k = 0; k < starts[runs]; ++k) {
      std::uint32_t expected = 0;
      for (std::uint32_t i = 0; i < runs; ++i)
        if (starts[i] <= k) expected = i;
      ASSERT_EQ(run_of(starts.data(), runs, k), expected) << "item " << k;
      ASSERT_LT(k, starts[expected + 1]) << "item " << k << " past its run";
    }
  }
}

// ChunkStep (how a thread of the device row copies moves on by the block size): at every step
// the row and chunk a division would give, for row widths below, at and above the stride.
TEST(ChunkStep, StepsToTheRowAndChunkADivisionGives) {
  for (std::uint32_t const stride : {32u, 128u, 384u, 512u})
    for (std::uint32_t const row_chunks : {1u, 7u, 8u, 64u, 256u, 383u, 384u, 385u, 896u, 1000u})
      for (std::uint32_t const thread : {0u, 1u, stride / 2, stride - 1}) {
        ChunkStep const step = ChunkStep::of(row_chunks, stride);
        std::uint32_t row = thread / row_chunks, chunk = thread % row_chunks;
        for (std::uint32_t k = 0; k < 3 * row_chunks + 64; ++k) {
          std::uint32_t const unit = thread + k * stride;
          ASSERT_EQ(row, unit / row_chunks)
              << "stride " << stride << ", " << row_chunks << " chunks a row, unit " << unit;
          ASSERT_EQ(chunk, unit % row_chunks)
              << "stride " << stride << ", " << row_chunks << " chunks a row, unit " << unit;
          step.advance(row, chunk);
        }
      }
}

TEST(MoEConfig, ViolationsNameTheConstraint) {
  auto message = [](MoEConfig c) {
    try {
      validate(c);
    } catch (loom::Error const& e) {
      return std::string(e.what());
    }
    return std::string("valid");
  };
  MoEConfig c;
  c.top_k = 9;
  EXPECT_NE(message(c).find("top_k=9"), std::string::npos);
  c = MoEConfig{};
  c.hidden = 100;
  EXPECT_NE(message(c).find("hidden=100 must be a positive multiple of 64"), std::string::npos);
  c = MoEConfig{};
  c.experts = 2;
  c.top_k = 3;
  EXPECT_NE(message(c).find("exceeds experts=2"), std::string::npos);
  EXPECT_EQ(message(MoEConfig{}), "valid");
}

}  // namespace
