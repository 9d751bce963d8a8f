// How fast do the tensor cores run an expert tile's MMAs when the two consumer warpgroups split
// the work unevenly? The MoE layer's expert tiles run one K block (64) a stage: each consumer
// warpgroup fences, issues its wgmma for the four k16 steps, commits, and waits until at most one
// group is in flight (tasks/gemm/device/mainloop_wgmma.cuh). Here the operands stay in shared
// memory (three rotating stages, no loads), so only the MMA issue and the tensor cores set the
// pace. One CTA of the two consumer warpgroups per SM, 132 CTAs. Splits (rows x columns of a
// tile; each warpgroup's wgmma per k16 step):
// - full: 128 x 256, each m64n256 (a full up or down tile);
// - short: 64 x 256 split along N, each m64n128 (an expert's last M-tile of at most 64 rows);
// - lone: 64 x 256, warpgroup 0 m64n256, warpgroup 1 idle;
// - pair3: 192 x 128 as 256 x 128 with three blocks, warpgroup 0 rows 0 and 128 (2 x m64n128),
//   warpgroup 1 rows 64 (m64n128) (the paired M-tiles tried before);
// - even128: 192 x 128, each m64n128 (rows 0 / 64) + m64n64 (rows 128, its half of the columns);
// - even256: 192 x 256, each m64n256 (rows 0 / 64) + m64n128 (rows 128, its half);
// - pair4: 256 x 128, each 2 x m64n128.
// nvcc -O3 -std=c++17 -arch=sm_90a -I<repo> wgmma_split_probe.cu -o wgmma_split_probe
// (results: docs/results/wgmma_split_probe_h200.txt).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "docs/results/wgmma_k_block.cuh"
#include "tasks/gemm/ptx/smem.cuh"
#include "tasks/gemm/ptx/wgmma.cuh"

namespace ptx = loom::tasks::gemm::ptx;

constexpr int kStages = 3;
constexpr std::uint32_t kRowBytes = 128;            // 64 bf16 of K a row
constexpr std::uint32_t kABytes = 256 * kRowBytes;  // up to 256 rows of A a stage
constexpr std::uint32_t kBBytes = 256 * kRowBytes;  // up to 256 rows of B
constexpr std::uint32_t kStageBytes = kABytes + kBBytes;
constexpr int kSmem = kStages * kStageBytes + 1024;

// One warpgroup's K loop: per stage, wgmma N1 on (A rows a1, B rows b1) and, if N2 > 0, wgmma N2
// on (a2, b2), for the four k16 steps; one commit a stage, one group left in flight.
template <int N1, int N2>
__device__ void warpgroup_loop(std::uint32_t base, std::uint32_t a1, std::uint32_t b1,
                               std::uint32_t a2, std::uint32_t b2, int stages, float* sink) {
  float acc1[N1 / 2];
  float acc2[N2 > 0 ? N2 / 2 : 1];
#pragma unroll
  for (int i = 0; i < N1 / 2; ++i) acc1[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (N2 > 0 ? N2 / 2 : 1); ++i) acc2[i] = 0.f;
  for (int s = 0; s < stages; ++s) {
    std::uint32_t const stage = base + static_cast<std::uint32_t>(s % kStages) * kStageBytes;
    std::uint64_t const da1 = ptx::smem_desc_k_major_sw128(stage + a1 * kRowBytes);
    std::uint64_t const db1 = ptx::smem_desc_k_major_sw128(stage + kABytes + b1 * kRowBytes);
    std::uint64_t const da2 = ptx::smem_desc_k_major_sw128(stage + a2 * kRowBytes);
    std::uint64_t const db2 = ptx::smem_desc_k_major_sw128(stage + kABytes + b2 * kRowBytes);
    wgmma_k_block<N1, N2>(acc1, acc2, da1, db1, da2, db2);
  }
  ptx::wgmma_wait_group<0>();
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N1 / 2; ++i) sum += acc1[i];
  if constexpr (N2 > 0) {
#pragma unroll
    for (int i = 0; i < N2 / 2; ++i) sum += acc2[i];
  }
  if (sum == 1.2345f) sink[threadIdx.x] = sum;  // keeps the MMAs; never true for these inputs
}

enum Split { kFull, kShort, kLone, kPair3, kEven128, kEven256, kPair4, kSplits };
char const* const kNames[] = {"full 128x256",    "short 64x256",    "lone 64x256",  "pair3 192x128",
                              "even128 192x128", "even256 192x256", "pair4 256x128"};
// Rows x columns x 64 x 2 of every wgmma issued a stage, both warpgroups.
double const kStageFlop[] = {2.0 * 128 * 256 * 64, 2.0 * 64 * 256 * 64,  2.0 * 64 * 256 * 64,
                             2.0 * 192 * 128 * 64, 2.0 * 192 * 128 * 64, 2.0 * 192 * 256 * 64,
                             2.0 * 256 * 128 * 64};

template <int S>
__global__ void __launch_bounds__(256, 1)
    probe(int stages, float* sink, unsigned long long* cycles) {
  extern __shared__ unsigned char raw[];
  unsigned char* const smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(raw) + 1023) & ~std::uintptr_t{1023});
  // Small random bf16 everywhere (the values do not matter, the tensor cores' toggling might).
  for (std::uint32_t i = threadIdx.x; i < kStages * kStageBytes / 4; i += blockDim.x) {
    std::uint32_t x = (i + blockIdx.x * 7919u) * 2654435761u;
    x ^= x >> 13;
    std::uint32_t const lo = 0x3c00u | (x & 0x00ffu), hi = 0x3c00u | ((x >> 8) & 0x00ffu);
    reinterpret_cast<std::uint32_t*>(smem)[i] = lo | (hi << 16);  // bf16 near 0.008 .. 0.015
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  std::uint32_t const base = ptx::smem_address(smem);
  unsigned const wg = threadIdx.x / 128u;
  unsigned long long const t0 = clock64();
  if constexpr (S == kFull) {
    warpgroup_loop<256, 0>(base, wg * 64u, 0, 0, 0, stages, sink);
  } else if constexpr (S == kShort) {
    warpgroup_loop<128, 0>(base, 0, wg * 128u, 0, 0, stages, sink);
  } else if constexpr (S == kLone) {
    if (wg == 0) warpgroup_loop<256, 0>(base, 0, 0, 0, 0, stages, sink);
  } else if constexpr (S == kPair3) {
    if (wg == 0)
      warpgroup_loop<128, 128>(base, 0, 0, 128, 0, stages, sink);
    else
      warpgroup_loop<128, 0>(base, 64, 0, 0, 0, stages, sink);
  } else if constexpr (S == kEven128) {
    warpgroup_loop<128, 64>(base, wg * 64u, 0, 128, wg * 64u, stages, sink);
  } else if constexpr (S == kEven256) {
    warpgroup_loop<256, 128>(base, wg * 64u, 0, 128, wg * 128u, stages, sink);
  } else {
    warpgroup_loop<128, 128>(base, wg * 64u, 0, 128 + wg * 64u, 0, stages, sink);
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

template <int S>
int run(int sms, int stages, float* sink, unsigned long long* cycles, int clock_khz) {
  CK(cudaFuncSetAttribute(probe<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  std::vector<unsigned long long> cyc(sms);
  double cyc_med = 0;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaEventRecord(a));
    probe<S><<<sms, 256, kSmem>>>(stages, sink, cycles);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
    if (rep == 3) {
      CK(cudaMemcpy(cyc.data(), cycles, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      std::sort(cyc.begin(), cyc.end());
      cyc_med = static_cast<double>(cyc[sms / 2]);
    }
  }
  std::sort(ms.begin(), ms.end());
  double const med = ms[ms.size() / 2];
  double const flop = kStageFlop[S] * stages * sms;
  double const ns_stage = med * 1e6 / stages;
  // One N-tile's worth of K = 2048 (32 stages) at this rate, for the layer's tiles.
  std::printf("%-16s %8.1f TFLOP/s  %6.1f ns a stage (%6.0f cycles)  %6.2f us for K = 2048\n",
              kNames[S], flop / (med * 1e-3) / 1e12, ns_stage, cyc_med / stages,
              32 * ns_stage / 1e3);
  (void)clock_khz;
  return 0;
}

int main(int argc, char** argv) {
  int const stages = argc > 1 ? std::atoi(argv[1]) : 32 * 400;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  int const sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, %d stages (K blocks of 64) per CTA, medians of 7 launches\n", prop.name,
              sms, stages);
  float* sink;
  unsigned long long* cycles;
  CK(cudaMalloc(&sink, 256 * sizeof(float)));
  CK(cudaMalloc(&cycles, sms * sizeof(unsigned long long)));
  for (int round = 0; round < 2; ++round) {
    if (run<kFull>(sms, stages, sink, cycles, clock_khz) ||
        run<kShort>(sms, stages, sink, cycles, clock_khz) ||
        run<kLone>(sms, stages, sink, cycles, clock_khz) ||
        run<kPair3>(sms, stages, sink, cycles, clock_khz) ||
        run<kEven128>(sms, stages, sink, cycles, clock_khz) ||
        run<kEven256>(sms, stages, sink, cycles, clock_khz) ||
        run<kPair4>(sms, stages, sink, cycles, clock_khz))
      return 1;
  }
  return 0;
}
