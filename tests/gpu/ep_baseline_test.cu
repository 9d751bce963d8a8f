// The unfused expert-parallel baseline (bench/ep_baseline.cuh: NCCL all-to-all around the
// single-GPU unfused layer) over 2, 4 and 8 GPUs of one process, against the float64 reference:
// random routings with -1 entries, a rank with no tokens, every token to rank 0's experts,
// nothing routed at all; and each token sent once to each rank holding one of its experts.
// A case skips where fewer GPUs than its P are present.
#include <algorithm>
#include <random>
#include <string>
#include <tuple>

#include "bench/ep_baseline.cuh"
#include "moe/reference.hpp"
#include "runtime/cuda/scoped_device.hpp"
#include "tests/gpu/ep_test_util.cuh"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/gpu/moe_test_util.cuh"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

enum class Pattern { random_with_gaps, last_rank_empty, all_to_rank_zero, nothing_routed };

char const* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::random_with_gaps:
      return "random_with_gaps";
    case Pattern::last_rank_empty:
      return "last_rank_empty";
    case Pattern::all_to_rank_zero:
      return "all_to_rank_zero";
    case Pattern::nothing_routed:
      return "nothing_routed";
  }
  return "unknown";
}

using RankInput = ep_test::RankData;

UnfusedEpCall call_of(RankInput const& in) {
  return {in.dx.get(), in.tokens, in.dids.get(), in.dweights.get(), in.dout.get()};
}

// k distinct experts drawn from [first, first + count) for the token's slots, each slot left
// empty (-1) with probability `gap`.
void route_token(std::mt19937& rng, std::uint32_t k, std::int32_t first, std::int32_t count,
                 double gap, std::int32_t* ids, float* weights) {
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  std::bernoulli_distribution empty(gap);
  for (std::uint32_t j = 0; j < k; ++j) {
    std::int32_t e;
    do {
      e = first + static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(count));
    } while (std::find(ids, ids + j, e) != ids + j);
    ids[j] = e;
    weights[j] = weight(rng);
  }
  for (std::uint32_t j = 0; j < k; ++j)
    if (empty(rng)) ids[j] = -1;
}

class UnfusedEp : public ::testing::TestWithParam<std::tuple<std::uint32_t, ExpertGemmDispatch>> {};

TEST_P(UnfusedEp, MatchesFloat64ReferenceAndSendsEachTokenOncePerRank) {
  auto const [world, dispatch] = GetParam();
  if (loom::cuda_device_count() < static_cast<int>(std::max(2u, world)))
    GTEST_SKIP() << "needs " << std::max(2u, world) << " GPUs";
  // Two experts per rank at least: the all-to-rank-0 pattern draws top-2 from rank 0's.
  MoEConfig const c = moe_test::config(Activation::swiglu, RouterScore::softmax, 256, 256,
                                       std::max(8u, 2 * world), 2, 128);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::vector<int> devices(world);
  for (std::uint32_t r = 0; r < world; ++r) devices[r] = static_cast<int>(r);
  auto const comms = loom::NcclCommunicator::init_all(devices);
  UnfusedEpMoE ep(c, w, comms, dispatch);
  std::int32_t const per_rank = static_cast<std::int32_t>(c.experts / world);
  std::mt19937 rng(static_cast<unsigned>(seed));

  for (Pattern pattern : {Pattern::random_with_gaps, Pattern::last_rank_empty,
                          Pattern::all_to_rank_zero, Pattern::nothing_routed}) {
    SCOPED_TRACE(pattern_name(pattern));
    std::vector<RankInput> ranks(world);
    std::vector<std::uint32_t> expected_rows(world, 0);
    for (std::uint32_t r = 0; r < world; ++r) {
      RankInput& in = ranks[r];
      in.device = devices[r];
      in.tokens = pattern == Pattern::last_rank_empty && r == world - 1 ? 0
                  : pattern == Pattern::all_to_rank_zero                ? c.max_tokens
                                                                        : 1 + rng() % c.max_tokens;
      in.x = random_tokens(c, in.tokens, seed + 101 * r + static_cast<std::uint64_t>(pattern));
      in.ids.resize(std::size_t{in.tokens} * c.top_k);
      in.weights.resize(in.ids.size());
      for (std::uint32_t t = 0; t < in.tokens; ++t) {
        std::int32_t* ids = in.ids.data() + std::size_t{t} * c.top_k;
        float* wts = in.weights.data() + std::size_t{t} * c.top_k;
        if (pattern == Pattern::all_to_rank_zero)
          route_token(rng, c.top_k, 0, per_rank, 0.0, ids, wts);
        else
          route_token(rng, c.top_k, 0, static_cast<std::int32_t>(c.experts),
                      pattern == Pattern::nothing_routed ? 1.0 : 0.2, ids, wts);
        std::uint32_t mask = 0;
        for (std::uint32_t j = 0; j < c.top_k; ++j)
          if (ids[j] >= 0) mask |= 1u << (ids[j] / per_rank);
        for (std::uint32_t d = 0; d < world; ++d) expected_rows[d] += (mask >> d) & 1u;
      }
      in.upload(c.hidden);
    }

    std::vector<UnfusedEpCall> calls;
    for (auto const& in : ranks) calls.push_back(call_of(in));
    ep.forward(calls);
    ep.synchronize();

    EXPECT_EQ(ep.received_rows(), expected_rows);
    for (std::uint32_t r = 0; r < world; ++r) {
      RankInput const& in = ranks[r];
      if (in.tokens == 0) continue;
      auto const out = in.out();
      auto const ref =
          reference_moe(c, w, in.x.data(), in.tokens, in.ids.data(), in.weights.data());
      EXPECT_LT(relative_error(out, ref), 1e-2) << "rank " << r;
      for (std::uint32_t t = 0; t < in.tokens; ++t) {
        auto const* ids = in.ids.data() + std::size_t{t} * c.top_k;
        if (std::any_of(ids, ids + c.top_k, [](std::int32_t e) { return e >= 0; })) continue;
        for (std::uint32_t i = 0; i < c.hidden; ++i)
          ASSERT_EQ(__bfloat162float(out[std::size_t{t} * c.hidden + i]), 0.0f)
              << "rank " << r << ", token " << t << " has no expert";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, UnfusedEp,
                         ::testing::Combine(::testing::Values(2u, 4u, 8u),
                                            ::testing::Values(ExpertGemmDispatch::per_expert,
                                                              ExpertGemmDispatch::grouped)),
                         [](auto const& info) {
                           return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                  to_string(std::get<1>(info.param));
                         });

}  // namespace
