// The two expert GEMMs of the layer: their tile configurations, chosen on the host from the
// config, and their operand descriptions over the layer's buffers.
//
// Both GEMMs share one M-tile height (the gather forms M-tiles before either runs): 64 rows when
// an expert gets few rows on average (decode, many experts), else 128. N-tiles are 128 wide.
#pragma once

#include "moe/view.hpp"
#include "tasks/gemm/operands.hpp"

namespace loom::moe {

struct ExpertGemmConfigs {
  tasks::gemm::GemmConfig up, down;
};

ExpertGemmConfigs choose_expert_gemms(MoEConfig const& config,
                                      tasks::gemm::MmaPath path = tasks::gemm::MmaPath::wgmma);

// pool [rows][H] · W1 [E][up_cols][H]ᵀ -> h [rows][ffn] (bf16, with the activation).
tasks::gemm::GemmDesc up_gemm_desc(MoEConfig const& config, bf16 const* pool, bf16 const* w1,
                                   bf16* h);
// h [rows][ffn] · W2 [E][H][ffn]ᵀ -> fp32, delivered to y[slot][token] ([k][T][H]).
tasks::gemm::GemmDesc down_gemm_desc(MoEConfig const& config, bf16 const* h, bf16 const* w2,
                                     float* y);

}  // namespace loom::moe
