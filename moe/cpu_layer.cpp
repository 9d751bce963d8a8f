#include "moe/cpu_layer.hpp"

#include <algorithm>
#include <cstring>

#include "moe/route_task.hpp"

namespace loom::moe {

CpuMoELayer::CpuMoELayer(MoEConfig const& config, MoEWeights const& weights, CpuOptions options,
                         tasks::gemm::MmaPath path)
    : config_(config), shapes_(make_layer_shapes(config, path, options.processors)) {
  MoEView const& shape = shapes_.main;  // the sizes, the same in both views
  check_shapes(config, weights);
  router_ = weights.router;
  w1_ = pack_up_projection(config, weights);
  w2_ = weights.down;
  std::size_t const rows = std::size_t{config.max_tokens} * config.top_k;
  call_.assign(kCallWords, 0);
  counts_.assign(config.experts, 0);
  expert_tokens_.assign(config.experts, 0);
  offsets_.assign(config.experts + 1, 0);
  tile_base_.assign(config.experts + 1, 0);
  fill_.assign(config.experts, 0);
  block_pairs_.assign(shape.max_call_blocks, 0);
  row_source_.assign(rows, 0);
  rows_arrived_.assign(shape.max_mtiles, 0);
  up_done_.assign(shape.max_mtiles, 0);
  block_done_.assign(shape.max_call_blocks, 0);
  route_arrived_.assign(shape.max_routes, 0);
  route_sync_.assign(kRouteSyncWords, 0);
  pair_ticket_.assign(shape.route_gathers ? rows : 0, 0);
  route_partial_.assign(route_partial_size(shape), 0.0f);
  ids_.assign(rows, -1);
  weights_.assign(rows, 0.0f);
  y_.assign(rows * config.hidden, __float2bfloat16(0.0f));
  pool_.resize(rows * config.hidden);
  h_.resize(rows * config.ffn);
  // One view per M-tile height (see LayerShapes), over the same buffers, each with its own GEMM
  // operands.
  auto const view_of = [&](MoEView v, ExpertGemmConfigs const& gemms) {
    v.call = call_.data();
    v.router_w = router_.data();
    v.w1 = w1_.data();
    v.w2 = w2_.data();
    v.topk_ids = ids_.data();
    v.topk_weights = weights_.data();
    v.counts = counts_.data();
    v.expert_tokens = expert_tokens_.data();
    v.offsets = offsets_.data();
    v.tile_base = tile_base_.data();
    v.fill = fill_.data();
    v.block_pairs = block_pairs_.data();
    v.pool = pool_.data();
    v.row_source = row_source_.data();
    v.h = h_.data();
    v.y = y_.data();
    v.rows_arrived = rows_arrived_.data();
    v.up_done = up_done_.data();
    v.block_done = block_done_.data();
    v.route_arrived = route_arrived_.data();
    v.route_sync = route_sync_.data();
    v.up_emission = &up_emission_;
    v.pair_ticket = v.route_gathers ? pair_ticket_.data() : nullptr;
    v.route_partial = route_partial_.data();
    ops_.push_back(std::make_unique<tasks::gemm::GemmOperands>(tasks::gemm::make_operands(
        up_gemm_desc(config, pool_.data(), w1_.data(), h_.data()), gemms.up)));
    v.up_ops = ops_.back().get();
    ops_.push_back(std::make_unique<tasks::gemm::GemmOperands>(tasks::gemm::make_operands(
        down_gemm_desc(config, h_.data(), w2_.data(), y_.data()), gemms.down)));
    v.down_ops = ops_.back().get();
    return v;
  };
  MoEView v = view_of(shapes_.main, shapes_.gemms);
  if (shapes_.has_short) {
    short_view_ = std::make_unique<MoEView>(view_of(shapes_.short_tiles, shapes_.short_gemms));
    v.short_view = short_view_.get();
  }
  view_ = std::make_unique<MoEView>(v);
  std::vector<Graph> graphs;
  graphs.push_back(build_moe_graph(v, view_.get()));
  executor_ = std::make_unique<CpuExecutor<MoEPipeline>>(std::move(graphs), options);
}

void CpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, bf16* out) {
  call_[1] = 0;
  run(x, tokens, out);
}

void CpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                          float const* weights, bf16* out) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this layer");
  std::size_t const n = std::size_t{tokens} * config_.top_k;
  std::copy(ids, ids + n, ids_.begin());
  std::copy(weights, weights + n, weights_.begin());
  for (std::uint32_t t = 0; t < tokens; ++t) {
    std::int32_t offender = 0;
    if (std::uint32_t const bad = check_given_routing(*view_, t, offender))
      throw Error("loom: invalid routing: " + RouteTokens::describe_routing(bad, t, offender));
  }
  call_[1] = 1;
  run(x, tokens, out);
}

void CpuMoELayer::run(bf16 const* x, std::uint32_t tokens, bf16* out) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this layer");
  call_[0] = tokens;
  call_[2] = call_block_for(shapes_.main, tokens);
  for (MoEView* v : {view_.get(), short_view_.get()}) {
    if (!v) continue;
    v->x = x;
    v->out = out;
  }
  last_tokens_ = tokens;
  try {
    executor_->run();
  } catch (Error const&) {
    // A failed call may leave its counters raised: lower them so the next call starts clean.
    std::fill(counts_.begin(), counts_.end(), 0u);
    std::fill(fill_.begin(), fill_.end(), 0u);
    std::fill(rows_arrived_.begin(), rows_arrived_.end(), 0u);
    std::fill(up_done_.begin(), up_done_.end(), 0u);
    std::fill(block_done_.begin(), block_done_.end(), 0u);
    std::fill(route_arrived_.begin(), route_arrived_.end(), 0u);
    std::fill(route_sync_.begin(), route_sync_.end(), 0u);
    throw;
  }
}

std::uint32_t CpuMoELayer::mtile_rows(std::uint32_t tokens) const {
  return shapes_.mtile_rows(tokens);
}

std::uint32_t CpuMoELayer::mtiles() const {
  return tile_base_[config_.experts];
}

std::vector<std::uint32_t> CpuMoELayer::expert_tokens() const {
  return expert_tokens_;
}

std::vector<std::int32_t> CpuMoELayer::topk_ids() const {
  return {ids_.begin(), ids_.begin() + std::size_t{last_tokens_} * config_.top_k};
}

std::vector<float> CpuMoELayer::topk_weights() const {
  return {weights_.begin(), weights_.begin() + std::size_t{last_tokens_} * config_.top_k};
}

}  // namespace loom::moe
