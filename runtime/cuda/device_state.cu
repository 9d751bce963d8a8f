#include <algorithm>

#include "runtime/cuda/device_state.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace loom {

void throw_cuda_error(cudaError_t err, char const* call, char const* file, int line) {
  throw Error(std::string("loom: CUDA error ") + cudaGetErrorName(err) + " (" +
              cudaGetErrorString(err) + ") in " + call + " at " + file + ":" +
              std::to_string(line));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

namespace {
int current_device() {
  int device = 0;
  LOOM_CUDA(cudaGetDevice(&device));
  return device;
}
}  // namespace

DeviceState::DeviceState(Graph graph, StateOptions const& options)
    : device_(current_device()),
      graph_(std::move(graph)),
      layout_(graph_, options),
      image_(layout_.bytes()),
      arena_(layout_.bytes()) {
  layout_.initialize(image_.data());
  state_ = layout_.bind(arena_.get());
  LOOM_CUDA(cudaMemcpy(arena_.get(), image_.data(), image_.size(), cudaMemcpyHostToDevice));
  ErrorRecord* host = nullptr;
  LOOM_CUDA(cudaMallocHost(&host, sizeof(ErrorRecord)));
  error_host_.reset(host);
}

void DeviceState::reinitialize_after_failure() {
  reinitialize(read_epoch() + 1);
}

void DeviceState::reinitialize(std::uint64_t epoch) {
  ScopedDevice on(device_);
  layout_.initialize(image_.data(), epoch);
  LOOM_CUDA(cudaMemcpy(arena_.get(), image_.data(), image_.size(), cudaMemcpyHostToDevice));
  error_copied_ = false;
}

void DeviceState::copy_error_after(cudaStream_t stream) {
  ScopedDevice on(device_);
  error_copied_ = false;
  LOOM_CUDA(cudaMemcpyAsync(error_host_.get(), arena_.get() + layout_.error_offset(),
                            sizeof(ErrorRecord), cudaMemcpyDeviceToHost, stream));
  error_copied_ = true;
  error_stream_ = stream;
}

ErrorRecord DeviceState::read_error(cudaStream_t waited) const {
  if (error_copied_ && error_stream_ == waited) return *error_host_;
  ScopedDevice on(device_);
  ErrorRecord e{};
  LOOM_CUDA(
      cudaMemcpy(&e, arena_.get() + layout_.error_offset(), sizeof(e), cudaMemcpyDeviceToHost));
  return e;
}

ErrorRecord DeviceState::peek_error() const {
  ScopedDevice on(device_);
  if (!peek_stream_) {
    cudaStream_t side = nullptr;
    LOOM_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    peek_stream_.reset(side);
  }
  ErrorRecord e{};
  LOOM_CUDA(cudaMemcpyAsync(&e, arena_.get() + layout_.error_offset(), sizeof(e),
                            cudaMemcpyDeviceToHost, peek_stream_.get()));
  LOOM_CUDA(cudaStreamSynchronize(peek_stream_.get()));
  return e;
}

std::uint64_t DeviceState::read_epoch() const {
  ScopedDevice on(device_);
  std::uint64_t epoch = 0;
  LOOM_CUDA(cudaMemcpy(&epoch, arena_.get() + layout_.counters_offset(), sizeof(epoch),
                       cudaMemcpyDeviceToHost));
  return epoch;
}

std::vector<TraceRecord> DeviceState::take_trace() {
  ScopedDevice on(device_);
  std::vector<TraceRecord> out;
  if (layout_.trace_capacity() == 0) return out;
  std::uint64_t count = 0;
  LOOM_CUDA(cudaMemcpy(&count, arena_.get() + layout_.trace_count_offset(), sizeof(count),
                       cudaMemcpyDeviceToHost));
  out.resize(std::min<std::uint64_t>(count, layout_.trace_capacity()));
  if (!out.empty())
    LOOM_CUDA(cudaMemcpy(out.data(), arena_.get() + layout_.trace_offset(),
                         out.size() * sizeof(TraceRecord), cudaMemcpyDeviceToHost));
  LOOM_CUDA(cudaMemset(arena_.get() + layout_.trace_count_offset(), 0, sizeof(count)));
  return out;
}

}  // namespace loom
