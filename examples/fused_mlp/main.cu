// fused_mlp: runs Y = act(X · W1) · W2 as one Loom graph of TileMatmul tiles (see fused_mlp.hpp),
// checks it against a float64 reference and reports the relative error and the median time of
// one launch.
//
//   fused_mlp --m 256 --k 256 --h 512 --n 256 --act gelu --backend cpu --iters 10
//
// Exit status: 0 when the relative error is below 1e-5, 1 when it is not, 2 on bad arguments or a
// runtime error.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "examples/fused_mlp/fused_mlp.hpp"
#include "runtime/runtime.hpp"
#include "runtime/trace.hpp"
#if __has_include("runtime/cuda/gpu_executor.cuh")
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#endif
#include "tasks/tile_matmul.hpp"

namespace {

using loom::examples::FusedMlpProblem;
using MlpPipeline = loom::Pipeline<loom::tasks::TileMatmul>;

constexpr double kTolerance = 1e-5;  // fp32 against float64, relative L2

struct Inputs {
  std::vector<float> x, w1, w2;
};

struct Outcome {
  std::vector<float> y;                  // [m][n] after the last launch
  std::vector<double> launch_ms;         // one per launch
  std::vector<loom::TraceRecord> trace;  // the last launch's tasks, when tracing
};

// Room for every task of one launch: one per tile of each layer.
std::uint32_t trace_capacity(FusedMlpProblem const& p) {
  std::uint32_t const rows = (p.m + p.tile_m - 1) / p.tile_m;
  return rows * ((p.h + p.tile_h - 1) / p.tile_h + (p.n + p.tile_n - 1) / p.tile_n);
}

// Uniform inputs; weights scaled by 1/sqrt(fan-in) so activations stay O(1) at every size.
Inputs random_inputs(FusedMlpProblem const& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto fill = [&rng](std::size_t count, float scale) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> v(count);
    for (float& e : v) e = dist(rng);
    return v;
  };
  Inputs in;
  in.x = fill(std::size_t{p.m} * p.k, 1.0f);
  in.w1 = fill(std::size_t{p.k} * p.h, 1.0f / std::sqrt(float(p.k)));
  in.w2 = fill(std::size_t{p.h} * p.n, 1.0f / std::sqrt(float(p.h)));
  return in;
}

Outcome run_on_cpu(FusedMlpProblem const& p, Inputs const& in, unsigned iters,
                   loom::CpuOptions const& options) {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> hidden(std::size_t{p.m} * p.h, nan);
  Outcome out{std::vector<float>(std::size_t{p.m} * p.n, nan), {}, {}};
  std::vector<loom::Graph> graphs;
  graphs.push_back(loom::examples::build_fused_mlp_graph<MlpPipeline>(
      p, in.x.data(), in.w1.data(), in.w2.data(), hidden.data(), out.y.data()));
  loom::CpuExecutor<MlpPipeline> executor(std::move(graphs), options);
  for (unsigned i = 0; i < iters; ++i) {
    executor.take_trace(0);  // keep only the last launch's records
    auto const start = std::chrono::steady_clock::now();
    executor.run();
    std::chrono::duration<double, std::milli> const elapsed =
        std::chrono::steady_clock::now() - start;
    out.launch_ms.push_back(elapsed.count());
  }
  out.trace = executor.take_trace(0);
  return out;
}

#if __has_include("runtime/cuda/gpu_executor.cuh")
// One CUDA event, destroyed with its owner.
class CudaEvent {
 public:
  CudaEvent() { LOOM_CUDA(cudaEventCreate(&event_)); }
  CudaEvent(CudaEvent const&) = delete;
  CudaEvent& operator=(CudaEvent const&) = delete;
  ~CudaEvent() { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

bool gpu_available() {
  return loom::cuda_device_count() > 0;
}

// The GPU backend: inputs copied to the device, the same graph built over device pointers, one
// persistent-kernel launch per iteration timed with events, Y copied back after the last.
Outcome run_on_gpu(FusedMlpProblem const& p, Inputs const& in, unsigned iters,
                   loom::SchedulingPolicy policy, bool trace) {
  loom::DeviceBuffer<float> const x(in.x), w1(in.w1), w2(in.w2);
  loom::DeviceBuffer<float> hidden(std::size_t{p.m} * p.h), y(std::size_t{p.m} * p.n);
  hidden.fill_bytes(0xFF);  // NaN: a tile that is never written shows in the error
  y.fill_bytes(0xFF);
  loom::GpuOptions options;
  options.policy = policy;
  options.trace_capacity = trace ? trace_capacity(p) : 0;
  loom::GpuExecutor<MlpPipeline> executor(
      loom::examples::build_fused_mlp_graph<MlpPipeline>(p, x.get(), w1.get(), w2.get(),
                                                         hidden.get(), y.get()),
      options);
  CudaEvent start, stop;
  Outcome out;
  for (unsigned i = 0; i < iters; ++i) {
    executor.take_trace();  // keep only the last launch's records
    LOOM_CUDA(cudaEventRecord(start.get()));
    executor.launch();
    LOOM_CUDA(cudaEventRecord(stop.get()));
    executor.check();
    float ms = 0.0f;
    LOOM_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    out.launch_ms.push_back(ms);
  }
  out.y = y.download();
  out.trace = executor.take_trace();
  return out;
}
#else
bool gpu_available() {
  return false;
}

Outcome run_on_gpu(FusedMlpProblem const&, Inputs const&, unsigned, loom::SchedulingPolicy, bool) {
  throw loom::Error("GPU backend not built");
}
#endif

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  FusedMlpProblem p;
  std::string act = "relu", backend = "auto", policy = "fifo", trace_path;
  unsigned iters = 10, processors = 4;
  std::uint64_t seed = 1;
  po::options_description desc("fused_mlp: Y = act(X W1) W2 on the Loom runtime");
  // clang-format off
  desc.add_options()
      ("help", "this message")
      ("m", po::value(&p.m)->default_value(p.m), "rows of X and Y")
      ("k", po::value(&p.k)->default_value(p.k), "columns of X, rows of W1")
      ("h", po::value(&p.h)->default_value(p.h), "hidden width: columns of W1, rows of W2")
      ("n", po::value(&p.n)->default_value(p.n), "columns of W2 and Y")
      ("tile-m", po::value(&p.tile_m)->default_value(p.tile_m), "rows per tile")
      ("tile-h", po::value(&p.tile_h)->default_value(p.tile_h), "hidden columns per tile")
      ("tile-n", po::value(&p.tile_n)->default_value(p.tile_n), "output columns per tile")
      ("act", po::value(&act)->default_value(act), "activation: none, relu, gelu, silu")
      ("backend", po::value(&backend)->default_value(backend), "cpu, cuda or auto")
      ("iters", po::value(&iters)->default_value(iters), "launches to time")
      ("seed", po::value(&seed)->default_value(seed), "input seed")
      ("processors", po::value(&processors)->default_value(processors),
       "CPU executor: processor threads")
      ("policy", po::value(&policy)->default_value(policy), "scheduling policy: fifo, priority")
      ("trace", po::value(&trace_path), "write the last launch's tasks as Chrome-trace JSON "
                                        "(open in Perfetto) to this file");
  // clang-format on
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
    p.activation = loom::tasks::parse_activation(act);
    loom::examples::validate(p);
    if (iters == 0) throw loom::Error("loom: --iters must be at least 1");
    if (backend != "cpu" && backend != "cuda" && backend != "auto")
      throw loom::Error("loom: unknown backend '" + backend + "' (choose cpu, cuda or auto)");
    if (policy != "fifo" && policy != "priority")
      throw loom::Error("loom: unknown policy '" + policy + "' (choose fifo or priority)");
  } catch (std::exception const& e) {
    std::cerr << "fused_mlp: " << e.what() << "\n" << desc;
    return 2;
  }

  try {
    bool const use_gpu = backend == "cuda" || (backend == "auto" && gpu_available());
    if (use_gpu && !gpu_available())
      throw loom::Error(
          "loom: --backend cuda, but the GPU backend is not built or no CUDA device "
          "is present");
    Inputs const in = random_inputs(p, seed);
    std::vector<double> const reference =
        loom::examples::reference_fused_mlp(p, in.x.data(), in.w1.data(), in.w2.data());
    loom::SchedulingPolicy const scheduling =
        policy == "priority" ? loom::SchedulingPolicy::priority : loom::SchedulingPolicy::fifo;
    Outcome out;
    if (use_gpu) {
      out = run_on_gpu(p, in, iters, scheduling, !trace_path.empty());
    } else {
      loom::CpuOptions options;
      options.processors = processors;
      options.policy = scheduling;
      options.trace_capacity = trace_path.empty() ? 0 : trace_capacity(p);
      out = run_on_cpu(p, in, iters, options);
    }
    if (!trace_path.empty()) {
      loom::write_chrome_trace(trace_path, out.trace, MlpPipeline::names, MlpPipeline::size);
      std::printf("trace: %zu tasks written to %s\n", out.trace.size(), trace_path.c_str());
    }
    double const error = loom::examples::relative_error(out.y, reference);
    double const ms = median(out.launch_ms);
    std::printf(
        "fused_mlp M=%u K=%u H=%u N=%u tiles %ux%u/%u act=%s backend=%s: relative error %.3e "
        "(%s), median %.3f ms over %u launches, %.2f GFLOP/s\n",
        p.m, p.k, p.h, p.n, p.tile_m, p.tile_h, p.tile_n, loom::tasks::to_string(p.activation),
        use_gpu ? "cuda" : "cpu", error, error < kTolerance ? "ok" : "FAILED", ms, iters,
        p.flops() / (ms * 1e6));
    return error < kTolerance ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fused_mlp: %s\n", e.what());
    return 2;
  }
}
