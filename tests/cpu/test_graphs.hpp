// Graph shapes the executor and chaos suites run (chain, chain of diamonds, fan-out/fan-in, random
// DAG), each with the "must finish before" pairs its dependencies imply, and the check that one
// launch honoured them: every task ran exactly once, each after all of its predecessors ended.
#pragma once

#include <algorithm>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "tests/cpu/test_support.hpp"

namespace loom::test {

struct Shape {
  Graph graph;
  std::uint32_t tasks = 0;                                      // task t stamps recorder slot t
  std::vector<std::pair<std::uint32_t, std::uint32_t>> before;  // (a, b): a ends before b starts
};

// Random priorities 0..4 when rng is given (4 shares level 3 with 3), else all 0.
inline std::uint8_t draw_priority(std::mt19937* rng) {
  return rng ? static_cast<std::uint8_t>((*rng)() % 5) : 0;
}

// t0 -> t1 -> ... -> t(n-1), each link an event of one arrival.
inline Shape chain_shape(Recorder& r, std::uint32_t n, std::mt19937* rng = nullptr) {
  GraphBuilder b;
  Shape s;
  EventId prev = kNoEvent;
  for (std::uint32_t t = 0; t < n; ++t) {
    EventId const e = t + 1 < n ? b.add_event(1) : kNoEvent;
    Task const task = stamp_task(r, t, e, draw_priority(rng));
    if (prev == kNoEvent)
      b.add_task(task);
    else
      b.add_task(task, {prev});
    if (t > 0) s.before.emplace_back(t - 1, t);
    prev = e;
  }
  s.graph = b.build();
  s.tasks = n;
  return s;
}

// A -> {B, C} -> D, where D is the next diamond's A. The join alternates at random between two
// events (D has two gates) and one event that expects both B and C.
inline Shape diamond_chain_shape(Recorder& r, std::uint32_t diamonds, std::mt19937& rng,
                                 bool priorities = false) {
  GraphBuilder b;
  Shape s;
  std::mt19937* prio_rng = priorities ? &rng : nullptr;
  std::uint32_t next = 0;
  auto add = [&](EventId completes, std::vector<EventId> const& after) {
    std::uint32_t const t = next++;
    b.add_task(stamp_task(r, t, completes, draw_priority(prio_rng)), after);
    return t;
  };
  EventId a_done = b.add_event(1);
  std::uint32_t a = add(a_done, {});
  for (std::uint32_t d = 0; d < diamonds; ++d) {
    bool const last = d + 1 == diamonds;
    std::vector<EventId> join;
    std::uint32_t bt, ct;
    if (rng() % 2 == 0) {
      EventId const eb = b.add_event(1), ec = b.add_event(1);
      bt = add(eb, {a_done});
      ct = add(ec, {a_done});
      join = {eb, ec};
    } else {
      EventId const ebc = b.add_event(2);
      bt = add(ebc, {a_done});
      ct = add(ebc, {a_done});
      join = {ebc};
    }
    EventId const d_done = last ? kNoEvent : b.add_event(1);
    std::uint32_t const dt = add(d_done, join);
    s.before.insert(s.before.end(), {{a, bt}, {a, ct}, {bt, dt}, {ct, dt}});
    a = dt;
    a_done = d_done;
  }
  s.graph = b.build();
  s.tasks = next;
  return s;
}

// One root releases `width` tasks whose completions release one sink.
inline Shape fan_shape(Recorder& r, std::uint32_t width, std::mt19937* rng = nullptr) {
  GraphBuilder b;
  Shape s;
  EventId const opened = b.add_event(1);
  EventId const joined = b.add_event(width);
  b.add_task(stamp_task(r, 0, opened, draw_priority(rng)));
  for (std::uint32_t i = 1; i <= width; ++i) {
    b.add_task(stamp_task(r, i, joined, draw_priority(rng)), {opened});
    s.before.emplace_back(0, i);
    s.before.emplace_back(i, width + 1);
  }
  b.add_task(stamp_task(r, width + 1, kNoEvent, draw_priority(rng)), {joined});
  s.graph = b.build();
  s.tasks = width + 2;
  return s;
}

// `sources` root tasks, each completing its own event, and `sinks` tasks that each wait on 1..3
// distinct source events drawn at random: every event fans out to hundreds of tasks (released by
// the scheduler from a fan-out entry), many of which also wait on other fan-outs.
inline Shape shared_fanout_shape(Recorder& r, std::uint32_t sources, std::uint32_t sinks,
                                 std::mt19937& rng) {
  GraphBuilder b;
  Shape s;
  std::vector<EventId> done(sources);
  for (std::uint32_t i = 0; i < sources; ++i) {
    done[i] = b.add_event(1);
    b.add_task(stamp_task(r, i, done[i], draw_priority(&rng)));
  }
  for (std::uint32_t j = 0; j < sinks; ++j) {
    std::uint32_t const t = sources + j;
    std::vector<EventId> after;
    std::uint32_t const k = 1 + rng() % 3;
    for (std::uint32_t g = 0; g < k; ++g) {
      std::uint32_t const p = rng() % sources;
      if (std::find(after.begin(), after.end(), done[p]) != after.end()) continue;
      after.push_back(done[p]);
      s.before.emplace_back(p, t);
    }
    b.add_task(stamp_task(r, t, kNoEvent, draw_priority(&rng)), after);
  }
  s.graph = b.build();
  s.tasks = sources + sinks;
  return s;
}

// n tasks in topological order; task t completes event t and waits on 0..3 distinct events of
// tasks in the `window` before it, so the graph is wide, with many multi-gate tasks.
inline Shape random_dag_shape(Recorder& r, std::uint32_t n, std::uint32_t window, std::mt19937& rng,
                              bool priorities = false) {
  GraphBuilder b;
  Shape s;
  std::mt19937* prio_rng = priorities ? &rng : nullptr;
  std::vector<std::vector<EventId>> gates(n);
  std::vector<bool> completes(n, false);
  for (std::uint32_t t = 1; t < n; ++t) {
    std::uint32_t const k = rng() % 4;
    std::uint32_t const lo = t > window ? t - window : 0;
    for (std::uint32_t j = 0; j < k; ++j) {
      std::uint32_t const p = lo + rng() % (t - lo);
      if (std::find(gates[t].begin(), gates[t].end(), p) != gates[t].end()) continue;
      gates[t].push_back(p);
      completes[p] = true;
      s.before.emplace_back(p, t);
    }
  }
  // Event ids follow the task ids of the completers that have successors.
  std::vector<EventId> event_of(n, kNoEvent);
  for (std::uint32_t t = 0; t < n; ++t)
    if (completes[t]) event_of[t] = b.add_event(1);
  for (std::uint32_t t = 0; t < n; ++t) {
    std::vector<EventId> after;
    for (std::uint32_t p : gates[t]) after.push_back(event_of[p]);
    b.add_task(stamp_task(r, t, event_of[t], draw_priority(prio_rng)), after);
  }
  s.graph = b.build();
  s.tasks = n;
  return s;
}

// `emitters` root Emitter tasks (slots 0..emitters-1), each with a share `bound` of the dynamic
// bound, emitting count[i] (drawn per launch) Stamp children that complete one dynamic-arrivals
// event; each emitter tops the event up for the children it did not emit, so the event fires once
// per launch and releases the static sink (slot `emitters`). Children of emitter i use slots
// emitters + 1 + i * bound ... `extra_roots` are added as further root tasks. Not copyable: the
// payloads point at its counts.
class EmissionShape {
 public:
  static std::uint32_t slots_for(std::uint32_t emitters, std::uint32_t bound) {
    return emitters + 1 + emitters * bound;
  }

  EmissionShape(Recorder& r, std::uint32_t emitters, std::uint32_t bound,
                std::vector<Task> const& extra_roots = {})
      : emitters_(emitters), bound_(bound), counts_(new std::uint32_t[emitters]()) {
    if (r.slots() < slots_for(emitters, bound)) throw Error("test: recorder too small");
    GraphBuilder b;
    EventId const children_done = b.add_event(emitters * bound, EventOptions{true});
    for (std::uint32_t i = 0; i < emitters; ++i)
      b.add_task(
          TestPipeline::make<Emitter>(Emitter::Payload{&r, &counts_[i], i, bound, first_child(i),
                                                       children_done, children_done, 0},
                                      kNoEvent, i));
    b.add_task(stamp_task(r, emitters), {children_done});
    for (Task const& t : extra_roots) b.add_task(t);
    b.set_dynamic_bound(emitters * bound);
    graph_ = b.build();
  }
  EmissionShape(EmissionShape const&) = delete;
  EmissionShape& operator=(EmissionShape const&) = delete;

  Graph const& graph() const { return graph_; }
  std::uint32_t count(std::uint32_t i) const { return counts_[i]; }
  void set_count(std::uint32_t i, std::uint32_t n) { counts_[i] = n; }
  void draw_counts(std::mt19937& rng) {
    for (std::uint32_t i = 0; i < emitters_; ++i) counts_[i] = rng() % (bound_ + 1);
  }
  std::uint32_t first_child(std::uint32_t i) const { return emitters_ + 1 + i * bound_; }

  // Emitters and sink once; exactly the emitted children once, each after its emitter started and
  // before the sink started; no other slot.
  ::testing::AssertionResult check(Recorder const& r, std::uint64_t epoch) const {
    std::uint32_t const sink = emitters_;
    std::vector<bool> used(r.slots(), false);
    std::vector<std::uint32_t> before_sink;
    for (std::uint32_t i = 0; i <= emitters_; ++i) used[i] = true;
    for (std::uint32_t i = 0; i < emitters_; ++i) {
      before_sink.push_back(i);
      for (std::uint32_t c = first_child(i); c < first_child(i) + counts_[i]; ++c) {
        used[c] = true;
        before_sink.push_back(c);
      }
    }
    std::ostringstream bad;
    int problems = 0;
    for (std::uint32_t t = 0; t < r.slots(); ++t) {
      std::uint32_t const want = used[t] ? 1 : 0;
      if (r.runs(t) != want && problems++ < 8)
        bad << "slot " << t << " ran " << r.runs(t) << " times, expected " << want << "\n";
      if (want && r.runs(t) == 1 && r.epoch(t) != epoch && problems++ < 8)
        bad << "slot " << t << " saw epoch " << r.epoch(t) << ", not " << epoch << "\n";
    }
    for (std::uint32_t i = 0; i < emitters_; ++i)
      for (std::uint32_t c = first_child(i); c < first_child(i) + counts_[i]; ++c)
        if (r.runs(c) == 1 && !(r.start(c) > r.start(i)) && problems++ < 8)
          bad << "child " << c << " started before its emitter " << i << "\n";
    for (std::uint32_t a : before_sink)
      if (!(r.start(sink) > r.end(a)) && problems++ < 8)
        bad << "sink started before slot " << a << " ended\n";
    if (r.out_of_range() != 0 && problems++ < 8) bad << "stamps out of range\n";
    if (problems == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << problems << " problems, first ones:\n" << bad.str();
  }

 private:
  std::uint32_t emitters_, bound_;
  std::unique_ptr<std::uint32_t[]> counts_;
  Graph graph_;
};

// One launch's record against the shape: every task exactly once, in this epoch, after its
// predecessors.
inline ::testing::AssertionResult ran_in_order(Shape const& s, Recorder const& r,
                                               std::uint64_t epoch) {
  std::ostringstream bad;
  int problems = 0;
  auto note = [&](auto const&... parts) {
    if (problems++ < 8) {
      (bad << ... << parts);
      bad << "\n";
    }
  };
  for (std::uint32_t t = 0; t < s.tasks; ++t) {
    if (r.runs(t) != 1)
      note("task ", t, " ran ", r.runs(t), " times");
    else if (r.epoch(t) != epoch)
      note("task ", t, " saw epoch ", r.epoch(t), ", not ", epoch);
  }
  for (std::size_t t = s.tasks; t < r.slots(); ++t)
    if (r.runs(t) != 0) note("unused slot ", t, " ran ", r.runs(t), " times");
  if (r.out_of_range() != 0) note(r.out_of_range(), " stamps out of range");
  for (auto const& [a, b] : s.before)
    if (!(r.start(b) > r.end(a)))
      note("task ", b, " started (ticket ", r.start(b), ") before task ", a, " ended (ticket ",
           r.end(a), ")");
  if (problems == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << problems << " problems, first ones:\n" << bad.str();
}

}  // namespace loom::test
