// Per-processor doorbell: the scheduler writes a task ref and rings; the processor waits for the
// ring count to move. Only the scheduler writes a doorbell and only when its processor is idle,
// so the ref is never overwritten before it is read. The ring count only grows.
#pragma once

#include "runtime/watchdog.hpp"

namespace loom {

struct alignas(64) Doorbell {
  std::uint64_t rings;
  TaskRef task;
  std::uint32_t pad_[13];
};
static_assert(sizeof(Doorbell) == 64);

// The scheduler alone.
LOOM_HD LOOM_INLINE void doorbell_ring(Doorbell& d, TaskRef task) {
  store_relaxed(d.task, task);
  store_release(d.rings, load_relaxed(d.rings) + 1);
}

// The processor's leader thread, polling. `seen` is the ring count it last consumed; true with the
// new ref in `task` when the scheduler has rung since.
LOOM_HD LOOM_INLINE bool doorbell_poll(Doorbell& d, std::uint64_t& seen, TaskRef& task) {
  std::uint64_t const r = load_acquire(d.rings);
  if (r == seen) return false;
  seen = r;
  task = load_relaxed(d.task);
  return true;
}

// Liveness of the launch as an idle actor sees it: the idle queue's tail moves whenever any
// processor finishes a task. An actor with nothing to do bounds its wait by how long this stays
// still, so a long but moving launch never trips it, and a dead one always does.
class Heartbeat {
 public:
  LOOM_HD explicit Heartbeat(std::uint64_t const* beat) : beat_(beat), last_(load_relaxed(*beat)) {}
  LOOM_HD LOOM_INLINE bool moved() {
    std::uint64_t const b = load_relaxed(*beat_);
    if (b == last_) return false;
    last_ = b;
    return true;
  }

 private:
  std::uint64_t const* beat_;
  std::uint64_t last_;
};

// Bounded wait for the next ring. False when the wait ended on an error.
LOOM_HD LOOM_INLINE bool doorbell_wait(Doorbell& d, std::uint64_t& seen, TaskRef& task,
                                       Heartbeat& beat, Watchdog& dog) {
  dog.reset();
  while (!doorbell_poll(d, seen, task)) {
    if (beat.moved()) dog.reset();
    if (!dog.keep_waiting(seen + 1, seen)) return false;
  }
  return true;
}

}  // namespace loom
