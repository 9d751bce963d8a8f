// Runs a pipeline's graph in the persistent kernel on one GPU. The grid comes from the occupancy
// API and the device: every block must be resident at once (the actors spin on each other), so the
// launch is cooperative and a configuration that cannot be co-resident is refused before it runs.
// launch() is asynchronous and capturable in a CUDA graph (the epoch lives on the device, so every
// replay is a new launch); check() synchronises and turns a device error record into loom::Error,
// and a launch that cannot end after its error into one too, instead of waiting for ever.
//
// Several .cu files of one program may run the same pipeline: the code is built without
// relocatable device code, so each of them compiles its own copy of the kernel, and kernel()
// below makes every launch use one of them (see there).
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "runtime/cuda/check.hpp"
#include "runtime/cuda/device_state.hpp"
#include "runtime/cuda/persistent_kernel.cuh"
#include "scheduler/policy.hpp"

namespace loom {

struct GpuOptions {
  SchedulingPolicy policy = SchedulingPolicy::fifo;
  std::chrono::milliseconds watchdog{5000};
  std::uint32_t trace_capacity = 0;        // 0: tracing off
  std::uint64_t prefetch_after_ns = 2000;  // see StateOptions (0: always, kNoPrefetch: never)
  bool waiting_first = false;              // see StateOptions
  std::uint32_t blocks_per_sm = 1;   // processors per SM, capped by the occupancy API's answer
  std::uint32_t max_processors = 0;  // 0: as many as can be resident
  std::uint32_t subscribers = 1;     // subscriber warps in the OS block
  int device = -1;                   // -1: the current device
};

struct GpuLaunchShape {
  std::uint32_t grid;           // processors + 1
  std::uint32_t threads;        // per block
  std::uint32_t shared_bytes;   // dynamic, per block
  std::uint32_t blocks_per_sm;  // from the occupancy API
  std::uint32_t sm_count;
};

template <class Pipeline, class Decoder = NoDecoder>
class GpuExecutor {
 public:
  explicit GpuExecutor(Graph graph, GpuOptions options = {}, Decoder decoder = {},
                       SymmetricView heap = {})
      : options_(options),
        decoder_(decoder),
        heap_(heap),
        shape_(plan(options)),
        state_(std::move(graph), state_options(options, shape_, heap)) {}

  GpuLaunchShape const& shape() const { return shape_; }
  // The shape an executor of this pipeline takes with `options` on the current device, before
  // one is built (a graph may want the processor count).
  static GpuLaunchShape launch_shape(GpuOptions const& options = {}) { return plan(options); }
  std::uint32_t processors() const { return shape_.grid - 1; }

  // Enqueues one launch on `stream`; no host synchronisation.
  void launch(cudaStream_t stream = nullptr) {
    if (stuck_)
      throw Error(
          "loom: an earlier launch of this executor never ended (see its error); it cannot launch "
          "again");
    with_policy(options_.policy, [&](auto p) { launch_with<decltype(p)>(stream); });
  }

  // Enqueues the copy of the last launch's error record into pinned host memory, behind that
  // launch on `stream`; check() and failure() on that stream then read it without a synchronous
  // copy of their own. For a caller that launches several executors and then waits for them all
  // (the copies run in the background instead of one after another after the waits); a lone
  // launch is better off without it, since the copy lengthens its stream by a few microseconds.
  void copy_error_back(cudaStream_t stream = nullptr) { state_.copy_error_after(stream); }

  // Waits for the stream and raises the launch's error, if any (then re-initialises the state).
  void check(cudaStream_t stream = nullptr) {
    wait(stream);
    ErrorRecord const e = state_.read_error(stream);
    if (e.code != 0) {
      state_.reinitialize_after_failure();
      throw Error(Pipeline::describe(e));
    }
  }

  // For several ranks that launch together: waits for the stream and returns the launch's error
  // message ("" when it succeeded) without re-initialising; then restart_at() on every rank.
  std::string failure(cudaStream_t stream = nullptr) {
    wait(stream);
    ErrorRecord const e = state_.read_error(stream);
    return e.code != 0 ? Pipeline::describe(e) : std::string();
  }
  // Re-initialises the state so that the next launch is number `epoch`.
  void restart_at(std::uint64_t epoch) { state_.reinitialize(epoch); }
  std::uint64_t epoch() const { return state_.read_epoch(); }

  void run(cudaStream_t stream = nullptr) {
    launch(stream);
    check(stream);
  }

  std::uint64_t launches() const { return state_.read_epoch() - 1; }
  // A launch of this executor never ended (check() raised it): nothing may wait on its stream.
  bool stuck() const { return stuck_; }
  std::vector<TraceRecord> take_trace() { return state_.take_trace(); }

 private:
  // Waits for `stream`. Every wait inside a launch is bounded, so a launch that has recorded an
  // error ends soon after; one that has not ended a grace period later (twice the watchdog, at
  // least a second) has a block stuck where no watchdog reaches (a hardware wait, a task body's
  // own loop). Waiting on would hang the host without a word, so that is raised instead, with the
  // recorded error; the executor then refuses to launch again.
  void wait(cudaStream_t stream) {
    using Clock = std::chrono::steady_clock;
    constexpr auto kPeekEvery = std::chrono::milliseconds(50);
    constexpr auto kSpinFor = std::chrono::milliseconds(10);
    auto const grace = std::max<Clock::duration>(2 * options_.watchdog, std::chrono::seconds(1));
    auto const start = Clock::now();
    auto next_peek = start + kPeekEvery;
    Clock::time_point failed_at{};
    bool failed = false;
    for (;;) {
      cudaError_t const q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) LOOM_CUDA(q);
      auto const now = Clock::now();
      if (now - start > kSpinFor) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (now < next_peek) continue;
      next_peek = now + kPeekEvery;
      ErrorRecord const e = state_.peek_error();
      if (e.code == 0) continue;
      if (!failed) {
        failed = true;
        failed_at = now;
      } else if (now - failed_at > grace) {
        stuck_ = true;
        auto const ms = std::chrono::duration_cast<std::chrono::milliseconds>(grace).count();
        throw Error(Pipeline::describe(e) + "; the launch did not end within " +
                    std::to_string(ms) +
                    " ms of that error: a block is stuck where no watchdog reaches, and this "
                    "executor cannot launch again");
      }
    }
  }

  // The kernel of each policy, read from one object per program. persistent_kernel has internal
  // linkage, so every .cu file that instantiates this class has its own copy of it; the pointer
  // lives in an inline variable (one definition, kept from one file), so that plan() sets the
  // shared-memory attribute on the same copy that launch_with() launches, whichever file's copies
  // of those functions the linker keeps.
  template <class Policy>
  static inline decltype(&persistent_kernel<Pipeline, Policy, Decoder>) kernel_ =
      &persistent_kernel<Pipeline, Policy, Decoder>;
  template <class Policy>
  static auto kernel() {
    return kernel_<Policy>;
  }

  static GpuLaunchShape plan(GpuOptions const& options) {
    int device = options.device;
    if (device < 0)
      LOOM_CUDA(cudaGetDevice(&device));
    else
      LOOM_CUDA(cudaSetDevice(device));
    cudaDeviceProp prop{};
    LOOM_CUDA(cudaGetDeviceProperties(&prop, device));
    if (!prop.cooperativeLaunch)
      throw Error(std::string("loom: device ") + prop.name +
                  " cannot launch cooperatively; the persistent kernel needs every block resident");
    GpuLaunchShape shape{};
    shape.threads = Pipeline::threads;
    shape.shared_bytes = Pipeline::shared_bytes;
    shape.sm_count = static_cast<std::uint32_t>(prop.multiProcessorCount);
    if (options.subscribers + 1 > shape.threads / 32)
      throw Error("loom: " + std::to_string(options.subscribers) +
                  " subscriber warps plus the scheduler warp do not fit in a block of " +
                  std::to_string(shape.threads) + " threads");
    if (shape.shared_bytes > prop.sharedMemPerBlockOptin)
      throw Error("loom: the pipeline's task types need " + std::to_string(shape.shared_bytes) +
                  " bytes of shared memory per block; " + prop.name + " allows at most " +
                  std::to_string(prop.sharedMemPerBlockOptin) +
                  ", so the persistent kernel cannot be resident");
    std::uint32_t per_sm = ~0u;
    for (auto k : {kernel<FifoPolicy>(), kernel<PriorityPolicy>()}) {
      if (shape.shared_bytes > 48 * 1024)
        LOOM_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shape.shared_bytes)));
      int n = 0;
      LOOM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, k, static_cast<int>(shape.threads), shape.shared_bytes));
      per_sm = std::min(per_sm, static_cast<std::uint32_t>(n));
    }
    if (per_sm == 0)
      throw Error("loom: the persistent kernel cannot be resident: a block of " +
                  std::to_string(shape.threads) + " threads with " +
                  std::to_string(shape.shared_bytes) + " bytes of shared memory does not fit on " +
                  prop.name);
    shape.blocks_per_sm =
        options.blocks_per_sm == 0 ? per_sm : std::min(per_sm, options.blocks_per_sm);
    shape.grid = shape.blocks_per_sm * shape.sm_count;
    if (options.max_processors != 0) shape.grid = std::min(shape.grid, options.max_processors + 1);
    if (shape.grid < 2)
      throw Error(
          "loom: the persistent kernel needs at least two resident blocks (one "
          "processor and the OS block)");
    return shape;
  }

  static StateOptions state_options(GpuOptions const& options, GpuLaunchShape const& shape,
                                    SymmetricView const& heap) {
    StateOptions so;
    so.rank = heap.rank;
    so.world = heap.world == 0 ? 1 : heap.world;
    so.processors = shape.grid - 1;
    so.subscribers = options.subscribers;
    so.watchdog_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(options.watchdog).count());
    so.trace_capacity = options.trace_capacity;
    so.prefetch_after_ns = options.prefetch_after_ns;
    so.waiting_first = options.waiting_first;
    return so;
  }

  template <class Policy>
  void launch_with(cudaStream_t stream) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(shape_.grid);
    config.blockDim = dim3(shape_.threads);
    config.dynamicSmemBytes = shape_.shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    state_.launched();
    LOOM_CUDA(cudaLaunchKernelEx(&config, kernel<Policy>(), state_.state(), heap_, decoder_));
    LOOM_CUDA(cudaGetLastError());
  }

  GpuOptions options_;
  Decoder decoder_;
  SymmetricView heap_;
  GpuLaunchShape shape_;
  DeviceState state_;
  bool stuck_ = false;  // a launch never ended (see wait)
};

}  // namespace loom
