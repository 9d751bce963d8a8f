#include <algorithm>

#include "moe/layer_buffers.cuh"

namespace loom::moe {

LayerBuffers::LayerBuffers(MoEConfig const& config, MoEView const& shape, std::uint32_t experts,
                           std::size_t rows, std::size_t slots, std::vector<bf16> const& router_w,
                           std::vector<bf16> const& w1_packed, std::vector<bf16> const& w2_w)
    : router(router_w),
      w1(w1_packed),
      w2(w2_w),
      pool(rows * config.hidden),
      h(rows * config.ffn),
      call(zeros<std::uint32_t>(2)),
      counts(zeros<std::uint32_t>(config.experts)),
      expert_tokens(zeros<std::uint32_t>(config.experts)),
      offsets(zeros<std::uint32_t>(experts + 1)),
      tile_base(zeros<std::uint32_t>(experts + 1)),
      fill(zeros<std::uint32_t>(experts)),
      block_pairs(zeros<std::uint32_t>(shape.max_blocks)),
      row_source(zeros<std::uint32_t>(rows)),
      rows_arrived(zeros<std::uint32_t>(shape.max_mtiles)),
      up_done(zeros<std::uint32_t>(shape.max_mtiles)),
      route_arrived(zeros<std::uint32_t>(shape.max_routes)),
      ids(slots),
      weights(slots),
      route_partial(route_partial_size(shape)) {}

namespace {

// Block 0's thread 0 writes the call's words (the views share their call words); every thread
// copies its share of the given routing.
__global__ void set_call(MoEView* view, MoEView* second, bf16 const* x, bf16* out,
                         std::uint32_t tokens, std::int32_t const* given_ids,
                         float const* given_weights, std::int32_t* ids, float* weights,
                         std::size_t slots) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    view->x = x;
    view->out = out;
    if (second) {
      second->x = x;
      second->out = out;
    }
    const_cast<std::uint32_t*>(view->call)[0] = tokens;
    const_cast<std::uint32_t*>(view->call)[1] = given_ids ? 1u : 0u;
  }
  if (!given_ids) return;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < slots;
       i += std::size_t{gridDim.x} * blockDim.x) {
    ids[i] = given_ids[i];
    weights[i] = given_weights[i];
  }
}

}  // namespace

void LayerBuffers::enqueue_call(MoEView* view, MoEView* second, bf16 const* x, bf16* out,
                                std::uint32_t tokens, std::uint32_t top_k,
                                std::int32_t const* given_ids, float const* given_weights,
                                cudaStream_t stream) {
  std::size_t const slots = given_ids ? std::size_t{tokens} * top_k : 0;
  constexpr unsigned kThreads = 256, kMaxBlocks = 64;
  unsigned const blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((slots + kThreads - 1) / kThreads, 1, kMaxBlocks));
  set_call<<<blocks, kThreads, 0, stream>>>(view, second, x, out, tokens, given_ids, given_weights,
                                            ids.get(), weights.get(), slots);
  LOOM_CUDA(cudaGetLastError());
}

void LayerBuffers::bind(MoEView& v) const {
  v.call = call.get();
  v.router_w = router.get();
  v.w1 = w1.get();
  v.w2 = w2.get();
  v.topk_ids = ids.get();
  v.topk_weights = weights.get();
  v.counts = counts.get();
  v.expert_tokens = expert_tokens.get();
  v.offsets = offsets.get();
  v.tile_base = tile_base.get();
  v.fill = fill.get();
  v.block_pairs = block_pairs.get();
  v.pool = pool.get();
  v.row_source = row_source.get();
  v.h = h.get();
  v.rows_arrived = rows_arrived.get();
  v.up_done = up_done.get();
  v.route_arrived = route_arrived.get();
  v.route_partial = route_partial.get();
}

void LayerBuffers::lower_counters() {
  for (auto* b : {&counts, &fill, &rows_arrived, &up_done, &route_arrived}) b->fill_bytes(0);
}

}  // namespace loom::moe
