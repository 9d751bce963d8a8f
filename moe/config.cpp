#include "moe/config.hpp"

#include "runtime/error.hpp"

namespace loom::moe {

char const* to_string(Activation a) {
  switch (a) {
    case Activation::swiglu:
      return "swiglu";
    case Activation::gelu:
      return "gelu";
    case Activation::relu:
      return "relu";
  }
  return "unknown";
}

char const* to_string(RouterScore s) {
  return s == RouterScore::softmax ? "softmax" : "sigmoid";
}

Activation parse_activation(std::string const& name) {
  if (name == "swiglu") return Activation::swiglu;
  if (name == "gelu") return Activation::gelu;
  if (name == "relu") return Activation::relu;
  throw Error("loom: unknown activation '" + name + "' (choose swiglu, gelu or relu)");
}

RouterScore parse_router_score(std::string const& name) {
  if (name == "softmax") return RouterScore::softmax;
  if (name == "sigmoid") return RouterScore::sigmoid;
  throw Error("loom: unknown router score '" + name + "' (choose softmax or sigmoid)");
}

void validate(MoEConfig const& c) {
  auto fail = [](std::string const& what) { throw Error("loom: MoEConfig: " + what); };
  if (c.hidden == 0 || c.hidden % kWidthMultiple != 0)
    fail("hidden=" + std::to_string(c.hidden) + " must be a positive multiple of " +
         std::to_string(kWidthMultiple));
  if (c.ffn == 0 || c.ffn % kWidthMultiple != 0)
    fail("ffn=" + std::to_string(c.ffn) + " must be a positive multiple of " +
         std::to_string(kWidthMultiple));
  if (c.experts == 0 || c.experts > kMaxExperts)
    fail("experts=" + std::to_string(c.experts) + " must be between 1 and " +
         std::to_string(kMaxExperts));
  if (c.top_k == 0 || c.top_k > kMaxTopK)
    fail("top_k=" + std::to_string(c.top_k) + " must be between 1 and " + std::to_string(kMaxTopK) +
         " (experts per token limit)");
  if (c.top_k > c.experts)
    fail("top_k=" + std::to_string(c.top_k) + " exceeds experts=" + std::to_string(c.experts));
  if (c.max_tokens == 0) fail("max_tokens must be at least 1");
  if (std::uint64_t{c.max_tokens} * c.top_k >= (1ull << 30))
    fail("max_tokens=" + std::to_string(c.max_tokens) + " times top_k=" + std::to_string(c.top_k) +
         " exceeds 2^30 routed rows");
}

}  // namespace loom::moe
