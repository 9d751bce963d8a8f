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

  // Copies the error record back (after the stream is synchronised).
  ErrorRecord read_error() const;
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
};

}  // namespace loom
