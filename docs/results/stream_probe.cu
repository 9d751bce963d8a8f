// Two questions about the first wave of a call's weight stream. One block per SM streams 1 MB
// slices of a 1.5 GB buffer (the MoE layer's up tiles stream 1 MB of weights each), all blocks
// starting together; medians of the first wave's slices, the second's and the rest.
// 1. Is the stream's first wave slow by itself? Back to back; after streaming 4 GB elsewhere
//    (another buffer's pages through the TLBs and L2); with one word of every 2 MB page (or of
//    every 64 KB) loaded by a kernel before.
// 2. What does code that no SM holds cost when every SM runs it at once? Each block runs N
//    distinct straight-line FFMAs (16 bytes of code each) before each slice; "code evicted
//    between" runs 192 KB of other code on every SM before each timed launch.
// nvcc -O3 -arch=sm_90a; results in docs/results/tile_probes_h200.txt, discussed in
// docs/performance.md ("What a tile's time is made of: three probes").
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

template <int N, int SALT>
__device__ __forceinline__ float body(float seed) {
  float x[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = seed + j;
#pragma unroll
  for (int i = 0; i < N; ++i) x[i % 8] = fmaf(x[i % 8], 1.0f + (i + 1 + SALT) * 1e-7f, (i + 1) * 1e-4f + SALT);
  float s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += x[j];
  return s;
}

// Slice s: stamps [3s] start, [3s + 1] after the code, [3s + 2] end.
template <int N, int SALT>
__global__ void __launch_bounds__(384, 1) stream(const uint4* buf, size_t slice_vecs, unsigned slices,
                                                  unsigned long long* stamps, unsigned* sink) {
  __shared__ unsigned long long t0, t1;
  unsigned acc = 0;
  float f = 0;
  for (unsigned s = blockIdx.x; s < slices; s += gridDim.x) {
    __syncthreads();
    if (threadIdx.x == 0) t0 = gtime();
    if (N > 0) f += body<N, SALT>(f + s);
    __syncthreads();
    if (threadIdx.x == 0) t1 = gtime();
    const uint4* p = buf + s * slice_vecs;
    for (size_t i = threadIdx.x; i < slice_vecs; i += 8 * blockDim.x) {
      uint4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) { size_t k = i + j * blockDim.x; v[j] = k < slice_vecs ? __ldcs(p + k) : make_uint4(0,0,0,0); }
#pragma unroll
      for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].w;
    }
    __syncthreads();
    if (threadIdx.x == 0) { stamps[3 * s] = t0; stamps[3 * s + 1] = t1; stamps[3 * s + 2] = gtime(); }
  }
  if (acc == 0x12345678u || f == 1.2345f) sink[0] = acc;
}

__global__ void touch(const unsigned char* buf, size_t bytes, size_t stride, unsigned* sink) {
  unsigned acc = 0;
  for (size_t o = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * stride; o < bytes;
       o += size_t(gridDim.x) * blockDim.x * stride)
    acc ^= __ldcg(reinterpret_cast<const unsigned*>(buf + o));
  if (acc == 0x12345678u) sink[0] = acc;
}

struct Buffers {
  unsigned char *w, *other;
  size_t wbytes, obytes;
  unsigned long long* st;
  unsigned* sink;
  int sms;
};
constexpr size_t kSlice = 1 << 20;
constexpr int kSmem = 200 << 10;  // one block per SM

double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// pre: bit 0 streams `other` first, bit 1 touches every 2 MB page of w, bit 2 every 64 KB;
// bit 3 runs 192 KB of other code on every SM.
template <int N, int SALT>
int run(const char* name, int pre, Buffers const& b) {
  unsigned const slices = b.wbytes / kSlice;
  CK(cudaFuncSetAttribute(stream<N, SALT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  std::vector<unsigned long long> h(slices * 3);
  for (int rep = 0; rep < 6; ++rep) {
    if (pre & 1) stream<0, 0><<<b.sms, 384, kSmem>>>((const uint4*)b.other, kSlice / 16, b.obytes / kSlice, b.st, b.sink);
    if (pre & 2) touch<<<1, 256>>>(b.w, b.wbytes, size_t(2) << 20, b.sink);
    if (pre & 4) touch<<<64, 256>>>(b.w, b.wbytes, size_t(64) << 10, b.sink);
    if (pre & 8) stream<12288, 7><<<b.sms, 384, kSmem>>>((const uint4*)b.w, kSlice / 16, b.sms, b.st, b.sink);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0);
    stream<N, SALT><<<b.sms, 384, kSmem>>>((const uint4*)b.w, kSlice / 16, slices, b.st, b.sink);
    cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    CK(cudaMemcpy(h.data(), b.st, slices * 24, cudaMemcpyDeviceToHost));
    if (rep < 3) continue;
    unsigned long long first = ~0ull; for (unsigned s = 0; s < slices; ++s) first = std::min(first, h[3 * s]);
    std::vector<double> c0, cl, w0, w1, wl; double end = 0;
    for (unsigned s = 0; s < slices; ++s) {
      double const c = (h[3 * s + 1] - h[3 * s]) * 1e-3, d = (h[3 * s + 2] - h[3 * s]) * 1e-3;
      end = std::max(end, (h[3 * s + 2] - first) * 1e-3);
      unsigned const wave = s / b.sms;
      (wave == 0 ? c0 : cl).push_back(c);
      (wave == 0 ? w0 : wave == 1 ? w1 : wl).push_back(d);
    }
    printf("%-34s rep %d: kernel %.1f us (span %.1f, %.2f TB/s); code part wave0 %.2f later %.2f us; "
           "slice wave0 %.1f wave1 %.1f later %.1f us\n", name, rep, ms * 1e3, end,
           b.wbytes / (end * 1e-6) / 1e12, med(c0), med(cl), med(w0), med(w1), med(wl));
  }
  return 0;
}

int main() {
  Buffers b{};
  CK(cudaDeviceGetAttribute(&b.sms, cudaDevAttrMultiProcessorCount, 0));
  b.wbytes = size_t(1536) << 20; b.obytes = size_t(4096) << 20;
  CK(cudaMalloc(&b.w, b.wbytes)); CK(cudaMalloc(&b.other, b.obytes)); CK(cudaMalloc(&b.sink, 64));
  CK(cudaMalloc(&b.st, b.wbytes / kSlice * 24));
  CK(cudaMemset(b.w, 1, b.wbytes)); CK(cudaMemset(b.other, 2, b.obytes));
  CK(cudaFuncSetAttribute(stream<0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(stream<12288, 7>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  printf("-- 1. the stream alone\n");
  run<0, 0>("back to back", 0, b);
  run<0, 0>("after streaming 4 GB elsewhere", 1, b);
  run<0, 0>("touch 2MB pages first", 2, b);
  run<0, 0>("stream 4 GB, touch 2MB pages", 3, b);
  run<0, 0>("stream 4 GB, touch 64KB", 5, b);
  printf("-- 2. code before each slice\n");
  run<1024, 1>("16 KB code", 0, b);
  run<4096, 2>("64 KB code", 0, b);
  run<1024, 4>("16 KB code, code evicted between", 8, b);
  run<4096, 3>("64 KB code, code evicted between", 8, b);
  run<12288, 5>("192 KB code, code evicted between", 8, b);
  return 0;
}
