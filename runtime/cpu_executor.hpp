// The CPU executor: runs a pipeline's graphs on host threads playing the actor roles, one set per
// virtual rank, all ranks in one process over a HostSymmetricHeap. It runs the same protocol code
// as the GPU (queues, doorbells, events, epochs, termination); only task bodies differ.
//
// Actors spin on each other, so each needs its own thread for the whole launch. They run as TBB
// tasks in an arena sized to hold all of them at once, with TBB's parallelism limit raised to
// match (checked: a lower limit set elsewhere in the process is reported, not waited on).
#pragma once

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/host_actors.hpp"
#include "runtime/scheduler_loop.hpp"
#include "runtime/state_image.hpp"
#include "runtime/symmetric_layout.hpp"
#include "scheduler/policy.hpp"

namespace loom {

struct CpuOptions {
  std::uint32_t processors = 4;   // processor threads per rank
  std::uint32_t subscribers = 1;  // subscriber threads per rank
  SchedulingPolicy policy = SchedulingPolicy::fifo;
  std::chrono::milliseconds watchdog{5000};
  std::uint64_t chaos_seed = 0;        // non-zero: random delays in every actor
  std::uint32_t chaos_per_mille = 50;  // chance of a delay at each protocol point
  std::uint32_t chaos_max_delay_us = 200;
  std::uint32_t trace_capacity = 0;        // per rank; 0: tracing off
  std::uint64_t prefetch_after_ns = 2000;  // see StateOptions (0: always, kNoPrefetch: never)
  bool waiting_first = false;              // see StateOptions
};

// Host-side state of one rank: its graph, the arena, the bound RuntimeState.
class HostRankState {
 public:
  HostRankState(Graph graph, StateOptions const& options);
  RuntimeState const& state() const { return state_; }
  ErrorRecord take_error();
  // Re-initialises after a failed launch; the next launch is number `epoch`.
  void reinitialize(std::uint64_t epoch);
  std::vector<TraceRecord> take_trace();
  std::uint64_t epoch() const { return state_.counters->epoch.value; }

 private:
  struct Free {
    void operator()(unsigned char* p) const;
  };
  Graph graph_;
  StateLayout layout_;
  std::unique_ptr<unsigned char[], Free> arena_;
  RuntimeState state_;
};

// Runs all actors of all ranks for one launch; returns each rank's error record.
class CpuActorPool {
 public:
  explicit CpuActorPool(std::size_t actors);
  std::size_t actors() const { return actors_; }
  template <class Fn>
  void run_all(std::vector<Fn> const& bodies) {
    arena_.execute([&] {
      oneapi::tbb::task_group group;
      for (auto const& body : bodies) group.run([&body] { body(); });
      group.wait();
    });
  }

 private:
  std::size_t actors_;
  oneapi::tbb::task_arena arena_;
};

template <class Pipeline, class Decoder = NoDecoder>
class CpuExecutor {
 public:
  // One graph per rank. `heap` (may be null for one rank without communication) must outlive the
  // executor; `decoders` holds one decoder per rank (empty: default-constructed decoders).
  CpuExecutor(std::vector<Graph> graphs, CpuOptions options,
              HostSymmetricHeap const* heap = nullptr, std::vector<Decoder> decoders = {})
      : options_(options),
        heap_(heap),
        decoders_(std::move(decoders)),
        pool_(graphs.size() * (options.processors + 1 + options.subscribers)) {
    std::uint32_t const world = static_cast<std::uint32_t>(graphs.size());
    if (world == 0) throw Error("loom: the CPU executor needs at least one rank's graph");
    if (heap_ && heap_->world() != world)
      throw Error("loom: " + std::to_string(world) + " graphs but the symmetric heap has " +
                  std::to_string(heap_->world()) + " ranks");
    if (!heap_ && world > 1)
      throw Error("loom: several ranks need a symmetric heap to talk through");
    if (decoders_.empty()) decoders_.resize(world);
    if (decoders_.size() != world) throw Error("loom: one decoder per rank is required");
    for (std::uint32_t r = 0; r < world; ++r) {
      StateOptions so;
      so.processors = options.processors;
      so.subscribers = options.subscribers;
      so.rank = r;
      so.world = world;
      so.watchdog_ns = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(options.watchdog).count());
      so.trace_capacity = options.trace_capacity;
      so.prefetch_after_ns = options.prefetch_after_ns;
      so.waiting_first = options.waiting_first;
      ranks_.push_back(std::make_unique<HostRankState>(std::move(graphs[r]), so));
    }
  }

  std::uint32_t world() const { return static_cast<std::uint32_t>(ranks_.size()); }
  RuntimeState const& state(std::uint32_t rank) const { return ranks_[rank]->state(); }
  std::uint64_t launches() const { return ranks_[0]->epoch() - 1; }
  std::vector<TraceRecord> take_trace(std::uint32_t rank) { return ranks_[rank]->take_trace(); }

  // One launch on every rank; returns when all actors have left. Throws loom::Error with the first
  // failing actor's report; the executor is then re-initialised and can run again.
  void run(SchedulingPolicy policy) {
    with_policy(policy, [&](auto p) { run_with<decltype(p)>(); });
  }
  void run() { run(options_.policy); }

 private:
  template <class Policy>
  void run_with() {
    std::vector<std::function<void()>> bodies;
    std::uint64_t seed = options_.chaos_seed;
    for (std::uint32_t r = 0; r < world(); ++r) {
      RuntimeState const& s = ranks_[r]->state();
      SymmetricView const heap = heap_ ? heap_->view(r) : SymmetricView{{}, 0, r, world()};
      auto with_chaos = [this, &seed](auto fn) {
        std::uint64_t const my_seed = seed ? ++seed * 0x9E3779B97F4A7C15ull : 0;
        return [fn, my_seed, this]() {
          ChaosState chaos{std::mt19937_64(my_seed), options_.chaos_per_mille,
                           options_.chaos_max_delay_us};
          tls_chaos = my_seed ? &chaos : nullptr;
          fn();
          tls_chaos = nullptr;
        };
      };
      bodies.push_back(with_chaos([&s, r] {
        run_scheduler<Policy>(s, WaiterId{Actor::scheduler, 0, r});
      }));
      for (std::uint32_t p = 0; p < options_.processors; ++p)
        bodies.push_back(
            with_chaos([&s, p, heap] { run_processor_host<Pipeline, Policy>(s, p, heap); }));
      for (std::uint32_t i = 0; i < options_.subscribers; ++i)
        bodies.push_back(
            with_chaos([&s, i, heap, this, r] { run_subscriber(s, i, decoders_[r], heap); }));
    }
    pool_.run_all(bodies);
    // Every failing rank's report, one line each (a missing peer shows on all the others).
    std::string message;
    for (auto& rank : ranks_) {
      ErrorRecord const e = rank->take_error();
      if (e.code != 0) message += (message.empty() ? "" : "\n") + Pipeline::describe(e);
    }
    if (!message.empty()) {
      // Every rank restarts at one epoch past the failed launch, together.
      std::uint64_t epoch = 0;
      for (auto& rank : ranks_) epoch = std::max(epoch, rank->epoch());
      for (auto& rank : ranks_) rank->reinitialize(epoch + 1);
      throw Error(message);
    }
  }

  CpuOptions options_;
  HostSymmetricHeap const* heap_;
  std::vector<Decoder> decoders_;
  std::vector<std::unique_ptr<HostRankState>> ranks_;
  CpuActorPool pool_;
};

}  // namespace loom
