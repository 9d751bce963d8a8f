// The two ceilings a layer's floor is measured against, on the current GPU, in the same run:
// bf16 tensor throughput (cuBLAS, fp32 accumulate) and device-memory bandwidth (a large
// device-to-device copy, bytes read plus written).
#pragma once

namespace loom::moe {

struct Ceilings {
  double tensor_flops_per_s = 0;
  double memory_bytes_per_s = 0;
};

// sustain_seconds = 0: the median of ten calls of each, the rates of a short run at the GPU's
// boost clocks (what a run of a few dozen calls sees). sustain_seconds > 0: each is called for at
// least that long and its rate is the median of the calls in the second half, the rate the GPU
// holds under a long run once its power limit has pulled the clocks down (an H200 at its 700 W
// limit ran tensor-core work at 1545-1750 MHz instead of 1980 within half a second). Compare a
// layer timed over a long run with the sustained ceilings.
Ceilings measure_ceilings(double sustain_seconds = 0);

}  // namespace loom::moe
