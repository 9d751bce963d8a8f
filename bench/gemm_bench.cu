// The bf16 tile GEMM as a task graph in the persistent kernel vs cuBLAS, in the same run:
// C[m][n] = A[m][k] · B[n][k]ᵀ, bf16 in, fp32 accumulate, bf16 out, no epilogue.
//
// Each benchmark builds several input sets (A, B, and a persistent-kernel executor over the whole
// GEMM's tile graph) so that one pass over the sets reads more than twice the L2; an iteration
// times one pass of loom launches and one pass of cublasGemmEx calls with CUDA events, and
// reports loom's time per GEMM as the manual time. Counters (medians over iterations):
//   TFLOPs, cublas_TFLOPs, vs_cublas (loom / cuBLAS throughput), and for skinny shapes
//   floor_ratio = loom time / (n·k·2 bytes / HBM bandwidth), the bandwidth measured in the same
//   process with a device-to-device cudaMemcpy (bytes read + written). rel_err_vs_cublas compares
//   the two results once. The label names the tile configuration the heuristic chose.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cublas.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/event.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "tasks/gemm/device_gemm.hpp"
#include "tasks/gemm/heuristic.hpp"

namespace {

namespace g = loom::tasks::gemm;
using GemmPipeline = loom::Pipeline<loom::tasks::GemmRunTile>;

__global__ void fill_uniform_bf16(g::Bf16* out, std::size_t n, std::uint64_t seed, float scale) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29, x *= 0x94D049BB133111EBull,
        x ^= x >> 32;
    float const u = float(x & 0xFFFFFF) / float(0x1000000) * 2.0f - 1.0f;  // [-1, 1)
    out[i] = g::to_bf16(u * scale);
  }
}

void fill(loom::DeviceBuffer<g::Bf16>& buf, std::uint64_t seed, float scale) {
  fill_uniform_bf16<<<1024, 256>>>(buf.get(), buf.size(), seed, scale);
  LOOM_CUDA(cudaGetLastError());
}

using loom::EventTimer;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device-to-device copy bandwidth (read + write bytes per second), measured once per process.
double hbm_bytes_per_second() {
  static double const bw = [] {
    std::size_t const bytes = std::size_t{1} << 30;
    loom::DeviceBuffer<unsigned char> src(bytes), dst(bytes);
    src.fill_bytes(1);
    EventTimer ev;
    std::vector<double> t;
    for (int i = 0; i < 7; ++i) {
      ev.start(nullptr);
      LOOM_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice));
      t.push_back(ev.stop_seconds(nullptr));
    }
    return 2.0 * bytes / median(t);
  }();
  return bw;
}

double relative_difference(std::vector<g::Bf16> const& x, std::vector<g::Bf16> const& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const a = g::to_float(x[i]), b = g::to_float(ref[i]);
    if (std::isnan(a)) return INFINITY;
    num += (a - b) * (a - b), den += b * b;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// One traced launch of `graph` (LOOM_GEMM_TRACE set): the launch's wall time against the span of
// its tasks, and the task durations, so fixed launch costs and per-tile costs can be told apart.
template <class Pipeline>
void print_trace(loom::Graph const& graph, std::uint32_t m, std::uint32_t n, std::uint32_t k) {
  loom::GpuOptions options;
  options.trace_capacity = static_cast<std::uint32_t>(graph.tasks.size()) + 64;
  loom::GpuExecutor<Pipeline> ex(graph, options);
  ex.run();
  (void)ex.take_trace();
  EventTimer ev;
  ev.start(nullptr);
  ex.launch();
  double const wall_us = ev.stop_seconds(nullptr) * 1e6;
  ex.check();
  auto const trace = ex.take_trace();
  if (trace.empty()) return;
  std::uint64_t first = ~0ull, last = 0;
  std::vector<double> dur;
  for (auto const& r : trace) {
    first = std::min(first, r.start_ns), last = std::max(last, r.end_ns);
    dur.push_back((r.end_ns - r.start_ns) * 1e-3);
  }
  std::sort(dur.begin(), dur.end());
  if (char const* path = std::getenv("LOOM_GEMM_TRACE_CSV")) {  // every record, for gap analysis
    if (std::FILE* f = std::fopen(path, "a")) {
      for (auto const& r : trace)
        std::fprintf(f, "%u,%u,%u,%u,%llu,%llu\n", m, n, k, r.processor,
                     static_cast<unsigned long long>(r.start_ns - first),
                     static_cast<unsigned long long>(r.end_ns - first));
      std::fclose(f);
    }
  }
  std::printf(
      "trace %ux%ux%u: launch %.1f us, tasks span %.1f us, %zu tasks: min %.1f median %.1f "
      "max %.1f us\n",
      m, n, k, wall_us, (last - first) * 1e-3, trace.size(), dur.front(), dur[dur.size() / 2],
      dur.back());
}

template <class Pipeline>
struct InputSet {
  loom::DeviceBuffer<g::Bf16> a, b;
  std::unique_ptr<g::DeviceGemm> gemm;
  std::unique_ptr<loom::GpuExecutor<Pipeline>> executor;
};

// Times the GEMM of configuration `cfg` on run tasks of type Task (the wide type for the 128x224
// tile) against cuBLAS, and sets the benchmark's counters and label.
template <class Task>
void time_gemm(benchmark::State& state, cudaDeviceProp const& prop, std::uint32_t m,
               std::uint32_t n, std::uint32_t k, g::GemmConfig const& cfg, std::uint32_t chains,
               std::uint32_t raster, std::uint32_t run);

void BM_GemmVsCublas(benchmark::State& state) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  std::uint32_t const m = static_cast<std::uint32_t>(state.range(0));
  std::uint32_t const n = static_cast<std::uint32_t>(state.range(1));
  std::uint32_t const k = static_cast<std::uint32_t>(state.range(2));
  cudaDeviceProp prop{};
  int device = 0;
  LOOM_CUDA(cudaGetDevice(&device));
  LOOM_CUDA(cudaGetDeviceProperties(&prop, device));

  g::GemmShape shape;
  shape.m = m, shape.n = n, shape.k = k;
  g::GemmDeviceModel model;
  model.processors = static_cast<std::uint32_t>(prop.multiProcessorCount) - 1;
  model.wide_tile = !std::getenv("LOOM_GEMM_NO_WIDE");  // its choice runs on GemmWideRunTile
  if (char const* max_n = std::getenv("LOOM_GEMM_MAX_BLOCK_N"))  // e.g. 128: no 128x256 tiles
    model.max_block_n = static_cast<std::uint32_t>(std::atoi(max_n));
  g::GemmConfig cfg = g::choose_gemm_config(shape, model);
  // LOOM_GEMM_TILE=MxNsS (e.g. 128x256s4): that tile and split-K instead of the heuristic's, for
  // sweeps that test the heuristic's choice; the deepest pipeline the tile fits.
  if (char const* t = std::getenv("LOOM_GEMM_TILE"); t && *t) {
    unsigned bm = 0, bn = 0, splits = 1;
    if (std::sscanf(t, "%ux%us%u", &bm, &bn, &splits) < 2) {
      state.SkipWithError("LOOM_GEMM_TILE: expected MxN or MxNsS, e.g. 128x256s4");
      return;
    }
    g::GemmConfig forced = cfg;
    forced.block_m = static_cast<std::uint16_t>(bm);
    forced.block_n = static_cast<std::uint16_t>(bn);
    forced.splits = static_cast<std::uint8_t>(splits);
    std::uint32_t const k_blocks = (k + g::kBlockK - 1) / g::kBlockK;
    if (!forced.shape_supported() || splits < 1 || splits > g::kMaxSplits || splits > k_blocks ||
        (splits - 1) * g::split_k_blocks_per(k_blocks, splits) >= k_blocks) {
      state.SkipWithError("LOOM_GEMM_TILE names a tile or split-K this shape cannot take");
      return;
    }
    forced.stages = static_cast<std::uint8_t>(forced.max_stages());
    cfg = forced;
  }
  cfg.overlap = static_cast<std::uint8_t>(state.range(3));
  if (char const* st = std::getenv("LOOM_GEMM_STAGES"))  // pipeline depth, 2..the heuristic's
    cfg.stages = static_cast<std::uint8_t>(std::clamp(std::atoi(st), 2, int(cfg.stages)));
  // Tiles strung into one chain per processor (local dispatch), or independent tasks.
  std::uint32_t const chains = state.range(4) ? model.processors : 0;

  std::uint32_t raster = g::kRasterGroupM;  // LOOM_GEMM_RASTER: row tiles per raster group
  if (char const* r = std::getenv("LOOM_GEMM_RASTER")) raster = std::uint32_t(std::atoi(r));
  std::uint32_t run = g::choose_gemm_run(cfg, m, n, model);  // LOOM_GEMM_RUN: n tiles per task
  if (char const* r = std::getenv("LOOM_GEMM_RUN")) run = std::max(1, std::atoi(r));
  if (cfg.wide())
    time_gemm<loom::tasks::GemmWideRunTile>(state, prop, m, n, k, cfg, chains, raster, run);
  else
    time_gemm<loom::tasks::GemmRunTile>(state, prop, m, n, k, cfg, chains, raster, run);
}

template <class Task>
void time_gemm(benchmark::State& state, cudaDeviceProp const& prop, std::uint32_t m,
               std::uint32_t n, std::uint32_t k, g::GemmConfig const& cfg, std::uint32_t chains,
               std::uint32_t raster, std::uint32_t run) {
  using Pipeline = loom::Pipeline<Task>;
  double const set_bytes = 2.0 * (double(m) * k + double(n) * k);
  int const sets = std::clamp(int(std::ceil(2.0 * prop.l2CacheSize / set_bytes)), 2, 48);
  loom::DeviceBuffer<g::Bf16> c(std::size_t{m} * n), c_ref(std::size_t{m} * n);
  std::vector<InputSet<Pipeline>> in(sets);
  loom::Graph graph0;
  for (int i = 0; i < sets; ++i) {
    in[i].a = loom::DeviceBuffer<g::Bf16>(std::size_t{m} * k);
    in[i].b = loom::DeviceBuffer<g::Bf16>(std::size_t{n} * k);
    fill(in[i].a, 2 * i + 1, 1.0f);
    fill(in[i].b, 2 * i + 2, 1.0f / std::sqrt(float(k)));
    g::GemmDesc d;
    d.a = in[i].a.get(), d.a_rows = m, d.b = in[i].b.get(), d.n = n, d.k = k, d.c = c.get();
    in[i].gemm = std::make_unique<g::DeviceGemm>(d, cfg);
    loom::GraphBuilder builder;
    std::uint32_t slot = 0;
    g::add_gemm_tiles<Pipeline, Task>(builder, *in[i].gemm, {0, 0, 0, m}, slot, loom::kNoEvent, {},
                                      raster, chains, run);
    loom::Graph graph = builder.build();
    if (i == 0) graph0 = graph;
    in[i].executor = std::make_unique<loom::GpuExecutor<Pipeline>>(std::move(graph));
  }
  loom::CublasHandle const owner;
  cublasHandle_t const handle = owner.get();
  float const alpha = 1.0f, beta = 0.0f;
  auto cublas = [&](InputSet<Pipeline> const& s, g::Bf16* out) {
    // Column-major view: Cᵀ (n x m) = B (n x k, stored as k x n) ᵀ · Aᵀ (k x m).
    loom::check_cublas(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, s.b.get(),
                     CUDA_R_16BF, int(k), s.a.get(), CUDA_R_16BF, int(k), &beta, out, CUDA_R_16BF,
                     int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  };

  // Warm-up, and one check of loom against cuBLAS on set 0.
  c.fill_bytes(0xFF);
  in[0].executor->run();
  cublas(in[0], c_ref.get());
  LOOM_CUDA(cudaDeviceSynchronize());
  double const rel_err = relative_difference(c.download(), c_ref.download());
  for (auto& s : in) s.executor->run();
  for (auto& s : in) cublas(s, c_ref.get());
  LOOM_CUDA(cudaDeviceSynchronize());

  EventTimer ev;
  std::vector<double> loom_s, cublas_s;
  for (auto _ : state) {
    ev.start(nullptr);
    for (auto& s : in) s.executor->launch();
    double const t_loom = ev.stop_seconds(nullptr) / sets;
    ev.start(nullptr);
    for (auto& s : in) cublas(s, c_ref.get());
    double const t_cublas = ev.stop_seconds(nullptr) / sets;
    state.SetIterationTime(t_loom);
    loom_s.push_back(t_loom);
    cublas_s.push_back(t_cublas);
  }
  for (auto& s : in) s.executor->check();
  if (std::getenv("LOOM_GEMM_TRACE")) print_trace<Pipeline>(graph0, m, n, k);

  double const flops = 2.0 * m * n * k;
  double const t_loom = median(loom_s), t_cublas = median(cublas_s);
  state.counters["TFLOPs"] = flops / t_loom * 1e-12;
  state.counters["cublas_TFLOPs"] = flops / t_cublas * 1e-12;
  state.counters["vs_cublas"] = t_cublas / t_loom;
  state.counters["loom_us"] = t_loom * 1e6;
  state.counters["cublas_us"] = t_cublas * 1e6;
  state.counters["rel_err_vs_cublas"] = rel_err;
  if (m <= 512) {
    double const floor_s = 2.0 * n * k / hbm_bytes_per_second();
    state.counters["floor_ratio"] = t_loom / floor_s;
    state.counters["cublas_floor_ratio"] = t_cublas / floor_s;
    state.counters["hbm_TBs"] = hbm_bytes_per_second() * 1e-12;
  }
  state.SetLabel(std::string(prop.name) + ", tile " + std::to_string(cfg.block_m) + "x" +
                 std::to_string(cfg.block_n) + " split " + std::to_string(cfg.splits) + " stages " +
                 std::to_string(cfg.stages) + (cfg.overlap ? "" : " no-overlap") + " raster " +
                 std::to_string(raster) + (run > 1 ? " run " + std::to_string(run) : "") +
                 (chains ? " chained" : " independent") + ", " + std::to_string(sets) +
                 " input sets");
}

// What a bare launch of the persistent kernel's shape costs: the same grid, block and dynamic
// shared memory, an empty body.
__global__ void empty_wide_kernel() {
  extern __shared__ uint4 unused[];
  (void)unused;
}

// Writes the global timer (the clock the trace uses) when it runs: launched just before and just
// after a traced persistent launch, it brackets the tile's start and end.
__global__ void stamp_kernel(std::uint64_t* out) {
  *out = loom::now_ns();
}

// The fixed cost of one persistent launch carrying one tiny GEMM tile (1 x 64 x 64): the floor
// under every GEMM in this benchmark, and its parts. Counters (µs, medians):
//   launch_us           back-to-back launches of the persistent kernel with that one tile;
//   bare_coop_us        back-to-back cooperative launches of an empty kernel of the same shape;
//   bare_us             the same, launched without the cooperative attribute;
// and from traced launches bracketed by stamp kernels on the same stream:
//   to_first_ask_us     the stamp kernel before it to the processor's first request for a task;
//   first_wait_us       that request to the doorbell that hands it the tile (start-up handshake);
//   tile_us             the tile task itself;
//   after_tile_us       the tile's end to the stamp kernel after the launch (end of the graph,
//                       stop doorbells, blocks leaving, the next launch starting).
void BM_GemmLaunchFloor(benchmark::State& state) {
  if (loom::cuda_device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  loom::DeviceBuffer<g::Bf16> a(64 * 64), b(64 * 64), c(64 * 64);
  fill(a, 1, 1.0f);
  fill(b, 2, 1.0f);
  g::GemmDesc d;
  d.a = a.get(), d.a_rows = 1, d.b = b.get(), d.n = 64, d.k = 64, d.c = c.get();
  g::GemmConfig cfg;
  cfg.block_m = 128, cfg.block_n = 64, cfg.stages = 2;
  g::DeviceGemm gemm(d, cfg);
  loom::GraphBuilder builder;
  std::uint32_t slot = 0;
  g::add_gemm_tiles<GemmPipeline, loom::tasks::GemmRunTile>(builder, gemm, {0, 0, 0, 1}, slot);
  loom::Graph const graph = builder.build();
  loom::GpuExecutor<GemmPipeline> ex(graph);
  ex.run();
  loom::GpuOptions traced_options;
  traced_options.trace_capacity = 64;
  loom::GpuExecutor<GemmPipeline> traced(graph, traced_options);
  traced.run();
  (void)traced.take_trace();

  auto const shape = ex.shape();
  LOOM_CUDA(cudaFuncSetAttribute(empty_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(shape.shared_bytes)));
  auto bare = [&](bool cooperative) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(shape.grid);
    config.blockDim = dim3(shape.threads);
    config.dynamicSmemBytes = shape.shared_bytes;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = cooperative ? 1 : 0;
    LOOM_CUDA(cudaLaunchKernelEx(&config, empty_wide_kernel));
  };
  loom::DeviceBuffer<std::uint64_t> stamps(2);

  EventTimer ev;
  constexpr int kLaunches = 20;
  std::vector<double> t, coop, plain, to_ask, wait, tile, after;
  auto timed = [&](auto&& launch_once) {
    ev.start(nullptr);
    for (int i = 0; i < kLaunches; ++i) launch_once();
    return ev.stop_seconds(nullptr) / kLaunches;
  };
  for (auto _ : state) {
    double const s = timed([&] { ex.launch(); });
    state.SetIterationTime(s);
    t.push_back(s);
    coop.push_back(timed([&] { bare(true); }));
    plain.push_back(timed([&] { bare(false); }));
    stamp_kernel<<<1, 1>>>(stamps.get());
    traced.launch();
    stamp_kernel<<<1, 1>>>(stamps.get() + 1);
    traced.check();
    auto const trace = traced.take_trace();
    auto const st = stamps.download();
    if (trace.size() != 1) throw loom::Error("launch floor: expected one trace record");
    auto const& r = trace[0];
    to_ask.push_back((double(r.start_ns) - r.wait_ns - double(st[0])) * 1e-9);
    wait.push_back(r.wait_ns * 1e-9);
    tile.push_back((double(r.end_ns) - double(r.start_ns)) * 1e-9);
    after.push_back((double(st[1]) - double(r.end_ns)) * 1e-9);
  }
  ex.check();
  state.counters["launch_us"] = median(t) * 1e6;
  state.counters["bare_coop_us"] = median(coop) * 1e6;
  state.counters["bare_us"] = median(plain) * 1e6;
  state.counters["to_first_ask_us"] = median(to_ask) * 1e6;
  state.counters["first_wait_us"] = median(wait) * 1e6;
  state.counters["tile_us"] = median(tile) * 1e6;
  state.counters["after_tile_us"] = median(after) * 1e6;
}
BENCHMARK(BM_GemmLaunchFloor)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);

// How every BM_GemmVsCublas shape is timed: manual time (CUDA events), 30 iterations.
void timed(benchmark::internal::Benchmark* b) {
  b->UseManualTime()->Iterations(30)->Unit(benchmark::kMicrosecond);
}

// Arguments: m, n, k, overlap (1: one K block's wgmma group kept in flight, the default),
// chained (1: one chain of tiles per processor, the default; 0: independent tile tasks).
BENCHMARK(BM_GemmVsCublas)
    ->Args({8192, 8192, 8192, 1, 1})
    ->Args({8192, 8192, 8192, 1, 0})
    ->Args({4096, 4096, 4096, 1, 1})
    ->Args({4096, 4096, 4096, 1, 0})
    ->Args({128, 2048, 2048, 1, 1})
    ->Args({256, 2048, 2048, 1, 1})
    ->Args({512, 2048, 2048, 1, 1})
    ->Args({128, 7168, 7168, 1, 1})
    ->Args({256, 7168, 7168, 1, 1})
    ->Args({512, 7168, 7168, 1, 1})
    ->Args({1024, 7168, 7168, 1, 1})  // medium M at N = 7168: the 128x224 tile's other shapes
    ->Args({2048, 7168, 7168, 1, 1})
    ->Apply(timed);

}  // namespace

// LOOM_GEMM_SHAPES=MxNxK[,MxNxK...] adds those shapes (chained, overlap on) to BM_GemmVsCublas,
// for sweeps of the heuristic beyond the fixed list; LOOM_GEMM_NO_WIDE=1 keeps the model from the
// 128x224 tile (as a caller of the default task types sees it).
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (char const* list = std::getenv("LOOM_GEMM_SHAPES")) {
    for (char const* at = list; *at;) {
      unsigned m = 0, n = 0, k = 0;
      int used = 0;
      if (std::sscanf(at, "%ux%ux%u%n", &m, &n, &k, &used) != 3 || m == 0 || n == 0 || k == 0) {
        std::fprintf(stderr, "LOOM_GEMM_SHAPES: expected MxNxK[,MxNxK...], at '%s'\n", at);
        return 2;
      }
      timed(
          benchmark::RegisterBenchmark("BM_GemmVsCublas", BM_GemmVsCublas)->Args({m, n, k, 1, 1}));
      at += used;
      if (*at == ',') ++at;
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
