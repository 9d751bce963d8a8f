#include "runtime/error.hpp"

#include <sstream>

namespace loom {

char const* to_string(Actor a) {
  switch (a) {
    case Actor::none:
      return "nobody";
    case Actor::processor:
      return "processor";
    case Actor::scheduler:
      return "scheduler";
    case Actor::subscriber:
      return "subscriber";
    case Actor::task:
      return "task body";
    case Actor::host:
      return "host";
  }
  return "unknown actor";
}

char const* to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::none:
      return "no error";
    case ErrorCode::watchdog:
      return "watchdog expired";
    case ErrorCode::dynamic_bound_exceeded:
      return "dynamic task bound exceeded";
    case ErrorCode::retire_overshoot:
      return "retired more dynamic slack than the bound leaves";
    case ErrorCode::event_overshoot:
      return "event received more arrivals than expected";
    case ErrorCode::event_incomplete:
      return "event still incomplete at termination";
    case ErrorCode::task_assert:
      return "task check failed";
    case ErrorCode::bad_task_type:
      return "task type not in the pipeline";
    case ErrorCode::queue_overflow:
      return "queue overflow";
    case ErrorCode::keep_unavailable:
      return "a body kept a task where its processor had no free keep slot";
  }
  return "unknown error";
}

char const* to_string(WaitSite w) {
  switch (w) {
    case WaitSite::none:
      return "nothing";
    case WaitSite::doorbell:
      return "its doorbell (next task)";
    case WaitSite::queue_slot:
      return "a free queue slot";
    case WaitSite::scheduler_progress:
      return "any task to complete or become ready";
    case WaitSite::actors_started:
      return "every actor to start";
    case WaitSite::signal:
      return "a signal from peer rank";
    case WaitSite::subscriber_poll:
      return "arrivals";
    case WaitSite::sibling_tasks:
      return "other tasks of its launch";
  }
  return "unknown wait";
}

std::string describe(ErrorRecord const& e, char const* const* type_names,
                     std::uint32_t type_count) {
  std::ostringstream os;
  auto const code = static_cast<ErrorCode>(e.code);
  auto const actor = static_cast<Actor>(e.actor);
  os << "loom: " << to_string(code) << " in " << to_string(actor) << " (block " << e.block
     << ", rank " << e.rank << ")";
  auto type_name = [&](std::uint32_t t) -> std::string {
    if (type_names && t < type_count) return type_names[t];
    return "type #" + std::to_string(t);
  };
  switch (code) {
    case ErrorCode::watchdog:
      if (static_cast<WaitSite>(e.site) == WaitSite::scheduler_progress) {
        os << ": no task completed or became ready within the watchdog bound; ";
        if (e.object != 0xFFFFFFFFu)
          os << "event " << e.object << " expected " << e.expected
             << " arrivals in this launch, saw " << e.seen;
        else
          os << "expected " << e.expected << " tasks completed or retired, saw " << e.seen
             << " (part of the dynamic bound was neither emitted nor retired)";
      } else if (static_cast<WaitSite>(e.site) == WaitSite::signal) {
        os << ": waited on a signal from peer rank " << e.object << ", expected " << e.expected
           << ", saw " << e.seen;
      } else {
        os << ": waited on " << to_string(static_cast<WaitSite>(e.site)) << " #" << e.object
           << ", expected " << e.expected << ", saw " << e.seen;
      }
      break;
    case ErrorCode::event_overshoot:
    case ErrorCode::event_incomplete:
      os << ": event " << e.object << " expected " << e.expected << " arrivals, saw " << e.seen;
      break;
    case ErrorCode::task_assert:
      os << ": " << type_name(e.object) << " at line " << e.site << " (values " << e.expected
         << ", " << e.seen << ")";
      break;
    case ErrorCode::bad_task_type:
      os << ": descriptor names type " << e.object << ", pipeline has " << e.expected;
      break;
    case ErrorCode::dynamic_bound_exceeded:
    case ErrorCode::retire_overshoot:
      os << ": bound " << e.expected << ", reached " << e.seen;
      break;
    case ErrorCode::queue_overflow:
      os << ": queue #" << e.object << " capacity " << e.expected << ", position " << e.seen;
      break;
    case ErrorCode::keep_unavailable:
      os << ": dynamic task " << e.seen << " of a shared emission";
      break;
    case ErrorCode::none:
      break;
  }
  return os.str();
}

}  // namespace loom
