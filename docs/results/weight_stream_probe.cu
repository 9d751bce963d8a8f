// Does the layout or the order of the expert weights bound a call that reads each weight once
// (the MoE layer at T = 1024 and in decode)? One CTA per SM but one (the scheduler's) streams the
// up tiles' TMA boxes of a T = 1024 call: A 64 pool rows (8 KB a stage, L2-resident), B 256 weight
// rows x 64 columns (32 KB a stage), five stages, 32 K blocks a tile; 64 experts x 16 N-tiles, each
// weight box read once from HBM. The consumer holds each stage for a fixed time standing for the
// tensor cores (0, or 260 ns: a 64x256x64 K block at about 8 TFLOP/s an SM), then a task ends
// with a 2 us epilogue before its CTA takes the next task from a global counter. Variants:
//   layout     rows: W1 [64][4096][2048] as the layer stores it (a box is 256 runs of 128 bytes,
//              4 KB apart); blocked: each (expert, N-tile, K block) box 32 contiguous KB;
//   tasks      runs of 1, 2 or 4 N-tiles streamed without a break, the N-tiles of a run adjacent
//              (n, n + 1, ...) or strided (q, q + 4, ...);
//   order      by expert (an expert's tasks next to each other in the list, as the layer emits an
//              M-tile's tasks) or interleaved (task q of every expert, then task q + 1), and
//              rotated (an expert's task q covers run (q + expert) mod runs).
// nvcc -O3 -std=c++17 -arch=sm_90a; results in docs/results/weight_stream_probe_h200.txt,
// discussed in docs/performance.md ("The order of the weight stream").
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda/ptx>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int kStages = 5, kKBlocks = 32, kABytes = 64 * 64 * 2, kBBytes = 256 * 64 * 2;
constexpr int kStageBytes = kABytes + kBBytes, kJobs = 1024;

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(sa(bar)), "r"(parity) : "memory");
}

// A task: expert e, N-tiles n0, n0 + step, ... (count of them), streamed without a break; between
// tasks the producer waits for the previous task's end and a 2 us epilogue, as a task per run does.
// Tasks are taken from a global counter, in the order of the list, as the scheduler's queue gives
// them out.
struct Job { int e, n0, step, count; };
template <bool kBlocked>
__global__ void __launch_bounds__(256, 1) feed(const __grid_constant__ CUtensorMap a_map,
                                               const __grid_constant__ CUtensorMap b_map,
                                               Job const* jobs, int njobs, unsigned* next,
                                               int hold_ns, unsigned long long* stamps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages], done;
  __shared__ int job[2];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) { cuda::ptx::mbarrier_init(&full[s], 1); cuda::ptx::mbarrier_init(&empty[s], 1); }
    cuda::ptx::mbarrier_init(&done, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  uint32_t it = 0;
  for (int round = 0;; ++round) {
    if (threadIdx.x == 0) job[round & 1] = (int)atomicAdd(next, 1u);
    __syncthreads();
    int const j = job[round & 1];
    if (j >= njobs) break;
    Job const t = jobs[j];
    unsigned long long const t0 = gtime();
    if (threadIdx.x == 0) {  // producer
      for (int c = 0; c < t.count; ++c) {
        int const n = t.n0 + c * t.step;
        for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
          int const s = it % kStages;
          if (it >= kStages) wait(&empty[s], ((it / kStages) - 1) & 1);
          (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, &full[s], kStageBytes);
          unsigned char* st = smem + s * kStageBytes;
          int32_t ca[2] = {kb * 64, t.e * 64};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st, &a_map, ca, &full[s]);
          int32_t cb[2] = {kBlocked ? 0 : kb * 64, kBlocked ? ((t.e * 16 + n) * 32 + kb) * 256 : t.e * 4096 + n * 256};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st + kABytes, &b_map, cb, &full[s]);
        }
      }
    } else if (threadIdx.x == 128) {  // consumer (one thread stands for the warpgroups)
      for (int c = 0; c < t.count; ++c)
        for (int kb = 0; kb < kKBlocks; ++kb, ++it) {
          int const s = it % kStages;
          wait(&full[s], (it / kStages) & 1);
          if (hold_ns) { unsigned long long const h0 = gtime(); while (gtime() - h0 < (unsigned long long)hold_ns) {} }
          cuda::ptx::mbarrier_arrive(&empty[s]);
        }
      unsigned long long const h0 = gtime(); while (gtime() - h0 < 2000) {}  // the epilogue
      stamps[2 * j] = t0; stamps[2 * j + 1] = gtime();
    }
    __syncthreads();
  }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;
static CUtensorMap make_map(void* base, uint64_t rows, uint32_t box_rows, uint64_t cols) {
  CUtensorMap m;
  cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * 2};
  cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) printf("encode failed %d\n", r);
  return m;
}

std::vector<Job> order(int run, bool strided, bool interleave, bool rotate) {
  std::vector<Job> jobs;
  int const per = 16 / run;
  auto job = [&](int e, int q) {
    if (rotate) q = (q + e) % per;
    jobs.push_back({e, strided ? q : q * run, strided ? per : 1, run});
  };
  if (interleave) {
    for (int q = 0; q < per; ++q)
      for (int e = 0; e < 64; ++e) job(e, q);
  } else {
    for (int e = 0; e < 64; ++e)
      for (int q = 0; q < per; ++q) job(e, q);
  }
  return jobs;
}

template <bool kBlocked>
int run(int grid, CUtensorMap const& am, CUtensorMap const& bm, int hold, void* flush, unsigned long long* st,
        Job* djobs, unsigned* next, int per_task, bool strided, bool interleave, bool rotate = false) {
  int const smem = kStages * kStageBytes + 1024;
  auto k = feed<kBlocked>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<Job> const jobs = order(per_task, strided, interleave, rotate);
  int const njobs = (int)jobs.size();
  CK(cudaMemcpy(djobs, jobs.data(), jobs.size() * sizeof(Job), cudaMemcpyHostToDevice));
  std::vector<float> totals;
  std::vector<double> d;
  std::vector<unsigned long long> h(njobs * 2);
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaMemset(flush, rep, size_t(256) << 20));  // 256 MB through L2: no weight line left there
    CK(cudaMemset(next, 0, 4));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a);
    k<<<grid, 256, smem>>>(am, bm, djobs, njobs, next, hold, st);
    cudaEventRecord(b); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, a, b); totals.push_back(ms * 1e3f);
    if (rep == 3) {
      CK(cudaMemcpy(h.data(), st, njobs * 2 * 8, cudaMemcpyDeviceToHost));
      for (int t = 0; t < njobs; ++t) d.push_back((h[2 * t + 1] - h[2 * t]) * 1e-3);
    }
  }
  std::sort(d.begin(), d.end()); std::sort(totals.begin(), totals.end());
  double const wbytes = double(kJobs) * kKBlocks * kBBytes;
  printf("%-8s runs of %2d N-tiles, %-10s %-11s%s hold %3d ns, %d CTAs: kernel median %.1f us (min %.1f), task median %.1f us (p10 %.1f p90 %.1f); weights %.2f TB/s\n",
         kBlocked ? "blocked" : "rows", per_task, per_task == 1 ? "" : strided ? "strided" : "adjacent", interleave ? "interleaved" : "by expert", rotate ? " rotated" : "", hold, grid,
         totals[3], totals[0], d[d.size() / 2], d[d.size() / 10], d[d.size() * 9 / 10], wbytes / (totals[3] * 1e-6) / 1e12);
  return 0;
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q));
  void *a, *b, *flush; unsigned long long* st;
  size_t const wbytes = size_t(64) * 4096 * 2048 * 2;
  CK(cudaMalloc(&a, size_t(4096) * 2048 * 2)); CK(cudaMalloc(&b, wbytes)); CK(cudaMalloc(&flush, size_t(256) << 20));
  CK(cudaMemset(a, 0, size_t(4096) * 2048 * 2)); CK(cudaMemset(b, 1, wbytes));
  CK(cudaMalloc(&st, kJobs * 2 * 8));
  CUtensorMap am = make_map(a, 4096, 64, 2048), rows = make_map(b, 64 * 4096, 256, 2048);
  CUtensorMap blocked = make_map(b, uint64_t(64) * 4096 * 32, 256, 64);
  // A plain copy of the weights, for the bandwidth a stream of that size gets here.
  void* c; CK(cudaMalloc(&c, wbytes));
  for (int rep = 0; rep < 3; ++rep) {
    cudaEvent_t x, y; cudaEventCreate(&x); cudaEventCreate(&y);
    cudaEventRecord(x); CK(cudaMemcpy(c, b, wbytes, cudaMemcpyDeviceToDevice)); cudaEventRecord(y); CK(cudaEventSynchronize(y));
    float ms; cudaEventElapsedTime(&ms, x, y);
    printf("device copy of the weights: %.1f us, %.2f TB/s (read + write)\n", ms * 1e3, 2.0 * wbytes / (ms * 1e-3) / 1e12);
  }
  CK(cudaFree(c));
  Job* djobs; unsigned* next;
  CK(cudaMalloc(&djobs, kJobs * sizeof(Job))); CK(cudaMalloc(&next, 4));
  int const grid = sms - 1;  // the scheduler's SM runs no tiles
  for (int hold : {0, 260}) {
    for (int runlen : {1, 4})
      for (bool interleave : {false, true})
        run<false>(grid, am, rows, hold, flush, st, djobs, next, runlen, false, interleave, true);
    for (int runlen : {1, 2, 4}) {
      for (bool strided : {false, true}) {
        if (runlen == 1 && strided) continue;
        for (bool interleave : {false, true}) run<false>(grid, am, rows, hold, flush, st, djobs, next, runlen, strided, interleave);
      }
    }
    run<true>(grid, am, blocked, hold, flush, st, djobs, next, 1, false, false);
    run<true>(grid, am, blocked, hold, flush, st, djobs, next, 4, false, false);
  }
  return 0;
}
