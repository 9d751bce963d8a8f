// Route tasks that gather (MoEView::route_gathers). When every route task has a processor of its
// own from the launch's start (a root per processor: scheduler/ready_list.hpp, start_root), the
// route tasks can wait for one another, so the call needs neither a plan task nor gather tasks,
// nor the two trips through the scheduler between them: each route task counts its tokens' pairs
// (keeping each pair's ticket among its expert's pairs), arrives on route_sync[0] and waits; the
// last to arrive writes the plan (PlanExperts::write_plan), gives back the unused bound and
// releases the others; then each gathers its share of the call blocks (GatherTokens, a pair's
// pool row its expert's offset plus its ticket), whose arrivals emit the up tiles of the M-tile
// groups they complete, as the gather tasks' do.
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
// its wait for the others (RouteTokens::wait_for_parts), so none reads the word again.
LOOM_HD inline void leave_route_sync(MoEView const& v, std::uint32_t task) {
  if (v.route_parts > 1 && task % v.route_parts == 0)
    store_relaxed(v.route_arrived[task / v.route_parts], 0u);
  if (fetch_add_acq_rel(v.route_sync[1], 1u) + 1 != v.route_gathers) return;
  store_relaxed(v.route_sync[0], 0u);
  store_relaxed(v.route_sync[1], 0u);
}

// Waits (bounded) until the last route task has written the plan. False when the wait ended on an
// error (this task's or another actor's).
LOOM_HD inline bool wait_for_plan(MoEView const& v, std::uint32_t task, TaskContext& ctx) {
  Watchdog dog = ctx.watchdog(WaitSite::sibling_tasks, task);
  for (std::uint32_t seen; (seen = load_acquire(v.route_sync[0])) != plan_written(v);)
    if (!dog.keep_waiting(plan_written(v), seen)) return false;
  return true;
}

// f(b, last) for the call blocks route task `task` gathers, while f returns true: blocks task,
// task + route_gathers, ..., so that every route task gathers a share, also of a small call whose
// tokens few of them routed (a layer sized for many tokens). `last`: b is the task's last. A
// block's gather may keep the first up task it emits (GatherTokens::keeps_up_task) only when it is
// the last: kept earlier, the task would wait for its other blocks while processors wait for
// tasks.
template <class F>
LOOM_HD void for_each_gathered_block(MoEView const& v, std::uint32_t task, F const& f) {
  std::uint32_t const blocks = call_blocks(v), step = v.route_gathers;
  for (std::uint32_t b = task; b < blocks; b += step)
    if (!f(b, b + step >= blocks)) return;
}

// Route task `task`, after routing its groups (host).
inline void gather_after_routes_host(MoEView const& main, std::uint32_t task, TaskContext& ctx) {
  if (ctx.failed()) return;  // its check failed: the launch ends, and the waits with it
  MoEView const& v = PlanExperts::tiles_view(main);
  if (fetch_add_acq_rel(main.route_sync[0], 1u) + 1 == main.route_gathers) {
    PlanExperts::retire_unused(v, PlanExperts::write_plan(v), ctx);
    store_release(main.route_sync[0], plan_written(main));
  } else if (!wait_for_plan(main, task, ctx)) {
    return;
  }
  leave_route_sync(main, task);
  for_each_gathered_block(main, task, [&](std::uint32_t b, bool last) {
    GatherTokens::gather_block_host(v, b, ctx, last);
    return !ctx.failed();
  });
}

#if defined(__CUDACC__)
// The same on the device, by the whole block: thread 0 arrives (after the block's counts and
// tickets, fenced) and waits, or, arriving last, the block writes the plan.
__device__ inline void gather_after_routes_device(MoEView const& main, std::uint32_t task,
                                                  TaskContext& ctx) {
  __shared__ bool last, go;
  if (__syncthreads_or(ctx.failed())) return;
  MoEView const& v = PlanExperts::tiles_view(main);
  if (threadIdx.x == 0) {
    __threadfence();
    last = fetch_add_acq_rel(main.route_sync[0], 1u) + 1 == main.route_gathers;
  }
  __syncthreads();
  if (last) {
    std::uint32_t const tiles = PlanExperts::write_plan_device(v, ctx.shared_memory());
    if (threadIdx.x == 0) {
      PlanExperts::retire_unused(v, tiles, ctx);
      store_release(main.route_sync[0], plan_written(main));
      go = true;
    }
  } else if (threadIdx.x == 0) {
    go = wait_for_plan(main, task, ctx);
  }
  __syncthreads();
  if (!go) return;
  if (threadIdx.x == 0) leave_route_sync(main, task);
  for_each_gathered_block(main, task, [&](std::uint32_t b, bool last) {
    if (__syncthreads_or(ctx.failed())) return false;
    GatherTokens::gather_block_device(v, b, ctx, last);
    return true;
  });
}
#endif

}  // namespace loom::moe
