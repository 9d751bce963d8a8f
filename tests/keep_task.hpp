// A root that emits tasks with keep_first (TaskContext::emit_many), for the CPU executor's suite
// and the GPU's: the first task it emitted must run next on its own processor, ahead of the
// processors that wait for a task (the scheduler would have rung one of them), and only that one.
// Words (KeepWords): a ticket counter, the root's processor, then per marked task its processor,
// its ticket and how often it ran.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/atomic.hpp"
#include "runtime/context.hpp"
#include "runtime/pipeline.hpp"
#include "runtime/watchdog.hpp"
#include "tests/pause_until.hpp"

namespace loom::test {

struct KeepWords {
  std::uint32_t* words;  // [3 + 3 * tasks]
  std::uint32_t tasks;
  static std::size_t size(std::uint32_t tasks) { return 3 + 3 * std::size_t{tasks}; }
  LOOM_HD std::uint32_t& ticket() const { return words[0]; }
  LOOM_HD std::uint32_t& root_actor() const { return words[1]; }
  LOOM_HD std::uint32_t& actor(std::uint32_t i) const { return words[3 + i]; }
  LOOM_HD std::uint32_t& order(std::uint32_t i) const { return words[3 + tasks + i]; }
  LOOM_HD std::uint32_t& runs(std::uint32_t i) const { return words[3 + 2 * tasks + i]; }
};

// Records its processor and a ticket.
struct Marked {
  static constexpr char const* name = "marked";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    KeepWords log;
    std::uint32_t index;
  };
  LOOM_HD static void mark(Payload const& p, std::uint32_t actor) {
    store_relaxed(p.log.actor(p.index), actor);
    store_relaxed(p.log.order(p.index), fetch_add_relaxed(p.log.ticket(), 1u));
    fetch_add_relaxed(p.log.runs(p.index), 1u);
  }
  static void host(Payload const& p, TaskContext& ctx) { mark(p, ctx.actor_index()); }
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx) {
    if (threadIdx.x == 0) mark(p, ctx.actor_index());
  }
#endif
};

// Records its processor, waits until the other processors have long been waiting for a task,
// then emits `children` Marked tasks (indices 0 ..), keeping the first if `keep`, and one more
// (index children) the same way, which keeps nothing: a processor keeps one task.
struct KeepingRoot {
  static constexpr char const* name = "keeping_root";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    KeepWords log;
    std::uint32_t children, settle_us, keep;
  };
  static void host(Payload const& p, TaskContext& ctx);
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx);
#endif
};

using KeepPipeline = Pipeline<Marked, KeepingRoot>;

inline Task marked(KeepWords log, std::uint32_t index) {
  return KeepPipeline::make<Marked>(Marked::Payload{log, index});
}

inline void KeepingRoot::host(Payload const& p, TaskContext& ctx) {
  store_relaxed(p.log.root_actor(), ctx.actor_index());
  pause_until(now_ns() + p.settle_us * 1000);
  auto const make = [&](std::uint32_t i) {
    return KeepPipeline::make_dynamic<Marked>(Marked::Payload{p.log, i});
  };
  ctx.emit_many(p.children, make, p.keep != 0);
  ctx.emit_many(
      1, [&](std::uint32_t) { return make(p.children); }, p.keep != 0);
}

#if defined(__CUDACC__)
__device__ inline void KeepingRoot::device(Payload const& p, TaskContext& ctx) {
  if (threadIdx.x == 0) {
    store_relaxed(p.log.root_actor(), ctx.actor_index());
    pause_until(now_ns() + p.settle_us * 1000);
  }
  __syncthreads();
  auto const make = [&](std::uint32_t i) {
    return KeepPipeline::make_dynamic<Marked>(Marked::Payload{p.log, i});
  };
  ctx.emit_many_by_block(p.children, make, p.keep != 0);
  ctx.emit_many_by_block(
      1, [&](std::uint32_t) { return make(p.children); }, p.keep != 0);
}
#endif

// The root (completing an event) and its static successor (index children + 1), for `children`.
inline Graph keeping_graph(KeepWords log, std::uint32_t children, std::uint32_t settle_us,
                           bool keep) {
  GraphBuilder b;
  EventId const root_done = b.add_event(1);
  b.add_task(KeepPipeline::make<KeepingRoot>(
      KeepingRoot::Payload{log, children, settle_us, keep ? 1u : 0u}, root_done));
  b.add_task(marked(log, children + 1), {root_done});
  b.set_dynamic_bound(children + 1);
  return b.build();
}

// What the launch recorded: every task ran once; kept, the first emitted ran on the root's
// processor before any other task there; queued, on another processor. "" when it holds.
inline std::string keeping_outcome(KeepWords const& log, bool keep) {
  for (std::uint32_t i = 0; i < log.tasks; ++i)
    if (log.runs(i) != 1)
      return "task " + std::to_string(i) + " ran " + std::to_string(log.runs(i)) + " times";
  if (keep != (log.actor(0) == log.root_actor()))
    return "the first emitted task ran on processor " + std::to_string(log.actor(0)) +
           ", the root on " + std::to_string(log.root_actor());
  for (std::uint32_t i = 1; keep && i < log.tasks; ++i)
    if (log.actor(i) == log.root_actor() && log.order(i) < log.order(0))
      return "task " + std::to_string(i) + " ran on the root's processor before the kept one";
  return "";
}

}  // namespace loom::test
