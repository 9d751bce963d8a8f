// Shared by the expert-parallel GPU suites: one rank's call data, on the host and on its device.
#pragma once

#include <algorithm>
#include <vector>

#include "moe/weights.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace ep_test {

// x [tokens][hidden] and, for the caller's routing, ids and weights [tokens][k]; upload() puts
// them on `device` with out poisoned (NaN), and out() brings back the rank's output rows.
struct RankData {
  int device = 0;
  std::uint32_t tokens = 0;
  std::vector<loom::moe::bf16> x;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  loom::DeviceBuffer<loom::moe::bf16> dx, dout;
  loom::DeviceBuffer<std::int32_t> dids;
  loom::DeviceBuffer<float> dweights;

  void upload(std::uint32_t hidden) {
    loom::ScopedDevice const on(device);
    dx = loom::DeviceBuffer<loom::moe::bf16>(x);
    dout =
        loom::DeviceBuffer<loom::moe::bf16>(std::max<std::size_t>(1, std::size_t{tokens} * hidden));
    dout.fill_bytes(0xFF);  // NaN
    if (!ids.empty()) {
      dids = loom::DeviceBuffer<std::int32_t>(ids);
      dweights = loom::DeviceBuffer<float>(weights);
    }
  }
  std::vector<loom::moe::bf16> out() const {
    loom::ScopedDevice const on(device);
    auto o = dout.download();
    o.resize(std::size_t{tokens} * (x.size() / std::max(1u, tokens)));
    return o;
  }
};

}  // namespace ep_test
