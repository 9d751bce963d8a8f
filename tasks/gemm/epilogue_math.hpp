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

}  // namespace loom::tasks::gemm
