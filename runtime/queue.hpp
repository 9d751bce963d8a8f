// Bounded multi-producer, single-consumer queue of 32-bit entries (the ready queue's task refs
// and fan-out entries). Positions only grow, across launches too: slot `pos % capacity` carries a
// sequence word that says whose turn it is (free for pos: seq == pos; full: seq == pos + 1), so
// nothing is reset between launches. Initialise seq[i] = i once, at allocation.
#pragma once

#include "runtime/watchdog.hpp"

namespace loom {

struct QueueView {
  std::uint64_t* tail;   // next position a producer takes (fetch_add)
  std::uint64_t* head;   // next position the consumer reads; written by the consumer only
  std::uint64_t* seq;    // [capacity]
  std::uint32_t* items;  // [capacity]
  std::uint32_t capacity;
  std::uint32_t id;  // named in overflow and watchdog errors
};

// Slot `slot` + `d` of a ring of `capacity` slots, for d <= capacity. Positions grow without end;
// whoever walks a ring keeps the slot beside the position, since each `position % capacity` is a
// 64-bit remainder, a long software sequence on a GPU, paid in latency by a lone thread or warp.
LOOM_HD LOOM_INLINE std::uint32_t ring_slot(std::uint32_t slot, std::uint32_t d,
                                            std::uint32_t capacity) {
  std::uint32_t const at = slot + d;
  return at >= capacity ? at - capacity : at;
}

// Any thread: writes `item` at position `pos`, a ticket taken from the tail, once its slot is free
// for it; the release also publishes what the thread wrote before. Waits (bounded) only when the
// consumer has fallen a full lap behind, which a queue sized for a launch's tasks never does.
// Returns false if the wait ended on an error.
LOOM_HD LOOM_INLINE bool queue_fill(QueueView q, std::uint64_t pos, std::uint32_t item,
                                    Watchdog& dog) {
  std::uint64_t const slot = pos % q.capacity;
  std::uint64_t s;
  while ((s = load_acquire(q.seq[slot])) != pos) {
    if (!dog.keep_waiting(pos, s)) return false;
  }
  store_relaxed(q.items[slot], item);
  store_release(q.seq[slot], pos + 1);
  return true;
}

// Any thread: takes a ticket and fills its position (queue_fill).
LOOM_HD LOOM_INLINE bool queue_push(QueueView q, std::uint32_t item, Watchdog& dog) {
  std::uint64_t const pos = fetch_add_relaxed(*q.tail, std::uint64_t{1});
  chaos_point();  // a producer stalled between its ticket and its write
  return queue_fill(q, pos, item, dog);
}

// Any thread: pushes n <= kPushChunk entries (entry(i) for i < n) under one ticket, so a fan-out
// costs one atomic per chunk instead of one per entry. The slot checks are issued together and
// one fence orders them before the writes.
inline constexpr std::uint32_t kPushChunk = 16;
template <class EntryFn>
LOOM_HD LOOM_INLINE bool queue_push_chunk(QueueView q, std::uint32_t n, EntryFn entry,
                                          Watchdog& dog) {
  std::uint64_t const pos = fetch_add_relaxed(*q.tail, std::uint64_t{n});
  chaos_point();
  // One 64-bit remainder for the chunk; entry i's slot is ring_slot(first, i).
  std::uint32_t const first = static_cast<std::uint32_t>(pos % q.capacity);
  auto const slot = [&](std::uint32_t i) { return ring_slot(first, i, q.capacity); };
  for (;;) {
    // All n loads first, then the checks: one round trip to memory, not n.
    std::uint64_t seq[kPushChunk];
    LOOM_UNROLL
    for (std::uint32_t i = 0; i < kPushChunk; ++i)
      if (i < n) seq[i] = load_relaxed(q.seq[slot(i)]);
    bool free = true;
    std::uint64_t first_busy = 0, seen = 0;
    LOOM_UNROLL
    for (std::uint32_t i = 0; i < kPushChunk; ++i) {
      if (i < n && seq[i] != pos + i && free) {
        free = false;
        first_busy = pos + i;
        seen = seq[i];
      }
    }
    if (free) break;
    if (!dog.keep_waiting(first_busy, seen)) return false;
  }
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
  for (std::uint32_t i = 0; i < n; ++i) store_relaxed(q.items[slot(i)], entry(i));
  cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
  for (std::uint32_t i = 0; i < n; ++i) store_relaxed(q.seq[slot(i)], pos + i + 1);
  return true;
}

// The consumer alone. True and the entry at `pos` when a producer has filled it.
LOOM_HD LOOM_INLINE bool queue_peek(QueueView q, std::uint64_t pos, std::uint32_t& item) {
  std::uint64_t const slot = pos % q.capacity;
  if (load_acquire(q.seq[slot]) != pos + 1) return false;
  item = load_relaxed(q.items[slot]);
  return true;
}

// The consumer alone, after queue_peek succeeded at `pos`: hands the slot back to producers.
LOOM_HD LOOM_INLINE void queue_release(QueueView q, std::uint64_t pos) {
  store_release(q.seq[pos % q.capacity], pos + q.capacity);
}

// The consumer alone: pops one entry if one is there.
LOOM_HD LOOM_INLINE bool queue_try_pop(QueueView q, std::uint32_t& item) {
  std::uint64_t const pos = load_relaxed(*q.head);
  if (!queue_peek(q, pos, item)) return false;
  queue_release(q, pos);
  store_relaxed(*q.head, pos + 1);
  return true;
}

}  // namespace loom
