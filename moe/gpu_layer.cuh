// The MoE layer on one GPU: one persistent-kernel launch per call. Inputs, outputs and weights in
// device memory. forward() is asynchronous and capturable in a CUDA graph: the per-call words
// (token count, pointers, whether routing was given) are set by a small kernel on the same
// stream, so nothing is read on the host inside a call. A call with the same arguments as the one
// before (pointers and token count; the stream may differ) replays a CUDA graph of that kernel
// and the launch, captured at the first repeat (unless the stream is being captured already).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "moe/layer_buffers.cuh"
#include "moe/pipeline.hpp"
#include "moe/weights.hpp"
#include "runtime/cuda/call_graph.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "tasks/gemm/device_gemm.hpp"

namespace loom::moe {

class GpuMoELayer {
 public:
  // `path`: the expert GEMMs' tensor-core instruction (mma_sync is the portable fallback).
  GpuMoELayer(MoEConfig const& config, MoEWeights const& weights, GpuOptions options = {},
              tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma);

  MoEConfig const& config() const { return config_; }

  // x [tokens][H] -> out [tokens][H], device pointers, fused router. x is read 16 bytes at a time:
  // it must be 16-byte aligned (forward throws otherwise).
  void forward(bf16 const* x, std::uint32_t tokens, bf16* out, cudaStream_t stream = nullptr);
  // With the caller's routing (device pointers, [tokens][k]): ids -1 = no expert. Ids out of range
  // or repeated in a row and non-finite weights end the call with loom::Error at check().
  void forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids, float const* weights,
               bf16* out, cudaStream_t stream = nullptr);

  // Waits for the stream; raises the call's error, if any (the layer is then ready again).
  void check(cudaStream_t stream = nullptr);

  // Of the last call (synchronises): tokens per expert, and the routing used.
  std::vector<std::uint32_t> expert_tokens() const;
  std::vector<std::int32_t> topk_ids() const;
  std::vector<float> topk_weights() const;
  // Rows per expert M-tile in a call of `tokens` tokens (the plan picks the view), and the
  // M-tiles of the last call (synchronises).
  std::uint32_t mtile_rows(std::uint32_t tokens) const;
  std::uint32_t mtiles() const;

  GpuExecutor<MoEPipeline>& executor() { return *executor_; }
  // Calls that replayed the captured graph.
  std::uint64_t replayed_calls() const { return replayed_; }

 private:
  // A call's arguments; ids and weights are null with the fused router.
  struct Call {
    bf16 const* x;
    std::uint32_t tokens;
    std::int32_t const* ids;
    float const* weights;
    bf16* out;
    bool operator==(Call const& o) const {
      return x == o.x && tokens == o.tokens && ids == o.ids && weights == o.weights && out == o.out;
    }
  };
  // One call: its words (and the given routing, unless ids is null), then the launch; or the
  // graph of them when the call repeats the one before.
  void launch(Call const& call, cudaStream_t stream);
  void enqueue(Call const& call, cudaStream_t stream);
  void lower_counters();

  struct Gemms {
    std::unique_ptr<tasks::gemm::DeviceGemm> up, down;
  };

  MoEConfig config_;
  LayerShapes shapes_;
  LayerBuffers buf_;
  DeviceBuffer<std::uint32_t> block_done_;
  DeviceBuffer<bf16> y_;
  Gemms gemms_, short_gemms_;
  DeviceBuffer<MoEView> short_view_, view_;
  std::unique_ptr<GpuExecutor<MoEPipeline>> executor_;
  std::uint32_t last_tokens_ = 0;
  std::optional<Call> last_;  // the last call's arguments (none after a failure)
  CallGraph graph_;           // of last_, once it repeated
  std::uint64_t replayed_ = 0;
};

}  // namespace loom::moe
