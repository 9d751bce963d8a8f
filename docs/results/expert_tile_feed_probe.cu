// Can a 192-row expert tile be fed? At T = 4096 an expert of 129-192 rows runs a full 128-row
// M-tile and a short one of at most 64 rows, each of whose N-tiles streams the same 1 MB of
// weights (B: 256 rows x K = 2048). One 192 x 256 tile split evenly between the two consumer
// warpgroups (each m64n256 on its 64 rows and m64n128 on its half of rows 128-191) would read them
// once. This probe runs the expert tiles' K loop with real operands: a producer thread streams each
// tile's 32 K blocks by TMA (A: the tile's rows of a 16 MB pool that stays in L2; B: a fresh 1 MB
// of a 1 GB weight buffer, from HBM) through the stages of a 208 KB area, and the consumer
// warpgroups run the wgmma of the split on them, one group in flight, releasing each stage as the
// layer's K loop does (tasks/gemm/device/mainloop_wgmma.cuh). 131 CTAs of 384 threads (two
// consumer warpgroups with 232 registers a thread, as the layer's kernel gives them by setmaxnreg,
// the 192-row split's 192 accumulators among them, and a producer warpgroup with 40), one an SM
// (the layer's processors), each running `tiles` tiles back to back. Modes:
//   full        every CTA runs 128 x 256 tiles on weights of its own (4 stages of 48 KB);
//   full+short  CTA pairs: the even CTA runs 128 x 256 tiles, the odd one 64 x 256 tiles
//               (N split, each warpgroup m64n128; 5 stages of 40 KB) on the same weights at the
//               same time, as an expert's full and short M-tiles run side by side in the layer;
//   even192     every CTA runs 192 x 256 tiles on weights of its own (3 stages of 56 KB).
// Per tile: the median over CTAs of a CTA's time per tile (consumer side, %globaltimer), and the
// processor-time one N-tile of weights costs (full+short: both CTAs' tiles).
// nvcc -O3 -std=c++17 -arch=sm_90a -I<repo> expert_tile_feed_probe.cu -o expert_tile_feed_probe
// (results: docs/results/expert_tile_feed_probe_h200.txt).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "docs/results/wgmma_k_block.cuh"
#include "tasks/gemm/ptx/smem.cuh"
#include "tasks/gemm/ptx/sync.cuh"
#include "tasks/gemm/ptx/tma.cuh"
#include "tasks/gemm/ptx/wgmma.cuh"

namespace ptx = loom::tasks::gemm::ptx;

constexpr int kK = 2048, kKBlocks = kK / 64, kCtas = 131, kMaxTiles = 8;
constexpr int kPoolRows = 4096;                       // 16 MB of A: stays in L2
constexpr int kWeightRows = 256 * kCtas * kMaxTiles;  // 1 MB of B a tile, read once
constexpr std::uint32_t kRow = 128;                   // bytes of a 64-wide K block row
constexpr int kArea = 208 * 1024;

enum Mode { kFull, kFullShort, kEven192 };
char const* const kNames[] = {"full 128x256", "full+short", "even 192x256"};

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// One warpgroup's K loop over `tiles` tiles: per stage wgmma N1 on (A rows a1, B rows b1) and, if
// N2 > 0, N2 on (a2, b2); stage release by lane 0 of each warp once the stage's group is done.
template <int N1, int N2>
__device__ void consume(std::uint32_t area, std::uint32_t a_bytes, std::uint32_t stage_bytes,
                        int stages, int tiles, std::uint32_t a1, std::uint32_t b1, std::uint32_t a2,
                        std::uint32_t b2, std::uint64_t* full, std::uint64_t* empty, float* sink) {
  float acc1[N1 / 2];
  float acc2[N2 > 0 ? N2 / 2 : 1];
  bool const lane0 = threadIdx.x % 32u == 0;
  int stage = 0;
  std::uint32_t phase = 0;
  float total = 0.f;
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int i = 0; i < N1 / 2; ++i) acc1[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (N2 > 0 ? N2 / 2 : 1); ++i) acc2[i] = 0.f;
    int previous = 0;
    for (int kb = 0; kb < kKBlocks; ++kb) {
      while (!ptx::mbarrier_try_wait_parity(full + stage, phase)) {
      }
      std::uint32_t const s = area + static_cast<std::uint32_t>(stage) * stage_bytes;
      std::uint64_t const da1 = ptx::smem_desc_k_major_sw128(s + a1 * kRow);
      std::uint64_t const db1 = ptx::smem_desc_k_major_sw128(s + a_bytes + b1 * kRow);
      std::uint64_t const da2 = ptx::smem_desc_k_major_sw128(s + a2 * kRow);
      std::uint64_t const db2 = ptx::smem_desc_k_major_sw128(s + a_bytes + b2 * kRow);
      wgmma_k_block<N1, N2>(acc1, acc2, da1, db1, da2, db2);
      __syncwarp();
      if (lane0 && kb > 0) ptx::mbarrier_arrive(empty + previous);
      previous = stage;
      if (++stage == stages) stage = 0, phase ^= 1u;
    }
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < N1 / 2; ++i) ptx::fence_operand(acc1[i]);
    __syncwarp();
    if (lane0) ptx::mbarrier_arrive(empty + previous);
    total += acc1[0];
    if constexpr (N2 > 0) total += acc2[0];
  }
  if (total == 1.2345f) sink[threadIdx.x] = total;  // keeps the MMAs
}

template <int M>
__global__ void __launch_bounds__(384, 1)
    probe(const __grid_constant__ CUtensorMap a64, const __grid_constant__ CUtensorMap a128,
          const __grid_constant__ CUtensorMap a192, const __grid_constant__ CUtensorMap b256,
          int tiles, float* sink, unsigned long long* stamps) {
  extern __shared__ unsigned char raw[];
  unsigned char* const area = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(raw) + 1023) & ~std::uintptr_t{1023});
  __shared__ __align__(8) std::uint64_t full[8], empty[8];
  unsigned const cta = blockIdx.x;
  bool const short_tile = M == kFullShort && cta % 2 == 1;
  std::uint32_t const a_rows = M == kEven192 ? 192 : short_tile ? 64 : 128;
  std::uint32_t const a_bytes = a_rows * kRow, stage_bytes = a_bytes + 256 * kRow;
  int const stages = static_cast<int>(kArea / stage_bytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s)
      ptx::mbarrier_init(full + s, 1), ptx::mbarrier_init(empty + s, 8);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  // Tile t's weights: its own 256 rows of the buffer (shared by a CTA pair in full+short).
  unsigned const weights = M == kFullShort ? cta / 2 : cta;
  if (threadIdx.x >= 256) {  // the producer warpgroup: thread 256 streams, the others idle
    ptx::setmaxnreg_dec<40>();
    if (threadIdx.x != 256) return;
    void const* a_map = a_rows == 64 ? &a64 : a_rows == 128 ? &a128 : &a192;
    int stage = 0;
    std::uint32_t phase = 0;
    for (int t = 0; t < tiles; ++t) {
      std::int32_t const a_row =
          static_cast<std::int32_t>(((weights * 7 + t) * 192) % (kPoolRows - 192));
      std::int32_t const b_row = static_cast<std::int32_t>((weights * kMaxTiles + t) * 256);
      for (int kb = 0; kb < kKBlocks; ++kb) {
        while (!ptx::mbarrier_try_wait_parity(empty + stage, phase ^ 1u)) {
        }
        unsigned char* const box = area + stage * stage_bytes;
        ptx::mbarrier_arrive_expect_tx(full + stage, stage_bytes);
        ptx::tma_load_2d(box, a_map, kb * 64, a_row, full + stage);
        ptx::tma_load_2d(box + a_bytes, &b256, kb * 64, b_row, full + stage);
        if (++stage == stages) stage = 0, phase ^= 1u;
      }
    }
  } else {
    ptx::setmaxnreg_inc<232>();
    unsigned const wg = threadIdx.x / 128u;
    std::uint32_t const base = ptx::smem_address(area);
    unsigned long long const t0 = gtime();
    if (M == kEven192)
      consume<256, 128>(base, a_bytes, stage_bytes, stages, tiles, wg * 64u, 0, 128, wg * 128u,
                        full, empty, sink);
    else if (short_tile)
      consume<128, 0>(base, a_bytes, stage_bytes, stages, tiles, 0, wg * 128u, 0, 0, full, empty,
                      sink);
    else
      consume<256, 0>(base, a_bytes, stage_bytes, stages, tiles, wg * 64u, 0, 0, 0, full, empty,
                      sink);
    if (threadIdx.x == 0) stamps[2 * cta] = t0, stamps[2 * cta + 1] = gtime();
  }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;
static CUtensorMap make_map(void* base, std::uint64_t rows, std::uint32_t box_rows) {
  CUtensorMap map;
  cuuint64_t dims[2] = {kK, rows}, strides[1] = {kK * 2};
  cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
  CUresult const r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("encode failed %d\n", r);
  return map;
}

template <int M>
int run(CUtensorMap const* maps, int tiles, float* sink, unsigned long long* st, void* flush) {
  int const smem = kArea + 1024;
  CK(cudaFuncSetAttribute(probe<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<double> per_tile, kernel;
  std::vector<unsigned long long> h(2 * kCtas);
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaMemset(flush, rep, std::size_t{256} << 20));  // the weights come from HBM every time
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    probe<M><<<kCtas, 384, smem>>>(maps[0], maps[1], maps[2], maps[3], tiles, sink, st);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    kernel.push_back(ms * 1e3);
    CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
    for (int c = 0; c < kCtas; ++c) per_tile.push_back((h[2 * c + 1] - h[2 * c]) * 1e-3 / tiles);
  }
  std::sort(per_tile.begin(), per_tile.end());
  std::sort(kernel.begin(), kernel.end());
  double const tile = per_tile[per_tile.size() / 2], k = kernel[kernel.size() / 2];
  double const weight_mb =
      (M == kFullShort ? (kCtas + 1) / 2 : kCtas) * double(tiles);  // 1 MB each
  // Processor-time for one N-tile of weights: full+short runs two tiles on it.
  double const per_ntile = M == kFullShort ? 2 * tile : tile;
  std::printf(
      "%-14s tile %6.2f us (p10 %6.2f, p90 %6.2f)  kernel %7.1f us  weights %5.2f TB/s  "
      "processor-us an N-tile %6.2f\n",
      kNames[M], tile, per_tile[per_tile.size() / 10], per_tile[per_tile.size() * 9 / 10], k,
      weight_mb * 1.048576e6 / (k * 1e-6) / 1e12, per_ntile);
  return 0;
}

int main(int argc, char** argv) {
  int const tiles = argc > 1 ? std::atoi(argv[1]) : kMaxTiles;
  if (tiles < 1 || tiles > kMaxTiles) return 1;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode),
                                      12000, cudaEnableDefault, &q));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  void *a, *b, *flush;
  float* sink;
  unsigned long long* st;
  CK(cudaMalloc(&a, std::size_t{kPoolRows} * kK * 2));
  CK(cudaMalloc(&b, std::size_t{kWeightRows} * kK * 2));
  CK(cudaMemset(a, 0x3c, std::size_t{kPoolRows} * kK * 2));
  CK(cudaMemset(b, 0x3c, std::size_t{kWeightRows} * kK * 2));
  CK(cudaMalloc(&flush, std::size_t{256} << 20));
  CK(cudaMalloc(&sink, 512 * sizeof(float)));
  CK(cudaMalloc(&st, 2 * kCtas * 8));
  CUtensorMap const maps[4] = {make_map(a, kPoolRows, 64), make_map(a, kPoolRows, 128),
                               make_map(a, kPoolRows, 192), make_map(b, kWeightRows, 256)};
  std::printf(
      "%s, %d CTAs of 2 consumer warpgroups and a producer warpgroup, %d tiles each, K = %d, "
      "medians over CTAs and 7 launches\n",
      prop.name, kCtas, tiles, kK);
  for (int round = 0; round < 2; ++round)
    if (run<kFull>(maps, tiles, sink, st, flush) || run<kFullShort>(maps, tiles, sink, st, flush) ||
        run<kEven192>(maps, tiles, sink, st, flush))
      return 1;
  return 0;
}
