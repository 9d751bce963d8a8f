// Work-conserving FIFO: ready tasks run in the order they became ready; no idle processor is left
// waiting while any task is ready, except that with prefetch a task may be rung on a busy
// processor's prefetch credit, older than a waiting processor's, and wait for its task to end
// (StateOptions::waiting_first prevents that). Priorities are ignored. A processor whose task
// releases successors runs the first of them itself when nothing else is waiting (local dispatch):
// that keeps the order and saves the round trip through the scheduler on chains.
#pragma once

#include "runtime/config.hpp"

namespace loom {

struct FifoPolicy {
  static constexpr std::uint32_t levels = 1;
  static constexpr std::uint32_t first_ring = 4;  // its own ring, after the priority levels
  static constexpr bool local_dispatch = true;
  static constexpr char const* name = "fifo";
  LOOM_HD static constexpr std::uint32_t level(std::uint32_t /*priority_level*/) { return 0; }
};

}  // namespace loom
