// The expert-parallel MoE layer on GPUs: one persistent-kernel launch per rank per call, the
// ranks talking through NCCL symmetric windows (runtime/cuda/nccl_heap.hpp) by loads and stores
// over NVLink. GpuEpMoERank is one rank (one GPU, any process); GpuEpMoEGroup drives every GPU of
// one process. Calls are asynchronous and capturable in CUDA graphs (per rank).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "moe/ep_cpu_layer.hpp"  // EpRankCall
#include "moe/ep_pipeline.hpp"
#include "moe/layer_buffers.cuh"
#include "moe/weights.hpp"
#include "runtime/cuda/call_graph.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/gpu_executor.cuh"
#include "runtime/cuda/nccl_heap.hpp"
#include "tasks/gemm/device_gemm.hpp"

namespace loom::moe {

// Bytes of the symmetric window each rank needs.
std::uint64_t ep_heap_bytes(MoEConfig const& config, std::uint32_t world);

class GpuEpMoERank {
 public:
  // `heap`: this rank's symmetric window (at least ep_heap_bytes), zeroed, on the current device
  // (or options.device). `silent` is a test hook: this rank never sends anything.
  GpuEpMoERank(MoEConfig const& config, MoEWeights const& weights, SymmetricView heap,
               GpuOptions options = {}, tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma,
               bool silent = false);

  MoEConfig const& config() const { return config_; }
  std::uint32_t rank() const { return shape_.rank; }
  int device() const { return device_; }

  // Enqueues this rank's launch for one call (device pointers in `call`); no host sync. Every
  // rank of the world must launch for the same call. The same as prepare() then start(); a call
  // with the same arguments as this rank's call before (pointers and token count) replays a CUDA
  // graph of those two, captured at the first repeat (unless `stream` is being captured).
  void launch(EpRankCall const& call, cudaStream_t stream);
  // The two halves of launch, for a process driving several ranks: prepare() checks the call
  // and enqueues its routing copies and parameters; start() enqueues the persistent launch.
  // Preparing every rank before starting any keeps the ranks' launches close together (each
  // waits for the others' counts messages), and a bad call on one rank launches none.
  void prepare(EpRankCall const& call, cudaStream_t stream);
  void start(cudaStream_t stream);
  // Throws loom::Error naming the rank if `call` is not one it can run (prepare's checks).
  void check_call(EpRankCall const& call) const;
  // For a process driving several ranks (GpuEpMoEGroup::forward), whose calls repeat: capture()
  // keeps a CUDA graph of prepare(call), start() and the error record's copy, captured on
  // `stream` unless one is held (every rank's is captured before any is launched); replay()
  // enqueues it in place of them; drop_graph() lets it go (a call that differs, a failure).
  void capture(EpRankCall const& call, cudaStream_t stream);
  void replay(EpRankCall const& call, cudaStream_t stream);
  void drop_graph() { graph_.drop(); }
  // Waits for `stream`; returns the launch's error ("" if none), leaving the state as it is.
  std::string failure(cudaStream_t stream);
  // After a failed call on any rank: the next launch is number `epoch` with every counter
  // lowered (the caller zeroes the symmetric window, with no peer writing it).
  void restart_at(std::uint64_t epoch);
  std::uint64_t epoch() const { return executor_->epoch(); }
  // Calls of launch() that replayed its graph.
  std::uint64_t replayed_calls() const { return replayed_; }

  // Of the last call (synchronises): tokens of this rank per expert (all E), rows each local
  // expert computed (from all ranks), the routing used.
  std::vector<std::uint32_t> expert_tokens() const;
  std::vector<std::uint32_t> local_expert_rows() const;
  std::vector<std::int32_t> topk_ids() const;
  std::vector<float> topk_weights() const;

  GpuExecutor<EpPipeline, EpDecoder>& executor() { return *executor_; }

 private:
  void check_not_stuck() const;

  MoEConfig config_;
  int device_;
  EpView shape_;
  std::unique_ptr<LayerBuffers> buf_;  // allocated on device_
  DeviceBuffer<std::uint32_t> row_rank_, row_group_, local_tokens_, combine_list_;
  DeviceBuffer<std::uint32_t> group_rows_, group_pairs_, group_size_, group_tokens_;
  DeviceBuffer<std::uint64_t> last_sent_;
  DeviceBuffer<std::uint32_t> bin_rows_, bin_tokens_, send_next_, sends_done_;  // see EpView
  struct Gemms {
    std::unique_ptr<tasks::gemm::DeviceGemm> up, down;
  };
  // The local view's operands; the 64-row ones of an expert's last M-tile and the short view
  // that holds them (none where the tiles are short already: EpGemms::has_short).
  Gemms gemms_, short_gemms_;
  DeviceBuffer<MoEView> short_view_;
  DeviceBuffer<EpView> view_;
  std::unique_ptr<GpuExecutor<EpPipeline, EpDecoder>> executor_;
  std::uint32_t last_tokens_ = 0;
  std::optional<EpRankCall> last_launch_;  // launch()'s last call (none after a failure)
  CallGraph graph_;  // of last_launch_ once it repeated, or of the group's call (capture)
  std::uint64_t replayed_ = 0;
};

// Every rank on the GPUs of this process: communicators from ncclCommInitAll, one symmetric
// window per GPU, one GpuEpMoERank and one stream per GPU.
class GpuEpMoEGroup {
 public:
  GpuEpMoEGroup(MoEConfig const& config, MoEWeights const& weights, std::vector<int> const& devices,
                GpuOptions options = {}, int silent_rank = -1);
  ~GpuEpMoEGroup();

  std::uint32_t world() const { return static_cast<std::uint32_t>(ranks_.size()); }
  GpuEpMoERank& rank(std::uint32_t r) { return *ranks_.at(r); }
  cudaStream_t stream(std::uint32_t r) const { return streams_.at(r); }

  // Enqueues one call on every rank, each on its stream; no host sync. A call with the same
  // arguments as the one before (pointers and token counts on every rank) replays per-rank CUDA
  // graphs of its enqueueing, captured at the first repeat: one cudaGraphLaunch per GPU in place
  // of three enqueues, so that the last GPU starts sooner (every rank waits for the others'
  // counts messages).
  void forward(std::vector<EpRankCall> const& calls);
  // Waits for every rank; throws loom::Error with each failing rank's message, after which
  // every rank is ready for the next call.
  void check();
  // Calls that replayed captured graphs.
  std::uint64_t replayed_calls() const { return replayed_; }

 private:
  void drop_graphs();

  std::vector<NcclCommunicator> comms_;
  std::unique_ptr<NcclSymmetricHeapSet> heaps_;
  std::vector<std::unique_ptr<GpuEpMoERank>> ranks_;
  std::vector<cudaStream_t> streams_;
  std::vector<EpRankCall> last_;  // the last call's arguments (none after a failure)
  std::uint64_t replayed_ = 0;
};

}  // namespace loom::moe
