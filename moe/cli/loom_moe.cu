// loom-moe: runs the fused MoE layer on the GPU (one persistent launch per call) or on the CPU
// executor, checks it against the float64 reference, and reports latency, throughput and the
// distance to the floor. With --ranks P the experts are spread over P ranks (expert parallelism:
// P GPUs of this process, or P virtual ranks of the CPU executor), each with --tokens tokens.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>

#include "moe/cli/floor.hpp"
#include "moe/cpu_layer.hpp"
#include "moe/ep_cpu_layer.hpp"
#include "moe/ep_gpu_layer.cuh"
#include "moe/gpu_layer.cuh"
#include "moe/reference.hpp"
#include "runtime/cuda/event.hpp"
#include "runtime/cuda/scoped_device.hpp"
#include "runtime/trace.hpp"

namespace {

// Timed calls that run longer than this back to back may meet the GPU's power limit: at 30 calls
// of T = 16384 (52 ms) an H200 held its boost clocks, at 600 (1.1 s) it ran 8.7% slower.
constexpr double kShortRunSeconds = 0.1;

using namespace loom::moe;
namespace po = boost::program_options;

// Of every rank in rank order: outputs, routing and traces; expert_tokens sums the ranks' tokens
// per expert (all E).
struct Run {
  std::vector<bf16> out;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  std::vector<std::uint32_t> expert_tokens;
  std::vector<double> call_ms;
  std::vector<std::vector<loom::TraceRecord>> traces;  // one per rank
  std::string device;

  void add_rank(std::vector<std::int32_t> const& rank_ids, std::vector<float> const& rank_weights,
                std::vector<std::uint32_t> const& rank_expert_tokens) {
    ids.insert(ids.end(), rank_ids.begin(), rank_ids.end());
    weights.insert(weights.end(), rank_weights.begin(), rank_weights.end());
    expert_tokens.resize(rank_expert_tokens.size());
    for (std::size_t e = 0; e < expert_tokens.size(); ++e)
      expert_tokens[e] += rank_expert_tokens[e];
  }
};

// A progress bar on stderr for runs that take more than a couple of seconds.
class Progress {
 public:
  Progress(unsigned total, double first_call_ms)
      : total_(total), show_(total * first_call_ms > 2000.0) {}
  void step(unsigned done) const {
    if (!show_) return;
    unsigned const width = 40, filled = width * done / total_;
    std::fprintf(stderr, "\r[%s%s] %u/%u calls", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total_);
    if (done == total_) std::fprintf(stderr, "\n");
  }

 private:
  unsigned total_;
  bool show_;
};

// Trace records a call can write on one rank: four per task of the bound on its tasks.
std::size_t trace_records(MoEConfig const& c, std::uint32_t ranks) {
  return 4 * (ranks == 1 ? dynamic_bound(make_view_shape(c, choose_expert_gemms(c)))
                         : ep_dynamic_bound(
                               make_ep_shape(c, EpPlacement{0, ranks}, choose_ep_gemms(c, ranks))));
}

// With `given`, the timed calls take the caller's routing: the picks of a first call with the
// layer's router, passed in as topk_idx / topk_weights.
Run run_cpu(MoEConfig const& c, MoEWeights const& w, std::vector<bf16> const& x,
            std::uint32_t tokens, unsigned iters, bool trace, bool given) {
  loom::CpuOptions options;
  options.trace_capacity = trace ? trace_records(c, 1) : 0;
  CpuMoELayer layer(c, w, options);
  Run r;
  r.device = "CPU executor (" + std::to_string(options.processors) + " processor threads)";
  r.out.resize(std::size_t{tokens} * c.hidden);
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  if (given) {
    layer.forward(x.data(), tokens, r.out.data());
    ids = layer.topk_ids();
    weights = layer.topk_weights();
  }
  for (unsigned i = 0; i < iters; ++i) {
    layer.executor().take_trace(0);
    auto const t0 = std::chrono::steady_clock::now();
    if (given)
      layer.forward(x.data(), tokens, ids.data(), weights.data(), r.out.data());
    else
      layer.forward(x.data(), tokens, r.out.data());
    r.call_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    Progress(iters, r.call_ms[0]).step(i + 1);
  }
  r.traces = {layer.executor().take_trace(0)};
  r.add_rank(layer.topk_ids(), layer.topk_weights(), layer.expert_tokens());
  return r;
}

// Expert parallelism over `ranks` virtual ranks; rank q takes tokens [q * tokens, (q + 1) * tokens)
// of x. With `given`, as run_cpu: each rank's timed calls take its picks of a first call.
Run run_cpu_ep(MoEConfig const& c, MoEWeights const& w, std::vector<bf16> const& x,
               std::uint32_t tokens, std::uint32_t ranks, unsigned iters, bool trace, bool given) {
  loom::CpuOptions options;
  options.trace_capacity = trace ? trace_records(c, ranks) : 0;
  CpuEpMoELayer layer(c, w, ranks, options);
  Run r;
  r.device = "CPU executor, " + std::to_string(ranks) + " virtual ranks (" +
             std::to_string(options.processors) + " processor threads each)";
  r.out.resize(x.size());
  std::vector<EpRankCall> calls(ranks);
  for (std::uint32_t q = 0; q < ranks; ++q) {
    calls[q].x = x.data() + std::size_t{q} * tokens * c.hidden;
    calls[q].tokens = tokens;
    calls[q].out = r.out.data() + std::size_t{q} * tokens * c.hidden;
  }
  std::vector<std::vector<std::int32_t>> ids(ranks);
  std::vector<std::vector<float>> weights(ranks);
  if (given) {
    layer.forward(calls);
    for (std::uint32_t q = 0; q < ranks; ++q) {
      ids[q] = layer.topk_ids(q);
      weights[q] = layer.topk_weights(q);
      calls[q].ids = ids[q].data();
      calls[q].weights = weights[q].data();
    }
  }
  for (unsigned i = 0; i < iters; ++i) {
    for (std::uint32_t q = 0; q < ranks; ++q) layer.executor().take_trace(q);
    auto const t0 = std::chrono::steady_clock::now();
    layer.forward(calls);
    r.call_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    Progress(iters, r.call_ms[0]).step(i + 1);
  }
  for (std::uint32_t q = 0; q < ranks; ++q) {
    r.traces.push_back(layer.executor().take_trace(q));
    r.add_rank(layer.topk_ids(q), layer.topk_weights(q), layer.expert_tokens(q));
  }
  return r;
}

// Reads `n` 16-byte words (a buffer several times the L2): the lines it brings in are clean, and
// the dirty lines it evicts (the previous call's writes, the poisoned output) are written back
// before the timed call starts.
__global__ void read_through_l2(uint4 const* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    acc ^= __ldcg(p + i).x;
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads
}

Run run_cuda(MoEConfig const& c, MoEWeights const& w, std::vector<bf16> const& x,
             std::uint32_t tokens, unsigned iters, bool trace, bool clean_l2, bool given) {
  loom::GpuOptions options;
  options.trace_capacity = trace ? trace_records(c, 1) : 0;
  GpuMoELayer layer(c, w, options);
  cudaDeviceProp prop{};
  int dev = 0;
  LOOM_CUDA(cudaGetDevice(&dev));
  LOOM_CUDA(cudaGetDeviceProperties(&prop, dev));
  Run r;
  r.device = std::string(prop.name) + " (" + std::to_string(prop.multiProcessorCount) + " SMs, " +
             std::to_string(layer.executor().processors()) + " processors)";
  loom::DeviceBuffer<bf16> dx(x), dout(std::size_t{tokens} * c.hidden);
  loom::EventTimer timer;
  layer.forward(dx.get(), tokens, dout.get());  // warm-up (and the routing given after it)
  layer.check();
  loom::DeviceBuffer<std::int32_t> ids(given ? layer.topk_ids() : std::vector<std::int32_t>(1));
  loom::DeviceBuffer<float> weights(given ? layer.topk_weights() : std::vector<float>(1));
  std::size_t const clean_words = std::size_t{5} * prop.l2CacheSize / sizeof(uint4);
  loom::DeviceBuffer<uint4> clean(clean_l2 ? clean_words : 1);
  loom::DeviceBuffer<unsigned> sink(1);
  if (clean_l2) clean.fill_bytes(0);
  for (unsigned i = 0; i < iters; ++i) {
    dout.fill_bytes(0xFF);
    if (clean_l2) {
      read_through_l2<<<prop.multiProcessorCount * 4, 256>>>(clean.get(), clean_words, sink.get());
      LOOM_CUDA(cudaGetLastError());
    }
    layer.executor().take_trace();
    timer.start();
    if (given)
      layer.forward(dx.get(), tokens, ids.get(), weights.get(), dout.get());
    else
      layer.forward(dx.get(), tokens, dout.get());
    timer.stop();
    layer.check();
    r.call_ms.push_back(timer.seconds() * 1e3);
    Progress(iters, r.call_ms[0]).step(i + 1);
  }
  r.traces = {layer.executor().take_trace()};
  r.out = dout.download();
  r.add_rank(layer.topk_ids(), layer.topk_weights(), layer.expert_tokens());
  return r;
}

// Expert parallelism over GPUs 0 .. ranks - 1 of this process (GpuEpMoEGroup); rank q takes
// tokens [q * tokens, (q + 1) * tokens) of x. A call is timed on the host from the first rank's
// launch to the end of the last rank's stream. With `given`, as run_cuda: each rank's timed calls
// take its picks of the warm-up call.
Run run_cuda_ep(MoEConfig const& c, MoEWeights const& w, std::vector<bf16> const& x,
                std::uint32_t tokens, std::uint32_t ranks, unsigned iters, bool trace, bool given) {
  loom::GpuOptions options;
  options.trace_capacity = trace ? trace_records(c, ranks) : 0;
  std::vector<int> devices(ranks);
  for (std::uint32_t q = 0; q < ranks; ++q) devices[q] = static_cast<int>(q);
  GpuEpMoEGroup group(c, w, devices, options);
  cudaDeviceProp prop{};
  LOOM_CUDA(cudaGetDeviceProperties(&prop, 0));
  Run r;
  r.device = std::to_string(ranks) + " x " + prop.name + " (" +
             std::to_string(group.rank(0).executor().processors()) + " processors each)";
  std::size_t const rank_elems = std::size_t{tokens} * c.hidden;
  std::vector<loom::DeviceBuffer<bf16>> dx, dout;
  std::vector<EpRankCall> calls(ranks);
  for (std::uint32_t q = 0; q < ranks; ++q) {
    loom::ScopedDevice on(devices[q]);
    dx.emplace_back(
        std::vector<bf16>(x.begin() + q * rank_elems, x.begin() + (q + 1) * rank_elems));
    dout.emplace_back(rank_elems);
    calls[q].x = dx[q].get();
    calls[q].tokens = tokens;
    calls[q].out = dout[q].get();
  }
  group.forward(calls);  // warm-up (and the routing given after it)
  group.check();
  std::vector<loom::DeviceBuffer<std::int32_t>> ids;
  std::vector<loom::DeviceBuffer<float>> weights;
  for (std::uint32_t q = 0; given && q < ranks; ++q) {
    loom::ScopedDevice on(devices[q]);
    ids.emplace_back(group.rank(q).topk_ids());
    weights.emplace_back(group.rank(q).topk_weights());
    calls[q].ids = ids[q].get();
    calls[q].weights = weights[q].get();
  }
  for (unsigned i = 0; i < iters; ++i) {
    for (std::uint32_t q = 0; q < ranks; ++q) {
      loom::ScopedDevice on(devices[q]);
      dout[q].fill_bytes(0xFF);
      group.rank(q).executor().take_trace();
    }
    loom::synchronize_devices(devices);
    auto const t0 = std::chrono::steady_clock::now();
    group.forward(calls);
    group.check();
    r.call_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    Progress(iters, r.call_ms[0]).step(i + 1);
  }
  r.out.resize(x.size());
  for (std::uint32_t q = 0; q < ranks; ++q) {
    loom::ScopedDevice on(devices[q]);
    auto const o = dout[q].download();
    std::copy(o.begin(), o.end(), r.out.begin() + q * rank_elems);
    r.traces.push_back(group.rank(q).executor().take_trace());
    r.add_rank(group.rank(q).topk_ids(), group.rank(q).topk_weights(),
               group.rank(q).expert_tokens());
  }
  return r;
}

// "moe.json" -> "moe.r1.json": one trace file per rank.
std::string rank_path(std::string const& path, std::uint32_t rank) {
  std::string const suffix = ".r" + std::to_string(rank);
  auto const dot = path.rfind('.');
  return dot == std::string::npos || path.find('/', dot) != std::string::npos
             ? path + suffix
             : path.substr(0, dot) + suffix + path.substr(dot);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  MoEConfig c;
  std::uint32_t tokens = 0, ranks = 1;
  std::string act = "swiglu", router = "softmax", backend = "auto", trace_path, json_path;
  bool clean_l2 = false, given = false;
  std::uint64_t seed = 1;
  unsigned iters = 0, check_tokens = 256;
  bool check = false, no_renorm = false;
  po::options_description desc(
      "loom-moe: the fused Mixture-of-Experts layer (router -> experts -> combine) in one\n"
      "persistent launch per call. Weights and tokens are random (--seed).\n\n"
      "Examples:\n"
      "  loom-moe --check                             defaults for the backend found\n"
      "  loom-moe --tokens 4096 --hidden 2048 --ffn 2048 --experts 64 --topk 2 --iters 20\n"
      "  loom-moe --backend cpu --tokens 128 --check --trace moe.json   (open in Perfetto)\n"
      "  loom-moe --ranks 2 --tokens 8192 --experts 64 --check   experts over 2 GPUs (or 2\n"
      "                                               virtual ranks of the CPU executor)\n\n"
      "Options");
  // clang-format off
  desc.add_options()
      ("help,h", "this message")
      ("tokens", po::value(&tokens),
       "tokens per call and rank (default: 4096 on a GPU, 256 on the CPU)")
      ("max-tokens", po::value(&c.max_tokens),
       "tokens per call the layer is sized for (MoEConfig::max_tokens), at least --tokens "
       "(default: --tokens)")
      ("hidden", po::value(&c.hidden), "token width H, a multiple of 64 (default 2048 GPU, 512 CPU)")
      ("ffn", po::value(&c.ffn), "expert width D, a multiple of 64 (default 2048 GPU, 512 CPU)")
      ("experts", po::value(&c.experts), "experts E (default 64 GPU, 16 CPU)")
      ("topk", po::value(&c.top_k)->default_value(2), "experts per token, at most 8")
      ("act", po::value(&act)->default_value(act), "swiglu, gelu or relu")
      ("router", po::value(&router)->default_value(router), "softmax or sigmoid")
      ("no-renormalize", po::bool_switch(&no_renorm), "keep the top-k weights as scored")
      ("given-routing", po::bool_switch(&given),
       "time the path of the caller's routing: a first call's router picks are passed to the "
       "timed calls as topk_idx / topk_weights (with --ranks, each rank its own)")
      ("seed", po::value(&seed)->default_value(seed), "seed of the random weights and tokens")
      ("iters", po::value(&iters), "timed calls (default 20 GPU, 3 CPU)")
      ("backend", po::value(&backend)->default_value(backend), "cpu, cuda or auto")
      ("ranks", po::value(&ranks)->default_value(ranks),
       "expert parallelism: the experts spread over this many ranks (GPUs 0 .. ranks-1 of this "
       "process, or virtual ranks of the CPU executor), each with --tokens tokens; E must divide "
       "evenly")
      ("check", po::bool_switch(&check), "compare with the float64 reference")
      ("check-tokens", po::value(&check_tokens)->default_value(check_tokens),
       "tokens the reference recomputes (sampled evenly)")
      ("trace", po::value(&trace_path),
       "write the last call's tasks as Chrome-trace JSON and print a summary per task type")
      ("json", po::value(&json_path), "write the results as JSON")
      ("clean-l2", po::bool_switch(&clean_l2),
       "GPU: read five times the L2 before each timed call, so that it starts with no dirty line "
       "in L2 (the previous call's writes are written back outside the timing)");
  // clang-format on
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (backend != "cpu" && backend != "cuda" && backend != "auto")
      throw loom::Error("loom: --backend must be cpu, cuda or auto, not '" + backend + "'");
    bool const gpu = backend == "cuda" || (backend == "auto" && loom::cuda_device_count() > 0);
    if (gpu && loom::cuda_device_count() == 0)
      throw loom::Error("loom: --backend cuda, but no CUDA device is present");
    backend = gpu ? "cuda" : "cpu";
    if (clean_l2 && !gpu) throw loom::Error("loom: --clean-l2 needs the cuda backend");
    if (clean_l2 && ranks > 1) throw loom::Error("loom: --clean-l2 runs with one rank");
    if (gpu && ranks > static_cast<std::uint32_t>(loom::cuda_device_count()))
      throw loom::Error("loom: --ranks " + std::to_string(ranks) + " needs as many GPUs, found " +
                        std::to_string(loom::cuda_device_count()));
    if (!vm.count("tokens")) tokens = gpu ? 4096 : 256;
    if (!vm.count("hidden")) c.hidden = gpu ? 2048 : 512;
    if (!vm.count("ffn")) c.ffn = gpu ? 2048 : 512;
    if (!vm.count("experts")) c.experts = gpu ? 64 : 16;
    if (!vm.count("iters")) iters = gpu ? 20 : 3;
    if (iters == 0) throw loom::Error("loom: --iters must be at least 1");
    if (tokens == 0) throw loom::Error("loom: --tokens must be at least 1");
    c.activation = parse_activation(act);
    c.router = parse_router_score(router);
    c.renormalize = !no_renorm;
    if (!vm.count("max-tokens")) c.max_tokens = tokens;
    if (c.max_tokens < tokens)
      throw loom::Error("loom: --max-tokens " + std::to_string(c.max_tokens) +
                        " is below --tokens " + std::to_string(tokens));
    validate(c);
    if (ranks != 1) validate_placement(c, ranks);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "loom-moe: %s\n\nSee loom-moe --help.\n", e.what());
    return 2;
  }

  try {
    std::printf("loom-moe: T=%u H=%u D=%u E=%u top-%u %s %s%s%s, backend %s", tokens, c.hidden,
                c.ffn, c.experts, c.top_k, to_string(c.activation), to_string(c.router),
                c.renormalize ? " renormalised" : "", given ? ", routing given" : "",
                backend.c_str());
    if (c.max_tokens != tokens) std::printf(", layer sized for %u tokens", c.max_tokens);
    if (ranks > 1)
      std::printf(", %u ranks of %u experts, each with its own %u tokens", ranks, c.experts / ranks,
                  tokens);
    std::printf("\n");
    std::uint32_t const all_tokens = tokens * ranks;
    MoEWeights const w = random_weights(c, seed);
    auto const x = random_tokens(c, all_tokens, seed);
    bool const trace = !trace_path.empty();
    // The ceilings first, on a fresh device: measured after the layer's large buffers were freed,
    // the copy ran up to 11% slower, which flattered the floor ratio.
    Ceilings const ceil = backend == "cuda" ? measure_ceilings() : Ceilings{};
    Run const r =
        ranks > 1 ? (backend == "cuda" ? run_cuda_ep(c, w, x, tokens, ranks, iters, trace, given)
                                       : run_cpu_ep(c, w, x, tokens, ranks, iters, trace, given))
                  : (backend == "cuda" ? run_cuda(c, w, x, tokens, iters, trace, clean_l2, given)
                                       : run_cpu(c, w, x, tokens, iters, trace, given));

    // Work and weight bytes per rank (rank q holds experts [q * E / P, (q + 1) * E / P) and
    // routes its own tokens); the floor is the busiest rank's.
    std::uint32_t const local = c.experts / ranks;
    double flops = 0, floor_flops = 0, floor_bytes = 0;
    for (std::uint32_t q = 0; q < ranks; ++q) {
      std::uint64_t routed = 0, experts_hit = 0;
      for (std::uint32_t e = q * local; e < (q + 1) * local; ++e)
        routed += r.expert_tokens[e], experts_hit += r.expert_tokens[e] > 0;
      // The router's products and bytes count where the layer runs its router.
      double const router = given ? 0.0 : 1.0;
      double const rank_flops =
          c.expert_flops(routed) + router * 2.0 * tokens * double(c.hidden) * c.experts;
      double const rank_bytes =
          2.0 * experts_hit * (double(c.up_columns()) * c.hidden + double(c.hidden) * c.ffn) +
          router * 2.0 * c.experts * c.hidden;
      flops += rank_flops;
      if (backend == "cuda" &&
          std::max(rank_flops / ceil.tensor_flops_per_s, rank_bytes / ceil.memory_bytes_per_s) >=
              std::max(floor_flops / ceil.tensor_flops_per_s,
                       floor_bytes / ceil.memory_bytes_per_s))
        floor_flops = rank_flops, floor_bytes = rank_bytes;
    }
    double const ms = median(r.call_ms);
    std::printf("device: %s\n", r.device.c_str());
    std::printf("latency: median %.3f ms over %u calls; %.1f tokens/s; %.2f TFLOP/s\n", ms, iters,
                all_tokens / (ms * 1e-3), flops / (ms * 1e-3) / 1e12);

    double floor_ms = 0;
    if (backend == "cuda") {
      floor_ms = 1e3 * std::max(floor_flops / ceil.tensor_flops_per_s,
                                floor_bytes / ceil.memory_bytes_per_s);
      std::printf(
          "floor%s: %.3f ms = max(%.1f GFLOP / %.0f TFLOP/s cuBLAS bf16, %.1f MB expert weights "
          "hit / %.0f GB/s copy); latency / floor = %.2f\n",
          ranks > 1 ? " (the busiest rank, ceilings of GPU 0)" : "", floor_ms, floor_flops / 1e9,
          ceil.tensor_flops_per_s / 1e12, floor_bytes / 1e6, ceil.memory_bytes_per_s / 1e9,
          ms / floor_ms);
      // The ceilings are those of ten calls at boost clocks. A long run of calls back to back
      // meets the GPU's power limit (docs/moe.md, "Short runs and long runs").
      double const run_s = std::accumulate(r.call_ms.begin(), r.call_ms.end(), 0.0) * 1e-3;
      if (run_s > kShortRunSeconds)
        std::printf(
            "note: the timed calls ran %.2f s back to back, long enough that the power limit may "
            "lower the clocks; the ceilings are a short run's (loom_moe_bench measures both)\n",
            run_s);
    }

    int status = 0;
    double error = -1;
    if (check) {
      std::uint32_t const n = std::min(check_tokens, all_tokens);
      std::vector<std::uint32_t> sample(n);
      for (std::uint32_t i = 0; i < n; ++i)
        sample[i] = static_cast<std::uint32_t>(std::uint64_t{i} * all_tokens / n);
      std::vector<bf16> xs, outs;
      std::vector<std::int32_t> ids;
      std::vector<float> wts;
      for (auto t : sample) {
        xs.insert(xs.end(), x.begin() + std::size_t{t} * c.hidden,
                  x.begin() + std::size_t{t + 1} * c.hidden);
        outs.insert(outs.end(), r.out.begin() + std::size_t{t} * c.hidden,
                    r.out.begin() + std::size_t{t + 1} * c.hidden);
        ids.insert(ids.end(), r.ids.begin() + std::size_t{t} * c.top_k,
                   r.ids.begin() + std::size_t{t + 1} * c.top_k);
        wts.insert(wts.end(), r.weights.begin() + std::size_t{t} * c.top_k,
                   r.weights.begin() + std::size_t{t + 1} * c.top_k);
      }
      auto const scores = reference_scores(c, w, xs.data(), n);
      std::string const routing = check_routing(c, scores, n, ids.data(), wts.data(), 1e-3);
      auto const ref = reference_moe(c, w, xs.data(), n, ids.data(), wts.data());
      error = relative_error(outs, ref);
      bool const ok = routing.empty() && error < 1e-2;
      std::printf("check: %u tokens against float64: routing %s, relative error %.3e (%s)\n", n,
                  routing.empty() ? "ok" : routing.c_str(), error, ok ? "ok" : "FAILED");
      status = ok ? 0 : 1;
    }
    if (trace) {
      for (std::uint32_t q = 0; q < ranks; ++q) {
        std::string const path = ranks > 1 ? rank_path(trace_path, q) : trace_path;
        char const* const* names = ranks > 1 ? EpPipeline::names : MoEPipeline::names;
        std::size_t const types = ranks > 1 ? EpPipeline::size : MoEPipeline::size;
        auto const& records = r.traces[q];
        loom::write_chrome_trace(path, records, names, types, ranks > 1 ? kEpMarkNames : nullptr,
                                 ranks > 1 ? kEpMarkCount : 0);
        std::size_t const marks = static_cast<std::size_t>(
            std::count_if(records.begin(), records.end(), loom::is_trace_mark));
        std::printf(
            "trace: %zu tasks and %zu marks written to %s\n%s", records.size() - marks, marks,
            path.c_str(),
            loom::format_trace_summary(loom::summarize_trace(records), names, types).c_str());
      }
    }
    if (!json_path.empty()) {
      std::ofstream j(json_path);
      j << "{\"backend\":\"" << backend << "\",\"device\":\"" << r.device
        << "\",\"tokens\":" << tokens << ",\"max_tokens\":" << c.max_tokens
        << ",\"hidden\":" << c.hidden << ",\"ffn\":" << c.ffn << ",\"ranks\":" << ranks
        << ",\"experts\":" << c.experts << ",\"top_k\":" << c.top_k << ",\"activation\":\""
        << to_string(c.activation) << "\",\"median_ms\":" << ms
        << ",\"tokens_per_s\":" << all_tokens / (ms * 1e-3)
        << ",\"tflops\":" << flops / (ms * 1e-3) / 1e12 << ",\"floor_ms\":" << floor_ms
        << ",\"relative_error\":" << error << ",\"clean_l2\":" << (clean_l2 ? "true" : "false")
        << ",\"given_routing\":" << (given ? "true" : "false") << "}\n";
      if (!j) throw loom::Error("loom: cannot write " + json_path);
    }
    return status;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "loom-moe: %s\n", e.what());
    return 2;
  }
}
