// Lays out a RuntimeState in one arena and writes its initial contents. The host builds the image
// in host memory; the CPU executor uses it in place, the GPU launcher copies it to the device once.
// After that only the kernel (or the executor's actors) touch it: epochs make every launch start
// clean.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/graph.hpp"

namespace loom {

struct StateOptions {
  std::uint32_t processors = 1;
  std::uint32_t subscribers = 0;
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
  std::uint64_t watchdog_ns = 5'000'000'000ull;
  std::uint32_t trace_capacity = 0;  // 0: tracing off
  // Processors ask for their next task as they start one when the task before ran this long
  // (0: always; kNoPrefetch: never). See report_word in state.hpp.
  std::uint64_t prefetch_after_ns = 2000;
  // With fewer ready tasks than credits, hand them to waiting processors before prefetch credits
  // of busy ones (waiting_first, runtime/scheduler_loop.hpp). Off: oldest credit first.
  bool waiting_first = false;
};

class StateLayout {
 public:
  StateLayout(Graph const& graph, StateOptions const& options);

  std::size_t bytes() const { return bytes_; }

  // Pointers into an arena of bytes() at `base` (host or device memory).
  RuntimeState bind(void* base) const;

  // Writes the initial contents into a host buffer of bytes() (zeroed first), ready for launch
  // number `epoch`. After a failed launch the state restarts at a later epoch than any launch so
  // far, so epoch-valued flags the application keeps elsewhere (symmetric-heap signals) stay
  // valid: event counters are set as if launches 1 .. epoch-1 had completed.
  void initialize(void* host_image, std::uint64_t epoch = 1) const;

  // Offsets of what the host reads back after a launch.
  std::size_t error_offset() const { return error_; }
  std::size_t counters_offset() const { return counters_; }
  std::size_t trace_offset() const { return trace_; }
  std::size_t trace_count_offset() const { return trace_count_; }
  std::uint32_t trace_capacity() const { return options_.trace_capacity; }

 private:
  std::size_t take(std::size_t bytes, std::size_t align = 128);

  Graph const& graph_;
  StateOptions options_;
  std::size_t bytes_ = 0;
  std::size_t tasks_, gate_counts_, roots_, events_, successors_;
  std::size_t event_arrivals_, gate_arrivals_, dynamic_tasks_, counters_;
  std::size_t ready_tail_, ready_head_, ready_seq_, ready_items_;
  std::size_t reports_, doorbells_, ready_list_, idle_list_, reports_seen_, error_, trace_,
      trace_count_;
};

}  // namespace loom
