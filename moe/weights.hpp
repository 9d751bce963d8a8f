// The layer's parameters in their logical layout (what a user loads from a checkpoint), and the
// packing into the layout the expert GEMMs read.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/view.hpp"

namespace loom::moe {

struct MoEWeights {
  std::vector<bf16> router;  // [E][H]
  std::vector<bf16> gate;    // [E][D][H]: W1 for GELU/ReLU, the gate half for SwiGLU
  std::vector<bf16> up;      // [E][D][H]: the up half for SwiGLU; empty otherwise
  std::vector<bf16> down;    // [E][H][D]: W2
};

// Random weights scaled by 1/sqrt(fan-in) (router scaled so softmax is neither flat nor one-hot).
MoEWeights random_weights(MoEConfig const& config, std::uint64_t seed);

// Throws loom::Error when a tensor's size does not match the config.
void check_shapes(MoEConfig const& config, MoEWeights const& weights);

// W1 as the up-projection GEMM reads it: [E][up_columns][H]; for SwiGLU the gate and up rows
// alternate in blocks of 8 (tasks/gemm/config.hpp, swiglu_gate_column), so every GEMM tile holds
// matching gate/up columns.
std::vector<bf16> pack_up_projection(MoEConfig const& config, MoEWeights const& weights);

std::vector<bf16> random_tokens(MoEConfig const& config, std::uint32_t tokens, std::uint64_t seed);

}  // namespace loom::moe
