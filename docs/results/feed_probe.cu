// How long does a 128x256 (K = 2048) tile take when only its operands are real? One CTA per SM
// streams the TMA boxes of the MoE layer's up tiles (A: 128 pool rows, B: 256 weight rows, 64
// columns a stage, four 48 KB stages), two M-tiles of each (expert, N-tile) side by side and an
// expert's N-tiles together, as the layer emits them; the consumer stands for the tensor cores by
// holding each stage for a fixed time (0, 500 or 700 ns: 700 ns is 128x256x64 at 787 TFLOP/s over
// 132 SMs). Variants: 2-CTA clusters (cooperative or not) whose CTAs each load half of the shared
// B box into both (TMA multicast) and release a stage in both; B stored K-blocked, so that a box
// is 32 contiguous KB; and tile by tile (the next tile's loads wait for the previous tile's end
// and a 2 us epilogue), as one task per tile runs, with or without the next tile's first K blocks
// prefetched into L2 near the current tile's end. nvcc -O3 -std=c++17 -arch=sm_90a; results in
// docs/results/tile_probes_h200.txt.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda/ptx>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int kStages = 4, kKBlocks = 32, kABytes = 128 * 64 * 2, kBBytes = 256 * 64 * 2;
constexpr int kStageBytes = kABytes + kBBytes;

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(sa(bar)), "r"(parity) : "memory");
  return done;
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) { while (!try_wait(bar, parity)) {} }
__device__ __forceinline__ uint32_t cta_rank() { uint32_t r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
template <bool kReleaseCluster>
__device__ __forceinline__ void arrive_remote(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sa(bar)), "r"(rank));
  if (kReleaseCluster)
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  else
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}

// mode 0: one CTA per tile, B whole; 1: clusters of 2, B halves multicast, a stage released in
// both CTAs; 2: clusters, B whole, released locally; 3: clusters, B whole, released in both;
// 4: as 0, B K-blocked; 5: as 1, B K-blocked; 6: as 3, the remote release .release.cluster.
template <int kMode, bool kSerial = false, int kPrefetch = 0>
__global__ void __launch_bounds__(256, 1) feed(const __grid_constant__ CUtensorMap a_map,
                                               const __grid_constant__ CUtensorMap b_map, int jobs,
                                               int mma_ns, unsigned long long* stamps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages], done;
  uint32_t const rank = kMode ? cta_rank() : blockIdx.x % 2;
  constexpr bool kCoupled = kMode == 1 || kMode == 3 || kMode == 5 || kMode == 6, kMcast = kMode == 1 || kMode == 5, kBlocked = kMode >= 4;
  uint32_t const unit = kMode ? blockIdx.x / 2 : blockIdx.x / 2, units = gridDim.x / 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) { cuda::ptx::mbarrier_init(&full[s], 1); cuda::ptx::mbarrier_init(&empty[s], kCoupled ? 2 : 1); }
    cuda::ptx::mbarrier_init(&done, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (kMode) cluster_sync();
  uint32_t it = 0;
  if (threadIdx.x == 0) {  // producer
    for (int j = unit, n_job = 0; j < jobs; j += units, ++n_job) {
      if (kSerial && n_job > 0) wait(&done, (n_job - 1) & 1);  // a task per tile: no stream across tiles
      int const e = (j / 16) % 64, n = j % 16;  // as the MoE up tiles: an M-tile pair's N-tiles together
      int const arow = (e * 2 + rank) * 128 % 8192, brow = e * 4096 + n * 256;
      for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
        int const s = it % kStages;
        if (it >= kStages) wait(&empty[s], ((it / kStages) - 1) & 1);
        (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, &full[s], kStageBytes);
        unsigned char* st = smem + s * kStageBytes;
        int32_t ca[2] = {kb * 64, arow};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st, &a_map, ca, &full[s]);
        if (kPrefetch && kb == kKBlocks - 8 && j + units < jobs) {  // the next tile's first K blocks into L2
          int const e2 = ((j + units) / 16) % 64, n2 = (j + units) % 16;
          int const arow2 = (e2 * 2 + rank) * 128 % 8192, brow2 = e2 * 4096 + n2 * 256;
          for (int k2 = 0; k2 < kPrefetch; ++k2) {
            asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" :: "l"(&a_map), "r"(k2 * 64), "r"(arow2) : "memory");
            asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" :: "l"(&b_map), "r"(k2 * 64), "r"(brow2) : "memory");
          }
        }
        if (kMcast) {
          int32_t cb[2] = {kBlocked ? 0 : kb * 64, kBlocked ? ((e * 16 + n) * 32 + kb) * 256 + (int)rank * 128 : brow + (int)rank * 128};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st + kABytes + rank * (kBBytes / 2), &b_map, cb, &full[s], (uint16_t)0x3);
        } else {
          int32_t cb[2] = {kBlocked ? 0 : kb * 64, kBlocked ? ((e * 16 + n) * 32 + kb) * 256 : brow};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st + kABytes, &b_map, cb, &full[s]);
        }
      }
    }
  } else if (threadIdx.x == 128) {  // consumer (one thread stands for the warpgroups)
    for (int j = unit; j < jobs; j += units) {
      unsigned long long const t0 = gtime();
      for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
        int const s = it % kStages;
        wait(&full[s], (it / kStages) & 1);
        if (mma_ns) { long long const c = clock64(); long long const n = (long long)mma_ns * 185 / 100; while (clock64() - c < n) {} }
        cuda::ptx::mbarrier_arrive(&empty[s]);
        if (kCoupled) arrive_remote<kMode == 6>(&empty[s], rank ^ 1);
      }
      if (kSerial) {  // the epilogue (2 us), then the tile's end releases the next task
        long long const c = clock64(); while (clock64() - c < 3700) {}
        cuda::ptx::mbarrier_arrive(&done);
      }
      unsigned long long const t1 = gtime();
      stamps[2 * (j * 2 + rank)] = t0; stamps[2 * (j * 2 + rank) + 1] = t1;
    }
  }
  __syncthreads();
  if (kMode) cluster_sync();
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;
static CUtensorMap make_map(void* base, uint64_t rows, uint32_t box_rows, uint64_t cols = 2048) {
  CUtensorMap m;
  cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * 2};
  cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) printf("encode failed %d\n", r);
  return m;
}

template <int kMode, bool kSerial = false, int kPrefetch = 0>
int run(int sms, CUtensorMap const& am, CUtensorMap const& bm, int mma_ns, bool coop, unsigned long long* st) {
  int const jobs = 1024, smem = kStages * kStageBytes + 1024;
  CK(cudaFuncSetAttribute(feed<kMode, kSerial, kPrefetch>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if (kMode) CK(cudaFuncSetAttribute(feed<kMode, kSerial, kPrefetch>, cudaFuncAttributeNonPortableClusterSizeAllowed, 0));
  cudaLaunchConfig_t cfg = {};
  int const grid = sms / 2 * 2;
  cfg.gridDim = grid; cfg.blockDim = 256; cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute at[2]; int na = 0;
  if (kMode) { at[na].id = cudaLaunchAttributeClusterDimension; at[na].val.clusterDim.x = 2; at[na].val.clusterDim.y = 1; at[na].val.clusterDim.z = 1; ++na; }
  if (coop) { at[na].id = cudaLaunchAttributeCooperative; at[na].val.cooperative = 1; ++na; }
  cfg.attrs = at; cfg.numAttrs = na;
  if (kMode) {
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, feed<kMode, kSerial, kPrefetch>, &cfg));
    printf("  max active clusters of 2: %d (grid %d blocks)\n", clusters, grid);
  }
  std::vector<unsigned long long> h(jobs * 4);
  std::vector<float> totals;
  for (int rep = 0; rep < 7; ++rep) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a);
    cudaError_t e = cudaLaunchKernelEx(&cfg, feed<kMode, kSerial, kPrefetch>, am, bm, jobs, mma_ns, st);
    if (e != cudaSuccess) { printf("  launch (mode %d coop %d): %s\n", kMode, coop, cudaGetErrorString(e)); cudaGetLastError(); return 0; }
    cudaEventRecord(b); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, a, b); totals.push_back(ms * 1e3f);
  }
  CK(cudaMemcpy(h.data(), st, jobs * 4 * 8, cudaMemcpyDeviceToHost));
  std::vector<double> d; for (int t = 0; t < jobs * 2; ++t) d.push_back((h[2 * t + 1] - h[2 * t]) * 1e-3);
  std::sort(d.begin(), d.end()); std::sort(totals.begin(), totals.end());
  double const bytes = double(jobs) * 2 * 32 * kABytes + double(jobs) * 32 * kBBytes * (kMode == 1 || kMode == 5 ? 1 : 2);
  printf("%s mode %s coop %d mma %4d ns/K-block: kernel %.1f us, tile median %.1f us (p10 %.1f p90 %.1f); %.2f TB/s into SMs\n",
         kSerial ? (kPrefetch == 1 ? "tile by tile, next 1 K block in L2 " : kPrefetch == 2 ? "tile by tile, next 2 K blocks in L2" : kPrefetch == 4 ? "tile by tile, next 4 K blocks in L2" : "tile by tile") : "stream     ", kMode == 4 ? "no cluster, own B, blocked   " : kMode == 5 ? "cluster, multicast, blocked " : kMode == 1 ? "cluster, multicast B, coupled" : kMode == 2 ? "cluster, own B, decoupled   " : kMode == 3 ? "cluster, own B, coupled     " : kMode == 6 ? "as 3, .release.cluster      " : "no cluster, own B           ", coop, mma_ns, totals[3], d[d.size() / 2], d[d.size() / 10], d[d.size() * 9 / 10],
         bytes / (totals[3] * 1e-6) / 1e12);
  return 0;
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&encode, cudaEnableDefault, &q));
  void *a, *b; unsigned long long* st;
  CK(cudaMalloc(&a, size_t(8192) * 2048 * 2)); CK(cudaMalloc(&b, size_t(64) * 4096 * 2048 * 2));
  CK(cudaMemset(a, 0, size_t(8192) * 2048 * 2)); CK(cudaMemset(b, 0, size_t(64) * 4096 * 2048 * 2));
  CK(cudaMalloc(&st, 1024 * 4 * 8));
  CUtensorMap am = make_map(a, 8192, 128), bm = make_map(b, 64 * 4096, 256), bh = make_map(b, 64 * 4096, 128);
  CUtensorMap kbm = make_map(b, uint64_t(64) * 4096 * 32, 256, 64), kbh = make_map(b, uint64_t(64) * 4096 * 32, 128, 64);
  for (int mma : {0, 500, 700}) {
    run<0>(sms, am, bm, mma, false, st);
    run<1>(sms, am, bh, mma, false, st);
    run<4>(sms, am, kbm, mma, false, st);
    run<5>(sms, am, kbh, mma, false, st);
  }
  for (int mma : {0, 700}) run<0, true>(sms, am, bm, mma, false, st);
  for (int mma : {0, 700}) {
    run<2>(sms, am, bm, mma, false, st);
    run<3>(sms, am, bm, mma, false, st);
    run<6>(sms, am, bm, mma, false, st);
  }
  run<0>(sms, am, bm, 700, true, st);  // cooperative launches
  run<1>(sms, am, bh, 700, true, st);
  // Tile by tile, the next tile's first 1, 2 or 4 K blocks prefetched into L2 (cp.async.bulk.
  // prefetch.tensor) when the producer issues the current tile's eighth K block from the end.
  for (int mma : {0, 700}) {
    run<0, true>(sms, am, bm, mma, false, st);
    run<0, true, 1>(sms, am, bm, mma, false, st);
    run<0, true, 2>(sms, am, bm, mma, false, st);
    run<0, true, 4>(sms, am, bm, mma, false, st);
  }
  return 0;
}
