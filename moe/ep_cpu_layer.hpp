// The expert-parallel MoE layer on the CPU executor: P virtual ranks in one process over a
// HostSymmetricHeap, each running the EP pipeline's host bodies with its own tokens and its own
// E / P experts. The same protocol and decomposition as on P GPUs (moe/ep_gpu_layer.cuh).
#pragma once

#include <memory>
#include <vector>

#include "moe/ep_pipeline.hpp"
#include "moe/weights.hpp"
#include "runtime/cpu_executor.hpp"

namespace loom::moe {

// Per-rank inputs and outputs of one call, host pointers.
struct EpRankCall {
  bf16 const* x = nullptr;  // [tokens][H]
  std::uint32_t tokens = 0;
  bf16* out = nullptr;  // [tokens][H]
  // With the caller's routing: [tokens][k] global expert ids (-1: none) and weights; both null
  // for the fused router.
  std::int32_t const* ids = nullptr;
  float const* weights = nullptr;
};

class CpuEpMoELayer {
 public:
  // `silent_rank` >= 0 is a test hook: that rank never sends anything (a peer that never arrives).
  CpuEpMoELayer(MoEConfig const& config, MoEWeights const& weights, std::uint32_t world,
                CpuOptions options = {}, std::int32_t silent_rank = -1);
  ~CpuEpMoELayer();

  MoEConfig const& config() const { return config_; }
  std::uint32_t world() const { return world_; }

  // One call on every rank (calls.size() == world). Invalid caller routing is rejected before
  // the launch with loom::Error naming the rank and token.
  void forward(std::vector<EpRankCall> const& calls);

  // Of the last call: tokens of `rank` routed to each of the E experts; rows each of the rank's
  // local experts computed (from every rank); the routing `rank` used.
  std::vector<std::uint32_t> expert_tokens(std::uint32_t rank) const;
  std::vector<std::uint32_t> local_expert_rows(std::uint32_t rank) const;
  std::vector<std::int32_t> topk_ids(std::uint32_t rank) const;
  std::vector<float> topk_weights(std::uint32_t rank) const;

  // Every put of later calls is reported to `log` (null: none).
  void set_write_log(RemoteWriteLog* log);
  // Where each symmetric region lies (for checking a write log).
  EpHeapRegions const& regions() const { return regions_; }
  std::uint64_t heap_bytes() const { return layout_.bytes(); }

  CpuExecutor<EpPipeline, EpDecoder>& executor() { return *executor_; }

 private:
  struct Rank;
  void lower_counters();

  MoEConfig config_;
  std::uint32_t world_;
  SymmetricLayout layout_;
  EpHeapRegions regions_;
  std::unique_ptr<HostSymmetricHeap> heap_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<CpuExecutor<EpPipeline, EpDecoder>> executor_;
};

}  // namespace loom::moe
