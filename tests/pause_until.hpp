// Waiting until a time on the launch's clock (now_ns) inside a test task: the device spins on the
// global timer; a host processor thread sleeps.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "runtime/watchdog.hpp"

namespace loom::test {

LOOM_HD inline void pause_until(std::uint64_t t) {
#if defined(__CUDA_ARCH__)
  while (now_ns() < t) {
  }
#else
  std::uint64_t const now = now_ns();
  if (t > now) std::this_thread::sleep_for(std::chrono::nanoseconds(t - now));
#endif
}

}  // namespace loom::test
