// The expert-parallel MoE layer on the CPU executor with P virtual ranks: every rank's output
// against the float64 reference (fused router and caller routing, skewed routings), bitwise
// equality across world sizes, the write-conflict-free layout, and a peer that never arrives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "moe/cpu_layer.hpp"
#include "moe/ep_cpu_layer.hpp"
#include "moe/ep_dispatch.hpp"
#include "moe/reference.hpp"
#include "runtime/state.hpp"
#include "tests/seed.hpp"

namespace {

using namespace loom::moe;

MoEConfig ep_config(std::uint32_t experts, std::uint32_t top_k, std::uint32_t max_tokens) {
  MoEConfig c;
  c.hidden = 128;
  c.ffn = 128;
  c.experts = experts;
  c.top_k = top_k;
  c.max_tokens = max_tokens;
  return c;
}

loom::CpuOptions ep_options(std::uint32_t world) {
  loom::CpuOptions o;
  o.processors = world >= 8 ? 2 : 3;
  o.subscribers = 2;
  return o;
}

std::vector<bf16> poisoned(std::size_t n) {
  return std::vector<bf16>(n, __float2bfloat16(std::numeric_limits<float>::quiet_NaN()));
}

// One rank's inputs and outputs for a call.
struct RankData {
  std::vector<bf16> x, out;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

std::vector<EpRankCall> calls_for(std::vector<RankData>& ranks, bool routed) {
  std::vector<EpRankCall> calls;
  for (auto& r : ranks) {
    EpRankCall c;
    c.x = r.x.data();
    c.tokens = static_cast<std::uint32_t>(r.x.size() / 128);
    c.out = r.out.data();
    if (routed) c.ids = r.ids.data(), c.weights = r.weights.data();
    calls.push_back(c);
  }
  return calls;
}

// A layer of random weights over `world` virtual ranks, the fresh seed that drew them, and a
// generator and routing weights for the test's caller routings.
struct SeededLayer {
  std::uint64_t seed;
  MoEWeights weights;
  CpuEpMoELayer layer;
  std::mt19937 rng;
  std::uniform_real_distribution<float> weight{0.1f, 1.0f};

  SeededLayer(MoEConfig const& c, std::uint32_t world, std::uint64_t seed_)
      : seed(seed_),
        weights(random_weights(c, seed)),
        layer(c, weights, world, ep_options(world)),
        rng(static_cast<unsigned>(seed)) {}
};

class EpCpu : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(EpCpu, FusedRouterMatchesFloat64ReferenceOnEveryRank) {
  std::uint32_t const world = GetParam();
  MoEConfig const c = ep_config(16, 2, 64);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuEpMoELayer layer(c, w, world, ep_options(world));
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int call = 0; call < 2; ++call) {
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      // Rank 1 brings no tokens on the first call; the others a random count.
      std::uint32_t const tokens = (r == 1 && call == 0) ? 0 : 1 + rng() % c.max_tokens;
      ranks[r].x = random_tokens(c, tokens, seed + 17 * r + call);
      ranks[r].out = poisoned(ranks[r].x.size());
    }
    layer.forward(calls_for(ranks, false));
    std::uint32_t rows = 0, pairs = 0;
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens = static_cast<std::uint32_t>(ranks[r].x.size() / c.hidden);
      auto const ids = layer.topk_ids(r);
      auto const wts = layer.topk_weights(r);
      auto const scores = reference_scores(c, w, ranks[r].x.data(), tokens);
      EXPECT_EQ(check_routing(c, scores, tokens, ids.data(), wts.data(), 1e-3), "") << "rank " << r;
      auto const ref = reference_moe(c, w, ranks[r].x.data(), tokens, ids.data(), wts.data());
      if (tokens > 0) {
        EXPECT_LT(relative_error(ranks[r].out, ref), 1e-2) << "rank " << r;
      }
      auto const routed = layer.expert_tokens(r);
      auto const computed = layer.local_expert_rows(r);
      EXPECT_EQ(std::accumulate(routed.begin(), routed.end(), 0u), tokens * c.top_k);
      pairs += std::accumulate(routed.begin(), routed.end(), 0u);
      rows += std::accumulate(computed.begin(), computed.end(), 0u);
    }
    EXPECT_EQ(rows, pairs) << "every routed pair is computed by exactly one rank";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, EpCpu, ::testing::Values(2u, 4u, 8u));

// More chunks than send tasks: each send task claims several, and calls of few tokens leave most
// send tasks without one. Three calls, so the bins' and claims' counters are lowered between
// calls too.
TEST(EpCpu, SendTasksCarrySeveralChunksEach) {
  std::uint32_t const world = 2, blocks = kSendTasks + 9;
  MoEConfig const c = ep_config(8, 2, blocks * 32 - 5);
  ASSERT_LT(make_ep_shape(c, EpPlacement{0, world}, choose_ep_gemms(c, world)).send_tasks, blocks);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuEpMoELayer layer(c, w, world, ep_options(world));
  std::uint32_t const tokens[3][2] = {
      {c.max_tokens, c.max_tokens}, {40, c.max_tokens - 100}, {c.max_tokens, 1}};
  for (int call = 0; call < 3; ++call) {
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks[r].x = random_tokens(c, tokens[call][r], seed + 31 * r + call);
      ranks[r].out = poisoned(ranks[r].x.size());
    }
    layer.forward(calls_for(ranks, false));
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const n = tokens[call][r];
      auto const ids = layer.topk_ids(r);
      auto const wts = layer.topk_weights(r);
      auto const ref = reference_moe(c, w, ranks[r].x.data(), n, ids.data(), wts.data());
      EXPECT_LT(relative_error(ranks[r].out, ref), 1e-2) << "call " << call << ", rank " << r;
    }
  }
}

// A traced call records a mark for every chunk record a send task publishes and for every run of
// records the receiving subscriber takes: on each destination, the runs taken from a source cover
// exactly the records that source published to it, once each, and each is taken after it was
// published (the virtual ranks share one clock).
TEST(EpCpu, TracedCallsMarkEveryRecordPublishedAndTaken) {
  loom::test::TracedSeed const seed;
  for (std::uint32_t world : {2u, 4u}) {
    MoEConfig const c = ep_config(4 * world, 2, 200);
    loom::CpuOptions o = ep_options(world);
    o.trace_capacity = 1u << 16;
    MoEWeights const w = random_weights(c, seed);
    CpuEpMoELayer layer(c, w, world, o);
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks[r].x = random_tokens(c, c.max_tokens - 13 * r, seed + r);
      ranks[r].out = poisoned(ranks[r].x.size());
    }
    for (int call = 0; call < 2; ++call) {
      for (std::uint32_t r = 0; r < world; ++r) layer.executor().take_trace(r);
      layer.forward(calls_for(ranks, false));
      // published[s][d][record] and taken[d][s][record]: when (0: never).
      using Times = std::vector<std::vector<std::vector<std::uint64_t>>>;
      Times published(world, std::vector<std::vector<std::uint64_t>>(world));
      Times taken(world, std::vector<std::vector<std::uint64_t>>(world));
      std::uint32_t tasks = 0;
      for (std::uint32_t r = 0; r < world; ++r) {
        for (loom::TraceRecord const& t : layer.executor().take_trace(r)) {
          if (!loom::is_trace_mark(t)) {
            ++tasks;
            continue;
          }
          ASSERT_EQ(t.rank, r);
          std::uint16_t const kind = t.type & ~loom::kTraceMark;
          if (kind == kMarkRecordPublished) {
            auto& at = published[r][t.task_id];
            if (at.size() <= t.wait_ns) at.resize(t.wait_ns + 1, 0);
            EXPECT_EQ(at[t.wait_ns], 0u) << "published twice: " << r << " -> " << t.task_id;
            at[t.wait_ns] = t.start_ns;
            EXPECT_EQ(t.processor & loom::kTraceBySubscriber, 0u) << "by a send task";
          } else {
            ASSERT_EQ(kind, kMarkRecordsTaken);
            EXPECT_NE(t.processor & loom::kTraceBySubscriber, 0u) << "by the subscriber";
            std::uint32_t const source = t.task_id >> 24, count = t.task_id & 0xFFFFFFu;
            ASSERT_LT(source, world);
            ASSERT_GT(count, 0u);
            auto& at = taken[r][source];
            if (at.size() < t.wait_ns + count) at.resize(t.wait_ns + count, 0);
            for (std::uint32_t i = t.wait_ns; i < t.wait_ns + count; ++i) {
              EXPECT_EQ(at[i], 0u) << "taken twice: " << source << " -> " << r << " record " << i;
              at[i] = t.start_ns;
            }
          }
        }
      }
      EXPECT_GT(tasks, 0u);
      for (std::uint32_t s = 0; s < world; ++s)
        for (std::uint32_t d = 0; d < world; ++d) {
          SCOPED_TRACE("call " + std::to_string(call) + ", " + std::to_string(s) + " -> " +
                       std::to_string(d));
          auto const& pub = published[s][d];
          auto const& got = taken[d][s];
          EXPECT_FALSE(pub.empty());
          ASSERT_EQ(got.size(), pub.size());
          for (std::size_t i = 0; i < pub.size(); ++i) {
            EXPECT_NE(pub[i], 0u) << "record " << i << " never published";
            EXPECT_GE(got[i], pub[i]) << "record " << i << " taken before it was published";
          }
        }
    }
  }
}

// The send order (ep_view.hpp) on random bin sizes, every rank of 1 to 8 ranks: the chunks number
// each destination's rows and chunk records exactly once, in token blocks, chunk by chunk in the
// order the sends claim them, expert by expert; the plan's totals agree; the records fit the
// region.
TEST(EpCpu, SendOrderNumbersEveryRowAndChunkOnceExpertByExpert) {
  loom::test::TracedSeed const seed;
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (std::uint32_t world : {1u, 2u, 3u, 4u, 8u}) {
    for (std::uint32_t local : {1u, 3u, 32u}) {
      MoEConfig const c = ep_config(world * local, std::min(2u, world * local), 300);
      for (std::uint32_t rank = 0; rank < world; ++rank) {
        EpView ep = make_ep_shape(c, EpPlacement{rank, world}, choose_ep_gemms(c, world));
        std::uint32_t const bins = ep.bins(), block = ep.local.token_block;
        // Each destination gets at most max_tokens rows, spread over its bins at random (some
        // empty, some a partial token block).
        std::vector<std::uint32_t> rows(bins, 0);
        for (std::uint32_t d = 0; d < world; ++d) {
          std::uint32_t const n = rng() % (c.max_tokens + 1);
          for (std::uint32_t t = 0; t < n; ++t) ++rows[d * local + rng() % (rng() % local + 1)];
        }
        std::vector<std::uint32_t> tokens(std::size_t{bins} * c.max_tokens, 0);
        ep.bin_rows = rows.data();
        ep.bin_tokens = tokens.data();
        std::vector<std::uint32_t> words(4 * std::size_t{bins} + 1);
        SendOrder const order{rows.data(), words.data(), words.data() + bins,
                              words.data() + 2 * bins};
        order.number_bins(ep, 0, 1);
        order.start_positions(ep, 0, 1);
        std::vector<std::vector<int>> row_seen(world, std::vector<int>(c.max_tokens, 0));
        std::vector<std::vector<int>> chunk_seen(world, std::vector<int>(ep.chunk_capacity(), 0));
        std::vector<std::uint32_t> last_record(world, 0), next_row(world, 0);
        std::uint32_t last_expert = 0;
        for (std::uint32_t k = 0; k < order.start[bins]; ++k) {
          SendBlocks::Chunk const ch = SendBlocks::chunk_at(ep, order, k);
          ASSERT_LT(ch.dest, world);
          ASSERT_GT(ch.rows, 0u);
          ASSERT_LE(ch.rows, block);
          std::uint32_t const expert = ch.bin % local;
          EXPECT_GE(expert, last_expert) << "chunk " << k << " goes back to an earlier expert";
          last_expert = expert;
          ASSERT_LT(ch.record, ep.chunk_capacity() - 1);
          EXPECT_EQ(chunk_seen[ch.dest][ch.record]++, 0);
          EXPECT_EQ(ch.record, last_record[ch.dest])
              << "destination " << ch.dest << ": records in order";
          last_record[ch.dest] = ch.record + 1;
          EXPECT_EQ(ch.first, next_row[ch.dest]) << "destination " << ch.dest << ": rows in order";
          next_row[ch.dest] += ch.rows;
          EXPECT_EQ(ch.tokens, tokens.data() + std::size_t{ch.bin} * c.max_tokens +
                                   (ch.first - order.row_base[ch.bin]));
          for (std::uint32_t r = ch.first; r < ch.first + ch.rows; ++r) ++row_seen[ch.dest][r];
        }
        for (std::uint32_t d = 0; d < world; ++d) {
          DestinationTotals const t = totals_share(ep, d, 0, 1);
          DestinationTotals by_lanes{0, 0};  // the plan task's warp: 32 shares, summed
          for (std::uint32_t lane = 0; lane < 32; ++lane) {
            DestinationTotals const share = totals_share(ep, d, lane, 32);
            by_lanes.rows += share.rows;
            by_lanes.chunks += share.chunks;
          }
          EXPECT_EQ(by_lanes.rows, t.rows) << "destination " << d;
          EXPECT_EQ(by_lanes.chunks, t.chunks) << "destination " << d;
          EXPECT_EQ(next_row[d], t.rows) << "destination " << d;
          EXPECT_EQ(last_record[d], t.chunks) << "destination " << d;
          for (std::uint32_t r = 0; r < t.rows; ++r) EXPECT_EQ(row_seen[d][r], 1);
          for (std::uint32_t i = 0; i < t.chunks; ++i) EXPECT_EQ(chunk_seen[d][i], 1);
        }
      }
    }
  }
}

// A token's combine group is the highest local expert index among its experts on any rank (the
// order every rank computes its experts in), 0 without experts, found with its pair count; its
// RowMeta carries it to each destination.
TEST(EpCpu, CombineGroupIsTheHighestLocalExpertOfAToken) {
  MoEConfig const c = ep_config(16, 4, 8);  // four ranks of four experts
  EpView ep = make_ep_shape(c, EpPlacement{1, 4}, choose_ep_gemms(c, 4));
  std::vector<std::int32_t> ids = {
      5,  2,  -1, -1,  // local 1 (rank 1) and local 2 (rank 0): group 2
      12, 13, 14, 15,  // all on rank 3: group 3
      -1, -1, -1, -1,  // no experts: group 0
      8,  -1, 4,  0,   // local 0 everywhere: group 0
      3,  7,  -1, 9,   // locals 3, 3, 1: group 3
  };
  ep.local.topk_ids = ids.data();
  std::uint32_t const want[] = {2, 3, 0, 0, 3}, pairs[] = {2, 4, 0, 3, 3};
  for (std::uint32_t t = 0; t < 5; ++t) {
    EXPECT_EQ(combine_group(ep, t).group, want[t]) << "token " << t;
    EXPECT_EQ(combine_group(ep, t).pairs, pairs[t]) << "token " << t;
    for (std::uint32_t d = 0; d < 4; ++d) EXPECT_EQ(row_meta_for(ep, t, d).group, want[t]);
  }
}

// Caller routings that stress the exchange, on 2, 4 and 8 ranks of two experts each: all tokens
// to one rank's experts, one hot expert, a rank with no tokens, -1 entries, top-k equal to the
// experts per rank, and the hot expert beside tokens without experts (whose combine group, 0,
// then has tokens but no pairs). The hot expert gets a row from every token of every rank (1034
// rows on four ranks: nine 128-row M-tiles, so two M-tile groups, the second of one partial tile).
class EpCpuSkewed : public ::testing::TestWithParam<std::uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Worlds, EpCpuSkewed, ::testing::Values(2u, 4u, 8u));

TEST_P(EpCpuSkewed, CallerRoutingsMatchReference) {
  std::uint32_t const world = GetParam();
  std::int32_t const experts = static_cast<std::int32_t>(2 * world);
  MoEConfig const c = ep_config(2 * world, 2, 260);  // two experts per rank: top-k = E_local
  EpGemms const gemms = choose_ep_gemms(c, world);
  MoEView const shape = make_ep_shape(c, EpPlacement{0, world}, gemms).local;
  ASSERT_EQ(shape.tile_rows, 128u);
  // An expert's last M-tile of at most 64 rows runs on the 64-row operands: the hot expert's
  // tenth on four ranks (1034 rows), most experts' last in the random patterns.
  ASSERT_TRUE(gemms.has_short);
  EXPECT_EQ(shape.short_rows, 64u);
  EXPECT_EQ(gemms.short_tiles.up.block_m, 64u);
  EXPECT_EQ(shape.short_tokens, 0u);
  // Single up tiles at both heights (the pipeline has no run type).
  EXPECT_EQ(gemms.short_tiles.up_run, 1u);
  EXPECT_EQ(shape.up_tasks, shape.up_tiles);
  std::int32_t const hot = experts - 3;  // local expert 1 of rank world - 2
  std::uint32_t const idle = world > 2 ? 2 : 1;
  loom::test::TracedSeed const seed;
  SeededLayer run(c, world, seed);
  MoEWeights const& w = run.weights;
  CpuEpMoELayer& layer = run.layer;
  std::mt19937& rng = run.rng;
  auto& weight = run.weight;
  for (int pattern = 0; pattern < 6; ++pattern) {
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens = pattern == 3 && r == idle ? 0 : c.max_tokens - r;
      RankData& d = ranks[r];
      d.x = random_tokens(c, tokens, seed + r + 100 * pattern);
      d.out = poisoned(d.x.size());
      d.ids.resize(std::size_t{tokens} * 2);
      d.weights.resize(d.ids.size());
      for (std::uint32_t t = 0; t < tokens; ++t) {
        std::int32_t a = 0, b = 0;
        switch (pattern) {
          case 0:
            a = 2, b = 3;
            break;  // all to rank 1's experts
          case 1:
            a = hot, b = -1;
            break;  // one hot expert
          case 2:
            a = t % 3 ? std::int32_t(rng() % experts) : -1, b = -1;
            break;  // -1 entries
          case 3:
            a = std::int32_t(rng() % experts),
            b = (a + 1 + std::int32_t(rng() % (experts - 1))) % experts;
            break;  // rank `idle` has no tokens
          case 4:
            a = std::int32_t(2 * (t % world)), b = a + 1;
            break;  // both slots on one rank
          default:
            a = t % 3 ? hot : -1, b = -1;
            break;  // the hot expert, and tokens without experts
        }
        if (a == b) b = -1;
        d.ids[2 * t] = a, d.ids[2 * t + 1] = b;
        d.weights[2 * t] = weight(rng), d.weights[2 * t + 1] = weight(rng);
      }
    }
    layer.forward(calls_for(ranks, true));
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens = static_cast<std::uint32_t>(ranks[r].x.size() / c.hidden);
      if (tokens == 0) continue;
      auto const ref = reference_moe(c, w, ranks[r].x.data(), tokens, ranks[r].ids.data(),
                                     ranks[r].weights.data());
      EXPECT_LT(relative_error(ranks[r].out, ref), 1e-2) << "pattern " << pattern << " rank " << r;
    }
    if (pattern == 1) {
      auto const rows = layer.local_expert_rows(static_cast<std::uint32_t>(hot) / 2);
      std::uint32_t total = 0;
      for (std::uint32_t r = 0; r < world; ++r) total += c.max_tokens - r;
      EXPECT_EQ(rows[1], total);
      EXPECT_EQ(rows[0], 0u);
    }
  }
}

// Many local experts per rank (16 on each of four ranks, top-4), the low ones hot, so that the
// bins of the send order are of every size, from empty to several token blocks, and tokens have
// two or more experts on one rank; two calls, so the bins are lowered in between. Every rank's
// output against float64, and every local expert's rows against the routing.
TEST(EpCpu, ManyLocalExpertsInEveryBinSizeMatchReference) {
  std::uint32_t const world = 4, local = 16;
  MoEConfig const c = ep_config(world * local, 4, 600);
  loom::test::TracedSeed const seed;
  SeededLayer run(c, world, seed);
  for (int call = 0; call < 2; ++call) {
    std::vector<RankData> ranks(world);
    std::vector<std::uint32_t> expected(c.experts, 0);
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens = c.max_tokens - 37 * r - 100 * call;
      RankData& d = ranks[r];
      d.x = random_tokens(c, tokens, run.seed + r + 10 * call);
      d.out = poisoned(d.x.size());
      d.ids.resize(std::size_t{tokens} * c.top_k);
      d.weights.resize(d.ids.size());
      for (std::uint32_t t = 0; t < tokens; ++t) {
        std::vector<std::int32_t> experts(c.experts);
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), run.rng);
        if (run.rng() % 2) {  // a hot low expert (local 0 or 1 of some rank) first
          std::int32_t const hot =
              static_cast<std::int32_t>(local * (run.rng() % world) + run.rng() % 2);
          std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), hot));
        }
        for (std::uint32_t j = 0; j < c.top_k; ++j) {
          d.ids[t * c.top_k + j] = experts[j];
          d.weights[t * c.top_k + j] = run.weight(run.rng);
          ++expected[static_cast<std::uint32_t>(experts[j])];
        }
      }
    }
    run.layer.forward(calls_for(ranks, true));
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens = static_cast<std::uint32_t>(ranks[r].x.size() / c.hidden);
      auto const ref = reference_moe(c, run.weights, ranks[r].x.data(), tokens, ranks[r].ids.data(),
                                     ranks[r].weights.data());
      EXPECT_LT(relative_error(ranks[r].out, ref), 1e-2) << "call " << call << " rank " << r;
      auto const rows = run.layer.local_expert_rows(r);
      for (std::uint32_t e = 0; e < local; ++e)
        EXPECT_EQ(rows[e], expected[r * local + e])
            << "call " << call << " expert " << r * local + e;
    }
  }
}

// The same global problem split over 1, 2, 4 and 8 ranks (and on the single-rank layer) gives
// bitwise the same output: each row is computed the same way wherever it lands, and combined
// in top-k order. With 16 experts the route tasks take one token block each; with 128 the shape
// is the router tile's, whose route groups span several token blocks on some world sizes. With
// 1024 tokens over 16 experts (about 256 rows each) the M-tiles are 128 rows tall and an
// expert's last one of at most 64 rows takes the 64-row operands.
class EpCpuWorlds : public ::testing::TestWithParam<std::pair<std::uint32_t, std::uint32_t>> {};
INSTANTIATE_TEST_SUITE_P(ExpertsAndTokens, EpCpuWorlds,
                         ::testing::Values(std::pair{16u, 96u}, std::pair{128u, 1536u},
                                           std::pair{16u, 1024u}));

TEST_P(EpCpuWorlds, OutputIsBitwiseIdenticalAcrossWorldSizes) {
  auto const [experts, global_tokens] = GetParam();
  loom::test::TracedSeed const seed;
  MoEConfig const whole = ep_config(experts, 4, global_tokens);
  if (experts >= kMinTileRouterExperts) {
    MoEView const shape = make_ep_shape(whole, EpPlacement{0, 1}, choose_ep_gemms(whole, 1)).local;
    ASSERT_TRUE(shape.tile_router);
    ASSERT_GT(shape.route_blocks, 1u);
  }
  MoEWeights const w = random_weights(whole, seed);
  auto const x = random_tokens(whole, global_tokens, seed);
  std::vector<bf16> single(x.size());
  CpuMoELayer(whole, w).forward(x.data(), global_tokens, single.data());
  for (std::uint32_t world : {1u, 2u, 4u, 8u}) {
    MoEConfig c = whole;
    c.max_tokens = global_tokens / world;
    CpuEpMoELayer layer(c, w, world, ep_options(world));
    std::vector<RankData> ranks(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      auto const first = x.begin() + std::size_t{r} * c.max_tokens * c.hidden;
      ranks[r].x.assign(first, first + std::size_t{c.max_tokens} * c.hidden);
      ranks[r].out = poisoned(ranks[r].x.size());
    }
    layer.forward(calls_for(ranks, false));
    std::vector<bf16> joined;
    for (auto const& r : ranks) joined.insert(joined.end(), r.out.begin(), r.out.end());
    EXPECT_EQ(std::memcmp(joined.data(), single.data(), single.size() * sizeof(bf16)), 0)
        << "world " << world;
  }
}

// Every remote write of a call on 2, 4 and 8 ranks of two experts each, for random and
// adversarial routings: no two writes share a byte, each lands in the region meant for it, and a
// token travels once to each rank that holds any of its experts.
class EpCpuWrites : public ::testing::TestWithParam<std::uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Worlds, EpCpuWrites, ::testing::Values(2u, 4u, 8u));

TEST_P(EpCpuWrites, NeverOverlapAndTokensTravelOncePerRank) {
  std::uint32_t const world = GetParam();
  std::int32_t const last = static_cast<std::int32_t>(2 * world - 1);
  MoEConfig const c = ep_config(2 * world, 4, 40);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  CpuEpMoELayer layer(c, w, world, ep_options(world));
  loom::RemoteWriteLog log;
  layer.set_write_log(&log);
  EpHeapRegions const& regions = layer.regions();
  std::mt19937 rng(static_cast<unsigned>(seed));
  for (int pattern = 0; pattern < 8; ++pattern) {
    std::vector<RankData> ranks(world);
    std::vector<std::uint32_t> expected_rows(world * world, 0);  // [source][destination]
    for (std::uint32_t r = 0; r < world; ++r) {
      std::uint32_t const tokens =
          pattern == 2 ? (r == 0 ? c.max_tokens : 0) : 1 + rng() % c.max_tokens;
      RankData& d = ranks[r];
      d.x = random_tokens(c, tokens, seed + r);
      d.out = poisoned(d.x.size());
      d.ids.assign(std::size_t{tokens} * c.top_k, -1);
      d.weights.assign(d.ids.size(), 0.5f);
      for (std::uint32_t t = 0; t < tokens; ++t) {
        std::vector<std::int32_t> experts(c.experts);
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        if (pattern == 1) experts = {0, 1, 2, 3};              // every token to ranks 0 and 1
        if (pattern == 3) experts = {last, last - 1, -1, -1};  // all to the last rank
        std::uint32_t mask = 0;
        for (std::uint32_t j = 0; j < c.top_k; ++j) {
          d.ids[t * c.top_k + j] = experts[j];
          if (experts[j] >= 0) mask |= 1u << (experts[j] / 2);
        }
        for (std::uint32_t dst = 0; dst < world; ++dst)
          expected_rows[r * world + dst] += (mask >> dst) & 1u;
      }
    }
    layer.forward(calls_for(ranks, true));
    auto writes = log.take();
    ASSERT_FALSE(writes.empty());
    std::sort(writes.begin(), writes.end(), [](auto const& a, auto const& b) {
      return a.target != b.target ? a.target < b.target : a.offset < b.offset;
    });
    for (std::size_t i = 1; i < writes.size(); ++i) {
      auto const& a = writes[i - 1];
      auto const& b = writes[i];
      if (a.target != b.target) continue;
      ASSERT_LE(a.offset + a.bytes, b.offset)
          << "pattern " << pattern << ": rank " << a.writer << " and rank " << b.writer
          << " both write rank " << a.target << " bytes at " << b.offset;
    }
    std::vector<std::uint32_t> rows(world * world, 0);
    auto inside = [](loom::Region r, std::uint64_t offset, std::uint64_t bytes) {
      return offset >= r.offset && offset + bytes <= r.offset + r.bytes;
    };
    for (auto const& wr : writes) {
      std::uint64_t const row_bytes = std::uint64_t{c.hidden} * sizeof(bf16);
      if (inside(regions.recv_rows, wr.offset, wr.bytes)) {
        // Rows from source s land in the s-th slice of the destination's recv area.
        std::uint64_t const slice = std::uint64_t{c.max_tokens} * row_bytes;
        EXPECT_EQ((wr.offset - regions.recv_rows.offset) / slice, wr.writer);
        EXPECT_EQ(wr.bytes, row_bytes);
        ++rows[wr.writer * world + wr.target];
      } else {
        bool const known = inside(regions.recv_meta, wr.offset, wr.bytes) ||
                           inside(regions.chunks, wr.offset, wr.bytes) ||
                           inside(regions.inbox, wr.offset, wr.bytes) ||
                           inside(regions.y, wr.offset, wr.bytes);
        EXPECT_TRUE(known) << "a write outside every region at " << wr.offset;
      }
    }
    EXPECT_EQ(rows, expected_rows) << "pattern " << pattern;
  }
}

// Random delays in every actor of every rank (chaos mode) change the interleaving of sends,
// arrivals and tiles, never the result; odd seeds also hand tasks to waiting processors first
// (waiting_first).
TEST(EpCpu, ChaosInterleavingsGiveTheSameBits) {
  std::uint32_t const world = 4;
  MoEConfig const c = ep_config(8, 2, 32);
  loom::test::TracedSeed const seed;
  MoEWeights const w = random_weights(c, seed);
  std::vector<RankData> ranks(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    ranks[r].x = random_tokens(c, c.max_tokens - r, seed + r);
    ranks[r].out = poisoned(ranks[r].x.size());
  }
  CpuEpMoELayer calm(c, w, world, ep_options(world));
  calm.forward(calls_for(ranks, false));
  std::vector<std::vector<bf16>> expected;
  for (auto const& r : ranks) expected.push_back(r.out);
  for (std::uint64_t chaos = 1; chaos <= 6; ++chaos) {
    loom::CpuOptions o = ep_options(world);
    o.chaos_seed = seed * 16 + chaos;
    o.chaos_per_mille = 100;
    o.chaos_max_delay_us = 300;
    o.waiting_first = chaos % 2 == 1;
    CpuEpMoELayer layer(c, w, world, o);
    for (auto& r : ranks) r.out = poisoned(r.out.size());
    layer.forward(calls_for(ranks, false));
    for (std::uint32_t r = 0; r < world; ++r)
      ASSERT_EQ(0, std::memcmp(ranks[r].out.data(), expected[r].data(),
                               expected[r].size() * sizeof(bf16)))
          << "chaos seed " << o.chaos_seed << (o.waiting_first ? " waiting_first" : "") << " rank "
          << r;
  }
}

// A rank that never sends, on 2, 4 and 8 ranks: every other rank ends the call with a watchdog
// error naming it.
class EpCpuSilent : public ::testing::TestWithParam<std::uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Worlds, EpCpuSilent, ::testing::Values(2u, 4u, 8u));

TEST_P(EpCpuSilent, ARankThatNeverArrivesIsNamedByTheOthers) {
  std::uint32_t const world = GetParam(), silent = world / 2;
  MoEConfig const c = ep_config(2 * world, 2, 16);
  loom::CpuOptions o = ep_options(world);
  o.watchdog = std::chrono::milliseconds(400);
  CpuEpMoELayer layer(c, random_weights(c, 5), world, o, silent);
  std::vector<RankData> ranks(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    ranks[r].x = random_tokens(c, c.max_tokens, r);
    ranks[r].out = poisoned(ranks[r].x.size());
  }
  std::string message;
  try {
    layer.forward(calls_for(ranks, false));
  } catch (loom::Error const& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "the call did not fail";
  for (std::uint32_t r = 0; r < world; ++r) {
    if (r == silent) continue;
    EXPECT_NE(message.find("subscriber (block 0, rank " + std::to_string(r) +
                           "): waited on a signal from peer rank " + std::to_string(silent)),
              std::string::npos)
        << message;
  }
}

TEST(EpCpu, BadInputIsRejectedNamingTheRank) {
  MoEConfig const c = ep_config(8, 2, 16);
  CpuEpMoELayer layer(c, random_weights(c, 1), 2, ep_options(2));
  std::vector<RankData> ranks(2);
  for (auto& r : ranks) {
    r.x = random_tokens(c, 4, 1);
    r.out = poisoned(r.x.size());
    r.ids = {0, 1, 2, 3, 4, 5, 6, 7};
    r.weights.assign(8, 0.5f);
  }
  ranks[1].ids[3] = 2;  // token 1 names expert 2 twice
  try {
    layer.forward(calls_for(ranks, true));
    ADD_FAILURE() << "repeated expert accepted";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: invalid routing: token 1 names expert 2 twice"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(CpuEpMoELayer(c, random_weights(c, 1), 3), loom::Error);  // 8 experts over 3
  ranks[1].ids[3] = 3;
  layer.forward(calls_for(ranks, true));  // still works afterwards
  auto too_many = calls_for(ranks, true);
  too_many[0].tokens = 17;
  EXPECT_THROW(layer.forward(too_many), loom::Error);
}

}  // namespace
