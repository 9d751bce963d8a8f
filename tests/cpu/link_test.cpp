// A processor's side of the doorbell protocol (take_next_task, runtime/protocol.hpp) on a state of
// its own: the ring another thread of the processor already took (the GPU's warp 1 during the
// finish, peek_ring_warp) stands for the first poll, a kept successor still goes first, and a
// launch's roots are taken by the processors without a ring, the ones the scheduler would ring.
#include "runtime/protocol.hpp"
#include "scheduler/fifo.hpp"
#include "scheduler/priority.hpp"
#include "scheduler/ready_list.hpp"
#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

// One processor's words: its report, its doorbell and the launch counters.
struct OneProcessor {
  Counters counters{};
  std::uint64_t report = kStartReport;
  Doorbell bell{};
  ErrorRecord error{};
  RuntimeState s{};
  ProcessorLink link = ProcessorLink::start(0);

  OneProcessor() {
    s.counters = &counters;
    s.reports = &report;
    s.doorbells = &bell;
    s.error = &error;
    s.processors = 1;
    s.watchdog_ns = 1'000'000'000;
    s.prefetch_after_ns = kNoPrefetch;
  }
  bool take(TaskRef& ref, TaskRef peeked) {
    Watchdog dog(error, WaiterId{Actor::processor, 0, 0}, s.watchdog_ns, WaitSite::doorbell, 0);
    return take_next_task(s, link, bell, dog, ref, peeked);
  }
};

TEST(ProcessorLink, APeekedRingIsTakenWithoutAnotherPollOrReport) {
  OneProcessor p;
  // The ring is not on the doorbell: only the peek can supply it, so a poll would wait (and a
  // report would go out) instead of returning at once.
  TaskRef ref = kStopRef;
  ASSERT_TRUE(p.take(ref, 7));
  EXPECT_EQ(ref, 7u);
  EXPECT_FALSE(p.link.credit_out);
  EXPECT_EQ(p.report, kStartReport);
  EXPECT_EQ(p.error.code, 0u);
}

TEST(ProcessorLink, AKeptSuccessorRunsFirstAndTheRingStaysForTheNextTake) {
  OneProcessor p;
  doorbell_ring(p.bell, 1, 7);
  p.link.kept = 5;
  TaskRef ref = kStopRef;
  ASSERT_TRUE(p.take(ref, 7));
  EXPECT_EQ(ref, 5u);
  EXPECT_EQ(p.link.kept, kStopRef);
  EXPECT_TRUE(p.link.credit_out);  // ring 1 is still owed
  ASSERT_TRUE(p.take(ref, kStopRef));
  EXPECT_EQ(ref, 7u);
  EXPECT_FALSE(p.link.credit_out);
}

TEST(ProcessorLink, WithoutAPeekTheDoorbellIsPolled) {
  OneProcessor p;
  doorbell_ring(p.bell, 1, 9);
  TaskRef ref = kStopRef;
  ASSERT_TRUE(p.take(ref, kStopRef));
  EXPECT_EQ(ref, 9u);
  EXPECT_FALSE(p.link.credit_out);
}

TEST(ProcessorLink, AStartRootRunsFirstReportedBusyWithRingOneStillOwed) {
  OneProcessor p;
  take_start_root(p.s, p.link, 4);
  EXPECT_EQ(p.report, report_word(1, 0, false));  // busy: no waiting_first credit
  TaskRef ref = kStopRef;
  ASSERT_TRUE(p.take(ref, kStopRef));
  EXPECT_EQ(ref, 4u);
  EXPECT_TRUE(p.link.credit_out);
  ++p.link.completed;
  doorbell_ring(p.bell, 1, 7);  // the scheduler used the first credit as a prefetch
  ASSERT_TRUE(p.take(ref, kStopRef));
  EXPECT_EQ(ref, 7u);
  EXPECT_FALSE(p.link.credit_out);
  // Without a root nothing is reported: the processor waits for ring 1.
  OneProcessor q;
  take_start_root(q.s, q.link, kStopRef);
  EXPECT_EQ(q.report, kStartReport);
  EXPECT_EQ(q.link.kept, kStopRef);
}

// Roots of several priorities, more of them than processors: processor p takes the task the
// scheduler's list would hand out p-th, and the list the scheduler keeps after dropping them
// starts with the next one.
template <class Policy>
void check_start_roots(std::uint32_t processors) {
  Recorder r(7);
  GraphBuilder b;
  for (std::uint32_t t = 0; t < 7; ++t) b.add_task(stamp_task(r, t, kNoEvent, (t * 5) % 3));
  StateOptions o;
  o.processors = processors;
  HostState const hs(b.build(), o);
  RuntimeState const& s = hs.state();
  ASSERT_EQ(start_roots(s), std::min(7u, processors));
  ReadyList<Policy> all(s), kept(s);
  kept.drop(start_roots(s));
  for (std::uint32_t p = 0; p < start_roots(s); ++p) EXPECT_EQ(start_root<Policy>(s, p), all.pop());
  EXPECT_EQ(start_root<Policy>(s, start_roots(s)), kStopRef);
  EXPECT_EQ(kept.size(), all.size());
  while (!all.empty()) EXPECT_EQ(kept.pop(), all.pop());
}

TEST(StartRoots, ProcessorsTakeTheRootsTheSchedulerWouldRingFirst) {
  for (std::uint32_t processors : {1u, 3u, 7u, 9u}) {
    SCOPED_TRACE("processors " + std::to_string(processors));
    check_start_roots<FifoPolicy>(processors);
    check_start_roots<PriorityPolicy>(processors);
  }
}

}  // namespace
}  // namespace loom::test
