// Work-conserving priority: a ready task of a higher level always goes before a lower one; FIFO
// among equals. A task's level is its header priority, clamped to 0..3 (3 runs first). Use it to
// put the critical path first (e.g. the GEMM tiles that unblock communication).
#pragma once

#include "runtime/state.hpp"

namespace loom {

struct PriorityPolicy {
  static constexpr std::uint32_t levels = kLevels;
  static constexpr std::uint32_t first_ring = 0;
  // Every ready task goes through the scheduler, which alone sees all levels.
  static constexpr bool local_dispatch = false;
  static constexpr char const* name = "priority";
  LOOM_HD static constexpr std::uint32_t level(std::uint32_t priority_level) {
    return priority_level;
  }
};

}  // namespace loom
