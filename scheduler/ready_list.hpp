// The scheduler's private list of ready tasks: one FIFO ring per level of the policy, over storage
// sized for a whole launch, so it can never overflow. Positions restart at zero every launch, with
// the graph's roots already in place (see kReadyRings). Used by the scheduler actor alone,
// single-threaded.
#pragma once

#include "runtime/state.hpp"

namespace loom {

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
