// Thin, named atomics over cuda::atomic_ref, identical on host and device. Every protocol word
// goes through these so the memory order of each access is spelled out where it is used.
#pragma once

#include <cuda/atomic>

#include "runtime/config.hpp"

namespace loom {

// Device scope orders accesses among the blocks of one GPU (and among host threads on the CPU
// executor, where libcu++ maps it to std::atomic); system scope is for words other GPUs write.
using DeviceScope = cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device>;

template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE T load_acquire(T const& word) {
  return cuda::atomic_ref<T, S>(const_cast<T&>(word)).load(cuda::memory_order_acquire);
}
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE T load_relaxed(T const& word) {
  return cuda::atomic_ref<T, S>(const_cast<T&>(word)).load(cuda::memory_order_relaxed);
}
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE void store_release(T& word, T value) {
  cuda::atomic_ref<T, S>(word).store(value, cuda::memory_order_release);
}
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE void store_relaxed(T& word, T value) {
  cuda::atomic_ref<T, S>(word).store(value, cuda::memory_order_relaxed);
}
// Returns the value before the addition; acquire-release so the last arriver of an event sees
// everything the earlier arrivers wrote before they arrived.
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE T fetch_add_acq_rel(T& word, T value) {
  return cuda::atomic_ref<T, S>(word).fetch_add(value, cuda::memory_order_acq_rel);
}
// Release only: what this thread wrote (or saw happen before, e.g. through a block barrier)
// before the addition is visible to whoever acquires the word after it.
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE T fetch_add_release(T& word, T value) {
  return cuda::atomic_ref<T, S>(word).fetch_add(value, cuda::memory_order_release);
}
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE T fetch_add_relaxed(T& word, T value) {
  return cuda::atomic_ref<T, S>(word).fetch_add(value, cuda::memory_order_relaxed);
}
template <class T, cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE bool compare_exchange(T& word, T& expected, T desired) {
  return cuda::atomic_ref<T, S>(word).compare_exchange_strong(expected, desired,
                                                              cuda::memory_order_acq_rel);
}

// Orders this thread's later reads after the relaxed reads before it (which saw released values).
template <cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE void fence_acquire() {
  cuda::atomic_thread_fence(cuda::memory_order_acquire, S);
}

// With a relaxed store after it, a release: what this thread wrote (or saw happen before) before
// the fence is visible to whoever acquires a word it stores after the fence.
template <cuda::thread_scope S = cuda::thread_scope_device>
LOOM_HD LOOM_INLINE void fence_release() {
  cuda::atomic_thread_fence(cuda::memory_order_release, S);
}

}  // namespace loom
