// Programmatic dependent launch against back-to-back launches of the persistent kernel's shape
// (132 blocks of 384 threads, 208 KB of dynamic shared memory). nvcc -O2 -arch=sm_90a; results in
// docs/results/pdl_probe_h200.txt, discussed in docs/performance.md ("Programmatic dependent launch").
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

__device__ unsigned long long sink;
__global__ void wide(int spin_ns, int pdl) {
  extern __shared__ char smem[];
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long t = t0;
  while (t - t0 < (unsigned long long)spin_ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0) smem[blockIdx.x % 1024] = 1;
  if (threadIdx.x == 0 && blockIdx.x == 0) sink += smem[0];
}
__global__ void small(int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) sink += 1;
}

int launch(cudaStream_t s, int grid, int smem, int spin, bool coop, bool pdl) {
  cudaLaunchConfig_t c{}; c.gridDim = grid; c.blockDim = 384; c.dynamicSmemBytes = smem; c.stream = s;
  cudaLaunchAttribute a[2]; int n = 0;
  if (coop) { a[n].id = cudaLaunchAttributeCooperative; a[n].val.cooperative = 1; ++n; }
  if (pdl) { a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
  c.attrs = a; c.numAttrs = n;
  CK(cudaLaunchKernelEx(&c, wide, spin, (int)pdl));
  return 0;
}
int launch_small(cudaStream_t s, bool pdl) {
  cudaLaunchConfig_t c{}; c.gridDim = 1; c.blockDim = 32; c.stream = s;
  cudaLaunchAttribute a[1]; int n = 0;
  if (pdl) { a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
  c.attrs = a; c.numAttrs = n;
  CK(cudaLaunchKernelEx(&c, small, (int)pdl));
  return 0;
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int smem = 208 * 1024;
  CK(cudaFuncSetAttribute(wide, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int N = 200;
  for (int spin : {0, 5000}) for (int pair : {0, 1}) for (int coop : {1, 0}) for (int pdl : {0, 1}) {
    std::vector<float> v;
    for (int rep = 0; rep < 7; ++rep) {
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < N; ++i) {
        if (pair && launch_small(s, pdl)) return 1;
        if (launch(s, sms, smem, spin, coop, pdl)) return 1;
      }
      CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1); v.push_back(ms * 1000 / N);
    }
    std::sort(v.begin(), v.end());
    printf("spin=%d ns pair=%d coop=%d pdl=%d: %.2f us per launch (min %.2f)\n", spin, pair, coop, pdl, v[3], v[0]);
  }
  CK(cudaGetLastError());
  return 0;
}
