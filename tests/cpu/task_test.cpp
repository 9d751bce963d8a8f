// The task descriptor and the pipeline's compile-time list: encoding, type ids, block shape,
// host dispatch.
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

static_assert(sizeof(Task) == 64);
static_assert(alignof(Task) == 16);
static_assert(std::is_trivially_copyable_v<Task>);
static_assert(sizeof(TaskHeader) == 16);
static_assert(kPayloadBytes == 48);

TEST(Task, DescriptorIsSixtyFourBytesAlignedAndTriviallyCopyable) {
  EXPECT_EQ(sizeof(Task), 64u);
  EXPECT_EQ(alignof(Task), 16u);
  EXPECT_TRUE(std::is_trivially_copyable_v<Task>);
  EXPECT_EQ(offsetof(Task, payload), sizeof(TaskHeader));
  EXPECT_EQ(sizeof(Task) % 16, 0u);  // moves as whole uint4s
}

struct Mixed {
  std::uint8_t a;
  std::uint16_t b;
  std::uint32_t c;
  std::uint64_t d;
  float e[3];
  double f;
};
struct Pointers {
  float const* in;
  float* out;
  std::uint32_t rows, cols;
};
struct Tiny {
  std::uint8_t byte;
};

template <class P>
bool same_bytes(P const& a, P const& b) {
  return std::memcmp(&a, &b, sizeof(P)) == 0;
}

TEST(Task, EncodeAndViewRoundTripSeveralPayloads) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  for (int round = 0; round < 100; ++round) {
    Mixed m{};
    m.a = static_cast<std::uint8_t>(rng());
    m.b = static_cast<std::uint16_t>(rng());
    m.c = rng();
    m.d = (std::uint64_t{rng()} << 32) | rng();
    for (float& x : m.e) x = std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
    m.f = std::uniform_real_distribution<double>(-1.0, 1.0)(rng);
    float scratch[4];
    Pointers p{scratch, scratch + 1 + rng() % 3, static_cast<std::uint32_t>(rng()),
               static_cast<std::uint32_t>(rng())};
    Tiny tiny{static_cast<std::uint8_t>(rng())};
    Wide::Payload w{};
    for (double& x : w.values) x = std::uniform_real_distribution<double>(-1.0, 1.0)(rng);

    EventId const ev = rng();
    std::uint32_t const id = rng();
    std::uint8_t const prio = static_cast<std::uint8_t>(rng());
    std::uint16_t const type = static_cast<std::uint16_t>(rng());

    Task const tm = encode_task(type, m, ev, id, prio);
    EXPECT_TRUE(same_bytes(tm.as<Mixed>(), m));
    EXPECT_EQ(tm.header.type, type);
    EXPECT_EQ(tm.header.event, ev);
    EXPECT_EQ(tm.header.id, id);
    EXPECT_EQ(tm.header.priority, prio);
    EXPECT_EQ(tm.header.flags, 0u);
    EXPECT_EQ(tm.header.aux, 0u);

    Task const tp = encode_task(1, p);
    EXPECT_EQ(tp.as<Pointers>().in, p.in);
    EXPECT_EQ(tp.as<Pointers>().out, p.out);
    EXPECT_EQ(tp.as<Pointers>().rows, p.rows);
    EXPECT_EQ(tp.as<Pointers>().cols, p.cols);
    EXPECT_EQ(tp.header.event, kNoEvent);  // the defaults
    EXPECT_EQ(tp.header.id, 0u);
    EXPECT_EQ(tp.header.priority, 0u);

    Task const tt = encode_task(2, tiny);
    EXPECT_EQ(tt.as<Tiny>().byte, tiny.byte);
    // Bytes past a small payload are zero: descriptors compare and hash reproducibly.
    for (std::size_t i = sizeof(Tiny); i < kPayloadBytes; ++i) ASSERT_EQ(tt.payload[i], 0u);

    Task const tw = encode_task(3, w);
    EXPECT_TRUE(same_bytes(tw.as<Wide::Payload>(), w));

    // A copied descriptor carries everything (it moves between queues as raw bytes).
    Task copy;
    std::memcpy(&copy, &tm, sizeof(Task));
    EXPECT_TRUE(same_bytes(copy.as<Mixed>(), m));
    EXPECT_EQ(copy.header.id, id);
  }
}

TEST(Pipeline, TypeIdsArePositionsInTheList) {
  EXPECT_EQ(TestPipeline::id<Stamp>, 0);
  EXPECT_EQ(TestPipeline::id<Emitter>, 1);
  EXPECT_EQ(TestPipeline::id<CheckedFail>, 2);
  EXPECT_EQ(TestPipeline::id<Wide>, 3);
  EXPECT_EQ(TestPipeline::size, 4u);
  using Reordered = Pipeline<Wide, Stamp>;
  EXPECT_EQ(Reordered::id<Wide>, 0);
  EXPECT_EQ(Reordered::id<Stamp>, 1);
}

TEST(Pipeline, NamesFollowTheList) {
  ASSERT_EQ(std::size(TestPipeline::names), 4u);
  EXPECT_STREQ(TestPipeline::names[0], "stamp");
  EXPECT_STREQ(TestPipeline::names[1], "emitter");
  EXPECT_STREQ(TestPipeline::names[2], "checked_fail");
  EXPECT_STREQ(TestPipeline::names[3], "wide");
}

TEST(Pipeline, BlockShapeIsTheMaximumOverTypes) {
  EXPECT_EQ(TestPipeline::threads, 256u);        // Wide
  EXPECT_EQ(TestPipeline::shared_bytes, 4096u);  // CheckedFail
  EXPECT_EQ((Pipeline<Stamp>::threads), 64u);
  EXPECT_EQ((Pipeline<Stamp>::shared_bytes), 0u);
  EXPECT_EQ((Pipeline<Stamp, Emitter>::threads), 128u);
  EXPECT_EQ((Pipeline<Stamp, Emitter>::shared_bytes), 1024u);
}

// A type may ask for its device body to run as a call; by default it is inlined into the kernel.
struct CalledBody : Stamp {
  static constexpr bool call_body = true;
};
struct InlinedBody : Stamp {
  static constexpr bool call_body = false;
};

TEST(Pipeline, DeviceBodiesAreInlinedUnlessTheTypeAsksForACall) {
  using P = Pipeline<Stamp, CalledBody, InlinedBody>;
  EXPECT_FALSE(P::called<Stamp>);
  EXPECT_TRUE(P::called<CalledBody>);
  EXPECT_FALSE(P::called<InlinedBody>);
}

TEST(Pipeline, MakeSetsTypeEventIdAndPriority) {
  Recorder r(1);
  Task const t = TestPipeline::make<Stamp>(Stamp::Payload{&r, 7}, 5, 11, 2);
  EXPECT_EQ(t.header.type, TestPipeline::id<Stamp>);
  EXPECT_EQ(t.header.event, 5u);
  EXPECT_EQ(t.header.id, 11u);
  EXPECT_EQ(t.header.priority, 2u);
  EXPECT_EQ(t.as<Stamp::Payload>().recorder, &r);
  EXPECT_EQ(t.as<Stamp::Payload>().slot, 7u);
  Task const d = TestPipeline::make_dynamic<CheckedFail>(CheckedFail::Payload{nullptr, 0});
  EXPECT_EQ(d.header.type, TestPipeline::id<CheckedFail>);
  EXPECT_EQ(d.header.event, kNoEvent);
}

TEST(Pipeline, RunHostCallsTheBodyOfTheTasksType) {
  HostState hs;
  SymmetricView const heap{{}, 0, 0, 1};
  TaskContext ctx(hs.state(), 1, WaiterId{Actor::processor, 0, 0}, heap, nullptr);
  Recorder r(3);
  EXPECT_TRUE(TestPipeline::run_host(stamp_task(r, 1), ctx));
  EXPECT_EQ(r.runs(0), 0u);
  EXPECT_EQ(r.runs(1), 1u);
  EXPECT_EQ(r.runs(2), 0u);

  // Emitter stamps its own slot (and emits nothing here: count 0, bound 0).
  std::uint32_t const zero = 0;
  Task const emitter =
      TestPipeline::make<Emitter>(Emitter::Payload{&r, &zero, 2, 0, 0, kNoEvent, kNoEvent, 0});
  EXPECT_TRUE(TestPipeline::run_host(emitter, ctx));
  EXPECT_EQ(r.runs(2), 1u);
  EXPECT_EQ(r.runs(1), 1u);

  // CheckedFail with its trigger set records a task_assert naming its type.
  std::uint32_t const trigger = 9;
  EXPECT_FALSE(ctx.failed());
  EXPECT_TRUE(TestPipeline::run_host(checked_fail_task<TestPipeline>(&trigger), ctx));
  ASSERT_TRUE(ctx.failed());
  EXPECT_EQ(hs.state().error->code, static_cast<std::uint32_t>(ErrorCode::task_assert));
  EXPECT_EQ(hs.state().error->object, TestPipeline::id<CheckedFail>);
  EXPECT_EQ(hs.state().error->expected, 9u);
}

TEST(Pipeline, RunHostRejectsATypeOutsideTheList) {
  HostState hs;
  SymmetricView const heap{{}, 0, 0, 1};
  TaskContext ctx(hs.state(), 1, WaiterId{Actor::processor, 0, 0}, heap, nullptr);
  Recorder r(1);
  Task bad = stamp_task(r, 0);
  bad.header.type = TestPipeline::size;
  EXPECT_FALSE(TestPipeline::run_host(bad, ctx));
  EXPECT_EQ(r.runs(0), 0u);
  ASSERT_TRUE(ctx.failed());
  EXPECT_EQ(hs.state().error->code, static_cast<std::uint32_t>(ErrorCode::bad_task_type));
  EXPECT_EQ(hs.state().error->object, TestPipeline::size);
}

TEST(Pipeline, UnknownTypeFailsTheLaunchWithBadTaskType) {
  Recorder r(2);
  GraphBuilder b;
  EventId const e = b.add_event(1);
  b.add_task(stamp_task(r, 0, e));
  Task bad = stamp_task(r, 1);
  bad.header.type = 99;
  b.add_task(bad, {e});
  CpuExecutor<TestPipeline> ex(one_rank(b.build()), options_with(2));
  std::string const message = error_of([&] { ex.run(); });
  EXPECT_TRUE(mentions(message, "not in the pipeline"));
  EXPECT_TRUE(mentions(message, "99"));
  EXPECT_EQ(r.runs(0), 1u);
  EXPECT_EQ(r.runs(1), 0u);
}

}  // namespace
}  // namespace loom::test
