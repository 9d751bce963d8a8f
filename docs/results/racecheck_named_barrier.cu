// Built with nvcc -O3 -arch=sm_90a; run under compute-sanitizer --tool racecheck --racecheck-report analysis
// (docs/verification.md, "compute-sanitizer on the MoE and runtime suites").
// Does racecheck report the persistent kernel's processor-loop pattern? Thread 0 writes a word,
// a block barrier, every thread reads it, a block barrier, then (variant) warps 0-1 meet at
// named barrier 1 (64 threads) while the others go on to the next block barrier.
#include <cstdio>
__device__ unsigned sink;
template <int kNamed>
__global__ void loop(int iters) {
  __shared__ unsigned word;
  unsigned acc = 0;
  for (int i = 0; i < iters; ++i) {
    if (threadIdx.x == 0) word = i;
    __syncwarp();
    __syncthreads();
    acc += word;
    __syncwarp();
    __syncthreads();
    if (kNamed && threadIdx.x < 64) {
      __syncwarp();
      asm volatile("bar.sync 1, 64;" ::: "memory");
    }
  }
  if (acc == 12345) sink = acc;
}
int main() {
  loop<0><<<2, 384>>>(100);
  cudaDeviceSynchronize();
  printf("plain done\n");
  loop<1><<<2, 384>>>(100);
  cudaDeviceSynchronize();
  printf("named done: %s\n", cudaGetErrorString(cudaGetLastError()));
}
