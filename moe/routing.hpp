// Routing of one token, the same on host and device: scores from the router logits (softmax or
// sigmoid), the top-k experts (ties go to the lower expert id, so the choice is deterministic),
// optional renormalisation of the k weights.
#pragma once

#include <cmath>

#include "moe/config.hpp"
#include "runtime/config.hpp"

namespace loom::moe {

// logits[E] in, scores written in place. Softmax is computed stably (max subtracted).
LOOM_HD inline void score_logits(float* logits, std::uint32_t experts, RouterScore score) {
  if (score == RouterScore::sigmoid) {
    for (std::uint32_t e = 0; e < experts; ++e) logits[e] = 1.0f / (1.0f + expf(-logits[e]));
    return;
  }
  float max = logits[0];
  for (std::uint32_t e = 1; e < experts; ++e) max = fmaxf(max, logits[e]);
  float sum = 0.0f;
  for (std::uint32_t e = 0; e < experts; ++e) sum += (logits[e] = expf(logits[e] - max));
  for (std::uint32_t e = 0; e < experts; ++e) logits[e] /= sum;
}

// Picks the k largest scores (lower id first among equals; NaN scores rank last), writing ids and
// weights in descending order of score; renormalises the weights to sum to 1 when asked. The
// picks are kept in registers until the end: ids and weights may live in global memory, and
// re-reading them for every candidate would cost a memory round trip each on the GPU.
LOOM_HD inline void select_top_k(float const* scores, std::uint32_t experts, std::uint32_t k,
                                 bool renormalize, std::int32_t* ids, float* weights) {
  std::int32_t picked[kMaxTopK];
  float picked_score[kMaxTopK];
  for (std::uint32_t j = 0; j < k; ++j) {
    std::int32_t best = -1;
    float best_score = 0.0f;
    for (std::uint32_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (std::uint32_t i = 0; i < j; ++i) taken |= picked[i] == static_cast<std::int32_t>(e);
      if (taken) continue;
      float const s = scores[e];
      bool const better = best < 0 || (s > best_score) || (best_score != best_score && s == s);
      if (better) {
        best = static_cast<std::int32_t>(e);
        best_score = s;
      }
    }
    picked[j] = best;
    picked_score[j] = best_score;
  }
  float sum = 0.0f;
  if (renormalize)
    for (std::uint32_t j = 0; j < k; ++j) sum += picked_score[j];
  for (std::uint32_t j = 0; j < k; ++j) {
    ids[j] = picked[j];
    weights[j] = renormalize ? picked_score[j] / sum : picked_score[j];
  }
}

// Activations applied per expert path in the first GEMM's epilogue.
LOOM_HD inline float silu(float x) {
  return x / (1.0f + expf(-x));
}
LOOM_HD inline float gelu_tanh(float x) {
  float const c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
LOOM_HD inline float relu(float x) {
  return x > 0.0f ? x : 0.0f;
}

}  // namespace loom::moe
