#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/ep_baseline.cuh"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/event.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace loom::moe {

namespace {

// The plan kernel's block: one warp per destination rank scans that destination's per-warp
// counts, so the block has 32 warps and the destination mask is one 32-bit word.
constexpr std::uint32_t kPlanThreads = 1024;
constexpr std::uint32_t kPlanWarps = kPlanThreads / 32;
constexpr std::uint32_t kMaxRanks = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

void check_launch() {
  LOOM_CUDA(cudaGetLastError());
}

// Bit d set when one of the token's k experts lives on rank d.
__device__ std::uint32_t destination_mask(std::int32_t const* token_ids, std::uint32_t k,
                                          std::uint32_t experts, std::uint32_t experts_per_rank) {
  std::uint32_t mask = 0;
  for (std::uint32_t j = 0; j < k; ++j) {
    std::int32_t const e = token_ids[j];
    if (e >= 0 && static_cast<std::uint32_t>(e) < experts)
      mask |= 1u << (static_cast<std::uint32_t>(e) / experts_per_rank);
  }
  return mask;
}

// One block of kPlanThreads threads per rank. Packed send rows: destination 0's rows first, then
// destination 1's, ...; within a destination, its tokens in order. Writes row_of[t][d] (the
// token's send row for destination d, -1 when none) and rows_to[d] (rows for destination d).
// Handles tokens == 0 (rows_to all 0).
__global__ void __launch_bounds__(kPlanThreads)
    plan_dispatch(std::int32_t const* ids, std::uint32_t tokens, std::uint32_t k,
                  std::uint32_t experts, std::uint32_t experts_per_rank, std::uint32_t world,
                  std::int32_t* row_of, int* rows_to) {
  __shared__ std::uint32_t rows[kMaxRanks];  // per destination: rows, then its next free row
  __shared__ std::uint32_t warp_first[kMaxRanks][kPlanWarps];  // first row of each warp's tokens
  std::uint32_t const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x < world) rows[threadIdx.x] = 0;
  __syncthreads();

  // Pass 1: rows per destination.
  for (std::uint32_t base = 0; base < tokens; base += kPlanThreads) {
    std::uint32_t const t = base + threadIdx.x;
    std::uint32_t const mask =
        t < tokens ? destination_mask(ids + std::size_t{t} * k, k, experts, experts_per_rank) : 0;
    for (std::uint32_t d = 0; d < world; ++d) {
      int const n = __syncthreads_count((mask >> d) & 1u);
      if (threadIdx.x == 0) rows[d] += static_cast<std::uint32_t>(n);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t first = 0;
    for (std::uint32_t d = 0; d < world; ++d) {
      rows_to[d] = static_cast<int>(rows[d]);
      std::uint32_t const n = rows[d];
      rows[d] = first;
      first += n;
    }
  }
  __syncthreads();

  // Pass 2: each (token, destination)'s row = the destination's next free row + the tokens before
  // it in this chunk that go there (warps' counts scanned by warp d, lanes' by a ballot).
  unsigned const lanes_before = (1u << lane) - 1u;
  for (std::uint32_t base = 0; base < tokens; base += kPlanThreads) {
    std::uint32_t const t = base + threadIdx.x;
    std::uint32_t const mask =
        t < tokens ? destination_mask(ids + std::size_t{t} * k, k, experts, experts_per_rank) : 0;
    for (std::uint32_t d = 0; d < world; ++d) {
      unsigned const goes = __ballot_sync(kFullWarp, (mask >> d) & 1u);
      if (lane == 0) warp_first[d][warp] = static_cast<std::uint32_t>(__popc(goes));
    }
    __syncthreads();
    if (warp < world) {
      std::uint32_t const n = warp_first[warp][lane];
      std::uint32_t inclusive = n;
      for (std::uint32_t step = 1; step < 32; step *= 2) {
        std::uint32_t const below = __shfl_up_sync(kFullWarp, inclusive, step);
        if (lane >= step) inclusive += below;
      }
      warp_first[warp][lane] = rows[warp] + inclusive - n;
      __syncwarp();
      if (lane == 31) rows[warp] += inclusive;
    }
    __syncthreads();
    for (std::uint32_t d = 0; d < world; ++d) {
      bool const goes_here = (mask >> d) & 1u;
      unsigned const goes = __ballot_sync(kFullWarp, goes_here);
      if (t < tokens)
        row_of[std::size_t{t} * world + d] =
            goes_here
                ? static_cast<std::int32_t>(warp_first[d][warp] +
                                            static_cast<std::uint32_t>(__popc(goes & lanes_before)))
                : -1;
    }
    __syncthreads();  // warp_first is rewritten by the next chunk
  }
}

// One block per token: copies x[t] into each of its send rows (16-byte loads; H is a multiple of
// 64) with the row's record: the destination's local expert id of each slot (-1 where the slot's
// expert lives elsewhere or is none) and the slot's weight.
__global__ void pack_rows(bf16 const* x, std::int32_t const* ids, float const* weights,
                          std::uint32_t hidden, std::uint32_t k, std::uint32_t experts,
                          std::uint32_t experts_per_rank, std::uint32_t world,
                          std::int32_t const* row_of, bf16* send_x, std::int32_t* send_ids,
                          float* send_weights) {
  std::uint32_t const t = blockIdx.x;
  auto const* src = reinterpret_cast<uint4 const*>(x + std::size_t{t} * hidden);
  for (std::uint32_t d = 0; d < world; ++d) {
    std::int32_t const row = row_of[std::size_t{t} * world + d];
    if (row < 0) continue;
    auto* dst = reinterpret_cast<uint4*>(send_x + std::size_t(row) * hidden);
    for (std::uint32_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
    for (std::uint32_t j = threadIdx.x; j < k; j += blockDim.x) {
      std::int32_t const e = ids[std::size_t{t} * k + j];
      bool const here = e >= 0 && static_cast<std::uint32_t>(e) < experts &&
                        static_cast<std::uint32_t>(e) / experts_per_rank == d;
      send_ids[std::size_t(row) * k + j] =
          here ? static_cast<std::int32_t>(static_cast<std::uint32_t>(e) % experts_per_rank) : -1;
      send_weights[std::size_t(row) * k + j] = weights[std::size_t{t} * k + j];
    }
  }
}

// One block per token: out[t] = sum over destinations d in rank order of returned[row_of[t][d]],
// fp32, 8 columns per thread step; 0 for a token with no send row.
__global__ void combine_partials(bf16 const* returned, std::uint32_t hidden, std::uint32_t world,
                                 std::int32_t const* row_of, bf16* out) {
  std::uint32_t const t = blockIdx.x;
  for (std::uint32_t c8 = threadIdx.x; c8 < hidden / 8; c8 += blockDim.x) {
    float acc[8] = {};
    for (std::uint32_t d = 0; d < world; ++d) {
      std::int32_t const row = row_of[std::size_t{t} * world + d];
      if (row < 0) continue;
      uint4 const v = reinterpret_cast<uint4 const*>(returned + std::size_t(row) * hidden)[c8];
      auto const* pairs = reinterpret_cast<__nv_bfloat162 const*>(&v);
      for (int i = 0; i < 4; ++i) {
        float2 const f = __bfloat1622float2(pairs[i]);
        acc[2 * i] += f.x;
        acc[2 * i + 1] += f.y;
      }
    }
    uint4 packed;
    auto* o = reinterpret_cast<__nv_bfloat162*>(&packed);
    for (int i = 0; i < 4; ++i) o[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    reinterpret_cast<uint4*>(out + std::size_t{t} * hidden)[c8] = packed;
  }
}

// NCCL calls of every rank between one ncclGroupStart / ncclGroupEnd (one thread drives all the
// communicators, so each rank's calls must be in the same group); the group is closed when
// issuing throws.
template <class Issue>
void nccl_group(Issue&& issue) {
  LOOM_NCCL(ncclGroupStart());
  try {
    issue();
  } catch (...) {
    ncclResult_t const r = ncclGroupEnd();
    if (r != ncclSuccess) warn_nccl_error(r, "ncclGroupEnd (after a failed call)");
    throw;
  }
  LOOM_NCCL(ncclGroupEnd());
}

// Experts [first, first + count) of the global weights, padded with zero experts up to `padded`
// (the local layer needs top_k <= its experts; padding experts are never routed to).
MoEWeights slice_weights(MoEConfig const& c, MoEWeights const& w, std::uint32_t first,
                         std::uint32_t count, std::uint32_t padded) {
  auto slice = [&](std::vector<bf16> const& all, std::size_t per_expert) {
    std::vector<bf16> part(std::size_t{padded} * per_expert);
    if (!all.empty())
      std::copy(all.begin() + std::size_t{first} * per_expert,
                all.begin() + std::size_t{first + count} * per_expert, part.begin());
    return part;
  };
  std::size_t const h = c.hidden, d = c.ffn;
  MoEWeights part;
  part.router = slice(w.router, h);
  part.gate = slice(w.gate, d * h);
  if (c.activation == Activation::swiglu) part.up = slice(w.up, d * h);
  part.down = slice(w.down, h * d);
  return part;
}

}  // namespace

// One rank's stream, expert layer and buffers, all on its device. Send rows are indexed as the
// plan packs them; receive rows source rank after source rank.
struct UnfusedEpMoE::Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudaEvent> counts_ready;  // made on `device`
  std::unique_ptr<UnfusedMoELayer> experts;
  DeviceBuffer<std::int32_t> row_of;  // [T][P] send row of each (token, destination), -1: none
  DeviceBuffer<int> counts;           // [2P]: rows sent to each rank, then received from each
  int* host_counts = nullptr;         // pinned copy of counts
  DeviceBuffer<bf16> send_x, recv_x, partial, returned;  // [P*T][H] each
  DeviceBuffer<std::int32_t> send_ids, recv_ids;         // [P*T][k] local expert ids
  DeviceBuffer<float> send_weights, recv_weights;        // [P*T][k]
  std::vector<std::size_t> send_first, recv_first;       // [P + 1] first row per peer
  std::uint32_t tokens = 0;                              // of the current call

  ~Rank() {
    // The caller made this rank's device current (UnfusedEpMoE::release).
    if (stream) {
      cudaError_t const e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess)
        std::fprintf(stderr, "loom: cudaStreamSynchronize failed: %s\n", cudaGetErrorString(e));
      cudaStreamDestroy(stream);
    }
    if (host_counts) cudaFreeHost(host_counts);
  }
  std::uint32_t rows_to(std::uint32_t peer) const { return host_counts[peer]; }
  std::uint32_t rows_from(std::uint32_t peer, std::uint32_t world) const {
    return host_counts[world + peer];
  }
};

UnfusedEpMoE::UnfusedEpMoE(MoEConfig const& config, MoEWeights const& weights,
                           std::vector<NcclCommunicator> const& comms, ExpertGemmDispatch dispatch)
    : config_(config) {
  validate(config);
  check_shapes(config, weights);
  std::uint32_t const world = static_cast<std::uint32_t>(comms.size());
  if (world == 0 || world > kMaxRanks)
    throw Error("loom: UnfusedEpMoE needs 1 to " + std::to_string(kMaxRanks) +
                " communicators, got " + std::to_string(world));
  if (config.experts % world != 0)
    throw Error("loom: UnfusedEpMoE: experts=" + std::to_string(config.experts) +
                " is not a multiple of the " + std::to_string(world) + " ranks");
  for (std::uint32_t r = 0; r < world; ++r)
    if (comms[r].rank() != r || comms[r].world() != world)
      throw Error("loom: UnfusedEpMoE: communicator " + std::to_string(r) + " is rank " +
                  std::to_string(comms[r].rank()) + " of " + std::to_string(comms[r].world()) +
                  "; pass every rank of one group, in rank order");
  experts_per_rank_ = config.experts / world;

  MoEConfig local = config;
  local.experts = std::max(experts_per_rank_, config.top_k);
  local.max_tokens = world * config.max_tokens;  // every rank may send it all its tokens
  std::size_t const rows = local.max_tokens, h = config.hidden, k = config.top_k;

  try {
    for (std::uint32_t r = 0; r < world; ++r) {
      ranks_.push_back(std::make_unique<Rank>());
      Rank& rank = *ranks_.back();
      rank.device = comms[r].device();
      rank.comm = comms[r].get();
      ScopedDevice const on(rank.device);
      LOOM_CUDA(cudaStreamCreate(&rank.stream));
      rank.counts_ready = std::make_unique<CudaEvent>(cudaEventDisableTiming);
      LOOM_CUDA(cudaMallocHost(&rank.host_counts, 2 * world * sizeof(int)));
      std::fill(rank.host_counts, rank.host_counts + 2 * world, 0);
      rank.experts = std::make_unique<UnfusedMoELayer>(
          local,
          slice_weights(config, weights, r * experts_per_rank_, experts_per_rank_, local.experts),
          dispatch);
      rank.row_of = DeviceBuffer<std::int32_t>(std::size_t{config.max_tokens} * world);
      rank.counts = DeviceBuffer<int>(2 * world);
      rank.send_x = DeviceBuffer<bf16>(rows * h);
      rank.recv_x = DeviceBuffer<bf16>(rows * h);
      rank.partial = DeviceBuffer<bf16>(rows * h);
      rank.returned = DeviceBuffer<bf16>(rows * h);
      rank.send_ids = DeviceBuffer<std::int32_t>(rows * k);
      rank.recv_ids = DeviceBuffer<std::int32_t>(rows * k);
      rank.send_weights = DeviceBuffer<float>(rows * k);
      rank.recv_weights = DeviceBuffer<float>(rows * k);
      rank.send_first.assign(world + 1, 0);
      rank.recv_first.assign(world + 1, 0);
    }
  } catch (...) {
    release();
    throw;
  }
}

UnfusedEpMoE::~UnfusedEpMoE() {
  release();
}

void UnfusedEpMoE::release() noexcept {
  for (auto& rank : ranks_) {
    if (!rank) continue;
    ScopedDevice const on(rank->device, std::nothrow);
    rank.reset();
  }
  ranks_.clear();
}

void UnfusedEpMoE::forward(std::vector<UnfusedEpCall> const& calls) {
  std::uint32_t const world = this->world();
  if (calls.size() != world)
    throw Error("loom: UnfusedEpMoE::forward got " + std::to_string(calls.size()) + " calls for " +
                std::to_string(world) + " ranks");
  for (std::uint32_t r = 0; r < world; ++r) {
    UnfusedEpCall const& c = calls[r];
    if (c.tokens > config_.max_tokens)
      throw Error("loom: UnfusedEpMoE: rank " + std::to_string(r) + " has " +
                  std::to_string(c.tokens) +
                  " tokens, more than max_tokens=" + std::to_string(config_.max_tokens));
    if (c.tokens > 0 && (!c.x || !c.ids || !c.weights || !c.out))
      throw Error("loom: UnfusedEpMoE: rank " + std::to_string(r) +
                  " has tokens but a null x, ids, weights or out pointer");
  }
  std::uint32_t const hidden = config_.hidden, k = config_.top_k, experts = config_.experts;

  // Plan, and rows per destination exchanged.
  for (std::uint32_t r = 0; r < world; ++r) {
    Rank& rank = *ranks_[r];
    rank.tokens = calls[r].tokens;
    ScopedDevice const on(rank.device);
    plan_dispatch<<<1, kPlanThreads, 0, rank.stream>>>(calls[r].ids, rank.tokens, k, experts,
                                                       experts_per_rank_, world, rank.row_of.get(),
                                                       rank.counts.get());
    check_launch();
  }
  nccl_group([&] {
    for (auto& rank : ranks_)
      for (std::uint32_t peer = 0; peer < world; ++peer) {
        LOOM_NCCL(ncclSend(rank->counts.get() + peer, 1, ncclInt32, static_cast<int>(peer),
                           rank->comm, rank->stream));
        LOOM_NCCL(ncclRecv(rank->counts.get() + world + peer, 1, ncclInt32, static_cast<int>(peer),
                           rank->comm, rank->stream));
      }
  });
  for (std::uint32_t r = 0; r < world; ++r) {
    Rank& rank = *ranks_[r];
    ScopedDevice const on(rank.device);
    LOOM_CUDA(cudaMemcpyAsync(rank.host_counts, rank.counts.get(), 2 * world * sizeof(int),
                              cudaMemcpyDeviceToHost, rank.stream));
    rank.counts_ready->record(rank.stream);
    if (rank.tokens == 0) continue;
    // Packing runs on while the host waits for the counts.
    pack_rows<<<rank.tokens, 128, 0, rank.stream>>>(
        calls[r].x, calls[r].ids, calls[r].weights, hidden, k, experts, experts_per_rank_, world,
        rank.row_of.get(), rank.send_x.get(), rank.send_ids.get(), rank.send_weights.get());
    check_launch();
  }
  for (auto& rank : ranks_) {
    rank->counts_ready->synchronize();
    for (std::uint32_t peer = 0; peer < world; ++peer) {
      rank->send_first[peer + 1] = rank->send_first[peer] + rank->rows_to(peer);
      rank->recv_first[peer + 1] = rank->recv_first[peer] + rank->rows_from(peer, world);
    }
  }

  // Dispatch: rows and their records, grouped per peer pair; empty transfers are left out on
  // both sides (the counts agree).
  nccl_group([&] {
    for (auto& rank : ranks_)
      for (std::uint32_t peer = 0; peer < world; ++peer) {
        int const p = static_cast<int>(peer);
        if (std::size_t const n = rank->rows_to(peer); n > 0) {
          std::size_t const first = rank->send_first[peer];
          LOOM_NCCL(ncclSend(rank->send_x.get() + first * hidden, n * hidden, ncclBfloat16, p,
                             rank->comm, rank->stream));
          LOOM_NCCL(ncclSend(rank->send_ids.get() + first * k, n * k, ncclInt32, p, rank->comm,
                             rank->stream));
          LOOM_NCCL(ncclSend(rank->send_weights.get() + first * k, n * k, ncclFloat32, p,
                             rank->comm, rank->stream));
        }
        if (std::size_t const n = rank->rows_from(peer, world); n > 0) {
          std::size_t const first = rank->recv_first[peer];
          LOOM_NCCL(ncclRecv(rank->recv_x.get() + first * hidden, n * hidden, ncclBfloat16, p,
                             rank->comm, rank->stream));
          LOOM_NCCL(ncclRecv(rank->recv_ids.get() + first * k, n * k, ncclInt32, p, rank->comm,
                             rank->stream));
          LOOM_NCCL(ncclRecv(rank->recv_weights.get() + first * k, n * k, ncclFloat32, p,
                             rank->comm, rank->stream));
        }
      }
  });

  // Each rank's experts on what it received.
  for (auto& rank : ranks_) {
    ScopedDevice const on(rank->device);
    rank->experts->forward(rank->recv_x.get(), static_cast<std::uint32_t>(rank->recv_first.back()),
                           rank->recv_ids.get(), rank->recv_weights.get(), rank->partial.get(),
                           rank->stream);
  }

  // Return: partial rows back to their sources, landing in their send rows.
  nccl_group([&] {
    for (auto& rank : ranks_)
      for (std::uint32_t peer = 0; peer < world; ++peer) {
        int const p = static_cast<int>(peer);
        if (std::size_t const n = rank->rows_from(peer, world); n > 0)
          LOOM_NCCL(ncclSend(rank->partial.get() + rank->recv_first[peer] * hidden, n * hidden,
                             ncclBfloat16, p, rank->comm, rank->stream));
        if (std::size_t const n = rank->rows_to(peer); n > 0)
          LOOM_NCCL(ncclRecv(rank->returned.get() + rank->send_first[peer] * hidden, n * hidden,
                             ncclBfloat16, p, rank->comm, rank->stream));
      }
  });

  // Combine on each source rank.
  for (std::uint32_t r = 0; r < world; ++r) {
    Rank& rank = *ranks_[r];
    if (rank.tokens == 0) continue;
    ScopedDevice const on(rank.device);
    combine_partials<<<rank.tokens, 128, 0, rank.stream>>>(rank.returned.get(), hidden, world,
                                                           rank.row_of.get(), calls[r].out);
    check_launch();
  }
}

void UnfusedEpMoE::synchronize() {
  for (auto& rank : ranks_) {
    ScopedDevice const on(rank->device);
    LOOM_CUDA(cudaStreamSynchronize(rank->stream));
  }
}

std::vector<std::uint32_t> UnfusedEpMoE::received_rows() const {
  std::vector<std::uint32_t> rows;
  for (auto const& rank : ranks_)
    rows.push_back(static_cast<std::uint32_t>(rank->recv_first.back()));
  return rows;
}

}  // namespace loom::moe
