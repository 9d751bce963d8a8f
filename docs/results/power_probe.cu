// Does a GEMM run faster under the power limit when part of A is zero? The MoE layer's expert
// tiles multiply the rows past an M-tile's valid ones too (their results are dropped): at
// T = 4096 about a fifth of the up tiles' rows, holding whatever the pool has there. cuBLAS
// 8192^3 (bf16 in, fp32 compute, bf16 out) runs back to back for about 0.7 s with A random, with
// the last 8, 23 or 40 of every 128 rows of A zero (6%, 18%, 31%), and with A all zero (B random
// throughout; three rounds, the order reversed every other round); per-call
// times by CUDA events, median of the first 10 calls (boost clocks) and of the last 100
// (sustained). nvcc -O3 -std=c++17 -arch=sm_90a -o power_probe power_probe.cu -lcublas
// (results: docs/results/power_probe_h100.txt).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                     \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace {

constexpr int kN = 8192;

// Random bf16 in [-1, 1), row r of a row-major [kN][kN] matrix zero where zero_row(r).
__global__ void fill(__nv_bfloat16* m, unsigned seed, int zero_from, int zero_every) {
  std::size_t const i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (i >= std::size_t{kN} * kN) return;
  unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
  x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
  int const row = static_cast<int>(i / kN);
  bool const zero = zero_every != 0 && row % zero_every >= zero_from;
  m[i] = __float2bfloat16(zero ? 0.f : (x & 0xffff) / 32768.f - 1.f);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(cublasHandle_t h, __nv_bfloat16 const* a, __nv_bfloat16 const* b, __nv_bfloat16* c,
         char const* name) {
  float const one = 1.f, zero = 0.f;
  int const calls = 500;
  std::vector<cudaEvent_t> ev(calls + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < calls; ++i) {
    // C[n][m] = sum_k B[n][k] A[m][k]: A's rows are the output's rows (TN, as the layer's tiles).
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kN, kN, kN, &one, b, CUDA_R_16BF, kN, a, CUDA_R_16BF,
                 kN, &zero, c, CUDA_R_16BF, kN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CK(cudaEventRecord(ev[i + 1]));
  }
  CK(cudaEventSynchronize(ev[calls]));
  std::vector<float> first, last;
  for (int i = 0; i < calls; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
    (i < 10 ? first : last).push_back(ms);
  }
  last.erase(last.begin(), last.end() - 100);
  double const flop = 2.0 * kN * kN * kN;
  std::printf("%-34s first 10: %.3f ms (%.0f TFLOP/s); last 100: %.3f ms (%.0f TFLOP/s)\n", name,
              median(first), flop / (median(first) * 1e-3) / 1e12, median(last),
              flop / (median(last) * 1e-3) / 1e12);
  for (auto& e : ev) CK(cudaEventDestroy(e));
}

}  // namespace

int main() {
  __nv_bfloat16 *a, *b, *c;
  std::size_t const n = std::size_t{kN} * kN;
  CK(cudaMalloc(&a, n * 2));
  CK(cudaMalloc(&b, n * 2));
  CK(cudaMalloc(&c, n * 2));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  unsigned const blocks = static_cast<unsigned>((n + 255) / 256);
  fill<<<blocks, 256>>>(b, 17u, 0, 0);
  struct Form {
    int zero_from, zero_every;
    char const* name;
  };
  Form const forms[] = {{0, 0, "A random"},
                        {120, 128, "A: rows 120..127 of 128 zero"},
                        {105, 128, "A: rows 105..127 of 128 zero"},
                        {88, 128, "A: rows 88..127 of 128 zero"},
                        {0, 1, "A zero"}};
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 5; ++i) {
      Form const& f = forms[round % 2 == 0 ? i : 4 - i];  // alternate the order
      fill<<<blocks, 256>>>(a, 5u, f.zero_from, f.zero_every);
      run(h, a, b, c, f.name);
    }
  CK(cudaGetLastError());
  cublasDestroy(h);
  return 0;
}
