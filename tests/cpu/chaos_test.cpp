// Adversarial interleaving: with CpuOptions::chaos_seed set, every actor pauses at random at the
// protocol's points (queue tickets, event arrivals, polls). The same graphs must still give exactly
// the right execution under every seed, with the scheduler handing out credits in either order.
#include "tests/cpu/test_graphs.hpp"

namespace loom::test {
namespace {

constexpr int kSeeds = 20;

// Seeds base+1 .. base+kSeeds; base is fresh per test and printed on failure.
template <class Fn>
void for_each_chaos_seed(Fn&& fn) {
  TracedSeed const base;
  for (int i = 1; i <= kSeeds; ++i) {
    std::uint64_t const chaos = std::uint64_t{base} + static_cast<std::uint64_t>(i);
    SCOPED_TRACE("chaos seed " + std::to_string(chaos));
    fn(chaos);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Odd seeds run with waiting_first (the scheduler reorders its credits), even ones without.
void run_shape_under_chaos(Shape const& shape, Recorder& r, std::uint64_t chaos,
                           std::uint32_t processors) {
  CpuOptions o = options_with(processors, chaos);
  o.waiting_first = chaos % 2 == 1;
  SCOPED_TRACE(o.waiting_first ? "waiting_first" : "oldest credit first");
  CpuExecutor<TestPipeline> ex(one_rank(shape.graph), o);
  for (SchedulingPolicy policy : {SchedulingPolicy::fifo, SchedulingPolicy::priority}) {
    r.poison();
    ASSERT_TRUE(succeeds([&] { ex.run(policy); })) << to_string(policy);
    ASSERT_TRUE(ran_in_order(shape, r, ex.launches())) << to_string(policy);
  }
}

TEST(Chaos, DiamondsUnderRandomDelays) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    Recorder r(3 * 300 + 1);
    Shape const shape = diamond_chain_shape(r, 300, rng, /*priorities=*/true);
    run_shape_under_chaos(shape, r, chaos, 3);
  });
}

TEST(Chaos, FanOutFanInUnderRandomDelays) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    Recorder r(1500 + 2);
    Shape const shape = fan_shape(r, 1500, &rng);
    run_shape_under_chaos(shape, r, chaos, 4);
  });
}

TEST(Chaos, SharedWideFanOutsUnderRandomDelays) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    Recorder r(4 + 600);
    Shape const shape = shared_fanout_shape(r, 4, 600, rng);
    run_shape_under_chaos(shape, r, chaos, 4);
  });
}

TEST(Chaos, RandomDagUnderRandomDelays) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    Recorder r(1000);
    Shape const shape = random_dag_shape(r, 1000, 40, rng, /*priorities=*/true);
    run_shape_under_chaos(shape, r, chaos, 4);
  });
}

TEST(Chaos, DynamicEmissionUnderRandomDelays) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    constexpr std::uint32_t emitters = 6, bound = 200;
    Recorder r(EmissionShape::slots_for(emitters, bound));
    EmissionShape shape(r, emitters, bound);
    CpuExecutor<TestPipeline> ex(one_rank(shape.graph()), options_with(3, chaos));
    for (SchedulingPolicy policy : {SchedulingPolicy::fifo, SchedulingPolicy::priority}) {
      shape.draw_counts(rng);
      r.poison();
      ASSERT_TRUE(succeeds([&] { ex.run(policy); })) << to_string(policy);
      ASSERT_TRUE(shape.check(r, ex.launches())) << to_string(policy);
    }
  });
}

// Chaos also in the error path: a failing task among many must end the launch, every time, and
// leave the executor able to run.
TEST(Chaos, FailureUnderRandomDelaysEndsTheLaunchAndRecovers) {
  for_each_chaos_seed([](std::uint64_t chaos) {
    std::mt19937 rng(static_cast<std::uint32_t>(chaos));
    constexpr std::uint32_t emitters = 3, bound = 100;
    Recorder r(EmissionShape::slots_for(emitters, bound));
    std::uint32_t trigger = 1;
    EmissionShape shape(r, emitters, bound, {checked_fail_task<TestPipeline>(&trigger)});
    CpuExecutor<TestPipeline> ex(one_rank(shape.graph()), options_with(3, chaos));
    shape.draw_counts(rng);
    r.poison();
    ASSERT_TRUE(mentions(error_of([&] { ex.run(); }), "checked_fail"));
    trigger = 0;
    shape.draw_counts(rng);
    r.poison();
    ASSERT_TRUE(succeeds([&] { ex.run(); }));
    ASSERT_TRUE(shape.check(r, ex.launches()));
  });
}

}  // namespace
}  // namespace loom::test
