// A task emitted while one processor runs a long task and the others wait, for the CPU executor's
// suite and the GPU's. The long task held a prefetch credit since it started (a launch's first
// task prefetches), older than the waiting processors' credits; with StateOptions::waiting_first
// the emitted task must go to a waiting processor (runtime/scheduler_loop.hpp), not queue behind
// the long task.
// Roots: one long task and `shorts` short ones, one per processor. The long task waits for the
// short ones to end, lets their processors report that they wait (settle_us), emits the task, and
// holds its processor until that task has run or give_up_us has passed.
#pragma once

#include <cstdint>

#include "runtime/atomic.hpp"
#include "runtime/context.hpp"
#include "runtime/pipeline.hpp"
#include "runtime/watchdog.hpp"
#include "tests/pause_until.hpp"

namespace loom::test {

struct Hold {
  static constexpr char const* name = "hold";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  enum Role : std::uint32_t { kLong, kShort, kEmitted };
  // What the long task saw.
  enum Outcome : std::uint32_t { kNotRun = 0, kRanWhileHeld, kQueuedBehind, kShortsNeverEnded };
  struct Payload {
    std::uint32_t role;
    std::uint32_t shorts;        // short tasks in the launch
    std::uint32_t* shorts_done;  // counted by the short tasks
    std::uint32_t* emitted_ran;  // set by the emitted task
    std::uint32_t* outcome;      // written by the long task (Outcome)
    std::uint32_t settle_us, give_up_us;
  };

  static void host(Payload const& p, TaskContext& ctx) { run(p, ctx); }
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    if (threadIdx.x == 0) run(p, ctx);
  }
#endif

 private:
  LOOM_HD static void run(Payload const& p, TaskContext& ctx) {
    if (p.role == kShort) return (void)fetch_add_relaxed(*p.shorts_done, 1u);
    if (p.role == kEmitted) return store_relaxed(*p.emitted_ran, 1u);
    constexpr std::uint64_t us = 1000;
    std::uint64_t const t0 = now_ns();
    while (load_relaxed(*p.shorts_done) < p.shorts) {
      if (now_ns() > t0 + p.give_up_us * us) {
        store_relaxed(*p.outcome, std::uint32_t{kShortsNeverEnded});
        ctx.retire(1);
        return;
      }
      pause_until(now_ns() + 10 * us);
    }
    pause_until(now_ns() + p.settle_us * us);
    Payload emitted = p;
    emitted.role = kEmitted;
    if (!ctx.emit(Pipeline<Hold>::make_dynamic<Hold>(emitted))) return;
    std::uint64_t const t1 = now_ns();
    while (load_relaxed(*p.emitted_ran) == 0) {
      if (now_ns() > t1 + p.give_up_us * us)
        return store_relaxed(*p.outcome, std::uint32_t{kQueuedBehind});
      pause_until(now_ns() + 10 * us);
    }
    store_relaxed(*p.outcome, std::uint32_t{kRanWhileHeld});
  }
};

}  // namespace loom::test
