// A root that emits tasks with keep_first (TaskContext::emit_many), for the CPU executor's suite
// and the GPU's: the first task it emitted must run next on its own processor, ahead of the
// processors that wait for a task (the scheduler would have rung one of them), and only that one.
// Words (KeepWords): a ticket counter, the root's processor, then per marked task its processor,
// its ticket and how often it ran. And roots that share out one emission (TaskContext::
// reserve_emission, emit_reserved): each keeps one task and queues its share of the rest.
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

// Root `index` of `roots` that run at once (a processor each): records its processor, arrives on
// sync[0]; the last to arrive reserves one shared emission of `children` Marked tasks, `roots` of
// them kept, and releases the others (sync[1]). Root i then writes task i (kept: its next task)
// and its share of the queued ones, from the last index of the share down, so that the queue's
// later slots fill first. The last to leave (sync[2]) lowers the words for the next launch. With
// `keep_twice`, root 0 also writes task 1 as its own (keep_unavailable); root 1 then skips it.
struct SharingRoot {
  static constexpr char const* name = "sharing_root";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    KeepWords log;
    std::uint32_t* root_actors;  // [roots]
    std::uint32_t* sync;         // [3]
    SharedEmission* shared;
    std::uint16_t index, roots, children, keep_twice;
  };
  // Task k's writer: root k for k < roots, else the root whose share of [roots, children) holds k.
  LOOM_HD static std::uint32_t writer(Payload const& p, std::uint32_t k) {
    if (k < p.roots) return k;
    std::uint32_t const each = (p.children - p.roots + p.roots - 1) / p.roots;
    return (k - p.roots) / each;
  }
  // The reservation, once every root has arrived; false when the wait failed.
  LOOM_HD static bool share(Payload const& p, TaskContext& ctx, SharedEmission& e) {
    store_relaxed(p.root_actors[p.index], ctx.actor_index());
    if (fetch_add_acq_rel(p.sync[0], 1u) + 1 == p.roots) {
      if (!ctx.reserve_emission(p.children, p.roots, *p.shared)) return false;
      store_release(p.sync[1], 1u);
    } else {
      Watchdog dog = ctx.watchdog(WaitSite::sibling_tasks, p.index);
      for (std::uint32_t seen; (seen = load_acquire(p.sync[1])) != 1u;)
        if (!dog.keep_waiting(1, seen)) return false;
    }
    e = *p.shared;
    return true;
  }
  LOOM_HD static void leave(Payload const& p) {
    if (fetch_add_acq_rel(p.sync[2], 1u) + 1 != p.roots) return;
    for (std::uint32_t i = 0; i < 3; ++i) store_relaxed(p.sync[i], 0u);
  }
  LOOM_HD static Task child(Payload const& p, std::uint32_t k);
  static void host(Payload const& p, TaskContext& ctx);
#if defined(__CUDACC__)
  __device__ static void device(Payload const& p, TaskContext& ctx);
#endif
};

using KeepPipeline = Pipeline<Marked, KeepingRoot, SharingRoot>;

LOOM_HD inline Task SharingRoot::child(Payload const& p, std::uint32_t k) {
  return KeepPipeline::make_dynamic<Marked>(Marked::Payload{p.log, k});
}

inline void SharingRoot::host(Payload const& p, TaskContext& ctx) {
  SharedEmission e;
  if (!share(p, ctx, e)) return;
  leave(p);
  if (p.index == 0 && p.keep_twice) ctx.emit_reserved(e, 1, child(p, 1));
  if (p.index == 1 && p.keep_twice) return;
  for (std::uint32_t k = p.children; k-- > 0;)
    if (writer(p, k) == p.index && !ctx.emit_reserved(e, k, child(p, k))) return;
}

#if defined(__CUDACC__)
// Thread 0 arrives and waits; each thread writes one task of the share at a time.
__device__ inline void SharingRoot::device(Payload const& p, TaskContext& ctx) {
  __shared__ SharedEmission e;
  __shared__ bool go;
  if (threadIdx.x == 0) {
    go = share(p, ctx, e);
    if (go) leave(p);
  }
  __syncthreads();
  if (!go) return;
  if (threadIdx.x == 0 && p.index == 0 && p.keep_twice) ctx.emit_reserved(e, 1, child(p, 1));
  if (p.index == 1 && p.keep_twice) return;
  for (std::uint32_t k = threadIdx.x; k < p.children; k += blockDim.x)
    if (writer(p, k) == p.index && !ctx.emit_reserved(e, k, child(p, k))) return;
}
#endif

// `roots` sharing roots that share out `children` tasks.
inline Graph sharing_graph(KeepWords log, std::uint32_t* root_actors, std::uint32_t* sync,
                           SharedEmission* shared, std::uint32_t roots, bool keep_twice = false) {
  GraphBuilder b;
  for (std::uint32_t i = 0; i < roots; ++i)
    b.add_task(KeepPipeline::make<SharingRoot>(SharingRoot::Payload{
        log, root_actors, sync, shared, static_cast<std::uint16_t>(i),
        static_cast<std::uint16_t>(roots), static_cast<std::uint16_t>(log.tasks),
        static_cast<std::uint16_t>(keep_twice ? 1 : 0)}));
  b.set_dynamic_bound(log.tasks);
  return b.build();
}

// What a sharing launch recorded: every task ran once, and task i < roots on root i's processor
// before any other task there. "" when it holds.
inline std::string sharing_outcome(KeepWords const& log, std::uint32_t const* root_actors,
                                   std::uint32_t roots) {
  for (std::uint32_t k = 0; k < log.tasks; ++k)
    if (log.runs(k) != 1)
      return "task " + std::to_string(k) + " ran " + std::to_string(log.runs(k)) + " times";
  for (std::uint32_t i = 0; i < roots; ++i) {
    if (log.actor(i) != root_actors[i])
      return "kept task " + std::to_string(i) + " ran on processor " +
             std::to_string(log.actor(i)) + ", its writer on " + std::to_string(root_actors[i]);
    for (std::uint32_t k = 0; k < log.tasks; ++k)
      if (k != i && log.actor(k) == root_actors[i] && log.order(k) < log.order(i))
        return "task " + std::to_string(k) + " ran on root " + std::to_string(i) +
               "'s processor before the task it kept";
  }
  return "";
}

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
