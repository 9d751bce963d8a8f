// Checked cuBLAS calls and an owned handle, for the cuBLAS pipelines that benchmarks, examples
// and the MoE CLI run beside the runtime (baselines and measured ceilings).
#pragma once

#include <cublas_v2.h>

#include <string>

#include "runtime/error.hpp"

namespace loom {

// Throws a loom::Error naming `what` when a cuBLAS call failed.
inline void check_cublas(cublasStatus_t status, char const* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("loom: ") + what + " failed (cuBLAS status " +
                std::to_string(static_cast<int>(status)) + ")");
}

// One cuBLAS handle, destroyed with its owner.
class CublasHandle {
 public:
  CublasHandle() { check_cublas(cublasCreate(&handle_), "cublasCreate"); }
  CublasHandle(CublasHandle const&) = delete;
  CublasHandle& operator=(CublasHandle const&) = delete;
  ~CublasHandle() { cublasDestroy(handle_); }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace loom
