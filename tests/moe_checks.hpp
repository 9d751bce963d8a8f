// Checks the CPU and GPU MoE suites share: a call's routing and output against the float64
// reference, and two layers' calls against each other, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "moe/reference.hpp"
#include "moe/view.hpp"

namespace loom::moe::checks {

// The layer's last call on x (tokens rows): routing against the float64 scores, output within
// 1e-2 of the float64 layer run on that routing.
template <class Layer>
void expect_matches_reference(MoEConfig const& c, MoEWeights const& w, std::vector<bf16> const& x,
                              std::uint32_t tokens, Layer const& layer,
                              std::vector<bf16> const& out) {
  auto const ids = layer.topk_ids();
  auto const wts = layer.topk_weights();
  auto const scores = reference_scores(c, w, x.data(), tokens);
  EXPECT_EQ(check_routing(c, scores, tokens, ids.data(), wts.data(), 1e-3), "") << tokens;
  auto const ref = reference_moe(c, w, x.data(), tokens, ids.data(), wts.data());
  EXPECT_LT(relative_error(out, ref), 1e-2) << tokens;
}

// Top-2 caller routing over 4 experts, ids [tokens][2] and weights: expert 0 takes three tokens
// in four (more rows than a short M-tile holds even in a short call), every fifth token has a -1.
struct Top2Routing {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};
inline Top2Routing skewed_top2_of_4(std::uint32_t tokens, std::mt19937& rng) {
  Top2Routing r{std::vector<std::int32_t>(tokens * 2), std::vector<float>(tokens * 2)};
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    std::int32_t const a = t % 4 == 3 ? static_cast<std::int32_t>(rng() % 4) : 0;
    r.ids[2 * t] = a;
    r.ids[2 * t + 1] = t % 5 == 0 ? -1 : (a + 1 + static_cast<std::int32_t>(rng() % 3)) % 4;
    r.weights[2 * t] = weight(rng), r.weights[2 * t + 1] = weight(rng);
  }
  return r;
}

// Top-2 caller routing over 8 experts in one of kSkewedPatterns shapes: 0 every token to expert 3
// alone (one hot expert, the other slot -1), 1 every token to experts 5 and 6 (six empty),
// 2 gaps and -1 entries spread over all eight, 3 nothing routed (every slot -1).
inline constexpr int kSkewedPatterns = 4;
inline Top2Routing skewed_top2_of_8(int pattern, std::uint32_t tokens, std::mt19937& rng) {
  Top2Routing r{std::vector<std::int32_t>(tokens * 2), std::vector<float>(tokens * 2)};
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (std::uint32_t t = 0; t < tokens; ++t) {
    std::int32_t* const ids = &r.ids[2 * t];
    if (pattern == 0) ids[0] = 3, ids[1] = -1;
    if (pattern == 1) ids[0] = 5, ids[1] = 6;
    if (pattern == 2) {
      ids[0] = t % 3 == 0 ? -1 : static_cast<std::int32_t>(t % 8);
      ids[1] = t % 5 == 0 ? -1 : static_cast<std::int32_t>((t + 3) % 8);
    }
    if (pattern == 3) ids[0] = -1, ids[1] = -1;
    r.weights[2 * t] = weight(rng), r.weights[2 * t + 1] = weight(rng);
  }
  return r;
}

// A call's output on skewed_top2_of_8(pattern): zeros where nothing is routed (the reference is
// all zeros there too), else within 1e-2 of the float64 reference.
inline void expect_skewed_output(int pattern, std::vector<bf16> const& out,
                                 std::vector<double> const& ref) {
  if (pattern != 3) {
    EXPECT_LT(relative_error(out, ref), 1e-2) << "pattern " << pattern;
    return;
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    ASSERT_EQ(__bfloat162float(out[i]), 0.0f) << "nothing routed, element " << i;
}

// Top-2 caller routing in which expert e takes exactly counts[e] of the 2 x tokens pairs (each at
// most `tokens`, summing to 2 x tokens), the tokens in random order, random weights.
inline Top2Routing top2_with_counts(std::vector<std::uint32_t> const& counts, std::uint32_t tokens,
                                    std::mt19937& rng) {
  std::vector<std::int32_t> pairs;  // the ids in expert order; token t takes t and t + tokens
  for (std::size_t e = 0; e < counts.size(); ++e)
    pairs.insert(pairs.end(), counts[e], static_cast<std::int32_t>(e));
  EXPECT_EQ(pairs.size(), 2u * tokens);
  pairs.resize(2u * tokens, -1);
  std::vector<std::uint32_t> order(tokens);
  for (std::uint32_t t = 0; t < tokens; ++t) order[t] = t;
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  Top2Routing r{std::vector<std::int32_t>(tokens * 2), std::vector<float>(tokens * 2)};
  for (std::uint32_t t = 0; t < tokens; ++t) {
    r.ids[2 * order[t]] = pairs[t];
    r.ids[2 * order[t] + 1] = pairs[t + tokens];  // another expert: no count exceeds tokens
    r.weights[2 * order[t]] = weight(rng), r.weights[2 * order[t] + 1] = weight(rng);
  }
  return r;
}

// Expert counts of a 600-token top-2 call whose last M-tiles of 128 rows hold 62, 65, 2 and 47
// rows: three of them run on the short operands (at most 64 rows), one on the tall ones.
inline std::vector<std::uint32_t> const kMixedLastTiles = {190, 321, 130, 559};
inline constexpr std::uint32_t kMixedLastTilesTokens = 600;

// Token counts of calls on a layer whose route tasks take several groups in turn (route_rounds
// > 1; `max_tokens` its size): one token, a call ending in a task's first group, one ending in its
// second round, the full size.
inline std::vector<std::uint32_t> route_round_calls(MoEView const& shape,
                                                    std::uint32_t max_tokens) {
  std::uint32_t const group_tokens = shape.route_blocks * shape.token_block;
  return {1u, group_tokens + 3, route_tasks(shape) * group_tokens + 5, max_tokens};
}

// The last calls of a and b routed bitwise alike and gave bitwise the same output.
template <class Layer>
void expect_bitwise_equal(Layer const& a, std::vector<bf16> const& out_a, Layer const& b,
                          std::vector<bf16> const& out_b) {
  auto const ids_a = a.topk_ids(), ids_b = b.topk_ids();
  auto const wts_a = a.topk_weights(), wts_b = b.topk_weights();
  ASSERT_EQ(ids_a.size(), ids_b.size());
  ASSERT_EQ(out_a.size(), out_b.size());
  EXPECT_EQ(0, std::memcmp(ids_a.data(), ids_b.data(), ids_a.size() * sizeof(ids_a[0])));
  EXPECT_EQ(0, std::memcmp(wts_a.data(), wts_b.data(), wts_a.size() * sizeof(wts_a[0])));
  EXPECT_EQ(0, std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(bf16)));
}

}  // namespace loom::moe::checks
