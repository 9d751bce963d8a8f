// The all-to-all exchange both NCCL suites run (one process driving every GPU, and one rank per
// process): every rank stores a rank-specific pattern into every rank's window through the
// SymmetricView, signals each rank (system-scope release), waits for every peer's signal
// (acquire, bounded by a Watchdog) and checks what arrived, on the device and again on the host.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/nccl_heap.hpp"
#include "runtime/cuda/scoped_device.hpp"
#include "runtime/symmetric_layout.hpp"

namespace loom_nccl_test {

// The exchange's regions, identical in every rank's heap.
struct ExchangeRegions {
  loom::Region inbox;     // [world][words_per_peer] u64: row src holds what rank src stored here
  loom::Region arrivals;  // [world] u64: arrivals[src] counts rank src's blocks that finished
  std::uint32_t words_per_peer;
};

inline ExchangeRegions lay_out_exchange(loom::SymmetricLayout& layout, std::uint32_t world,
                                        std::uint32_t words_per_peer) {
  ExchangeRegions r;
  r.inbox =
      layout.add_array<std::uint64_t>("exchange.inbox", std::uint64_t(world) * words_per_peer);
  r.arrivals = layout.add_array<std::uint64_t>("exchange.arrivals", world);
  r.words_per_peer = words_per_peer;
  return r;
}

// Word i that rank src stores into rank dst's inbox. Never 0, so a zeroed word means "missing".
LOOM_HD inline std::uint64_t exchange_word(std::uint64_t seed, std::uint32_t src, std::uint32_t dst,
                                           std::uint32_t i) {
  std::uint64_t z = seed ^ ((std::uint64_t(src) << 56) | (std::uint64_t(dst) << 48) | i);
  z += 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) | 1u;
}

// Whole grid. Every block stores its share of this rank's row into every rank's inbox, then its
// thread 0 adds 1 to arrivals[rank] on every rank (release: the block's stores, fenced at system
// scope and gathered by the barrier, are visible to whoever acquires the count). Block 0 then
// waits for gridDim.x arrivals from every peer (the grid must be the same on every rank) and
// counts the words of its own inbox that differ from the pattern into *mismatches.
__global__ void exchange(loom::SymmetricView view, ExchangeRegions regions, std::uint64_t seed,
                         std::uint64_t limit_ns, loom::ErrorRecord* errors,
                         unsigned long long* mismatches) {
  std::uint32_t const words = regions.words_per_peer;
  std::uint64_t const row_offset = regions.inbox.offset + std::uint64_t(view.rank) * words * 8;
  for (std::uint32_t dst = 0; dst < view.world; ++dst) {
    std::uint64_t* row = view.at<std::uint64_t>(dst, row_offset);
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += gridDim.x * blockDim.x)
      row[i] = exchange_word(seed, view.rank, dst, i);
  }
  __threadfence_system();
  __syncthreads();
  std::uint64_t* arrivals = view.local<std::uint64_t>(regions.arrivals.offset);
  if (threadIdx.x == 0)
    for (std::uint32_t dst = 0; dst < view.world; ++dst)
      view.signal_add(dst, arrivals + view.rank, 1);
  if (blockIdx.x != 0) return;

  __shared__ int all_arrived;
  if (threadIdx.x == 0) {
    all_arrived = 1;
    for (std::uint32_t src = 0; src < view.world && all_arrived; ++src) {
      loom::Watchdog dog(*errors, loom::WaiterId{loom::Actor::task, blockIdx.x, view.rank},
                         limit_ns, loom::WaitSite::signal, src);
      all_arrived = loom::SymmetricView::wait(arrivals + src, gridDim.x, dog);
    }
  }
  __syncthreads();
  if (!all_arrived) return;
  unsigned long long wrong = 0;
  std::uint64_t const* inbox = view.local<std::uint64_t>(regions.inbox.offset);
  for (std::uint32_t src = 0; src < view.world; ++src)
    for (std::uint32_t i = threadIdx.x; i < words; i += blockDim.x)
      wrong += inbox[std::uint64_t(src) * words + i] != exchange_word(seed, src, view.rank, i);
  if (wrong) atomicAdd(mismatches, wrong);
}

// One rank's part of an exchange: launch() on every rank first (they wait for each other), then
// finish() on each.
class ExchangeRun {
 public:
  static constexpr unsigned kBlocks = 4;
  static constexpr unsigned kThreads = 256;

  ExchangeRun(loom::NcclSymmetricHeap const& heap, ExchangeRegions regions, std::uint64_t seed,
              std::uint64_t limit_ns = 10'000'000'000ull)
      : heap_(heap), regions_(regions), seed_(seed), limit_ns_(limit_ns) {
    loom::ScopedDevice const on(heap_.device());
    errors_ = loom::DeviceBuffer<loom::ErrorRecord>(1);
    mismatches_ = loom::DeviceBuffer<unsigned long long>(1);
    errors_.fill_bytes(0);
    mismatches_.fill_bytes(0);
  }

  // Asynchronous, on the heap's device's default stream.
  void launch() {
    loom::ScopedDevice const on(heap_.device());
    exchange<<<kBlocks, kThreads>>>(heap_.view(), regions_, seed_, limit_ns_, errors_.get(),
                                    mismatches_.get());
    LOOM_CUDA(cudaGetLastError());
  }

  // Waits for the kernel; returns "" when this rank received every peer's words, else what failed.
  std::string finish() {
    loom::ScopedDevice const on(heap_.device());
    LOOM_CUDA(cudaDeviceSynchronize());
    std::ostringstream report;
    loom::SymmetricView const view = heap_.view();
    loom::ErrorRecord const e = errors_.download()[0];
    if (e.code != 0) report << loom::describe(e) << "; ";
    unsigned long long const wrong = mismatches_.download()[0];
    if (wrong)
      report << "rank " << view.rank << " counted " << wrong << " wrong words on the device; ";

    // The host reads the inbox back through the window's own base (local()).
    std::uint32_t const words = regions_.words_per_peer;
    std::vector<std::uint64_t> inbox(std::size_t(view.world) * words);
    LOOM_CUDA(cudaMemcpy(inbox.data(),
                         static_cast<unsigned char*>(heap_.local()) + regions_.inbox.offset,
                         inbox.size() * sizeof(std::uint64_t), cudaMemcpyDefault));
    std::uint64_t host_wrong = 0;
    for (std::uint32_t src = 0; src < view.world; ++src)
      for (std::uint32_t i = 0; i < words; ++i) {
        std::uint64_t const want = exchange_word(seed_, src, view.rank, i);
        std::uint64_t const got = inbox[std::size_t(src) * words + i];
        if (got != want && host_wrong++ == 0)
          report << "rank " << view.rank << ": word " << i << " from rank " << src << " is 0x"
                 << std::hex << got << ", expected 0x" << want << std::dec << "; ";
      }
    if (host_wrong) report << host_wrong << " wrong words in rank " << view.rank << "'s inbox";
    return report.str();
  }

 private:
  loom::NcclSymmetricHeap const& heap_;
  ExchangeRegions regions_;
  std::uint64_t seed_;
  std::uint64_t limit_ns_;
  loom::DeviceBuffer<loom::ErrorRecord> errors_;
  loom::DeviceBuffer<unsigned long long> mismatches_;
};

}  // namespace loom_nccl_test
