// How fast can one block copy token rows, as an EP send claim does? Rows of 4 KB (H = 2048,
// bf16) are read in a random order (the tokens of a send order) and written to consecutive rows
// (a destination's recv slots), 128 rows a claim, claims dealt to B blocks of 384 threads.
// Variants:
//   threads16 / threads24: the row fan-out's loop (each thread keeps 16 or 24 16-byte loads in
//     flight, then stores them; per-row source and destination addresses in shared memory,
//     predicated st.global);
//   bulk: warp 0 stages rows into a ring of 33 row slots (132 KB) with cp.async.bulk, completing
//     on one mbarrier per slot; warps 1..11 store a staged row each (st.global from shared memory)
//     and free its slot.
// Each variant to this GPU's memory and, with two GPUs, to the other's over NVLink (peer
// pointers); medians of 7 launches, every copy checked against its source.
// nvcc -O3 -std=c++17 -arch=sm_90a copy_probe.cu -o copy_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

constexpr unsigned kThreads = 384, kRowBytes = 4096, kRowChunks = kRowBytes / 16;
constexpr unsigned kClaimRows = 128;
// A slot's rows are always stored by the same consumer warp (33 = 3 x 11 warps), so that no warp
// waits on a slot's phase more than one ahead of the last it took (a parity wait cannot tell).
constexpr unsigned kSlots = 33;
static_assert(kSlots % (kThreads / 32 - 1) == 0, "each slot belongs to one consumer warp");

__device__ __forceinline__ void st_global_v4(uint4* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}
__device__ __forceinline__ unsigned smem(void const* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Claims c = blockIdx.x, blockIdx.x + gridDim.x, ...: claim row k copies src row perm[128c + k]
// to dst row 128c + k.
template <unsigned kLoads>
__global__ void __launch_bounds__(kThreads, 1)
    copy_threads(uint4 const* src, uint4* dst, unsigned const* perm, unsigned rows) {
  __shared__ uint4 const* from[kClaimRows];
  __shared__ uint4* to[kClaimRows];
  unsigned const claims = (rows + kClaimRows - 1) / kClaimRows;
  unsigned const step_rows = blockDim.x / kRowChunks, step_chunks = blockDim.x % kRowChunks;
  auto advance = [&](unsigned& s, unsigned& c) {
    s += step_rows;
    c += step_chunks;
    if (c >= kRowChunks) c -= kRowChunks, ++s;
  };
  for (unsigned claim = blockIdx.x; claim < claims; claim += gridDim.x) {
    unsigned const row0 = claim * kClaimRows, n = min(kClaimRows, rows - row0);
    if (threadIdx.x < n) {
      from[threadIdx.x] = src + std::size_t{perm[row0 + threadIdx.x]} * kRowChunks;
      to[threadIdx.x] = dst + std::size_t{row0 + threadIdx.x} * kRowChunks;
    }
    __syncthreads();
    unsigned s = threadIdx.x / kRowChunks, c = threadIdx.x % kRowChunks;
    while (s < n) {
      uint4 r[kLoads];
      unsigned ls = s, lc = c;
#pragma unroll
      for (unsigned u = 0; u < kLoads; ++u) {
        r[u] = __ldcg(from[min(ls, n - 1)] + lc);
        advance(ls, lc);
      }
#pragma unroll
      for (unsigned u = 0; u < kLoads; ++u) {
        bool const valid = s < n;
        uint4* const row = to[min(s, n - 1)];
        if (valid) st_global_v4(row + c, r[u]);
        advance(s, c);
      }
    }
    __syncthreads();
  }
}

// The block's rows in claim order, one stream: row i of the block is claim-row i % 128 of its
// (i / 128)-th claim. Slot i % kSlots, phase (i / kSlots) & 1.
__global__ void __launch_bounds__(kThreads, 1)
    copy_bulk(uint4 const* src, uint4* dst, unsigned const* perm, unsigned rows) {
  extern __shared__ __align__(128) unsigned char ring[];  // kSlots rows
  __shared__ __align__(8) unsigned long long full[kSlots], empty[kSlots];
  unsigned const claims = (rows + kClaimRows - 1) / kClaimRows;
  unsigned mine = 0;  // rows of this block
  for (unsigned claim = blockIdx.x; claim < claims; claim += gridDim.x)
    mine += min(kClaimRows, rows - claim * kClaimRows);
  auto global_row = [&](unsigned i) {
    return (blockIdx.x + (i / kClaimRows) * gridDim.x) * kClaimRows + i % kClaimRows;
  };
  if (threadIdx.x == 0) {
    for (unsigned q = 0; q < kSlots; ++q) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&full[q])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&empty[q])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto wait = [](unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem(bar)), "r"(parity)
          : "memory");
  };
  unsigned const warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (warp == 0) {
    if (lane == 0)
      for (unsigned i = 0; i < mine; ++i) {
        unsigned const q = i % kSlots;
        if (i >= kSlots) wait(&empty[q], ((i / kSlots) & 1u) ^ 1u);
        asm volatile(
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(&full[q])),
            "r"(kRowBytes)
            : "memory");
        uint4 const* from = src + std::size_t{perm[global_row(i)]} * kRowChunks;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(smem(ring + q * kRowBytes)),
            "l"(from), "r"(kRowBytes), "r"(smem(&full[q]))
            : "memory");
      }
  } else {
    for (unsigned i = warp - 1; i < mine; i += warps - 1) {
      unsigned const q = i % kSlots;
      wait(&full[q], (i / kSlots) & 1u);
      uint4 const* row = reinterpret_cast<uint4 const*>(ring + q * kRowBytes);
      uint4* const out = dst + std::size_t{global_row(i)} * kRowChunks;
#pragma unroll
      for (unsigned c = lane; c < kRowChunks; c += 32) st_global_v4(out + c, row[c]);
      __syncwarp();
      if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(&empty[q])) : "memory");
    }
  }
}

int main() {
  int devices = 0;
  CK(cudaGetDeviceCount(&devices));
  if (devices < 1) return std::printf("no GPU\n"), 1;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  unsigned const rows = 8192;
  std::size_t const bytes = std::size_t{rows} * kRowBytes;
  std::vector<unsigned> perm(rows);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<unsigned char> host(bytes), back(bytes);
  std::mt19937 rng(11);
  for (auto& b : host) b = static_cast<unsigned char>(rng());

  CK(cudaSetDevice(0));
  uint4 *src = nullptr, *local = nullptr, *peer = nullptr;
  unsigned* dperm = nullptr;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&local, bytes));
  CK(cudaMalloc(&dperm, rows * sizeof(unsigned)));
  CK(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dperm, perm.data(), rows * sizeof(unsigned), cudaMemcpyHostToDevice));
  int can = 0;
  if (devices > 1) CK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (can) {
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&peer, bytes));
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
  }
  unsigned const bulk_smem = kSlots * kRowBytes;
  CK(cudaFuncSetAttribute(copy_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, bulk_smem));
  std::printf("%s, %d SMs; %u rows of %u bytes (%.1f MB) read in a random order, %u rows a claim\n",
              prop.name, prop.multiProcessorCount, rows, kRowBytes, bytes / 1e6, kClaimRows);

  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  char const* names[] = {"threads16", "threads24", "bulk"};
  for (int target = 0; target < (peer ? 2 : 1); ++target) {
    uint4* dst = target == 0 ? local : peer;
    for (unsigned blocks : {1u, 4u, 8u, 16u, 24u, 32u, 64u, 132u}) {
      for (int v = 0; v < 3; ++v) {
        auto launch = [&] {
          if (v == 0) copy_threads<16><<<blocks, kThreads>>>(src, dst, dperm, rows);
          if (v == 1) copy_threads<24><<<blocks, kThreads>>>(src, dst, dperm, rows);
          if (v == 2) copy_bulk<<<blocks, kThreads, bulk_smem>>>(src, dst, dperm, rows);
        };
        CK(cudaMemset(dst, 0, bytes));
        launch();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (unsigned k = 0; k < rows && ok; ++k)
          ok = std::memcmp(back.data() + std::size_t{k} * kRowBytes,
                           host.data() + std::size_t{perm[k]} * kRowBytes, kRowBytes) == 0;
        std::vector<float> ms;
        for (int rep = 0; rep < 7; ++rep) {
          CK(cudaEventRecord(t0));
          launch();
          CK(cudaEventRecord(t1));
          CK(cudaEventSynchronize(t1));
          float m = 0;
          CK(cudaEventElapsedTime(&m, t0, t1));
          ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        double const gbs = bytes / (ms[3] * 1e-3) / 1e9;
        std::printf("%-6s %3u blocks %-10s %8.1f us  %7.1f GB/s  %6.1f GB/s a block  %s\n",
                    target == 0 ? "local" : "peer", blocks, names[v], ms[3] * 1e3, gbs,
                    gbs / blocks, ok ? "ok" : "WRONG");
      }
    }
  }
  return 0;
}
