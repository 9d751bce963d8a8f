// The scheduler actor: one thread that moves ready tasks to idle processors until every task of
// the launch, static and dynamic, has completed, then ends the launch. It also releases the
// successors of wide fan-outs (fan-out entries, see arrive). The same loop runs on a
// CPU-executor thread and on lane 0 of the GPU's scheduler warp.
#pragma once

#include "runtime/doorbell.hpp"
#include "runtime/protocol.hpp"
#include "scheduler/ready_list.hpp"

namespace loom {

// Scans the events for one that has not fired in this launch (for the watchdog's message).
LOOM_HD LOOM_INLINE EventId first_unfired_event(RuntimeState const& s, std::uint64_t epoch,
                                                std::uint64_t& expected, std::uint64_t& seen) {
  for (EventId e = 0; e < s.graph.event_count; ++e) {
    std::uint64_t const a = load_relaxed(s.event_arrivals[e]);
    std::uint64_t const target = epoch * s.graph.events[e].expected;
    if (a < target) {
      expected = s.graph.events[e].expected;
      seen = a - (epoch - 1) * s.graph.events[e].expected;
      return e;
    }
  }
  return kNoEvent;
}

// Puts the `take` credits to hand out next at the head of the ring of credits held (ring[(head +
// i) % processors] for i < held), with fewer ready tasks than credits (take < held): those of
// processors that wait for a task (their last report says so, report_waiting) before prefetch
// credits of busy ones, ring order within each kind; the credits left keep their order behind
// them. `scratch` has room for `held` entries. The GPU scheduler's warp does the same
// (warp::waiting_first).
LOOM_HD LOOM_INLINE void waiting_first(std::uint64_t* ring, std::uint64_t* scratch,
                                       std::uint32_t processors, std::uint64_t head,
                                       std::uint32_t held, std::uint32_t take,
                                       std::uint64_t const* reports_seen) {
  auto waiting = [&](std::uint64_t entry) {
    return report_waiting(reports_seen[idle_processor(entry)]);
  };
  std::uint32_t w = 0;
  for (std::uint32_t i = 0; i < held; ++i) w += waiting(ring[(head + i) % processors]) ? 1 : 0;
  if (w == 0 || w == held) return;  // one kind: ring order already
  std::uint32_t const take_waiting = w < take ? w : take, take_busy = take - take_waiting;
  std::uint32_t n_waiting = 0, n_busy = 0, n_left = 0;
  for (std::uint32_t i = 0; i < held; ++i) {
    std::uint64_t const e = ring[(head + i) % processors];
    bool const is_waiting = waiting(e);
    std::uint32_t& rank = is_waiting ? n_waiting : n_busy;
    std::uint32_t const quota = is_waiting ? take_waiting : take_busy;
    std::uint32_t const first = is_waiting ? 0 : take_waiting;
    scratch[rank < quota ? first + rank : take + n_left++] = e;
    ++rank;
  }
  for (std::uint32_t i = 0; i < held; ++i) ring[(head + i) % processors] = scratch[i];
}

// Ends the launch: every actor is told to stop; on success the per-launch counters are cleared and
// the epoch advances, so the next launch starts clean without the host touching anything. The
// stops go first: a stopped processor reads none of what follows (the next launch does, after this
// one has been joined or its kernel has ended).
LOOM_HD LOOM_INLINE void end_launch(RuntimeState const& s, std::uint64_t epoch, bool ok) {
  Counters& c = *s.counters;
  for (std::uint32_t p = 0; p < s.processors; ++p) doorbell_stop(s.doorbells[p]);
  // Processors that start the next launch on their roots read it before the next scheduler
  // publishes its own: no backlog is known then.
  store_relaxed(c.drained_at.value, kNotDrained);
  if (ok) {
    store_relaxed(c.dynamic_emitted.value, std::uint64_t{0});
    store_relaxed(c.retired.value, std::uint64_t{0});
    store_relaxed(c.subscribers_in.value, std::uint64_t{0});
  }
  store_release(c.stopped.value, epoch);
  // Every processor is waiting on its doorbell with its last report taken in (the scheduler holds
  // every credit), so nothing writes a report word after this.
  if (ok)
    for (std::uint32_t p = 0; p < s.processors; ++p) store_relaxed(s.reports[p], kStartReport);
  if (ok) store_release(c.epoch.value, epoch + 1);
}

template <class Policy>
LOOM_HD void run_scheduler(RuntimeState const& s, WaiterId who) {
  Counters& c = *s.counters;
  std::uint64_t const epoch = load_acquire(c.epoch.value);
  std::uint64_t const total = std::uint64_t{s.graph.task_count} + s.graph.dynamic_bound;

  ReadyList<Policy> ready(s);  // the roots are already in it
  ready.drop(start_roots(s));  // the processors took those themselves

  // Credits held (processors whose doorbell may be rung), oldest first: s.idle_list is a ring of
  // `processors` entries from idle_head to idle_tail, each the processor and the ring to send.
  // Oldest first: with prefetch, a processor that has waited idle gets work before one that just
  // started a task. With s.waiting_first and fewer ready tasks than credits, every waiting
  // processor's credit goes before any prefetch credit (waiting_first). It starts with every
  // processor's first credit (kStartReport), those of processors running a root last
  // (first_credit_at).
  std::uint64_t idle_head = 0, idle_tail = s.processors;
  for (std::uint32_t i = 0; i < s.processors; ++i)
    s.idle_list[i] = idle_entry(first_credit_at(s, i), report_credits(kStartReport));
  std::uint64_t completed = 0;           // tasks reported done by processors
  std::uint32_t waiting = s.processors;  // processors whose last report says they wait
  std::uint64_t ready_pos = load_relaxed(*s.ready.head);
  std::uint64_t drained_at = kNotDrained;  // last value published in counters.drained_at
  store_relaxed(c.drained_at.value, drained_at);
  for (std::uint32_t p = 0; p < s.processors; ++p) s.reports_seen[p] = kStartReport;
  Watchdog dog(*s.error, who, s.watchdog_ns, WaitSite::scheduler_progress, 0);
  Heartbeat beat(&c.beat.value);
  bool ok = true;
  for (;;) {
    bool progress = false;
    std::uint32_t entry;
    while (queue_try_pop(s.ready, entry)) {
      if (is_fanout(entry))
        release_fanout(s, fanout_event(entry), epoch, [&](std::uint32_t e) { ready.push(e); });
      else
        ready.push(entry);
      progress = true;
    }
    for (std::uint32_t p = 0; p < s.processors; ++p) {
      std::uint64_t const word = load_relaxed(s.reports[p]), seen = s.reports_seen[p];
      if (word == seen) continue;
      completed += report_completed(word) - report_completed(seen);  // modulo 2^32
      if (report_waiting(word) != report_waiting(seen))
        report_waiting(word) ? ++waiting : --waiting;
      if (report_credits(word) != report_credits(seen))
        s.idle_list[idle_tail++ % s.processors] = idle_entry(p, report_credits(word));
      s.reports_seen[p] = word;
      progress = true;
    }
    if (s.waiting_first && waiting != 0 && !ready.empty() && ready.size() < idle_tail - idle_head)
      waiting_first(s.idle_list, s.idle_list + s.processors, s.processors, idle_head,
                    static_cast<std::uint32_t>(idle_tail - idle_head),
                    static_cast<std::uint32_t>(ready.size()), s.reports_seen);
    while (idle_tail != idle_head && !ready.empty()) {
      std::uint64_t const idle = s.idle_list[idle_head++ % s.processors];
      doorbell_ring(s.doorbells[idle_processor(idle)], idle_ring(idle), ready.pop());
      progress = true;
    }
    ready_pos = load_relaxed(*s.ready.head);
    std::uint64_t const drained = ready.empty() ? ready_pos : kNotDrained;
    if (drained != drained_at) store_relaxed(c.drained_at.value, drained_at = drained);
    if (beat.moved()) progress = true;

    std::uint64_t const retired = load_acquire(c.retired.value);
    std::uint64_t const emitted = load_relaxed(c.dynamic_emitted.value);
    if (emitted + retired > s.graph.dynamic_bound) {
      raise_error(*s.error, bound_passed(emitted, s.graph.dynamic_bound), who.actor, who.block,
                  who.rank, 0, 0, s.graph.dynamic_bound, emitted + retired);
      ok = false;
      break;
    }
    if (completed + retired == total && idle_tail - idle_head == s.processors &&
        load_acquire(c.subscribers_in.value) == s.subscribers)
      break;

    if (progress) {
      dog.reset();
      continue;
    }
    Watchdog::Poll const p = dog.poll();
    if (p == Watchdog::Poll::keep_waiting) continue;
    if (p == Watchdog::Poll::expired) {
      std::uint64_t expected = total, seen = completed + retired;
      EventId const e = first_unfired_event(s, epoch, expected, seen);
      raise_error(*s.error, ErrorCode::watchdog, who.actor, who.block, who.rank,
                  static_cast<std::uint32_t>(WaitSite::scheduler_progress), e, expected, seen);
    }
    ok = false;
    break;
  }
  if (ok && has_error(*s.error)) ok = false;
  end_launch(s, epoch, ok);
}

}  // namespace loom
