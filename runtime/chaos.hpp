// Adversarial interleaving for the CPU executor: at chosen points of the protocol (between taking
// a queue ticket and filling the slot, before an event arrival, in every poll) an actor thread
// with chaos enabled sleeps or yields at random, so tests explore orders a fair scheduler rarely
// produces. No code is emitted for the device and nothing happens while chaos is off.
#pragma once

#include <chrono>
#include <random>
#include <thread>

#include "runtime/config.hpp"

namespace loom {

// Host-only state; declared in both compilation passes because host templates that are parsed in
// the device pass (the CPU executor) name it.
struct ChaosState {
  std::mt19937_64 rng;
  std::uint32_t delay_per_mille;  // chance of a pause at each point, per thousand
  std::uint32_t max_delay_us;
};
inline thread_local ChaosState* tls_chaos = nullptr;

LOOM_HD LOOM_INLINE void chaos_point() {
#if !LOOM_DEVICE_PASS
  ChaosState* c = tls_chaos;
  if (c == nullptr) return;
  std::uint64_t const r = c->rng();
  if (r % 1000 >= c->delay_per_mille) return;
  if ((r >> 20) & 1u) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds((r >> 32) % (c->max_delay_us + 1)));
  }
#endif
}

}  // namespace loom
