// CUDA events owned by an object, and the timer that benchmarks, examples and the MoE CLI time
// stream regions with. Events belong to the device that was current when they were made.
#pragma once

#include "runtime/cuda/check.hpp"

namespace loom {

// One CUDA event, destroyed with its owner.
class CudaEvent {
 public:
  explicit CudaEvent(unsigned flags = cudaEventDefault) {
    LOOM_CUDA(cudaEventCreateWithFlags(&event_, flags));
  }
  CudaEvent(CudaEvent const&) = delete;
  CudaEvent& operator=(CudaEvent const&) = delete;
  ~CudaEvent() { cudaEventDestroy(event_); }

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream = nullptr) { LOOM_CUDA(cudaEventRecord(event_, stream)); }
  void synchronize() const { LOOM_CUDA(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

// Times a region of a stream: start() before it, stop() after it, then seconds(), which waits
// for the stop. stop_seconds() is the last two together.
class EventTimer {
 public:
  void start(cudaStream_t stream = nullptr) { start_.record(stream); }
  void stop(cudaStream_t stream = nullptr) { stop_.record(stream); }
  double seconds() const {
    stop_.synchronize();
    float ms = 0.0f;
    LOOM_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
    return ms * 1e-3;
  }
  double stop_seconds(cudaStream_t stream = nullptr) {
    stop(stream);
    return seconds();
  }

 private:
  CudaEvent start_, stop_;
};

}  // namespace loom
