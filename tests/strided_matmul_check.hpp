// A check the CPU and GPU suites share for the fp32 TileMatmul task type: one product over
// sub-matrices of larger buffers (lda > k, ldb > n, ldc > n) with bias and an activation, its C
// compared with float64 and its padding columns required untouched (NaN-poisoned beforehand).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "examples/fused_mlp/fused_mlp.hpp"
#include "tasks/tile_matmul.hpp"

namespace loom::test {

struct StridedMatmul {
  std::uint32_t m = 70, n = 45, k = 90, lda = 101, ldb = 52, ldc = 61;
  tasks::Activation activation = tasks::Activation::gelu_tanh;
  std::vector<float> a, b, bias;

  explicit StridedMatmul(std::mt19937& rng) {
    auto fill = [&rng](std::size_t count, float scale) {
      std::uniform_real_distribution<float> dist(-scale, scale);
      std::vector<float> v(count);
      for (float& e : v) e = dist(rng);
      return v;
    };
    a = fill(std::size_t{m} * lda, 1.0f);
    b = fill(std::size_t{k} * ldb, 0.1f);
    bias = fill(n, 1.0f);
  }

  // The operands over the given copies of a, b, bias and C (host or device memory).
  tasks::MatmulOperands operands(float const* a_at, float const* b_at, float const* bias_at,
                                 float* c_at) const {
    tasks::MatmulOperands op;
    op.a = a_at, op.b = b_at, op.c = c_at, op.bias = bias_at;
    op.m = m, op.n = n, op.k = k, op.lda = lda, op.ldb = ldb, op.ldc = ldc;
    op.activation = activation;
    return op;
  }

  // C ([m][ldc], read back to the host) against float64: relative error below 1e-5, and every
  // padding column still NaN.
  void expect_matches_reference(std::vector<float> const& c) const {
    std::vector<float> out;
    std::vector<double> ref;
    for (std::uint32_t r = 0; r < m; ++r) {
      for (std::uint32_t col = 0; col < n; ++col) {
        double sum = bias[col];
        for (std::uint32_t kk = 0; kk < k; ++kk)
          sum += double(a[std::size_t{r} * lda + kk]) * double(b[std::size_t{kk} * ldb + col]);
        ref.push_back(tasks::activate(activation, sum));
        out.push_back(c[std::size_t{r} * ldc + col]);
      }
      for (std::uint32_t col = n; col < ldc; ++col)
        ASSERT_TRUE(std::isnan(c[std::size_t{r} * ldc + col])) << "row " << r << " col " << col;
    }
    EXPECT_LT(examples::relative_error(out, ref), 1e-5);
  }
};

}  // namespace loom::test
