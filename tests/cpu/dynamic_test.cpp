// Dynamic emission on the CPU executor: tasks emitted at run time within the declared bound, slack
// retired when the real count is known, dynamic arrivals on static events, and the errors for
// breaking the bound (after which the executor runs again).
#include <algorithm>
#include <vector>

#include "tests/cpu/test_graphs.hpp"
#include "tests/keep_task.hpp"

namespace loom::test {
namespace {

// A body that emits with keep_first runs the first task it emitted next on its own processor,
// ahead of the processors that wait (which the scheduler would have rung first), and only that
// one: every task runs once, the root's static successor (pushed, not kept) among them.
TEST(Dynamic, AKeptEmittedTaskRunsNextOnItsEmittersProcessor) {
  constexpr std::uint32_t children = 6;
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_first" : "queued");
    std::vector<std::uint32_t> words(KeepWords::size(children + 2), 0);
    KeepWords const log{words.data(), children + 2};
    CpuExecutor<KeepPipeline> ex(one_rank(keeping_graph(log, children, 2000, keep)),
                                 options_with(4));
    for (int launch = 0; launch < 3; ++launch) {
      std::fill(words.begin(), words.end(), 0u);
      ex.run(SchedulingPolicy::fifo);
      EXPECT_EQ(keeping_outcome(log, keep), "") << "launch " << launch;
    }
  }
}

// Roots running at once share out one emission: each keeps the task it writes below `kept` and
// runs it next on its own processor, and every queued task, written in any order into its
// reserved place, runs once. Over launches (the roots lower their words), with chaos stirring
// the interleavings. A body that keeps two tasks fails with keep_unavailable, and the executor
// recovers.
TEST(Dynamic, RootsShareOutOneEmissionAndKeepTheirFirstTask) {
  constexpr std::uint32_t roots = 3, children = 40;
  std::vector<std::uint32_t> words(KeepWords::size(children), 0), actors(roots), sync(3, 0);
  SharedEmission shared{};
  KeepWords const log{words.data(), children};
  for (std::uint64_t chaos : {0u, 7u}) {
    SCOPED_TRACE("chaos " + std::to_string(chaos));
    CpuExecutor<KeepPipeline> ex(
        one_rank(sharing_graph(log, actors.data(), sync.data(), &shared, roots)),
        options_with(roots + 1, chaos));
    for (int launch = 0; launch < 4; ++launch) {
      std::fill(words.begin(), words.end(), 0u);
      ex.run(launch % 2 ? SchedulingPolicy::priority : SchedulingPolicy::fifo);
      EXPECT_EQ(sharing_outcome(log, actors.data(), roots), "") << "launch " << launch;
    }
  }
  CpuExecutor<KeepPipeline> bad(
      one_rank(sharing_graph(log, actors.data(), sync.data(), &shared, roots, true)),
      options_with(roots + 1));
  std::string const m = error_of([&] { bad.run(); });
  EXPECT_TRUE(mentions(m, "no free keep slot")) << m;
  CpuExecutor<KeepPipeline> good(
      one_rank(sharing_graph(log, actors.data(), sync.data(), &shared, roots)),
      options_with(roots + 1));
  std::fill(words.begin(), words.end(), 0u);
  good.run();
  EXPECT_EQ(sharing_outcome(log, actors.data(), roots), "");
}

TEST(Dynamic, EmitsARandomCountAndRetiresTheRestEveryLaunch) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t emitters = 8, bound = 300;
  Recorder r(EmissionShape::slots_for(emitters, bound));
  EmissionShape shape(r, emitters, bound);
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph()), options_with(4));
  for (std::uint64_t launch = 1; launch <= 10; ++launch) {
    shape.draw_counts(rng);
    if (launch == 2)
      for (std::uint32_t i = 0; i < emitters; ++i) shape.set_count(i, 0);  // retire everything
    if (launch == 3)
      for (std::uint32_t i = 0; i < emitters; ++i) shape.set_count(i, bound);  // no slack
    r.poison();
    ex.run(launch % 2 ? SchedulingPolicy::fifo : SchedulingPolicy::priority);
    ASSERT_TRUE(shape.check(r, launch)) << "launch " << launch;
  }
}

// Emitted tasks alone complete an event (no top-up): it fires when the last of them completes.
TEST(Dynamic, EmittedTasksCompletingADynamicEventReleaseAStaticSuccessor) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  std::uint32_t const n = 50 + rng() % 500;
  Recorder r(n + 2);
  std::uint32_t count = n;
  GraphBuilder b;
  EventId const done = b.add_event(n, EventOptions{true});
  b.add_task(TestPipeline::make<Emitter>(Emitter::Payload{&r, &count, 0, n, 2, done, kNoEvent, 0}));
  b.add_task(stamp_task(r, 1), {done});
  b.set_dynamic_bound(n);
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(3));
  for (std::uint64_t launch = 1; launch <= 5; ++launch) {
    r.poison();
    ex.run();
    for (std::uint32_t c = 2; c < n + 2; ++c) {
      ASSERT_EQ(r.runs(c), 1u) << "child " << c;
      ASSERT_GT(r.start(1), r.end(c)) << "successor started before child " << c << " ended";
      ASSERT_GT(r.start(c), r.start(0)) << "child " << c << " before its emitter";
    }
    ASSERT_EQ(r.runs(0), 1u);
    ASSERT_EQ(r.runs(1), 1u);
  }
}

// Emitted tasks and static tasks arrive on one event; the static successor waits for both kinds.
TEST(Dynamic, StaticAndDynamicArrivalsShareAnEvent) {
  constexpr std::uint32_t statics = 20, dynamics = 30;
  Recorder r(2 + statics + dynamics);
  std::uint32_t count = dynamics;
  GraphBuilder b;
  EventId const done = b.add_event(statics + dynamics, EventOptions{true});
  b.add_task(TestPipeline::make<Emitter>(
      Emitter::Payload{&r, &count, 0, dynamics, 2 + statics, done, kNoEvent, 0}));
  for (std::uint32_t i = 0; i < statics; ++i) b.add_task(stamp_task(r, 2 + i, done));
  b.add_task(stamp_task(r, 1), {done});
  b.set_dynamic_bound(dynamics);
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(4));
  for (int launch = 0; launch < 5; ++launch) {
    r.poison();
    ex.run();
    for (std::uint32_t s = 0; s < r.slots(); ++s) ASSERT_EQ(r.runs(s), 1u) << "slot " << s;
    for (std::uint32_t s = 2; s < r.slots(); ++s) ASSERT_GT(r.start(1), r.end(s));
  }
}

TEST(Dynamic, EmittingPastTheBoundFailsAndTheExecutorRecovers) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t emitters = 2, bound = 16;
  Recorder r(EmissionShape::slots_for(emitters, bound));
  EmissionShape shape(r, emitters, bound);
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph()), options_with(3));
  for (int round = 0; round < 3; ++round) {
    shape.draw_counts(rng);
    r.poison();
    ex.run();
    ASSERT_TRUE(shape.check(r, ex.launches()));

    // Both emitters together emit one more than the graph's bound.
    shape.set_count(0, bound + 1);
    shape.set_count(1, bound);
    r.poison();
    std::string const m = error_of([&] { ex.run(); });
    EXPECT_TRUE(mentions(m, "dynamic task bound exceeded"));
    EXPECT_TRUE(mentions(m, "bound " + std::to_string(emitters * bound)));
  }
}

TEST(Dynamic, RetiringMoreThanTheBoundLeavesFailsAndTheExecutorRecovers) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t n = 40;
  Recorder r(n + 2);
  std::uint32_t count = 0;
  GraphBuilder b;
  EventId const done = b.add_event(n, EventOptions{true});
  TaskId const emitter =
      b.add_task(TestPipeline::make<Emitter>(Emitter::Payload{&r, &count, 0, n, 2, done, done, 0}));
  b.add_task(stamp_task(r, 1), {done});
  b.set_dynamic_bound(n);
  Graph good = b.build();
  // The same graph with an emitter that retires 3 more than its share.
  Graph bad = good;
  Emitter::Payload p = bad.tasks[emitter].as<Emitter::Payload>();
  p.extra_retire = 3;
  bad.tasks[emitter] = TestPipeline::make<Emitter>(p);

  CpuExecutor<TestPipeline> ok(one_rank(good), options_with(2));
  CpuExecutor<TestPipeline> overshoot(one_rank(bad), options_with(2));
  for (int round = 0; round < 3; ++round) {
    count = rng() % (n + 1);
    r.poison();
    ok.run();
    for (std::uint32_t c = 0; c < n + 2; ++c)
      ASSERT_EQ(r.runs(c), c < 2 + count ? 1u : 0u) << "slot " << c;

    r.poison();
    std::string const m = error_of([&] { overshoot.run(); });
    EXPECT_TRUE(mentions(m, "retired"));
    EXPECT_TRUE(mentions(m, "bound " + std::to_string(n)));
  }
}

// After an error, the executor re-initialises: the next launches run the full graph correctly.
TEST(Dynamic, ExecutorRunsCorrectlyAfterATaskFailure) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t emitters = 4, bound = 50;
  Recorder r(EmissionShape::slots_for(emitters, bound));
  std::uint32_t trigger = 0;
  // The emission shape plus a CheckedFail root.
  EmissionShape shape(r, emitters, bound, {checked_fail_task<TestPipeline>(&trigger)});
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph()), options_with(3));
  for (int round = 0; round < 4; ++round) {
    trigger = 0;
    shape.draw_counts(rng);
    r.poison();
    ex.run();
    ASSERT_TRUE(shape.check(r, ex.launches())) << "round " << round;
    trigger = 1 + round;
    std::string const m = error_of([&] { ex.run(); });
    EXPECT_TRUE(mentions(m, "checked_fail"));
  }
}

}  // namespace
}  // namespace loom::test
