#include <algorithm>

#include "moe/layer_buffers.cuh"
#include "tasks/gemm/ptx/tma.cuh"
#include "tasks/gemm/tensor_map.hpp"

namespace loom::moe {

namespace {

// The router as the tile reads it: route_columns(experts) rows, those past the experts zero.
std::vector<bf16> padded_router(MoEConfig const& c, MoEView const& shape,
                                std::vector<bf16> const& router) {
  if (!shape.tile_router) return router;
  std::vector<bf16> padded(std::size_t{route_columns(c.experts)} * c.hidden,
                           __float2bfloat16(0.0f));
  std::copy(router.begin(), router.end(), padded.begin());
  return padded;
}

}  // namespace

LayerBuffers::LayerBuffers(MoEConfig const& config, MoEView const& shape, std::uint32_t experts,
                           std::size_t rows, std::size_t slots, std::vector<bf16> const& router_w,
                           std::vector<bf16> const& w1_packed, std::vector<bf16> const& w2_w)
    : router(padded_router(config, shape, router_w)),
      w1(w1_packed),
      w2(w2_w),
      pool(rows * config.hidden),
      h(rows * config.ffn),
      call(zeros<std::uint32_t>(kCallWords)),
      counts(zeros<std::uint32_t>(config.experts)),
      expert_tokens(zeros<std::uint32_t>(config.experts)),
      offsets(zeros<std::uint32_t>(experts + 1)),
      tile_base(zeros<std::uint32_t>(experts + 1)),
      fill(zeros<std::uint32_t>(experts)),
      block_pairs(zeros<std::uint32_t>(shape.max_call_blocks)),
      row_source(zeros<std::uint32_t>(rows)),
      rows_arrived(zeros<std::uint32_t>(shape.max_mtiles)),
      up_done(zeros<std::uint32_t>(shape.max_mtiles)),
      route_arrived(zeros<std::uint32_t>(shape.max_routes)),
      route_sync(zeros<std::uint32_t>(kRouteSyncWords)),
      up_emission(1),
      pair_ticket(shape.route_gathers ? slots : 0),
      ids(slots),
      weights(slots),
      route_partial(route_partial_size(shape)),
      hidden_(config.hidden) {
  if (!shape.tile_router) return;
  // x's rows times the router: one 64-row tile of 128 or 256 columns per route task, chosen from
  // the experts alone. A stands in for x until a call rewrites its map (pool has at least
  // max_tokens rows).
  std::uint32_t const columns = route_columns(config.experts);
  route_logits = DeviceBuffer<float>(std::size_t{config.max_tokens} * columns);
  tasks::gemm::GemmConfig cfg;
  cfg.block_m = kRouteTileTokens;
  cfg.block_n = columns <= 128 ? 128 : 256;
  cfg.splits = 1;
  cfg.path = tasks::gemm::MmaPath::wgmma;
  cfg.stages = static_cast<std::uint8_t>(cfg.max_stages());
  tasks::gemm::GemmDesc d;
  d.a = reinterpret_cast<tasks::gemm::Bf16 const*>(pool.get());
  d.a_rows = config.max_tokens;
  d.b = reinterpret_cast<tasks::gemm::Bf16 const*>(router.get());
  d.n = columns;
  d.k = config.hidden;
  d.c = route_logits.get();
  d.output = tasks::gemm::OutputType::fp32;
  route_gemm = std::make_unique<tasks::gemm::DeviceGemm>(d, cfg);
}

namespace {

// Block 0's thread 0 writes the call's words (the views share their call words) and, given a
// place for it, the router tile's map of x, released to the tensor-map proxy; every thread
// copies its share of the given routing.
__global__ void set_call(MoEView* view, MoEView* second, bf16 const* x, bf16* out,
                         std::uint32_t tokens, std::uint32_t call_block,
                         std::int32_t const* given_ids, float const* given_weights,
                         std::int32_t* ids, float* weights, std::size_t slots,
                         tasks::gemm::TensorMapBytes x_map, tasks::gemm::TensorMapBytes* x_map_at) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (x_map_at) {
      auto const* from = reinterpret_cast<uint4 const*>(x_map.bytes);
      auto* to = reinterpret_cast<uint4*>(x_map_at->bytes);
#pragma unroll
      for (int i = 0; i < 8; ++i) to[i] = from[i];
      tasks::gemm::ptx::fence_tensormap_release();
    }
    view->x = x;
    view->out = out;
    if (second) {
      second->x = x;
      second->out = out;
    }
    const_cast<std::uint32_t*>(view->call)[0] = tokens;
    const_cast<std::uint32_t*>(view->call)[1] = given_ids ? 1u : 0u;
    const_cast<std::uint32_t*>(view->call)[2] = call_block;
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
                                std::uint32_t tokens, std::uint32_t call_block, std::uint32_t top_k,
                                std::int32_t const* given_ids, float const* given_weights,
                                cudaStream_t stream) {
  std::size_t const slots = given_ids ? std::size_t{tokens} * top_k : 0;
  constexpr unsigned kThreads = 256, kMaxBlocks = 64;
  unsigned const blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((slots + kThreads - 1) / kThreads, 1, kMaxBlocks));
  // The router tile reads x through a map of this call's rows ([tokens][hidden]; rows past them
  // read as zeros), encoded here and written into the tile's operands by set_call.
  tasks::gemm::TensorMapBytes x_map{};
  tasks::gemm::TensorMapBytes* x_map_at = nullptr;
  if (tokens > 0 && reinterpret_cast<std::uintptr_t>(x) % 16 != 0)
    throw Error("loom: x must be 16-byte aligned (the layer reads it 16 bytes at a time)");
  if (route_gemm && !given_ids && tokens > 0) {
    tasks::gemm::encode_a_map(x_map, x, hidden_, tokens, hidden_, kRouteTileTokens,
                              "x (router tile)");
    x_map_at = &const_cast<tasks::gemm::GemmOperands*>(route_gemm->device())->a_map;
  }
  set_call<<<blocks, kThreads, 0, stream>>>(view, second, x, out, tokens, call_block, given_ids,
                                            given_weights, ids.get(), weights.get(), slots, x_map,
                                            x_map_at);
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
  v.route_sync = route_sync.get();
  v.up_emission = up_emission.get();
  v.pair_ticket = v.route_gathers ? pair_ticket.get() : nullptr;
  v.route_partial = route_partial.get();
  v.route_ops = route_gemm ? route_gemm->device() : nullptr;
  v.route_logits = route_logits.get();
}

void LayerBuffers::lower_counters() {
  for (auto* b : {&counts, &fill, &rows_arrived, &up_done, &route_arrived, &route_sync})
    b->fill_bytes(0);
}

}  // namespace loom::moe
