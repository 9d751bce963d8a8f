// A task that does nothing: measures the runtime's own cost per task, and shapes test graphs.
#pragma once

#include "runtime/context.hpp"

namespace loom::tasks {

struct Empty {
  static constexpr char const* name = "empty";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    std::uint32_t unused;
  };
  static void host(Payload const&, TaskContext&) {}
#if defined(__CUDACC__)
  __device__ static void device(Payload const&, TaskContext&) {}
#endif
};

}  // namespace loom::tasks
