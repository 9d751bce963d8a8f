#include "runtime/state_image.hpp"

#include <cstring>

namespace loom {

namespace {
inline constexpr std::uint32_t kReadyQueueId = 0;
}  // namespace

std::size_t StateLayout::take(std::size_t bytes, std::size_t align) {
  bytes_ = (bytes_ + align - 1) / align * align;
  std::size_t const at = bytes_;
  bytes_ += bytes == 0 ? align : bytes;
  return at;
}

StateLayout::StateLayout(Graph const& graph, StateOptions const& options)
    : graph_(graph), options_(options) {
  if (options.processors == 0 || options.processors >= kMaxProcessors)
    throw Error("loom: a launch needs 1 to " + std::to_string(kMaxProcessors - 1) +
                " processors, not " + std::to_string(options.processors));
  if (options.world == 0 || options.world > kMaxRanks || options.rank >= options.world)
    throw Error("loom: rank " + std::to_string(options.rank) + " of world " +
                std::to_string(options.world) + " is out of range (at most " +
                std::to_string(kMaxRanks) + " ranks)");
  std::size_t const n_tasks = graph.tasks.size();
  std::size_t const capacity = n_tasks + graph.dynamic_bound;
  std::size_t const queue_capacity = capacity == 0 ? 1 : capacity;
  tasks_ = take(n_tasks * sizeof(Task));
  gate_counts_ = take(n_tasks * sizeof(std::uint32_t));
  roots_ = take(graph.roots.size() * sizeof(TaskId));
  events_ = take(graph.events.size() * sizeof(EventDesc));
  successors_ = take(graph.successors.size() * sizeof(std::uint64_t));
  event_arrivals_ = take(graph.events.size() * sizeof(std::uint64_t));
  gate_arrivals_ = take(n_tasks * sizeof(std::uint64_t));
  dynamic_tasks_ = take(graph.dynamic_bound * sizeof(Task));
  counters_ = take(sizeof(Counters));
  ready_tail_ = take(sizeof(std::uint64_t));
  ready_head_ = take(sizeof(std::uint64_t));
  ready_seq_ = take(queue_capacity * sizeof(std::uint64_t));
  ready_items_ = take(queue_capacity * sizeof(std::uint32_t));
  // Report words side by side: the scheduler reads 32 of them per load instruction.
  reports_ = take(options.processors * sizeof(std::uint64_t), 128);
  doorbells_ = take(options.processors * sizeof(Doorbell));
  ready_list_ = take(std::size_t{kReadyRings} * queue_capacity * sizeof(std::uint32_t));
  idle_list_ = take(2 * std::size_t{options.processors} * sizeof(std::uint64_t));
  reports_seen_ = take(options.processors * sizeof(std::uint64_t));
  error_ = take(sizeof(ErrorRecord));
  trace_ = take(options.trace_capacity * sizeof(TraceRecord));
  trace_count_ = take(sizeof(std::uint64_t));
}

RuntimeState StateLayout::bind(void* base_ptr) const {
  auto* base = static_cast<unsigned char*>(base_ptr);
  auto at = [&](std::size_t offset) { return base + offset; };
  RuntimeState s{};
  std::uint32_t const n_tasks = static_cast<std::uint32_t>(graph_.tasks.size());
  std::uint32_t const queue_capacity = std::max<std::uint32_t>(1, n_tasks + graph_.dynamic_bound);
  s.graph.tasks = reinterpret_cast<Task const*>(at(tasks_));
  s.graph.gate_counts = reinterpret_cast<std::uint32_t const*>(at(gate_counts_));
  s.graph.roots = reinterpret_cast<TaskId const*>(at(roots_));
  s.graph.events = reinterpret_cast<EventDesc const*>(at(events_));
  s.graph.successors = reinterpret_cast<std::uint64_t const*>(at(successors_));
  s.graph.task_count = n_tasks;
  s.graph.root_count = static_cast<std::uint32_t>(graph_.roots.size());
  s.graph.event_count = static_cast<std::uint32_t>(graph_.events.size());
  s.graph.dynamic_bound = graph_.dynamic_bound;
  for (std::uint32_t r = 0; r < kReadyRings; ++r) s.graph.ring_roots[r] = 0;
  for (TaskId t : graph_.roots) {
    ++s.graph.ring_roots[priority_level(graph_.tasks[t].header.priority)];
    ++s.graph.ring_roots[kLevels];
  }
  s.event_arrivals = reinterpret_cast<std::uint64_t*>(at(event_arrivals_));
  s.gate_arrivals = reinterpret_cast<std::uint64_t*>(at(gate_arrivals_));
  s.dynamic_tasks = reinterpret_cast<Task*>(at(dynamic_tasks_));
  s.counters = reinterpret_cast<Counters*>(at(counters_));
  s.ready = QueueView{reinterpret_cast<std::uint64_t*>(at(ready_tail_)),
                      reinterpret_cast<std::uint64_t*>(at(ready_head_)),
                      reinterpret_cast<std::uint64_t*>(at(ready_seq_)),
                      reinterpret_cast<std::uint32_t*>(at(ready_items_)),
                      queue_capacity,
                      kReadyQueueId};
  s.reports = reinterpret_cast<std::uint64_t*>(at(reports_));
  s.doorbells = reinterpret_cast<Doorbell*>(at(doorbells_));
  s.ready_list = reinterpret_cast<std::uint32_t*>(at(ready_list_));
  s.idle_list = reinterpret_cast<std::uint64_t*>(at(idle_list_));
  s.reports_seen = reinterpret_cast<std::uint64_t*>(at(reports_seen_));
  s.error = reinterpret_cast<ErrorRecord*>(at(error_));
  s.trace = options_.trace_capacity ? reinterpret_cast<TraceRecord*>(at(trace_)) : nullptr;
  s.trace_count = reinterpret_cast<std::uint64_t*>(at(trace_count_));
  s.trace_capacity = options_.trace_capacity;
  s.processors = options_.processors;
  s.subscribers = options_.subscribers;
  s.rank = options_.rank;
  s.world = options_.world;
  s.watchdog_ns = options_.watchdog_ns;
  s.prefetch_after_ns = options_.prefetch_after_ns;
  s.waiting_first = options_.waiting_first;
  return s;
}

void StateLayout::initialize(void* host_image, std::uint64_t epoch) const {
  auto* base = static_cast<unsigned char*>(host_image);
  std::memset(base, 0, bytes_);
  auto copy = [&](std::size_t offset, auto const& vec) {
    if (!vec.empty()) std::memcpy(base + offset, vec.data(), vec.size() * sizeof(vec[0]));
  };
  copy(tasks_, graph_.tasks);
  copy(gate_counts_, graph_.gate_counts);
  copy(roots_, graph_.roots);
  copy(events_, graph_.events);
  {
    std::vector<std::uint64_t> words(graph_.successors.size());
    for (std::size_t i = 0; i < words.size(); ++i) {
      TaskId const t = graph_.successors[i];
      words[i] = successor_word(t, graph_.tasks[t].header.priority, graph_.gate_counts[t]);
    }
    copy(successors_, words);
  }
  RuntimeState const s = bind(host_image);
  s.counters->epoch.value = epoch;
  s.counters->stopped.value = epoch - 1;
  s.counters->drained_at.value = kNotDrained;
  for (std::uint32_t e = 0; e < s.graph.event_count; ++e)
    s.event_arrivals[e] = (epoch - 1) * graph_.events[e].expected;
  for (std::uint32_t t = 0; t < s.graph.task_count; ++t)
    s.gate_arrivals[t] = (epoch - 1) * graph_.gate_counts[t];
  for (std::uint32_t i = 0; i < s.ready.capacity; ++i) s.ready.seq[i] = i;
  for (std::uint32_t p = 0; p < s.processors; ++p) s.reports[p] = kStartReport;
  // Each ready ring starts with its roots, in graph order (FIFO: all of them; priority: by level).
  std::uint32_t fill[kReadyRings] = {};
  for (TaskId t : graph_.roots) {
    std::uint32_t const level = priority_level(graph_.tasks[t].header.priority);
    s.ready_list[level * s.ready.capacity + fill[level]++] = t;
    s.ready_list[kLevels * s.ready.capacity + fill[kLevels]++] = t;
  }
}

}  // namespace loom
