// Route tasks that gather (MoEView::route_gathers). When every route task has a processor of its
// own from the launch's start (a root per processor: scheduler/ready_list.hpp, start_root), the
// route tasks can wait for one another, so the call needs neither a plan task nor gather tasks,
// nor the trips through the scheduler between them: each route task counts its tokens' pairs
// (keeping each pair's ticket among its expert's pairs), arrives on route_sync[0] and waits; the
// last to arrive writes the plan (PlanExperts::write_plan), gives back the unused bound and
// releases the others; then each gathers its share of the call blocks (GatherTokens, a pair's
// pool row its expert's offset plus its ticket). The last to count also reserves the call's up
// tasks as one shared emission (TaskContext::reserve_emission); once all have gathered
// (route_sync[2]), each keeps one of them to run next and queues its share of the rest, in the
// order the M-tile groups' emissions would list them. (Emitted by the gathers that complete each
// group, the last few gathers emitted nearly all of them, alone, and most processors then waited
// for the scheduler to hand them out: 23 us at T = 4096.)
#pragma once

#include "moe/expert_tile.hpp"
#include "moe/plan_task.hpp"

namespace loom::moe {

// route_sync[0] once the plan is written: every route task may read it.
LOOM_HD inline std::uint32_t plan_written(MoEView const& v) {
  return v.route_gathers + 1;
}

// After route task `task` has seen the plan: counts it on route_sync[1]; the last lowers both
// words for the next call (every route task has then read route_sync[0] for the last time). Part 0
// of a spread group lowers the group's route_arrived: every part arrived on route_sync[0] after
// its wait for the others (RouteTokens::route_part_host), so none reads the word again.
LOOM_HD inline void leave_route_sync(MoEView const& v, std::uint32_t task) {
  if (v.route_parts > 1 && task % v.route_parts == 0)
    store_relaxed(v.route_arrived[task / v.route_parts], 0u);
  if (fetch_add_acq_rel(v.route_sync[1], 1u) + 1 != v.route_gathers) return;
  store_relaxed(v.route_sync[0], 0u);
  store_relaxed(v.route_sync[1], 0u);
}

// Route task `task` waits (bounded) until `word`, which the route tasks raise, reads `value`.
// False when the wait ended on an error (this task's or another actor's).
LOOM_HD inline bool wait_for_siblings(std::uint32_t const& word, std::uint32_t value,
                                      std::uint32_t task, TaskContext& ctx) {
  Watchdog dog = ctx.watchdog(WaitSite::sibling_tasks, task);
  for (std::uint32_t seen; (seen = load_acquire(word)) != value;)
    if (!dog.keep_waiting(value, seen)) return false;
  return true;
}

// The last route task to count, once it has written the plan of `tiles` M-tiles on tiles view v:
// reserves the call's up tasks (every M-tile's up_tasks) as one shared emission, route_gathers of
// them kept, into up_emission, before it releases the others with the plan. The queue positions
// wait, unfilled, until the route tasks have gathered: nothing else is emitted meanwhile.
LOOM_HD inline bool reserve_up_tasks(MoEView const& main, MoEView const& v, std::uint32_t tiles,
                                     TaskContext& ctx) {
  return ctx.reserve_emission(tiles * v.up_tasks, main.route_gathers, *main.up_emission);
}

// The reservation, read after the plan's release (another route task wrote it: through L2 on the
// device).
LOOM_HD inline SharedEmission up_reservation(MoEView const& main) {
  SharedEmission const& r = *main.up_emission;
  return {load_relaxed(r.first), load_relaxed(r.pos), load_relaxed(r.n), load_relaxed(r.kept)};
}

// Route task `task`, its gathers done (one thread; on the device after a fence that covers the
// block's pool rows): arrives on route_sync[2] and waits until every route task has. False when
// the wait failed.
LOOM_HD inline bool wait_for_gathers(MoEView const& main, std::uint32_t task, TaskContext& ctx) {
  std::uint32_t const tasks = main.route_gathers;
  return fetch_add_acq_rel(main.route_sync[2], 1u) + 1 == tasks ||
         wait_for_siblings(main.route_sync[2], tasks, task, ctx);
}
// After a task has seen every gather done: counts it on route_sync[3]; the last lowers [2] and [3]
// (every route task has then read [2] for the last time).
LOOM_HD inline void leave_gathers(MoEView const& main) {
  if (fetch_add_acq_rel(main.route_sync[3], 1u) + 1 != main.route_gathers) return;
  store_relaxed(main.route_sync[2], 0u);
  store_relaxed(main.route_sync[3], 0u);
}

// f(b) for the call blocks route task `task` gathers, while f returns true: blocks task,
// task + route_gathers, ..., so that every route task gathers a share, also of a small call whose
// tokens few of them routed (a layer sized for many tokens).
template <class F>
LOOM_HD void for_each_gathered_block(MoEView const& v, std::uint32_t task, F const& f) {
  std::uint32_t const blocks = call_blocks(v), step = v.route_gathers;
  for (std::uint32_t b = task; b < blocks; b += step)
    if (!f(b)) return;
}

// f(k) for the up tasks route task `task` writes of reservation e, thread `thread` of `threads`
// each taking every threads-th, while f returns true: task `task` (kept) if it is below e.kept,
// then the task's share of the queued ones (share_of over route_gathers).
template <class F>
LOOM_HD void for_each_up_task(MoEView const& main, SharedEmission const& e, std::uint32_t task,
                              std::uint32_t thread, std::uint32_t threads, F const& f) {
  Share const s = share_of(e.n - e.kept, main.route_gathers, task);
  std::uint32_t const own = task < e.kept ? 1 : 0;
  for (std::uint32_t i = thread; i < own + s.count; i += threads)
    if (!f(i < own ? task : e.kept + s.first + i - own)) return;
}

// Route task `task`, after routing its groups (host).
inline void gather_after_routes_host(MoEView const& main, std::uint32_t task, TaskContext& ctx) {
  if (ctx.failed()) return;  // its check failed: the launch ends, and the waits with it
  MoEView const& v = PlanExperts::tiles_view(main);
  if (fetch_add_acq_rel(main.route_sync[0], 1u) + 1 == main.route_gathers) {
    std::uint32_t const tiles = PlanExperts::write_plan(v);
    PlanExperts::retire_unused(v, tiles, ctx);
    reserve_up_tasks(main, v, tiles, ctx);
    store_release(main.route_sync[0], plan_written(main));
  } else if (!wait_for_siblings(main.route_sync[0], plan_written(main), task, ctx)) {
    return;
  }
  leave_route_sync(main, task);
  if (ctx.failed()) return;  // the reservation failed
  SharedEmission const e = up_reservation(main);
  for_each_gathered_block(main, task, [&](std::uint32_t b) {
    GatherTokens::gather_block_host(v, b, ctx, false);
    return !ctx.failed();
  });
  if (ctx.failed() || !wait_for_gathers(main, task, ctx)) return;
  leave_gathers(main);
  TileOps const ops = up_tile_ops(v);
  for_each_up_task(main, e, task, 0, 1, [&](std::uint32_t k) {
    return ctx.emit_reserved(e, k, up_task_at(v, ops, v.offsets, v.tile_base, k));
  });
}

#if defined(__CUDACC__)
// Device, one thread: the token rows of the first call block route task `task` gathers, into L2
// (one bulk prefetch; x is 16-byte aligned, enqueue_call checks), so that the gather's reads
// find them there after the wait for the plan.
__device__ inline void prefetch_first_block(MoEView const& v, std::uint32_t task) {
  if (task >= call_blocks(v)) return;
  std::uint32_t const cb = call_block(v), t0 = task * cb;
  std::uint32_t const rows = v.call[0] - t0 < cb ? v.call[0] - t0 : cb;
  bf16 const* const first = v.x + std::size_t{t0} * v.hidden;
  std::uint32_t const bytes = rows * v.hidden * static_cast<std::uint32_t>(sizeof(bf16));
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"(bytes) : "memory");
}

// The same on the device, by the whole block: thread 0 arrives (after the block's counts and
// tickets, fenced) and waits, or, arriving last, the block writes the plan and thread 0 reserves
// the up tasks. Before its gathers the block copies the reservation and the plan's offsets and
// tile_base into shared memory, for the up tasks it writes after them, one per thread.
__device__ inline void gather_after_routes_device(MoEView const& main, std::uint32_t task,
                                                  TaskContext& ctx) {
  __shared__ bool last, go;
  __shared__ SharedEmission e;
  if (__syncthreads_or(ctx.failed())) return;
  MoEView const& v = PlanExperts::tiles_view(main);
  if (threadIdx.x == 0) {
    prefetch_first_block(v, task);
    __threadfence();
    last = fetch_add_acq_rel(main.route_sync[0], 1u) + 1 == main.route_gathers;
  }
  __syncthreads();
  if (last) {
    std::uint32_t const tiles = PlanExperts::write_plan_device(v, ctx.shared_memory());
    // The retirement (a thread of another warp) goes out beside the reservation.
    if (threadIdx.x == 32 % blockDim.x) PlanExperts::retire_unused(v, tiles, ctx);
    if (threadIdx.x == 0) {
      go = reserve_up_tasks(main, v, tiles, ctx);
      store_release(main.route_sync[0], plan_written(main));
    }
  } else if (threadIdx.x == 0) {
    go = wait_for_siblings(main.route_sync[0], plan_written(main), task, ctx) && !ctx.failed();
  }
  __syncthreads();
  if (!go) return;
  // Threads of other warps than those that copy the plan below, so that the atomic, the
  // reservation's loads and the plan's go out together (one after another, thread 0 took three
  // round trips).
  std::uint32_t const leaver = blockDim.x - 1, reader = blockDim.x > 32 ? blockDim.x - 33 : leaver;
  if (threadIdx.x == leaver) leave_route_sync(main, task);
  if (threadIdx.x == reader) e = up_reservation(main);
  auto* const offsets = static_cast<std::uint32_t*>(ctx.shared_memory());  // [experts + 1]
  std::uint32_t* const tile_base = offsets + v.experts + 1;                // [experts + 1]
  for (std::uint32_t i = threadIdx.x; i <= v.experts; i += blockDim.x) {
    offsets[i] = written_elsewhere(v.offsets[i]);
    tile_base[i] = written_elsewhere(v.tile_base[i]);
  }
  for_each_gathered_block(main, task, [&](std::uint32_t b) {
    if (__syncthreads_or(ctx.failed())) return false;
    GatherTokens::gather_block_device(v, b, ctx, false);
    return true;
  });
  if (__syncthreads_or(ctx.failed())) return;
  if (threadIdx.x == 0) {
    __threadfence();
    go = wait_for_gathers(main, task, ctx);
  }
  __syncthreads();
  if (!go) return;
  if (threadIdx.x == 32 % blockDim.x) leave_gathers(main);  // beside warp 0's kept task
  TileOps const ops = up_tile_ops(v);
  for_each_up_task(main, e, task, threadIdx.x, blockDim.x, [&](std::uint32_t k) {
    return ctx.emit_reserved(e, k, up_task_at(v, ops, offsets, tile_base, k));
  });
}
#endif

}  // namespace loom::moe
