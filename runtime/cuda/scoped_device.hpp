// Makes a CUDA device current for a scope and restores the caller's device afterwards, so code
// that drives several GPUs of one process leaves the current device as it found it.
#pragma once

#include <cstdio>
#include <new>
#include <vector>

#include "runtime/cuda/check.hpp"

namespace loom {

class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    LOOM_CUDA(cudaGetDevice(&previous_));
    if (device != previous_) LOOM_CUDA(cudaSetDevice(device));
  }
  // For teardown paths that must not throw: a failure is reported on stderr.
  ScopedDevice(int device, std::nothrow_t) noexcept {
    if (!report(cudaGetDevice(&previous_), "cudaGetDevice")) {
      previous_ = -1;
      return;
    }
    if (device != previous_) report(cudaSetDevice(device), "cudaSetDevice");
  }
  ~ScopedDevice() {
    if (previous_ >= 0) report(cudaSetDevice(previous_), "cudaSetDevice (restoring the device)");
  }
  ScopedDevice(ScopedDevice const&) = delete;
  ScopedDevice& operator=(ScopedDevice const&) = delete;

 private:
  static bool report(cudaError_t err, char const* call) noexcept {
    if (err == cudaSuccess) return true;
    std::fprintf(stderr, "loom: %s failed: %s\n", call, cudaGetErrorString(err));
    return false;
  }
  int previous_ = -1;
};

// Waits for every device of `devices` to finish its work (cudaDeviceSynchronize on each in turn),
// leaving the current device as it was.
inline void synchronize_devices(std::vector<int> const& devices) {
  for (int d : devices) {
    ScopedDevice on(d);
    LOOM_CUDA(cudaDeviceSynchronize());
  }
}

}  // namespace loom
