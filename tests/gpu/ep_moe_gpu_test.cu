// The expert-parallel MoE layer over 2, 4 and 8 GPUs of one process (NCCL symmetric windows,
// LSA stores over NVLink), against the float64 reference: fused router, skewed caller routings,
// a rank with no tokens, -1 entries; bitwise equality for P = 1, 2, 4, 8 (as many as present) on
// one global problem; a rank that never arrives; the call after a failed one. A case skips where
// its GPUs are not present.
#include <cstring>
#include <random>
#include <utility>

#include "moe/ep_gpu_layer.cuh"
#include "moe/reference.hpp"
#include "runtime/cuda/scoped_device.hpp"
#include "tests/gpu/ep_test_util.cuh"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/gpu/moe_test_util.cuh"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

#define LOOM_REQUIRE_GPUS(n)                                                           \
  do {                                                                                 \
    if (::loom::cuda_device_count() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs"; \
  } while (0)

std::vector<int> first_devices(std::uint32_t n) {
  std::vector<int> d(n);
  for (std::uint32_t i = 0; i < n; ++i) d[i] = static_cast<int>(i);
  return d;
}

using ep_test::RankData;

// A rank's call: with the caller's routing when `routed`, else through the fused router.
EpRankCall call_of(RankData const& r, bool routed) {
  EpRankCall c;
  c.x = r.dx.get();
  c.tokens = r.tokens;
  c.out = r.dout.get();
  if (routed) c.ids = r.dids.get(), c.weights = r.dweights.get();
  return c;
}

std::vector<EpRankCall> calls(std::vector<RankData> const& ranks, bool routed) {
  std::vector<EpRankCall> c;
  for (auto const& r : ranks) c.push_back(call_of(r, routed));
  return c;
}

// The fused router's layer over `world` GPUs with random weights from a fresh seed.
struct RouterGroup {
  MoEConfig config =
      moe_test::config(Activation::swiglu, RouterScore::softmax, 512, 256, 16, 2, 256);
  loom::test::TracedSeed seed;  // names the seed in the failures of the test that holds the group
  MoEWeights weights = random_weights(config, seed);
  GpuEpMoEGroup group;

  explicit RouterGroup(std::uint32_t world) : group(config, weights, first_devices(world)) {}

  // Each rank with tokens: its router's choice against the float64 scores, and its output
  // against the float64 reference of that routing.
  void expect_matches_reference(std::vector<RankData> const& ranks, int call) {
    for (std::uint32_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].tokens == 0) continue;
      auto const ids = group.rank(r).topk_ids();
      auto const wts = group.rank(r).topk_weights();
      auto const scores = reference_scores(config, weights, ranks[r].x.data(), ranks[r].tokens);
      EXPECT_EQ(check_routing(config, scores, ranks[r].tokens, ids.data(), wts.data(), 1e-3), "")
          << "call " << call << " rank " << r;
      auto const ref = reference_moe(config, weights, ranks[r].x.data(), ranks[r].tokens,
                                     ids.data(), wts.data());
      EXPECT_LT(relative_error(ranks[r].out(), ref), 1e-2) << "call " << call << " rank " << r;
    }
  }
};

class EpGpu : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(EpGpu, FusedRouterMatchesFloat64ReferenceOverRepeatedCalls) {
  std::uint32_t const world = GetParam();
  LOOM_REQUIRE_GPUS(static_cast<int>(world));
  RouterGroup layer(world);
  SCOPED_TRACE("seed " + std::to_string(layer.seed));
  MoEConfig const& c = layer.config;
  std::uint64_t const seed = layer.seed;
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int call = 0; call < 4; ++call) {
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks[r].device = static_cast<int>(r);
      ranks[r].tokens = (call == 1 && r == world - 1) ? 0 : 1 + rng() % c.max_tokens;
      ranks[r].x = random_tokens(c, ranks[r].tokens, seed + 31 * r + call);
      ranks[r].upload(c.hidden);
    }
    layer.group.forward(calls(ranks, false));
    layer.group.check();
    layer.expect_matches_reference(ranks, call);
  }
}

// Calls with the same arguments replay per-rank CUDA graphs (captured at the first repeat) and
// stay correct with new contents in the same buffers; a call with another buffer enqueues
// directly, and the next repeat captures again.
TEST_P(EpGpu, RepeatedCallsReplayCapturedGraphs) {
  std::uint32_t const world = GetParam();
  LOOM_REQUIRE_GPUS(static_cast<int>(world));
  RouterGroup layer(world);
  SCOPED_TRACE("seed " + std::to_string(layer.seed));
  MoEConfig const& c = layer.config;
  std::uint64_t const seed = layer.seed;
  std::vector<RankData> ranks(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    ranks[r].device = static_cast<int>(r);
    ranks[r].tokens = c.max_tokens - 7 * r;
    ranks[r].x = random_tokens(c, ranks[r].tokens, seed + r);
    ranks[r].upload(c.hidden);
  }
  // Replayed calls after each call: the first enqueues, the second captures and replays, the
  // fifth has a new buffer on rank 0, the sixth captures again.
  std::uint64_t const replayed[] = {0, 1, 2, 3, 3, 4};
  for (int call = 0; call < 6; ++call) {
    for (std::uint32_t r = 0; call > 0 && r < world; ++r) {
      RankData& d = ranks[r];
      d.x = random_tokens(c, d.tokens, seed + 100 * call + r);
      if (call == 4 && r == 0) {
        d.upload(c.hidden);
        continue;
      }
      loom::ScopedDevice on(d.device);
      d.dx.upload(d.x);
      d.dout.fill_bytes(0xFF);
    }
    layer.group.forward(calls(ranks, false));
    layer.group.check();
    EXPECT_EQ(layer.group.replayed_calls(), replayed[call]) << "call " << call;
    layer.expect_matches_reference(ranks, call);
  }
}

// All tokens to one rank's experts, one hot expert, -1 entries, a rank with no tokens.
TEST_P(EpGpu, SkewedCallerRoutingsMatchReference) {
  std::uint32_t const world = GetParam();
  LOOM_REQUIRE_GPUS(static_cast<int>(world));
  MoEConfig const c = moe_test::config(Activation::gelu, RouterScore::softmax, 256, 256, 8, 2, 200);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  GpuEpMoEGroup group(c, w, first_devices(world));
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::int32_t const per_rank = static_cast<std::int32_t>(c.experts / world);
  for (int pattern = 0; pattern < 4; ++pattern) {
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      RankData& d = ranks[r];
      d.device = static_cast<int>(r);
      d.tokens = pattern == 3 && r == 0 ? 0 : c.max_tokens - 3 * r;
      d.x = random_tokens(c, d.tokens, seed + r + 7 * pattern);
      d.ids.resize(std::size_t{d.tokens} * 2);
      d.weights.resize(d.ids.size());
      for (std::uint32_t t = 0; t < d.tokens; ++t) {
        std::int32_t a = 0, b = -1;
        if (pattern == 0) a = per_rank * static_cast<std::int32_t>(world - 1), b = a + per_rank - 1;
        if (pattern == 1) a = 1, b = -1;  // one hot expert
        if (pattern == 2)
          a = t % 4 ? int(rng() % c.experts) : -1, b = t % 3 ? -1 : int(rng() % c.experts);
        if (pattern == 3) a = int(rng() % c.experts), b = int(rng() % c.experts);
        if (a == b) b = -1;
        d.ids[2 * t] = a, d.ids[2 * t + 1] = b;
        d.weights[2 * t] = weight(rng), d.weights[2 * t + 1] = weight(rng);
      }
      d.upload(c.hidden);
    }
    group.forward(calls(ranks, true));
    group.check();
    for (std::uint32_t r = 0; r < world; ++r) {
      if (ranks[r].tokens == 0) continue;
      auto const ref = reference_moe(c, w, ranks[r].x.data(), ranks[r].tokens, ranks[r].ids.data(),
                                     ranks[r].weights.data());
      EXPECT_LT(relative_error(ranks[r].out(), ref), 1e-2)
          << "pattern " << pattern << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, EpGpu, ::testing::Values(1u, 2u, 4u, 8u));

// One global problem over 1, 2, 4 and 8 GPUs (those present): bitwise the same output. With 16
// experts the router runs in the route tasks (mma.sync), with 128 on the tensor cores (RouteTile).
// With 2048 tokens over 16 experts (about 256 rows each, 128-row M-tiles), which rows fill an
// expert's last M-tile, and whether it runs on the 64-row operands, depends on the order the rows
// arrive in, which differs between world sizes.
class EpGpuWorlds : public ::testing::TestWithParam<std::pair<std::uint32_t, std::uint32_t>> {};
INSTANTIATE_TEST_SUITE_P(ExpertsAndTokens, EpGpuWorlds,
                         ::testing::Values(std::pair{16u, 512u}, std::pair{128u, 512u},
                                           std::pair{16u, 2048u}));

TEST_P(EpGpuWorlds, OutputIsBitwiseIdenticalAcrossWorldSizes) {
  LOOM_REQUIRE_GPUS(2);
  auto const [experts, global_tokens] = GetParam();
  MoEConfig const whole = moe_test::config(Activation::swiglu, RouterScore::softmax, 512, 256,
                                           experts, 2, global_tokens);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(whole, seed);
  auto const x = random_tokens(whole, global_tokens, seed);
  std::vector<bf16> first;
  for (std::uint32_t world : {1u, 2u, 4u, 8u}) {
    if (static_cast<int>(world) > loom::cuda_device_count()) continue;
    MoEConfig c = whole;
    c.max_tokens = global_tokens / world;
    GpuEpMoEGroup group(c, w, first_devices(world));
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks[r].device = static_cast<int>(r);
      ranks[r].tokens = c.max_tokens;
      auto const from = x.begin() + std::size_t{r} * c.max_tokens * c.hidden;
      ranks[r].x.assign(from, from + std::size_t{c.max_tokens} * c.hidden);
      ranks[r].upload(c.hidden);
    }
    group.forward(calls(ranks, false));
    group.check();
    std::vector<bf16> joined;
    for (auto const& r : ranks) {
      auto const o = r.out();
      joined.insert(joined.end(), o.begin(), o.end());
    }
    if (first.empty()) {
      first = joined;
      auto const ids = group.rank(0).topk_ids();
      auto const wts = group.rank(0).topk_weights();
      EXPECT_LT(relative_error(joined, reference_moe(whole, w, x.data(), global_tokens, ids.data(),
                                                     wts.data())),
                1e-2);
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), joined.data(), first.size() * sizeof(bf16)))
          << "world " << world << " differs from world 1";
    }
  }
}

// A call that is bad on one rank is refused before any rank launches (a launched rank would
// wait for the refused one's counts until its watchdog); the next good call runs.
TEST(EpGpu, ABadCallOnOneRankLaunchesNoRank) {
  LOOM_REQUIRE_GPUS(2);
  MoEConfig const c = moe_test::config(Activation::relu, RouterScore::softmax, 256, 256, 8, 2, 64);
  MoEWeights const w = random_weights(c, 4);
  GpuEpMoEGroup group(c, w, first_devices(2));
  std::vector<RankData> ranks(2);
  for (std::uint32_t r = 0; r < 2; ++r) {
    ranks[r].device = static_cast<int>(r);
    ranks[r].tokens = 64;
    ranks[r].x = random_tokens(c, 64, 40 + r);
    ranks[r].upload(c.hidden);
  }
  std::vector<EpRankCall> bad = calls(ranks, false);
  bad[1].tokens = c.max_tokens + 1;
  try {
    group.forward(bad);
    FAIL() << "the call was accepted";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: 65 tokens exceed max_tokens=64"),
              std::string::npos)
        << e.what();
  }
  group.check();  // nothing launched, nothing failed
  group.forward(calls(ranks, false));
  group.check();
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto const ids = group.rank(r).topk_ids();
    auto const wts = group.rank(r).topk_weights();
    auto const ref = reference_moe(c, w, ranks[r].x.data(), 64, ids.data(), wts.data());
    EXPECT_LT(relative_error(ranks[r].out(), ref), 1e-2) << "rank " << r;
  }
}

// A call whose routing one rank's kernel rejects (a token naming one expert twice) fails on every
// rank; the group restarts from zeroed windows, and the next call matches the reference: nothing
// of the failed call (send tickets, armed block counters, the combine list) leaks into it.
TEST(EpGpu, AFailedCallLeavesTheNextOneCorrect) {
  LOOM_REQUIRE_GPUS(2);
  MoEConfig const c = moe_test::config(Activation::relu, RouterScore::softmax, 256, 256, 8, 2, 64);
  MoEWeights const w = random_weights(c, 5);
  loom::GpuOptions o;
  o.watchdog = std::chrono::milliseconds(500);
  GpuEpMoEGroup group(c, w, first_devices(2), o);
  std::vector<RankData> ranks(2);
  for (std::uint32_t r = 0; r < 2; ++r) {
    RankData& d = ranks[r];
    d.device = static_cast<int>(r);
    d.tokens = 64;
    d.x = random_tokens(c, 64, 50 + r);
    for (std::uint32_t t = 0; t < d.tokens; ++t) {
      d.ids.push_back(static_cast<std::int32_t>(t % c.experts));
      d.ids.push_back(static_cast<std::int32_t>((t + 1 + 2 * r) % c.experts));
      d.weights.push_back(0.75f);
      d.weights.push_back(0.25f);
    }
  }
  ranks[1].ids[2 * 5 + 1] = ranks[1].ids[2 * 5];  // token 5 of rank 1 names one expert twice
  for (auto& d : ranks) d.upload(c.hidden);
  group.forward(calls(ranks, true));
  try {
    group.check();
    FAIL() << "the call did not fail";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("token 5 names expert 5 twice"), std::string::npos)
        << e.what();
  }
  ranks[1].ids[2 * 5 + 1] = 0;
  for (auto& d : ranks) d.upload(c.hidden);  // and the outputs poisoned again
  group.forward(calls(ranks, true));
  group.check();
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto const ref = reference_moe(c, w, ranks[r].x.data(), ranks[r].tokens, ranks[r].ids.data(),
                                   ranks[r].weights.data());
    EXPECT_LT(relative_error(ranks[r].out(), ref), 1e-2) << "rank " << r;
  }
}

TEST(EpGpu, ARankThatNeverArrivesIsNamedByTheOthers) {
  LOOM_REQUIRE_GPUS(2);
  MoEConfig const c = moe_test::config(Activation::relu, RouterScore::softmax, 256, 256, 8, 2, 64);
  loom::GpuOptions o;
  o.watchdog = std::chrono::milliseconds(500);
  GpuEpMoEGroup group(c, random_weights(c, 3), first_devices(2), o, /*silent_rank=*/1);
  std::vector<RankData> ranks(2);
  for (std::uint32_t r = 0; r < 2; ++r) {
    ranks[r].device = static_cast<int>(r);
    ranks[r].tokens = 64;
    ranks[r].x = random_tokens(c, 64, r);
    ranks[r].upload(c.hidden);
  }
  group.forward(calls(ranks, false));
  try {
    group.check();
    FAIL() << "the call did not fail";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0): waited on a signal from peer rank 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
