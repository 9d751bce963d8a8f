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
  std::uint32_t succ_begin;  // successors[succ_begin, succ_end): the released static tasks
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
  std::uint64_t const* successors;  // successor_word(task): what releasing it needs, in one load
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
  std::uint32_t wait_ns;  // how long the processor waited for this task (saturates at 4.29 s)
};

// A record whose type has kTraceMark set is a mark, not a task: an instant that a task body or a
// decoder recorded (TaskContext::trace_mark), of kind type & ~kTraceMark, with two values in
// task_id and wait_ns, start_ns == end_ns, and `processor` the actor that recorded it.
inline constexpr std::uint16_t kTraceMark = 0x8000;
// A mark whose `processor` has this bit set was recorded by subscriber `processor & ~bit`.
inline constexpr std::uint32_t kTraceBySubscriber = 0x80000000u;
LOOM_HD constexpr bool is_trace_mark(TraceRecord const& r) {
  return (r.type & kTraceMark) != 0;
}

struct RuntimeState {
  GraphView graph;
  std::uint64_t* event_arrivals;  // [event_count] monotonic: fires at epoch * expected
  std::uint64_t* gate_arrivals;   // [task_count] monotonic, for tasks with gate_count > 1
  Task* dynamic_tasks;            // [dynamic_bound]
  Counters* counters;
  QueueView ready;            // entries: level << 30 | ref
  std::uint64_t* reports;     // [processors] report words (report_word), one writer each
  Doorbell* doorbells;        // [processors]
  std::uint32_t* ready_list;  // scheduler-private: [kReadyRings][task capacity], roots first
  // Scheduler-private (the GPU scheduler keeps them in the OS block's shared memory when it holds
  // them: SchedulerPrivate): the credits held (idle_entry), a ring of [processors] followed by
  // [processors] entries of room to reorder it (waiting_first), and the report word last taken
  // in from each processor, [processors].
  std::uint64_t* idle_list;
  std::uint64_t* reports_seen;
  ErrorRecord* error;
  TraceRecord* trace;  // null when tracing is off
  std::uint64_t* trace_count;
  std::uint32_t trace_capacity;
  std::uint32_t processors;
  std::uint32_t subscribers;
  std::uint32_t rank;
  std::uint32_t world;
  std::uint64_t watchdog_ns;  // 0 = unbounded (not recommended)
  // Prefetch once the previous task ran this long (kNoPrefetch: never).
  std::uint64_t prefetch_after_ns;
  bool waiting_first;  // see StateOptions

  LOOM_HD LOOM_INLINE std::uint32_t task_capacity() const {
    return graph.task_count + graph.dynamic_bound;
  }
  LOOM_HD LOOM_INLINE Task const& task(TaskRef ref) const {
    return ref < graph.task_count ? graph.tasks[ref] : dynamic_tasks[ref - graph.task_count];
  }
};

inline constexpr std::uint64_t kNoPrefetch = ~std::uint64_t{0};

// A processor's report to the scheduler is one word of its own, rewritten whole with a plain
// store (no queue, no ticket, nothing to wait for): the credits it has handed over in this launch
// in bits 32-62, whether it is waiting for a task in bit 63, the tasks it has completed in the low
// 32. The scheduler reads every word in each pass and takes in the difference to the word it saw
// last: completed tasks, and a new credit when the credit count moved. A processor has one
// credit: a credit means its doorbell may be rung, and the scheduler answers a processor's n-th
// credit with its n-th ring (the ring carries n, so the processor needs no store to empty its
// doorbell). Without prefetch it hands the credit over once its task is done; with prefetch as
// soon as it takes a task, so the next ring arrives while the task runs. A processor prefetches
// when its previous task ran at least prefetch_after_ns (a launch's first task counts as following
// a long one, kFirstTaskNs): long tasks hide the scheduler's round trip, and short ones would only
// double the reports the scheduler handles. A report without a new credit brings the count up to
// date, or says that the processor now waits.
//
// The waiting bit tells the credits of idle processors from prefetch credits: a processor sets it
// in the report it sends as it starts to wait on its doorbell, and clears it in the prefetch
// credit it hands over as it starts a task. A task rung on a prefetch credit waits until the task
// its processor runs has ended: behind a long task (the EP layer's sends stream for 150 us) it
// waits while other processors idle. With StateOptions::waiting_first the scheduler, holding more
// credits than it has ready tasks, hands them to waiting processors first (waiting_first). It is
// off by default: on the one-GPU MoE layer it cost 1.5% (docs/architecture.md, "Prefetch
// credits and waiting processors").
//
// A launch starts with every processor's first credit already handed over: each word reads
// kStartReport (one credit, nothing completed, waiting), and the scheduler starts holding credit
// 1 of every processor. Processor p < start_roots runs the p-th root without a ring
// (scheduler/ready_list.hpp); the scheduler rings the roots left, if any, at once, and a
// processor without a root starts waiting for ring 1. So the first tasks go out without a round
// trip through the scheduler. The scheduler puts the words back to
// kStartReport when a launch ends well; the host re-initialises them after a failed one.
inline constexpr std::uint32_t kMaxProcessors = 1u << 16;
inline constexpr std::uint64_t kReportWaiting = std::uint64_t{1} << 63;
LOOM_HD constexpr std::uint64_t report_word(std::uint32_t credits, std::uint32_t completed,
                                            bool waiting) {
  return (waiting ? kReportWaiting : 0) | (std::uint64_t{credits} << 32) | completed;
}
inline constexpr std::uint64_t kStartReport = report_word(1, 0, true);
LOOM_HD LOOM_INLINE std::uint32_t report_credits(std::uint64_t word) {
  return static_cast<std::uint32_t>((word & ~kReportWaiting) >> 32);
}
LOOM_HD LOOM_INLINE std::uint32_t report_completed(std::uint64_t word) {
  return static_cast<std::uint32_t>(word);
}
LOOM_HD LOOM_INLINE bool report_waiting(std::uint64_t word) {
  return (word & kReportWaiting) != 0;
}
// A credit the scheduler holds: the processor and the ring that answers it.
LOOM_HD LOOM_INLINE std::uint64_t idle_entry(std::uint32_t processor, std::uint32_t ring) {
  return (std::uint64_t{ring} << 32) | processor;
}
LOOM_HD LOOM_INLINE std::uint32_t idle_processor(std::uint64_t entry) {
  return static_cast<std::uint32_t>(entry);
}
LOOM_HD LOOM_INLINE std::uint32_t idle_ring(std::uint64_t entry) {
  return static_cast<std::uint32_t>(entry >> 32);
}
inline constexpr std::uint32_t kLevelShift = 30;

LOOM_HD LOOM_INLINE std::uint32_t priority_level(std::uint8_t priority) {
  return priority < kLevels - 1 ? priority : kLevels - 1;
}
LOOM_HD LOOM_INLINE std::uint32_t ready_entry(TaskRef ref, std::uint8_t priority) {
  return (priority_level(priority) << kLevelShift) | ref;
}

// A fan-out entry in the ready queue: event `e` fired and the scheduler releases its successors
// itself, many per memory round trip, instead of the one thread whose arrival fired it.
LOOM_HD LOOM_INLINE std::uint32_t fanout_entry(EventId e) {
  return kFanOutFlag | e;
}
LOOM_HD LOOM_INLINE bool is_fanout(std::uint32_t entry) {
  return (entry & kFanOutFlag) != 0;
}
LOOM_HD LOOM_INLINE EventId fanout_event(std::uint32_t entry) {
  return entry & (kFanOutFlag - 1);
}

// A successor as its releaser needs it: the ready entry in the low word, the task's gate count in
// the high word (more than one gate: it waits for its other events too).
LOOM_HD LOOM_INLINE std::uint64_t successor_word(TaskRef ref, std::uint8_t priority,
                                                 std::uint32_t gates) {
  return std::uint64_t{gates} << 32 | ready_entry(ref, priority);
}

}  // namespace loom
