// Static graphs on the CPU executor: order along dependencies, exactly-once execution, multi-gate
// tasks, repeated launches without any reset, the two scheduling policies, and termination of
// degenerate graphs.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

#include "runtime/scheduler_loop.hpp"
#include "tests/cpu/test_graphs.hpp"
#include "tests/hold_task.hpp"
#include "tests/wave_task.hpp"

namespace loom::test {
namespace {

// Every test gets a fresh seed and a generator on it (SeededTest).
class Executor : public SeededTest {};

constexpr SchedulingPolicy kPolicies[] = {SchedulingPolicy::fifo, SchedulingPolicy::priority};

// Runs `launches` launches with each policy, poisoning the record before each, and checks each.
void run_and_check(Shape const& shape, Recorder& r, CpuOptions options, int launches) {
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph), options);
  for (SchedulingPolicy policy : kPolicies) {
    SCOPED_TRACE(to_string(policy));
    for (int l = 0; l < launches; ++l) {
      r.poison();
      std::uint64_t const epoch = ex.launches() + 1;
      ex.run(policy);
      ASSERT_TRUE(ran_in_order(shape, r, epoch)) << "launch " << epoch;
      EXPECT_EQ(ex.launches(), epoch);
    }
  }
}

TEST_F(Executor, ChainRunsInStrictOrder) {
  constexpr std::uint32_t n = 10'000;
  Recorder r(n);
  Shape const shape = chain_shape(r, n, &rng);  // priorities must not matter along a chain
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph), options_with(3));
  for (SchedulingPolicy policy : kPolicies) {
    SCOPED_TRACE(to_string(policy));
    r.poison();
    ex.run(policy);
    // Nothing else runs, so task t takes tickets 2t+1 (start) and 2t+2 (end).
    for (std::uint32_t t = 0; t < n; ++t) {
      ASSERT_EQ(r.runs(t), 1u) << "task " << t;
      ASSERT_EQ(r.start(t), 2 * t + 1) << "task " << t;
      ASSERT_EQ(r.end(t), 2 * t + 2) << "task " << t;
    }
  }
}

TEST_F(Executor, ChainOfDiamondsRunsEachTaskOnceAfterItsPredecessors) {
  Recorder r(3 * 3334 + 1);
  Shape const shape = diamond_chain_shape(r, 3334, rng, /*priorities=*/true);
  ASSERT_GE(shape.tasks, 10'000u);
  run_and_check(shape, r, options_with(4), 2);
}

TEST_F(Executor, RandomDagRunsEachTaskOnceAfterItsPredecessors) {
  Recorder r(10'000);
  Shape const shape = random_dag_shape(r, 10'000, 64, rng, /*priorities=*/true);
  run_and_check(shape, r, options_with(4), 2);
}

// Processors asking for their next task as they start one (prefetch: always, never, or after a
// task of at least 2 µs, the default), the scheduler handing tasks to waiting processors first or
// to the oldest credit: the same order and exactly-once execution, with reports that carry a
// credit or only a count, on a DAG and on a wide fan-out where the idle processors must get the
// work.
TEST_F(Executor, PrefetchOnAndOffKeepOrderAndExactlyOnce) {
  Recorder r(10'000);
  Shape const dag = random_dag_shape(r, 10'000, 64, rng, /*priorities=*/true);
  Recorder f(2'002);
  Shape const fan = fan_shape(f, 2'000, &rng);
  for (std::uint64_t after : {kNoPrefetch, std::uint64_t{0}, std::uint64_t{2000}}) {
    for (bool waiting_first : {false, true}) {
      SCOPED_TRACE("prefetch_after_ns " + std::to_string(after) + " waiting_first " +
                   std::to_string(waiting_first));
      CpuOptions o = options_with(4);
      o.prefetch_after_ns = after;
      o.waiting_first = waiting_first;
      run_and_check(dag, r, o, 2);
      run_and_check(fan, f, o, 2);
    }
  }
}

// Two waves of equal tasks on P processors with prefetch after 1 ms (tests/wave_task.hpp): the
// first P tasks end 20 ms apart, the other P take 200 ms. When the first task did not prefetch,
// the processor that ended its first task first took a second and, as it started it, handed over
// a prefetch credit that was served before the others ended theirs: 3, 3, 1 and 1 tasks.
using WavePipeline = Pipeline<Wave>;

TEST_F(Executor, TwoWavesOfEqualTasksGiveEveryProcessorTwo) {
  constexpr std::uint32_t processors = 4;
  std::uint32_t started = 0, timed_out = 0, ran[processors] = {};
  Wave::Payload const wave{&started, ran, &timed_out, processors, 20'000, 200'000, 20'000'000};
  GraphBuilder b;
  for (std::uint32_t i = 0; i < 2 * processors; ++i) b.add_task(WavePipeline::make<Wave>(wave));
  CpuOptions o = options_with(processors);
  o.prefetch_after_ns = 1'000'000;
  CpuExecutor<WavePipeline> ex(one_rank(b.build()), o);
  for (int launch = 0; launch < 2; ++launch) {
    started = 0;
    for (auto& n : ran) n = 0;
    ex.run(SchedulingPolicy::fifo);
    ASSERT_EQ(timed_out, 0u) << "the first wave never started together";
    for (std::uint32_t p = 0; p < processors; ++p)
      EXPECT_EQ(ran[p], 2u) << "processor " << p << ", launch " << launch;
  }
}

// With fewer ready tasks than credits held, the scheduler hands them to waiting processors
// first (waiting_first): on a ring of eight credits from position 6 of 8 (it wraps), busy and
// waiting processors mixed, each number of tasks takes the waiting ones in ring order, then the
// busy ones in ring order, and leaves the rest behind in ring order.
TEST(WaitingFirst, WaitingProcessorsFirstThenBusyOnesEachInRingOrder) {
  constexpr std::uint32_t processors = 8;
  // Processor p's credit, in ring order from the head: 5 3 0 6 1 7 2 4; waiting: 0, 1, 2 and 4.
  std::uint32_t const order[processors] = {5, 3, 0, 6, 1, 7, 2, 4};
  std::uint64_t seen[processors];
  for (std::uint32_t p = 0; p < processors; ++p)
    seen[p] = report_word(p + 2, 0, p == 0 || p == 1 || p == 2 || p == 4);
  constexpr std::uint64_t head = 6;
  std::uint32_t const want[][processors] = {{0, 5, 3, 6, 1, 7, 2, 4}, {0, 1, 5, 3, 6, 7, 2, 4},
                                            {0, 1, 2, 5, 3, 6, 7, 4}, {0, 1, 2, 4, 5, 3, 6, 7},
                                            {0, 1, 2, 4, 5, 3, 6, 7}, {0, 1, 2, 4, 5, 3, 6, 7},
                                            {0, 1, 2, 4, 5, 3, 6, 7}};
  for (std::uint32_t take = 1; take < processors; ++take) {
    SCOPED_TRACE("take " + std::to_string(take));
    std::uint64_t ring[2 * processors];
    for (std::uint32_t i = 0; i < processors; ++i)
      ring[(head + i) % processors] = idle_entry(order[i], order[i] + 2);
    waiting_first(ring, ring + processors, processors, head, processors, take, seen);
    for (std::uint32_t i = 0; i < processors; ++i) {
      std::uint64_t const e = ring[(head + i) % processors];
      ASSERT_EQ(idle_processor(e), want[take - 1][i]) << "position " << i;
      ASSERT_EQ(idle_ring(e), idle_processor(e) + 2) << "position " << i;
    }
  }
  // One kind only: ring order stays.
  for (bool waiting : {false, true}) {
    for (std::uint32_t p = 0; p < processors; ++p) seen[p] = report_word(p + 2, 0, waiting);
    std::uint64_t ring[2 * processors];
    for (std::uint32_t i = 0; i < processors; ++i) ring[i] = idle_entry(order[i], order[i] + 2);
    waiting_first(ring, ring + processors, processors, 0, processors, 3, seen);
    for (std::uint32_t i = 0; i < processors; ++i) ASSERT_EQ(idle_processor(ring[i]), order[i]);
  }
}

// With waiting_first, a task emitted by a long task while the other processors wait runs on one
// of them, not behind the long task on its prefetch credit (tests/hold_task.hpp).
using HoldPipeline = Pipeline<Hold>;

TEST(WaitingFirst, ATaskEmittedDuringALongTaskRunsOnAWaitingProcessor) {
  constexpr std::uint32_t processors = 4;
  std::uint32_t shorts_done = 0, emitted_ran = 0, outcome = 0;
  // The short tasks' processors get 100 ms to report that they wait; the long task gives up
  // after 5 s.
  std::uint32_t const settle_us = 100'000, give_up_us = 5'000'000;
  Hold::Payload p{Hold::kLong, processors - 1, &shorts_done, &emitted_ran,
                  &outcome,    settle_us,      give_up_us};
  GraphBuilder b;
  b.add_task(HoldPipeline::make<Hold>(p));
  p.role = Hold::kShort;
  for (std::uint32_t i = 1; i < processors; ++i) b.add_task(HoldPipeline::make<Hold>(p));
  b.set_dynamic_bound(1);
  CpuOptions o = options_with(processors);
  o.waiting_first = true;
  CpuExecutor<HoldPipeline> ex(one_rank(b.build()), o);
  for (int launch = 0; launch < 3; ++launch) {
    shorts_done = emitted_ran = outcome = 0;
    ex.run(SchedulingPolicy::fifo);
    ASSERT_EQ(outcome, std::uint32_t{Hold::kRanWhileHeld}) << "launch " << launch;
  }
}

// Without waiting_first too, a task emitted by a launch's only root while it runs goes to a
// processor without a root, not behind the root on its processor's first credit: the credits of
// processors that took a root start at the back of the scheduler's ring (first_credit_at).
TEST(StartRoots, ATaskEmittedDuringTheOnlyRootRunsOnAnotherProcessor) {
  constexpr std::uint32_t processors = 4;
  std::uint32_t shorts_done = 0, emitted_ran = 0, outcome = 0;
  Hold::Payload const p{Hold::kLong, 0, &shorts_done, &emitted_ran, &outcome, 1'000, 2'000'000};
  GraphBuilder b;
  b.add_task(HoldPipeline::make<Hold>(p));
  b.set_dynamic_bound(1);
  CpuExecutor<HoldPipeline> ex(one_rank(b.build()), options_with(processors));
  for (int launch = 0; launch < 3; ++launch) {
    shorts_done = emitted_ran = outcome = 0;
    ex.run(SchedulingPolicy::fifo);
    ASSERT_EQ(outcome, std::uint32_t{Hold::kRanWhileHeld}) << "launch " << launch;
  }
}

// Fan-outs wider than one chunk are released by the scheduler (fan-out entries); tasks gated on
// several of them run once, after the last.
TEST_F(Executor, WideFanOutsWithSharedGatesRunEachTaskOnceAfterItsPredecessors) {
  Recorder r(6 + 5'000);
  Shape const shape = shared_fanout_shape(r, 6, 5'000, rng);
  ASSERT_GT(shape.graph.events[0].succ_end - shape.graph.events[0].succ_begin, kFanOutAbove);
  run_and_check(shape, r, options_with(4), 3);
}

TEST_F(Executor, FanOutThenFanIn) {
  Recorder r(10'002);
  Shape const shape = fan_shape(r, 10'000, &rng);
  run_and_check(shape, r, options_with(4), 2);
  // The sink saw every middle task end before it started.
  for (std::uint32_t i = 1; i <= 10'000; ++i) ASSERT_LT(r.end(i), r.start(10'001));
}

TEST_F(Executor, TaskWithSeveralGatesWaitsForAllOfThem) {
  // Sink waits on k events; event i is completed by a chain of i+1 tasks, so the gates fire at
  // very different times. Several sinks share some of the gates.
  constexpr std::uint32_t k = 6;
  GraphBuilder b;
  Recorder r(64);
  Shape s;
  std::uint32_t slot = 0;
  std::vector<EventId> gate_events;
  std::vector<std::uint32_t> chain_ends;
  for (std::uint32_t i = 0; i < k; ++i) {
    EventId prev = kNoEvent;
    for (std::uint32_t j = 0; j <= i; ++j) {
      EventId const e = b.add_event(1);
      std::uint32_t const t = slot++;
      if (prev == kNoEvent)
        b.add_task(stamp_task(r, t, e));
      else {
        b.add_task(stamp_task(r, t, e), {prev});
        s.before.emplace_back(t - 1, t);
      }
      prev = e;
    }
    gate_events.push_back(prev);
    chain_ends.push_back(slot - 1);
  }
  std::uint32_t const all = slot++;
  b.add_task(stamp_task(r, all), gate_events);
  for (std::uint32_t c : chain_ends) s.before.emplace_back(c, all);
  // A sink gated on the first and last chains, added through add_gate.
  std::uint32_t const pair = slot++;
  TaskId const pair_task = b.add_task(stamp_task(r, pair), {gate_events.front()});
  b.add_gate(pair_task, gate_events.back());
  s.before.emplace_back(chain_ends.front(), pair);
  s.before.emplace_back(chain_ends.back(), pair);
  s.graph = b.build();
  s.tasks = slot;
  EXPECT_EQ(s.graph.gate_counts[all], k);
  EXPECT_EQ(s.graph.gate_counts[pair_task], 2u);
  // Many launches: the per-task gate counters are monotonic across launches.
  run_and_check(s, r, options_with(3), 30);
}

TEST_F(Executor, RepeatedLaunchesGiveTheSameResultWithoutReset) {
  Recorder r(1000);
  Shape const shape = random_dag_shape(r, 1000, 32, rng);
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph), options_with(4));
  for (std::uint64_t launch = 1; launch <= 50; ++launch) {
    r.poison();
    ex.run();
    ASSERT_TRUE(ran_in_order(shape, r, launch)) << "launch " << launch;
    ASSERT_EQ(ex.launches(), launch);
  }
  // Every event received exactly `launches * expected` arrivals: nothing overshot or was lost.
  RuntimeState const& s = ex.state(0);
  for (EventId e = 0; e < s.graph.event_count; ++e)
    ASSERT_EQ(s.event_arrivals[e], 50u * s.graph.events[e].expected) << "event " << e;
}

// One processor: the scheduler's choice is the execution order. Roots of random priority are all
// ready when the launch starts.
TEST_F(Executor, PriorityPolicyRunsHigherLevelsFirstAndFifoWithinALevel) {
  constexpr std::uint32_t n = 300;
  Recorder r(n);
  GraphBuilder b;
  std::vector<std::uint8_t> prio(n);
  for (std::uint32_t t = 0; t < n; ++t) {
    prio[t] = static_cast<std::uint8_t>(rng() % 7);  // 3..6 all share the top level
    b.add_task(stamp_task(r, t, kNoEvent, prio[t]));
  }
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(1));
  auto executed_order = [&] {
    std::vector<std::uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](std::uint32_t x, std::uint32_t y) { return r.start(x) < r.start(y); });
    return order;
  };

  r.poison();
  ex.run(SchedulingPolicy::priority);
  std::vector<std::uint32_t> want(n);
  std::iota(want.begin(), want.end(), 0u);
  auto level = [&](std::uint32_t t) { return std::min<std::uint32_t>(prio[t], 3); };
  std::stable_sort(want.begin(), want.end(),
                   [&](std::uint32_t x, std::uint32_t y) { return level(x) > level(y); });
  EXPECT_EQ(executed_order(), want);

  r.poison();
  ex.run(SchedulingPolicy::fifo);
  std::vector<std::uint32_t> ready_order(n);
  std::iota(ready_order.begin(), ready_order.end(), 0u);
  EXPECT_EQ(executed_order(), ready_order);
}

// One processor, tasks released during the launch: A releases L1..Lk (level 0) and then H
// (level 3) in one arrival. Under the priority policy H is the highest ready task when A ends, so
// it runs next; under FIFO the released tasks run in the order they were released. Every Li
// releases a follower Fi, which became ready after all of L1..Lk and H, so under FIFO it runs
// after them. A's successors are more than kFanOutAbove, so they reach the scheduler as one
// fan-out entry and become ready together. (Released by A's processor, at most kFanOutAbove of
// them, they land slot by slot, and the processor's prefetch credit may take L1 before H's slot
// is written: H was not yet ready, which the policy allows.)
TEST_F(Executor, OneProcessorRunsReleasedTasksInPolicyOrder) {
  constexpr std::uint32_t k = kFanOutAbove + 1;
  // Slots: 0 = A, 1..k = L, k+1 = H, k+2.. = F.
  Recorder r(2 * k + 2);
  GraphBuilder b;
  EventId const a_done = b.add_event(1);
  b.add_task(stamp_task(r, 0, a_done));
  std::vector<EventId> l_done;
  for (std::uint32_t i = 1; i <= k; ++i) {
    l_done.push_back(b.add_event(1));
    b.add_task(stamp_task(r, i, l_done.back(), 0), {a_done});
  }
  b.add_task(stamp_task(r, k + 1, kNoEvent, 3), {a_done});
  for (std::uint32_t i = 0; i < k; ++i)
    b.add_task(stamp_task(r, k + 2 + i, kNoEvent, 0), {l_done[i]});
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(1));
  auto order = [&] {
    std::vector<std::uint32_t> o(r.slots());
    std::iota(o.begin(), o.end(), 0u);
    std::sort(o.begin(), o.end(),
              [&](std::uint32_t x, std::uint32_t y) { return r.start(x) < r.start(y); });
    return o;
  };
  std::vector<std::uint32_t> fifo(r.slots());
  std::iota(fifo.begin(), fifo.end(), 0u);  // A, L1..Lk, H, F1..Fk
  int fifo_wrong = 0, priority_wrong = 0;
  std::vector<std::uint32_t> first_fifo_wrong, first_priority_wrong;
  for (int launch = 0; launch < 20; ++launch) {
    r.poison();
    ex.run(SchedulingPolicy::fifo);
    if (std::vector<std::uint32_t> const got = order(); got != fifo && fifo_wrong++ == 0)
      first_fifo_wrong = got;
    r.poison();
    ex.run(SchedulingPolicy::priority);
    if (std::vector<std::uint32_t> const got = order(); got[1] != k + 1 && priority_wrong++ == 0)
      first_priority_wrong = got;
  }
  EXPECT_EQ(fifo_wrong, 0) << "FIFO launches out of ready order, e.g. "
                           << ::testing::PrintToString(first_fifo_wrong) << " (want "
                           << ::testing::PrintToString(fifo) << ")";
  EXPECT_EQ(priority_wrong, 0) << "priority launches where a level-0 task ran before the level-3 "
                                  "task released with it, e.g. "
                               << ::testing::PrintToString(first_priority_wrong) << " (H = slot "
                               << k + 1 << ")";
}

TEST_F(Executor, LaunchWithoutTasksTerminates) {
  CpuExecutor<TestPipeline> ex(one_rank(GraphBuilder{}.build()), options_with(2));
  for (int i = 0; i < 5; ++i) ex.run(kPolicies[i % 2]);
  EXPECT_EQ(ex.launches(), 5u);
}

TEST_F(Executor, LaunchOfOnlyRootsTerminates) {
  Recorder r(200);
  GraphBuilder b;
  Shape s;
  for (std::uint32_t t = 0; t < 200; ++t) b.add_task(stamp_task(r, t));
  s.graph = b.build();
  s.tasks = 200;
  EXPECT_EQ(s.graph.roots.size(), 200u);
  run_and_check(s, r, options_with(4), 3);
}

TEST_F(Executor, MoreProcessorsThanTasks) {
  Recorder r(3);
  Shape const s = fan_shape(r, 1);
  run_and_check(s, r, options_with(8), 3);
}

// Every executor alive keeps a thread per actor: a smaller one built beside a larger one (TBB
// takes the least parallelism any live limit allows) does not take the larger one's threads.
TEST_F(Executor, ASmallerExecutorLeavesALargerOneAThreadPerActor) {
  Recorder r(3);
  Shape const s = fan_shape(r, 1);
  std::uint32_t const processors = 24;
  CpuExecutor<TestPipeline> large(one_rank(s.graph), options_with(processors));
  CpuExecutor<TestPipeline> small(one_rank(s.graph), options_with(1));
  EXPECT_GE(
      oneapi::tbb::global_control::active_value(
          oneapi::tbb::global_control::max_allowed_parallelism),
      std::size_t{processors} + 3);  // the processors, the scheduler, a subscriber, the caller
  large.run();
  small.run();
}

TEST_F(Executor, TraceRecordsEveryTaskOnce) {
  Recorder r(102);
  Shape const s = fan_shape(r, 100);
  CpuOptions o = options_with(3);
  o.trace_capacity = 1000;
  CpuExecutor<TestPipeline> ex(one_rank(s.graph), o);
  for (int launch = 0; launch < 2; ++launch) {
    r.poison();
    ex.run();
    std::vector<TraceRecord> const trace = ex.take_trace(0);
    ASSERT_EQ(trace.size(), 102u) << "launch " << launch;
    std::vector<int> seen(102, 0);
    for (TraceRecord const& t : trace) {
      ASSERT_LT(t.task_id, 102u);
      ++seen[t.task_id];
      EXPECT_EQ(t.type, TestPipeline::id<Stamp>);
      EXPECT_EQ(t.rank, 0u);
      EXPECT_LT(t.processor, 3u);
      EXPECT_LE(t.start_ns, t.end_ns);
    }
    for (std::uint32_t i = 0; i < 102; ++i) EXPECT_EQ(seen[i], 1) << "task " << i;
    std::string const json = chrome_trace_json(trace, TestPipeline::names, TestPipeline::size);
    std::size_t names = 0;
    for (std::size_t at = 0; (at = json.find("\"name\":\"stamp\"", at)) != std::string::npos; ++at)
      ++names;
    EXPECT_EQ(names, 102u);
  }
  // A trace smaller than the launch keeps its first records and drops the rest.
  o.trace_capacity = 10;
  CpuExecutor<TestPipeline> small(one_rank(s.graph), o);
  small.run();
  EXPECT_EQ(small.take_trace(0).size(), 10u);
}

// The epoch is what every epoch-valued flag (symmetric-heap signals, arrival markers) is compared
// against, so it must never go back, not even when a launch fails and the executor re-initialises.
TEST_F(Executor, EpochKeepsGrowingAcrossAFailedLaunch) {
  Recorder r(2);
  std::uint32_t trigger = 0;
  GraphBuilder b;
  b.add_task(stamp_task(r, 0));
  b.add_task(checked_fail_task<TestPipeline>(&trigger));
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(2));
  std::uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    r.poison();
    ex.run();
    EXPECT_GT(r.epoch(0), last);
    last = r.epoch(0);
  }
  trigger = 1;
  r.poison();
  EXPECT_TRUE(mentions(error_of([&] { ex.run(); }), "checked_fail"));
  if (r.runs(0) == 1) last = std::max(last, r.epoch(0));
  trigger = 0;
  for (int i = 0; i < 3; ++i) {
    r.poison();
    ex.run();
    ASSERT_EQ(r.runs(0), 1u);
    EXPECT_GT(r.epoch(0), last) << "launch after the failure reused an old epoch";
    last = r.epoch(0);
  }
}

}  // namespace
}  // namespace loom::test
