#include "runtime/graph.hpp"

#include <algorithm>
#include <sstream>

namespace loom {

EventId GraphBuilder::add_event(std::uint32_t expected, EventOptions options) {
  if (expected == 0)
    throw Error("loom: an event needs at least one expected arrival (event " +
                std::to_string(expected_.size()) + ")");
  expected_.push_back(expected);
  event_flags_.push_back(options.dynamic_arrivals ? EventDesc::kDynamicArrivals : 0u);
  return static_cast<EventId>(expected_.size() - 1);
}

TaskId GraphBuilder::add_task(Task const& task, std::initializer_list<EventId> after) {
  return add_task(task, std::vector<EventId>(after));
}

TaskId GraphBuilder::add_task(Task const& task, std::vector<EventId> const& after) {
  tasks_.push_back(task);
  gates_.push_back(after);
  return static_cast<TaskId>(tasks_.size() - 1);
}

void GraphBuilder::add_gate(TaskId task, EventId event) {
  if (task >= tasks_.size())
    throw Error("loom: add_gate on task " + std::to_string(task) + ", which does not exist");
  gates_[task].push_back(event);
}

namespace {

std::string task_name(TaskId t, Task const& task) {
  return "task " + std::to_string(t) + " (type " + std::to_string(task.header.type) + ", id " +
         std::to_string(task.header.id) + ")";
}

}  // namespace

Graph GraphBuilder::build() const {
  std::size_t const n_tasks = tasks_.size();
  std::size_t const n_events = expected_.size();
  if (n_tasks + dynamic_bound_ >= kMaxTasksPerLaunch)
    throw Error("loom: " + std::to_string(n_tasks) + " static tasks plus a dynamic bound of " +
                std::to_string(dynamic_bound_) + " exceed the per-launch limit of " +
                std::to_string(kMaxTasksPerLaunch - 1));

  if (n_events >= kMaxEventsPerLaunch)
    throw Error("loom: " + std::to_string(n_events) + " events exceed the per-launch limit of " +
                std::to_string(kMaxEventsPerLaunch - 1));

  // Dangling references and duplicate gates.
  std::vector<std::vector<TaskId>> completers(n_events);
  std::vector<std::vector<TaskId>> successors(n_events);
  for (TaskId t = 0; t < n_tasks; ++t) {
    EventId const e = tasks_[t].header.event;
    if (e != kNoEvent) {
      if (e >= n_events)
        throw Error("loom: " + task_name(t, tasks_[t]) + " completes event " + std::to_string(e) +
                    ", which does not exist (" + std::to_string(n_events) + " events)");
      completers[e].push_back(t);
    }
    std::vector<EventId> gates = gates_[t];
    std::sort(gates.begin(), gates.end());
    for (std::size_t i = 0; i < gates.size(); ++i) {
      if (gates[i] >= n_events)
        throw Error("loom: " + task_name(t, tasks_[t]) + " waits on event " +
                    std::to_string(gates[i]) + ", which does not exist (" +
                    std::to_string(n_events) + " events)");
      if (i > 0 && gates[i] == gates[i - 1])
        throw Error("loom: " + task_name(t, tasks_[t]) + " waits on event " +
                    std::to_string(gates[i]) + " twice");
      successors[gates[i]].push_back(t);
    }
  }

  // Arrival counts: a static-only event must receive exactly its expected count.
  for (EventId e = 0; e < n_events; ++e) {
    std::size_t const n = completers[e].size();
    bool const dynamic = event_flags_[e] & EventDesc::kDynamicArrivals;
    if (n > expected_[e])
      throw Error("loom: event " + std::to_string(e) + " expects " + std::to_string(expected_[e]) +
                  " arrivals but " + std::to_string(n) +
                  " tasks complete it; extra arrivals would corrupt the next launch");
    if (!dynamic && n < expected_[e]) {
      std::ostringstream os;
      os << "loom: event " << e << " expects " << expected_[e] << " arrivals but only " << n
         << " tasks complete it, so it can never fire";
      if (!successors[e].empty())
        os << " and " << task_name(successors[e].front(), tasks_[successors[e].front()])
           << " can never run";
      os << " (mark it EventOptions{.dynamic_arrivals = true} if dynamic tasks arrive on it)";
      throw Error(os.str());
    }
  }

  // Cycles and reachability: Kahn's algorithm over tasks. A task becomes runnable when all its
  // gate events have fired; an event fires (statically) when all its completers have run.
  std::vector<std::uint32_t> waiting_gates(n_tasks);
  std::vector<std::uint32_t> waiting_completers(n_events);
  std::vector<TaskId> order;
  order.reserve(n_tasks);
  for (TaskId t = 0; t < n_tasks; ++t) {
    waiting_gates[t] = static_cast<std::uint32_t>(gates_[t].size());
    if (waiting_gates[t] == 0) order.push_back(t);
  }
  for (EventId e = 0; e < n_events; ++e)
    waiting_completers[e] = static_cast<std::uint32_t>(completers[e].size());
  auto fire = [&](EventId e) {
    for (TaskId s : successors[e])
      if (--waiting_gates[s] == 0) order.push_back(s);
  };
  // Events completed only by dynamic tasks are assumed to fire: they are checked at run time.
  for (EventId e = 0; e < n_events; ++e)
    if (waiting_completers[e] == 0) fire(e);
  for (std::size_t i = 0; i < order.size(); ++i) {
    EventId const e = tasks_[order[i]].header.event;
    if (e != kNoEvent && --waiting_completers[e] == 0) fire(e);
  }
  if (order.size() != n_tasks) {
    // Some task never became runnable: walk back along unfired gates to show the cycle.
    TaskId t = 0;
    while (waiting_gates[t] == 0) ++t;
    std::ostringstream os;
    os << "loom: the graph has a cycle or a task that can never run: ";
    std::vector<bool> seen(n_tasks, false);
    for (int steps = 0; steps < 16 && !seen[t]; ++steps) {
      seen[t] = true;
      EventId blocking = kNoEvent;
      for (EventId g : gates_[t])
        if (waiting_completers[g] != 0) blocking = g;
      os << task_name(t, tasks_[t]) << " waits on event " << blocking;
      TaskId next = kNoEvent;
      for (TaskId c : completers[blocking])
        if (waiting_gates[c] != 0) next = c;
      if (next == kNoEvent) break;
      os << ", completed by ";
      t = next;
    }
    throw Error(os.str());
  }

  Graph g;
  g.tasks = tasks_;
  g.dynamic_bound = dynamic_bound_;
  g.gate_counts.resize(n_tasks);
  for (TaskId t = 0; t < n_tasks; ++t) {
    g.gate_counts[t] = static_cast<std::uint32_t>(gates_[t].size());
    if (gates_[t].empty()) g.roots.push_back(t);
  }
  g.events.resize(n_events);
  for (EventId e = 0; e < n_events; ++e) {
    g.events[e].expected = expected_[e];
    g.events[e].flags = event_flags_[e];
    g.events[e].succ_begin = static_cast<std::uint32_t>(g.successors.size());
    g.successors.insert(g.successors.end(), successors[e].begin(), successors[e].end());
    g.events[e].succ_end = static_cast<std::uint32_t>(g.successors.size());
  }
  return g;
}

}  // namespace loom
