// The expert-parallel MoE layer (GpuEpMoEGroup: one persistent launch per GPU per call, dispatch
// and combine as tasks over NCCL symmetric windows) against the unfused baseline a user would
// otherwise write (bench/ep_baseline.cuh: grouped ncclSend/ncclRecv all-to-all, the single-GPU
// unfused layer on each rank's experts, all-to-all back), on the same inputs, weights and routing,
// in one process driving P GPUs.
//
// Weak scaling: fixed tokens per GPU, P = 1, 2, 4 (as many as present); the overlap efficiency is
// T(1) / T(P) of the fused layer, printed at P >= 2 (given routing and router) when P = 1 ran
// too. A call is timed on the host from the first launch to the end of the last rank's stream,
// after two warm-up calls; medians over --iters calls.
//   - "given": both take the routing the fused router chose on the warm-up call;
//   - "router": the fused layer with its router (the baseline has none in EP form).
// Columns: median ms, MTokens/s (all ranks' tokens per second), speedup = baseline / fused.
//
// --sweep runs FlashDMoE's setting instead: H = D = 2048, top-2, SwiGLU, E in {8, 16, 32, 64,
// 128} experts in all (the same E at every P, so each rank holds E / P), 1024 to 16384 tokens
// per GPU, at P = 1, 2, 4, 8 as present.
//
// At P >= 2 the run first measures the LSA store bandwidth (every rank storing through NCCL's
// peer pointers into every other rank's window at once, the dispatch's traffic pattern). With
// --trace it also reports the dispatch's rate on each rank: the bytes its send tasks stored into
// other ranks' windows (rows and metas) over the window from the first send task's start to the
// last one's end. --trace writes one call with given routing (PREFIX.NAME.PN.rR.json) and one
// with the router (PREFIX.NAME-router.PN.rR.json) per rank.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/ep_baseline.cuh"
#include "moe/ep_gpu_layer.cuh"
#include "moe/reference.hpp"
#include "runtime/cuda/nccl_heap.hpp"
#include "runtime/cuda/scoped_device.hpp"
#include "runtime/trace.hpp"

namespace {

using namespace loom::moe;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Scenario {
  std::string name;
  std::uint32_t hidden, ffn;
  std::uint32_t experts;  // per rank, or in all when experts_fixed
  std::uint32_t top_k, tokens_per_rank;
  bool experts_fixed = false;  // the same experts over every world size (the sweep)
  bool measure_links = true;   // the LSA store bandwidth first, at P >= 2

  std::uint32_t experts_for(std::uint32_t world) const {
    return experts_fixed ? experts : experts * world;
  }
};

struct RankInputs {
  loom::DeviceBuffer<bf16> x, out, base_out;
  loom::DeviceBuffer<std::int32_t> ids;
  loom::DeviceBuffer<float> weights;
};

// Every rank stores `chunks` 16-byte words into each peer's window; block b serves peer
// b % peers (the grid is a multiple of peers).
struct PeerTargets {
  uint4* dst[loom::kMaxRanks];
  std::uint32_t count;
};

__global__ void store_to_peers(PeerTargets t, std::size_t chunks) {
  std::uint32_t const peer = blockIdx.x % t.count, blocks = gridDim.x / t.count;
  uint4 const v = make_uint4(threadIdx.x, blockIdx.x, 0u, 0u);
  for (std::size_t i = std::size_t{blockIdx.x / t.count} * blockDim.x + threadIdx.x; i < chunks;
       i += std::size_t{blocks} * blockDim.x)
    t.dst[peer][i] = v;
}

// GB/s leaving each rank while every rank stores into every other rank's window at once: one
// 512-thread block per SM, 256 MiB a window (a slice per source rank), median of 10.
double lsa_store_gbps(std::vector<int> const& devices) {
  std::uint32_t const world = static_cast<std::uint32_t>(devices.size());
  std::uint64_t const window = std::uint64_t{256} << 20, slice = window / world;
  std::vector<loom::NcclCommunicator> comms = loom::NcclCommunicator::init_all(devices);
  loom::NcclSymmetricHeapSet heaps = loom::NcclSymmetricHeap::create_all(comms, window);
  std::size_t const chunks = slice / sizeof(uint4);
  auto store_all = [&] {
    for (std::uint32_t r = 0; r < world; ++r) {
      loom::ScopedDevice on(devices[r]);
      loom::SymmetricView const view = heaps[r].view();
      PeerTargets t{};
      for (std::uint32_t d = 0; d < world; ++d)
        if (d != r)
          t.dst[t.count++] = static_cast<uint4*>(view.peer(
              d, static_cast<void*>(static_cast<unsigned char*>(heaps[r].local()) + r * slice)));
      int sms = 0;
      LOOM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, devices[r]));
      store_to_peers<<<sms / t.count * t.count, 512>>>(t, chunks);
      LOOM_CUDA(cudaGetLastError());
    }
  };
  store_all();  // warm-up
  loom::synchronize_devices(devices);
  std::vector<double> t;
  for (int i = 0; i < 10; ++i) {
    auto const t0 = Clock::now();
    store_all();
    loom::synchronize_devices(devices);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(slice) * (world - 1) / median(t) / 1e9;
}

// Bytes rank r's route tasks store into other ranks' windows: per token and other rank holding
// one of its experts, its row and its 32-byte meta.
double dispatch_bytes(MoEConfig const& c, std::vector<std::int32_t> const& ids, std::uint32_t rank,
                      std::uint32_t world) {
  std::uint32_t const local = c.experts / world;
  double rows = 0;
  for (std::size_t t = 0; t < ids.size() / c.top_k; ++t) {
    std::uint32_t mask = 0;
    for (std::uint32_t j = 0; j < c.top_k; ++j)
      if (std::int32_t const e = ids[t * c.top_k + j]; e >= 0) mask |= 1u << (e / local);
    rows += __builtin_popcount(mask & ~(1u << rank));
  }
  return rows * (double(c.hidden) * sizeof(bf16) + sizeof(RowMeta));
}

// The fused layer's medians of one run, in seconds.
struct FusedTimes {
  double router = 0, given = 0;
};

// Runs scenario `s` on `world` GPUs and returns the fused layer's medians. `at_one`: the same
// scenario's medians at P = 1 when they were measured in this run (then the overlap efficiency
// T(1) / T(P) is printed and written), else null.
FusedTimes run(Scenario const& s, std::uint32_t world, int iters, FILE* json, bool& first_json,
               std::string const& trace_prefix, FusedTimes const* at_one) {
  MoEConfig c;
  c.hidden = s.hidden, c.ffn = s.ffn, c.experts = s.experts_for(world), c.top_k = s.top_k;
  c.activation = Activation::swiglu, c.router = RouterScore::softmax;
  c.max_tokens = s.tokens_per_rank;
  std::vector<int> devices(world);
  for (std::uint32_t r = 0; r < world; ++r) devices[r] = static_cast<int>(r);
  double const lsa = world > 1 && s.measure_links ? lsa_store_gbps(devices) : 0.0;
  if (lsa > 0)
    std::printf("P=%u: LSA stores, every rank to every other at once: %.1f GB/s out of each rank\n",
                world, lsa);
  MoEWeights const w = random_weights(c, 1234);
  loom::GpuOptions options;
  if (!trace_prefix.empty())
    options.trace_capacity =
        4 * ep_dynamic_bound(make_ep_shape(c, EpPlacement{0, world}, choose_ep_gemms(c, world)));
  GpuEpMoEGroup fused(c, w, devices, options);
  std::vector<RankInputs> in(world);
  for (std::uint32_t r = 0; r < world; ++r) {
    loom::ScopedDevice on(devices[r]);
    in[r].x = loom::DeviceBuffer<bf16>(random_tokens(c, s.tokens_per_rank, 77 + r));
    in[r].out = loom::DeviceBuffer<bf16>(std::size_t{s.tokens_per_rank} * c.hidden);
    in[r].base_out = loom::DeviceBuffer<bf16>(std::size_t{s.tokens_per_rank} * c.hidden);
  }
  auto fused_calls = [&](bool given) {
    std::vector<EpRankCall> calls(world);
    for (std::uint32_t r = 0; r < world; ++r) {
      calls[r].x = in[r].x.get();
      calls[r].tokens = s.tokens_per_rank;
      calls[r].out = in[r].out.get();
      if (given) calls[r].ids = in[r].ids.get(), calls[r].weights = in[r].weights.get();
    }
    return calls;
  };
  // Warm-up with the router; its routing is what both layers take in the "given" runs.
  for (int i = 0; i < 2; ++i) {
    fused.forward(fused_calls(false));
    fused.check();
  }
  for (std::uint32_t r = 0; r < world; ++r) {
    auto const ids = fused.rank(r).topk_ids();
    auto const wts = fused.rank(r).topk_weights();
    loom::ScopedDevice on(devices[r]);
    in[r].ids = loom::DeviceBuffer<std::int32_t>(ids);
    in[r].weights = loom::DeviceBuffer<float>(wts);
  }
  // Medians of the whole call and of its enqueueing alone (forward(): every rank's launch).
  auto time_fused = [&](bool given) {
    std::vector<double> t, enqueue;
    for (int i = 0; i < iters + 2; ++i) {
      loom::synchronize_devices(devices);
      auto const t0 = Clock::now();
      fused.forward(fused_calls(given));
      auto const t1 = Clock::now();
      fused.check();
      if (i < 2) continue;
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      enqueue.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    return std::pair{median(t), median(enqueue)};
  };
  auto const [fused_router, enqueue_router] = time_fused(false);
  auto const [fused_given, enqueue_given] = time_fused(true);
  double dispatch_gbps = 0;  // the fastest rank's, when traced
  // One more call with the router and one with given routing, traced on every rank.
  for (bool const given : {false, true}) {
    if (trace_prefix.empty()) break;
    for (std::uint32_t r = 0; r < world; ++r) fused.rank(r).executor().take_trace();
    fused.forward(fused_calls(given));
    fused.check();
    for (std::uint32_t r = 0; r < world; ++r) {
      std::string const path = trace_prefix + "." + s.name + (given ? "" : "-router") + ".P" +
                               std::to_string(world) + ".r" + std::to_string(r) + ".json";
      std::vector<loom::TraceRecord> const trace = fused.rank(r).executor().take_trace();
      loom::write_chrome_trace(path, trace, EpPipeline::names, EpPipeline::size, kEpMarkNames,
                               kEpMarkCount);
      if (world == 1 || !given) continue;
      std::uint64_t begin = ~std::uint64_t{0}, end = 0;  // the first send's start to the last's end
      for (auto const& t : trace)
        if (t.type == EpPipeline::id<SendBlocks>)
          begin = std::min(begin, t.start_ns), end = std::max(end, t.end_ns);
      double const bytes = dispatch_bytes(c, fused.rank(r).topk_ids(), r, world);
      double const gbps = end > begin ? bytes / double(end - begin) : 0.0;
      std::printf(
          "%-8s P=%u rank %u: dispatch %.1f MB to peers during %.1f us of sends: "
          "%.1f GB/s",
          s.name.c_str(), world, r, bytes / 1e6, (end - begin) / 1e3, gbps);
      if (lsa > 0) std::printf(", %.0f%% of the LSA store bandwidth", 100.0 * gbps / lsa);
      std::printf("\n");
      dispatch_gbps = std::max(dispatch_gbps, gbps);
    }
  }

  std::vector<loom::NcclCommunicator> comms = loom::NcclCommunicator::init_all(devices);
  UnfusedEpMoE baseline(c, w, comms);
  std::vector<UnfusedEpCall> base_calls(world);
  for (std::uint32_t r = 0; r < world; ++r)
    base_calls[r] = UnfusedEpCall{in[r].x.get(), s.tokens_per_rank, in[r].ids.get(),
                                  in[r].weights.get(), in[r].base_out.get()};
  std::vector<double> tb;
  for (int i = 0; i < iters + 2; ++i) {
    loom::synchronize_devices(devices);
    auto const t0 = Clock::now();
    baseline.forward(base_calls);
    baseline.synchronize();
    if (i >= 2) tb.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double const base_given = median(tb);
  // The two layers compute the same function on the given routing.
  double diff = 0, norm = 0;
  for (std::uint32_t r = 0; r < world; ++r) {
    loom::ScopedDevice on(devices[r]);
    auto const a = in[r].out.download();
    auto const b = in[r].base_out.download();
    for (std::size_t i = 0; i < a.size(); ++i) {
      double const x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
      diff += (x - y) * (x - y), norm += y * y;
    }
  }
  double const rel = norm > 0 ? std::sqrt(diff / norm) : 0.0;
  double const tokens = double(s.tokens_per_rank) * world;
  std::printf(
      "%-8s P=%u E=%-4u T/rank=%-6u  fused(router) %8.3f ms  fused(given) %8.3f ms  "
      "baseline(given) %8.3f ms  speedup %5.2fx  %7.2f MTok/s  rel.diff %.1e\n",
      s.name.c_str(), world, c.experts, s.tokens_per_rank, fused_router * 1e3, fused_given * 1e3,
      base_given * 1e3, base_given / fused_given, tokens / fused_router / 1e6, rel);
  // Overlap efficiency T(1) / T(P): 1 when P GPUs run P times the work in the time one takes.
  double const overlap_given = at_one ? at_one->given / fused_given : 0.0;
  double const overlap_router = at_one ? at_one->router / fused_router : 0.0;
  if (at_one)
    std::printf("%-8s P=%u overlap efficiency T(1)/T(P): %.3f (given routing), %.3f (router)\n",
                s.name.c_str(), world, overlap_given, overlap_router);
  std::printf(
      "%-8s P=%u host: forward() enqueues every rank's call in %.1f us (router) / %.1f us "
      "(given routing), medians\n",
      s.name.c_str(), world, enqueue_router * 1e6, enqueue_given * 1e6);
  std::fflush(stdout);
  if (json) {
    std::fprintf(json,
                 "%s{\"scenario\":\"%s\",\"world\":%u,\"experts\":%u,\"hidden\":%u,\"ffn\":%u,"
                 "\"top_k\":%u,\"tokens_per_rank\":%u,\"fused_router_ms\":%.4f,"
                 "\"fused_given_ms\":%.4f,\"baseline_given_ms\":%.4f,\"rel_diff\":%.3e,"
                 "\"lsa_store_GBps\":%.1f,\"dispatch_GBps\":%.1f,\"enqueue_router_us\":%.1f,"
                 "\"enqueue_given_us\":%.1f",
                 first_json ? "" : ",\n", s.name.c_str(), world, c.experts, c.hidden, c.ffn,
                 c.top_k, s.tokens_per_rank, fused_router * 1e3, fused_given * 1e3,
                 base_given * 1e3, rel, lsa, dispatch_gbps, enqueue_router * 1e6,
                 enqueue_given * 1e6);
    if (at_one)
      std::fprintf(json, ",\"overlap_given\":%.4f,\"overlap_router\":%.4f", overlap_given,
                   overlap_router);
    std::fprintf(json, "}");
    first_json = false;
  }
  return FusedTimes{fused_router, fused_given};
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 10;
  std::uint32_t max_world = 4;
  std::string only, json_path, trace_prefix;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--iters" && i + 1 < argc)
      iters = std::stoi(argv[++i]);
    else if (a == "--max-world" && i + 1 < argc)
      max_world = std::stoul(argv[++i]);
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--trace" && i + 1 < argc)
      trace_prefix = argv[++i];
    else if (a == "--sweep")
      sweep = true;
    else {
      std::fprintf(
          stderr,
          "usage: %s [--iters N] [--max-world P] [--json FILE]\n"
          "          [--only NAME]     the scenarios whose name starts with NAME (weak,\n"
          "                             decode; in the sweep e.g. E64.T4096, or E64. for all\n"
          "                             of E = 64)\n"
          "          [--trace PREFIX]  (two more calls per run, traced, given routing\n"
          "                             and router: PREFIX.<scenario>.P<world>.r<rank>.json\n"
          "                             and PREFIX.<scenario>-router.P<world>.r<rank>.json)\n"
          "          [--sweep]         FlashDMoE's grid instead of weak and decode:\n"
          "                             H = D = 2048, top-2, E in {8, ..., 128} in all,\n"
          "                             1024 to 16384 tokens per GPU (scenario E<e>.T<t>)\n",
          argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  int const devices = loom::cuda_device_count();
  if (devices == 0) {
    std::fprintf(stderr, "loom_ep_bench: no GPU\n");
    return 1;
  }
  cudaDeviceProp prop{};
  LOOM_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %d x %s; medians of %d calls (host wall time, launch to last stream)\n",
              devices, prop.name, iters);
  std::vector<Scenario> scenarios = {
      {"weak", 2048, 2048, 32, 2, 8192},
      {"decode", 7168, 2048, 32, 8, 128},
  };
  if (sweep) {
    scenarios.clear();
    for (std::uint32_t e = 8; e <= 128; e *= 2)
      for (std::uint32_t t = 1024; t <= 16384; t *= 2)
        scenarios.push_back({"E" + std::to_string(e) + ".T" + std::to_string(t), 2048, 2048, e, 2,
                             t, /*experts_fixed=*/true, /*measure_links=*/false});
  }
  FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  if (json) std::fprintf(json, "[\n");
  bool first = true;
  try {
    for (auto const& s : scenarios) {
      if (s.name.rfind(only, 0) != 0) continue;  // a prefix ("" takes every scenario)
      std::optional<FusedTimes> at_one;
      for (std::uint32_t world = 1; world <= std::min<std::uint32_t>(max_world, devices);
           world *= 2) {
        if (s.experts_for(world) % world != 0) continue;
        FusedTimes const t =
            run(s, world, iters, json, first, trace_prefix, at_one ? &*at_one : nullptr);
        if (world == 1) at_one = t;
      }
    }
  } catch (loom::Error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  if (json) std::fprintf(json, "\n]\n"), std::fclose(json);
  return 0;
}
