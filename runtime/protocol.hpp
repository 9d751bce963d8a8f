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

// A static task's gate event fired: the task runs once all its gate events have fired.
LOOM_HD LOOM_INLINE bool release_task(RuntimeState const& s, TaskId t, std::uint64_t epoch,
                                      Watchdog& dog) {
  std::uint32_t const gates = s.graph.gate_counts[t];
  if (gates > 1) {
    std::uint64_t const arrived = fetch_add_acq_rel(s.gate_arrivals[t], std::uint64_t{1}) + 1;
    if (arrived != epoch * gates) return true;
  }
  return make_ready(s, t, s.graph.tasks[t].header.priority, dog);
}

// One arrival on event `e` in launch `epoch`. The arrival that brings the count to
// epoch * expected releases the successors; arrivals beyond it are an error (they would corrupt
// the next launch's epoch), reported, not ignored.
LOOM_HD LOOM_INLINE bool arrive(RuntimeState const& s, EventId e, std::uint64_t epoch,
                                WaiterId who, Watchdog& dog) {
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
  for (std::uint32_t i = ev.succ_begin; i < ev.succ_end; ++i) {
    if (!release_task(s, s.graph.successors[i], epoch, dog)) return false;
  }
  return true;
}

// Emits one dynamic task (any thread of any actor). It is counted against the graph's declared
// bound; emitting past the bound is an error.
LOOM_HD LOOM_INLINE bool emit_task(RuntimeState const& s, Task const& task, WaiterId who,
                                   Watchdog& dog) {
  std::uint64_t const n =
      fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{1});
  if (n >= s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0,
                0, s.graph.dynamic_bound, n + 1);
    return false;
  }
  chaos_point();
  s.dynamic_tasks[n] = task;
  // The release in queue_push publishes the descriptor written above.
  return make_ready(s, s.graph.task_count + static_cast<TaskRef>(n), task.header.priority, dog);
}

// Gives back `n` tasks of the dynamic bound that will never be emitted in this launch (the real
// count became known). Termination waits for completed + retired == static + bound, so every
// emitter must either emit or retire each task of the bound it was given.
LOOM_HD LOOM_INLINE void retire_slack(RuntimeState const& s, std::uint32_t n) {
  if (n != 0) fetch_add_acq_rel(s.counters->retired.value, std::uint64_t{n});
}

}  // namespace loom
