#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "moe/cli/floor.hpp"
#include "runtime/cuda/cublas.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/event.hpp"

namespace loom::moe {

namespace {

// The median time of `fn` over ten calls, or over the second half of the calls made in at least
// `sustain_seconds` (ten at least).
template <class Fn>
double median_seconds(double sustain_seconds, Fn&& fn) {
  EventTimer timer;
  fn();  // warm-up
  std::vector<double> t;
  auto const start = std::chrono::steady_clock::now();
  auto const elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (t.size() < 10 || elapsed() < sustain_seconds) {
    timer.start();
    fn();
    t.push_back(timer.stop_seconds());
  }
  if (sustain_seconds > 0) t.erase(t.begin(), t.begin() + t.size() / 2);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

Ceilings measure_ceilings(double sustain_seconds) {
  Ceilings c;
  // Bandwidth: 1 GiB copied device to device; counts bytes read plus written.
  std::size_t const bytes = std::size_t{1} << 30;
  DeviceBuffer<unsigned char> src(bytes), dst(bytes);
  src.fill_bytes(1);
  double const copy_s = median_seconds(sustain_seconds, [&] {
    LOOM_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice));
  });
  c.memory_bytes_per_s = 2.0 * bytes / copy_s;

  // Tensor throughput: an 8192^3 bf16 product with fp32 accumulation, on random-ish data.
  int const n = 8192;
  std::vector<__nv_bfloat16> host(std::size_t{n} * n);
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
  DeviceBuffer<__nv_bfloat16> a(host), b(host), out(std::size_t{n} * n);
  CublasHandle const cublas;
  cublasHandle_t const handle = cublas.get();
  float const one = 1.0f, zero = 0.0f;
  double const gemm_s = median_seconds(sustain_seconds, [&] {
    check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.get(), CUDA_R_16BF,
                              n, b.get(), CUDA_R_16BF, n, &zero, out.get(), CUDA_R_16BF, n,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  });
  c.tensor_flops_per_s = 2.0 * n * n * double(n) / gemm_s;
  return c;
}

}  // namespace loom::moe
