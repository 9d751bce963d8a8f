// The dependency protocol: event arrivals with monotonic epochs, release of successors by the
// last arriver, dynamic emission within the declared bound, and slack retirement. Every function
// here is called by one thread (a processor's leader, a subscriber, a host thread) and is the same
// code on the CPU executor and on the GPU.
#pragma once

#include "runtime/state.hpp"

namespace loom {

// Pushes a ready task into the scheduler's queue.
LOOM_HD LOOM_INLINE bool make_ready(RuntimeState const& s, TaskRef ref, std::uint8_t priority,
                                    Watchdog& dog) {
  return queue_push(s.ready, ready_entry(ref, priority), dog);
}

// A static task's gate event fired: true when that was its last gate (it is ready now).
LOOM_HD LOOM_INLINE bool gate_opened(RuntimeState const& s, TaskId t, std::uint32_t gates,
                                     std::uint64_t epoch) {
  if (gates <= 1) return true;
  std::uint64_t const arrived = fetch_add_acq_rel(s.gate_arrivals[t], std::uint64_t{1}) + 1;
  return arrived == epoch * gates;
}

// One arrival on event `e` (descriptor `ev`) in launch `epoch`, counted. The arrival that brings
// the count to epoch * expected is the last (it releases the successors); arrivals beyond it are
// an error (they would corrupt the next launch's epoch), reported, not ignored.
enum class Arrival { counted, last, failed };
LOOM_HD LOOM_INLINE Arrival count_arrival(RuntimeState const& s, EventId e, EventDesc const& ev,
                                          std::uint64_t epoch, WaiterId who) {
  chaos_point();
  std::uint64_t const target = epoch * ev.expected;
  std::uint64_t const count = fetch_add_acq_rel(s.event_arrivals[e], std::uint64_t{1}) + 1;
  if (count < target) return Arrival::counted;
  if (count > target) {
    raise_error(*s.error, ErrorCode::event_overshoot, who.actor, who.block, who.rank, 0, e,
                ev.expected, count - (epoch - 1) * ev.expected);
    return Arrival::failed;
  }
  return Arrival::last;
}

// One arrival on event `e` (count_arrival); the last releases the successors.
//
// An event with at most kFanOutAbove successors is released by its last arriver: they go to the
// ready queue under one ticket, their successor words loaded together (one round trip to memory,
// not one per successor). If `keep` is not null, the first released successor is handed back in
// *keep instead (it was kStopRef on entry): the caller runs it next itself (local dispatch) and it
// never passes through the scheduler. A wider fan-out goes to the scheduler as one fan-out entry
// (release_fanout): one thread releasing hundreds of successors a chunk at a time takes a round
// trip or more per chunk while the processors it would feed sit idle. (A GPU processor releases
// with its whole first warp: finish_task_warp, runtime/cuda/processor_finish.cuh.)
inline constexpr std::uint32_t kFanOutAbove = kPushChunk;

// The scheduler's side of a fan-out entry: push(entry) for each successor of `e` whose last gate
// this was. The GPU's scheduler warp has its own version, 32 lanes wide (scheduler_warp.cuh).
template <class PushFn>
LOOM_HD void release_fanout(RuntimeState const& s, EventId e, std::uint64_t epoch, PushFn push) {
  EventDesc const ev = s.graph.events[e];
  for (std::uint32_t i = ev.succ_begin; i < ev.succ_end; ++i) {
    std::uint64_t const word = s.graph.successors[i];
    std::uint32_t const entry = static_cast<std::uint32_t>(word);
    if (gate_opened(s, entry & kRefMask, static_cast<std::uint32_t>(word >> 32), epoch))
      push(entry);
  }
}

LOOM_HD LOOM_INLINE bool arrive(RuntimeState const& s, EventId e, std::uint64_t epoch, WaiterId who,
                                Watchdog& dog, TaskRef* keep = nullptr) {
  EventDesc const ev = s.graph.events[e];
  Arrival const arrival = count_arrival(s, e, ev, epoch, who);
  if (arrival != Arrival::last) return arrival == Arrival::counted;
  std::uint32_t const m = ev.succ_end - ev.succ_begin;
  if (m > kFanOutAbove) return queue_push(s.ready, fanout_entry(e), dog);
  std::uint64_t words[kPushChunk];
  LOOM_UNROLL
  for (std::uint32_t i = 0; i < kPushChunk; ++i)
    if (i < m) words[i] = s.graph.successors[ev.succ_begin + i];
  // The gates, one successor after another over the m there are, in a rolled loop. Unrolled
  // kPushChunk times it compiled to about a thousand instructions, and releasing one successor
  // spent about 6 µs in it (the MoE layer's route -> plan on an H200); rolled, that whole hop
  // from the route's end to the plan's start takes 3-4 µs.
  std::uint32_t chunk[kPushChunk];
  std::uint32_t n = 0;
  LOOM_NO_UNROLL
  for (std::uint32_t i = 0; i < m; ++i) {
    std::uint32_t const entry = static_cast<std::uint32_t>(words[i]);
    TaskId const t = entry & kRefMask;
    if (!gate_opened(s, t, static_cast<std::uint32_t>(words[i] >> 32), epoch)) continue;
    if (keep && *keep == kStopRef) {
      *keep = t;
      continue;
    }
    chunk[n++] = entry;
  }
  return n == 0 || queue_push_chunk(
                       s.ready, n, [&](std::uint32_t k) { return chunk[k]; }, dog);
}

// Appends the record make() builds, once it has a slot, when tracing is on (records past the
// capacity are dropped).
template <class Make>
LOOM_HD LOOM_INLINE void append_trace(RuntimeState const& s, Make const& make) {
  if (!s.trace) return;
  std::uint64_t const i = fetch_add_relaxed(*s.trace_count, std::uint64_t{1});
  if (i < s.trace_capacity) s.trace[i] = make();
}

// Appends one task's trace record. `asked_ns` is when the processor started waiting for the task,
// `start_ns` when it began running.
LOOM_HD LOOM_INLINE void record_trace(RuntimeState const& s, Task const& task,
                                      std::uint32_t processor, std::uint64_t asked_ns,
                                      std::uint64_t start_ns) {
  append_trace(s, [&] {
    std::uint64_t const wait = start_ns - asked_ns;
    return TraceRecord{start_ns,
                       now_ns(),
                       processor,
                       task.header.type,
                       static_cast<std::uint16_t>(s.rank),
                       task.header.id,
                       static_cast<std::uint32_t>(wait < 0xFFFFFFFFu ? wait : 0xFFFFFFFFu)};
  });
}

// Appends a mark (kTraceMark: an instant of kind `kind` with values a and b).
LOOM_HD LOOM_INLINE void record_mark(RuntimeState const& s, std::uint32_t actor, std::uint16_t kind,
                                     std::uint32_t a, std::uint32_t b) {
  append_trace(s, [&] {
    std::uint64_t const t = now_ns();
    return TraceRecord{t,
                       t,
                       actor,
                       static_cast<std::uint16_t>(kTraceMark | kind),
                       static_cast<std::uint16_t>(s.rank),
                       a,
                       b};
  });
}

// After a task: one beat of the heartbeat (fire-and-forget), then the arrival on its event. Local
// dispatch (keep the first released successor and run it next) is offered only when the policy
// allows it and the scheduler has handed out every task ever pushed to the ready queue, so a kept
// successor overtakes no task that was already ready.
LOOM_HD LOOM_INLINE bool complete_task(RuntimeState const& s, Task const& task, std::uint64_t epoch,
                                       WaiterId who, Watchdog& dog, bool may_keep, TaskRef& keep) {
  keep = kStopRef;
  fetch_add_relaxed(s.counters->beat.value, std::uint64_t{1});
  if (task.header.event == kNoEvent) return true;
  bool const local =
      may_keep && load_relaxed(*s.ready.tail) == load_relaxed(s.counters->drained_at.value);
  return arrive(s, task.header.event, epoch, who, dog, local ? &keep : nullptr);
}

// A processor's side of the doorbell protocol (the CPU executor's processor thread, the GPU
// processor block's thread 0). See report_word in state.hpp for the credit.
// With the credit out, the doorbell is polled this many times before the count goes out in a report
// of its own: a prefetched ring is usually there already, and then the count rides on the next
// credit report. Each poll is a round trip to memory: with four, the last task's count (and so
// the launch's end) came 1.8 µs later (the GEMM launch floor on an H100, tile end to launch end).
inline constexpr std::uint32_t kRingPolls = 1;
// A launch's first task counts as following one longer than any prefetch_after_ns: it
// prefetches (unless prefetch is off, kNoPrefetch, which take_next_task tests first). The phase
// that opens a launch is often a few waves of equal tasks (the MoE route); without this, each
// processor's second task waited for its first to end and for the scheduler's round trip after it.
inline constexpr std::uint64_t kFirstTaskNs = ~std::uint64_t{0};
// Trivially constructible, so that a GPU processor block can keep it in shared memory.
struct ProcessorLink {
  std::uint32_t me;
  std::uint32_t completed;  // tasks completed in this launch
  std::uint32_t reported;   // of them, the count in the last report
  std::uint32_t credits;    // credits handed over in this launch: the ring to expect
  bool credit_out;          // the scheduler holds this processor's credit
  bool credit_due;          // a prefetch credit is to be given (give_prefetch_credit)
  bool waiting;             // the last report said it waits for a task (report_waiting)
  TaskRef kept;             // a successor kept by local dispatch, run next
  std::uint64_t taken_ns;   // when the running task was taken
  std::uint64_t last_ns;    // how long the previous task took, taken to finished

  // Processor `me` at the start of a launch: its first credit is already with the scheduler
  // (kStartReport), so it waits for ring 1 without reporting, unless it takes a root itself
  // (take_start_root).
  LOOM_HD static ProcessorLink start(std::uint32_t me) {
    ProcessorLink link{};
    link.me = me;
    link.credits = report_credits(kStartReport);
    link.credit_out = true;
    link.waiting = true;
    link.kept = kStopRef;
    link.last_ns = kFirstTaskNs;
    return link;
  }
};

// One store, whatever it reports; the scheduler finds it on its next pass. `waiting`: the
// processor is about to wait on its doorbell with nothing to run.
LOOM_HD LOOM_INLINE void send_report(RuntimeState const& s, ProcessorLink& link, bool waiting) {
  chaos_point();  // a report late behind the work it counts
  link.reported = link.completed;
  link.waiting = waiting;
  store_relaxed(s.reports[link.me], report_word(link.credits, link.completed, waiting));
}
// A processor that starts a launch on `root` (start_root, scheduler/ready_list.hpp; kStopRef:
// none) runs it first, its credit still with the scheduler, and reports that it is busy, so that a
// scheduler with waiting_first does not hand the next task to it before a processor that waits.
LOOM_HD LOOM_INLINE void take_start_root(RuntimeState const& s, ProcessorLink& link, TaskRef root) {
  if (root == kStopRef) return;
  link.kept = root;
  send_report(s, link, false);
}
LOOM_HD LOOM_INLINE void hand_over_credit(RuntimeState const& s, ProcessorLink& link,
                                          bool waiting) {
  ++link.credits;
  link.credit_out = true;
  send_report(s, link, waiting);
}

// The next task to run in `ref`: the kept successor, else the doorbell's ref, waiting for it
// (bounded) after handing over the credit or the count the scheduler does not have yet. With
// prefetch (the previous task ran at least prefetch_after_ns) the credit goes back to the
// scheduler as soon as a ref is taken: give_prefetch_credit, next. kStopRef: the launch is over.
// `peeked`, when not kStopRef, is ring link.credits's ref, already taken from the doorbell (with
// its acquire) by another thread of the processor, ordered before this call: it stands for the
// first poll. False when the wait ended on an error.
LOOM_HD LOOM_INLINE bool take_next_task(RuntimeState const& s, ProcessorLink& link, Doorbell& bell,
                                        Watchdog& bell_dog, TaskRef& ref,
                                        TaskRef peeked = kStopRef) {
  ref = link.kept;
  link.kept = kStopRef;
  if (ref == kStopRef) {
    // With the credit out, a ring is likely there already (kRingPolls).
    bool rung = link.credit_out && peeked != kStopRef;
    if (rung) ref = peeked;
    for (std::uint32_t i = 0; link.credit_out && !rung && i < kRingPolls; ++i)
      rung = doorbell_poll(bell, link.credits, ref);
    if (!rung) {
      // About to wait: the report says so (a prefetch credit said busy), so that a scheduler
      // with waiting_first hands this processor a task before it hands one to a busy processor.
      if (!link.credit_out)
        hand_over_credit(s, link, true);
      else if (link.completed != link.reported || !link.waiting)
        send_report(s, link, true);
      Heartbeat beat(&s.counters->beat.value);
      if (!doorbell_wait(bell, link.credits, ref, beat, bell_dog)) return false;
    }
    link.credit_out = false;
    if (ref == kStopRef) doorbell_clear(bell);
  }
  if (s.prefetch_after_ns != kNoPrefetch) link.taken_ns = now_ns();
  link.credit_due = ref != kStopRef && !link.credit_out && s.prefetch_after_ns != kNoPrefetch &&
                    link.last_ns >= s.prefetch_after_ns;
  return true;
}

// After take_next_task: hands the prefetch credit to the scheduler if one is due. Separate so
// that the GPU processor sends it while its other warps load the task's descriptor.
LOOM_HD LOOM_INLINE void give_prefetch_credit(RuntimeState const& s, ProcessorLink& link) {
  if (!link.credit_due) return;
  link.credit_due = false;
  hand_over_credit(s, link, false);
}

// After running `task`: counts it and completes it, keeping a released successor when the policy
// allows local dispatch.
LOOM_HD LOOM_INLINE bool finish_task(RuntimeState const& s, ProcessorLink& link, Task const& task,
                                     std::uint64_t epoch, WaiterId who, Watchdog& push_dog,
                                     bool local_dispatch) {
  push_dog.reset();
  if (s.prefetch_after_ns != kNoPrefetch) link.last_ns = now_ns() - link.taken_ns;
  ++link.completed;
  if (complete_task(s, task, epoch, who, push_dog, local_dispatch, link.kept)) return true;
  link.kept = kStopRef;
  return false;
}

// Emits one dynamic task (any thread of any actor). It is counted against the graph's declared
// bound; emitting past the bound is an error.
LOOM_HD LOOM_INLINE bool emit_task(RuntimeState const& s, Task const& task, WaiterId who,
                                   Watchdog& dog) {
  std::uint64_t const n = fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{1});
  if (n >= s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                s.graph.dynamic_bound, n + 1);
    return false;
  }
  chaos_point();
  s.dynamic_tasks[n] = task;
  // The release in queue_push publishes the descriptor written above.
  return make_ready(s, s.graph.task_count + static_cast<TaskRef>(n), task.header.priority, dog);
}

// Emits `n` dynamic tasks, make(i) for i < n, with one bound check and one queue ticket per chunk:
// the way a last arriver releases a whole row of tiles. With `keep` pointing at kStopRef, make(0)
// is written but not queued, and its ref left in *keep for the caller's processor to run next
// (TaskContext::emit_many, keep_first).
template <class MakeFn>
LOOM_HD bool emit_tasks(RuntimeState const& s, std::uint32_t n, MakeFn make, WaiterId who,
                        Watchdog& dog, TaskRef* keep = nullptr) {
  if (n == 0) return true;
  std::uint64_t const first =
      fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{n});
  if (first + n > s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                s.graph.dynamic_bound, first + n);
    return false;
  }
  TaskRef const base = s.graph.task_count + static_cast<TaskRef>(first);
  std::uint32_t const kept = keep != nullptr && *keep == kStopRef ? 1 : 0;
  if (kept) {
    s.dynamic_tasks[first] = make(0);
    *keep = base;
  }
  for (std::uint32_t done = kept; done < n; done += kPushChunk) {
    std::uint32_t const m = n - done < kPushChunk ? n - done : kPushChunk;
    std::uint32_t entries[kPushChunk];
    for (std::uint32_t k = 0; k < m; ++k) {
      Task const task = make(done + k);
      s.dynamic_tasks[first + done + k] = task;
      entries[k] = ready_entry(base + done + k, task.header.priority);
    }
    // The release in queue_push_chunk publishes the descriptors written above.
    if (!queue_push_chunk(
            s.ready, m, [&](std::uint32_t k) { return entries[k]; }, dog))
      return false;
  }
  return true;
}

#if defined(__CUDACC__)
// Device, the whole block calls with the same n: emits make(0) .. make(n-1) under one reservation.
// Thread 0 takes the bound and the queue positions for all n (two atomics); then every thread
// writes every blockDim.x-th descriptor and queue entry and publishes them behind its own fence.
// A few round trips to memory whatever n, where emit_tasks from many threads of one block
// costs each thread its own tickets and fences, and the lanes of a warp take turns (a gather
// that emitted 40 groups of up tiles so ran for 0.6 ms). `keep` as emit_tasks's (the same pointer
// on every thread). False on every thread when it failed.
template <class MakeFn>
__device__ bool emit_tasks_block(RuntimeState const& s, std::uint32_t n, MakeFn make, WaiterId who,
                                 Watchdog& dog, TaskRef* keep = nullptr) {
  if (n == 0) return true;               // n is the same on every thread
  __shared__ std::uint64_t reserved[2];  // dynamic index of make(0), queue position of the first
  __shared__ std::uint32_t kept;         // 1: make(0) is kept, not queued
  __shared__ int failed;
  __syncthreads();  // the previous call's words are read by every thread
  if (threadIdx.x == 0) {
    failed = 0;
    kept = keep != nullptr && *keep == kStopRef ? 1 : 0;
    reserved[0] = fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{n});
    if (reserved[0] + n > s.graph.dynamic_bound) {
      raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                  s.graph.dynamic_bound, reserved[0] + n);
      failed = 1;
    } else {
      if (n > kept) reserved[1] = fetch_add_relaxed(*s.ready.tail, std::uint64_t{n - kept});
      if (kept) *keep = s.graph.task_count + static_cast<TaskRef>(reserved[0]);
    }
  }
  __syncthreads();
  if (failed) return false;
  std::uint64_t const first = reserved[0];
  std::uint32_t const skip = kept;
  std::uint64_t const pos = reserved[1] - skip;  // queue position of task k: pos + k (k >= skip)
  TaskRef const base = s.graph.task_count + static_cast<TaskRef>(first);
  QueueView const q = s.ready;
  // This thread's slots must be free (their previous lap consumed) before it writes them.
  bool ok = true;
  for (std::uint32_t k = threadIdx.x; k < n && ok; k += blockDim.x)
    for (std::uint64_t seen;
         k >= skip && (seen = load_relaxed(q.seq[(pos + k) % q.capacity])) != pos + k;)
      if (!dog.keep_waiting(pos + k, seen)) {
        ok = false;
        break;
      }
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
  for (std::uint32_t k = threadIdx.x; k < n && ok; k += blockDim.x) {
    Task const task = make(k);
    s.dynamic_tasks[first + k] = task;
    if (k >= skip)
      store_relaxed(q.items[(pos + k) % q.capacity], ready_entry(base + k, task.header.priority));
  }
  // The release publishes this thread's descriptors and entries with its seq words (and the kept
  // task's descriptor before the processor reads it).
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
  for (std::uint32_t k = threadIdx.x; k < n && ok; k += blockDim.x)
    if (k >= skip) store_relaxed(q.seq[(pos + k) % q.capacity], pos + k + 1);
  // Not through `failed`: a thread that failed here would store it while a slower thread may
  // still be reading it above (and leave before this barrier).
  return !__syncthreads_or(!ok);
}
#endif

// A shared emission: n dynamic tasks whose bound and queue positions one thread reserves at once
// (reserve_shared_emission), and whose descriptors bodies running at the same time then write,
// each its own indices, in any order (emit_reserved). Task k from `kept` on is queued at the
// reservation's (k - kept)-th position, so the scheduler hands them out in index order whoever
// wrote them and whenever; a task below `kept` is not queued: the body that writes it runs it
// next on its own processor (its keep slot, TaskContext::offer_keep). For bodies that open one
// phase together (a row of tiles known only once they have all finished), so that none emits the
// whole phase alone and the first `kept` tasks start without a trip through the scheduler.
// Every index must be written, or the launch never ends.
struct SharedEmission {
  std::uint64_t first;  // dynamic index of task 0
  std::uint64_t pos;    // queue position of task `kept`
  std::uint32_t n, kept;
};

// One thread: reserves n tasks, `kept` <= n of them kept by their writers. False (the error
// raised) when the bound is exceeded.
LOOM_HD inline bool reserve_shared_emission(RuntimeState const& s, std::uint32_t n,
                                            std::uint32_t kept, WaiterId who, SharedEmission& out) {
  out.n = n;
  out.kept = kept < n ? kept : n;
  out.first = fetch_add_relaxed(s.counters->dynamic_emitted.value, std::uint64_t{n});
  if (out.first + n > s.graph.dynamic_bound) {
    raise_error(*s.error, ErrorCode::dynamic_bound_exceeded, who.actor, who.block, who.rank, 0, 0,
                s.graph.dynamic_bound, out.first + n);
    return false;
  }
  out.pos = fetch_add_relaxed(*s.ready.tail, std::uint64_t{n - out.kept});
  return true;
}

// Any thread: writes task k of reservation e. From e.kept on it goes to its queue position
// (queue_fill, whose release publishes the descriptor); below, its ref goes to *keep, which must
// hold kStopRef (else keep_unavailable is raised). False when it failed.
LOOM_HD inline bool emit_reserved(RuntimeState const& s, SharedEmission const& e, std::uint32_t k,
                                  Task const& task, WaiterId who, Watchdog& dog, TaskRef* keep) {
  TaskRef const ref = s.graph.task_count + static_cast<TaskRef>(e.first + k);
  if (k < e.kept) {
    if (keep == nullptr || *keep != kStopRef) {
      raise_error(*s.error, ErrorCode::keep_unavailable, who.actor, who.block, who.rank, 0, 0, k,
                  e.first + k);
      return false;
    }
    s.dynamic_tasks[e.first + k] = task;
    // Read by this block after the body (its barrier orders the two, as for emit_tasks's kept
    // task): a fence of the block's scope, not the device's.
    cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_block);
    *keep = ref;
    return true;
  }
  s.dynamic_tasks[e.first + k] = task;
  return queue_fill(s.ready, e.pos + (k - e.kept), ready_entry(ref, task.header.priority), dog);
}

// Gives back `n` tasks of the dynamic bound that will never be emitted in this launch (the real
// count became known). Termination waits for completed + retired == static + bound, so every
// emitter must either emit or retire each task of the bound it was given.
LOOM_HD LOOM_INLINE void retire_slack(RuntimeState const& s, std::uint32_t n) {
  if (n != 0) fetch_add_acq_rel(s.counters->retired.value, std::uint64_t{n});
}

// The scheduler's verdict on counters that passed the bound (emitted + retired > bound): tasks
// emitted past it (as the emitter that crossed it reports, whichever of the two records first),
// else slack retired past it.
LOOM_HD LOOM_INLINE ErrorCode bound_passed(std::uint64_t emitted, std::uint64_t bound) {
  return emitted > bound ? ErrorCode::dynamic_bound_exceeded : ErrorCode::retire_overshoot;
}

}  // namespace loom
