// Work-conserving FIFO: ready tasks run in the order they became ready; no idle processor is left
// waiting while any task is ready. Priorities are ignored.
#pragma once

#include "runtime/config.hpp"

namespace loom {

struct FifoPolicy {
  static constexpr std::uint32_t levels = 1;
  static constexpr char const* name = "fifo";
  LOOM_HD static constexpr std::uint32_t level(std::uint32_t /*priority_level*/) { return 0; }
};

}  // namespace loom
