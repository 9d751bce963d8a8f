// The policies a launch can choose, by name at run time, and the one switch that maps the
// choice to the scheduler loop instantiated for it.
#pragma once

#include <string>

#include "scheduler/fifo.hpp"
#include "scheduler/priority.hpp"

namespace loom {

enum class SchedulingPolicy { fifo, priority };

inline char const* to_string(SchedulingPolicy p) {
  return p == SchedulingPolicy::fifo ? FifoPolicy::name : PriorityPolicy::name;
}

// Calls fn(FifoPolicy{}) or fn(PriorityPolicy{}).
template <class Fn>
decltype(auto) with_policy(SchedulingPolicy p, Fn&& fn) {
  if (p == SchedulingPolicy::priority) return fn(PriorityPolicy{});
  return fn(FifoPolicy{});
}

}  // namespace loom
