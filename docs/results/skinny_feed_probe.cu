// How fast can 112 SMs feed the 128x128 tiles of a skinny GEMM (256 x 7168 x 7168: 2 M-tiles x 56
// N-tiles, one tile a CTA, one wave), and does a 2-CTA cluster's TMA multicast feed them faster?
// Only the operands are real: a producer thread streams each tile's 112 K blocks (A: 128 rows x 64,
// B: 128 rows x 64, 32 KB a stage, six stages) and a consumer thread stands for the tensor cores by
// holding each stage for a fixed time (0 ns: the feed alone; 350 ns: 128x128x64 at 6 TFLOP/s an
// SM, cuBLAS's rate). Modes:
//   0  no cluster: each CTA loads its A and its B;
//   1  clusters of 2 on (m, n) and (m, n + 1): each CTA loads half of the shared A box and
//      multicasts it into both, and its own B; a stage is released in both CTAs;
//   2  clusters of 2 on (0, n) and (1, n): each CTA loads its own A and half of the shared B box,
//      multicast into both; a stage is released in both CTAs.
// nvcc -O3 -std=c++17 -arch=sm_90a skinny_feed_probe.cu -o skinny_feed_probe; results in
// docs/results/skinny_feed_probe_h200.txt.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cuda/ptx>
#include <vector>
#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                   \
      return 1;                                                        \
    }                                                                  \
  } while (0)

constexpr int kStages = 6, kKBlocks = 112, kK = kKBlocks * 64, kN = 7168, kM = 256;
constexpr int kABytes = 128 * 64 * 2, kBBytes = 128 * 64 * 2, kStageBytes = kABytes + kBBytes;
constexpr int kTiles = 2 * (kN / 128);  // 112

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t sa(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
      "p;\n}\n"
      : "=r"(done)
      : "r"(sa(bar)), "r"(parity)
      : "memory");
  return done;
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  while (!try_wait(bar, parity)) {
  }
}
__device__ __forceinline__ uint32_t cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
__device__ __forceinline__ void arrive_remote(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sa(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

template <int kMode>
__global__ void __launch_bounds__(256, 1)
    feed(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
         int mma_ns, unsigned long long* stamps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  constexpr bool kCluster = kMode != 0;
  uint32_t const rank = kCluster ? cta_rank() : 0;
  // The tile (m, n) of this CTA; in mode 1 a cluster holds two N-tiles of one M-tile, in mode 2
  // both M-tiles of one N-tile.
  uint32_t const b = blockIdx.x;
  uint32_t m, n;
  if (kMode == 2) {
    m = rank, n = b / 2;
  } else {
    m = b / (kN / 128), n = b % (kN / 128);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], kCluster ? 2 : 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (kCluster) cluster_sync();
  if (threadIdx.x == 0) {  // producer
    for (int kb = 0; kb < kKBlocks; ++kb) {
      int const s = kb % kStages;
      if (kb >= kStages) wait(&empty[s], ((kb / kStages) - 1) & 1);
      (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                                 cuda::ptx::space_shared, &full[s], kStageBytes);
      unsigned char* st = smem + s * kStageBytes;
      if (kMode == 1) {  // half of A, into both CTAs
        int32_t ca[2] = {kb * 64, int32_t(m * 128 + rank * 64)};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        st + rank * (kABytes / 2), &a_map, ca, &full[s],
                                        (uint16_t)0x3);
      } else {
        int32_t ca[2] = {kb * 64, int32_t(m * 128)};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st,
                                        &a_map, ca, &full[s]);
      }
      if (kMode == 2) {  // half of B, into both CTAs
        int32_t cb[2] = {kb * 64, int32_t(n * 128 + rank * 64)};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        st + kABytes + rank * (kBBytes / 2), &b_map, cb, &full[s],
                                        (uint16_t)0x3);
      } else {
        int32_t cb[2] = {kb * 64, int32_t(n * 128)};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        st + kABytes, &b_map, cb, &full[s]);
      }
    }
  } else if (threadIdx.x == 128) {  // consumer (one thread stands for the warpgroups)
    unsigned long long const t0 = gtime();
    for (int kb = 0; kb < kKBlocks; ++kb) {
      int const s = kb % kStages;
      wait(&full[s], (kb / kStages) & 1);
      if (mma_ns) {
        long long const c = clock64(), cycles = (long long)mma_ns * 185 / 100;
        while (clock64() - c < cycles) {
        }
      }
      cuda::ptx::mbarrier_arrive(&empty[s]);
      if (kCluster) arrive_remote(&empty[s], rank ^ 1);
    }
    unsigned long long const t1 = gtime();
    stamps[2 * b] = t0, stamps[2 * b + 1] = t1;
  }
  __syncthreads();
  if (kCluster) cluster_sync();
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;
static CUtensorMap make_map(void* base, uint64_t rows, uint32_t box_rows) {
  CUtensorMap map;
  cuuint64_t dims[2] = {kK, rows}, strides[1] = {kK * 2};
  cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
  CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) printf("encode failed %d\n", r);
  return map;
}

template <int kMode>
int run(CUtensorMap const& am, CUtensorMap const& bm, int mma_ns, unsigned long long* st,
        std::vector<void*> const& flush) {
  int const smem = kStages * kStageBytes + 1024;
  CK(cudaFuncSetAttribute(feed<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = kTiles, cfg.blockDim = 256, cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute at[1];
  if (kMode) {
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
  }
  std::vector<float> totals;
  std::vector<double> tiles;
  std::vector<unsigned long long> h(2 * kTiles);
  for (int rep = 0; rep < 9; ++rep) {
    // B (103 MB) comes from HBM in every repetition: another buffer is written in between.
    CK(cudaMemset(flush[rep % flush.size()], rep, size_t(256) << 20));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    cudaEventRecord(a);
    CK(cudaLaunchKernelEx(&cfg, feed<kMode>, am, bm, mma_ns, st));
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    totals.push_back(ms * 1e3f);
    CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
    for (int t = 0; t < kTiles; ++t) tiles.push_back((h[2 * t + 1] - h[2 * t]) * 1e-3);
  }
  std::sort(totals.begin(), totals.end());
  std::sort(tiles.begin(), tiles.end());
  double const tile = tiles[tiles.size() / 2];
  double const into_sms = double(kTiles) * kKBlocks * kStageBytes / (tile * 1e-6) / 1e12;
  printf(
      "mode %d (%s) hold %3d ns/K block: kernel %.1f us, tile median %.1f us (p10 %.1f, p90 "
      "%.1f), %.3f us a K block, %.2f TB/s into the SMs' shared memory\n",
      kMode,
      kMode == 0   ? "no cluster         "
      : kMode == 1 ? "cluster, A shared  "
                   : "cluster, B shared  ",
      mma_ns, totals[totals.size() / 2], tile, tiles[tiles.size() / 10],
      tiles[tiles.size() * 9 / 10], tile / kKBlocks, into_sms);
  return 0;
}

int main() {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000,
                                      cudaEnableDefault, &q));
  void *a, *b;
  unsigned long long* st;
  CK(cudaMalloc(&a, size_t(kM) * kK * 2));
  CK(cudaMalloc(&b, size_t(kN) * kK * 2));
  CK(cudaMemset(a, 0, size_t(kM) * kK * 2));
  CK(cudaMemset(b, 0, size_t(kN) * kK * 2));
  CK(cudaMalloc(&st, 2 * kTiles * 8));
  std::vector<void*> flush(2);
  for (auto& f : flush) CK(cudaMalloc(&f, size_t(256) << 20));
  CUtensorMap const a128 = make_map(a, kM, 128), a64 = make_map(a, kM, 64);
  CUtensorMap const b128 = make_map(b, kN, 128), b64 = make_map(b, kN, 64);
  for (int round = 0; round < 2; ++round)
    for (int mma : {0, 350}) {
      run<0>(a128, b128, mma, st, flush);
      run<1>(a64, b128, mma, st, flush);
      run<2>(a128, b64, mma, st, flush);
    }
  return 0;
}
