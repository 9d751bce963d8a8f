// One rank of the expert-parallel MoE layer in its own process (start it with
// scripts/launch.sh -n P -- this program): reads its place from the LOOM_* environment, joins the
// communicator through the rendezvous, registers its symmetric window and runs a GpuEpMoERank
// for four calls with the fused router, a random token count per rank (none on the last rank in
// the second call; the fourth repeats the third's arguments with new tokens, and replays its
// graph), checking its routing and output against the float64 reference.
// Every rank draws the same weights (a shared seed); tokens differ per rank. Exits 0 on success,
// 1 with a message otherwise, and 0 with "skipped: needs 2 GPUs" where fewer exist (CI has none).
#include <cstdio>
#include <random>

#include "moe/ep_gpu_layer.cuh"
#include "moe/reference.hpp"
#include "runtime/cuda/nccl_heap.hpp"
#include "tests/gpu/multiprocess.cuh"

namespace {

using namespace loom::moe;

int run(loom::RankEnvironment const& env) {
  loom::NcclCommunicator const comm = loom::NcclCommunicator::init_rank(env);
  MoEConfig c;
  c.hidden = 512, c.ffn = 256, c.experts = 4 * env.world, c.top_k = 2;
  c.activation = Activation::swiglu, c.router = RouterScore::softmax, c.max_tokens = 256;
  std::uint64_t const seed = loom_multiprocess::shared_seed(comm);
  std::printf("rank %u: seed %llu\n", env.rank, static_cast<unsigned long long>(seed));
  MoEWeights const w = random_weights(c, seed);
  loom::NcclSymmetricHeap heap(comm, ep_heap_bytes(c, env.world));
  loom::GpuOptions options;
  options.device = env.device;
  GpuEpMoERank rank(c, w, heap.view(), options);
  cudaStream_t stream = nullptr;
  LOOM_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(static_cast<unsigned>(seed + env.rank));
  loom::DeviceBuffer<bf16> dx(std::size_t{c.max_tokens} * c.hidden),
      dout(std::size_t{c.max_tokens} * c.hidden);
  int status = 0;
  std::uint32_t tokens = 0;
  // Calls 0-2 each differ from the call before (a call that repeats the one before replays its
  // graph); the fourth repeats the third.
  for (int call = 0; call < 4 && status == 0; ++call) {
    if (call < 3) {
      std::uint32_t const before = tokens;
      do tokens = call == 1 && env.rank == env.world - 1 ? 0 : 1 + rng() % c.max_tokens;
      while (call > 0 && tokens == before);
    }
    auto const x = random_tokens(c, tokens, seed + 31 * env.rank + call);
    if (tokens > 0) dx.upload(x);
    dout.fill_bytes(0xFF);  // NaN
    EpRankCall one;
    one.x = dx.get(), one.tokens = tokens, one.out = dout.get();
    rank.launch(one, stream);
    if (std::string const failure = rank.failure(stream); !failure.empty()) {
      std::fprintf(stderr, "FAILED call %d: %s\n", call, failure.c_str());
      status = 1;
      break;
    }
    if (tokens == 0) continue;
    auto const ids = rank.topk_ids();
    auto const wts = rank.topk_weights();
    std::string const routing = check_routing(c, reference_scores(c, w, x.data(), tokens), tokens,
                                              ids.data(), wts.data(), 1e-3);
    auto out = dout.download();
    out.resize(std::size_t{tokens} * c.hidden);
    double const error =
        relative_error(out, reference_moe(c, w, x.data(), tokens, ids.data(), wts.data()));
    std::printf("rank %u call %d: %u tokens, routing %s, relative error %.3e\n", env.rank, call,
                tokens, routing.empty() ? "ok" : routing.c_str(), error);
    if (!routing.empty() || !(error < 1e-2)) status = 1;
  }
  LOOM_CUDA(cudaStreamDestroy(stream));
  if (status == 0 && rank.replayed_calls() != 1) {
    std::fprintf(stderr, "FAILED: %llu calls replayed a graph, expected 1 (the fourth)\n",
                 static_cast<unsigned long long>(rank.replayed_calls()));
    status = 1;
  }
  if (status == 0)
    std::printf("rank %u of %u (device %d): four calls match the float64 reference\n", env.rank,
                env.world, env.device);
  return status;
}

}  // namespace

int main() {
  return loom_multiprocess::rank_main(run);
}
