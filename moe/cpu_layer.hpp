// The MoE layer on the CPU executor: the same pipeline and decomposition as on the GPU, with the
// task types' host bodies. Inputs, outputs and weights in host memory.
#pragma once

#include <memory>

#include "moe/pipeline.hpp"
#include "moe/weights.hpp"
#include "runtime/cpu_executor.hpp"

namespace loom::moe {

class CpuMoELayer {
 public:
  // `path`: the GPU layer whose decomposition this one follows (with mma_sync, the router's
  // slices of a few route groups are spread over several tasks; with wgmma and a shape
  // routes_on_tile admits, route groups of up to kRouteTileTokens tokens, each after its
  // RouteTile, which does nothing here: the route task computes the logits itself).
  CpuMoELayer(MoEConfig const& config, MoEWeights const& weights, CpuOptions options = {},
              tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma);

  MoEConfig const& config() const { return config_; }

  // x [tokens][H] -> out [tokens][H] with the fused router.
  void forward(bf16 const* x, std::uint32_t tokens, bf16* out);
  // The same with the caller's routing: ids [tokens][k] (-1: none), weights [tokens][k]. Invalid
  // routing (id out of range or repeated in a row, non-finite weight) is rejected before the
  // launch with loom::Error.
  void forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids, float const* weights,
               bf16* out);

  // Of the last call: tokens routed to each expert, and the routing used.
  std::vector<std::uint32_t> expert_tokens() const;
  std::vector<std::int32_t> topk_ids() const;
  std::vector<float> topk_weights() const;
  // Rows per expert M-tile in a call of `tokens` tokens (the plan picks the view), and the
  // M-tiles of the last call.
  std::uint32_t mtile_rows(std::uint32_t tokens) const;
  std::uint32_t mtiles() const;

  CpuExecutor<MoEPipeline>& executor() { return *executor_; }

 private:
  void run(bf16 const* x, std::uint32_t tokens, bf16* out);

  MoEConfig config_;
  LayerShapes shapes_;
  std::vector<bf16> router_, w1_, w2_;
  std::vector<std::uint32_t> call_, counts_, expert_tokens_, offsets_, tile_base_, fill_,
      block_pairs_, row_source_, rows_arrived_, up_done_, block_done_, route_arrived_, route_sync_,
      pair_ticket_;
  SharedEmission up_emission_{};
  std::vector<std::int32_t> ids_;
  std::vector<float> weights_, route_partial_;
  std::vector<bf16> pool_, h_, y_;
  std::vector<std::unique_ptr<tasks::gemm::GemmOperands>> ops_;
  std::unique_ptr<MoEView> short_view_, view_;
  std::unique_ptr<CpuExecutor<MoEPipeline>> executor_;
  std::uint32_t last_tokens_ = 0;
};

}  // namespace loom::moe
