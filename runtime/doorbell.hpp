// Per-processor doorbell: a one-word mailbox. The scheduler writes (release) the processor's n-th
// task ref of the launch with n beside it; the processor takes the ring it expects (acquire) and
// leaves the word alone, so the scheduler only ever writes and the processor only ever reads,
// until the processor takes the stop and clears the word for the next launch.
#pragma once

#include "runtime/watchdog.hpp"

namespace loom {

struct alignas(64) Doorbell {
  std::uint64_t word;  // 0: not rung in this launch; ring << 32 | ref: ring n brings ref
  std::uint64_t pad_[7];
};
static_assert(sizeof(Doorbell) == 64);

LOOM_HD LOOM_INLINE std::uint64_t doorbell_word(std::uint32_t ring, TaskRef task) {
  return (std::uint64_t{ring} << 32) | task;
}

// The scheduler alone, answering the processor's credit number `ring` (from 1).
LOOM_HD LOOM_INLINE void doorbell_ring(Doorbell& d, std::uint32_t ring, TaskRef task) {
  store_release(d.word, doorbell_word(ring, task));
}

// The scheduler alone, ending the launch: a stop is taken whatever ring the processor expects.
LOOM_HD LOOM_INLINE void doorbell_stop(Doorbell& d) {
  store_release(d.word, doorbell_word(0, kStopRef));
}

// The processor's leader thread, polling for ring `ring`: true with the ref in `task` when it (or
// a stop) was there.
LOOM_HD LOOM_INLINE bool doorbell_poll(Doorbell const& d, std::uint32_t ring, TaskRef& task) {
  std::uint64_t const w = load_acquire(d.word);
  TaskRef const ref = static_cast<TaskRef>(w);
  if (w != doorbell_word(ring, ref) && ref != kStopRef) return false;
  task = ref;
  return true;
}

// The processor's leader thread, once it has taken the stop: the next launch counts rings from 1.
LOOM_HD LOOM_INLINE void doorbell_clear(Doorbell& d) {
  store_relaxed(d.word, std::uint64_t{0});
}

// Liveness of the launch as an idle actor sees it: the beat counter moves whenever any processor
// finishes a task. An actor with nothing to do bounds its wait by how long this stays
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

// Bounded wait for ring `ring` (or a stop). False when the wait ended on an error.
LOOM_HD LOOM_INLINE bool doorbell_wait(Doorbell const& d, std::uint32_t ring, TaskRef& task,
                                       Heartbeat& beat, Watchdog& dog) {
  dog.reset();
  while (!doorbell_poll(d, ring, task)) {
    if (beat.moved()) dog.reset();
    if (!dog.keep_waiting(1, 0)) return false;
  }
  return true;
}

}  // namespace loom
