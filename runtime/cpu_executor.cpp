#include "runtime/cpu_executor.hpp"

#include <cstdlib>

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

CpuActorPool::CpuActorPool(std::size_t actors)
    : actors_(actors),
      parallelism_(oneapi::tbb::global_control::max_allowed_parallelism, actors + 1),
      arena_(static_cast<int>(actors + 1), 1) {
  std::size_t const allowed = oneapi::tbb::global_control::active_value(
      oneapi::tbb::global_control::max_allowed_parallelism);
  if (allowed < actors + 1)
    throw Error("loom: TBB parallelism is limited to " + std::to_string(allowed) +
                " threads elsewhere in this process; the CPU executor needs " +
                std::to_string(actors + 1) + " (one per actor)");
}

}  // namespace loom
