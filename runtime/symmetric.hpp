// The symmetric heap as actors see it: one allocation per rank with the same layout, so an
// address in this rank's heap names the same object in every peer's. put copies bytes into a
// peer's heap, signal publishes them (release), wait acquires them (bounded). The same view serves
// the CPU executor (ranks are host allocations in one process) and the GPU (peer bases are
// load/store-accessible pointers into each rank's window).
#pragma once

#include <cstring>

#include "runtime/watchdog.hpp"

namespace loom {

// Host only: appends one remote write to a RemoteWriteLog (runtime/symmetric_layout.hpp).
void record_remote_write(void* log, std::uint32_t writer, std::uint32_t target,
                         std::uint64_t offset, std::uint64_t bytes);

struct SymmetricView {
  unsigned char* bases[kMaxRanks];
  std::uint64_t bytes;
  std::uint32_t rank;
  std::uint32_t world;
  void* write_log = nullptr;  // host only: a RemoteWriteLog that put_serial reports to

  template <class T>
  LOOM_HD LOOM_INLINE T* peer(std::uint32_t r, T* local) const {
    auto const offset = reinterpret_cast<unsigned char const*>(local) - bases[rank];
    return reinterpret_cast<T*>(bases[r] + offset);
  }
  template <class T>
  LOOM_HD LOOM_INLINE T* at(std::uint32_t r, std::uint64_t offset) const {
    return reinterpret_cast<T*>(bases[r] + offset);
  }
  template <class T>
  LOOM_HD LOOM_INLINE T* local(std::uint64_t offset) const {
    return at<T>(rank, offset);
  }

  // Copies `bytes` to the same place in rank r's heap as `dst_local` is in ours. On the host one
  // thread copies; on the device see the cooperative overload in runtime/cuda/symmetric.cuh.
  LOOM_HD LOOM_INLINE void put_serial(std::uint32_t r, void* dst_local, void const* src,
                                      std::uint64_t n) const {
    std::memcpy(peer(r, dst_local), src, n);
#if !LOOM_DEVICE_PASS
    if (write_log)
      record_remote_write(write_log, rank, r,
                          static_cast<std::uint64_t>(static_cast<unsigned char*>(dst_local) -
                                                     bases[rank]),
                          n);
#endif
  }

  // Release-ordered store of `value` into rank r's copy of `flag_local`: everything this thread
  // wrote before (its puts included) is visible to a thread that acquires the flag.
  LOOM_HD LOOM_INLINE void signal_set(std::uint32_t r, std::uint64_t* flag_local,
                                      std::uint64_t value) const {
    store_release<std::uint64_t, cuda::thread_scope_system>(*peer(r, flag_local), value);
  }
  LOOM_HD LOOM_INLINE void signal_add(std::uint32_t r, std::uint64_t* flag_local,
                                      std::uint64_t value) const {
    fetch_add_acq_rel<std::uint64_t, cuda::thread_scope_system>(*peer(r, flag_local), value);
  }

  // Acquire-load of a local flag; true once it reaches `at_least`.
  LOOM_HD LOOM_INLINE static bool arrived(std::uint64_t const* flag_local, std::uint64_t at_least) {
    return load_acquire<std::uint64_t, cuda::thread_scope_system>(*flag_local) >= at_least;
  }

  // Bounded wait for a local flag to reach `at_least`; `from_peer` is named in the error.
  LOOM_HD LOOM_INLINE static bool wait(std::uint64_t const* flag_local, std::uint64_t at_least,
                                       Watchdog& dog) {
    std::uint64_t seen;
    while ((seen = load_acquire<std::uint64_t, cuda::thread_scope_system>(*flag_local)) <
           at_least) {
      if (!dog.keep_waiting(at_least, seen)) return false;
    }
    return true;
  }
};

}  // namespace loom
