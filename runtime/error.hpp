// Errors. On the host: one exception type whose message a user can act on. Inside a launch: an
// error record that the first failing actor fills; every other actor sees it in its next
// spin-wait and leaves its loop, and the host turns the record into a loom::Error.
#pragma once

#include <stdexcept>
#include <string>

#include "runtime/atomic.hpp"

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Actor : std::uint32_t { none = 0, processor, scheduler, subscriber, task, host };

enum class ErrorCode : std::uint32_t {
  none = 0,
  watchdog,                // a spin-wait outlived its bound
  dynamic_bound_exceeded,  // more dynamic tasks emitted than the declared bound
  retire_overshoot,        // more slack retired than the bound left
  event_overshoot,         // an event received more arrivals than its expected count
  event_incomplete,        // at termination an event had fewer arrivals than expected
  task_assert,             // a task body's check failed
  bad_task_type,           // a descriptor names a type the pipeline does not have
  queue_overflow,          // a queue was pushed past its capacity
  keep_unavailable,        // a body kept a task where its processor had no free keep slot
};

// What a spin-wait waited on; named in the error message.
enum class WaitSite : std::uint32_t {
  none = 0,
  doorbell,            // processor waiting for its next task
  queue_slot,          // producer waiting for a queue slot to free
  scheduler_progress,  // scheduler: no task completed or became ready
  actors_started,      // scheduler waiting for every actor's first report
  signal,              // wait on a symmetric-heap flag (object = peer rank)
  subscriber_poll,     // subscriber waiting for arrivals
  sibling_tasks,       // a task body waiting for other tasks of its launch (object: its index)
};

char const* to_string(Actor a);
char const* to_string(ErrorCode c);
char const* to_string(WaitSite w);

struct ErrorRecord {
  std::uint32_t code;  // ErrorCode; 0 while no error; kClaimed while the first writer fills it
  std::uint32_t actor;
  std::uint32_t block;  // block index on the GPU, actor thread index on the CPU executor
  std::uint32_t rank;
  std::uint32_t site;    // WaitSite for watchdog errors, source line for task_assert
  std::uint32_t object;  // event id, processor, peer rank, task type ... (depends on the site)
  std::uint64_t expected;
  std::uint64_t seen;
};
inline constexpr std::uint32_t kClaimed = 0xFFFFFFFFu;

LOOM_HD LOOM_INLINE bool has_error(ErrorRecord const& e) {
  return load_relaxed(e.code) != 0;
}

// Records the first error of a launch; later calls are ignored. Callable by any thread.
LOOM_HD LOOM_INLINE void raise_error(ErrorRecord& e, ErrorCode code, Actor actor,
                                     std::uint32_t block, std::uint32_t rank, std::uint32_t site,
                                     std::uint32_t object, std::uint64_t expected,
                                     std::uint64_t seen) {
  std::uint32_t idle = 0;
  if (!compare_exchange(e.code, idle, kClaimed)) return;
  e.actor = static_cast<std::uint32_t>(actor);
  e.block = block;
  e.rank = rank;
  e.site = site;
  e.object = object;
  e.expected = expected;
  e.seen = seen;
  store_release(e.code, static_cast<std::uint32_t>(code));
}

// Renders a filled record; `type_name` maps a task type id to its name (may be null).
std::string describe(ErrorRecord const& e, char const* const* type_names = nullptr,
                     std::uint32_t type_count = 0);

}  // namespace loom
