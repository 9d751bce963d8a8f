// Two waves of P equal tasks on P processors, for the CPU executor's suite and the GPU's: the
// first P tasks wait until all of them have started, then end one by one, step_us apart in the
// order they started; the other P take second_us. Each processor counts the tasks it ran. Used
// to check that a launch's first task prefetches (kFirstTaskNs): then every processor has its
// second task queued while it runs its first, and each runs two.
#pragma once

#include <cstdint>

#include "runtime/atomic.hpp"
#include "runtime/context.hpp"
#include "runtime/watchdog.hpp"
#include "tests/pause_until.hpp"

namespace loom::test {

struct Wave {
  static constexpr char const* name = "wave";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    std::uint32_t* started;    // tickets, in start order
    std::uint32_t* ran;        // [processors]
    std::uint32_t* timed_out;  // 1: the first wave never started together (within give_up_us)
    std::uint32_t processors;
    std::uint32_t step_us, second_us, give_up_us;
  };

  static void host(Payload const& p, TaskContext& ctx) { run(p, ctx.actor_index()); }
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    if (threadIdx.x == 0) run(p, ctx.actor_index());
  }
#endif

 private:
  LOOM_HD static void run(Payload const& p, std::uint32_t me) {
    std::uint32_t const order = fetch_add_relaxed(*p.started, 1u);
    fetch_add_relaxed(p.ran[me], 1u);
    std::uint64_t const t0 = now_ns();
    constexpr std::uint64_t us = 1000;
    if (order >= p.processors) return pause_until(t0 + p.second_us * us);
    while (load_relaxed(*p.started) < p.processors)
      if (now_ns() > t0 + p.give_up_us * us) return store_relaxed(*p.timed_out, 1u);
    pause_until(now_ns() + p.step_us * us * (order + 1));
  }
};

}  // namespace loom::test
