// Shared pieces of the host suites: seeded randomness that reports its seed, a recorder that task
// bodies stamp (how often, in what order, in which launch each task ran), the test task types and
// the pipeline that carries them, and a helper that captures a loom::Error's message.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/runtime.hpp"
#include "runtime/state_image.hpp"
#include "tests/seed.hpp"

namespace loom::test {

// A test fixture with a fresh seed, named in every failure of the test, and a generator on it.
class SeededTest : public ::testing::Test {
 protected:
  TracedSeed const seed;
  std::mt19937 rng{seed};
};

// A RuntimeState laid out and initialised in host memory, as a launch would find it: for calling
// host bodies outside a launch (a trivial graph by default) and for reading the launch's words.
class HostState {
 public:
  explicit HostState(Graph graph = GraphBuilder{}.build(), StateOptions const& options = {})
      : graph_(std::move(graph)), layout_(graph_, options) {
    arena_.resize(layout_.bytes() + 128);
    void* base = arena_.data() + (128 - reinterpret_cast<std::uintptr_t>(arena_.data()) % 128);
    layout_.initialize(base);
    state_ = layout_.bind(base);
  }
  HostState(HostState const&) = delete;  // the layout refers to graph_
  HostState& operator=(HostState const&) = delete;
  RuntimeState const& state() const { return state_; }

 private:
  Graph graph_;
  StateLayout layout_;
  std::vector<unsigned char> arena_;
  RuntimeState state_;
};

// Runs fn; returns the loom::Error message it threw, or a marker saying it threw none.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (Error const& e) {
    return e.what();
  }
  return "<no loom::Error thrown>";
}

// Runs fn; success if it throws no loom::Error (its message otherwise).
template <class Fn>
::testing::AssertionResult succeeds(Fn&& fn) {
  try {
    fn();
  } catch (Error const& e) {
    return ::testing::AssertionFailure() << "loom::Error: " << e.what();
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult mentions(std::string const& message, std::string const& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "message \"" << message << "\" does not mention \"" << part << "\"";
}

// What task bodies write: per task slot, how many times it ran in this launch, a start and an end
// ticket from one global counter (so "b started after a ended" is start[b] > end[a]), and the
// epoch it saw. poison() before every launch.
class Recorder {
 public:
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

  explicit Recorder(std::size_t slots)
      : slots_(slots),
        runs_(new std::atomic<std::uint32_t>[slots]),
        start_(new std::atomic<std::uint64_t>[slots]),
        end_(new std::atomic<std::uint64_t>[slots]),
        epoch_(new std::atomic<std::uint64_t>[slots]) {
    poison();
  }

  void poison() {
    ticket_.store(1);
    for (std::size_t i = 0; i < slots_; ++i) {
      runs_[i].store(0);
      start_[i].store(kNever);
      end_[i].store(kNever);
      epoch_[i].store(kNever);
    }
  }

  // Called by task bodies. An out-of-range slot is counted, never written.
  void stamp(std::uint32_t slot, TaskContext const& ctx) {
    if (slot >= slots_) {
      out_of_range_.fetch_add(1);
      return;
    }
    runs_[slot].fetch_add(1);
    start_[slot].store(ticket_.fetch_add(1));
    epoch_[slot].store(ctx.epoch());
    end_[slot].store(ticket_.fetch_add(1));
  }

  std::size_t slots() const { return slots_; }
  std::uint32_t runs(std::size_t i) const { return runs_[i].load(); }
  std::uint64_t start(std::size_t i) const { return start_[i].load(); }
  std::uint64_t end(std::size_t i) const { return end_[i].load(); }
  std::uint64_t epoch(std::size_t i) const { return epoch_[i].load(); }
  std::uint64_t out_of_range() const { return out_of_range_.load(); }

 private:
  std::size_t slots_;
  std::atomic<std::uint64_t> ticket_{1};
  std::atomic<std::uint64_t> out_of_range_{0};
  std::unique_ptr<std::atomic<std::uint32_t>[]> runs_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> start_, end_, epoch_;
};

// ---- Test task types -------------------------------------------------------------------------
// Host bodies only: tests/cpu is compiled by the host compiler alone.

// Stamps its recorder slot.
struct Stamp {
  static constexpr char const* name = "stamp";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    Recorder* recorder;
    std::uint32_t slot;
  };
  static void host(Payload const& p, TaskContext& ctx) { p.recorder->stamp(p.slot, ctx); }
};

// Stamps its own slot, then emits *count dynamic Stamp tasks (slots first_child ...) that complete
// child_event, and gives back the rest of its share `bound` of the dynamic bound. If top_up_event
// is an event, it also arrives on it once for each child it did not emit, so an event that expects
// `bound` child arrivals fires whatever the real count (a self-correcting count). extra_retire
// retires more than it should (to provoke the overshoot error).
struct Emitter {
  static constexpr char const* name = "emitter";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 1024;
  struct Payload {
    Recorder* recorder;
    std::uint32_t const* count;
    std::uint32_t slot;
    std::uint32_t bound;
    std::uint32_t first_child;
    EventId child_event;
    EventId top_up_event;
    std::uint32_t extra_retire;
  };
  static void host(Payload const& p, TaskContext& ctx);
};

// Raises a task check failure when *trigger is non-zero; otherwise does nothing. TaskContext::fail
// wants the failing task's type id, which a task type cannot know by itself (its id is its
// position in whichever pipeline lists it), so the maker puts it in the payload: use
// checked_fail_task<Pipeline>().
struct CheckedFail {
  static constexpr char const* name = "checked_fail";
  static constexpr unsigned threads = 96;
  static constexpr unsigned shared_bytes = 4096;
  struct Payload {
    std::uint32_t const* trigger;
    std::uint32_t type;  // this type's id in the pipeline that runs it
  };
  static void host(Payload const& p, TaskContext& ctx);
};

// Payload layouts of several shapes, for the descriptor round trip.
struct Wide {
  static constexpr char const* name = "wide";
  static constexpr unsigned threads = 256;
  static constexpr unsigned shared_bytes = 512;
  struct Payload {
    double values[6];  // exactly kPayloadBytes
  };
  static void host(Payload const&, TaskContext&) {}
};

using TestPipeline = Pipeline<Stamp, Emitter, CheckedFail, Wide>;

inline void Emitter::host(Payload const& p, TaskContext& ctx) {
  p.recorder->stamp(p.slot, ctx);
  std::uint32_t const n = *p.count;
  for (std::uint32_t i = 0; i < n; ++i) {
    Task const child = TestPipeline::make_dynamic<Stamp>(
        Stamp::Payload{p.recorder, p.first_child + i}, p.child_event, p.first_child + i);
    if (!ctx.emit(child)) return;
  }
  if (n < p.bound) {
    ctx.retire(p.bound - n);
    if (p.top_up_event != kNoEvent)
      for (std::uint32_t i = n; i < p.bound; ++i)
        if (!ctx.arrive(p.top_up_event)) return;
  }
  if (p.extra_retire != 0) ctx.retire(p.extra_retire);
}

inline void CheckedFail::host(Payload const& p, TaskContext& ctx) {
  if (*p.trigger != 0) ctx.fail(p.type, __LINE__, *p.trigger, 42);
}

template <class P>
Task checked_fail_task(std::uint32_t const* trigger, EventId completes = kNoEvent) {
  return P::template make<CheckedFail>(CheckedFail::Payload{trigger, P::template id<CheckedFail>},
                                       completes);
}

inline Task stamp_task(Recorder& r, std::uint32_t slot, EventId completes = kNoEvent,
                       std::uint8_t priority = 0) {
  return TestPipeline::make<Stamp>(Stamp::Payload{&r, slot}, completes, slot, priority);
}

inline CpuOptions options_with(std::uint32_t processors, std::uint64_t chaos_seed = 0) {
  CpuOptions o;
  o.processors = processors;
  o.chaos_seed = chaos_seed;
  return o;
}

inline std::vector<Graph> one_rank(Graph g) {
  std::vector<Graph> graphs;
  graphs.push_back(std::move(g));
  return graphs;
}

}  // namespace loom::test
