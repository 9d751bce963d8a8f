// The scheduler's private list of ready tasks: one FIFO ring per level of the policy, over storage
// sized for a whole launch, so it can never overflow. Positions restart at zero every launch, with
// the graph's roots already in place (see kReadyRings). Used by the scheduler actor alone,
// single-threaded, but for the root prefix, which the processors read as a launch starts.
#pragma once

#include "runtime/state.hpp"

namespace loom {

// A launch's first tasks go out without a ring: processor p < start_roots(s) runs the p-th root
// in the policy's order (highest level first, graph order within a level), the one the scheduler
// would have rung on its first credit, and the scheduler drops those roots from its list
// (drop(start_roots(s))). It keeps every processor's first credit, which it may ring with the next
// ready task as a prefetch. The roots sit at the start of the rings for the whole launch.
LOOM_HD LOOM_INLINE std::uint32_t start_roots(RuntimeState const& s) {
  return s.graph.root_count < s.processors ? s.graph.root_count : s.processors;
}
// The scheduler's credits at a launch's start, oldest first: position i of its ring of credits
// holds this processor's first credit. The processors without a root come first, those running
// their roots after them, so that a task emitted while the roots run goes to a processor that
// waits rather than behind a root, as when the roots were rung and their processors' prefetch
// credits came in after the others.
LOOM_HD LOOM_INLINE std::uint32_t first_credit_at(RuntimeState const& s, std::uint32_t i) {
  return (i + start_roots(s)) % s.processors;
}
template <class Policy>
LOOM_HD LOOM_INLINE TaskRef start_root(RuntimeState const& s, std::uint32_t processor) {
  if (processor >= start_roots(s)) return kStopRef;
  for (std::uint32_t l = Policy::levels; l-- > 0;) {
    std::uint32_t const ring = Policy::first_ring + l, roots = s.graph.ring_roots[ring];
    if (processor < roots) return s.ready_list[ring * s.task_capacity() + processor];
    processor -= roots;
  }
  return kStopRef;
}

template <class Policy>
class ReadyList {
 public:
  static_assert(Policy::first_ring + Policy::levels <= kReadyRings);

  LOOM_HD ReadyList(RuntimeState const& s)
      : storage_(s.ready_list + Policy::first_ring * s.task_capacity()),
        capacity_(s.task_capacity()) {
    for (std::uint32_t l = 0; l < Policy::levels; ++l) {
      head_[l] = 0;
      tail_[l] = s.graph.ring_roots[Policy::first_ring + l];
    }
  }

  LOOM_HD LOOM_INLINE void push(std::uint32_t entry) {
    std::uint32_t const l = Policy::level(entry >> kLevelShift);
    storage_[l * capacity_ + tail_[l] % capacity_] = entry & kRefMask;
    ++tail_[l];
  }

  LOOM_HD LOOM_INLINE bool empty() const {
    for (std::uint32_t l = 0; l < Policy::levels; ++l)
      if (head_[l] != tail_[l]) return false;
    return true;
  }

  LOOM_HD LOOM_INLINE std::uint64_t size() const {
    std::uint64_t n = 0;
    for (std::uint32_t l = 0; l < Policy::levels; ++l) n += tail_[l] - head_[l];
    return n;
  }

  // Drops the first n tasks pop() would return (n <= size()).
  LOOM_HD LOOM_INLINE void drop(std::uint64_t n) {
    for (std::uint32_t l = Policy::levels; l-- > 0 && n != 0;) {
      std::uint64_t const m = tail_[l] - head_[l] < n ? tail_[l] - head_[l] : n;
      head_[l] += m;
      n -= m;
    }
  }

  // Highest level first; FIFO within a level. Precondition: !empty().
  LOOM_HD LOOM_INLINE TaskRef pop() {
    for (std::uint32_t l = Policy::levels; l-- > 0;) {
      if (head_[l] != tail_[l]) {
        TaskRef const ref = storage_[l * capacity_ + head_[l] % capacity_];
        ++head_[l];
        return ref;
      }
    }
    return kStopRef;
  }

 private:
  std::uint32_t* storage_;
  std::uint32_t capacity_;
  std::uint64_t head_[Policy::levels];
  std::uint64_t tail_[Policy::levels];
};

}  // namespace loom
