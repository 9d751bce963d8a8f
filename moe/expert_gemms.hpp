// The two expert GEMMs of the layer: their tile configurations, chosen on the host from the
// config, and their operand descriptions over the layer's buffers.
//
// Both GEMMs share one M-tile height (the gather forms M-tiles before either runs): 64 rows when
// an expert gets at most kShortMTileRows rows on average (decode, many experts), else 128. On
// H200 at H = D = 2048, E = 64, top-2 (max_tokens = T), 64-row tiles were 3-5% faster at 16 and
// 32 rows per expert (and in decode), and 128-row tiles 4% faster at 64 rows per expert and
// 14-20% faster at 128 and more. N-tiles are 256 wide for both heights (wider is fewer, longer
// tasks; the 128x256 tile borrows registers with setmaxnreg). The layer's height is chosen from
// max_tokens; a layer with 128-row tiles also gets the 64-row configuration
// (short_expert_gemms), which its plan takes for a call of few tokens (MoEView::short_view).
#pragma once

#include "moe/view.hpp"
#include "tasks/gemm/operands.hpp"

namespace loom::moe {

inline constexpr std::uint32_t kShortMTileRows = 48;
// N-tiles per up task (MoEView::up_run) on 64-row tiles; 1 on taller ones.
inline constexpr std::uint32_t kShortUpRun = 4;

struct ExpertGemmConfigs {
  tasks::gemm::GemmConfig up, down;
  std::uint32_t up_run = 1;  // N-tiles per up task (MoEView::up_run)
};

// Whether `tokens` tokens give an expert at most kShortMTileRows rows on average.
inline bool short_mtiles(MoEConfig const& c, std::uint32_t tokens) {
  return std::uint64_t{tokens} * c.top_k <= std::uint64_t{kShortMTileRows} * c.experts;
}

ExpertGemmConfigs choose_expert_gemms(MoEConfig const& config,
                                      tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma);
// The 64-row configuration for the calls of few tokens, when choose_expert_gemms chose 128 rows;
// false when the layer's tiles are already short. Checked against the tall one (check_short_gemms).
bool short_expert_gemms(MoEConfig const& config, tasks::gemm::MmaPath path, ExpertGemmConfigs& out);
// An expert's last M-tile may run on the short configuration's operands, but it is emitted with
// the layer's N-tile counts (MoEView::up_tiles, down_tiles) and the plan retires the dynamic bound
// by them: both heights must cut N into the same tiles. Throws loom::Error naming the GEMM whose
// N-tiles differ.
void check_short_gemms(ExpertGemmConfigs const& tall, ExpertGemmConfigs const& short_tiles);

// Which experts a rank's GEMMs hold and how many pool rows it has: all of them and T * k on one
// GPU; E / P and the expert-parallel pool (moe/ep_layer.hpp) on each of P ranks.
struct ExpertSide {
  std::uint32_t experts;
  std::uint32_t pool_rows;
};
inline ExpertSide all_experts(MoEConfig const& c) {
  return {c.experts, c.max_tokens * c.top_k};
}

// pool [rows][H] · W1 [E][up_cols][H]ᵀ -> h [rows][ffn] (bf16, with the activation).
tasks::gemm::GemmDesc up_gemm_desc(MoEConfig const& config, bf16 const* pool, bf16 const* w1,
                                   bf16* h, ExpertSide side);
inline tasks::gemm::GemmDesc up_gemm_desc(MoEConfig const& config, bf16 const* pool, bf16 const* w1,
                                          bf16* h) {
  return up_gemm_desc(config, pool, w1, h, all_experts(config));
}
// h [rows][ffn] · W2 [E][H][ffn]ᵀ -> bf16 (fp32 accumulation), delivered to y[slot][token]
// ([k][T][H]).
tasks::gemm::GemmDesc down_gemm_desc(MoEConfig const& config, bf16 const* h, bf16 const* w2,
                                     bf16* y, ExpertSide side);
inline tasks::gemm::GemmDesc down_gemm_desc(MoEConfig const& config, bf16 const* h, bf16 const* w2,
                                            bf16* y) {
  return down_gemm_desc(config, h, w2, y, all_experts(config));
}

}  // namespace loom::moe
