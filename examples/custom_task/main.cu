// custom_task: a task type defined outside the runtime (RowSoftmax, in row_softmax.hpp) run by the
// runtime unchanged. Builds a graph of RowSoftmax tasks, one per block of rows of a random matrix,
// runs it on the CPU executor (and on the GPU where that backend is built and a device is present),
// and compares with a float64 softmax.
//
// Exit status: 0 when every backend run is within 1e-5 relative error, 1 otherwise, 2 on a
// runtime error.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "examples/custom_task/row_softmax.hpp"
#include "runtime/runtime.hpp"
#if __has_include("runtime/cuda/gpu_executor.cuh")
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#endif

namespace {

using loom::examples::RowSoftmax;
// The one line that registers the new type: its place in the program's pipeline.
using SoftmaxPipeline = loom::Pipeline<RowSoftmax>;

constexpr std::uint32_t kRows = 1000, kCols = 777, kRowsPerTask = 16;
constexpr double kTolerance = 1e-5;

// One independent task per block of kRowsPerTask rows (the last one clipped).
loom::Graph build_softmax_graph(float const* in, float* out) {
  loom::GraphBuilder builder;
  loom::TileGrid const blocks{kRows, kCols, kRowsPerTask, kCols};
  blocks.for_each([&](loom::Tile const& t) {
    RowSoftmax::Payload const p{in + std::size_t{t.row0} * kCols,
                                out + std::size_t{t.row0} * kCols,
                                t.rows,
                                kCols,
                                kCols,
                                kCols};
    builder.add_task(SoftmaxPipeline::make<RowSoftmax>(p, loom::kNoEvent, t.row_tile));
  });
  return builder.build();
}

std::vector<double> reference_softmax(std::vector<float> const& in) {
  std::vector<double> out(in.size());
  for (std::uint32_t r = 0; r < kRows; ++r) {
    float const* x = in.data() + std::size_t{r} * kCols;
    double* y = out.data() + std::size_t{r} * kCols;
    double max = x[0];
    for (std::uint32_t c = 1; c < kCols; ++c) max = std::fmax(max, double(x[c]));
    double sum = 0.0;
    for (std::uint32_t c = 0; c < kCols; ++c) sum += (y[c] = std::exp(double(x[c]) - max));
    for (std::uint32_t c = 0; c < kCols; ++c) y[c] /= sum;
  }
  return out;
}

double relative_error(std::vector<float> const& out, std::vector<double> const& ref) {
  double diff2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff2 += (out[i] - ref[i]) * (out[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  return std::sqrt(diff2 / ref2);
}

std::vector<float> run_on_cpu(std::vector<float> const& in) {
  std::vector<float> out(in.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<loom::Graph> graphs;
  graphs.push_back(build_softmax_graph(in.data(), out.data()));
  loom::CpuExecutor<SoftmaxPipeline> executor(std::move(graphs), loom::CpuOptions{});
  executor.run();
  return out;
}

#if __has_include("runtime/cuda/gpu_executor.cuh")
bool gpu_available() {
  return loom::cuda_device_count() > 0;
}

// The same graph over device buffers, one launch of the persistent kernel.
std::vector<float> run_on_gpu(std::vector<float> const& in) {
  loom::DeviceBuffer<float> const in_device(in);
  loom::DeviceBuffer<float> out_device(in.size());
  out_device.fill_bytes(0xFF);  // NaN: a row that is never written shows in the error
  loom::GpuExecutor<SoftmaxPipeline> executor(
      build_softmax_graph(in_device.get(), out_device.get()));
  executor.run();
  return out_device.download();
}
#else
bool gpu_available() {
  return false;
}

std::vector<float> run_on_gpu(std::vector<float> const&) {
  throw loom::Error("GPU backend not built");
}
#endif

bool report(char const* backend, std::vector<float> const& out, std::vector<double> const& ref) {
  double const error = relative_error(out, ref);
  bool const ok = error < kTolerance;
  std::printf("custom_task row_softmax %ux%u on %s: relative error %.3e (%s)\n", kRows, kCols,
              backend, error, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  try {
    // Logits spread over [-30, 30]: a naive exp(x) / sum would lose precision; the max shift
    // keeps every exponent <= 0.
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
    std::vector<float> in(std::size_t{kRows} * kCols);
    for (float& v : in) v = dist(rng);
    std::vector<double> const ref = reference_softmax(in);

    bool ok = report("cpu", run_on_cpu(in), ref);
    if (gpu_available()) ok = report("cuda", run_on_gpu(in), ref) && ok;
    return ok ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "custom_task: %s\n", e.what());
    return 2;
  }
}
