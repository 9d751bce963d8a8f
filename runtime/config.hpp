// Compile-time switches shared by every header that is compiled for both host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__
#define LOOM_DEVICE __device__
#define LOOM_INLINE __forceinline__
#else
#define LOOM_HD
#define LOOM_DEVICE
#define LOOM_INLINE inline
#endif

// Unrolls the next loop in device code (host compilers do not know the pragma).
// LOOM_NO_UNROLL keeps the next loop rolled (see arrive in runtime/protocol.hpp).
#if defined(__CUDA_ARCH__)
#define LOOM_UNROLL _Pragma("unroll")
#define LOOM_NO_UNROLL _Pragma("unroll 1")
#else
#define LOOM_UNROLL
#define LOOM_NO_UNROLL
#endif

// True while compiling the device side of a .cu translation unit.
#if defined(__CUDA_ARCH__)
#define LOOM_DEVICE_PASS 1
#else
#define LOOM_DEVICE_PASS 0
#endif

namespace loom {

// Reference to a task: an index into the static task table [0, static_tasks) or into the dynamic
// arena [static_tasks, static_tasks + dynamic_bound). The top two bits of a queue entry carry the
// scheduling level and bit 29 marks a fan-out entry (an event whose successors the scheduler
// releases), so a reference itself is at most 29 bits.
using TaskRef = std::uint32_t;
using EventId = std::uint32_t;
using TaskId = std::uint32_t;

inline constexpr TaskRef kRefMask = 0x3FFFFFFFu;  // an entry without its level
inline constexpr std::uint32_t kFanOutFlag = 1u << 29;
inline constexpr std::uint32_t kMaxTasksPerLaunch = kFanOutFlag - 1;  // refs 0 .. this - 1
inline constexpr std::uint32_t kMaxEventsPerLaunch = kFanOutFlag;     // ids 0 .. this - 1
inline constexpr TaskRef kStopRef = 0xFFFFFFFFu;                      // doorbell: leave the loop
inline constexpr EventId kNoEvent = 0xFFFFFFFFu;
inline constexpr int kMaxRanks = 8;

}  // namespace loom
