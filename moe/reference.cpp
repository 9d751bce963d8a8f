#include "moe/reference.hpp"

#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace loom::moe {

namespace {
double f(bf16 v) {
  return static_cast<double>(__bfloat162float(v));
}
double activate64(Activation a, double v) {
  if (a == Activation::relu) return v > 0 ? v : 0;
  double const c = 0.7978845608028654;
  return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
}
}  // namespace

std::vector<double> reference_scores(MoEConfig const& c, MoEWeights const& w, bf16 const* x,
                                     std::uint32_t tokens) {
  std::vector<double> s(std::size_t{tokens} * c.experts);
  oneapi::tbb::parallel_for(std::uint32_t{0}, tokens, [&](std::uint32_t t) {
    double* row = s.data() + std::size_t{t} * c.experts;
    for (std::uint32_t e = 0; e < c.experts; ++e) {
      double acc = 0;
      for (std::uint32_t i = 0; i < c.hidden; ++i)
        acc += f(x[std::size_t{t} * c.hidden + i]) * f(w.router[std::size_t{e} * c.hidden + i]);
      row[e] = acc;
    }
    if (c.router == RouterScore::sigmoid) {
      for (std::uint32_t e = 0; e < c.experts; ++e) row[e] = 1.0 / (1.0 + std::exp(-row[e]));
    } else {
      double const m = *std::max_element(row, row + c.experts);
      double sum = 0;
      for (std::uint32_t e = 0; e < c.experts; ++e) sum += (row[e] = std::exp(row[e] - m));
      for (std::uint32_t e = 0; e < c.experts; ++e) row[e] /= sum;
    }
  });
  return s;
}

std::vector<double> reference_moe(MoEConfig const& c, MoEWeights const& w, bf16 const* x,
                                  std::uint32_t tokens, std::int32_t const* ids,
                                  float const* weights) {
  std::size_t const h = c.hidden, d = c.ffn;
  std::vector<double> out(std::size_t{tokens} * h, 0.0);
  oneapi::tbb::parallel_for(std::uint32_t{0}, tokens, [&](std::uint32_t t) {
    std::vector<double> act(d);
    for (std::uint32_t j = 0; j < c.top_k; ++j) {
      std::int32_t const e = ids[std::size_t{t} * c.top_k + j];
      if (e < 0) continue;
      bf16 const* xt = x + t * h;
      for (std::size_t i = 0; i < d; ++i) {
        double g = 0, u = 0;
        bf16 const* gr = w.gate.data() + (std::size_t(e) * d + i) * h;
        for (std::size_t k = 0; k < h; ++k) g += f(xt[k]) * f(gr[k]);
        if (c.activation == Activation::swiglu) {
          bf16 const* ur = w.up.data() + (std::size_t(e) * d + i) * h;
          for (std::size_t k = 0; k < h; ++k) u += f(xt[k]) * f(ur[k]);
          act[i] = g / (1.0 + std::exp(-g)) * u;
        } else {
          act[i] = activate64(c.activation, g);
        }
      }
      double const wt = weights[std::size_t{t} * c.top_k + j];
      for (std::size_t o = 0; o < h; ++o) {
        bf16 const* dr = w.down.data() + (std::size_t(e) * h + o) * d;
        double acc = 0;
        for (std::size_t i = 0; i < d; ++i) acc += act[i] * f(dr[i]);
        out[t * h + o] += wt * acc;
      }
    }
  });
  return out;
}

std::string check_routing(MoEConfig const& c, std::vector<double> const& scores,
                          std::uint32_t tokens, std::int32_t const* ids, float const* weights,
                          double tol) {
  for (std::uint32_t t = 0; t < tokens; ++t) {
    double const* s = scores.data() + std::size_t{t} * c.experts;
    std::vector<double> sorted(s, s + c.experts);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double const kth = sorted[c.top_k - 1];
    double chosen_sum = 0;
    for (std::uint32_t j = 0; j < c.top_k; ++j) {
      std::int32_t const e = ids[std::size_t{t} * c.top_k + j];
      if (e < 0 || e >= static_cast<std::int32_t>(c.experts))
        return "token " + std::to_string(t) + " slot " + std::to_string(j) + ": expert " +
               std::to_string(e) + " out of range";
      for (std::uint32_t i = 0; i < j; ++i)
        if (ids[std::size_t{t} * c.top_k + i] == e)
          return "token " + std::to_string(t) + ": expert " + std::to_string(e) + " chosen twice";
      if (s[e] < kth - tol)
        return "token " + std::to_string(t) + ": expert " + std::to_string(e) + " (score " +
               std::to_string(s[e]) + ") is not among the top " + std::to_string(c.top_k);
      chosen_sum += s[e];
    }
    for (std::uint32_t j = 0; j < c.top_k; ++j) {
      std::int32_t const e = ids[std::size_t{t} * c.top_k + j];
      double const want = c.renormalize ? s[e] / chosen_sum : s[e];
      if (std::abs(weights[std::size_t{t} * c.top_k + j] - want) > tol * std::max(1.0, want))
        return "token " + std::to_string(t) + ": weight " +
               std::to_string(weights[std::size_t{t} * c.top_k + j]) + " for expert " +
               std::to_string(e) + ", reference " + std::to_string(want);
    }
  }
  return {};
}

double relative_error(std::vector<bf16> const& out, std::vector<double> const& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double const d = static_cast<double>(__bfloat162float(out[i])) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

}  // namespace loom::moe
