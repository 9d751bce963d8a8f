// How far apart one process's calls start on its GPUs (up to four), by the way the host enqueues them. Each
// rank's call is a graph of three nodes shaped like a Loom call (a one-block set-up kernel, a
// kernel of 132 blocks x 384 threads with 200 KB of dynamic shared memory that stamps
// %globaltimer when its first block starts and then spins 50 us, a 64-byte copy to pinned host
// memory). Ways of starting them:
//   seq:    one graph per GPU, launched one after another from one thread (GpuEpMoEGroup today);
//   multi:  one graph holding every GPU's nodes (captured across their streams), one launch;
//   thread: one graph per GPU, each launched by a thread of its own (helpers spin-wait).
// The GPUs' timers are put on one clock first: every GPU spins on one pinned host word and stamps
// when it sees it set (median offsets of 20 rounds). Prints medians over the calls of the skew
// (last start - first start), the host time of the enqueueing and the wall time to the end of the
// last stream. nvcc -O2 -arch=sm_90a -std=c++17; results in docs/results/launch_skew_h200x2.txt.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int kMaxGpus = 4, kSmem = 200 * 1024;
int kGpus = 0;  // the GPUs there are, at most kMaxGpus

__device__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void setup(int* word) {
  if (threadIdx.x == 0) *word += 1;
}
__global__ void stamp(unsigned long long* at, int spin_ns) {
  extern __shared__ char smem[];
  unsigned long long const t0 = now();
  if (blockIdx.x == 0 && threadIdx.x == 0) *at = t0;
  while (now() - t0 < (unsigned long long)spin_ns) {
  }
  if (threadIdx.x == 0) smem[0] = 1;
}
__global__ void calib(volatile int* flag, unsigned long long* at) {
  while (*flag == 0) {
  }
  *at = now();
}

struct Rank {
  cudaStream_t s;
  int* word;
  unsigned long long* at;
  char* host_copy;
  char* dev_copy;
};

void enqueue(Rank& r, int dev) {
  CK(cudaSetDevice(dev));
  setup<<<1, 32, 0, r.s>>>(r.word);
  stamp<<<132, 384, kSmem, r.s>>>(r.at, 50000);
  CK(cudaMemcpyAsync(r.host_copy, r.dev_copy, 64, cudaMemcpyDeviceToHost, r.s));
}

double med(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  using Clock = std::chrono::steady_clock;
  CK(cudaGetDeviceCount(&kGpus));
  kGpus = std::min(kGpus, kMaxGpus);
  std::printf("%d GPUs\n", kGpus);
  Rank rk[kMaxGpus];
  for (int d = 0; d < kGpus; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaFuncSetAttribute(stamp, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    CK(cudaStreamCreateWithFlags(&rk[d].s, cudaStreamNonBlocking));
    CK(cudaMalloc(&rk[d].word, 4));
    CK(cudaMalloc(&rk[d].at, 8));
    CK(cudaMalloc(&rk[d].dev_copy, 64));
    CK(cudaMallocHost(&rk[d].host_copy, 64));
  }
  // One clock: offsets of each GPU's timer from GPU 0's.
  int* flag;
  unsigned long long* seen;
  CK(cudaHostAlloc(&flag, 4, cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostAlloc(&seen, 8 * kGpus, cudaHostAllocMapped | cudaHostAllocPortable));
  std::vector<double> off[kMaxGpus];
  for (int round = 0; round < 20; ++round) {
    *(volatile int*)flag = 0;
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      calib<<<1, 1, 0, rk[d].s>>>(flag, seen + d);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    *(volatile int*)flag = 1;
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaStreamSynchronize(rk[d].s));
    }
    for (int d = 0; d < kGpus; ++d) off[d].push_back(double(seen[d]) - double(seen[0]));
  }
  double offset[kMaxGpus];
  for (int d = 0; d < kGpus; ++d) offset[d] = med(off[d]);
  std::printf("timer offsets from GPU 0 (ns):");
  for (int d = 0; d < kGpus; ++d) std::printf(" %.0f", offset[d]);
  std::printf("\n");

  // seq: a graph per GPU.
  cudaGraphExec_t per[kMaxGpus];
  for (int d = 0; d < kGpus; ++d) {
    CK(cudaSetDevice(d));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(rk[d].s, cudaStreamCaptureModeThreadLocal));
    enqueue(rk[d], d);
    CK(cudaStreamEndCapture(rk[d].s, &g));
    CK(cudaGraphInstantiate(&per[d], g, 0));
    CK(cudaGraphDestroy(g));
  }
  // multi: one graph over the four streams, forked from and joined to GPU 0's.
  cudaGraphExec_t multi;
  {
    cudaEvent_t fork, join[kMaxGpus];
    CK(cudaSetDevice(0));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventCreateWithFlags(&join[d], cudaEventDisableTiming));
    }
    CK(cudaSetDevice(0));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(rk[0].s, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(fork, rk[0].s));
    for (int d = 1; d < kGpus; ++d) CK(cudaStreamWaitEvent(rk[d].s, fork, 0));
    for (int d = 0; d < kGpus; ++d) enqueue(rk[d], d);
    for (int d = 1; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaEventRecord(join[d], rk[d].s));
      CK(cudaStreamWaitEvent(rk[0].s, join[d], 0));
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamEndCapture(rk[0].s, &g));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(g, nullptr, &nodes));
    std::printf("multi-device graph: %zu nodes\n", nodes);
    CK(cudaGraphInstantiate(&multi, g, 0));
    CK(cudaGraphDestroy(g));
  }
  // thread: three helpers, each for one GPU, spin on a generation word.
  std::atomic<unsigned> go{0}, done{0};
  std::atomic<bool> quit{false};
  std::vector<std::thread> helpers;
  for (int d = 1; d < kGpus; ++d)
    helpers.emplace_back([&, d] {
      CK(cudaSetDevice(d));
      unsigned seen_go = 0;
      while (!quit.load(std::memory_order_acquire)) {
        unsigned const g = go.load(std::memory_order_acquire);
        if (g == seen_go) continue;
        seen_go = g;
        CK(cudaGraphLaunch(per[d], rk[d].s));
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });

  char const* names[] = {"seq", "multi", "thread"};
  std::vector<double> skew[3], host[3], wall[3];
  unsigned long long at[kMaxGpus];
  for (int it = 0; it < 600; ++it) {
    int const way = it % 3;
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaDeviceSynchronize());
    }
    CK(cudaSetDevice(0));
    auto const t0 = Clock::now();
    if (way == 0) {
      for (int d = 0; d < kGpus; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaGraphLaunch(per[d], rk[d].s));
      }
    } else if (way == 1) {
      CK(cudaGraphLaunch(multi, rk[0].s));
    } else {
      unsigned const before = done.load();
      go.fetch_add(1, std::memory_order_acq_rel);
      CK(cudaGraphLaunch(per[0], rk[0].s));
      while (done.load(std::memory_order_acquire) != before + kGpus - 1) {
      }
    }
    auto const t1 = Clock::now();
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaStreamSynchronize(rk[d].s));
    }
    auto const t2 = Clock::now();
    for (int d = 0; d < kGpus; ++d) {
      CK(cudaSetDevice(d));
      CK(cudaMemcpy(&at[d], rk[d].at, 8, cudaMemcpyDeviceToHost));
    }
    double lo = 1e30, hi = -1e30;
    for (int d = 0; d < kGpus; ++d) {
      double const t = double(at[d]) - offset[d];
      lo = std::min(lo, t), hi = std::max(hi, t);
    }
    if (it < 30) continue;
    skew[way].push_back((hi - lo) * 1e-3);
    host[way].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    wall[way].push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
  }
  quit = true;
  for (auto& h : helpers) h.join();
  for (int w = 0; w < 3; ++w)
    std::printf("%-6s skew %6.2f us  enqueue %6.2f us  wall %7.2f us  (medians of %zu calls)\n",
                names[w], med(skew[w]), med(host[w]), med(wall[w]), skew[w].size());
  return 0;
}
