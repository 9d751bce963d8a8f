// Shared by the MoE GPU suites: a layer configuration in one call, and a test case of it.
#pragma once

#include "moe/config.hpp"

namespace moe_test {

inline loom::moe::MoEConfig config(loom::moe::Activation act, loom::moe::RouterScore score,
                                   std::uint32_t hidden, std::uint32_t ffn, std::uint32_t experts,
                                   std::uint32_t top_k, std::uint32_t max_tokens) {
  loom::moe::MoEConfig c;
  c.hidden = hidden, c.ffn = ffn, c.experts = experts, c.top_k = top_k;
  c.activation = act, c.router = score, c.max_tokens = max_tokens;
  return c;
}

struct Case {
  loom::moe::MoEConfig config;
  std::uint32_t tokens;
};

}  // namespace moe_test
