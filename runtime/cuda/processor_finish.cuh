// A GPU processor's side of finish_task (runtime/protocol.hpp), run by the block's first warp: lane
// 0 counts the task and arrives on its event as one thread would; when that arrival is the last,
// the warp releases the successors together, lane i taking successor i.
//
// Thread 0 alone, the release of 16 successors took 17 µs (a traced fused-MLP launch on an H100,
// each last arriver of a row event): the successor and slot words sat in local memory (arrays
// indexed in rolled loops), every slot index was a 64-bit remainder, and each step waited for the
// one before it. Across the warp the successor words are loaded while lane 0 arrives, the gates
// open at once, and the chunk's slots are checked, filled and published in parallel.
#pragma once

#include "runtime/protocol.hpp"

namespace loom {

namespace detail {

// Pushes the entries of the lanes in `lanes` (their `entry`) to the ready queue in lane order,
// under one ticket, as queue_push_chunk does. Whole warp; false on every lane if a wait ended on
// an error.
__device__ __forceinline__ bool push_lanes_warp(RuntimeState const& s, unsigned lanes,
                                                std::uint32_t entry, WaiterId who) {
  unsigned const lane = threadIdx.x % 32;
  QueueView const q = s.ready;
  std::uint64_t pos = 0;
  std::uint32_t first = 0;
  if (lane == 0) {
    pos = fetch_add_relaxed(*q.tail, std::uint64_t{static_cast<unsigned>(__popc(lanes))});
    first = static_cast<std::uint32_t>(pos % q.capacity);
  }
  pos = __shfl_sync(0xFFFFFFFFu, pos, 0);
  first = __shfl_sync(0xFFFFFFFFu, first, 0);
  bool const mine = (lanes >> lane) & 1u;
  std::uint32_t const rank = static_cast<std::uint32_t>(__popc(lanes & ((1u << lane) - 1u)));
  std::uint32_t const slot = ring_slot(first, rank, q.capacity);
  bool ok = true;
  if (mine) {
    Watchdog dog(*s.error, who, s.watchdog_ns, WaitSite::queue_slot, q.id);
    for (std::uint64_t seen; (seen = load_relaxed(q.seq[slot])) != pos + rank;)
      if (!dog.keep_waiting(pos + rank, seen)) {
        ok = false;
        break;
      }
  }
  if (!__all_sync(0xFFFFFFFFu, ok)) return false;
  if (mine) {
    cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
    store_relaxed(q.items[slot], entry);
    // The release publishes this lane's entry (and, through the warp's ordering with lane 0,
    // what the arrival acquired) with its seq word.
    cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
    store_relaxed(q.seq[slot], pos + rank + 1);
  }
  __syncwarp();
  return true;
}

}  // namespace detail

// finish_task for warp 0 of a processor block (every lane calls it with the same arguments; lane 0
// owns `link`); false at once if an error was recorded. Same protocol and order as the one-thread
// version: the beat, the arrival, and for the last arrival the first opened successor kept (local
// dispatch) and the others pushed in successor order under one ticket. A wider fan-out than
// kFanOutAbove goes to the scheduler as one fan-out entry. Returns the same on every lane.
__device__ __forceinline__ bool finish_task_warp(RuntimeState const& s, ProcessorLink& link,
                                                 Task const& task, std::uint64_t epoch,
                                                 WaiterId who, bool local_dispatch) {
  static_assert(kFanOutAbove <= 32, "a warp releases at most 32 successors");
  unsigned const lane = threadIdx.x % 32;
  // The event's descriptor and successor words are the graph's, fixed for the launch: every lane
  // loads its word while lane 0 arrives, so that a last arrival has them at hand.
  EventId const e = task.header.event;
  EventDesc ev{};
  std::uint64_t word = 0;
  if (e != kNoEvent) {
    ev = s.graph.events[e];
    if (lane < ev.succ_end - ev.succ_begin && ev.succ_end - ev.succ_begin <= kFanOutAbove)
      word = s.graph.successors[ev.succ_begin + lane];
  }
  int outcome = 0;  // 0: done, 1: failed, 2: release ev's successors
  int local = 0;
  if (lane == 0 && has_error(*s.error)) {
    outcome = 1;
  } else if (lane == 0) {
    if (s.prefetch_after_ns != kNoPrefetch) link.last_ns = now_ns() - link.taken_ns;
    ++link.completed;
    link.kept = kStopRef;
    fetch_add_relaxed(s.counters->beat.value, std::uint64_t{1});
    if (e != kNoEvent) {
      local = local_dispatch &&
              load_relaxed(*s.ready.tail) == load_relaxed(s.counters->drained_at.value);
      Arrival const arrival = count_arrival(s, e, ev, epoch, who);
      if (arrival == Arrival::failed) {
        outcome = 1;
      } else if (arrival == Arrival::last) {
        // One successor (a chain's link) is lane 0's alone: the warp's shuffles would only add
        // to the hop.
        std::uint32_t const m = ev.succ_end - ev.succ_begin;
        std::uint32_t const entry = static_cast<std::uint32_t>(word);
        std::uint32_t const gates = static_cast<std::uint32_t>(word >> 32);
        if (m == 1 && gate_opened(s, entry & kRefMask, gates, epoch)) {
          if (local) {
            link.kept = entry & kRefMask;
          } else {
            Watchdog dog(*s.error, who, s.watchdog_ns, WaitSite::queue_slot, s.ready.id);
            outcome = queue_push(s.ready, entry, dog) ? 0 : 1;
          }
        } else if (m > kFanOutAbove) {
          Watchdog dog(*s.error, who, s.watchdog_ns, WaitSite::queue_slot, s.ready.id);
          outcome = queue_push(s.ready, fanout_entry(e), dog) ? 0 : 1;
        } else if (m > 1) {
          outcome = 2;
        }
      }
    }
  }
  outcome = __shfl_sync(0xFFFFFFFFu, outcome, 0);
  if (outcome != 2) return outcome == 0;
  // Lane 0's acquire (the arrival) is ordered before every lane's gate and push below by the
  // warp's shuffles.
  local = __shfl_sync(0xFFFFFFFFu, local, 0);
  std::uint32_t const m = ev.succ_end - ev.succ_begin;
  std::uint32_t const entry = static_cast<std::uint32_t>(word);
  bool const open =
      lane < m && gate_opened(s, entry & kRefMask, static_cast<std::uint32_t>(word >> 32), epoch);
  unsigned lanes = __ballot_sync(0xFFFFFFFFu, open);
  if (local && lanes != 0) {
    TaskRef const kept = __shfl_sync(0xFFFFFFFFu, entry & kRefMask, __ffs(lanes) - 1);
    if (lane == 0) link.kept = kept;
    lanes &= lanes - 1;
  }
  bool const ok = lanes == 0 || detail::push_lanes_warp(s, lanes, entry, who);
  if (!ok && lane == 0) link.kept = kStopRef;
  return ok;
}

// Warp 1 of a processor block while warp 0 finishes the task (finish_task_warp): with a prefetch
// credit out, the ring it asked for is usually on the doorbell already. Lane 0 takes that ring
// (one acquiring poll) and the warp loads its descriptor into `next`, so that the next
// take_next_task skips its poll and the block its descriptor load: two round trips to memory that
// otherwise followed the finish's own. `peeked` is the ring's ref, or kStopRef when there was none
// (or a stop, which thread 0 takes itself). Reads only link.credits and link.credit_out, which the
// finish does not write. Whole warp; no wait.
__device__ __forceinline__ void peek_ring_warp(RuntimeState const& s, ProcessorLink const& link,
                                               Doorbell const& bell, Task& next, TaskRef& peeked) {
  constexpr std::uint32_t kWords = sizeof(Task) / sizeof(uint4);
  static_assert(kWords <= 32);
  unsigned const lane = threadIdx.x % 32;
  TaskRef ref = kStopRef;
  if (lane == 0 && link.credit_out && !doorbell_poll(bell, link.credits, ref)) ref = kStopRef;
  ref = __shfl_sync(0xFFFFFFFFu, ref, 0);
  __syncwarp();  // orders the other lanes' descriptor loads after lane 0's acquire
  if (ref != kStopRef && lane < kWords)
    reinterpret_cast<uint4*>(&next)[lane] =
        __ldcg(reinterpret_cast<uint4 const*>(&s.task(ref)) + lane);
  if (lane == 0) peeked = ref;
}

}  // namespace loom
