// Several virtual ranks in one process over a HostSymmetricHeap: tiles put into peers' receive
// regions, epoch-valued arrival flags, subscribers decoding arrivals into dynamic tasks, over
// several launches without resetting anything.
#include <chrono>
#include <cmath>
#include <sstream>

#include "tests/cpu/tile_exchange.hpp"

namespace loom::test {
namespace {

using Executor = CpuExecutor<ExchangePipeline, TileDecoder>;

// Every rank sends tiles[a][b] tiles (0..max_tiles) of `floats` floats to every rank b, itself
// included. At rank b, the tile t from rank a lands in slot a * max_tiles + t; its ConsumeTile
// writes out[b] at the same slot, scaled by scale(b). A static sink per rank waits for all of them.
class Exchange {
 public:
  struct Config {
    std::uint32_t world = 2;
    std::uint32_t max_tiles = 8;
    std::uint32_t floats = 64;
    CpuOptions options;
    bool failing_root = false;  // rank 0 gets a CheckedFail root triggered by `trigger`
  };

  Exchange(Config const& c, std::mt19937& rng) : c_(c), slots_(c.world * c.max_tiles) {
    recv_ = layout_.add_array<float>("recv", std::uint64_t{slots_} * c.floats);
    flags_ = layout_.add_array<std::uint64_t>("flags", slots_);
    heap_ = std::make_unique<HostSymmetricHeap>(layout_, c.world);

    tiles_.assign(c.world, std::vector<std::uint32_t>(c.world));
    for (std::uint32_t b = 0; b < c.world; ++b) {
      std::uint32_t sum = 0;
      for (std::uint32_t a = 0; a < c.world; ++a) sum += tiles_[a][b] = rng() % (c.max_tiles + 1);
      if (sum == 0) tiles_[b][b] = 1;
    }
    for (std::uint32_t r = 0; r < c.world; ++r) {
      input_.emplace_back(std::size_t{slots_} * c.floats);
      out_.emplace_back(std::size_t{slots_} * c.floats);
      decoded_.emplace_back(slots_, 0);
      recorders_.push_back(std::make_unique<Recorder>(1 + slots_));
    }

    std::vector<Graph> graphs;
    std::vector<TileDecoder> decoders;
    for (std::uint32_t me = 0; me < c.world; ++me) {
      GraphBuilder b;
      for (std::uint32_t dst = 0; dst < c.world; ++dst)
        for (std::uint32_t t = 0; t < tiles_[me][dst]; ++t) {
          std::uint32_t const slot = me * c.max_tiles + t;  // at dst
          b.add_task(ExchangePipeline::make<SendTile>(SendTile::Payload{
              input_[me].data() + std::size_t{dst * c.max_tiles + t} * c.floats,
              recv_.offset + std::uint64_t{slot} * c.floats * sizeof(float),
              flags_.offset + std::uint64_t{slot} * sizeof(std::uint64_t), dst, c.floats}));
        }
      std::uint32_t const incoming = incoming_tiles(me);
      EventId const consumed = b.add_event(incoming, EventOptions{true});
      b.add_task(ExchangePipeline::make<Stamp>(Stamp::Payload{recorders_[me].get(), 0}),
                 {consumed});
      if (c.failing_root && me == 0) b.add_task(checked_fail_task<ExchangePipeline>(&trigger));
      b.set_dynamic_bound(incoming);
      graphs.push_back(b.build());

      TileDecoder d;
      d.flags = heap_->local<std::uint64_t>(me, flags_);
      d.recv = heap_->local<float>(me, recv_);
      d.decoded = decoded_[me].data();
      d.out = out_[me].data();
      d.recorder = recorders_[me].get();
      d.first_record = 1;
      d.slots = slots_;
      d.floats = c.floats;
      d.scale = scale(me);
      d.consumed = consumed;
      decoders.push_back(d);
    }
    executor_ = std::make_unique<Executor>(std::move(graphs), c.options, heap_.get(), decoders);
  }

  static float scale(std::uint32_t rank) { return 0.5f * static_cast<float>(rank + 1) + 0.25f; }

  std::uint32_t incoming_tiles(std::uint32_t b) const {
    std::uint32_t n = 0;
    for (std::uint32_t a = 0; a < c_.world; ++a) n += tiles_[a][b];
    return n;
  }

  // Fresh inputs, poisoned outputs and records.
  void prepare(std::mt19937& rng) {
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (std::uint32_t r = 0; r < c_.world; ++r) {
      for (float& x : input_[r]) x = value(rng);
      std::fill(out_[r].begin(), out_[r].end(), std::nanf(""));
      recorders_[r]->poison();
    }
  }

  Executor& executor() { return *executor_; }

  // Outputs and records of the launch that just ran with epoch `epoch`.
  ::testing::AssertionResult check(std::uint64_t epoch) const {
    std::ostringstream bad;
    int problems = 0;
    auto note = [&](auto const&... parts) {
      if (problems++ < 8) {
        (bad << ... << parts);
        bad << "\n";
      }
    };
    std::uint32_t const F = c_.floats, M = c_.max_tiles;
    for (std::uint32_t b = 0; b < c_.world; ++b) {
      Recorder const& rec = *recorders_[b];
      if (rec.runs(0) != 1) note("rank ", b, ": sink ran ", rec.runs(0), " times");
      for (std::uint32_t a = 0; a < c_.world; ++a)
        for (std::uint32_t t = 0; t < M; ++t) {
          std::uint32_t const s = a * M + t;
          bool const sent = t < tiles_[a][b];
          if (rec.runs(1 + s) != (sent ? 1u : 0u))
            note("rank ", b, ": slot ", s, " consumed ", rec.runs(1 + s), " times");
          if (sent && rec.runs(1 + s) == 1 && rec.epoch(1 + s) != epoch)
            note("rank ", b, ": slot ", s, " consumed in epoch ", rec.epoch(1 + s));
          if (sent && !(rec.start(0) > rec.end(1 + s)))
            note("rank ", b, ": sink started before slot ", s, " was consumed");
          for (std::uint32_t i = 0; i < F; ++i) {
            float const got = out_[b][std::size_t{s} * F + i];
            if (!sent) {
              if (!std::isnan(got)) note("rank ", b, ": unused slot ", s, " written");
              break;
            }
            float const want = input_[a][std::size_t{b * M + t} * F + i] * scale(b);
            if (!(got == want)) {
              note("rank ", b, ": slot ", s, " (from rank ", a, ", tile ", t, ") float ", i, " is ",
                   got, ", expected ", want);
              break;
            }
          }
        }
    }
    if (problems == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << problems << " problems, first ones:\n" << bad.str();
  }

  std::uint32_t trigger = 0;

 private:
  Config c_;
  std::uint32_t slots_;
  SymmetricLayout layout_;
  Region recv_, flags_;
  std::unique_ptr<HostSymmetricHeap> heap_;
  std::vector<std::vector<std::uint32_t>> tiles_;  // [from][to]
  std::vector<std::vector<float>> input_, out_;
  std::vector<std::vector<std::uint64_t>> decoded_;
  std::vector<std::unique_ptr<Recorder>> recorders_;
  std::unique_ptr<Executor> executor_;
};

CpuOptions exchange_options(std::uint32_t processors, std::uint32_t subscribers,
                            std::uint64_t chaos = 0) {
  CpuOptions o = options_with(processors, chaos);
  o.subscribers = subscribers;
  return o;
}

// The exchange's tiles drawn from `seed` (a test whose chaos seeds come from it too replays whole
// from one LOOM_TEST_SEED), or from a fresh one.
void exchange_over_launches(Exchange::Config const& config, int launches, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Exchange x(config, rng);
  for (std::uint64_t launch = 1; launch <= static_cast<std::uint64_t>(launches); ++launch) {
    x.prepare(rng);
    ASSERT_TRUE(succeeds([&] { x.executor().run(); })) << "launch " << launch;
    ASSERT_TRUE(x.check(launch)) << "launch " << launch;
    ASSERT_EQ(x.executor().launches(), launch);
  }
}
void exchange_over_launches(Exchange::Config const& config, int launches) {
  TracedSeed const seed;
  exchange_over_launches(config, launches, seed);
}

TEST(Ranks, TwoRanksExchangeTilesOverSeveralLaunches) {
  Exchange::Config c;
  c.world = 2;
  c.options = exchange_options(2, 2);
  exchange_over_launches(c, 8);
}

TEST(Ranks, FourRanksExchangeTilesOverSeveralLaunches) {
  Exchange::Config c;
  c.world = 4;
  c.max_tiles = 6;
  c.options = exchange_options(2, 2);
  exchange_over_launches(c, 6);
}

TEST(Ranks, OneSubscriberPerRankDecodesEverySlot) {
  Exchange::Config c;
  c.world = 3;
  c.options = exchange_options(1, 1);
  exchange_over_launches(c, 4);
}

TEST(Ranks, ExchangeUnderRandomDelays) {
  TracedSeed const base;
  for (std::uint64_t i = 1; i <= 8; ++i) {
    SCOPED_TRACE("chaos seed " + std::to_string(base + i));
    Exchange::Config c;
    c.world = 2 + static_cast<std::uint32_t>(i % 2) * 2;
    c.max_tiles = 4;
    c.options = exchange_options(2, 2, base + i);
    exchange_over_launches(c, 2, base);
    if (HasFatalFailure()) return;
  }
}

// A launch fails on one rank; the next launches must still exchange correctly. The arrival flags
// in the symmetric heap keep the epochs of earlier launches (nothing resets them), so the executor
// must keep epochs growing across its re-initialisation for "arrived in this launch" to mean
// anything.
TEST(Ranks, ExchangeRecoversAfterAFailedLaunch) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  Exchange::Config c;
  c.world = 2;
  c.options = exchange_options(2, 1);
  // Rank 1 of the failed launch waits this long for tiles rank 0 never sends.
  c.options.watchdog = std::chrono::milliseconds(1000);
  c.failing_root = true;
  Exchange x(c, rng);
  for (int launch = 0; launch < 2; ++launch) {
    x.prepare(rng);
    ASSERT_TRUE(succeeds([&] { x.executor().run(); }));
    ASSERT_TRUE(x.check(x.executor().launches()));
  }
  x.trigger = 1;
  x.prepare(rng);
  EXPECT_TRUE(mentions(error_of([&] { x.executor().run(); }), "checked_fail"));
  x.trigger = 0;
  for (int launch = 0; launch < 2; ++launch) {
    x.prepare(rng);
    ASSERT_TRUE(succeeds([&] { x.executor().run(); })) << "launch " << launch << " after failure";
    ASSERT_TRUE(x.check(x.executor().launches())) << "launch " << launch << " after failure";
  }
}

TEST(Ranks, ExecutorRejectsInconsistentRankSetups) {
  SymmetricLayout layout;
  layout.add_array<std::uint64_t>("flags", 4);
  HostSymmetricHeap heap3(layout, 3);
  auto graphs = [](std::uint32_t n) {
    std::vector<Graph> g;
    for (std::uint32_t i = 0; i < n; ++i) g.push_back(GraphBuilder{}.build());
    return g;
  };
  CpuOptions const o = exchange_options(1, 1);
  EXPECT_TRUE(mentions(error_of([&] { Executor ex(graphs(2), o, &heap3); }), "3 ranks"));
  EXPECT_TRUE(mentions(error_of([&] { Executor ex(graphs(2), o); }), "symmetric heap"));
  EXPECT_TRUE(mentions(error_of([&] { Executor ex(graphs(3), o, &heap3, {TileDecoder{}}); }),
                       "one decoder per rank"));
  EXPECT_TRUE(mentions(error_of([&] { Executor ex(graphs(0), o); }), "at least one rank"));
  EXPECT_TRUE(mentions(error_of([&] { HostSymmetricHeap h(layout, kMaxRanks + 1); }), "ranks"));
  EXPECT_TRUE(mentions(error_of([&] { layout.add("flags", 8); }), "added twice"));
  EXPECT_TRUE(mentions(error_of([&] { (void)layout.find("nope"); }), "nope"));
}

TEST(Ranks, SymmetricViewAddressesTheSameObjectOnEveryRank) {
  SymmetricLayout layout;
  Region const a = layout.add("a", 100, 64);
  Region const b = layout.add_array<std::uint64_t>("b", 10);
  EXPECT_EQ(a.offset % 64, 0u);
  EXPECT_EQ(b.offset % 256, 0u);
  EXPECT_GE(b.offset, a.offset + a.bytes);
  EXPECT_EQ(layout.find("b").offset, b.offset);
  HostSymmetricHeap heap(layout, 4);
  for (std::uint32_t r = 0; r < 4; ++r) {
    SymmetricView const v = heap.view(r);
    EXPECT_EQ(v.rank, r);
    EXPECT_EQ(v.world, 4u);
    std::uint64_t* mine = v.local<std::uint64_t>(b.offset);
    EXPECT_EQ(mine, heap.local<std::uint64_t>(r, b));
    for (std::uint32_t p = 0; p < 4; ++p) {
      EXPECT_EQ(v.peer(p, mine), heap.local<std::uint64_t>(p, b));
      EXPECT_EQ(v.at<std::uint64_t>(p, b.offset), heap.local<std::uint64_t>(p, b));
    }
    // A signal from rank r lands in every peer's copy of the flag.
    for (std::uint32_t p = 0; p < 4; ++p) v.signal_add(p, mine + 3, 1);
  }
  for (std::uint32_t p = 0; p < 4; ++p) {
    EXPECT_EQ(heap.local<std::uint64_t>(p, b)[3], 4u);  // zeroed at allocation, then 4 adds
    EXPECT_TRUE(SymmetricView::arrived(heap.local<std::uint64_t>(p, b) + 3, 4));
    EXPECT_FALSE(SymmetricView::arrived(heap.local<std::uint64_t>(p, b) + 3, 5));
  }
}

}  // namespace
}  // namespace loom::test
