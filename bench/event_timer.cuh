// Times a region of a stream with a pair of CUDA events: start() before it, stop_seconds() after
// (which waits for the stop event). One timer per benchmark loop.
#pragma once

#include "runtime/cuda/check.hpp"

namespace loom::bench {

class EventTimer {
 public:
  EventTimer() {
    LOOM_CUDA(cudaEventCreate(&start_));
    LOOM_CUDA(cudaEventCreate(&stop_));
  }
  EventTimer(EventTimer const&) = delete;
  EventTimer& operator=(EventTimer const&) = delete;
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start(cudaStream_t s) { LOOM_CUDA(cudaEventRecord(start_, s)); }
  double stop_seconds(cudaStream_t s) {
    LOOM_CUDA(cudaEventRecord(stop_, s));
    LOOM_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    LOOM_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_, stop_;
};

}  // namespace loom::bench
