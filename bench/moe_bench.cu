// The fused MoE layer (GpuMoELayer, one persistent launch per call) against the unfused baseline a
// user would otherwise write (bench/moe_baseline.cuh: cuBLAS router, CUB sort, per-expert cuBLAS
// GEMMs, separate activation / gather / combine kernels), on the same inputs, weights and
// routing, in the same process:
//   - given routing: both take the routing the fused router chose on the first call, so both
//     compute the same function (their outputs are compared once per config and the relative
//     difference is printed);
//   - with router: each runs its own router.
// The baseline's expert GEMMs are dispatched two ways: one cublasGemmEx per non-empty expert, and
// one cublasGemmGroupedBatchedEx. Each call is timed with CUDA events after two warm-up calls; the
// summary at the end gives per-call medians over every timed call, each baseline's time over the
// fused layer's (> 1: fused is faster), tokens/s, TFLOP/s (expert GEMMs, plus the router where it
// runs), and each time over the floor = max(FLOPs / cuBLAS bf16 peak, bytes of expert weights
// hit / copy bandwidth), both ceilings measured once at start-up (moe/cli/floor.cu). Each case
// runs its calls back to back for half a second or more, long enough for the GPU's power limit to
// pull its clocks down under tensor-core work, so x_floor takes the ceilings sustained over as long
// a run; x_burst takes those of ten calls at boost clocks, as a short run (loom-moe) sees them.
#include <benchmark/benchmark.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/moe_baseline.cuh"
#include "moe/cli/floor.hpp"
#include "moe/gpu_layer.cuh"
#include "runtime/cuda/event.hpp"

namespace {

using namespace loom::moe;

// ----- Configurations (the issue's) -----

struct Model {
  char const* name;
  MoEConfig config;
};

MoEConfig make_config(std::uint32_t hidden, std::uint32_t ffn, std::uint32_t experts,
                      std::uint32_t top_k, std::uint32_t max_tokens) {
  MoEConfig c;
  c.hidden = hidden, c.ffn = ffn, c.experts = experts, c.top_k = top_k;
  c.activation = Activation::swiglu, c.router = RouterScore::softmax, c.max_tokens = max_tokens;
  return c;
}

Model const kModels[] = {
    {"prefill", make_config(2048, 2048, 64, 2, 16384)},
    {"decode", make_config(7168, 2048, 64, 8, 128)},
};

struct Case {
  std::size_t model;
  std::uint32_t tokens;
};

Case const kCases[] = {{0, 1024}, {0, 4096}, {0, 16384}, {1, 128}};

std::string case_name(Case const& c) {
  MoEConfig const& m = kModels[c.model].config;
  return std::string(kModels[c.model].name) + "_T" + std::to_string(c.tokens) + "_H" +
         std::to_string(m.hidden) + "_D" + std::to_string(m.ffn) + "_E" +
         std::to_string(m.experts) + "_k" + std::to_string(m.top_k);
}

enum class Impl { fused, baseline_per_expert, baseline_grouped };
enum class Mode { given_routing, with_router };

char const* to_string(Impl i) {
  return i == Impl::fused                 ? "fused"
         : i == Impl::baseline_per_expert ? "baseline_per_expert"
                                          : "baseline_grouped";
}
char const* to_string(Mode m) {
  return m == Mode::given_routing ? "given_routing" : "with_router";
}

// ----- Fast random weights: a counter-based hash filled in parallel (the decode config's 2.8 G
// weights take about a minute through random_weights on one thread). Same scales as
// random_weights. -----

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<bf16> hashed_uniform(std::size_t n, float scale, std::uint64_t stream) {
  std::vector<bf16> v(n);
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<std::size_t>(0, n, std::size_t{1} << 16), [&](auto const& r) {
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          std::uint64_t const bits = splitmix64(stream * 0xD1B54A32D192ED03ull + i);
          float const u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
          v[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
        }
      });
  return v;
}

MoEWeights fast_random_weights(MoEConfig const& c, std::uint64_t seed) {
  std::size_t const e = c.experts, h = c.hidden, d = c.ffn;
  MoEWeights w;
  w.router = hashed_uniform(e * h, 2.0f / std::sqrt(float(h)), 4 * seed + 0);
  w.gate = hashed_uniform(e * d * h, 1.0f / std::sqrt(float(h)), 4 * seed + 1);
  if (c.activation == Activation::swiglu)
    w.up = hashed_uniform(e * d * h, 1.0f / std::sqrt(float(h)), 4 * seed + 2);
  w.down = hashed_uniform(e * h * d, 1.0f / std::sqrt(float(d)), 4 * seed + 3);
  return w;
}

// ----- What the benchmarks share: one model on the device at a time, one set of inputs per case.

struct Loaded {
  std::size_t model = ~std::size_t{0};
  std::unique_ptr<GpuMoELayer> fused;
  std::unique_ptr<UnfusedMoELayer> baseline;
};

struct Inputs {
  loom::DeviceBuffer<bf16> x, out;
  loom::DeviceBuffer<std::int32_t> ids;  // the fused router's choice on the first call
  loom::DeviceBuffer<float> weights;
};

// What the summary needs of a case once its buffers are gone.
struct CaseInfo {
  std::uint64_t routed = 0, experts_hit = 0;
  double fused_vs_baseline = 0;  // relative difference of the outputs on the given routing
};

cudaStream_t g_stream = nullptr;
// How long each ceiling's calls run back to back for the sustained rate: as long as a case's
// timed calls (five repetitions of at least 0.1 s).
constexpr double kSustainSeconds = 1.0;
Ceilings g_ceilings;        // sustained over a long run: the floor of x_floor
Ceilings g_burst_ceilings;  // of a short run: x_burst
std::string g_device;
Loaded g_loaded;
std::map<std::size_t, std::unique_ptr<Inputs>> g_inputs;  // cases of the loaded model
std::map<std::size_t, CaseInfo> g_info;

double relative_difference(std::vector<bf16> const& a, std::vector<bf16> const& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double const x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));  // NaN propagates
}

Loaded& load(std::size_t model) {
  if (g_loaded.model == model) return g_loaded;
  g_inputs.clear();
  g_loaded = Loaded{};
  MoEConfig const& c = kModels[model].config;
  MoEWeights const w = fast_random_weights(c, 1234 + model);
  g_loaded.fused = std::make_unique<GpuMoELayer>(c, w);
  g_loaded.baseline = std::make_unique<UnfusedMoELayer>(c, w);
  g_loaded.model = model;
  return g_loaded;
}

Inputs& inputs(std::size_t case_index) {
  Case const& cs = kCases[case_index];
  Loaded& l = load(cs.model);
  auto& slot = g_inputs[case_index];
  if (slot) return *slot;
  MoEConfig const& c = kModels[cs.model].config;
  auto in = std::make_unique<Inputs>();
  std::size_t const elems = std::size_t{cs.tokens} * c.hidden;
  in->x = loom::DeviceBuffer<bf16>(hashed_uniform(elems, 1.0f, 977 + case_index));
  in->out = loom::DeviceBuffer<bf16>(elems);
  l.fused->forward(in->x.get(), cs.tokens, in->out.get(), g_stream);
  l.fused->check(g_stream);
  auto const ids = l.fused->topk_ids();
  in->ids = loom::DeviceBuffer<std::int32_t>(ids);
  in->weights = loom::DeviceBuffer<float>(l.fused->topk_weights());
  CaseInfo& info = g_info[case_index];
  std::vector<bool> hit(c.experts, false);
  for (auto e : ids)
    if (e >= 0) ++info.routed, hit[static_cast<std::size_t>(e)] = true;
  info.experts_hit = static_cast<std::uint64_t>(std::count(hit.begin(), hit.end(), true));

  // Both compute the same function on the given routing: compare once.
  in->out.fill_bytes(0xFF);
  l.fused->forward(in->x.get(), cs.tokens, in->ids.get(), in->weights.get(), in->out.get(),
                   g_stream);
  l.fused->check(g_stream);
  auto const fused_out = in->out.download();
  in->out.fill_bytes(0xFF);
  l.baseline->set_dispatch(ExpertGemmDispatch::per_expert);
  l.baseline->forward(in->x.get(), cs.tokens, in->ids.get(), in->weights.get(), in->out.get(),
                      g_stream);
  LOOM_CUDA(cudaStreamSynchronize(g_stream));
  info.fused_vs_baseline = relative_difference(fused_out, in->out.download());
  slot = std::move(in);
  return *slot;
}

struct Work {
  double flops, bytes, floor_s, burst_floor_s;
};

Work work(std::size_t case_index, Mode mode) {
  CaseInfo const& in = g_info.at(case_index);
  Case const& cs = kCases[case_index];
  MoEConfig const& c = kModels[cs.model].config;
  bool const router = mode == Mode::with_router;
  double const flops =
      c.expert_flops(in.routed) + (router ? 2.0 * cs.tokens * double(c.hidden) * c.experts : 0.0);
  double const bytes =
      2.0 * in.experts_hit * (double(c.up_columns()) * c.hidden + double(c.hidden) * c.ffn) +
      (router ? 2.0 * c.experts * c.hidden : 0.0);
  auto const floor_of = [&](Ceilings const& c) {
    return std::max(flops / c.tensor_flops_per_s, bytes / c.memory_bytes_per_s);
  };
  return {flops, bytes, floor_of(g_ceilings), floor_of(g_burst_ceilings)};
}

// Per-call times of every timed call, by (case, mode, implementation), for the summary.
std::map<std::tuple<std::size_t, Mode, Impl>, std::vector<double>> g_times;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

using loom::EventTimer;

void BM_MoE(benchmark::State& state, std::size_t case_index, Mode mode, Impl impl) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  std::uint32_t const tokens = kCases[case_index].tokens;
  std::vector<double> seconds;
  try {
    Inputs* in = &inputs(case_index);
    Loaded& l = g_loaded;
    bool const given = mode == Mode::given_routing;
    if (impl != Impl::fused)
      l.baseline->set_dispatch(impl == Impl::baseline_grouped ? ExpertGemmDispatch::grouped
                                                              : ExpertGemmDispatch::per_expert);
    auto call = [&] {
      if (impl == Impl::fused) {
        if (given)
          l.fused->forward(in->x.get(), tokens, in->ids.get(), in->weights.get(), in->out.get(),
                           g_stream);
        else
          l.fused->forward(in->x.get(), tokens, in->out.get(), g_stream);
      } else {
        if (given)
          l.baseline->forward(in->x.get(), tokens, in->ids.get(), in->weights.get(), in->out.get(),
                              g_stream);
        else
          l.baseline->forward(in->x.get(), tokens, in->out.get(), g_stream);
      }
    };
    auto finish = [&] {
      if (impl == Impl::fused)
        l.fused->check(g_stream);
      else
        LOOM_CUDA(cudaStreamSynchronize(g_stream));
    };
    for (int i = 0; i < 2; ++i) call(), finish();  // warm-up
    EventTimer timer;
    for (auto _ : state) {
      timer.start(g_stream);
      call();
      double const s = timer.stop_seconds(g_stream);
      finish();
      state.SetIterationTime(s);
      seconds.push_back(s);
    }
  } catch (loom::Error const& e) {
    state.SkipWithError(e.what());
    return;
  }
  auto& all = g_times[{case_index, mode, impl}];
  all.insert(all.end(), seconds.begin(), seconds.end());
  double const med = median(seconds);
  Work const w = work(case_index, mode);
  state.counters["median_ms"] = med * 1e3;
  state.counters["tokens_per_s"] = tokens / med;
  state.counters["TFLOP_per_s"] = w.flops / med / 1e12;
  state.counters["x_floor"] = med / w.floor_s;
  state.counters["x_burst"] = med / w.burst_floor_s;
  state.SetLabel(g_device);
}

void print_summary() {
  if (g_times.empty()) return;
  std::printf(
      "\nceilings (measured at start), sustained: %.0f TFLOP/s cuBLAS bf16, %.0f GB/s copy; "
      "burst: %.0f TFLOP/s, %.0f GB/s; %s\n",
      g_ceilings.tensor_flops_per_s / 1e12, g_ceilings.memory_bytes_per_s / 1e9,
      g_burst_ceilings.tensor_flops_per_s / 1e12, g_burst_ceilings.memory_bytes_per_s / 1e9,
      g_device.c_str());
  std::printf("%-38s %-13s %-19s %9s %12s %9s %8s %8s %8s\n", "config", "routing", "implementation",
              "median_ms", "tokens/s", "TFLOP/s", "x_floor", "x_burst", "speedup");
  for (std::size_t ci = 0; ci < std::size(kCases); ++ci) {
    auto const it = g_info.find(ci);
    for (Mode mode : {Mode::given_routing, Mode::with_router}) {
      auto const fused = g_times.find({ci, mode, Impl::fused});
      double const fused_ms = fused == g_times.end() ? 0 : median(fused->second) * 1e3;
      for (Impl impl : {Impl::fused, Impl::baseline_per_expert, Impl::baseline_grouped}) {
        auto const t = g_times.find({ci, mode, impl});
        if (t == g_times.end() || it == g_info.end()) continue;
        double const s = median(t->second);
        Work const w = work(ci, mode);
        char speedup[32] = "";
        if (impl != Impl::fused && fused_ms > 0)
          std::snprintf(speedup, sizeof speedup, "%.2f", s * 1e3 / fused_ms);
        std::printf("%-38s %-13s %-19s %9.3f %12.4g %9.1f %8.2f %8.2f %8s\n",
                    case_name(kCases[ci]).c_str(), to_string(mode), to_string(impl), s * 1e3,
                    kCases[ci].tokens / s, w.flops / s / 1e12, s / w.floor_s, s / w.burst_floor_s,
                    speedup);
      }
    }
    if (it != g_info.end()) {
      Work const w = work(ci, Mode::given_routing);
      std::printf(
          "%-38s floor %.3f ms (given routing): %.1f GFLOP, %.0f MB of %llu experts' "
          "weights; routed pairs %llu; fused vs baseline output rel. diff %.2e\n",
          case_name(kCases[ci]).c_str(), w.floor_s * 1e3, w.flops / 1e9, w.bytes / 1e6,
          static_cast<unsigned long long>(it->second.experts_hit),
          static_cast<unsigned long long>(it->second.routed), it->second.fused_vs_baseline);
    }
  }
  std::printf("speedup = baseline median / fused median (> 1: the fused layer is faster)\n");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bool const gpu = loom::cuda_device_count() > 0;
  if (gpu) {
    cudaDeviceProp prop{};
    int device = 0;
    LOOM_CUDA(cudaGetDevice(&device));
    LOOM_CUDA(cudaGetDeviceProperties(&prop, device));
    g_device = std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs";
    LOOM_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    g_burst_ceilings = measure_ceilings();
    g_ceilings = measure_ceilings(kSustainSeconds);
    std::printf(
        "device: %s; ceilings sustained over %.1f s: %.0f TFLOP/s bf16 (cuBLAS 8192^3), %.0f GB/s "
        "(copy); of ten calls: %.0f TFLOP/s, %.0f GB/s\n",
        g_device.c_str(), kSustainSeconds, g_ceilings.tensor_flops_per_s / 1e12,
        g_ceilings.memory_bytes_per_s / 1e9, g_burst_ceilings.tensor_flops_per_s / 1e12,
        g_burst_ceilings.memory_bytes_per_s / 1e9);
  }
  for (std::size_t ci = 0; ci < std::size(kCases); ++ci)
    for (Mode mode : {Mode::given_routing, Mode::with_router})
      for (Impl impl : {Impl::fused, Impl::baseline_per_expert, Impl::baseline_grouped}) {
        std::string const name =
            "MoE/" + case_name(kCases[ci]) + "/" + to_string(mode) + "/" + to_string(impl);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& s) { BM_MoE(s, ci, mode, impl); })
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.1)
            ->Repetitions(5)
            ->ReportAggregatesOnly(true);
      }
  benchmark::RunSpecifiedBenchmarks();
  print_summary();
  benchmark::Shutdown();
  g_inputs.clear();
  g_loaded = Loaded{};
  if (g_stream) cudaStreamDestroy(g_stream);
  return 0;
}
