#include "runtime/cpu_executor.hpp"

#include <cstdlib>
#include <memory>
#include <mutex>

namespace loom {

void HostRankState::Free::operator()(unsigned char* p) const {
  std::free(p);
}

HostRankState::HostRankState(Graph graph, StateOptions const& options)
    : graph_(std::move(graph)), layout_(graph_, options) {
  std::size_t const bytes = (layout_.bytes() + 4095) / 4096 * 4096;
  arena_.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes)));
  if (!arena_) throw Error("loom: out of host memory for the runtime state");
  layout_.initialize(arena_.get());
  state_ = layout_.bind(arena_.get());
}

ErrorRecord HostRankState::take_error() {
  ErrorRecord e = *state_.error;
  return e;
}

void HostRankState::reinitialize(std::uint64_t epoch) {
  layout_.initialize(arena_.get(), epoch);
}

std::vector<TraceRecord> HostRankState::take_trace() {
  std::vector<TraceRecord> out;
  if (!state_.trace) return out;
  std::uint64_t const n = std::min<std::uint64_t>(*state_.trace_count, state_.trace_capacity);
  out.assign(state_.trace, state_.trace + n);
  *state_.trace_count = 0;
  return out;
}

namespace {

// TBB allows the least max_allowed_parallelism of all live global_control objects: a pool that
// held its own would cap every larger pool alive beside it, whose actors then waited for threads
// that never came. The pools share one, raised to the most any of them asked for and never
// lowered: a larger one is made before the smaller one goes. Returns `threads`.
std::size_t allow_parallelism(std::size_t threads) {
  static std::mutex mutex;
  static std::unique_ptr<oneapi::tbb::global_control> control;
  static std::size_t allowed = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (threads <= allowed) return threads;
  auto raised = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, threads);
  control = std::move(raised);
  allowed = threads;
  return threads;
}

}  // namespace

CpuActorPool::CpuActorPool(std::size_t actors)
    : actors_(actors), arena_(static_cast<int>(allow_parallelism(actors + 1)), 1) {
  std::size_t const allowed = oneapi::tbb::global_control::active_value(
      oneapi::tbb::global_control::max_allowed_parallelism);
  if (allowed < actors + 1)
    throw Error("loom: TBB parallelism is limited to " + std::to_string(allowed) +
                " threads elsewhere in this process; the CPU executor needs " +
                std::to_string(actors + 1) + " (one per actor)");
}

}  // namespace loom
