// A processor's side of the doorbell protocol (take_next_task, runtime/protocol.hpp) on a state of
// its own: the ring another thread of the processor already took (the GPU's warp 1 during the
// finish, peek_ring_warp) stands for the first poll, and a kept successor still goes first.
#include "runtime/protocol.hpp"
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

}  // namespace
}  // namespace loom::test
