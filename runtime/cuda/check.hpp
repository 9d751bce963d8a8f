// Checked CUDA calls: every runtime call goes through LOOM_CUDA, which turns a failure into a
// loom::Error naming the call and where it was made.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "runtime/error.hpp"

namespace loom {

[[noreturn]] void throw_cuda_error(cudaError_t err, char const* call, char const* file, int line);

// Number of CUDA devices; 0 where there is no driver or no GPU (never throws).
int cuda_device_count();

}  // namespace loom

#define LOOM_CUDA(call)                                                                           \
  do {                                                                                            \
    cudaError_t const loom_err_ = (call);                                                         \
    if (loom_err_ != cudaSuccess) ::loom::throw_cuda_error(loom_err_, #call, __FILE__, __LINE__); \
  } while (0)
