#include "moe/weights.hpp"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "runtime/error.hpp"

namespace loom::moe {

namespace {
// Uniform values in [-scale, scale], filled in parallel chunks; chunk i draws from its own stream
// (seed, stream, i), so the result depends only on the seed, not on the thread count.
std::vector<bf16> uniform(std::size_t n, float scale, std::uint64_t seed, std::uint64_t stream) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<bf16> v(n);
  oneapi::tbb::parallel_for(std::size_t{0}, (n + kChunk - 1) / kChunk, [&](std::size_t chunk) {
    std::seed_seq seq{seed, stream, static_cast<std::uint64_t>(chunk)};
    std::mt19937_64 rng(seq);
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (std::size_t i = chunk * kChunk; i < std::min(n, (chunk + 1) * kChunk); ++i)
      v[i] = __float2bfloat16(dist(rng));
  });
  return v;
}
}  // namespace

MoEWeights random_weights(MoEConfig const& c, std::uint64_t seed) {
  std::size_t const e = c.experts, h = c.hidden, d = c.ffn;
  MoEWeights w;
  w.router = uniform(e * h, 2.0f / std::sqrt(float(h)), seed, 1);
  w.gate = uniform(e * d * h, 1.0f / std::sqrt(float(h)), seed, 2);
  if (c.activation == Activation::swiglu)
    w.up = uniform(e * d * h, 1.0f / std::sqrt(float(h)), seed, 3);
  w.down = uniform(e * h * d, 1.0f / std::sqrt(float(d)), seed, 4);
  return w;
}

std::vector<bf16> random_tokens(MoEConfig const& c, std::uint32_t tokens, std::uint64_t seed) {
  return uniform(std::size_t{tokens} * c.hidden, 1.0f, seed, 5);
}

void check_shapes(MoEConfig const& c, MoEWeights const& w) {
  std::size_t const e = c.experts, h = c.hidden, d = c.ffn;
  auto check = [](char const* name, std::size_t have, std::size_t want) {
    if (have != want)
      throw Error(std::string("loom: MoE weight '") + name + "' has " + std::to_string(have) +
                  " elements, the config needs " + std::to_string(want));
  };
  check("router", w.router.size(), e * h);
  check("gate", w.gate.size(), e * d * h);
  check("up", w.up.size(), c.activation == Activation::swiglu ? e * d * h : 0);
  check("down", w.down.size(), e * h * d);
}

std::vector<bf16> pack_up_projection(MoEConfig const& c, MoEWeights const& w) {
  check_shapes(c, w);
  std::size_t const h = c.hidden, d = c.ffn;
  if (c.activation != Activation::swiglu) return w.gate;
  std::vector<bf16> packed(std::size_t{c.experts} * 2 * d * h);
  for (std::size_t e = 0; e < c.experts; ++e)
    for (std::uint32_t o = 0; o < d; ++o) {
      bf16 const* gate = w.gate.data() + (e * d + o) * h;
      bf16 const* up = w.up.data() + (e * d + o) * h;
      std::copy(gate, gate + h,
                packed.begin() + (e * 2 * d + tasks::gemm::swiglu_gate_column(o)) * h);
      std::copy(up, up + h, packed.begin() + (e * 2 * d + tasks::gemm::swiglu_up_column(o)) * h);
    }
  return packed;
}

}  // namespace loom::moe
