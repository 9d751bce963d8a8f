// The float64 reference of the layer, computed from the same bf16 inputs with no rounding in
// between: y[t] = sum_j w[t,j] * W2_e (act(W1_e x[t])) for e = ids[t,j] >= 0.
#pragma once

#include <vector>

#include "moe/weights.hpp"

namespace loom::moe {

// Router scores in float64: [T][E] after softmax or sigmoid.
std::vector<double> reference_scores(MoEConfig const& config, MoEWeights const& weights,
                                     bf16 const* x, std::uint32_t tokens);

// The layer's output given a routing: [T][H].
std::vector<double> reference_moe(MoEConfig const& config, MoEWeights const& weights, bf16 const* x,
                                  std::uint32_t tokens, std::int32_t const* ids,
                                  float const* routing_weights);

// Checks a routing the layer chose against float64 scores: every chosen expert's score is within
// `tolerance` of the k-th best score or above it, ids are distinct, and weights match the
// (renormalised) reference scores within `tolerance`. Returns an empty string or what is wrong.
std::string check_routing(MoEConfig const& config, std::vector<double> const& scores,
                          std::uint32_t tokens, std::int32_t const* ids, float const* weights,
                          double tolerance);

double relative_error(std::vector<bf16> const& out, std::vector<double> const& ref);

}  // namespace loom::moe
