// The NCCL symmetric heap with one process driving 2, 3, 4 or 8 GPUs (ncclCommInitAll):
// communicator identity, the view every rank's kernels get, an all-to-all exchange of stores and
// signals through that view, and zeroing. A case skips where fewer GPUs than it needs exist.
#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "tests/gpu/gpu_test_util.cuh"
#include "tests/gpu/nccl_exchange.cuh"
#include "tests/seed.hpp"

namespace loom_gpu_test {
namespace {

using loom::NcclCommunicator;
using loom::NcclSymmetricHeap;
using loom_nccl_test::ExchangeRun;

class NcclHeapWorld : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    int const gpus = loom::cuda_device_count();
    if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
    if (gpus < GetParam()) GTEST_SKIP() << "needs " << GetParam() << " GPUs, found " << gpus;
    devices_.resize(GetParam());
    std::iota(devices_.begin(), devices_.end(), 0);
  }
  std::vector<int> devices_;
};

TEST_P(NcclHeapWorld, CommunicatorsNumberRanksInDeviceOrder) {
  std::vector<NcclCommunicator> const comms = NcclCommunicator::init_all(devices_);
  ASSERT_EQ(comms.size(), devices_.size());
  for (std::size_t r = 0; r < comms.size(); ++r) {
    EXPECT_EQ(comms[r].rank(), r);
    EXPECT_EQ(comms[r].world(), devices_.size());
    EXPECT_EQ(comms[r].device(), devices_[r]);
    EXPECT_NE(comms[r].get(), nullptr);
  }
}

TEST_P(NcclHeapWorld, ViewNamesEveryPeersWindowAndItsOwnRank) {
  std::vector<NcclCommunicator> const comms = NcclCommunicator::init_all(devices_);
  std::uint64_t const bytes = 3 * 4096 + 40;  // not a multiple of NCCL's window alignment
  auto heaps = NcclSymmetricHeap::create_all(comms, bytes);
  ASSERT_EQ(heaps.size(), comms.size());
  for (std::size_t r = 0; r < heaps.size(); ++r) {
    loom::SymmetricView const v = heaps[r].view();
    EXPECT_EQ(v.rank, r);
    EXPECT_EQ(v.world, comms.size());
    EXPECT_EQ(v.bytes, bytes);
    EXPECT_GE(heaps[r].window_bytes(), bytes);
    EXPECT_EQ(heaps[r].window_bytes() % NCCL_WIN_REQUIRED_ALIGNMENT, 0u);
    EXPECT_EQ(heaps[r].local(), v.bases[r]);
    std::set<unsigned char*> const distinct(v.bases, v.bases + v.world);
    EXPECT_EQ(distinct.size(), v.world) << "rank " << r << " sees two peers at one address";
    EXPECT_EQ(distinct.count(nullptr), 0u);
  }
}

TEST_P(NcclHeapWorld, EveryRankStoresIntoEveryPeersWindowAndSignalsIt) {
  std::vector<NcclCommunicator> const comms = NcclCommunicator::init_all(devices_);
  loom::test::TracedSeed const seed;
  loom::SymmetricLayout layout;
  layout.add("leading.pad", 1000, 64);  // the exchange does not start at offset 0
  auto const regions = loom_nccl_test::lay_out_exchange(
      layout, static_cast<std::uint32_t>(comms.size()), 64 * 1024 + 17);
  auto heaps = NcclSymmetricHeap::create_all(comms, layout.bytes());

  // Two rounds: the second after zeroing every window, with another pattern.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<ExchangeRun>> runs;
    for (std::size_t r = 0; r < heaps.size(); ++r)
      runs.push_back(std::make_unique<ExchangeRun>(heaps[r], regions, seed + round));
    for (auto& run : runs) run->launch();  // every rank must be running before any can finish
    for (std::size_t r = 0; r < runs.size(); ++r)
      EXPECT_EQ(runs[r]->finish(), "") << "round " << round << ", rank " << r;
    for (std::size_t r = 0; r < heaps.size(); ++r) {
      loom::ScopedDevice const on(heaps[r].device());
      heaps[r].zero(nullptr);
      LOOM_CUDA(cudaDeviceSynchronize());
    }
  }
}

TEST_P(NcclHeapWorld, ZeroClearsTheWholeWindow) {
  std::vector<NcclCommunicator> const comms = NcclCommunicator::init_all(devices_);
  auto heaps = NcclSymmetricHeap::create_all(comms, 2 * 4096);
  for (std::size_t r = 0; r < heaps.size(); ++r) {
    loom::ScopedDevice const on(heaps[r].device());
    std::size_t const n = heaps[r].window_bytes();
    LOOM_CUDA(cudaMemset(heaps[r].local(), 0xA5, n));
    heaps[r].zero(nullptr);
    std::vector<unsigned char> back(n, 0xFF);
    LOOM_CUDA(cudaMemcpy(back.data(), heaps[r].local(), n, cudaMemcpyDefault));
    EXPECT_EQ(std::count(back.begin(), back.end(), 0), static_cast<std::ptrdiff_t>(n))
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpus, NcclHeapWorld, ::testing::Values(2, 3, 4, 8),
                         [](auto const& info) { return std::to_string(info.param) + "gpus"; });

}  // namespace
}  // namespace loom_gpu_test
