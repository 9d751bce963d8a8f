// Everything the actors of one rank share during a launch, as plain pointers into one arena
// (host memory for the CPU executor, device memory for the persistent kernel). Built on the host
// by StateImage (state_image.hpp); passed to actors by value.
#pragma once

#include "runtime/doorbell.hpp"
#include "runtime/queue.hpp"
#include "runtime/task.hpp"

namespace loom {

struct EventDesc {
  std::uint32_t expected;    // arrivals per launch
  std::uint32_t succ_begin;  // successors[succ_begin, succ_end) are static task ids
  std::uint32_t succ_end;
  std::uint32_t flags;  // EventDesc::kDynamicArrivals, ...
  static constexpr std::uint32_t kDynamicArrivals = 1u;
};

// The scheduler's ready list is kReadyRings FIFO rings of task_capacity() refs each: rings 0..3
// are the priority policy's levels, ring 4 is the FIFO policy's. The host lays each ring's roots
// out at its start once; a ring holds at most one launch's pushes, so positions restart at zero
// every launch and the root prefix is never overwritten.
inline constexpr std::uint32_t kLevels = 4;  // priorities above 3 share the top level
inline constexpr std::uint32_t kReadyRings = kLevels + 1;

// The static graph, immutable once uploaded.
struct GraphView {
  Task const* tasks;
  std::uint32_t const* gate_counts;  // [task_count] events a task waits for (0 = root)
  TaskId const* roots;
  EventDesc const* events;
  TaskId const* successors;
  std::uint32_t task_count;
  std::uint32_t root_count;
  std::uint32_t event_count;
  std::uint32_t dynamic_bound;            // most dynamic tasks one launch may emit
  std::uint32_t ring_roots[kReadyRings];  // roots laid out at the start of each ready ring
};

// Launch-wide words, each on its own 128-byte line (they are polled from many SMs).
struct alignas(128) Counter {
  std::uint64_t value;
  std::uint64_t pad_[15];
};

struct Counters {
  Counter epoch;            // launch number, from 1; advanced by the scheduler as a launch ends
  Counter stopped;          // = epoch once the scheduler has ended the launch
  Counter dynamic_emitted;  // dynamic tasks emitted in this launch
  Counter retired;          // dynamic-bound slack given back in this launch
  Counter subscribers_in;   // subscribers that started this launch
  Counter beat;             // tasks completed, ever: the launch's heartbeat
  Counter drained_at;       // ready-queue position up to which every ready task has been handed
                            // out, or kNotDrained while the scheduler holds ready tasks
};
inline constexpr std::uint64_t kNotDrained = ~std::uint64_t{0};

struct TraceRecord {
  std::uint64_t start_ns;
  std::uint64_t end_ns;
  std::uint32_t processor;
  std::uint16_t type;
  std::uint16_t rank;
  std::uint32_t task_id;
  std::uint32_t pad_;
};

struct RuntimeState {
  GraphView graph;
  std::uint64_t* event_arrivals;  // [event_count] monotonic: fires at epoch * expected
  std::uint64_t* gate_arrivals;   // [task_count] monotonic, for tasks with gate_count > 1
  Task* dynamic_tasks;            // [dynamic_bound]
  Counters* counters;
  QueueView ready;            // entries: level << 30 | ref
  QueueView idle;             // entries: idle_report(processor, completed)
  Doorbell* doorbells;        // [processors]
  std::uint32_t* ready_list;  // scheduler-private: [kReadyRings][task capacity], roots first
  std::uint32_t* idle_list;   // scheduler-private storage: [processors]
  ErrorRecord* error;
  TraceRecord* trace;  // null when tracing is off
  std::uint64_t* trace_count;
  std::uint32_t trace_capacity;
  std::uint32_t processors;
  std::uint32_t subscribers;
  std::uint32_t rank;
  std::uint32_t world;
  std::uint64_t watchdog_ns;  // 0 = unbounded (not recommended)

  LOOM_HD LOOM_INLINE std::uint32_t task_capacity() const {
    return graph.task_count + graph.dynamic_bound;
  }
  LOOM_HD LOOM_INLINE Task const& task(TaskRef ref) const {
    return ref < graph.task_count ? graph.tasks[ref] : dynamic_tasks[ref - graph.task_count];
  }
};

// An idle report: the processor's id in the low 16 bits, the number of tasks it completed since its
// last report above them (0 for the first report of a launch).
inline constexpr std::uint32_t kReportCountShift = 16;
inline constexpr std::uint32_t kMaxProcessors = 1u << kReportCountShift;
inline constexpr std::uint32_t kMaxReportCount = (1u << 15) - 1;
LOOM_HD LOOM_INLINE std::uint32_t idle_report(std::uint32_t processor, std::uint32_t completed) {
  return processor | (completed << kReportCountShift);
}
inline constexpr std::uint32_t kLevelShift = 30;

LOOM_HD LOOM_INLINE std::uint32_t priority_level(std::uint8_t priority) {
  return priority < kLevels - 1 ? priority : kLevels - 1;
}
LOOM_HD LOOM_INLINE std::uint32_t ready_entry(TaskRef ref, std::uint8_t priority) {
  return (priority_level(priority) << kLevelShift) | ref;
}

}  // namespace loom
