// One rank of a multi-process NCCL job (start it with scripts/launch.sh -n P -- this program):
// reads its place from the LOOM_* environment, joins the communicator through the rendezvous,
// builds its symmetric heap and runs the all-to-all exchange of tests/gpu/nccl_exchange.cuh twice
// (zeroing in between). Exits 0 on success, 1 with a message otherwise, and 0 with
// "skipped: needs 2 GPUs" where fewer than 2 GPUs exist (CI has none).
#include <cstdio>
#include <random>

#include "tests/gpu/multiprocess.cuh"
#include "tests/gpu/nccl_exchange.cuh"

namespace {

int run(loom::RankEnvironment const& env) {
  loom::NcclCommunicator const comm = loom::NcclCommunicator::init_rank(env);
  loom::SymmetricLayout layout;
  layout.add("leading.pad", 1000, 64);
  auto const regions = loom_nccl_test::lay_out_exchange(layout, env.world, 64 * 1024 + 17);
  loom::NcclSymmetricHeap heap(comm, layout.bytes());
  std::uint64_t const seed = loom_multiprocess::shared_seed(comm);
  std::printf("rank %u: seed %llu\n", env.rank, static_cast<unsigned long long>(seed));
  for (int round = 0; round < 2; ++round) {
    loom_nccl_test::ExchangeRun run(heap, regions, seed + round);
    run.launch();
    std::string const failure = run.finish();
    if (!failure.empty()) {
      std::fprintf(stderr, "FAILED round %d: %s\n", round, failure.c_str());
      return 1;
    }
    // Every rank zeroes its window before any starts the next round (whose stores would
    // otherwise be wiped): the zeroing, then an all-reduce of one word as a barrier, in order on
    // the default stream.
    heap.zero(nullptr);
    loom::DeviceBuffer<int> token(std::vector<int>{1});
    LOOM_NCCL(ncclAllReduce(token.get(), token.get(), 1, ncclInt, ncclSum, comm.get(), nullptr));
    LOOM_CUDA(cudaDeviceSynchronize());
  }
  std::printf("rank %u of %u (device %d): every peer's %u words arrived in both rounds\n", env.rank,
              env.world, env.device, regions.words_per_peer);
  return 0;
}

}  // namespace

int main() {
  return loom_multiprocess::rank_main(run);
}
