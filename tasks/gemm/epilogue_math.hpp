// The epilogue's per-element formulas, shared by the host body, both device paths and the tests'
// float64 references (instantiated with double there). gelu_tanh and silu are the formulas of
// tasks/tile_matmul.hpp's activate().
#pragma once

#include "tasks/gemm/config.hpp"
#include "tasks/tile_matmul.hpp"

namespace loom::tasks::gemm {

// none, relu or gelu_tanh of x (swiglu is pairwise: use swiglu()).
template <class Real>
LOOM_HD LOOM_INLINE Real activate(GemmActivation act, Real x) {
  switch (act) {
    case GemmActivation::relu:
      return loom::tasks::activate(Activation::relu, x);
    case GemmActivation::gelu_tanh:
      return loom::tasks::activate(Activation::gelu_tanh, x);
    default:
      return x;
  }
}

// silu(gate) * up.
template <class Real>
LOOM_HD LOOM_INLINE Real swiglu(Real gate, Real up) {
  return loom::tasks::activate(Activation::silu, gate) * up;
}

#if defined(__CUDACC__)
// The device epilogue's forms of the same formulas, from the hardware's exp2 and reciprocal: a
// few instructions and no slow path, where expf and a division take dozens with branches. Their
// relative error (about 1e-6) is far below a bf16 output's rounding (4e-3); non-finite inputs give
// what the formulas above give. gelu_tanh uses 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)).
namespace fast {

__device__ LOOM_INLINE float reciprocal(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ LOOM_INLINE float sigmoid(float x) {
  return reciprocal(1.0f + __expf(-x));
}

__device__ LOOM_INLINE float activate(GemmActivation act, float x) {
  switch (act) {
    case GemmActivation::relu:
      return x > 0.0f ? x : 0.0f;
    case GemmActivation::gelu_tanh: {
      float const u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
      return x * sigmoid(2.0f * u);
    }
    default:
      return x;
  }
}

__device__ LOOM_INLINE float swiglu(float gate, float up) {
  return gate * sigmoid(gate) * up;
}

}  // namespace fast
#endif

}  // namespace loom::tasks::gemm
