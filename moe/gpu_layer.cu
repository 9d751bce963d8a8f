#include "moe/gpu_layer.cuh"

namespace loom::moe {

namespace {

// The per-call words, written on the stream ahead of the persistent kernel.
__global__ void set_call(MoEView* view, bf16 const* x, bf16* out, std::uint32_t tokens,
                         std::uint32_t given) {
  view->x = x;
  view->out = out;
  const_cast<std::uint32_t*>(view->call)[0] = tokens;
  const_cast<std::uint32_t*>(view->call)[1] = given;
}

template <class T>
DeviceBuffer<T> zeros(std::size_t n) {
  DeviceBuffer<T> b(n);
  b.fill_bytes(0);
  return b;
}

}  // namespace

GpuMoELayer::GpuMoELayer(MoEConfig const& config, MoEWeights const& weights, GpuOptions options,
                         tasks::gemm::MmaPath path)
    : config_(config), shape_(make_view_shape(config, choose_expert_gemms(config, path))) {
  ExpertGemmConfigs const gemms = choose_expert_gemms(config, path);
  check_shapes(config, weights);
  std::size_t const rows = std::size_t{config.max_tokens} * config.top_k;
  router_ = DeviceBuffer<bf16>(weights.router);
  w1_ = DeviceBuffer<bf16>(pack_up_projection(config, weights));
  w2_ = DeviceBuffer<bf16>(weights.down);
  pool_ = DeviceBuffer<bf16>(rows * config.hidden);
  h_ = DeviceBuffer<bf16>(rows * config.ffn);
  call_ = zeros<std::uint32_t>(2);
  counts_ = zeros<std::uint32_t>(config.experts);
  expert_tokens_ = zeros<std::uint32_t>(config.experts);
  offsets_ = zeros<std::uint32_t>(config.experts + 1);
  tile_base_ = zeros<std::uint32_t>(config.experts + 1);
  fill_ = zeros<std::uint32_t>(config.experts);
  block_pairs_ = zeros<std::uint32_t>(shape_.max_blocks);
  row_source_ = zeros<std::uint32_t>(rows);
  rows_arrived_ = zeros<std::uint32_t>(shape_.max_mtiles);
  up_done_ = zeros<std::uint32_t>(shape_.max_mtiles);
  block_done_ = zeros<std::uint32_t>(shape_.max_blocks);
  ids_ = DeviceBuffer<std::int32_t>(rows);
  weights_ = DeviceBuffer<float>(rows);
  y_ = DeviceBuffer<float>(rows * config.hidden);

  MoEView v = shape_;
  v.call = call_.get();
  v.router_w = router_.get();
  v.w1 = w1_.get();
  v.w2 = w2_.get();
  v.topk_ids = ids_.get();
  v.topk_weights = weights_.get();
  v.counts = counts_.get();
  v.expert_tokens = expert_tokens_.get();
  v.offsets = offsets_.get();
  v.tile_base = tile_base_.get();
  v.fill = fill_.get();
  v.block_pairs = block_pairs_.get();
  v.pool = pool_.get();
  v.row_source = row_source_.get();
  v.h = h_.get();
  v.y = y_.get();
  v.rows_arrived = rows_arrived_.get();
  v.up_done = up_done_.get();
  v.block_done = block_done_.get();
  up_gemm_ = std::make_unique<tasks::gemm::DeviceGemm>(
      up_gemm_desc(config, pool_.get(), w1_.get(), h_.get()), gemms.up);
  down_gemm_ = std::make_unique<tasks::gemm::DeviceGemm>(
      down_gemm_desc(config, h_.get(), w2_.get(), y_.get()), gemms.down);
  v.up_ops = up_gemm_->device();
  v.down_ops = down_gemm_->device();
  view_ = DeviceBuffer<MoEView>(std::vector<MoEView>{v});
  executor_ = std::make_unique<GpuExecutor<MoEPipeline>>(build_moe_graph(v, view_.get()), options);
}

void GpuMoELayer::launch(bf16 const* x, std::uint32_t tokens, bool given, bf16* out,
                         cudaStream_t stream) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this layer");
  last_tokens_ = tokens;
  set_call<<<1, 1, 0, stream>>>(view_.get(), x, out, tokens, given ? 1u : 0u);
  LOOM_CUDA(cudaGetLastError());
  executor_->launch(stream);
}

void GpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, bf16* out, cudaStream_t stream) {
  launch(x, tokens, false, out, stream);
}

void GpuMoELayer::forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                          float const* weights, bf16* out, cudaStream_t stream) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this layer");
  std::size_t const n = std::size_t{tokens} * config_.top_k;
  LOOM_CUDA(
      cudaMemcpyAsync(ids_.get(), ids, n * sizeof(std::int32_t), cudaMemcpyDeviceToDevice, stream));
  LOOM_CUDA(cudaMemcpyAsync(weights_.get(), weights, n * sizeof(float), cudaMemcpyDeviceToDevice,
                            stream));
  launch(x, tokens, true, out, stream);
}

void GpuMoELayer::lower_counters() {
  counts_.fill_bytes(0);
  fill_.fill_bytes(0);
  rows_arrived_.fill_bytes(0);
  up_done_.fill_bytes(0);
  block_done_.fill_bytes(0);
}

void GpuMoELayer::check(cudaStream_t stream) {
  try {
    executor_->check(stream);
  } catch (Error const&) {
    // A failed call may leave its counters raised; a stuck one still runs, and lowering them
    // would wait behind it.
    if (!executor_->stuck()) lower_counters();
    throw;
  }
}

std::vector<std::uint32_t> GpuMoELayer::expert_tokens() const {
  return expert_tokens_.download();
}

std::vector<std::int32_t> GpuMoELayer::topk_ids() const {
  auto all = ids_.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

std::vector<float> GpuMoELayer::topk_weights() const {
  auto all = weights_.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

}  // namespace loom::moe
