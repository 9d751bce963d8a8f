// The device buffers one rank's layer owns and its MoEView points at: weights, routing, the plan's
// counts and offsets, the expert pool, the hidden rows and the arrival counters. The one-GPU layer
// and each expert-parallel rank build one; the rank places y and the block counters in its
// symmetric window instead, so those two stay with the layers.
#pragma once

#include <memory>
#include <vector>

#include "moe/view.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/protocol.hpp"
#include "tasks/gemm/device_gemm.hpp"

namespace loom::moe {

template <class T>
DeviceBuffer<T> zeros(std::size_t n) {
  DeviceBuffer<T> b(n);
  b.fill_bytes(0);
  return b;
}

struct LayerBuffers {
  // `shape`: the view's shape; `experts`: the experts this rank computes (their W1, packed, and
  // W2 given); `rows`: its pool rows; `slots`: routing slots, max_tokens x top_k.
  LayerBuffers(MoEConfig const& config, MoEView const& shape, std::uint32_t experts,
               std::size_t rows, std::size_t slots, std::vector<bf16> const& router,
               std::vector<bf16> const& w1, std::vector<bf16> const& w2);

  // Points the view's buffers at these (all but y and block_done), and its route_ops at the
  // router tile's operands when the shape routes on the tensor cores; pair_ticket only where the
  // view's route tasks gather (route_gathers).
  void bind(MoEView& v) const;
  // Enqueues one call's words on `stream`, ahead of the persistent kernel: x, out, the token
  // count, whether routing is given and the call block (tokens per gather and combine), into
  // `view` (device memory) and into `second` unless it is null; with given routing (ids and
  // weights, tokens x top_k each, on this device) also copies it into ids and weights; with the
  // router on the tensor cores, the router tile's tensor map of x. Throws unless x is 16-byte
  // aligned. One launch whatever is given. The callers check that ids and weights are both given
  // or both null.
  void enqueue_call(MoEView* view, MoEView* second, bf16 const* x, bf16* out, std::uint32_t tokens,
                    std::uint32_t call_block, std::uint32_t top_k, std::int32_t const* given_ids,
                    float const* given_weights, cudaStream_t stream);
  // After a failed call, which may leave them raised: zeroes the counters a call raises and
  // lowers again (expert counts, pool fill, row and tile arrivals, route parts, route_sync).
  void lower_counters();

  DeviceBuffer<bf16> router, w1, w2, pool, h;
  DeviceBuffer<std::uint32_t> call, counts, expert_tokens, offsets, tile_base, fill, block_pairs,
      row_source, rows_arrived, up_done, route_arrived, route_sync, pair_ticket;
  DeviceBuffer<SharedEmission> up_emission;
  DeviceBuffer<std::int32_t> ids;
  DeviceBuffer<float> weights, route_partial;
  // The router on the tensor cores (shape.tile_router): its logits and the tile's operands.
  DeviceBuffer<float> route_logits;
  std::unique_ptr<tasks::gemm::DeviceGemm> route_gemm;

 private:
  std::uint32_t hidden_ = 0;
};

}  // namespace loom::moe
