// Per-processor doorbell: a one-word mailbox. The scheduler writes (release) a task ref tagged
// as full; the processor takes it (acquire) and clears the word before it reports idle, so the
// scheduler only ever writes an empty doorbell and never reads one.
#pragma once

#include "runtime/watchdog.hpp"

namespace loom {

struct alignas(64) Doorbell {
  std::uint64_t word;  // 0: empty; kDoorbellFull | ref: a task (or kStopRef) to take
  std::uint64_t pad_[7];
};
static_assert(sizeof(Doorbell) == 64);
inline constexpr std::uint64_t kDoorbellFull = std::uint64_t{1} << 32;

// The scheduler alone, on an empty doorbell.
LOOM_HD LOOM_INLINE void doorbell_ring(Doorbell& d, TaskRef task) {
  store_release(d.word, kDoorbellFull | task);
}

// The processor's leader thread, polling: true with the ref in `task` when one was there.
LOOM_HD LOOM_INLINE bool doorbell_poll(Doorbell& d, TaskRef& task) {
  std::uint64_t const w = load_acquire(d.word);
  if (w == 0) return false;
  store_relaxed(d.word, std::uint64_t{0});
  task = static_cast<TaskRef>(w);
  return true;
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

// Bounded wait for the next ring. False when the wait ended on an error.
LOOM_HD LOOM_INLINE bool doorbell_wait(Doorbell& d, TaskRef& task, Heartbeat& beat, Watchdog& dog) {
  dog.reset();
  while (!doorbell_poll(d, task)) {
    if (beat.moved()) dog.reset();
    if (!dog.keep_waiting(1, 0)) return false;
  }
  return true;
}

}  // namespace loom
