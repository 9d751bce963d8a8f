#include "moe/ep_cpu_layer.hpp"

#include <algorithm>
#include <cstring>

namespace loom::moe {

// One virtual rank: its weights (router and its local experts), its local buffers, its view.
struct CpuEpMoELayer::Rank {
  std::vector<bf16> router, w1, w2, pool, h;
  std::vector<std::uint32_t> call, counts, expert_tokens, offsets, tile_base, fill, block_pairs,
      row_source, rows_arrived, up_done, bin_rows, bin_tokens, send_next, sends_done, row_rank,
      row_group, local_tokens, group_rows, group_pairs, group_size, group_tokens, combine_list;
  std::vector<std::uint64_t> last_sent;
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  // The local view's GEMM operands, then the 64-row ones of an expert's last M-tile and the
  // short view that holds them (ep_short_view).
  std::unique_ptr<tasks::gemm::GemmOperands> up_ops, down_ops, short_up_ops, short_down_ops;
  std::unique_ptr<MoEView> short_view;
  std::unique_ptr<EpView> view;
  std::uint32_t last_tokens = 0;
};

namespace {

// Rows [first, first + count) of a [rows][width] tensor.
std::vector<bf16> slice_rows(std::vector<bf16> const& all, std::size_t width, std::size_t first,
                             std::size_t count) {
  return {all.begin() + first * width, all.begin() + (first + count) * width};
}

}  // namespace

CpuEpMoELayer::CpuEpMoELayer(MoEConfig const& config, MoEWeights const& weights,
                             std::uint32_t world, CpuOptions options, std::int32_t silent_rank)
    : config_(config), world_(world) {
  validate_placement(config, world);
  check_shapes(config, weights);
  EpGemms const gemms = choose_ep_gemms(config, world);
  EpView const shape = make_ep_shape(config, EpPlacement{0, world}, gemms);
  regions_ = ep_heap_layout(shape.local, world, shape.local_experts, layout_);
  heap_ = std::make_unique<HostSymmetricHeap>(layout_, world);
  std::vector<bf16> const w1_all = pack_up_projection(config, weights);
  std::uint32_t const el = shape.local_experts;
  std::size_t const up_cols = config.up_columns();
  std::size_t const tokens = config.max_tokens, k = config.top_k;
  std::vector<Graph> graphs;
  std::vector<EpDecoder> decoders;
  for (std::uint32_t r = 0; r < world; ++r) {
    auto rank = std::make_unique<Rank>();
    Rank& m = *rank;
    EpView ep = make_ep_shape(config, EpPlacement{r, world}, gemms);
    ep.skip_sends = static_cast<std::int32_t>(r) == silent_rank ? 1u : 0u;
    MoEView& v = ep.local;
    m.router = weights.router;
    m.w1 = slice_rows(w1_all, up_cols * config.hidden, std::size_t{r} * el, el);
    m.w2 =
        slice_rows(weights.down, std::size_t{config.hidden} * config.ffn, std::size_t{r} * el, el);
    m.pool.resize(std::size_t{ep.pool_rows} * config.hidden);
    m.h.resize(std::size_t{ep.pool_rows} * config.ffn);
    m.call.assign(kCallWords, 0);
    m.counts.assign(config.experts, 0);
    m.expert_tokens.assign(config.experts, 0);
    m.offsets.assign(el + 1, 0);
    m.tile_base.assign(el + 1, 0);
    m.fill.assign(el, 0);
    m.block_pairs.assign(v.max_blocks, 0);
    m.row_source.assign(ep.pool_rows, 0);
    m.row_rank.assign(ep.pool_rows, 0);
    m.row_group.assign(ep.pool_rows, 0);
    m.rows_arrived.assign(v.max_mtiles, 0);
    m.up_done.assign(v.max_mtiles, 0);
    m.bin_rows.assign(ep.bins(), 0);
    m.bin_tokens.assign(std::size_t{ep.bins()} * tokens, 0);
    m.last_sent.assign(world, 0);
    m.send_next.assign(1, 0);
    m.sends_done.assign(1, 0);
    m.local_tokens.assign(el, 0);
    m.group_rows.assign(el, 0);
    m.group_pairs.assign(el, 0);
    m.group_size.assign(el, 0);
    m.group_tokens.assign(std::size_t{el} * tokens, 0);
    m.combine_list.assign(el, 0);
    m.ids.assign(tokens * k, -1);
    m.weights.assign(tokens * k, 0.0f);
    v.call = m.call.data();
    v.router_w = m.router.data();
    v.w1 = m.w1.data();
    v.w2 = m.w2.data();
    v.topk_ids = m.ids.data();
    v.topk_weights = m.weights.data();
    v.counts = m.counts.data();
    v.expert_tokens = m.expert_tokens.data();
    v.offsets = m.offsets.data();
    v.tile_base = m.tile_base.data();
    v.fill = m.fill.data();
    v.block_pairs = m.block_pairs.data();
    v.pool = m.pool.data();
    v.row_source = m.row_source.data();
    v.h = m.h.data();
    v.y = heap_->local<bf16>(r, regions_.y);
    v.rows_arrived = m.rows_arrived.data();
    v.up_done = m.up_done.data();
    ep.inbox = heap_->local<std::uint32_t>(r, regions_.inbox);
    ep.inbox_flag = heap_->local<std::uint64_t>(r, regions_.inbox_flag);
    ep.ack = heap_->local<std::uint64_t>(r, regions_.ack);
    ep.chunks = heap_->local<ChunkRecord>(r, regions_.chunks);
    ep.recv_meta = heap_->local<RowMeta>(r, regions_.recv_meta);
    ep.recv_rows = heap_->local<bf16>(r, regions_.recv_rows);
    ep.group_done = heap_->local<std::uint32_t>(r, regions_.group_done);
    ep.bin_rows = m.bin_rows.data();
    ep.bin_tokens = m.bin_tokens.data();
    ep.last_sent = m.last_sent.data();
    ep.send_next = m.send_next.data();
    ep.sends_done = m.sends_done.data();
    ep.row_rank = m.row_rank.data();
    ep.row_group = m.row_group.data();
    ep.local_tokens = m.local_tokens.data();
    ep.group_rows = m.group_rows.data();
    ep.group_pairs = m.group_pairs.data();
    ep.group_size = m.group_size.data();
    ep.group_tokens = m.group_tokens.data();
    ep.combine_list = m.combine_list.data();
    ExpertSide const side{el, ep.pool_rows};
    auto const operands = [&](tasks::gemm::GemmDesc const& d, tasks::gemm::GemmConfig const& g) {
      return std::make_unique<tasks::gemm::GemmOperands>(tasks::gemm::make_operands(d, g));
    };
    tasks::gemm::GemmDesc const up = up_gemm_desc(config, m.pool.data(), m.w1.data(), m.h.data(),
                                                  side),
                                down = down_gemm_desc(config, m.h.data(), m.w2.data(), v.y, side);
    m.up_ops = operands(up, gemms.main.up);
    m.down_ops = operands(down, gemms.main.down);
    v.up_ops = m.up_ops.get();
    v.down_ops = m.down_ops.get();
    if (gemms.has_short) {
      m.short_up_ops = operands(up, gemms.short_tiles.up);
      m.short_down_ops = operands(down, gemms.short_tiles.down);
      m.short_view =
          std::make_unique<MoEView>(ep_short_view(v, m.short_up_ops.get(), m.short_down_ops.get()));
      v.short_view = m.short_view.get();
    }
    m.view = std::make_unique<EpView>(ep);
    graphs.push_back(build_ep_graph(ep, m.view.get()));
    decoders.emplace_back(m.view.get());
    ranks_.push_back(std::move(rank));
  }
  options.subscribers = std::max(options.subscribers, 1u);
  executor_ = std::make_unique<CpuExecutor<EpPipeline, EpDecoder>>(
      std::move(graphs), options, heap_.get(), std::move(decoders));
}

CpuEpMoELayer::~CpuEpMoELayer() = default;

void CpuEpMoELayer::forward(std::vector<EpRankCall> const& calls) {
  if (calls.size() != world_)
    throw Error("loom: " + std::to_string(calls.size()) + " rank calls for a layer over " +
                std::to_string(world_) + " ranks");
  for (std::uint32_t r = 0; r < world_; ++r) {
    EpRankCall const& c = calls[r];
    Rank& m = *ranks_[r];
    if (c.tokens > config_.max_tokens)
      throw Error("loom: rank " + std::to_string(r) + ": " + std::to_string(c.tokens) +
                  " tokens exceed max_tokens=" + std::to_string(config_.max_tokens));
    if ((c.ids == nullptr) != (c.weights == nullptr))
      throw Error("loom: rank " + std::to_string(r) + ": routing needs both ids and weights");
    if (c.ids) {
      std::size_t const n = std::size_t{c.tokens} * config_.top_k;
      std::copy(c.ids, c.ids + n, m.ids.begin());
      std::copy(c.weights, c.weights + n, m.weights.begin());
      for (std::uint32_t t = 0; t < c.tokens; ++t) {
        std::int32_t offender = 0;
        if (std::uint32_t const bad = check_given_routing(m.view->local, t, offender))
          throw Error("loom: rank " + std::to_string(r) +
                      ": invalid routing: " + RouteTokens::describe_routing(bad, t, offender));
      }
    }
    m.call[0] = c.tokens;
    m.call[1] = c.ids ? 1u : 0u;
    m.call[2] = m.view->local.token_block;  // dispatch works in token blocks: the layer's
    m.view->local.x = c.x;
    m.view->local.out = c.out;
    m.last_tokens = c.tokens;
  }
  try {
    executor_->run();
  } catch (Error const&) {
    lower_counters();
    throw;
  }
}

void CpuEpMoELayer::lower_counters() {
  // A failed call may leave counters raised and messages half sent on any rank: every rank
  // starts the next call from a clean heap (epochs keep growing, so nothing old is mistaken).
  heap_->zero();
  for (auto& rank : ranks_) {
    Rank& m = *rank;
    for (auto* v : {&m.counts, &m.fill, &m.rows_arrived, &m.up_done, &m.bin_rows, &m.send_next,
                    &m.sends_done, &m.group_rows, &m.group_pairs})
      std::fill(v->begin(), v->end(), 0u);
    std::fill(m.last_sent.begin(), m.last_sent.end(), 0u);
  }
}

std::vector<std::uint32_t> CpuEpMoELayer::expert_tokens(std::uint32_t rank) const {
  return ranks_.at(rank)->expert_tokens;
}

std::vector<std::uint32_t> CpuEpMoELayer::local_expert_rows(std::uint32_t rank) const {
  return ranks_.at(rank)->local_tokens;
}

std::vector<std::int32_t> CpuEpMoELayer::topk_ids(std::uint32_t rank) const {
  Rank const& m = *ranks_.at(rank);
  return {m.ids.begin(), m.ids.begin() + std::size_t{m.last_tokens} * config_.top_k};
}

std::vector<float> CpuEpMoELayer::topk_weights(std::uint32_t rank) const {
  Rank const& m = *ranks_.at(rank);
  return {m.weights.begin(), m.weights.begin() + std::size_t{m.last_tokens} * config_.top_k};
}

void CpuEpMoELayer::set_write_log(RemoteWriteLog* log) {
  heap_->set_write_log(log);
}

}  // namespace loom::moe
