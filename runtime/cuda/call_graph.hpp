// A call's enqueueing kept as a CUDA graph, for callers that enqueue several things per call (the
// call's set-up kernel, the persistent launch, a copy) and often repeat the same call (the same
// pointers and sizes, new contents in the buffers): the first repeat captures the enqueueing
// once, and every later repeat launches the graph, one cudaGraphLaunch in place of several
// enqueues, so that the GPU starts on the call sooner and the host returns sooner. The caller
// decides what counts as a repeat and drops the graph when a call differs or fails.
#pragma once

#include <utility>

#include "runtime/cuda/check.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace loom {

class CallGraph {
 public:
  CallGraph() = default;
  CallGraph(CallGraph const&) = delete;
  CallGraph& operator=(CallGraph const&) = delete;
  CallGraph(CallGraph&& other) noexcept
      : exec_(std::exchange(other.exec_, nullptr)),
        stale_(other.stale_),
        device_(other.device_),
        own_(std::exchange(other.own_, nullptr)),
        own_device_(other.own_device_) {}
  ~CallGraph() {
    drop();
    if (own_) {
      ScopedDevice on(own_device_, std::nothrow);
      cudaStreamDestroy(own_);
    }
  }

  bool captured() const { return exec_ != nullptr; }

  // Captures `enqueue(on)` on stream `on` of the current device (nothing runs; `on` is not being
  // captured by anyone else), replacing the graph held. On failure nothing is held and the
  // error propagates.
  template <class Enqueue>
  void capture(cudaStream_t on, Enqueue&& enqueue) {
    drop();
    LOOM_CUDA(cudaStreamBeginCapture(on, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      enqueue(on);
    } catch (...) {
      cudaStreamEndCapture(on, &graph);  // the stream leaves capture mode either way
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    LOOM_CUDA(cudaStreamEndCapture(on, &graph));
    cudaError_t const made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) exec_ = nullptr;
    LOOM_CUDA(made);
    LOOM_CUDA(cudaGetDevice(&device_));
  }

  // The same on a stream of the graph's own (made on the first such capture): the caller's stream
  // may be the legacy default stream, which no capture takes.
  template <class Enqueue>
  void capture(Enqueue&& enqueue) {
    if (!own_) {
      LOOM_CUDA(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
      LOOM_CUDA(cudaGetDevice(&own_device_));
    }
    capture(own_, std::forward<Enqueue>(enqueue));
  }

  // One call on `stream`: `enqueue(stream)` itself when it does not repeat the call before (the
  // graph no longer serves) or when the caller is capturing `stream` (its capture takes the call
  // in, and the graph is left alone: a capture in global mode fails on other graph calls); else
  // the graph, captured on a stream of its own at the first repeat. True when it replayed.
  template <class Enqueue>
  bool run(bool repeat, cudaStream_t stream, Enqueue&& enqueue) {
    if (!repeat) stale_ = true;
    if (capturing(stream)) {
      enqueue(stream);
      return false;
    }
    if (stale_) drop();
    if (!repeat) {
      enqueue(stream);
      return false;
    }
    if (!captured()) capture(enqueue);
    launch(stream);
    return true;
  }

  // Enqueues the captured graph on `stream` (of the device it was captured on).
  void launch(cudaStream_t stream) const { LOOM_CUDA(cudaGraphLaunch(exec_, stream)); }

  void drop() noexcept {
    stale_ = false;
    if (!exec_) return;
    ScopedDevice on(device_, std::nothrow);
    cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }

  // Whether `stream` is being captured into a graph of the caller's own (then a call is enqueued
  // directly: the caller's capture takes it in).
  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    LOOM_CUDA(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
  bool stale_ = false;  // a call since the capture differed from it (dropped at the next chance)
  int device_ = 0;
  cudaStream_t own_ = nullptr;  // see capture(enqueue)
  int own_device_ = 0;
};

}  // namespace loom
