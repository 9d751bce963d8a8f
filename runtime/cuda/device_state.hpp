// Device-side copy of one rank's RuntimeState: the arena in device memory, uploaded once from
// the host image; afterwards only the kernel writes it (epochs), except after an error, when the
// host uploads the initial image again. The arena lives on the device current at construction;
// every method works on that device whatever the caller's current device is (one process may
// drive several GPUs).
#pragma once

#include <memory>
#include <vector>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/state_image.hpp"

namespace loom {

class DeviceState {
 public:
  DeviceState(Graph graph, StateOptions const& options);
  RuntimeState const& state() const { return state_; }

  // A launch is about to be enqueued: an earlier launch's pinned copy no longer stands for it.
  void launched() { error_copied_ = false; }
  // Enqueues the error record's copy into pinned host memory on `stream`, behind the launch just
  // enqueued there; read_error(stream) then reads it without a copy (and a wait) of its own.
  void copy_error_after(cudaStream_t stream);
  // The error record, once `waited` (a stream the caller synchronised) has ended: the pinned copy
  // when the last launch's copy went on `waited`, else copied back now.
  ErrorRecord read_error(cudaStream_t waited) const;
  // The same while a launch may still run: copied on a non-blocking stream of its own (made on
  // the first peek, kept for the next), which waits for nothing the launch's stream holds.
  ErrorRecord peek_error() const;
  // After a failed launch: re-uploads the initial image for the launch after it (epochs keep
  // growing, see StateLayout::initialize).
  void reinitialize_after_failure();
  // The same, for launch number `epoch` (ranks that failed together restart at one epoch).
  void reinitialize(std::uint64_t epoch);
  std::uint64_t read_epoch() const;
  std::vector<TraceRecord> take_trace();
  int device() const { return device_; }

 private:
  int device_ = 0;
  Graph graph_;
  StateLayout layout_;
  std::vector<unsigned char> image_;
  DeviceBuffer<unsigned char> arena_;
  RuntimeState state_;
  struct StreamDeleter {
    void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
  };
  mutable std::unique_ptr<CUstream_st, StreamDeleter> peek_stream_;
  struct HostDeleter {
    void operator()(ErrorRecord* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<ErrorRecord, HostDeleter> error_host_;  // pinned, written by copy_error_after
  bool error_copied_ = false;
  cudaStream_t error_stream_ = nullptr;  // where that copy went
};

}  // namespace loom
