// The persistent kernel runs the foundation's graphs: chain, fan-out/fan-in, gates, dynamic
// emission, repeated launches, graph capture, watchdog, trace.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "runtime/cuda/scoped_device.hpp"
#include "runtime/runtime.hpp"
#include "tasks/empty.hpp"
#include "tests/gpu/gpu_test_util.cuh"
#include "tests/hold_task.hpp"
#include "tests/keep_task.hpp"
#include "tests/seed.hpp"
#include "tests/wave_task.hpp"

namespace loom_gpu_test {

using loom::EventId;
using loom::Graph;
using loom::GraphBuilder;
using loom::TaskContext;

// Records, per task, a global ticket taken when it starts; the test checks the order.
struct Stamp {
  static constexpr char const* name = "stamp";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    unsigned long long* clock;   // global ticket counter
    unsigned long long* starts;  // [tasks]
    unsigned long long* ends;    // [tasks]
    std::uint32_t index;
  };
  static void host(Payload const& p, TaskContext&) {
    p.starts[p.index] = ++*p.clock;
    p.ends[p.index] = ++*p.clock;
  }
  __device__ static void device(Payload const& p, TaskContext&) {
    if (threadIdx.x == 0) {
      p.starts[p.index] = atomicAdd(p.clock, 1ull) + 1;
      __threadfence();
      p.ends[p.index] = atomicAdd(p.clock, 1ull) + 1;
    }
  }
};

// Emits `count` dynamic Stamp tasks (bound `bound`), retiring the rest of the bound; from thread 0
// one at a time, or (by_block) from the whole block under one reservation.
struct Spawn {
  static constexpr char const* name = "spawn";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    Stamp::Payload stamp;
    std::uint32_t count;
    std::uint32_t bound;
    EventId completes;
    bool by_block;
  };
  static void host(Payload const&, TaskContext&) {}
  __device__ static void device(Payload const& p, TaskContext& ctx);
};

// Fails its check when `value` is not `want`: the device-side assertion path.
struct Check {
  static constexpr char const* name = "check";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    std::uint32_t value;
    std::uint32_t want;
  };
  static void host(Payload const&, TaskContext&) {}
  __device__ static void device(Payload const& p, TaskContext& ctx);
};

// Fails while the device word `*when` is not zero: a failure that a later launch of the same graph
// does not repeat.
struct FailWhen {
  static constexpr char const* name = "fail_when";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    std::uint32_t const* when;
  };
  static void host(Payload const&, TaskContext&) {}
  __device__ static void device(Payload const& p, TaskContext& ctx);
};

// Needs more shared memory than any SM has: the launcher must refuse it before launching.
struct Huge {
  static constexpr char const* name = "huge";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 512 * 1024;
  struct Payload {
    std::uint32_t unused;
  };
  static void host(Payload const&, TaskContext&) {}
  __device__ static void device(Payload const&, TaskContext&) {}
};

// Spins until the host sets `*release`, with no watchdog on purpose: a block stuck where no
// watchdog reaches, as a hardware wait would leave it.
struct Stuck {
  static constexpr char const* name = "stuck";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    std::uint32_t const* release;
  };
  static void host(Payload const&, TaskContext&) {}
  __device__ static void device(Payload const& p, TaskContext&) {
    if (threadIdx.x == 0)
      while (*static_cast<std::uint32_t const volatile*>(p.release) == 0) {
      }
  }
};

using TestPipeline = loom::Pipeline<loom::tasks::Empty, Stamp, Spawn, Check, FailWhen>;
using loom::test::Wave;  // tests/wave_task.hpp
using WavePipeline = loom::Pipeline<Wave>;
using loom::test::Hold;  // tests/hold_task.hpp
using HoldPipeline = loom::Pipeline<Hold>;
using loom::test::keeping_graph;  // tests/keep_task.hpp
using loom::test::keeping_outcome;
using loom::test::KeepPipeline;
using loom::test::KeepWords;
using loom::test::sharing_graph;
using loom::test::sharing_outcome;
using HugePipeline = loom::Pipeline<Huge>;
using StuckPipeline = loom::Pipeline<Stuck>;

__device__ void Check::device(Payload const& p, TaskContext& ctx) {
  if (threadIdx.x == 0 && p.value != p.want) ctx.fail(__LINE__, p.value, p.want);
}

__device__ void FailWhen::device(Payload const& p, TaskContext& ctx) {
  if (threadIdx.x == 0) {
    std::uint32_t const when = *static_cast<std::uint32_t const volatile*>(p.when);
    if (when != 0) ctx.fail(__LINE__, when, 0);
  }
}

__device__ void Spawn::device(Payload const& p, TaskContext& ctx) {
  if (p.by_block) {
    bool const ok = ctx.emit_many_by_block(p.count, [&](std::uint32_t i) {
      Stamp::Payload s = p.stamp;
      s.index = p.stamp.index + i;
      return TestPipeline::make_dynamic<Stamp>(s, p.completes);
    });
    if (threadIdx.x == 0 && ok) ctx.retire(p.bound - p.count);
    return;
  }
  if (threadIdx.x != 0) return;
  for (std::uint32_t i = 0; i < p.count; ++i) {
    Stamp::Payload s = p.stamp;
    s.index = p.stamp.index + i;
    ctx.emit(TestPipeline::make_dynamic<Stamp>(s, p.completes));
  }
  ctx.retire(p.bound - p.count);
}

}  // namespace loom_gpu_test

namespace {

using namespace loom_gpu_test;
using loom::EventId;
using loom::GraphBuilder;

struct Stamps {
  explicit Stamps(std::size_t n) : clock(1), starts(n), ends(n) { clock.fill_bytes(0); }
  loom::DeviceBuffer<unsigned long long> clock, starts, ends;
  Stamp::Payload payload(std::uint32_t i) const {
    return Stamp::Payload{clock.get(), starts.get(), ends.get(), i};
  }
  void poison() {
    starts.fill_bytes(0);
    ends.fill_bytes(0);
  }
};

TEST(GpuRuntime, ChainRunsInOrder) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t n = 10000;
  Stamps st(n);
  GraphBuilder b;
  EventId prev = loom::kNoEvent;
  for (std::uint32_t i = 0; i < n; ++i) {
    EventId const e = b.add_event(1);
    if (prev == loom::kNoEvent)
      b.add_task(TestPipeline::make<Stamp>(st.payload(i), e));
    else
      b.add_task(TestPipeline::make<Stamp>(st.payload(i), e), {prev});
    prev = e;
  }
  loom::GpuExecutor<TestPipeline> ex(b.build());
  for (int launch = 0; launch < 3; ++launch) {
    st.poison();
    ex.run();
    auto const starts = st.starts.download();
    auto const ends = st.ends.download();
    for (std::uint32_t i = 0; i < n; ++i) {
      ASSERT_NE(starts[i], 0u) << "task " << i << " never ran";
      if (i > 0) ASSERT_GT(starts[i], ends[i - 1]) << "task " << i << " ran before its predecessor";
    }
  }
  EXPECT_EQ(ex.launches(), 3u);
}

TEST(GpuRuntime, FanOutFanInAndGates) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t width = 10000;
  Stamps st(width + 4);
  GraphBuilder b;
  EventId const head = b.add_event(1);
  EventId const body = b.add_event(width);
  EventId const side = b.add_event(1);
  b.add_task(TestPipeline::make<Stamp>(st.payload(0), head));
  b.add_task(TestPipeline::make<Stamp>(st.payload(1), side));
  for (std::uint32_t i = 0; i < width; ++i)
    b.add_task(TestPipeline::make<Stamp>(st.payload(2 + i), body), {head});
  b.add_task(TestPipeline::make<Stamp>(st.payload(width + 2)), {body, side});  // two gates
  for (auto policy : {loom::SchedulingPolicy::fifo, loom::SchedulingPolicy::priority}) {
    loom::GpuOptions o;
    o.policy = policy;
    loom::GpuExecutor<TestPipeline> ex(b.build(), o);
    for (int launch = 0; launch < 3; ++launch) {
      st.poison();
      ex.run();
      auto const starts = st.starts.download();
      auto const ends = st.ends.download();
      unsigned long long last_body_end = 0;
      for (std::uint32_t i = 0; i < width; ++i) {
        ASSERT_GT(starts[2 + i], ends[0]);
        last_body_end = std::max(last_body_end, ends[2 + i]);
      }
      EXPECT_GT(starts[width + 2], last_body_end);
      EXPECT_GT(starts[width + 2], ends[1]);
    }
  }
}

// `sources` root tasks, each completing an event of its own, and `sinks` tasks gated on up to three
// of those events: pick(rng, chosen) names a source for a sink that has `chosen` so far, or returns
// `sources` to skip the pick. The graph runs `launches` times under both policies (FIFO with local
// dispatch, priority without); every task runs once per launch, each sink after its sources.
template <class Pick>
void run_sources_and_sinks(std::uint32_t sources, std::uint32_t sinks, int launches, Pick pick) {
  Stamps st(sources + sinks);
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  GraphBuilder b;
  std::vector<EventId> done(sources);
  for (std::uint32_t i = 0; i < sources; ++i) {
    done[i] = b.add_event(1);
    b.add_task(TestPipeline::make<Stamp>(st.payload(i), done[i]));
  }
  std::vector<std::vector<std::uint32_t>> after(sinks);
  for (std::uint32_t j = 0; j < sinks; ++j) {
    std::vector<EventId> gates;
    for (std::uint32_t g = 0, k = 1 + rng() % 3; g < k; ++g) {
      std::uint32_t const p = pick(rng, std::as_const(after[j]));
      if (p == sources) continue;
      after[j].push_back(p);
      gates.push_back(done[p]);
    }
    b.add_task(TestPipeline::make<Stamp>(st.payload(sources + j)), gates);
  }
  for (auto policy : {loom::SchedulingPolicy::fifo, loom::SchedulingPolicy::priority}) {
    loom::GpuOptions o;
    o.policy = policy;
    loom::GpuExecutor<TestPipeline> ex(b.build(), o);
    for (int launch = 0; launch < launches; ++launch) {
      st.poison();
      unsigned long long const before = st.clock.download()[0];
      ex.run();
      auto const starts = st.starts.download();
      auto const ends = st.ends.download();
      // Two tickets per run: no task ran twice.
      ASSERT_EQ(st.clock.download()[0] - before, 2ull * (sources + sinks));
      for (std::uint32_t j = 0; j < sinks; ++j) {
        ASSERT_NE(starts[sources + j], 0u) << "sink " << j << " never ran";
        for (std::uint32_t p : after[j])
          ASSERT_GT(starts[sources + j], ends[p]) << "sink " << j << " ran before source " << p;
      }
    }
  }
}

bool holds(std::vector<std::uint32_t> const& chosen, std::uint32_t p) {
  return std::find(chosen.begin(), chosen.end(), p) != chosen.end();
}

// Fan-outs wider than one chunk go to the scheduler warp as fan-out entries; it releases them 32
// lanes at a time and opens the gates of tasks that also wait on other fan-outs.
TEST(GpuRuntime, WideFanOutsWithSharedGatesRunEachTaskOnceAfterItsPredecessors) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t sources = 6;
  run_sources_and_sinks(sources, 6000, 3, [](std::mt19937& rng, auto const& chosen) {
    std::uint32_t const p = rng() % sources;
    return holds(chosen, p) ? sources : p;
  });
}

// Fan-outs of at most one chunk are released by the last arriver's warp, one successor per lane
// (finish_task_warp): hundreds of them at once, of every width from 1 to kFanOutAbove, whose
// successors also wait on other fan-outs.
TEST(GpuRuntime, NarrowFanOutsReleasedByTheWarpRunEachTaskOnceAfterItsPredecessors) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t sources = 400;
  // Source p takes at most 1 + p % kFanOutAbove successors, so every width occurs.
  std::vector<std::uint32_t> width(sources, 0);
  auto const full = [&](std::uint32_t p) { return width[p] > p % loom::kFanOutAbove; };
  run_sources_and_sinks(sources, 2400, 5, [&](std::mt19937& rng, auto const& chosen) {
    std::uint32_t p = rng() % sources;
    for (std::uint32_t tries = 0; tries < sources && (full(p) || holds(chosen, p)); ++tries)
      p = (p + 1) % sources;
    if (full(p) || holds(chosen, p)) return sources;
    ++width[p];
    return p;
  });
}

TEST(GpuRuntime, ThousandsOfLaunchesReuseTheStateWithoutReset) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t width = 64;
  Stamps st(width + 1);
  GraphBuilder b;
  EventId const all = b.add_event(width);
  for (std::uint32_t i = 0; i < width; ++i)
    b.add_task(TestPipeline::make<Stamp>(st.payload(i), all));
  b.add_task(TestPipeline::make<Stamp>(st.payload(width)), {all});
  loom::GpuExecutor<TestPipeline> ex(b.build());
  constexpr int launches = 10000;
  for (int i = 0; i < launches; ++i) ex.launch();
  ex.check();
  EXPECT_EQ(ex.launches(), static_cast<std::uint64_t>(launches));
  // The clock counts two tickets per task per launch: nothing ran twice or was skipped.
  auto const clock = st.clock.download();
  EXPECT_EQ(clock[0], 2ull * (width + 1) * launches);
}

// The same executor after failed launches: the host re-initialises the state (report words,
// credits, counters), and the next launch runs every task exactly once. Wider than the grid, so the
// roots outnumber the first credits.
TEST(GpuRuntime, SameExecutorRunsAgainAfterAFailedLaunch) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t width = 600;
  Stamps st(width);
  loom::DeviceBuffer<std::uint32_t> when(1);
  GraphBuilder b;
  for (std::uint32_t i = 0; i < width; ++i) b.add_task(TestPipeline::make<Stamp>(st.payload(i)));
  b.add_task(TestPipeline::make<FailWhen>(FailWhen::Payload{when.get()}));
  loom::GpuExecutor<TestPipeline> ex(b.build());
  for (std::uint32_t round = 0; round < 4; ++round) {
    when.upload({round + 1});
    try {
      ex.run();
      ADD_FAILURE() << "round " << round << ": the failing task must end the launch with an error";
    } catch (loom::Error const& e) {
      EXPECT_NE(std::string(e.what()).find("fail_when"), std::string::npos) << e.what();
    }
    when.upload({0u});
    st.poison();
    st.clock.fill_bytes(0);
    ex.run();
    auto const starts = st.starts.download();
    for (std::uint32_t i = 0; i < width; ++i)
      ASSERT_NE(starts[i], 0ull) << "round " << round << ": task " << i << " did not run";
    EXPECT_EQ(st.clock.download()[0], 2ull * width) << "round " << round;
  }
}

TEST(GpuRuntime, LaunchReplaysFromACudaGraph) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t width = 256;
  Stamps st(width);
  GraphBuilder b;
  for (std::uint32_t i = 0; i < width; ++i) b.add_task(TestPipeline::make<Stamp>(st.payload(i)));
  loom::GpuExecutor<TestPipeline> ex(b.build());
  cudaStream_t stream;
  LOOM_CUDA(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  LOOM_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  ex.launch(stream);
  LOOM_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  LOOM_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  constexpr int replays = 100;
  for (int i = 0; i < replays; ++i) LOOM_CUDA(cudaGraphLaunch(exec, stream));
  ex.check(stream);
  EXPECT_EQ(ex.launches(), static_cast<std::uint64_t>(replays));
  EXPECT_EQ(st.clock.download()[0], 2ull * width * replays);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(GpuRuntime, DynamicEmissionWithinALargerBound) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t spawners = 32, bound_each = 40;
  Stamps st(spawners * bound_each + 1);
  std::vector<std::uint32_t> counts(spawners);
  std::uint32_t total = 0;
  for (auto& c : counts) total += (c = rng() % (bound_each + 1));
  GraphBuilder b;
  EventId const done = b.add_event(total + spawners, loom::EventOptions{true});
  for (std::uint32_t i = 0; i < spawners; ++i)
    b.add_task(TestPipeline::make<Spawn>(
        Spawn::Payload{st.payload(i * bound_each), counts[i], bound_each, done, false}, done));
  b.add_task(TestPipeline::make<Stamp>(st.payload(spawners * bound_each)), {done});
  b.set_dynamic_bound(spawners * bound_each);
  loom::GpuExecutor<TestPipeline> ex(b.build());
  for (int launch = 0; launch < 5; ++launch) {
    st.poison();
    ex.run();
    auto const starts = st.starts.download();
    for (std::uint32_t i = 0; i < spawners; ++i)
      for (std::uint32_t j = 0; j < bound_each; ++j)
        EXPECT_EQ(starts[i * bound_each + j] != 0, j < counts[i]) << "spawner " << i << " #" << j;
    EXPECT_NE(starts[spawners * bound_each], 0u) << "the successor of the dynamic tasks never ran";
  }
}

// Blocks emitting thousands of tasks each under one reservation (more than the block's threads,
// none, one), beside a thread that emits one at a time: every task runs, once.
TEST(GpuRuntime, BlockEmissionRunsEveryTaskOnce) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  constexpr std::uint32_t spawners = 12, bound_each = 3000;
  Stamps st(spawners * bound_each + 1);
  std::vector<std::uint32_t> counts(spawners);
  std::uint32_t total = 0;
  for (std::uint32_t i = 0; i < spawners; ++i)
    total += (counts[i] = i == 0 ? 0 : i == 1 ? 1 : i == 2 ? bound_each : rng() % bound_each);
  GraphBuilder b;
  EventId const done = b.add_event(total + spawners, loom::EventOptions{true});
  for (std::uint32_t i = 0; i < spawners; ++i)
    b.add_task(TestPipeline::make<Spawn>(
        Spawn::Payload{st.payload(i * bound_each), counts[i], bound_each, done, i != 3}, done));
  b.add_task(TestPipeline::make<Stamp>(st.payload(spawners * bound_each)), {done});
  b.set_dynamic_bound(spawners * bound_each);
  loom::GpuExecutor<TestPipeline> ex(b.build());
  for (int launch = 0; launch < 3; ++launch) {
    st.poison();
    st.clock.fill_bytes(0);
    ex.run();
    auto const starts = st.starts.download();
    for (std::uint32_t i = 0; i < spawners; ++i)
      for (std::uint32_t j = 0; j < bound_each; ++j)
        ASSERT_EQ(starts[i * bound_each + j] != 0, j < counts[i]) << "spawner " << i << " #" << j;
    EXPECT_NE(starts[spawners * bound_each], 0u) << "the successor of the dynamic tasks never ran";
    // Two tickets per Stamp task: a task run twice would take two more.
    EXPECT_EQ(st.clock.download()[0], 2ull * (total + 1));
  }
}

// The first task of a launch prefetches, so every processor has its second task queued while it
// runs its first, and each runs two (tests/wave_task.hpp): the first wave's tasks end 20 µs apart,
// the second's take 10 ms.
TEST(GpuRuntime, TwoWavesOfEqualTasksGiveEveryProcessorTwo) {
  LOOM_REQUIRE_GPU();
  std::uint32_t const processors = loom::GpuExecutor<WavePipeline>::launch_shape().grid - 1;
  loom::DeviceBuffer<std::uint32_t> started(1), timed_out(1), ran(processors);
  GraphBuilder b;
  for (std::uint32_t i = 0; i < 2 * processors; ++i)
    b.add_task(WavePipeline::make<Wave>(Wave::Payload{started.get(), ran.get(), timed_out.get(),
                                                      processors, 20, 10'000, 2'000'000}));
  loom::GpuExecutor<WavePipeline> ex(b.build());
  ASSERT_EQ(ex.processors(), processors);
  for (int launch = 0; launch < 3; ++launch) {
    started.fill_bytes(0);
    timed_out.fill_bytes(0);
    ran.fill_bytes(0);
    ex.run();
    ASSERT_EQ(timed_out.download()[0], 0u) << "the first wave never started together";
    auto const counts = ran.download();
    for (std::uint32_t p = 0; p < processors; ++p)
      ASSERT_EQ(counts[p], 2u) << "processor " << p << ", launch " << launch;
  }
}

// With waiting_first, a task emitted by a long task while the other processors wait runs on one
// of them, not behind the long task on its prefetch credit (tests/hold_task.hpp): the scheduler
// warp hands tasks to waiting processors first.
TEST(GpuRuntime, ATaskEmittedDuringALongTaskRunsOnAWaitingProcessor) {
  LOOM_REQUIRE_GPU();
  std::uint32_t const processors = loom::GpuExecutor<HoldPipeline>::launch_shape().grid - 1;
  loom::DeviceBuffer<std::uint32_t> words(3);  // shorts done, emitted ran, outcome
  Hold::Payload p{Hold::kLong, processors - 1, words.get(), words.get() + 1, words.get() + 2,
                  50,          200'000};
  GraphBuilder b;
  b.add_task(HoldPipeline::make<Hold>(p));
  p.role = Hold::kShort;
  for (std::uint32_t i = 1; i < processors; ++i) b.add_task(HoldPipeline::make<Hold>(p));
  b.set_dynamic_bound(1);
  loom::GpuOptions o;
  o.waiting_first = true;
  loom::GpuExecutor<HoldPipeline> ex(b.build(), o);
  for (int launch = 0; launch < 3; ++launch) {
    words.fill_bytes(0);
    ex.run();
    ASSERT_EQ(words.download()[2], std::uint32_t{Hold::kRanWhileHeld}) << "launch " << launch;
  }
}

// Without waiting_first too, a task emitted by a launch's only root while it runs goes to a
// processor without a root, not behind the root on its processor's first credit (first_credit_at).
TEST(GpuRuntime, ATaskEmittedDuringTheOnlyRootRunsOnAnotherProcessor) {
  LOOM_REQUIRE_GPU();
  loom::DeviceBuffer<std::uint32_t> words(3);  // shorts done, emitted ran, outcome
  Hold::Payload const p{Hold::kLong, 0, words.get(), words.get() + 1, words.get() + 2, 50, 200'000};
  GraphBuilder b;
  b.add_task(HoldPipeline::make<Hold>(p));
  b.set_dynamic_bound(1);
  loom::GpuExecutor<HoldPipeline> ex(b.build());
  for (int launch = 0; launch < 3; ++launch) {
    words.fill_bytes(0);
    ex.run();
    ASSERT_EQ(words.download()[2], std::uint32_t{Hold::kRanWhileHeld}) << "launch " << launch;
  }
}

// A body that emits with keep_first runs the first task it emitted next on its own processor,
// ahead of the waiting processors the scheduler would ring, and only that one
// (tests/keep_task.hpp; tests/cpu/dynamic_test.cpp for the CPU executor).
TEST(GpuRuntime, AKeptEmittedTaskRunsNextOnItsEmittersProcessor) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t children = 40;
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_first" : "queued");
    loom::DeviceBuffer<std::uint32_t> words(KeepWords::size(children + 2));
    KeepWords const log{words.get(), children + 2};
    loom::GpuExecutor<KeepPipeline> ex(keeping_graph(log, children, 50, keep));
    for (int launch = 0; launch < 3; ++launch) {
      words.fill_bytes(0);
      ex.run();
      auto host = words.download();
      EXPECT_EQ(keeping_outcome(KeepWords{host.data(), children + 2}, keep), "")
          << "launch " << launch;
    }
  }
}

// Roots running at once, one per processor for half the processors, share out one emission: each
// keeps the task it writes and runs it next, and every queued task runs once, over launches
// (tests/keep_task.hpp; tests/cpu/dynamic_test.cpp for the CPU executor). A body that keeps two
// fails with keep_unavailable.
TEST(GpuRuntime, RootsShareOutOneEmissionAndKeepTheirFirstTask) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t roots = 48, children = roots + 700;
  loom::DeviceBuffer<std::uint32_t> words(KeepWords::size(children)), actors(roots), sync(3);
  loom::DeviceBuffer<loom::SharedEmission> shared(1);
  sync.fill_bytes(0);
  KeepWords const log{words.get(), children};
  loom::GpuOptions o;
  o.max_processors = 2 * roots;
  for (bool keep_twice : {false, true}) {
    SCOPED_TRACE(keep_twice ? "keeping twice" : "sharing");
    loom::GpuExecutor<KeepPipeline> ex(
        sharing_graph(log, actors.get(), sync.get(), shared.get(), roots, keep_twice), o);
    for (int launch = 0; launch < (keep_twice ? 1 : 3); ++launch) {
      words.fill_bytes(0);
      if (keep_twice) {
        try {
          ex.run();
          ADD_FAILURE() << "a body kept two tasks and the launch succeeded";
        } catch (loom::Error const& e) {
          EXPECT_NE(std::string(e.what()).find("no free keep slot"), std::string::npos) << e.what();
        }
        continue;
      }
      ex.run();
      auto host = words.download();
      auto const who = actors.download();
      EXPECT_EQ(sharing_outcome(KeepWords{host.data(), children}, who.data(), roots), "")
          << "launch " << launch;
    }
  }
}

// The warp's waiting_first orders a ring of credits as the host's does, on random rings: any
// number of processors, head, credits held, tasks to take and waiting processors.
__global__ void waiting_first_kernel(std::uint64_t* idle_list, std::uint64_t* seen,
                                     std::uint32_t processors, std::uint32_t head,
                                     std::uint32_t held, std::uint32_t take) {
  loom::warp::waiting_first(loom::SchedulerPrivate{seen, idle_list}, processors, head, held, take);
}

TEST(GpuScheduler, WarpWaitingFirstMatchesTheHostOnRandomRings) {
  LOOM_REQUIRE_GPU();
  loom::test::TracedSeed const seed;
  std::mt19937 rng(seed);
  for (int round = 0; round < 200; ++round) {
    std::uint32_t const processors = 2 + rng() % 300;
    std::uint32_t const held = 2 + rng() % (processors - 1), take = 1 + rng() % (held - 1);
    std::uint32_t const head = rng() % processors;
    std::uint32_t const waiting_one_in = 1 + rng() % 8;
    SCOPED_TRACE("processors " + std::to_string(processors) + " held " + std::to_string(held) +
                 " take " + std::to_string(take) + " head " + std::to_string(head));
    std::vector<std::uint64_t> seen(processors), ring(2 * processors, ~0ull);
    std::vector<std::uint32_t> who(processors);
    std::iota(who.begin(), who.end(), 0u);
    std::shuffle(who.begin(), who.end(), rng);
    for (std::uint32_t p = 0; p < processors; ++p)
      seen[p] = loom::report_word(3 + p, 0, rng() % waiting_one_in == 0);
    for (std::uint32_t i = 0; i < held; ++i)
      ring[(head + i) % processors] = loom::idle_entry(who[i], 3 + who[i]);
    loom::DeviceBuffer<std::uint64_t> d_ring(ring), d_seen(seen);
    waiting_first_kernel<<<1, 32>>>(d_ring.get(), d_seen.get(), processors, head, held, take);
    LOOM_CUDA(cudaGetLastError());
    LOOM_CUDA(cudaDeviceSynchronize());
    loom::waiting_first(ring.data(), ring.data() + processors, processors, head, held, take,
                        seen.data());
    std::vector<std::uint64_t> const got = d_ring.download();
    for (std::uint32_t i = 0; i < held; ++i)
      ASSERT_EQ(got[(head + i) % processors], ring[(head + i) % processors]) << "position " << i;
  }
}

TEST(GpuRuntime, UnsatisfiableDependencyEndsInWatchdogError) {
  LOOM_REQUIRE_GPU();
  GraphBuilder b;
  EventId const never = b.add_event(2, loom::EventOptions{true});  // only one arrival will come
  b.add_task(TestPipeline::make<loom::tasks::Empty>({0}, never));
  b.add_task(TestPipeline::make<loom::tasks::Empty>({0}), {never});
  loom::GpuOptions o;
  o.watchdog = std::chrono::milliseconds(300);
  loom::GpuExecutor<TestPipeline> ex(b.build(), o);
  auto const t0 = std::chrono::steady_clock::now();
  try {
    ex.run();
    FAIL() << "an unsatisfiable dependency must not complete";
  } catch (loom::Error const& e) {
    std::string const msg = e.what();
    EXPECT_NE(msg.find("watchdog"), std::string::npos) << msg;
    EXPECT_NE(msg.find("scheduler"), std::string::npos) << msg;
    EXPECT_NE(msg.find("event 0 expected 2 arrivals"), std::string::npos) << msg;
    EXPECT_NE(msg.find("saw 1"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // The executor re-initialised itself: a satisfiable graph on the same device still runs.
  GraphBuilder ok;
  ok.add_task(TestPipeline::make<loom::tasks::Empty>({0}));
  loom::GpuExecutor<TestPipeline> ex2(ok.build());
  ex2.run();
}

// The scheduler's watchdog records the stall, but the stuck block cannot leave, so the launch
// never ends: check() raises the recorded error after its grace period instead of waiting.
TEST(GpuRuntime, LaunchThatCannotEndAfterItsErrorIsReportedNotWaitedFor) {
  LOOM_REQUIRE_GPU();
  loom::DeviceBuffer<std::uint32_t> release(std::vector<std::uint32_t>{0});
  GraphBuilder b;
  b.add_task(StuckPipeline::make<Stuck>({release.get()}));
  loom::GpuOptions o;
  o.watchdog = std::chrono::milliseconds(200);
  loom::GpuExecutor<StuckPipeline> ex(b.build(), o);
  cudaStream_t stream = nullptr, side = nullptr;
  LOOM_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LOOM_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  auto const t0 = std::chrono::steady_clock::now();
  ex.launch(stream);
  try {
    ex.check(stream);
    FAIL() << "a launch with a stuck block cannot have completed";
  } catch (loom::Error const& e) {
    std::string const msg = e.what();
    EXPECT_NE(msg.find("watchdog"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did not end"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_THROW(ex.launch(stream), loom::Error);
  // Let the block go: the launch then ends.
  std::uint32_t const one = 1;
  LOOM_CUDA(cudaMemcpyAsync(release.get(), &one, sizeof(one), cudaMemcpyHostToDevice, side));
  LOOM_CUDA(cudaStreamSynchronize(side));
  LOOM_CUDA(cudaStreamSynchronize(stream));
  LOOM_CUDA(cudaStreamDestroy(side));
  LOOM_CUDA(cudaStreamDestroy(stream));
}

TEST(GpuRuntime, DiamondsRunEveryTaskOnceAfterItsPredecessors) {
  LOOM_REQUIRE_GPU();
  // 2500 diamonds in a row: A -> {B, C} -> D -> next A. 10,000 tasks.
  constexpr std::uint32_t diamonds = 2500;
  Stamps st(4 * diamonds);
  GraphBuilder b;
  EventId prev = loom::kNoEvent;
  for (std::uint32_t d = 0; d < diamonds; ++d) {
    EventId const a_done = b.add_event(1), bc_done = b.add_event(2), d_done = b.add_event(1);
    std::vector<EventId> after;
    if (prev != loom::kNoEvent) after.push_back(prev);
    b.add_task(TestPipeline::make<Stamp>(st.payload(4 * d), a_done), after);
    b.add_task(TestPipeline::make<Stamp>(st.payload(4 * d + 1), bc_done), {a_done});
    b.add_task(TestPipeline::make<Stamp>(st.payload(4 * d + 2), bc_done), {a_done});
    b.add_task(TestPipeline::make<Stamp>(st.payload(4 * d + 3), d_done), {bc_done});
    prev = d_done;
  }
  for (auto policy : {loom::SchedulingPolicy::fifo, loom::SchedulingPolicy::priority}) {
    loom::GpuOptions o;
    o.policy = policy;
    loom::GpuExecutor<TestPipeline> ex(b.build(), o);
    st.poison();
    ex.run();
    auto const starts = st.starts.download();
    auto const ends = st.ends.download();
    for (std::uint32_t d = 0; d < diamonds; ++d) {
      std::uint32_t const a = 4 * d;
      ASSERT_GT(starts[a + 1], ends[a]);
      ASSERT_GT(starts[a + 2], ends[a]);
      ASSERT_GT(starts[a + 3], std::max(ends[a + 1], ends[a + 2]));
      if (d > 0) ASSERT_GT(starts[a], ends[a - 1]);
    }
  }
}

TEST(GpuRuntime, FailedDeviceCheckEndsTheLaunchWithItsTaskType) {
  LOOM_REQUIRE_GPU();
  GraphBuilder b;
  for (std::uint32_t i = 0; i < 500; ++i)
    b.add_task(TestPipeline::make<Check>(Check::Payload{i, i == 321 ? 0u : i}));
  loom::GpuExecutor<TestPipeline> ex(b.build());
  try {
    ex.run();
    FAIL() << "a failed check must end the launch with an error";
  } catch (loom::Error const& e) {
    std::string const msg = e.what();
    EXPECT_NE(msg.find("check"), std::string::npos) << msg;
    EXPECT_NE(msg.find("321"), std::string::npos) << msg;
  }
  // The state was re-initialised: a good graph runs on the same executor's device.
  GraphBuilder ok;
  ok.add_task(TestPipeline::make<Check>(Check::Payload{7, 7}));
  loom::GpuExecutor<TestPipeline> ex2(ok.build());
  ex2.run();
}

TEST(GpuRuntime, LauncherRefusesAPipelineThatCannotBeResident) {
  LOOM_REQUIRE_GPU();
  GraphBuilder b;
  b.add_task(HugePipeline::make<Huge>({0}));
  try {
    loom::GpuExecutor<HugePipeline> ex(b.build());
    FAIL() << "a block needing 512 KiB of shared memory cannot be resident";
  } catch (loom::Error const& e) {
    EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
  }
}

// n independent empty tasks, task i with id i.
auto empty_tasks(std::uint32_t n) {
  GraphBuilder b;
  for (std::uint32_t i = 0; i < n; ++i)
    b.add_task(TestPipeline::make<loom::tasks::Empty>({0}, loom::kNoEvent, i));
  return b.build();
}

loom::GpuOptions tracing(std::uint32_t records) {
  loom::GpuOptions o;
  o.trace_capacity = records;
  return o;
}

TEST(GpuRuntime, TraceRecordsEveryTask) {
  LOOM_REQUIRE_GPU();
  constexpr std::uint32_t n = 1000;
  loom::GpuExecutor<TestPipeline> ex(empty_tasks(n), tracing(2 * n));
  ex.run();
  auto const trace = ex.take_trace();
  ASSERT_EQ(trace.size(), n);
  std::vector<bool> seen(n, false);
  for (auto const& r : trace) {
    ASSERT_LT(r.task_id, n);
    seen[r.task_id] = true;
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_LT(r.processor, ex.processors());
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](bool s) { return s; }));
  std::string const json = loom::chrome_trace_json(trace, TestPipeline::names, TestPipeline::size);
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
}

// One process driving several GPUs: the trace is read and reset on the executor's own device,
// whichever device is current when the host asks for it.
TEST(GpuRuntime, TraceIsTakenFromTheExecutorsDeviceWhicheverIsCurrent) {
  LOOM_REQUIRE_GPU();
  if (loom::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr std::uint32_t n = 64;
  loom::ScopedDevice const first(0);
  std::optional<loom::GpuExecutor<TestPipeline>> ex;
  {
    loom::ScopedDevice const second(1);
    ex.emplace(empty_tasks(n), tracing(2 * n));
    ex->run();
  }
  EXPECT_EQ(ex->take_trace().size(), n);  // device 0 current
  EXPECT_TRUE(ex->take_trace().empty());  // the count was reset on device 1
  int current = -1;
  LOOM_CUDA(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);
}

TEST(GpuRuntime, GridComesFromTheOccupancyApi) {
  LOOM_REQUIRE_GPU();
  GraphBuilder b;
  b.add_task(TestPipeline::make<loom::tasks::Empty>({0}));
  loom::GpuExecutor<TestPipeline> ex(b.build());
  int device = 0, sms = 0;
  LOOM_CUDA(cudaGetDevice(&device));
  LOOM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EXPECT_EQ(ex.shape().sm_count, static_cast<std::uint32_t>(sms));
  EXPECT_EQ(ex.shape().grid, ex.shape().blocks_per_sm * ex.shape().sm_count);
  loom::GpuOptions small;
  small.max_processors = 3;
  loom::GpuExecutor<TestPipeline> ex3(b.build(), small);
  EXPECT_EQ(ex3.processors(), 3u);
  ex3.run();
}

}  // namespace
