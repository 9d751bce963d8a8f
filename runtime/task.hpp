// The task descriptor: what a processor copies into shared memory and runs. Fixed size,
// 16-byte aligned, trivially copyable, so it moves as four uint4 loads.
#pragma once

#include <cstring>
#include <type_traits>

#include "runtime/config.hpp"

namespace loom {

struct TaskHeader {
  std::uint16_t type;     // index of the task type in the pipeline's list
  std::uint8_t flags;     // reserved for task types; the runtime does not read it
  std::uint8_t priority;  // scheduling level for the priority policy (higher runs first)
  std::uint32_t id;       // user-visible id (graph task id, or whatever the emitter chooses)
  EventId event;          // event this task completes, or kNoEvent
  std::uint32_t aux;      // free for the task type (e.g. a tile index)
};
static_assert(sizeof(TaskHeader) == 16);

inline constexpr std::size_t kTaskBytes = 64;
inline constexpr std::size_t kPayloadBytes = kTaskBytes - sizeof(TaskHeader);

struct alignas(16) Task {
  TaskHeader header;
  alignas(8) unsigned char payload[kPayloadBytes];

  // Typed view of the payload. The payload is stored with memcpy semantics, so any trivially
  // copyable struct of at most kPayloadBytes can be carried.
  template <class P>
  LOOM_HD LOOM_INLINE P const& as() const {
    static_assert(std::is_trivially_copyable_v<P> && sizeof(P) <= kPayloadBytes,
                  "a payload must be trivially copyable and fit in Task::payload");
    static_assert(alignof(P) <= 8, "payload alignment above 8 bytes is not supported");
    return *reinterpret_cast<P const*>(payload);
  }
};
static_assert(sizeof(Task) == kTaskBytes, "the descriptor size is part of the protocol");
static_assert(alignof(Task) == 16);
static_assert(std::is_trivially_copyable_v<Task>);

template <class P>
LOOM_HD LOOM_INLINE Task encode_task(std::uint16_t type, P const& payload,
                                     EventId completes = kNoEvent, std::uint32_t id = 0,
                                     std::uint8_t priority = 0) {
  static_assert(std::is_trivially_copyable_v<P> && sizeof(P) <= kPayloadBytes,
                "a payload must be trivially copyable and fit in Task::payload");
  Task t{};
  t.header.type = type;
  t.header.flags = 0;
  t.header.priority = priority;
  t.header.id = id;
  t.header.event = completes;
  t.header.aux = 0;
  std::memcpy(t.payload, &payload, sizeof(P));
  return t;
}

}  // namespace loom
