// The two ceilings a layer's floor is measured against, on the current GPU, in the same run:
// bf16 tensor throughput (cuBLAS, fp32 accumulate) and device-memory bandwidth (a large
// device-to-device copy, bytes read plus written).
#pragma once

namespace loom::moe {

struct Ceilings {
  double tensor_flops_per_s = 0;
  double memory_bytes_per_s = 0;
};

Ceilings measure_ceilings();

}  // namespace loom::moe
