// Bounded spin-waits. Every wait in the protocol goes through a Watchdog: it backs off, checks
// the launch's error record (so a failure elsewhere ends the wait), and after `limit_ns` of no
// progress records a watchdog error naming the waiter and what it waited on.
#pragma once

#include "runtime/chaos.hpp"
#include "runtime/error.hpp"

#if !LOOM_DEVICE_PASS
#include <chrono>
#include <thread>
#endif

namespace loom {

LOOM_HD LOOM_INLINE std::uint64_t now_ns() {
#if LOOM_DEVICE_PASS
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

// Who is waiting: filled once per actor and copied into every error it raises.
struct WaiterId {
  Actor actor;
  std::uint32_t block;
  std::uint32_t rank;
};

class Watchdog {
 public:
  LOOM_HD Watchdog(ErrorRecord& errors, WaiterId who, std::uint64_t limit_ns, WaitSite site,
                   std::uint32_t object)
      : errors_(errors),
        who_(who),
        limit_ns_(limit_ns),
        site_(site),
        object_(object),
        start_(now_ns()) {}

  // Call once per unsuccessful poll. Returns false when the wait must end: another actor
  // reported an error, or this wait timed out (then this call records the error).
  LOOM_HD LOOM_INLINE bool keep_waiting(std::uint64_t expected, std::uint64_t seen) {
    Poll const p = poll();
    if (p == Poll::expired)
      raise_error(errors_, ErrorCode::watchdog, who_.actor, who_.block, who_.rank,
                  static_cast<std::uint32_t>(site_), object_, expected, seen);
    return p == Poll::keep_waiting;
  }

  // Like keep_waiting, but on expiry reports instead of recording, so the caller can record an
  // error with more detail than the site alone.
  enum class Poll { keep_waiting, failed_elsewhere, expired };
  LOOM_HD LOOM_INLINE Poll poll() {
    ++polls_;
    back_off();
    if ((polls_ & 15u) != 0) return Poll::keep_waiting;
    if (has_error(errors_)) return Poll::failed_elsewhere;
    if (limit_ns_ != 0 && now_ns() - start_ > limit_ns_) return Poll::expired;
    return Poll::keep_waiting;
  }

  // Progress was made; the bound starts again.
  LOOM_HD LOOM_INLINE void reset() {
    start_ = now_ns();
    polls_ = 0;
  }

 private:
  LOOM_HD LOOM_INLINE void back_off() const {
#if LOOM_DEVICE_PASS
    // Spin hot first (latency), then back off so idle pollers leave L2 bandwidth to the work.
    if (polls_ > 32) __nanosleep(polls_ < 256 ? 64 : 256);
#else
    chaos_point();
    if (polls_ > 64) std::this_thread::yield();
#endif
  }

  ErrorRecord& errors_;
  WaiterId who_;
  std::uint64_t limit_ns_;
  WaitSite site_;
  std::uint32_t object_;
  std::uint64_t start_;
  std::uint32_t polls_ = 0;
};

}  // namespace loom
