// fused_mlp: runs Y = act(X · W1ᵀ + b1) · W2ᵀ as one Loom graph of bf16 tile GEMM tasks (see
// fused_mlp.hpp), checks it against a float64 reference and reports the relative error and the
// median time of one launch.
//
//   fused_mlp --m 4096 --k 4096 --h 8192 --n 4096 --act swiglu --iters 20
//   fused_mlp --m 4096 --k 2048 --h 4096 --n 2048 --act relu --baseline   (beside cuBLAS)
//   fused_mlp --m 256 --k 256 --h 512 --n 256 --act gelu --backend cpu --iters 3
//
// Exit status: 0 when the relative error is below 1e-2 (bf16 inputs and hidden layer; with
// --baseline, the unfused pipeline's too), 1 when it is not, 2 on bad arguments or a runtime error.
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
#include "runtime/cuda/cublas.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/event.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "tasks/gemm/device_gemm.hpp"
#include "tasks/gemm/epilogue_math.hpp"
#endif
#include "tasks/gemm_tile.hpp"

namespace {

namespace g = loom::tasks::gemm;
using loom::examples::FusedMlpProblem;
using loom::examples::FusedMlpTensors;
using loom::examples::FusedMlpTiles;
using MlpPipeline = loom::Pipeline<loom::tasks::GemmTile>;

constexpr double kTolerance = 1e-2;  // bf16 inputs and hidden layer against float64, relative L2

struct Inputs {
  std::vector<g::Bf16> x, w1, w2;
  std::vector<float> b1;  // empty: no bias
};

struct Outcome {
  std::vector<float> y;                  // [m][n] after the last launch
  std::vector<double> launch_ms;         // one per launch
  std::vector<float> baseline_y;         // --baseline: the unfused pipeline's Y, else empty
  std::vector<double> baseline_ms;       // one per run of the unfused pipeline
  std::vector<loom::TraceRecord> trace;  // the last launch's tasks, when tracing
  FusedMlpTiles tiles;                   // what the heuristic chose
  std::size_t tasks = 0;                 // tasks per launch
};

// Uniform inputs; weights scaled by 1/sqrt(fan-in) so activations stay O(1) at every size.
Inputs random_inputs(FusedMlpProblem const& p, bool bias, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto fill = [&rng](std::size_t count, float scale) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<g::Bf16> v(count);
    for (g::Bf16& e : v) e = g::to_bf16(dist(rng));
    return v;
  };
  Inputs in;
  in.x = fill(std::size_t{p.m} * p.k, 1.0f);
  in.w1 = fill(std::size_t{p.w1_rows()} * p.k, 1.0f / std::sqrt(float(p.k)));
  in.w2 = fill(std::size_t{p.n} * p.h, 1.0f / std::sqrt(float(p.h)));
  if (bias) {
    std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
    in.b1.resize(p.w1_rows());
    for (float& b : in.b1) b = dist(rng);
  }
  return in;
}

float const* bias_of(Inputs const& in) {
  return in.b1.empty() ? nullptr : in.b1.data();
}

Outcome run_on_cpu(FusedMlpProblem const& p, Inputs const& in, unsigned iters,
                   loom::CpuOptions const& options, bool trace) {
  std::vector<g::Bf16> hidden(std::size_t{p.m} * p.h, g::Bf16{0xFFFF});  // NaN
  Outcome out;
  out.y.assign(std::size_t{p.m} * p.n, std::numeric_limits<float>::quiet_NaN());
  FusedMlpTensors const t{in.x.data(),  in.w1.data(),  bias_of(in),
                          in.w2.data(), hidden.data(), out.y.data()};
  out.tiles = loom::examples::choose_fused_mlp_tiles(p, options.processors, g::MmaPath::wgmma);
  g::GemmOperands const layer1 =
      loom::examples::host_operands(loom::examples::layer1_desc(p, t), out.tiles.layer1);
  g::GemmOperands const layer2 =
      loom::examples::host_operands(loom::examples::layer2_desc(p, t), out.tiles.layer2);
  std::vector<loom::Graph> graphs;
  graphs.push_back(
      loom::examples::build_fused_mlp_graph<MlpPipeline>(layer1, &layer1, layer2, &layer2));
  out.tasks = graphs[0].tasks.size();
  loom::CpuOptions run_options = options;
  run_options.trace_capacity = trace ? static_cast<std::uint32_t>(out.tasks) : 0;
  loom::CpuExecutor<MlpPipeline> executor(std::move(graphs), run_options);
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
bool gpu_available() {
  return loom::cuda_device_count() > 0;
}

// wgmma on a Hopper GPU (sm_90), mma.sync elsewhere.
g::MmaPath device_path() {
  int device = 0, major = 0;
  LOOM_CUDA(cudaGetDevice(&device));
  LOOM_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major == 9 ? g::MmaPath::wgmma : g::MmaPath::mma_sync;
}

// The unfused pipeline's middle step: hidden = act(z + b1) in bf16, z = X · W1ᵀ in bf16 as cuBLAS
// wrote it. SwiGLU pairs z's columns as the tile GEMM does (gate_column / up_column).
__global__ void bias_activation(g::Bf16 const* z, float const* bias, g::GemmActivation act,
                                std::uint32_t m, std::uint32_t h, std::uint32_t z_cols,
                                g::Bf16* hidden) {
  std::size_t const total = std::size_t{m} * h;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < total;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::size_t const r = i / h;
    std::uint32_t const c = static_cast<std::uint32_t>(i - r * h);
    auto const at = [&](std::uint32_t col) {
      return g::to_float(z[r * z_cols + col]) + (bias ? bias[col] : 0.0f);
    };
    float const v = act == g::GemmActivation::swiglu
                        ? g::fast::swiglu(at(g::swiglu_gate_column(c)), at(g::swiglu_up_column(c)))
                        : g::fast::activate(act, at(c));
    hidden[i] = g::to_bf16(v);
  }
}

// What a user would otherwise run for the same problem: cuBLAS for X · W1ᵀ (bf16 out, fp32
// accumulation), a kernel for bias and activation, cuBLAS for hidden · W2ᵀ (fp32 Y); timed with
// events around the three, `iters` times after one untimed run. Row-major C = A · Bᵀ is cuBLAS's
// column-major Cᵀ = op_T(B) · A.
void run_baseline(FusedMlpProblem const& p, loom::DeviceBuffer<g::Bf16> const& x,
                  loom::DeviceBuffer<g::Bf16> const& w1, float const* b1,
                  loom::DeviceBuffer<g::Bf16> const& w2, unsigned iters, Outcome& out) {
  loom::DeviceBuffer<g::Bf16> z(std::size_t{p.m} * p.w1_rows()), hidden(std::size_t{p.m} * p.h);
  loom::DeviceBuffer<float> y(std::size_t{p.m} * p.n);
  y.fill_bytes(0xFF);
  loom::CublasHandle const cublas;
  cublasHandle_t const handle = cublas.get();
  auto const run = [&] {
    float const one = 1.0f, zero = 0.0f;
    loom::check_cublas(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.w1_rows()),
                     static_cast<int>(p.m), static_cast<int>(p.k), &one, w1.get(), CUDA_R_16BF,
                     static_cast<int>(p.k), x.get(), CUDA_R_16BF, static_cast<int>(p.k), &zero,
                     z.get(), CUDA_R_16BF, static_cast<int>(p.w1_rows()), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (first layer)");
    bias_activation<<<1024, 256>>>(z.get(), b1, p.activation, p.m, p.h, p.w1_rows(), hidden.get());
    LOOM_CUDA(cudaGetLastError());
    loom::check_cublas(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
                     static_cast<int>(p.h), &one, w2.get(), CUDA_R_16BF, static_cast<int>(p.h),
                     hidden.get(), CUDA_R_16BF, static_cast<int>(p.h), &zero, y.get(), CUDA_R_32F,
                     static_cast<int>(p.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (second layer)");
  };
  run();
  loom::EventTimer timer;
  for (unsigned i = 0; i < iters; ++i) {
    timer.start();
    run();
    out.baseline_ms.push_back(timer.stop_seconds() * 1e3);
  }
  out.baseline_y = y.download();
}

// The GPU backend: inputs copied to the device, both layers' operands uploaded once, the graph
// built over them, one persistent-kernel launch per iteration timed with events, Y copied back
// after the last.
Outcome run_on_gpu(FusedMlpProblem const& p, Inputs const& in, unsigned iters, g::MmaPath path,
                   loom::SchedulingPolicy policy, bool trace, bool baseline) {
  loom::DeviceBuffer<g::Bf16> const x(in.x), w1(in.w1), w2(in.w2);
  loom::DeviceBuffer<float> const b1(in.b1);
  loom::DeviceBuffer<g::Bf16> hidden(std::size_t{p.m} * p.h);
  loom::DeviceBuffer<float> y(std::size_t{p.m} * p.n);
  hidden.fill_bytes(0xFF);  // NaN: a tile that is never written shows in the error
  y.fill_bytes(0xFF);
  FusedMlpTensors const t{x.get(),  w1.get(),     in.b1.empty() ? nullptr : b1.get(),
                          w2.get(), hidden.get(), y.get()};
  loom::GpuOptions options;
  options.policy = policy;
  Outcome out;
  out.tiles = loom::examples::choose_fused_mlp_tiles(
      p, loom::GpuExecutor<MlpPipeline>::launch_shape(options).grid - 1, path);
  g::DeviceGemm const layer1(loom::examples::layer1_desc(p, t), out.tiles.layer1);
  g::DeviceGemm const layer2(loom::examples::layer2_desc(p, t), out.tiles.layer2);
  loom::Graph graph = loom::examples::build_fused_mlp_graph<MlpPipeline>(
      layer1.host_view(), layer1.device(), layer2.host_view(), layer2.device());
  out.tasks = graph.tasks.size();
  options.trace_capacity = trace ? static_cast<std::uint32_t>(out.tasks) : 0;
  loom::GpuExecutor<MlpPipeline> executor(std::move(graph), options);
  loom::EventTimer timer;
  for (unsigned i = 0; i < iters; ++i) {
    executor.take_trace();  // keep only the last launch's records
    timer.start();
    executor.launch();
    timer.stop();
    executor.check();
    out.launch_ms.push_back(timer.seconds() * 1e3);
  }
  out.y = y.download();
  out.trace = executor.take_trace();
  if (baseline) run_baseline(p, x, w1, t.b1, w2, iters, out);
  return out;
}
#else
bool gpu_available() {
  return false;
}

g::MmaPath device_path() {
  return g::MmaPath::wgmma;
}

Outcome run_on_gpu(FusedMlpProblem const&, Inputs const&, unsigned, g::MmaPath,
                   loom::SchedulingPolicy, bool, bool) {
  throw loom::Error("GPU backend not built");
}
#endif

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

std::string describe(g::GemmConfig const& c) {
  return std::to_string(c.block_m) + "x" + std::to_string(c.block_n) +
         (c.splits > 1 ? " split " + std::to_string(c.splits) : "");
}

}  // namespace

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  FusedMlpProblem p;
  std::string act = "relu", backend = "auto", policy = "fifo", path_name = "auto", trace_path;
  unsigned iters = 10, processors = 4;
  std::uint64_t seed = 1;
  bool bias = false, baseline = false;
  po::options_description desc(
      "fused_mlp: Y = act(X W1^T + b1) W2^T on the Loom runtime, bf16 tile GEMM tasks");
  // clang-format off
  desc.add_options()
      ("help", "this message")
      ("m", po::value(&p.m)->default_value(p.m), "rows of X and Y")
      ("k", po::value(&p.k)->default_value(p.k), "columns of X (a multiple of 8)")
      ("h", po::value(&p.h)->default_value(p.h), "hidden width (a multiple of 8)")
      ("n", po::value(&p.n)->default_value(p.n), "columns of Y (a multiple of 8)")
      ("tile-m", po::value(&p.tile_m)->default_value(p.tile_m),
       "rows per tile in both layers: 64, 128, or 0 to let the heuristic choose")
      ("act", po::value(&act)->default_value(act),
       "activation: none, relu, gelu, swiglu (W1 then holds 2h rows: gate and up)")
      ("bias", po::bool_switch(&bias), "add a random bias b1 to the first layer")
      ("baseline", po::bool_switch(&baseline),
       "GPU: also time the unfused pipeline (cuBLAS, a bias/activation kernel, cuBLAS) on the "
       "same inputs, check it and print both")
      ("backend", po::value(&backend)->default_value(backend), "cpu, cuda or auto")
      ("path", po::value(&path_name)->default_value(path_name),
       "GPU tensor-core path: wgmma (sm_90a), mma_sync, or auto")
      ("iters", po::value(&iters)->default_value(iters), "launches to time")
      ("seed", po::value(&seed)->default_value(seed), "input seed")
      ("processors", po::value(&processors)->default_value(processors),
       "CPU executor: processor threads")
      ("policy", po::value(&policy)->default_value(policy), "scheduling policy: fifo, priority")
      ("trace", po::value(&trace_path), "write the last launch's tasks as Chrome-trace JSON "
                                        "(open in Perfetto) to this file and print a summary per "
                                        "task type");
  // clang-format on
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
    p.activation = g::parse_gemm_activation(act);
    loom::examples::validate(p);
    if (iters == 0) throw loom::Error("loom: --iters must be at least 1");
    if (processors == 0) throw loom::Error("loom: --processors must be at least 1");
    if (backend != "cpu" && backend != "cuda" && backend != "auto")
      throw loom::Error("loom: unknown backend '" + backend + "' (choose cpu, cuda or auto)");
    if (policy != "fifo" && policy != "priority")
      throw loom::Error("loom: unknown policy '" + policy + "' (choose fifo or priority)");
    if (path_name != "auto" && path_name != "wgmma" && path_name != "mma_sync")
      throw loom::Error("loom: unknown path '" + path_name + "' (choose wgmma, mma_sync or auto)");
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
    if (baseline && !use_gpu) throw loom::Error("loom: --baseline needs the GPU backend");
    Inputs const in = random_inputs(p, bias, seed);
    std::vector<double> const reference = loom::examples::reference_fused_mlp(
        p, in.x.data(), in.w1.data(), in.w2.data(), bias_of(in));
    loom::SchedulingPolicy const scheduling =
        policy == "priority" ? loom::SchedulingPolicy::priority : loom::SchedulingPolicy::fifo;
    g::MmaPath path = g::MmaPath::wgmma;
    if (use_gpu)
      path = path_name == "auto"    ? device_path()
             : path_name == "wgmma" ? g::MmaPath::wgmma
                                    : g::MmaPath::mma_sync;
    Outcome out;
    if (use_gpu) {
      out = run_on_gpu(p, in, iters, path, scheduling, !trace_path.empty(), baseline);
    } else {
      loom::CpuOptions options;
      options.processors = processors;
      options.policy = scheduling;
      out = run_on_cpu(p, in, iters, options, !trace_path.empty());
    }
    if (!trace_path.empty()) {
      loom::write_chrome_trace(trace_path, out.trace, MlpPipeline::names, MlpPipeline::size);
      std::printf("trace: %zu tasks written to %s\n%s", out.trace.size(), trace_path.c_str(),
                  loom::format_trace_summary(loom::summarize_trace(out.trace), MlpPipeline::names,
                                             MlpPipeline::size)
                      .c_str());
    }
    double const error = loom::examples::relative_error(out.y, reference);
    double const ms = median(out.launch_ms);
    std::printf(
        "fused_mlp M=%u K=%u H=%u N=%u act=%s%s backend=%s%s: tiles %s / %s, %zu tasks; "
        "relative error %.3e (%s), median %.3f ms over %u launches, %.2f TFLOP/s\n",
        p.m, p.k, p.h, p.n, g::to_string(p.activation), bias ? " bias" : "",
        use_gpu ? "cuda " : "cpu", use_gpu ? g::to_string(path) : "",
        describe(out.tiles.layer1).c_str(), describe(out.tiles.layer2).c_str(), out.tasks, error,
        error < kTolerance ? "ok" : "FAILED", ms, iters, p.flops() / (ms * 1e9));
    if (!baseline) return error < kTolerance ? 0 : 1;
    double const baseline_error = loom::examples::relative_error(out.baseline_y, reference);
    double const baseline_ms = median(out.baseline_ms);
    std::printf(
        "baseline (cuBLAS, bias/activation kernel, cuBLAS): relative error %.3e (%s), median "
        "%.3f ms, %.2f TFLOP/s; fused / baseline speed %.2fx\n",
        baseline_error, baseline_error < kTolerance ? "ok" : "FAILED", baseline_ms,
        p.flops() / (baseline_ms * 1e9), baseline_ms / ms);
    return error < kTolerance && baseline_error < kTolerance ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fused_mlp: %s\n", e.what());
    return 2;
  }
}
