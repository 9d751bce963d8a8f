// The scheduler actor on the GPU: the whole of warp 0 of the OS block runs the loop of
// runtime/scheduler_loop.hpp over the same state, many words per round trip to memory: the
// processors' report words 256 at a time, the ready queue 128 slots at a time (each lane peeks
// four slots, ballots find the filled prefix, one fence covers the batch); every doorbell of a
// pass is rung behind a single release fence, the credits and refs of 128 doorbells loaded
// together; the successors of a fan-out entry are loaded 128 at a time. The reports seen and the
// credits held live in the OS block's shared memory when it holds them (SchedulerPrivate).
// Loop state (queue head, ready-list ends, counts) is kept identical in every lane, so
// every branch is warp-uniform; beside each 64-bit position it keeps the slot (ring_slot,
// runtime/queue.hpp), so no pass computes a remainder.
#pragma once

#include "runtime/scheduler_loop.hpp"

namespace loom {

// The scheduler's private words (RuntimeState::reports_seen and idle_list), in the OS block's
// shared memory when its dynamic shared memory holds them (no task runs there; a pipeline with
// a GEMM gives it 200 KB), else in global memory. In shared memory, their loads do not leave the
// SM, and the pass's fences do not wait for their stores.
struct SchedulerPrivate {
  std::uint64_t* reports_seen;  // [processors]
  std::uint64_t* idle_list;     // [processors], a ring, then [processors] of room (waiting_first)

  __device__ static SchedulerPrivate in(RuntimeState const& s, void* shared,
                                        std::uint32_t shared_bytes) {
    if (shared != nullptr && shared_bytes >= 3 * s.processors * sizeof(std::uint64_t)) {
      auto* const words = static_cast<std::uint64_t*>(shared);
      return {words, words + s.processors};
    }
    return {s.reports_seen, s.idle_list};
  }
};

namespace warp {

__device__ __forceinline__ unsigned lane_id() {
  return threadIdx.x % 32;
}
__device__ __forceinline__ unsigned lanes_below() {
  return (1u << lane_id()) - 1u;
}

__device__ __forceinline__ void fence_acquire() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
}
__device__ __forceinline__ void fence_release() {
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
}
__device__ __forceinline__ void fence_acq_rel() {
  cuda::atomic_thread_fence(cuda::memory_order_acq_rel, cuda::thread_scope_device);
}

// Pops up to min(32 * kLoads, capacity) filled entries at the consumer position `head`, whose
// slot is `head_slot` (both lane-uniform; advanced): every lane checks kLoads slots at once, so
// one round trip to memory covers the whole window. Entry 32 k + i goes to lane i in items[k].
// Whole warp.
inline constexpr std::uint32_t kPopLoads = 4;
__device__ __forceinline__ std::uint32_t pop_window(QueueView q) {
  return q.capacity < 32 * kPopLoads ? q.capacity : 32 * kPopLoads;
}
__device__ __forceinline__ std::uint32_t pop_batch(QueueView q, std::uint64_t& head,
                                                   std::uint32_t& head_slot,
                                                   std::uint32_t (&items)[kPopLoads]) {
  unsigned const lane = lane_id();
  std::uint32_t const window = pop_window(q);
  std::uint32_t slot[kPopLoads];
  std::uint64_t seq[kPopLoads];
#pragma unroll
  for (std::uint32_t k = 0; k < kPopLoads; ++k) {
    slot[k] = ring_slot(head_slot, 32 * k + lane < window ? 32 * k + lane : 0, q.capacity);
    seq[k] = 32 * k + lane < window ? load_relaxed(q.seq[slot[k]]) : 0;
  }
  std::uint32_t n = 0;
  bool open = true;  // no empty slot seen yet (warp-uniform)
#pragma unroll
  for (std::uint32_t k = 0; k < kPopLoads; ++k) {
    std::uint64_t const pos = head + 32 * k + lane;
    bool const full = 32 * k + lane < window && seq[k] == pos + 1;
    unsigned const empty_lanes = ~__ballot_sync(0xFFFFFFFFu, full);
    if (open) {
      n += empty_lanes == 0 ? 32 : __ffs(empty_lanes) - 1;
      open = empty_lanes == 0;
    }
  }
  if (n == 0) return 0;
  fence_acquire();  // the producers' item writes happen-before our reads
#pragma unroll
  for (std::uint32_t k = 0; k < kPopLoads; ++k)
    if (32 * k + lane < n) items[k] = load_relaxed(q.items[slot[k]]);
  fence_acq_rel();  // our reads happen-before the producers' reuse of the slots
#pragma unroll
  for (std::uint32_t k = 0; k < kPopLoads; ++k)
    if (32 * k + lane < n) store_relaxed(q.seq[slot[k]], head + 32 * k + lane + q.capacity);
  head += n;
  head_slot = ring_slot(head_slot, n, q.capacity);
  return n;
}

// Takes in the processors' report words (see report_word), 32 x kScanLoads per round trip to
// memory: adds the tasks they completed to `completed`, keeps `waiting` the number of processors
// whose last report says they wait (with s.waiting_first, the only reader of that count), and
// appends their new credits to the idle ring at `idle_tail`, whose slot is `idle_tail_slot`, in
// processor order. True when any word moved. Whole warp; processor p is always lane p % 32's, so
// each lane reads back only its own reports_seen.
inline constexpr std::uint32_t kScanLoads = 8;
__device__ __forceinline__ bool scan_reports(RuntimeState const& s, SchedulerPrivate const& own,
                                             std::uint64_t& completed, std::uint32_t& waiting,
                                             std::uint64_t& idle_tail,
                                             std::uint32_t& idle_tail_slot) {
  unsigned const lane = lane_id();
  bool moved = false;
  for (std::uint32_t base = 0; base < s.processors; base += 32 * kScanLoads) {
    std::uint64_t word[kScanLoads], seen[kScanLoads];
#pragma unroll
    for (std::uint32_t k = 0; k < kScanLoads; ++k) {
      std::uint32_t const p = base + 32 * k + lane;
      word[k] = p < s.processors ? load_relaxed(s.reports[p]) : 0;
      seen[k] = p < s.processors ? own.reports_seen[p] : 0;
    }
    std::uint32_t done = 0, waiting_change = 0;  // both modulo 2^32
    bool changed = false;
#pragma unroll
    for (std::uint32_t k = 0; k < kScanLoads; ++k) {
      std::uint32_t const p = base + 32 * k + lane;
      done += report_completed(word[k]) - report_completed(seen[k]);  // modulo 2^32
      waiting_change += (report_waiting(word[k]) ? 1u : 0u) - (report_waiting(seen[k]) ? 1u : 0u);
      bool const credit = report_credits(word[k]) != report_credits(seen[k]);
      unsigned const credits = __ballot_sync(0xFFFFFFFFu, credit);
      if (credit)
        own.idle_list[ring_slot(idle_tail_slot, __popc(credits & lanes_below()), s.processors)] =
            idle_entry(p, report_credits(word[k]));
      idle_tail += __popc(credits);
      idle_tail_slot = ring_slot(idle_tail_slot, __popc(credits), s.processors);
      if (word[k] != seen[k]) {
        own.reports_seen[p] = word[k];
        changed = true;
      }
    }
    completed += __reduce_add_sync(0xFFFFFFFFu, done);
    if (s.waiting_first) waiting += __reduce_add_sync(0xFFFFFFFFu, waiting_change);
    moved = __any_sync(0xFFFFFFFFu, changed) || moved;
  }
  return moved;
}

// waiting_first (scheduler_loop.hpp) for the warp: of the `held` credits from ring slot
// `head_slot`, the `take` < held to hand out next go to the head, waiting processors' first, ring
// order within each kind, the others behind in ring order; 32 entries per step, through the room
// after the ring. Whole warp; `held` and `take` warp-uniform.
__device__ __forceinline__ void waiting_first(SchedulerPrivate const& own, std::uint32_t processors,
                                              std::uint32_t head_slot, std::uint32_t held,
                                              std::uint32_t take) {
  unsigned const lane = lane_id();
  std::uint64_t* const ring = own.idle_list;
  std::uint64_t* const room = own.idle_list + processors;
  // Entry i of the held credits in `entry`, and whether its processor waits.
  auto load = [&](std::uint32_t i, std::uint64_t& entry) {
    if (i >= held) return false;
    entry = ring[ring_slot(head_slot, i, processors)];
    return report_waiting(own.reports_seen[idle_processor(entry)]);
  };
  std::uint32_t waiting = 0;
  for (std::uint32_t base = 0; base < held; base += 32) {
    std::uint64_t entry;
    waiting += __popc(__ballot_sync(0xFFFFFFFFu, load(base + lane, entry)));
  }
  if (waiting == 0 || waiting == held) return;  // one kind: ring order already
  std::uint32_t const take_waiting = waiting < take ? waiting : take;
  std::uint32_t const take_busy = take - take_waiting;
  std::uint32_t n_waiting = 0, n_busy = 0, n_left = 0;
  for (std::uint32_t base = 0; base < held; base += 32) {
    std::uint64_t entry = 0;
    bool const valid = base + lane < held, is_waiting = load(base + lane, entry);
    unsigned const waiting_lanes = __ballot_sync(0xFFFFFFFFu, valid && is_waiting);
    unsigned const busy_lanes = __ballot_sync(0xFFFFFFFFu, valid && !is_waiting);
    std::uint32_t const rank = is_waiting ? n_waiting + __popc(waiting_lanes & lanes_below())
                                          : n_busy + __popc(busy_lanes & lanes_below());
    bool const taken = valid && rank < (is_waiting ? take_waiting : take_busy);
    unsigned const left_lanes = __ballot_sync(0xFFFFFFFFu, valid && !taken);
    if (valid)
      room[taken ? (is_waiting ? 0 : take_waiting) + rank
                 : take + n_left + __popc(left_lanes & lanes_below())] = entry;
    n_waiting += __popc(waiting_lanes);
    n_busy += __popc(busy_lanes);
    n_left += __popc(left_lanes);
  }
  __syncwarp();
  for (std::uint32_t i = lane; i < held; i += 32)
    ring[ring_slot(head_slot, i, processors)] = room[i];
  __syncwarp();
}

}  // namespace warp

// The ready list as the warp sees it: per level, a FIFO ring of `capacity` refs in global memory
// private to the scheduler warp; ends kept in registers, identical in every lane.
template <class Policy>
class WarpReadyList {
 public:
  static_assert(Policy::first_ring + Policy::levels <= kReadyRings);

  // Starts with the graph's roots, which the host laid out at the start of each ring.
  __device__ explicit WarpReadyList(RuntimeState const& s)
      : storage_(s.ready_list + Policy::first_ring * s.task_capacity()),
        capacity_(s.task_capacity()) {
    for (std::uint32_t l = 0; l < Policy::levels; ++l) {
      head_[l] = 0;
      tail_[l] = s.graph.ring_roots[Policy::first_ring + l];
      head_slot_[l] = 0;
      tail_slot_[l] = ring_slot(0, s.graph.ring_roots[Policy::first_ring + l], capacity_);
    }
  }

  // Lanes with `valid` push their entry; order among them is lane order. Whole warp.
  __device__ __forceinline__ void push(bool valid, std::uint32_t entry) {
    std::uint32_t const level = valid ? Policy::level(entry >> kLevelShift) : 0;
#pragma unroll
    for (std::uint32_t l = 0; l < Policy::levels; ++l) {
      unsigned const mask = __ballot_sync(0xFFFFFFFFu, valid && level == l);
      if (valid && level == l) {
        std::uint32_t const at =
            ring_slot(tail_slot_[l], __popc(mask & warp::lanes_below()), capacity_);
        storage_[l * capacity_ + at] = entry & kRefMask;
      }
      tail_[l] += __popc(mask);
      tail_slot_[l] = ring_slot(tail_slot_[l], __popc(mask), capacity_);
    }
    __syncwarp();
  }

  __device__ __forceinline__ std::uint64_t size() const {
    std::uint64_t n = 0;
#pragma unroll
    for (std::uint32_t l = 0; l < Policy::levels; ++l) n += tail_[l] - head_[l];
    return n;
  }

  // Drops the first n refs take() would return (n <= size()), as ReadyList::drop.
  __device__ __forceinline__ void drop(std::uint64_t n) {
#pragma unroll
    for (std::uint32_t l = Policy::levels; l-- > 0;) {
      std::uint64_t const m = tail_[l] - head_[l] < n ? tail_[l] - head_[l] : n;
      head_[l] += m;
      head_slot_[l] = ring_slot(head_slot_[l], static_cast<std::uint32_t>(m), capacity_);
      n -= m;
    }
  }

  // Takes `n` <= 32 x K refs, highest level first; ref i goes to lane i % 32 in refs[i / 32],
  // every load issued before any is used. Whole warp.
  template <std::uint32_t K>
  __device__ __forceinline__ void take(std::uint32_t n, TaskRef (&refs)[K]) {
    unsigned const lane = warp::lane_id();
#pragma unroll
    for (std::uint32_t c = 0; c < K; ++c) refs[c] = kStopRef;
    std::uint32_t taken = 0;
#pragma unroll
    for (std::uint32_t k = Policy::levels; k-- > 0;) {
      std::uint64_t const have = tail_[k] - head_[k];
      std::uint32_t const m = static_cast<std::uint32_t>(have < n - taken ? have : n - taken);
#pragma unroll
      for (std::uint32_t c = 0; c < K; ++c) {
        std::uint32_t const i = 32 * c + lane;
        if (i >= taken && i < taken + m)
          refs[c] = storage_[k * capacity_ + ring_slot(head_slot_[k], i - taken, capacity_)];
      }
      head_[k] += m;
      head_slot_[k] = ring_slot(head_slot_[k], m, capacity_);
      taken += m;
    }
  }

 private:
  std::uint32_t* storage_;
  std::uint32_t capacity_;
  std::uint64_t head_[Policy::levels];
  std::uint64_t tail_[Policy::levels];
  std::uint32_t head_slot_[Policy::levels];  // head_ % capacity_, tail_ % capacity_
  std::uint32_t tail_slot_[Policy::levels];
};

// The successors of a fan-out entry, kFanOutLoads x 32 at a time: every lane loads its words
// first (one round trip for the batch), then opens their gates, then the warp pushes the ready
// ones in successor order. Whole warp.
inline constexpr std::uint32_t kFanOutLoads = 4;
template <class Policy>
__device__ __forceinline__ void release_fanout_warp(RuntimeState const& s,
                                                    WarpReadyList<Policy>& ready, EventId e,
                                                    std::uint64_t epoch) {
  EventDesc const ev = s.graph.events[e];
  for (std::uint32_t begin = ev.succ_begin; begin < ev.succ_end; begin += 32 * kFanOutLoads) {
    std::uint64_t words[kFanOutLoads];
#pragma unroll
    for (std::uint32_t k = 0; k < kFanOutLoads; ++k) {
      std::uint32_t const i = begin + 32 * k + warp::lane_id();
      words[k] = i < ev.succ_end ? s.graph.successors[i] : 0;
    }
#pragma unroll
    for (std::uint32_t k = 0; k < kFanOutLoads; ++k) {
      std::uint32_t const entry = static_cast<std::uint32_t>(words[k]);
      bool const open =
          begin + 32 * k + warp::lane_id() < ev.succ_end &&
          gate_opened(s, entry & kRefMask, static_cast<std::uint32_t>(words[k] >> 32), epoch);
      ready.push(open, entry);
    }
  }
}

// Doorbells rung per round trip to memory: ring_idle loads the credits and refs of up to
// 32 x kRingLoads of them before it stores the first.
inline constexpr std::uint32_t kRingLoads = 4;

template <class Policy>
__device__ void run_scheduler_warp(RuntimeState const& s, WaiterId who, SchedulerPrivate own) {
  unsigned const lane = warp::lane_id();
  Counters& c = *s.counters;
  std::uint64_t const epoch = load_acquire(c.epoch.value);
  std::uint64_t const total = std::uint64_t{s.graph.task_count} + s.graph.dynamic_bound;

  WarpReadyList<Policy> ready(s);
  ready.drop(start_roots(s));  // the processors took those themselves

  std::uint64_t ready_head = load_relaxed(*s.ready.head);
  std::uint32_t ready_head_slot = static_cast<std::uint32_t>(ready_head % s.ready.capacity);
  // Credits held, oldest first (with s.waiting_first, waiting processors' ahead of prefetch
  // credits when not all are rung: waiting_first): a ring in own.idle_list (see
  // scheduler_loop.hpp), starting with every processor's first credit (kStartReport), those of
  // processors running a root last (first_credit_at).
  for (std::uint32_t p = lane; p < s.processors; p += 32) {
    own.reports_seen[p] = kStartReport;
    own.idle_list[p] = idle_entry(first_credit_at(s, p), report_credits(kStartReport));
  }
  __syncwarp();
  std::uint64_t idle_head_pos = 0, idle_tail_pos = s.processors;
  std::uint32_t idle_head_slot = 0, idle_tail_slot = 0;  // the positions % processors
  std::uint64_t completed = 0;                           // tasks reported done
  std::uint32_t waiting = s.processors;    // processors whose last report says they wait
  std::uint64_t drained_at = kNotDrained;  // last value published in counters.drained_at
  if (lane == 0) store_relaxed(c.drained_at.value, drained_at);
  Watchdog dog(*s.error, who, s.watchdog_ns, WaitSite::scheduler_progress, 0);
  Heartbeat beat(&c.beat.value);
  // Rings the doorbells of the credits held, oldest first, with the ready tasks, one release fence
  // for all of them; the credits and refs of 32 x kRingLoads doorbells per round trip. True when
  // it rang any.
  auto ring_idle = [&] {
    if (idle_tail_pos == idle_head_pos || ready.size() == 0) return false;
    if (s.waiting_first && waiting != 0 && ready.size() < idle_tail_pos - idle_head_pos)
      warp::waiting_first(own, s.processors, idle_head_slot,
                          static_cast<std::uint32_t>(idle_tail_pos - idle_head_pos),
                          static_cast<std::uint32_t>(ready.size()));
    warp::fence_release();
    while (idle_tail_pos != idle_head_pos && ready.size() > 0) {
      std::uint64_t const idle = idle_tail_pos - idle_head_pos, r = ready.size();
      std::uint64_t const m = idle < r ? idle : r;
      std::uint32_t const n = static_cast<std::uint32_t>(m < 32 * kRingLoads ? m : 32 * kRingLoads);
      TaskRef refs[kRingLoads];
      ready.take(n, refs);
      std::uint64_t credits[kRingLoads];
#pragma unroll
      for (std::uint32_t c = 0; c < kRingLoads; ++c) {
        std::uint32_t const i = 32 * c + lane;
        credits[c] = i < n ? own.idle_list[ring_slot(idle_head_slot, i, s.processors)] : 0;
      }
#pragma unroll
      for (std::uint32_t c = 0; c < kRingLoads; ++c)
        if (32 * c + lane < n)
          store_relaxed(s.doorbells[idle_processor(credits[c])].word,
                        doorbell_word(idle_ring(credits[c]), refs[c]));
      idle_head_pos += n;
      idle_head_slot = ring_slot(idle_head_slot, n, s.processors);
    }
    // Every lane's loads of the ring come before any lane's later stores into it (scan_reports
    // refills the slots taken here): the shuffles and votes between them order no memory.
    __syncwarp();
    return true;
  };
  // The roots the processors did not take go out before the first pass: every first credit is
  // already held.
  __syncwarp();
  ring_idle();
  bool ok = true;
  for (;;) {
    bool progress = false;
    std::uint32_t entries[warp::kPopLoads];
    // Three lanes read the shared counters in the same round trip as the report words, so the
    // pass that takes in the last report also ends the launch.
    std::uint64_t word = 0;
    if (lane == 1) word = load_relaxed(c.retired.value);
    if (lane == 2) word = load_relaxed(c.dynamic_emitted.value);
    if (lane == 3) word = load_relaxed(c.subscribers_in.value);
    if (warp::scan_reports(s, own, completed, waiting, idle_tail_pos, idle_tail_slot))
      progress = true;
    // FIFO takes ready entries only until the list covers the credits held and a batch more: a
    // backlog of a thousand emitted tiles is moved over while the processors already run the
    // first ones, not before (draining it first left every processor idle for ~40 µs). A policy
    // with levels drains the queue: it must see every ready task to put the highest first.
    // A batch that came back short met an empty slot: whatever is pushed behind it now waits for
    // the next pass, instead of this one paying another round trip to find nothing.
    bool full = true;
    for (std::uint32_t n;
         full && (Policy::levels > 1 || ready.size() < idle_tail_pos - idle_head_pos + 32) &&
         (n = warp::pop_batch(s.ready, ready_head, ready_head_slot, entries)) != 0;) {
      full = n == warp::pop_window(s.ready);
#pragma unroll
      for (std::uint32_t k = 0; k < warp::kPopLoads; ++k) {
        if (32 * k >= n) break;  // warp-uniform
        std::uint32_t const entry = entries[k];
        bool const fan = 32 * k + lane < n && is_fanout(entry);
        ready.push(32 * k + lane < n && !fan, entry);
        for (unsigned fans = __ballot_sync(0xFFFFFFFFu, fan); fans != 0; fans &= fans - 1) {
          std::uint32_t const e = __shfl_sync(0xFFFFFFFFu, entry, __ffs(fans) - 1);
          release_fanout_warp(s, ready, fanout_event(e), epoch);
        }
      }
      progress = true;
    }
    __syncwarp();
    if (ring_idle()) progress = true;
    if (lane == 0) {
      std::uint64_t const drained = ready.size() == 0 ? ready_head : kNotDrained;
      if (drained != drained_at) store_relaxed(c.drained_at.value, drained_at = drained);
    }
    // Lane 0 decides and broadcasts the decision. The counters may be older than the reports
    // taken in this pass, never newer; both only grow, so a stale value delays the end by a pass
    // and never ends a launch early.
    std::uint64_t const retired = __shfl_sync(0xFFFFFFFFu, word, 1);
    std::uint64_t const emitted = __shfl_sync(0xFFFFFFFFu, word, 2);
    std::uint64_t const subscribers_in = __shfl_sync(0xFFFFFFFFu, word, 3);
    int decision = 0;  // 0: go on, 1: done, 2: failed
    if (lane == 0) {
      if (emitted + retired > s.graph.dynamic_bound) {
        raise_error(*s.error, bound_passed(emitted, s.graph.dynamic_bound), who.actor, who.block,
                    who.rank, 0, 0, s.graph.dynamic_bound, emitted + retired);
        decision = 2;
      } else if (completed + retired == total && idle_tail_pos - idle_head_pos == s.processors &&
                 subscribers_in == s.subscribers) {
        decision = 1;
      } else if (progress || beat.moved()) {
        dog.reset();
      } else {
        Watchdog::Poll const p = dog.poll();
        if (p == Watchdog::Poll::expired) {
          std::uint64_t expected = total, seen = completed + retired;
          EventId const e = first_unfired_event(s, epoch, expected, seen);
          raise_error(*s.error, ErrorCode::watchdog, who.actor, who.block, who.rank,
                      static_cast<std::uint32_t>(WaitSite::scheduler_progress), e, expected, seen);
        }
        if (p != Watchdog::Poll::keep_waiting) decision = 2;
      }
    }
    decision = __shfl_sync(0xFFFFFFFFu, decision, 0);
    if (decision == 1) break;
    if (decision == 2) {
      ok = false;
      break;
    }
  }
  if (lane == 0 && ok && has_error(*s.error)) ok = false;
  ok = __shfl_sync(0xFFFFFFFFu, ok, 0);
  // The stops go out first, behind no fence: a stopped processor reads nothing that the stores
  // below write (the next launch sees them after this kernel ends), so its block leaves while
  // they drain.
  for (std::uint32_t p = lane; p < s.processors; p += 32)
    store_relaxed(s.doorbells[p].word, doorbell_word(0, kStopRef));
  if (lane == 0) {
    store_relaxed(*s.ready.head, ready_head);
    // Processors that start the next launch on their roots read it before this scheduler's
    // successor publishes its own: no backlog is known then.
    store_relaxed(c.drained_at.value, kNotDrained);
    if (ok) {
      store_relaxed(c.dynamic_emitted.value, std::uint64_t{0});
      store_relaxed(c.retired.value, std::uint64_t{0});
      store_relaxed(c.subscribers_in.value, std::uint64_t{0});
    }
    store_release(c.stopped.value, epoch);
  }
  // As in end_launch: with every credit held, no processor writes its report word again.
  if (ok)
    for (std::uint32_t p = lane; p < s.processors; p += 32)
      store_relaxed(s.reports[p], kStartReport);
  __syncwarp();
  if (lane == 0 && ok) store_release(c.epoch.value, epoch + 1);
}

}  // namespace loom
