// How fast a few SMs store into other GPUs over NVLink: the figure that decides how many
// processors a one-sided transfer needs (the dispatch's sends, the down tiles' rows to their
// source ranks) and how long one SM's remote stores take to drain.
//
// GPU d stores 64 MiB into each other GPU through peer pointers (cudaDeviceEnablePeerAccess: the
// same NVLink path as NCCL's LSA pointers), every GPU at once, with B blocks in all (block b
// serves peer b % peers). Three ways to store:
//   - thread128 / thread512: 16-byte loads and stores, 8 in flight per thread, from blocks of
//     128 (a processor's task width) or 512 threads;
//   - bulk: one thread per block streams 32 KB pieces through six shared-memory buffers, each
//     in by cp.async.bulk global -> shared and out by cp.async.bulk shared -> peer global.
// Reported: GB/s leaving each GPU (the slowest GPU's time, median of 5 after a warm-up) and that
// rate per block. `loom_link_bench [--gpus N]` (default: every GPU; 1 GPU is not enough).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda/ptx>
#include <string>
#include <vector>

#include "runtime/cuda/check.hpp"

namespace {

constexpr int kMaxPeers = 8;
constexpr std::size_t kBytesPerPeer = std::size_t{64} << 20;

struct Targets {
  unsigned char* dst[kMaxPeers];
  int count;
};

template <int kInFlight>
__global__ void thread_stores(uint4 const* __restrict__ src, Targets t, std::size_t words) {
  int const peer = blockIdx.x % t.count, blocks = gridDim.x / t.count;
  uint4* const dst = reinterpret_cast<uint4*>(t.dst[peer]);
  std::size_t const stride = std::size_t(blocks) * blockDim.x;
  for (std::size_t i0 = std::size_t(blockIdx.x / t.count) * blockDim.x + threadIdx.x; i0 < words;
       i0 += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i0 + k * stride < words) v[k] = __ldg(src + i0 + k * stride);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i0 + k * stride < words) dst[i0 + k * stride] = v[k];
  }
}

constexpr int kPiece = 32768, kBuffers = 6;

__global__ void bulk_stores(unsigned char const* src, Targets t, std::size_t bytes) {
  extern __shared__ __align__(128) unsigned char buffers[];
  __shared__ __align__(8) std::uint64_t full[kBuffers];
  if (threadIdx.x != 0) return;
  int const peer = blockIdx.x % t.count, blocks = gridDim.x / t.count;
  for (int s = 0; s < kBuffers; ++s) cuda::ptx::mbarrier_init(&full[s], 1);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  std::uint32_t parity = 0;  // bit s: buffer s's phase
  std::size_t k = 0;
  for (std::size_t piece = blockIdx.x / t.count; piece < bytes / kPiece; piece += blocks, ++k) {
    int const s = static_cast<int>(k % kBuffers);
    // Buffer s was last read by the store kBuffers pieces ago.
    if (k >= kBuffers) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<kBuffers - 1>{});
    unsigned char* const buf = buffers + s * kPiece;
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                         cuda::ptx::space_shared, &full[s], kPiece);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, buf,
                             src + piece * kPiece, kPiece, &full[s]);
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[s], (parity >> s) & 1u)) {
    }
    parity ^= 1u << s;
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                             t.dst[peer] + piece * kPiece, buf, kPiece);
    cuda::ptx::cp_async_bulk_commit_group();
  }
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

enum class Mode { thread128, thread512, bulk };
char const* name(Mode m) {
  return m == Mode::thread128 ? "thread128" : m == Mode::thread512 ? "thread512" : "bulk";
}

struct Gpu {
  unsigned char* src = nullptr;
  unsigned char* window = nullptr;  // kBytesPerPeer from each other GPU
  cudaEvent_t start{}, stop{};
};

// Milliseconds the slowest GPU took, every GPU storing into every other with `blocks` blocks.
float store_all(std::vector<Gpu> const& gpus, Mode mode, int blocks) {
  int const n = static_cast<int>(gpus.size());
  for (int d = 0; d < n; ++d) {
    LOOM_CUDA(cudaSetDevice(d));
    Targets t{};
    for (int p = 0; p < n; ++p)
      if (p != d) t.dst[t.count++] = gpus[p].window + std::size_t(d) * kBytesPerPeer;
    int const grid = std::max(blocks / t.count, 1) * t.count;
    LOOM_CUDA(cudaEventRecord(gpus[d].start));
    switch (mode) {
      case Mode::thread128:
        thread_stores<8>
            <<<grid, 128>>>(reinterpret_cast<uint4 const*>(gpus[d].src), t, kBytesPerPeer / 16);
        break;
      case Mode::thread512:
        thread_stores<8>
            <<<grid, 512>>>(reinterpret_cast<uint4 const*>(gpus[d].src), t, kBytesPerPeer / 16);
        break;
      case Mode::bulk:
        bulk_stores<<<grid, 32, kPiece * kBuffers>>>(gpus[d].src, t, kBytesPerPeer);
        break;
    }
    LOOM_CUDA(cudaGetLastError());
    LOOM_CUDA(cudaEventRecord(gpus[d].stop));
  }
  float worst = 0;
  for (int d = 0; d < n; ++d) {
    LOOM_CUDA(cudaSetDevice(d));
    LOOM_CUDA(cudaEventSynchronize(gpus[d].stop));
    float ms = 0;
    LOOM_CUDA(cudaEventElapsedTime(&ms, gpus[d].start, gpus[d].stop));
    worst = std::max(worst, ms);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int wanted = kMaxPeers;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--gpus" && i + 1 < argc) {
      wanted = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--gpus N]   (2 <= N <= %d; default: every GPU)\n", argv[0],
                   kMaxPeers);
      return a == "--help" ? 0 : 2;
    }
  }
  int present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess) present = 0;
  int const n = std::min(present, wanted);
  if (n < 2) {
    std::fprintf(stderr, "loom_link_bench: needs 2 GPUs (%d usable: %d present, --gpus %d)\n", n,
                 present, wanted);
    return 1;
  }
  std::vector<Gpu> gpus(n);
  for (int d = 0; d < n; ++d) {
    LOOM_CUDA(cudaSetDevice(d));
    for (int p = 0; p < n; ++p)
      if (p != d) LOOM_CUDA(cudaDeviceEnablePeerAccess(p, 0));
    LOOM_CUDA(cudaMalloc(&gpus[d].src, kBytesPerPeer));
    LOOM_CUDA(cudaMemset(gpus[d].src, 1, kBytesPerPeer));
    LOOM_CUDA(cudaMalloc(&gpus[d].window, kBytesPerPeer * n));
    LOOM_CUDA(cudaEventCreate(&gpus[d].start));
    LOOM_CUDA(cudaEventCreate(&gpus[d].stop));
    LOOM_CUDA(cudaFuncSetAttribute(bulk_stores, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   kPiece * kBuffers));
  }
  cudaDeviceProp prop{};
  LOOM_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%d x %s, every GPU storing %zu MiB into each other GPU at once\n", n, prop.name,
              kBytesPerPeer >> 20);
  std::printf("%-10s %7s %14s %16s\n", "mode", "blocks", "GB/s out", "GB/s per block");
  int const peers = n - 1;
  for (int blocks : {1, 2, 4, 8, 16, 32, 64, 128}) {
    for (Mode mode : {Mode::thread128, Mode::thread512, Mode::bulk}) {
      int const grid = std::max(blocks / peers, 1) * peers;
      store_all(gpus, mode, blocks);  // warm-up
      std::vector<float> ms;
      for (int i = 0; i < 5; ++i) ms.push_back(store_all(gpus, mode, blocks));
      std::sort(ms.begin(), ms.end());
      double const gbps = double(kBytesPerPeer) * peers / (ms[ms.size() / 2] * 1e-3) / 1e9;
      std::printf("%-10s %7d %14.1f %16.1f\n", name(mode), grid, gbps, gbps / grid);
    }
  }
  return 0;
}
