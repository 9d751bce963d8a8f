// Owning device allocation (cudaMalloc), moved, never copied.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/check.hpp"

namespace loom {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count) LOOM_CUDA(cudaMalloc(&ptr_, count * sizeof(T)));
  }
  explicit DeviceBuffer(std::vector<T> const& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }

  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  // Copies `host` into the first host.size() elements.
  void upload(std::vector<T> const& host) {
    if (host.size() > count_)
      throw Error("loom: " + std::to_string(host.size()) + " elements to upload into a device " +
                  "buffer of " + std::to_string(count_));
    if (!host.empty())
      LOOM_CUDA(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_) LOOM_CUDA(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with `byte` (e.g. 0xFF to poison floats as NaN).
  void fill_bytes(int byte) {
    if (count_) LOOM_CUDA(cudaMemset(ptr_, byte, bytes()));
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace loom
