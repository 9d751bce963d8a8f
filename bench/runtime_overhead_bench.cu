// Overhead of the persistent runtime itself, on empty tasks:
//   - throughput: N independent empty tasks through one persistent launch (tasks/s);
//   - latency: a chain of N empty tasks, each released by its predecessor's event (time per link);
//   - baselines in the same run: the same N tasks as one kernel launch each, back to back on a
//     stream, and the same launches captured once in a CUDA graph and replayed.
// Timed with CUDA events; Google Benchmark reports the median over repetitions.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "runtime/cuda/event.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "runtime/runtime.hpp"
#include "tasks/empty.hpp"

namespace {

using EmptyPipeline = loom::Pipeline<loom::tasks::Empty>;

loom::Graph independent_graph(std::uint32_t n) {
  loom::GraphBuilder b;
  for (std::uint32_t i = 0; i < n; ++i) b.add_task(EmptyPipeline::make<loom::tasks::Empty>({0}));
  return b.build();
}

loom::Graph chain_graph(std::uint32_t n) {
  loom::GraphBuilder b;
  loom::EventId prev = loom::kNoEvent;
  for (std::uint32_t i = 0; i < n; ++i) {
    loom::EventId const e = b.add_event(1);
    auto const t = EmptyPipeline::make<loom::tasks::Empty>({0}, e);
    if (prev == loom::kNoEvent)
      b.add_task(t);
    else
      b.add_task(t, {prev});
    prev = e;
  }
  return b.build();
}

using loom::EventTimer;

void set_device_label(benchmark::State& state) {
  cudaDeviceProp prop{};
  int device = 0;
  LOOM_CUDA(cudaGetDevice(&device));
  LOOM_CUDA(cudaGetDeviceProperties(&prop, device));
  state.SetLabel(std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs");
}

void run_persistent(benchmark::State& state, loom::Graph graph, std::uint32_t tasks) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  loom::GpuExecutor<EmptyPipeline> ex(std::move(graph));
  ex.run();  // warm-up: module load, first-touch
  EventTimer timer;
  for (auto _ : state) {
    timer.start(nullptr);
    ex.launch();
    state.SetIterationTime(timer.stop_seconds(nullptr));
  }
  ex.check();
  state.counters["tasks_per_s"] = benchmark::Counter(
      static_cast<double>(tasks) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["processors"] = ex.processors();
  set_device_label(state);
}

void BM_PersistentIndependentEmpty(benchmark::State& state) {
  auto const n = static_cast<std::uint32_t>(state.range(0));
  run_persistent(state, independent_graph(n), n);
}

void BM_PersistentChainEmpty(benchmark::State& state) {
  auto const n = static_cast<std::uint32_t>(state.range(0));
  run_persistent(state, chain_graph(n), n);
}

// Event-to-successor latency straight from the trace: in a chain, the gap between a task's end
// (just before it arrives on its event) and its successor's start. Median over the chain.
void BM_PersistentChainSuccessorGap(benchmark::State& state) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  auto const n = static_cast<std::uint32_t>(state.range(0));
  loom::GpuOptions options;
  options.trace_capacity = n;
  loom::GpuExecutor<EmptyPipeline> ex(chain_graph(n), options);
  ex.run();
  ex.take_trace();
  std::vector<double> gaps_us;
  for (auto _ : state) {
    ex.run();
    auto trace = ex.take_trace();
    std::sort(trace.begin(), trace.end(),
              [](auto const& a, auto const& b) { return a.start_ns < b.start_ns; });
    for (std::size_t i = 1; i < trace.size(); ++i)
      gaps_us.push_back((static_cast<double>(trace[i].start_ns) - trace[i - 1].end_ns) * 1e-3);
  }
  std::nth_element(gaps_us.begin(), gaps_us.begin() + gaps_us.size() / 2, gaps_us.end());
  state.counters["gap_us_median"] = gaps_us[gaps_us.size() / 2];
  state.counters["processors"] = ex.processors();
  set_device_label(state);
}

__global__ void empty_task_kernel(loom::tasks::Empty::Payload) {}

void BM_LaunchPerTaskEmpty(benchmark::State& state) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  auto const n = static_cast<std::uint32_t>(state.range(0));
  empty_task_kernel<<<1, 64>>>({0});
  LOOM_CUDA(cudaDeviceSynchronize());
  EventTimer timer;
  for (auto _ : state) {
    timer.start(nullptr);
    for (std::uint32_t i = 0; i < n; ++i) empty_task_kernel<<<1, 64>>>({i});
    state.SetIterationTime(timer.stop_seconds(nullptr));
  }
  LOOM_CUDA(cudaGetLastError());
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
  set_device_label(state);
}

void BM_CudaGraphOfLaunchesEmpty(benchmark::State& state) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  auto const n = static_cast<std::uint32_t>(state.range(0));
  cudaStream_t stream;
  LOOM_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  LOOM_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (std::uint32_t i = 0; i < n; ++i) empty_task_kernel<<<1, 64, 0, stream>>>({i});
  LOOM_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  LOOM_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  LOOM_CUDA(cudaGraphLaunch(exec, stream));
  LOOM_CUDA(cudaStreamSynchronize(stream));
  EventTimer timer;
  for (auto _ : state) {
    timer.start(stream);
    LOOM_CUDA(cudaGraphLaunch(exec, stream));
    state.SetIterationTime(timer.stop_seconds(stream));
  }
  state.counters["tasks_per_s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
  set_device_label(state);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

constexpr int kReps = 5;
BENCHMARK(BM_PersistentIndependentEmpty)
    ->Arg(100000)
    ->Arg(1000000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(kReps)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_PersistentChainEmpty)
    ->Arg(10000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(kReps)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_PersistentChainSuccessorGap)->Arg(10000)->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LaunchPerTaskEmpty)
    ->Arg(100000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(kReps)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_CudaGraphOfLaunchesEmpty)
    ->Arg(100000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(kReps)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
