// Host API for static task graphs: tasks complete (at most) one event; an event fires when it has
// received its expected number of arrivals and then releases its successor tasks; a task with
// several gate events runs when all of them have fired. build() validates the whole graph before
// anything runs: dangling ids, cycles, counts that can never be reached.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/state.hpp"

namespace loom {

// A validated graph, ready to be uploaded to an executor. Immutable.
struct Graph {
  std::vector<Task> tasks;
  std::vector<std::uint32_t> gate_counts;
  std::vector<TaskId> roots;
  std::vector<EventDesc> events;
  std::vector<TaskId> successors;
  std::uint32_t dynamic_bound = 0;
};

struct EventOptions {
  // Dynamic tasks (or TaskContext::arrive) also arrive on this event, so the static check
  // "enough tasks complete it" cannot apply. Its arrivals are still checked at run time.
  bool dynamic_arrivals = false;
};

class GraphBuilder {
 public:
  // An event that fires after `expected` arrivals per launch.
  EventId add_event(std::uint32_t expected, EventOptions options = {});

  // Adds a task; it completes task.header.event (set when the task was made) and runs after all
  // of `after` have fired (none: it is ready when the launch starts).
  TaskId add_task(Task const& task, std::initializer_list<EventId> after = {});
  TaskId add_task(Task const& task, std::vector<EventId> const& after);

  // Adds one more gate event to an existing task.
  void add_gate(TaskId task, EventId event);

  // Declares the most dynamic tasks one launch may emit (by task bodies and subscribers).
  void set_dynamic_bound(std::uint32_t bound) { dynamic_bound_ = bound; }

  std::size_t task_count() const { return tasks_.size(); }
  std::size_t event_count() const { return expected_.size(); }

  // Validates and freezes. Throws loom::Error naming the offending task or event.
  Graph build() const;

 private:
  std::vector<Task> tasks_;
  std::vector<std::vector<EventId>> gates_;  // per task
  std::vector<std::uint32_t> expected_;
  std::vector<std::uint32_t> event_flags_;
  std::uint32_t dynamic_bound_ = 0;
};

}  // namespace loom
