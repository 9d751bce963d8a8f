#include <algorithm>

#include "moe/ep_gpu_layer.cuh"
#include "runtime/cuda/scoped_device.hpp"

namespace loom::moe {

namespace {

// Experts [first, first + count) of a tensor of `per_expert` elements each.
std::vector<bf16> expert_slice(std::vector<bf16> const& all, std::size_t per_expert,
                               std::size_t first, std::size_t count) {
  return {all.begin() + first * per_expert, all.begin() + (first + count) * per_expert};
}

// Whether two calls have the same arguments (a repeat replays a captured graph).
bool same_call(EpRankCall const& a, EpRankCall const& b) {
  return a.x == b.x && a.tokens == b.tokens && a.out == b.out && a.ids == b.ids &&
         a.weights == b.weights;
}

int current_device(GpuOptions const& options) {
  int device = options.device;
  if (device < 0) LOOM_CUDA(cudaGetDevice(&device));
  return device;
}

}  // namespace

std::uint64_t ep_heap_bytes(MoEConfig const& config, std::uint32_t world) {
  EpView const shape = make_ep_shape(config, EpPlacement{0, world}, choose_ep_gemms(config, world));
  SymmetricLayout layout;
  ep_heap_layout(shape.local, world, shape.local_experts, layout);
  return layout.bytes();
}

GpuEpMoERank::GpuEpMoERank(MoEConfig const& config, MoEWeights const& weights, SymmetricView heap,
                           GpuOptions options, tasks::gemm::MmaPath path, bool silent)
    : config_(config), device_(current_device(options)) {
  ScopedDevice on(device_);
  options.device = device_;
  check_shapes(config, weights);
  std::uint32_t const world = heap.world;
  EpGemms const gemms = choose_ep_gemms(config, world, path);
  shape_ = make_ep_shape(config, EpPlacement{heap.rank, world}, gemms);
  SymmetricLayout layout;
  EpHeapRegions const regions = ep_heap_layout(shape_.local, world, shape_.local_experts, layout);
  if (heap.bytes < layout.bytes())
    throw Error("loom: rank " + std::to_string(heap.rank) + "'s symmetric window has " +
                std::to_string(heap.bytes) + " bytes; the layer needs " +
                std::to_string(layout.bytes()));
  std::uint32_t const el = shape_.local_experts, rank = heap.rank;
  std::size_t const rows = shape_.pool_rows, slots = std::size_t{config.max_tokens} * config.top_k;
  buf_ = std::make_unique<LayerBuffers>(
      config, shape_.local, el, rows, slots, weights.router,
      expert_slice(pack_up_projection(config, weights),
                   std::size_t{config.up_columns()} * config.hidden, std::size_t{rank} * el, el),
      expert_slice(weights.down, std::size_t{config.hidden} * config.ffn, std::size_t{rank} * el,
                   el));
  row_rank_ = zeros<std::uint32_t>(rows);
  row_group_ = zeros<std::uint32_t>(rows);
  bin_rows_ = zeros<std::uint32_t>(shape_.bins());
  bin_tokens_ = DeviceBuffer<std::uint32_t>(std::size_t{shape_.bins()} * config.max_tokens);
  last_sent_ = zeros<std::uint64_t>(world);
  send_next_ = zeros<std::uint32_t>(1);
  sends_done_ = zeros<std::uint32_t>(1);
  local_tokens_ = zeros<std::uint32_t>(el);
  group_rows_ = zeros<std::uint32_t>(el);
  group_pairs_ = zeros<std::uint32_t>(el);
  group_size_ = zeros<std::uint32_t>(el);
  group_tokens_ = DeviceBuffer<std::uint32_t>(std::size_t{el} * config.max_tokens);
  combine_list_ = zeros<std::uint32_t>(el);

  auto* const base = static_cast<unsigned char*>(heap.bases[rank]);
  auto at = [base](Region r) { return base + r.offset; };
  EpView ep = shape_;
  ep.skip_sends = silent ? 1u : 0u;
  MoEView& v = ep.local;
  buf_->bind(v);
  v.y = reinterpret_cast<bf16*>(at(regions.y));
  ep.inbox = reinterpret_cast<std::uint32_t*>(at(regions.inbox));
  ep.inbox_flag = reinterpret_cast<std::uint64_t*>(at(regions.inbox_flag));
  ep.ack = reinterpret_cast<std::uint64_t*>(at(regions.ack));
  ep.chunks = reinterpret_cast<ChunkRecord*>(at(regions.chunks));
  ep.recv_meta = reinterpret_cast<RowMeta*>(at(regions.recv_meta));
  ep.recv_rows = reinterpret_cast<bf16*>(at(regions.recv_rows));
  ep.group_done = reinterpret_cast<std::uint32_t*>(at(regions.group_done));
  ep.bin_rows = bin_rows_.get();
  ep.bin_tokens = bin_tokens_.get();
  ep.last_sent = last_sent_.get();
  ep.send_next = send_next_.get();
  ep.sends_done = sends_done_.get();
  ep.row_rank = row_rank_.get();
  ep.row_group = row_group_.get();
  ep.local_tokens = local_tokens_.get();
  ep.group_rows = group_rows_.get();
  ep.group_pairs = group_pairs_.get();
  ep.group_size = group_size_.get();
  ep.group_tokens = group_tokens_.get();
  ep.combine_list = combine_list_.get();
  // One pair of GEMM operands per M-tile height, over the same buffers.
  ExpertSide const side{el, shape_.pool_rows};
  auto const make_gemms = [&](ExpertGemmConfigs const& g, Gemms& out) {
    out.up = std::make_unique<tasks::gemm::DeviceGemm>(
        up_gemm_desc(config, buf_->pool.get(), buf_->w1.get(), buf_->h.get(), side), g.up);
    out.down = std::make_unique<tasks::gemm::DeviceGemm>(
        down_gemm_desc(config, buf_->h.get(), buf_->w2.get(), v.y, side), g.down);
  };
  make_gemms(gemms.main, gemms_);
  v.up_ops = gemms_.up->device();
  v.down_ops = gemms_.down->device();
  if (gemms.has_short) {
    make_gemms(gemms.short_tiles, short_gemms_);
    short_view_ = DeviceBuffer<MoEView>(std::vector<MoEView>{
        ep_short_view(v, short_gemms_.up->device(), short_gemms_.down->device())});
    v.short_view = short_view_.get();
  }
  view_ = DeviceBuffer<EpView>(std::vector<EpView>{ep});
  // Role 0 receives, role 1 combines: two subscriber warps.
  options.subscribers = std::max(options.subscribers, 2u);
  executor_ = std::make_unique<GpuExecutor<EpPipeline, EpDecoder>>(
      build_ep_graph(ep, view_.get()), options, EpDecoder(view_.get()), heap);
}

void GpuEpMoERank::launch(EpRankCall const& call, cudaStream_t stream) {
  ScopedDevice on(device_);
  check_call(call);
  check_not_stuck();
  bool const repeat = last_launch_ && same_call(*last_launch_, call);
  last_launch_ = call;
  if (graph_.run(repeat, stream, [&](cudaStream_t s) {
        prepare(call, s);
        start(s);
      }))
    ++replayed_;
  last_tokens_ = call.tokens;
}

void GpuEpMoERank::check_not_stuck() const {
  if (executor_->stuck())
    throw Error("loom: rank " + std::to_string(shape_.rank) +
                ": an earlier launch never ended (see its error); it cannot launch again");
}

void GpuEpMoERank::check_call(EpRankCall const& call) const {
  if (call.tokens > config_.max_tokens)
    throw Error("loom: rank " + std::to_string(shape_.rank) + ": " + std::to_string(call.tokens) +
                " tokens exceed max_tokens=" + std::to_string(config_.max_tokens));
  if ((call.ids == nullptr) != (call.weights == nullptr))
    throw Error("loom: rank " + std::to_string(shape_.rank) + ": routing needs ids and weights");
}

void GpuEpMoERank::prepare(EpRankCall const& call, cudaStream_t stream) {
  ScopedDevice on(device_);
  check_call(call);
  // Dispatch works in token blocks: the call's blocks are the layer's.
  buf_->enqueue_call(&view_.get()->local, nullptr, call.x, call.out, call.tokens,
                     shape_.local.token_block, config_.top_k, call.ids, call.weights, stream);
  last_tokens_ = call.tokens;
}

void GpuEpMoERank::start(cudaStream_t stream) {
  ScopedDevice on(device_);
  executor_->launch(stream);
}

void GpuEpMoERank::capture(EpRankCall const& call, cudaStream_t stream) {
  if (graph_.captured()) return;
  ScopedDevice on(device_);
  graph_.capture(stream, [&](cudaStream_t s) {
    prepare(call, s);
    start(s);
    executor_->copy_error_back(s);
  });
}

void GpuEpMoERank::replay(EpRankCall const& call, cudaStream_t stream) {
  ScopedDevice on(device_);
  check_not_stuck();
  graph_.launch(stream);
  last_tokens_ = call.tokens;
}

std::string GpuEpMoERank::failure(cudaStream_t stream) {
  ScopedDevice on(device_);
  std::string message = executor_->failure(stream);
  if (!message.empty()) {
    last_launch_.reset();
    graph_.drop();
  }
  return message;
}

void GpuEpMoERank::restart_at(std::uint64_t epoch) {
  ScopedDevice on(device_);
  last_launch_.reset();
  graph_.drop();
  executor_->restart_at(epoch);
  buf_->lower_counters();
  bin_rows_.fill_bytes(0);
  send_next_.fill_bytes(0);
  sends_done_.fill_bytes(0);
  last_sent_.fill_bytes(0);
  group_rows_.fill_bytes(0);
  group_pairs_.fill_bytes(0);
}

std::vector<std::uint32_t> GpuEpMoERank::expert_tokens() const {
  ScopedDevice on(device_);
  return buf_->expert_tokens.download();
}

std::vector<std::uint32_t> GpuEpMoERank::local_expert_rows() const {
  ScopedDevice on(device_);
  return local_tokens_.download();
}

std::vector<std::int32_t> GpuEpMoERank::topk_ids() const {
  ScopedDevice on(device_);
  auto all = buf_->ids.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

std::vector<float> GpuEpMoERank::topk_weights() const {
  ScopedDevice on(device_);
  auto all = buf_->weights.download();
  all.resize(std::size_t{last_tokens_} * config_.top_k);
  return all;
}

GpuEpMoEGroup::GpuEpMoEGroup(MoEConfig const& config, MoEWeights const& weights,
                             std::vector<int> const& devices, GpuOptions options, int silent_rank) {
  auto const world = static_cast<std::uint32_t>(devices.size());
  validate_placement(config, world);
  comms_ = NcclCommunicator::init_all(devices);
  heaps_ = std::make_unique<NcclSymmetricHeapSet>(
      NcclSymmetricHeap::create_all(comms_, ep_heap_bytes(config, world)));
  for (std::uint32_t r = 0; r < world; ++r) {
    GpuOptions o = options;
    o.device = devices[r];
    ranks_.push_back(std::make_unique<GpuEpMoERank>(config, weights, (*heaps_)[r].view(), o,
                                                    tasks::gemm::MmaPath::wgmma,
                                                    static_cast<int>(r) == silent_rank));
    ScopedDevice on(devices[r]);
    cudaStream_t s = nullptr;
    LOOM_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.push_back(s);
  }
}

GpuEpMoEGroup::~GpuEpMoEGroup() {
  drop_graphs();
  for (std::size_t r = 0; r < streams_.size(); ++r) {
    ScopedDevice on(ranks_[r]->device(), std::nothrow);
    cudaStreamDestroy(streams_[r]);
  }
  ranks_.clear();
  heaps_.reset();  // before the communicators
}

void GpuEpMoEGroup::forward(std::vector<EpRankCall> const& calls) {
  if (calls.size() != world())
    throw Error("loom: " + std::to_string(calls.size()) + " rank calls for a group of " +
                std::to_string(world()) + " GPUs");
  for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->check_call(calls[r]);
  bool const repeat = last_.size() == calls.size() &&
                      std::equal(calls.begin(), calls.end(), last_.begin(), same_call);
  if (!repeat) {
    drop_graphs();
    last_ = calls;
    for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->prepare(calls[r], streams_[r]);
    for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->start(streams_[r]);
    // After every launch: check() then waits for each stream and reads the copy.
    for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->executor().copy_error_back(streams_[r]);
    return;
  }
  // Every rank's graph is captured before any is launched, keeping the launches close.
  try {
    for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->capture(calls[r], streams_[r]);
  } catch (...) {
    drop_graphs();
    throw;
  }
  for (std::uint32_t r = 0; r < world(); ++r) ranks_[r]->replay(calls[r], streams_[r]);
  ++replayed_;
}

void GpuEpMoEGroup::drop_graphs() {
  for (auto& rank : ranks_) rank->drop_graph();
}

void GpuEpMoEGroup::check() {
  std::string message;
  for (std::uint32_t r = 0; r < world(); ++r) {
    std::string const m = ranks_[r]->failure(streams_[r]);
    if (!m.empty()) message += (message.empty() ? "" : "\n") + m;
  }
  if (message.empty()) return;
  drop_graphs();
  last_.clear();
  // Every rank restarts one epoch past the failed call, together, from a clean window.
  std::uint64_t epoch = 0;
  for (auto& rank : ranks_) epoch = std::max(epoch, rank->epoch());
  for (std::uint32_t r = 0; r < world(); ++r) {
    (*heaps_)[r].zero(streams_[r]);
    ranks_[r]->restart_at(epoch + 1);
  }
  for (std::uint32_t r = 0; r < world(); ++r) {
    ScopedDevice on(ranks_[r]->device());
    LOOM_CUDA(cudaStreamSynchronize(streams_[r]));
  }
  throw Error(message);
}

}  // namespace loom::moe
