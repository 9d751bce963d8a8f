// Failure reporting: a dependency that can never be satisfied at run time ends in a watchdog error
// that names what was missing, within the configured bound; a task body's failed check ends the
// launch with an error naming the task type. Never a hang.
#include <chrono>

#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

CpuOptions short_watchdog(std::uint32_t processors) {
  CpuOptions o = options_with(processors);
  o.watchdog = std::chrono::milliseconds(200);
  return o;
}

// A few events before the stuck one, so its id is not 0 and the message has to name the right one.
// The emitter completes `stuck` itself and emits *count children that complete it too; the event
// expects 2 arrivals, so with count 0 it can never fire.
struct StuckGraph {
  Recorder r{8};
  std::uint32_t count = 1;
  EventId stuck = kNoEvent;
  Graph graph;
  StuckGraph() {
    GraphBuilder b;
    EventId prev = kNoEvent;
    for (std::uint32_t t = 0; t < 3; ++t) {
      EventId const e = b.add_event(1);
      if (prev == kNoEvent)
        b.add_task(stamp_task(r, t, e));
      else
        b.add_task(stamp_task(r, t, e), {prev});
      prev = e;
    }
    stuck = b.add_event(2, EventOptions{true});
    b.add_task(TestPipeline::make<Emitter>(
                   Emitter::Payload{&r, &count, 3, 1, 5, stuck, kNoEvent, 0}, stuck),
               {prev});
    b.add_task(stamp_task(r, 4), {stuck});
    b.set_dynamic_bound(1);
    graph = b.build();
  }
};

TEST(Watchdog, UnsatisfiableEventEndsTheLaunchWithAWatchdogErrorNamingIt) {
  StuckGraph g;
  ASSERT_EQ(g.stuck, 3u);
  CpuExecutor<TestPipeline> ex(one_rank(g.graph), short_watchdog(3));

  g.count = 1;  // the second arrival comes: fine
  g.r.poison();
  ex.run();
  EXPECT_EQ(g.r.runs(4), 1u);

  g.count = 0;  // no second arrival: the successor can never run
  g.r.poison();
  auto const t0 = Clock::now();
  std::string const m = error_of([&] { ex.run(); });
  double const took = seconds_since(t0);
  EXPECT_LT(took, 5.0) << "the watchdog is configured at 200 ms";
  EXPECT_GE(took, 0.15) << "reported before the watchdog bound";
  EXPECT_TRUE(mentions(m, "watchdog"));
  EXPECT_TRUE(mentions(m, "scheduler"));
  EXPECT_TRUE(mentions(m, "event 3"));
  EXPECT_TRUE(mentions(m, "expected 2"));
  EXPECT_TRUE(mentions(m, "saw 1"));
  EXPECT_EQ(g.r.runs(4), 0u) << "the successor of the stuck event ran";

  // Re-initialised: with both arrivals the graph runs again.
  g.count = 1;
  for (int i = 0; i < 3; ++i) {
    g.r.poison();
    ex.run();
    for (std::uint32_t t : {0u, 1u, 2u, 3u, 4u, 5u}) ASSERT_EQ(g.r.runs(t), 1u) << "slot " << t;
  }
}

// No event is pending, but a dynamic task of the bound is neither emitted nor retired: the
// scheduler waits for a task that will never exist. The message should say how many tasks it
// waited for, not name a non-existent event.
TEST(Watchdog, UnretiredDynamicBoundEndsTheLaunchWithAWatchdogError) {
  Recorder r(4);
  std::uint32_t count = 0;
  GraphBuilder b;
  // Emits nothing and retires its share of 1, but the graph declares a bound of 2.
  b.add_task(
      TestPipeline::make<Emitter>(Emitter::Payload{&r, &count, 0, 1, 1, kNoEvent, kNoEvent, 0}));
  b.set_dynamic_bound(2);
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), short_watchdog(2));
  auto const t0 = Clock::now();
  std::string const m = error_of([&] { ex.run(); });
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_TRUE(mentions(m, "watchdog"));
  EXPECT_TRUE(mentions(m, "expected 3"));  // 1 static task + a bound of 2
  EXPECT_TRUE(mentions(m, "saw 2"));       // the task completed, 1 retired
  EXPECT_FALSE(mentions(m, std::to_string(kNoEvent)))
      << "the message names event id kNoEvent as if it were an object";
}

TEST(Watchdog, TaskCheckFailureNamesTheTaskType) {
  Recorder r(1000);
  std::uint32_t trigger = 7;
  // A chain with the failing task in the middle: nothing after it runs.
  GraphBuilder b;
  EventId prev = kNoEvent;
  for (std::uint32_t t = 0; t < 1000; ++t) {
    EventId const e = t + 1 < 1000 ? b.add_event(1) : kNoEvent;
    Task const task = t == 500 ? checked_fail_task<TestPipeline>(&trigger, e) : stamp_task(r, t, e);
    if (prev == kNoEvent)
      b.add_task(task);
    else
      b.add_task(task, {prev});
    prev = e;
  }
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(3));
  r.poison();
  auto const t0 = Clock::now();
  std::string const m = error_of([&] { ex.run(); });
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_TRUE(mentions(m, "checked_fail"));
  EXPECT_TRUE(mentions(m, "task check failed"));
  EXPECT_TRUE(mentions(m, "values 7, 42"));
  EXPECT_TRUE(mentions(m, "rank 0"));
  for (std::uint32_t t = 0; t < 500; ++t) ASSERT_EQ(r.runs(t), 1u) << "task " << t;
  for (std::uint32_t t = 501; t < 1000; ++t) ASSERT_EQ(r.runs(t), 0u) << "task " << t;

  trigger = 0;
  r.poison();
  ex.run();
  for (std::uint32_t t = 0; t < 1000; ++t) {
    if (t != 500) {
      ASSERT_EQ(r.runs(t), 1u) << "task " << t;
    }
  }
}

TEST(Watchdog, FailureOnOneOfManyProcessorsEndsTheLaunch) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  std::uint32_t trigger = 3;
  Recorder r(2000);
  GraphBuilder b;
  std::uint32_t const failing = rng() % 2000;
  for (std::uint32_t t = 0; t < 2000; ++t)
    b.add_task(t == failing ? checked_fail_task<TestPipeline>(&trigger) : stamp_task(r, t));
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(4));
  for (int i = 0; i < 5; ++i) {
    auto const t0 = Clock::now();
    EXPECT_TRUE(mentions(error_of([&] { ex.run(); }), "checked_fail"));
    EXPECT_LT(seconds_since(t0), 5.0);
  }
}

}  // namespace
}  // namespace loom::test
