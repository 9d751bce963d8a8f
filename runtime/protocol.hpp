// The dependency protocol: event arrivals with monotonic epochs, release of successors by the
// last arriver, dynamic emission within the declared bound, and slack retirement. Every function
// here is called by one thread (a processor's leader, a subscriber, a host thread) and is the same
// code on the CPU executor and on the GPU.
#pragma once

#include "runtime/state.hpp"

namespace loom {

// Pushes a ready task into the scheduler's queue.
LOOM_HD LOOM_INLINE bool make_ready(RuntimeState const& s, TaskRef ref, std::uint8_t priority,
                                    Watchdog& dog) {
  return queue_push(s.ready, ready_entry(ref, priority), dog);
}

// A static task's gate event fired: true when that was its last gate (it is ready now).
LOOM_HD LOOM_INLINE bool gate_opened(RuntimeState const& s, TaskId t, std::uint64_t epoch) {
  std::uint32_t const gates = s.graph.gate_counts[t];
  if (gates <= 1) return true;
  std::uint64_t const arrived = fetch_add_acq_rel(s.gate_arrivals[t], std::uint64_t{1}) + 1;
  return arrived == epoch * gates;
}

// One arrival on event `e` in launch `epoch`. The arrival that brings the count to
// epoch * expected releases the successors; arrivals beyond it are an error (they would corrupt
// the next launch's epoch), reported, not ignored.
//
// Released successors go to the ready queue in chunks under one ticket each. If `keep` is not
// null, the first released successor is handed back in *keep instead (it was kStopRef on entry):
// the caller runs it next itself (local dispatch) and it never passes through the scheduler.
LOOM_HD LOOM_INLINE bool arrive(RuntimeState const& s, EventId e, std::uint64_t epoch, WaiterId who,
                                Watchdog& dog, TaskRef* keep = nullptr) {
  chaos_point();
  EventDesc const ev = s.graph.events[e];
  std::uint64_t const target = epoch * ev.expected;
  std::uint64_t const count = fetch_add_acq_rel(s.event_arrivals[e], std::uint64_t{1}) + 1;
  if (count < target) return true;
  if (count > target) {
    raise_error(*s.error, ErrorCode::event_overshoot, who.actor, who.block, who.rank, 0, e,
                ev.expected, count - (epoch - 1) * ev.expected);
    return false;
  }
  std::uint32_t chunk[kPushChunk];
  std::uint32_t n = 0;
  for (std::uint32_t i = ev.succ_begin; i < ev.succ_end; ++i) {
    TaskId const t = s.graph.successors[i];
    if (!gate_opened(s, t, epoch)) continue;
    if (keep && *keep == kStopRef) {
      *keep = t;
      continue;
    }
    chunk[n++] = ready_entry(t, s.graph.tasks[t].header.priority);
    if (n == kPushChunk) {
      if (!queue_push_chunk(
              s.ready, n, [&](std::uint32_t k) { return chunk[k]; }, dog))
        return false;
      n = 0;
    }
  }
  if (n != 0 && !queue_push_chunk(
                    s.ready, n, [&](std::uint32_t k) { return chunk[k]; }, dog))
    return false;
  return true;
}

// Appends one task's trace record (when tracing is on; records past the capacity are dropped).
LOOM_HD LOOM_INLINE void record_trace(RuntimeState const& s, Task const& task,
                                      std::uint32_t processor, std::uint64_t start_ns) {
  if (!s.trace) return;
  std::uint64_t const i = fetch_add_relaxed(*s.trace_count, std::uint64_t{1});
  if (i < s.trace_capacity)
    s.trace[i] = TraceRecord{start_ns,       now_ns(), processor, task.header.type,
                             static_cast<std::uint16_t>(s.rank), task.header.id, 0};
}

// After a task: one beat of the heartbeat (fire-and-forget), then the arrival on its event. Local
// dispatch (keep the first released successor and run it next) is offered only when the policy
// allows it and the scheduler has handed out every task ever pushed to the ready queue, so a kept
// successor overtakes no task that was already ready.
LOOM_HD LOOM_INLINE bool complete_task(RuntimeState const& s, Task const& task, std::uint64_t epoch,
                                       WaiterId who, Watchdog& dog, bool may_keep, TaskRef& keep) {
  keep = kStopRef;
  fetch_add_relaxed(s.counters->beat.value, std::uint64_t{1});
  if (task.header.event == kNoEvent) return true;
  bool const local =
      may_keep && load_relaxed(*s.ready.tail) == load_relaxed(s.counters->drained_at.value);
  return arrive(s, task.header.event, epoch, who, dog, local ? &keep : nullptr);
}

// Emits one dynamic task (any thread of any actor). It is counted against the graph's declared
// bound; emitting past the bound is an error.
LOOM_HD LOOM_INLINE bool emit_task(RuntimeState const& s, Task const& task, WaiterId who,
                                   Watchdog& dog) {
  std::uint64_t const n = fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{1});
  if (n >= s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                s.graph.dynamic_bound, n + 1);
    return false;
  }
  chaos_point();
  s.dynamic_tasks[n] = task;
  // The release in queue_push publishes the descriptor written above.
  return make_ready(s, s.graph.task_count + static_cast<TaskRef>(n), task.header.priority, dog);
}

// Emits `n` dynamic tasks, make(i) for i < n, with one bound check and one queue ticket per chunk:
// the way a last arriver releases a whole row of tiles.
template <class MakeFn>
LOOM_HD bool emit_tasks(RuntimeState const& s, std::uint32_t n, MakeFn make, WaiterId who,
                        Watchdog& dog) {
  if (n == 0) return true;
  std::uint64_t const first =
      fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{n});
  if (first + n > s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                s.graph.dynamic_bound, first + n);
    return false;
  }
  for (std::uint32_t i = 0; i < n; ++i) s.dynamic_tasks[first + i] = make(i);
  TaskRef const base = s.graph.task_count + static_cast<TaskRef>(first);
  for (std::uint32_t done = 0; done < n; done += kPushChunk) {
    std::uint32_t const m = n - done < kPushChunk ? n - done : kPushChunk;
    auto entry = [&](std::uint32_t k) {
      return ready_entry(base + done + k, s.dynamic_tasks[first + done + k].header.priority);
    };
    if (!queue_push_chunk(s.ready, m, entry, dog)) return false;
  }
  return true;
}

// Gives back `n` tasks of the dynamic bound that will never be emitted in this launch (the real
// count became known). Termination waits for completed + retired == static + bound, so every
// emitter must either emit or retire each task of the bound it was given.
LOOM_HD LOOM_INLINE void retire_slack(RuntimeState const& s, std::uint32_t n) {
  if (n != 0) fetch_add_acq_rel(s.counters->retired.value, std::uint64_t{n});
}

}  // namespace loom
