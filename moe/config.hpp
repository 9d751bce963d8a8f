// The MoE layer's shape and options, checked once at construction with messages that name the
// violated constraint.
#pragma once

#include <cstdint>
#include <string>

namespace loom::moe {

enum class Activation : std::uint8_t { swiglu, gelu, relu };
enum class RouterScore : std::uint8_t { softmax, sigmoid };

char const* to_string(Activation a);
char const* to_string(RouterScore s);
Activation parse_activation(std::string const& name);  // throws loom::Error
RouterScore parse_router_score(std::string const& name);

struct MoEConfig {
  std::uint32_t hidden = 2048;  // H: token width
  std::uint32_t ffn = 2048;     // D: expert intermediate width
  std::uint32_t experts = 64;   // E
  std::uint32_t top_k = 2;
  Activation activation = Activation::swiglu;
  RouterScore router = RouterScore::softmax;
  bool renormalize = true;  // scale the k chosen weights to sum to 1
  std::uint32_t max_tokens = 4096;

  // Columns of the first expert GEMM: gate and up halves for SwiGLU, else D.
  std::uint32_t up_columns() const { return activation == Activation::swiglu ? 2 * ffn : ffn; }
  // Multiply-adds of the expert GEMMs for `routed` (token, expert) pairs, as flops.
  double expert_flops(std::uint64_t routed) const {
    return 2.0 * routed * (double(hidden) * up_columns() + double(ffn) * hidden);
  }
};

// Limits that the implementation imposes, named in validation errors.
inline constexpr std::uint32_t kMaxTopK = 8;
inline constexpr std::uint32_t kMaxExperts = 1024;
inline constexpr std::uint32_t kWidthMultiple = 64;  // hidden and ffn: the GEMM's K and N tiles

// Throws loom::Error naming the first violated constraint.
void validate(MoEConfig const& config);

}  // namespace loom::moe
