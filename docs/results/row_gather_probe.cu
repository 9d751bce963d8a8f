// Can an up tile read its A rows straight from x, one TMA box per row, as fast as from a gathered
// pool? One CTA per SM streams the operands of a T = 1024 call's up runs (64 experts, 32 tokens
// each; 64-row tiles, runs of 4 N-tiles of 256 weight rows, K = 2048 in 32 blocks of 64 columns,
// five 40 KB stages), the consumer holding each stage for a fixed time that stands for the tensor
// cores (350 ns: 64x256x64 at about 6 TFLOP/s per SM). A comes
//   pool:  one {64 x 64} box per stage over a pool of gathered rows (as the layer loads it now);
//   rows1: one {64 x 1} box per row over x at the row's token, 64 rows, issued by one lane;
//   rows32: the same, the producer warp's 32 lanes issuing two rows each;
//   valid: only the 32 valid rows, one per lane (rows past them left as they were);
//   none:  no A at all (the weight stream alone).
// Before timing, each row form's first stage is compared byte for byte with the pool form's over
// the valid rows: the 128-byte swizzle follows the shared-memory address, so one-row boxes build
// the same stage. nvcc -O3 -std=c++17 -arch=sm_90a -o row_gather_probe row_gather_probe.cu
// (results: docs/results/row_gather_probe_h200.txt).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <cuda/ptx>
#include <random>
#include <vector>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                   \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

namespace {

constexpr int kExperts = 64, kTokens = 1024, kHidden = 2048, kUpCols = 4096;
constexpr int kRows = 64, kValid = 32, kTileN = 256, kRun = 4, kKBlocks = kHidden / 64;
constexpr int kStages = 5, kABytes = kRows * 128, kBBytes = kTileN * 128;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kJobs = kExperts * (kUpCols / kTileN / kRun);  // 256 runs

enum Mode { pool, rows1, rows32, valid, none };
char const* const kModeName[] = {"pool  ", "rows1 ", "rows32", "valid ", "none  "};

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void wait_parity(std::uint64_t* bar, std::uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void load_2d(void* dst, CUtensorMap const* map, int col, int row,
                                        std::uint64_t* bar) {
  std::int32_t const c[2] = {col, row};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, c,
                                  bar);
}

// Bytes of A a stage receives in each mode.
__host__ __device__ constexpr int a_bytes(int mode) {
  return mode == none ? 0 : mode == valid ? kValid * 128 : kABytes;
}

// 160 threads: warp 0 lane 0 stands for the consumers, warp 4 is the producer.
template <int kMode>
__global__ void __launch_bounds__(160, 1)
    stream(const __grid_constant__ CUtensorMap pool_map, const __grid_constant__ CUtensorMap x_map,
           const __grid_constant__ CUtensorMap w_map, int const* tokens, int hold_ns,
           unsigned long long* stamps, unsigned char* first_stage) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});
  __shared__ __align__(8) std::uint64_t full[kStages], empty[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  unsigned const lane = threadIdx.x % 32;
  std::uint32_t it = 0;
  if (threadIdx.x >= 128) {  // producer warp
    for (int j = blockIdx.x; j < kJobs; j += gridDim.x) {
      int const e = j / (kJobs / kExperts), run = j % (kJobs / kExperts);
      // This lane's rows' tokens, read once per run (rows past the valid ones repeat the last).
      int const t0 = tokens[e * kValid + min(static_cast<int>(lane), kValid - 1)];
      int const t1 = tokens[e * kValid + kValid - 1];
      for (int n = 0; n < kRun; ++n) {
        int const w_row = e * kUpCols + (run * kRun + n) * kTileN;
        for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
          int const s = it % kStages;
          if (it >= kStages) wait_parity(&empty[s], ((it / kStages) - 1) & 1);
          unsigned char* st = smem + s * kStageBytes;
          if (lane == 0) {
            (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                                       cuda::ptx::space_shared, &full[s],
                                                       a_bytes(kMode) + kBBytes);
            load_2d(st + kABytes, &w_map, kb * 64, w_row, &full[s]);
            if (kMode == pool) load_2d(st, &pool_map, kb * 64, e * kRows, &full[s]);
            if (kMode == rows1)
              for (int r = 0; r < kRows; ++r)
                load_2d(st + r * 128, &x_map, kb * 64,
                        tokens[e * kValid + min(r, kValid - 1)], &full[s]);
          }
          __syncwarp();
          if (kMode == rows32) {
            load_2d(st + lane * 128, &x_map, kb * 64, t0, &full[s]);
            load_2d(st + (lane + 32) * 128, &x_map, kb * 64, t1, &full[s]);
          }
          if (kMode == valid) load_2d(st + lane * 128, &x_map, kb * 64, t0, &full[s]);
        }
      }
    }
  } else if (threadIdx.x == 0) {  // consumer
    for (int j = blockIdx.x; j < kJobs; j += gridDim.x) {
      unsigned long long const start = gtime();
      for (int n = 0; n < kRun; ++n)
        for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
          int const s = it % kStages;
          wait_parity(&full[s], (it / kStages) & 1);
          if (first_stage != nullptr && it == 0 && blockIdx.x == 0)
            for (int b = 0; b < kABytes; ++b) first_stage[b] = smem[b];
          if (hold_ns != 0) {
            unsigned long long const c = gtime();
            while (gtime() - c < static_cast<unsigned long long>(hold_ns)) {
            }
          }
          cuda::ptx::mbarrier_arrive(&empty[s]);
        }
      stamps[2 * j] = start;
      stamps[2 * j + 1] = gtime();
    }
  }
  __syncthreads();
}

PFN_cuTensorMapEncodeTiled_v12000 encode;

CUtensorMap make_map(void* base, std::uint64_t rows, std::uint32_t box_rows) {
  CUtensorMap m;
  cuuint64_t dims[2] = {kHidden, rows}, strides[1] = {kHidden * 2};
  cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("encode failed %d\n", r);
  return m;
}

struct Maps {
  CUtensorMap pool, x, w;
};

template <int kMode>
void launch(int grid, Maps const& m, int const* tokens, int hold_ns, unsigned long long* stamps,
            unsigned char* first_stage) {
  int const smem = kStages * kStageBytes + 1024;
  CK(cudaFuncSetAttribute(stream<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  stream<kMode><<<grid, 160, smem>>>(m.pool, m.x, m.w, tokens, hold_ns, stamps, first_stage);
  CK(cudaGetLastError());
}

template <int kMode>
void timed(int grid, Maps const& m, int const* tokens, int hold_ns, unsigned long long* stamps) {
  std::vector<float> kernel;
  std::vector<double> runs;
  std::vector<unsigned long long> h(2 * kJobs);
  for (int rep = 0; rep < 9; ++rep) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a));
    launch<kMode>(grid, m, tokens, hold_ns, stamps, nullptr);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    kernel.push_back(ms * 1e3f);
    CK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
    for (int j = 0; j < kJobs; ++j) runs.push_back((h[2 * j + 1] - h[2 * j]) * 1e-3);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
  }
  std::sort(kernel.begin(), kernel.end());
  std::sort(runs.begin(), runs.end());
  double const w_bytes = double(kExperts) * kUpCols * kHidden * 2;
  std::printf("%s hold %3d ns/K-block: kernel %6.1f us (min %6.1f), run median %6.1f us (p10 %6.1f, p90 %6.1f); weights %.2f TB/s\n",
              kModeName[kMode], hold_ns, kernel[kernel.size() / 2], kernel[0], runs[runs.size() / 2],
              runs[runs.size() / 10], runs[runs.size() * 9 / 10],
              w_bytes / (kernel[kernel.size() / 2] * 1e-6) / 1e12);
}

template <int kMode>
bool same_first_stage(int grid, Maps const& m, int const* tokens, unsigned long long* stamps,
                      unsigned char* dump, std::vector<unsigned char> const& reference) {
  CK(cudaMemset(dump, 0xA5, kABytes));
  launch<kMode>(grid, m, tokens, 0, stamps, dump);
  CK(cudaDeviceSynchronize());
  std::vector<unsigned char> got(kABytes);
  CK(cudaMemcpy(got.data(), dump, kABytes, cudaMemcpyDeviceToHost));
  bool const same = std::memcmp(got.data(), reference.data(), kValid * 128) == 0;
  std::printf("%s first stage, valid rows: %s the pool's\n", kModeName[kMode],
              same ? "equal to" : "DIFFERENT from");
  if (!same)  // where each 16-byte chunk of rows 0..9 sits in the pool form's row
    for (int r = 0; r < 10; ++r) {
      std::printf("  row %d: chunks at", r);
      for (int c = 0; c < 8; ++c) {
        int at = -1;
        for (int d = 0; d < 8; ++d)
          if (std::memcmp(&got[r * 128 + c * 16], &reference[r * 128 + d * 16], 16) == 0) at = d;
        std::printf(" %d", at);
      }
      std::printf("\n");
    }
  return same;
}

}  // namespace

int main(int argc, char**) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                             cudaEnableDefault, &q));
  // x with distinct bytes everywhere; each expert's 32 tokens drawn at random, and the pool of
  // gathered rows (expert e's rows at e * 64, rows past the valid ones zero).
  std::mt19937 rng(7);
  std::vector<std::uint16_t> x(std::size_t{kTokens} * kHidden);
  for (auto& v : x) v = static_cast<std::uint16_t>(rng());
  std::vector<int> tok(kExperts * kValid);
  for (auto& t : tok) t = static_cast<int>(rng() % kTokens);
  std::vector<std::uint16_t> gathered(std::size_t{kExperts} * kRows * kHidden, 0);
  for (int e = 0; e < kExperts; ++e)
    for (int r = 0; r < kValid; ++r)
      std::memcpy(&gathered[(std::size_t(e) * kRows + r) * kHidden],
                  &x[std::size_t(tok[e * kValid + r]) * kHidden], kHidden * 2);
  void *dx, *dpool, *dw;
  int* dtok;
  unsigned long long* stamps;
  unsigned char* dump;
  CK(cudaMalloc(&dx, x.size() * 2));
  CK(cudaMalloc(&dpool, gathered.size() * 2));
  CK(cudaMalloc(&dw, std::size_t{kExperts} * kUpCols * kHidden * 2));
  CK(cudaMalloc(&dtok, tok.size() * 4));
  CK(cudaMalloc(&stamps, 2 * kJobs * 8));
  CK(cudaMalloc(&dump, kABytes));
  CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpool, gathered.data(), gathered.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dtok, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dw, 0, std::size_t{kExperts} * kUpCols * kHidden * 2));
  Maps const m{make_map(dpool, std::uint64_t{kExperts} * kRows, kRows), make_map(dx, kTokens, 1),
               make_map(dw, std::uint64_t{kExperts} * kUpCols, kTileN)};
  int const grid = sms - 1;  // as the layer: one SM runs the scheduler

  std::vector<unsigned char> reference(kABytes);
  CK(cudaMemset(dump, 0, kABytes));
  launch<pool>(grid, m, dtok, 0, stamps, dump);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(reference.data(), dump, kABytes, cudaMemcpyDeviceToHost));
  bool ok = same_first_stage<rows1>(grid, m, dtok, stamps, dump, reference);
  ok &= same_first_stage<rows32>(grid, m, dtok, stamps, dump, reference);
  ok &= same_first_stage<valid>(grid, m, dtok, stamps, dump, reference);
  std::printf("%d CTAs, %d runs of %d N-tiles; weights %.0f MB\n", grid, kJobs, kRun,
              double(kExperts) * kUpCols * kHidden * 2 / 1e6);
  if (argc > 1) return ok ? 0 : 1;  // the stage comparison only
  for (int round = 0; round < 2; ++round)
    for (int hold : {0, 350}) {
      timed<pool>(grid, m, dtok, hold, stamps);
      timed<rows1>(grid, m, dtok, hold, stamps);
      timed<rows32>(grid, m, dtok, hold, stamps);
      timed<valid>(grid, m, dtok, hold, stamps);
      timed<none>(grid, m, dtok, hold, stamps);
    }
  return ok ? 0 : 1;
}
