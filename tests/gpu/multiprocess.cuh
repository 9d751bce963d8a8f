// Shared by the one-rank-per-process programs (started by scripts/launch.sh -n P): a seed every
// rank agrees on, and a main() that reads the rank's place from the LOOM_* environment and skips
// where fewer than 2 GPUs exist (CI has none).
#pragma once

#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include "runtime/bootstrap.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/nccl_comm.hpp"

namespace loom_multiprocess {

// Rank 0 draws the seed and broadcasts it.
inline std::uint64_t shared_seed(loom::NcclCommunicator const& comm) {
  std::uint64_t seed = 0;
  if (comm.rank() == 0) {
    std::random_device rd;
    seed = (std::uint64_t(rd()) << 32) | rd();
  }
  loom::DeviceBuffer<std::uint64_t> word(std::vector<std::uint64_t>{seed});
  LOOM_NCCL(ncclBroadcast(word.get(), word.get(), 1, ncclUint64, 0, comm.get(), nullptr));
  return word.download()[0];
}

// Exits 0 on success, 1 with a message otherwise, and 0 with "skipped: needs 2 GPUs" where fewer
// exist.
template <class Run>
int rank_main(Run const& run) {
  try {
    loom::RankEnvironment const env = loom::RankEnvironment::from_environment();
    int const gpus = loom::cuda_device_count();
    if (gpus < 2) {
      std::printf("skipped: needs 2 GPUs, found %d\n", gpus);
      return 0;
    }
    return run(env);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}

}  // namespace loom_multiprocess
