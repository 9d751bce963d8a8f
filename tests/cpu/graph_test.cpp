// GraphBuilder: what build() rejects (with a message that names the problem) and what a valid
// graph freezes into (roots, gate counts, the successor CSR).
#include <algorithm>
#include <map>
#include <set>

#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

Task plain(std::uint32_t id, EventId completes = kNoEvent) {
  return TestPipeline::make<Wide>(Wide::Payload{}, completes, id);
}

std::string build_error(GraphBuilder const& b) {
  return error_of([&] { (void)b.build(); });
}

TEST(Graph, RejectsTwoTasksGatingEachOther) {
  GraphBuilder b;
  EventId const e0 = b.add_event(1), e1 = b.add_event(1);
  b.add_task(plain(10, e0), {e1});
  b.add_task(plain(11, e1), {e0});
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "cycle"));
  EXPECT_TRUE(mentions(m, "id 10"));
  EXPECT_TRUE(mentions(m, "id 11"));
}

TEST(Graph, RejectsATaskGatedOnItsOwnEvent) {
  GraphBuilder b;
  EventId const root_done = b.add_event(1);
  b.add_task(plain(0, root_done));
  EventId const self = b.add_event(1);
  b.add_task(plain(1, self), {self});
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "cycle"));
  EXPECT_TRUE(mentions(m, "task 1"));
  EXPECT_TRUE(mentions(m, "event " + std::to_string(self)));
}

TEST(Graph, RejectsALongCycleBehindValidTasks) {
  // root -> a -> b -> c -> a: the cycle is not at the start of the task list.
  GraphBuilder b;
  EventId const r = b.add_event(1), ea = b.add_event(2), eb = b.add_event(1), ec = b.add_event(1);
  b.add_task(plain(0, ea));
  b.add_task(plain(1, eb), {ea});
  b.add_task(plain(2, ec), {eb});
  b.add_task(plain(3, ea), {ec});
  b.add_task(plain(4, r));
  b.add_task(plain(5), {r});
  EXPECT_TRUE(mentions(build_error(b), "cycle"));
}

TEST(Graph, RejectsCompletionOfAnEventThatDoesNotExist) {
  GraphBuilder b;
  b.add_event(1);
  b.add_task(plain(0, 0));
  b.add_task(plain(7, 5));
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "completes event 5"));
  EXPECT_TRUE(mentions(m, "does not exist"));
  EXPECT_TRUE(mentions(m, "id 7"));
}

TEST(Graph, RejectsAGateOnAnEventThatDoesNotExist) {
  GraphBuilder b;
  EventId const e = b.add_event(1);
  b.add_task(plain(0, e));
  b.add_task(plain(8), {e, 3});
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "waits on event 3"));
  EXPECT_TRUE(mentions(m, "does not exist"));
  EXPECT_TRUE(mentions(m, "id 8"));
}

TEST(Graph, RejectsTheSameGateTwice) {
  GraphBuilder b;
  EventId const e = b.add_event(1);
  b.add_task(plain(0, e));
  TaskId const t = b.add_task(plain(1), {e});
  b.add_gate(t, e);
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "twice"));
  EXPECT_TRUE(mentions(m, "event " + std::to_string(e)));

  GraphBuilder direct;
  EventId const f = direct.add_event(1);
  direct.add_task(plain(0, f));
  direct.add_task(plain(1), {f, f});
  EXPECT_TRUE(mentions(build_error(direct), "twice"));
}

TEST(Graph, RejectsAnEventThatCanNeverFire) {
  GraphBuilder b;
  EventId const e = b.add_event(3);
  b.add_task(plain(0, e));
  b.add_task(plain(1, e));
  b.add_task(plain(2), {e});
  std::string const m = build_error(b);
  EXPECT_TRUE(mentions(m, "event " + std::to_string(e)));
  EXPECT_TRUE(mentions(m, "expects 3"));
  EXPECT_TRUE(mentions(m, "never fire"));
  EXPECT_TRUE(mentions(m, "can never run"));

  GraphBuilder nobody;
  EventId const lonely = nobody.add_event(1);
  nobody.add_task(plain(0), {lonely});
  EXPECT_TRUE(mentions(build_error(nobody), "never fire"));
}

TEST(Graph, AcceptsTooFewCompletersWhenArrivalsAreDynamic) {
  GraphBuilder b;
  EventId const e = b.add_event(3, EventOptions{true});
  b.add_task(plain(0, e));
  b.add_task(plain(1), {e});
  b.set_dynamic_bound(2);
  Graph const g = b.build();
  ASSERT_EQ(g.events.size(), 1u);
  EXPECT_EQ(g.events[0].expected, 3u);
  EXPECT_EQ(g.events[0].flags, EventDesc::kDynamicArrivals);
  EXPECT_EQ(g.dynamic_bound, 2u);

  // An event completed only by dynamic tasks gates a successor too.
  GraphBuilder only_dynamic;
  EventId const d = only_dynamic.add_event(4, EventOptions{true});
  only_dynamic.add_task(plain(0), {d});
  EXPECT_NO_THROW((void)only_dynamic.build());
}

TEST(Graph, RejectsMoreCompletersThanExpectedArrivals) {
  for (bool dynamic : {false, true}) {
    SCOPED_TRACE(dynamic ? "dynamic arrivals" : "static arrivals");
    GraphBuilder b;
    EventId const e = b.add_event(2, EventOptions{dynamic});
    for (std::uint32_t i = 0; i < 3; ++i) b.add_task(plain(i, e));
    std::string const m = build_error(b);
    EXPECT_TRUE(mentions(m, "event " + std::to_string(e)));
    EXPECT_TRUE(mentions(m, "expects 2"));
    EXPECT_TRUE(mentions(m, "3 tasks complete it"));
  }
}

TEST(Graph, RejectsAnEventExpectingNoArrivals) {
  GraphBuilder b;
  EXPECT_TRUE(mentions(error_of([&] { b.add_event(0); }), "at least one"));
  EXPECT_EQ(b.event_count(), 0u);
}

TEST(Graph, RejectsAGateOnAMissingTask) {
  GraphBuilder b;
  EventId const e = b.add_event(1);
  b.add_task(plain(0, e));
  std::string const m = error_of([&] { b.add_gate(5, e); });
  EXPECT_TRUE(mentions(m, "task 5"));
  EXPECT_TRUE(mentions(m, "does not exist"));
}

TEST(Graph, RejectsMoreTasksThanALaunchCanAddress) {
  GraphBuilder b;
  b.add_task(plain(0));
  b.set_dynamic_bound(kMaxTasksPerLaunch);
  EXPECT_TRUE(mentions(build_error(b), "limit"));
}

TEST(Graph, EmptyGraphBuilds) {
  Graph const g = GraphBuilder{}.build();
  EXPECT_TRUE(g.tasks.empty());
  EXPECT_TRUE(g.roots.empty());
  EXPECT_TRUE(g.events.empty());
  EXPECT_TRUE(g.successors.empty());
}

// A random valid graph against a model of what build() must produce.
TEST(Graph, FreezesRootsGateCountsAndSuccessors) {
  TracedSeed const seed;
  std::mt19937 rng(seed);
  for (int round = 0; round < 20; ++round) {
    std::uint32_t const n = 1 + rng() % 300;
    GraphBuilder b;
    // Event e is completed by the tasks listed in completers[e]; tasks are added in an order in
    // which every gate's completers come first, so the graph is acyclic.
    std::vector<std::vector<TaskId>> completers;
    std::vector<std::vector<EventId>> gates(n);
    std::vector<EventId> completes(n, kNoEvent);
    std::vector<bool> dynamic;
    for (TaskId t = 0; t < n; ++t) {
      if (rng() % 3 != 0) {
        if (completers.empty() || rng() % 2 == 0) {
          completers.emplace_back();
          dynamic.push_back(rng() % 4 == 0);
        }
        completes[t] = static_cast<EventId>(rng() % completers.size());
        completers[completes[t]].push_back(t);
      }
    }
    // Gates: only events whose completers are all earlier than t (or dynamic-only events).
    for (TaskId t = 0; t < n; ++t) {
      std::uint32_t const k = rng() % 4;
      for (std::uint32_t j = 0; j < k && !completers.empty(); ++j) {
        EventId const e = static_cast<EventId>(rng() % completers.size());
        bool const earlier = std::all_of(completers[e].begin(), completers[e].end(),
                                         [&](TaskId c) { return c < t; });
        bool const dup = std::find(gates[t].begin(), gates[t].end(), e) != gates[t].end();
        if (earlier && !dup) gates[t].push_back(e);
      }
    }
    std::vector<std::uint32_t> expected(completers.size());
    for (EventId e = 0; e < completers.size(); ++e) {
      std::uint32_t const c = static_cast<std::uint32_t>(completers[e].size());
      // Dynamic events may expect more than their static completers deliver.
      expected[e] = dynamic[e] ? c + rng() % 3 + (c == 0) : (c == 0 ? 1 : c);
      if (!dynamic[e] && c == 0) dynamic[e] = true;  // no completer at all: must be dynamic
      EXPECT_EQ(b.add_event(expected[e], EventOptions{dynamic[e]}), e);
    }
    for (TaskId t = 0; t < n; ++t) {
      // Half of the gates are added after the task, through add_gate.
      std::vector<EventId> now(gates[t].begin(), gates[t].begin() + gates[t].size() / 2);
      EXPECT_EQ(b.add_task(plain(1000 + t, completes[t]), now), t);
    }
    for (TaskId t = 0; t < n; ++t)
      for (std::size_t j = gates[t].size() / 2; j < gates[t].size(); ++j)
        b.add_gate(t, gates[t][j]);
    std::uint32_t const bound = rng() % 50;
    b.set_dynamic_bound(bound);
    EXPECT_EQ(b.task_count(), n);
    EXPECT_EQ(b.event_count(), completers.size());

    Graph const g = b.build();
    ASSERT_EQ(g.tasks.size(), n);
    ASSERT_EQ(g.gate_counts.size(), n);
    ASSERT_EQ(g.events.size(), completers.size());
    EXPECT_EQ(g.dynamic_bound, bound);
    std::vector<TaskId> roots;
    for (TaskId t = 0; t < n; ++t) {
      EXPECT_EQ(g.tasks[t].header.id, 1000 + t);
      EXPECT_EQ(g.tasks[t].header.event, completes[t]);
      EXPECT_EQ(g.gate_counts[t], gates[t].size()) << "task " << t;
      if (gates[t].empty()) roots.push_back(t);
    }
    EXPECT_EQ(g.roots, roots);
    std::uint32_t at = 0;
    for (EventId e = 0; e < g.events.size(); ++e) {
      EventDesc const& d = g.events[e];
      EXPECT_EQ(d.expected, expected[e]);
      EXPECT_EQ(d.flags, dynamic[e] ? EventDesc::kDynamicArrivals : 0u);
      ASSERT_EQ(d.succ_begin, at) << "event " << e << ": CSR ranges must be contiguous";
      ASSERT_LE(d.succ_begin, d.succ_end);
      ASSERT_LE(d.succ_end, g.successors.size());
      std::multiset<TaskId> got(g.successors.begin() + d.succ_begin,
                                g.successors.begin() + d.succ_end);
      std::multiset<TaskId> want;
      for (TaskId t = 0; t < n; ++t)
        if (std::find(gates[t].begin(), gates[t].end(), e) != gates[t].end()) want.insert(t);
      EXPECT_EQ(got, want) << "successors of event " << e;
      at = d.succ_end;
    }
    EXPECT_EQ(at, g.successors.size());
  }
}

}  // namespace
}  // namespace loom::test
