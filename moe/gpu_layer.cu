#include "moe/gpu_layer.cuh"

namespace loom::moe {

namespace {

// The layer's buffers, once the weights' shapes are checked.
LayerBuffers checked_buffers(MoEConfig const& c, MoEView const& shape, MoEWeights const& w) {
  check_shapes(c, w);
  std::size_t const rows = std::size_t{c.max_tokens} * c.top_k;
  return LayerBuffers(c, shape, c.experts, rows, rows, w.router, pack_up_projection(c, w), w.down);
}

}  // namespace

GpuMoELayer::GpuMoELayer(MoEConfig const& config, MoEWeights const& weights, GpuOptions options,
                         tasks::gemm::MmaPath path)
    : config_(config),
      shapes_(make_layer_shapes(config, path,
                                GpuExecutor<MoEPipeline>::launch_shape(options).grid - 1)),
      buf_(checked_buffers(config, shapes_.main, weights)) {
  std::size_t const rows = std::size_t{config.max_tokens} * config.top_k;
  block_done_ = zeros<std::uint32_t>(shapes_.main.max_call_blocks);
  y_ = DeviceBuffer<bf16>(rows * config.hidden);

  // One view per M-tile height, over the same buffers, each with its own GEMM operands.
  auto const view_of = [&](MoEView v, ExpertGemmConfigs const& gemms, Gemms& g) {
    buf_.bind(v);
    v.y = y_.get();
    v.block_done = block_done_.get();
    g.up = std::make_unique<tasks::gemm::DeviceGemm>(
        up_gemm_desc(config, buf_.pool.get(), buf_.w1.get(), buf_.h.get()), gemms.up);
    g.down = std::make_unique<tasks::gemm::DeviceGemm>(
        down_gemm_desc(config, buf_.h.get(), buf_.w2.get(), y_.get()), gemms.down);
    v.up_ops = g.up->device();
    v.down_ops = g.down->device();
    return v;
  };
  MoEView v = view_of(shapes_.main, shapes_.gemms, gemms_);
  if (shapes_.has_short) {
    short_view_ = DeviceBuffer<MoEView>(
        std::vector<MoEView>{view_of(shapes_.short_tiles, shapes_.short_gemms, short_gemms_)});
    v.short_view = short_view_.get();
  }
  view_ = DeviceBuffer<MoEView>(std::vector<MoEView>{v});
  executor_ = std::make_unique<GpuExecutor<MoEPipeline>>(build_moe_graph(v, view_.get()), options);
}

std::uint32_t GpuMoELayer::mtile_rows(std::uint32_t tokens) const {
  return shapes_.mtile_rows(tokens);
}

std::uint32_t GpuMoELayer::mtiles() const {
  std::uint32_t n = 0;
  LOOM_CUDA(
      cudaMemcpy(&n, buf_.tile_base.get() + config_.experts, sizeof(n), cudaMemcpyDeviceToHost));
  return n;
}

void GpuMoELayer::enqueue(Call const& call, cudaStream_t stream) {
  buf_.enqueue_call(view_.get(), short_view_.get(), call.x, call.out, call.tokens,
                    call_block_for(shapes_.main, call.tokens), config_.top_k, call.ids,
                    call.weights, stream);
  executor_->launch(stream);
}

void GpuMoELayer::launch(Call const& call, cudaStream_t stream) {
  if (call.tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(call.tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this layer");
  if (executor_->stuck())
    throw Error(
        "loom: an earlier launch of this layer never ended (see its error); it cannot "
        "launch again");
  bool const repeat = last_ == call;
  last_ = call;
  if (graph_.run(repeat, stream, [&](cudaStream_t s) { enqueue(call, s); })) ++replayed_;
  last_tokens_ = call.tokens;
}

void GpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, bf16* out, cudaStream_t stream) {
  launch(Call{x, tokens, nullptr, nullptr, out}, stream);
}

void GpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                          float const* weights, bf16* out, cudaStream_t stream) {
  if (ids == nullptr || weights == nullptr)
    throw Error("loom: given routing needs both ids and weights");
  launch(Call{x, tokens, ids, weights, out}, stream);
}

void GpuMoELayer::lower_counters() {
  buf_.lower_counters();
  block_done_.fill_bytes(0);
}

void GpuMoELayer::check(cudaStream_t stream) {
  try {
    executor_->check(stream);
  } catch (Error const&) {
    last_.reset();
    graph_.drop();
    // A failed call may leave its counters raised; a stuck one still runs, and lowering them
    // would wait behind it.
    if (!executor_->stuck()) lower_counters();
    throw;
  }
}

std::vector<std::uint32_t> GpuMoELayer::expert_tokens() const {
  return buf_.expert_tokens.download();
}

std::vector<std::int32_t> GpuMoELayer::topk_ids() const {
  auto all = buf_.ids.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

std::vector<float> GpuMoELayer::topk_weights() const {
  auto all = buf_.weights.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

}  // namespace loom::moe
