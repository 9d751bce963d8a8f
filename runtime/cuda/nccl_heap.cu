#include <cstring>
#include <string>
#include <utility>

#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/nccl_heap.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace loom {
namespace {

// World rank -> index in this rank's LSA team (what ncclGetLsaPointer takes).
struct LsaPeers {
  int index[kMaxRanks];
};

// Writes rank r's window base, as this device reaches it, to out[r] for every rank.
__global__ void read_lsa_bases(ncclWindow_t window, LsaPeers peers, std::uint32_t world,
                               unsigned char** out) {
  for (std::uint32_t r = threadIdx.x; r < world; r += blockDim.x)
    out[r] = static_cast<unsigned char*>(ncclGetLsaPointer(window, 0, peers.index[r]));
}

std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granule) {
  return (bytes + granule - 1) / granule * granule;
}

void warn_if(ncclResult_t r, char const* call) noexcept {
  if (r != ncclSuccess) warn_nccl_error(r, call);
}

// Runs `step` on every heap inside one ncclGroupStart/End, each with its device current. A step
// that throws still closes the group.
template <class Heaps, class Step>
void grouped(Heaps& heaps, Step step) {
  LOOM_NCCL(ncclGroupStart());
  try {
    for (auto& h : heaps) {
      LOOM_CUDA(cudaSetDevice(h->device()));
      step(*h);
    }
  } catch (...) {
    warn_if(ncclGroupEnd(), "ncclGroupEnd (closing a failed group)");
    throw;
  }
  LOOM_NCCL(ncclGroupEnd());
}

}  // namespace

NcclSymmetricHeap::NcclSymmetricHeap(NcclCommunicator const& comm, std::uint64_t bytes, Deferred)
    : comm_(comm.get()),
      device_(comm.device()),
      window_bytes_(round_up(bytes == 0 ? 1 : bytes, NCCL_WIN_REQUIRED_ALIGNMENT)) {
  if (comm_ == nullptr) throw Error("loom: NcclSymmetricHeap needs a live communicator");
  if (comm.world() > static_cast<std::uint32_t>(kMaxRanks))
    throw Error("loom: a symmetric heap spans at most " + std::to_string(kMaxRanks) +
                " ranks; this communicator has " + std::to_string(comm.world()));
  view_.bytes = bytes;
  view_.rank = comm.rank();
  view_.world = comm.world();
  ScopedDevice const on(device_);
  LOOM_NCCL(ncclMemAlloc(&allocation_, window_bytes_));
  // Zeroed before registration, so no peer can see old contents: peers reach the window only
  // after the collective registration, which this rank enters after the memset has completed.
  cudaError_t err = cudaMemsetAsync(allocation_, 0, window_bytes_, nullptr);
  if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
  if (err != cudaSuccess) {
    free_memory();
    throw_cuda_error(err, "cudaMemsetAsync(window, 0) + cudaStreamSynchronize", __FILE__, __LINE__);
  }
}

NcclSymmetricHeap::NcclSymmetricHeap(NcclCommunicator const& comm, std::uint64_t bytes)
    : NcclSymmetricHeap(comm, bytes, Deferred{}) {
  // The object is complete here: if a step throws, the destructor undoes the earlier ones.
  ScopedDevice const on(device_);
  register_window();
  registered_ = true;
  create_dev_comm();
  has_dev_comm_ = true;
  resolve_peer_bases();
}

NcclSymmetricHeapSet NcclSymmetricHeap::create_all(std::vector<NcclCommunicator> const& comms,
                                                   std::uint64_t bytes) {
  if (comms.empty()) throw Error("loom: NcclSymmetricHeap::create_all needs communicators");
  for (std::size_t r = 0; r < comms.size(); ++r)
    if (comms[r].rank() != r || comms[r].world() != comms.size())
      throw Error(
          "loom: NcclSymmetricHeap::create_all needs every rank of one communicator, in "
          "rank order; position " +
          std::to_string(r) + " holds rank " + std::to_string(comms[r].rank()) + " of " +
          std::to_string(comms[r].world()));
  NcclSymmetricHeapSet set;
  for (auto const& c : comms)
    set.heaps_.push_back(
        std::unique_ptr<NcclSymmetricHeap>(new NcclSymmetricHeap(c, bytes, Deferred{})));
  ScopedDevice const keep(comms.front().device());
  grouped(set.heaps_, [](NcclSymmetricHeap& h) { h.register_window(); });
  for (auto& h : set.heaps_) h->registered_ = true;
  grouped(set.heaps_, [](NcclSymmetricHeap& h) { h.create_dev_comm(); });
  for (auto& h : set.heaps_) h->has_dev_comm_ = true;
  for (auto& h : set.heaps_) h->resolve_peer_bases();
  return set;
}

void NcclSymmetricHeap::register_window() {
  LOOM_NCCL(
      ncclCommWindowRegister(comm_, allocation_, window_bytes_, &window_, NCCL_WIN_COLL_SYMMETRIC));
}

void NcclSymmetricHeap::create_dev_comm() {
  // Zeroed, then one LSA barrier. Every gin* field stays 0: a non-zero one switches GIN on, which
  // then needs a NIC even on one node.
  ncclDevCommRequirements requirements;
  std::memset(&requirements, 0, sizeof requirements);
  requirements.lsaBarrierCount = 1;
  LOOM_NCCL(ncclDevCommCreate(comm_, &requirements, &dev_comm_));
}

void NcclSymmetricHeap::resolve_peer_bases() {
  ScopedDevice const on(device_);
  ncclTeam const lsa = ncclTeamLsa(dev_comm_);
  ncclTeam const world = ncclTeamWorld(dev_comm_);
  LsaPeers peers{};
  for (std::uint32_t r = 0; r < view_.world; ++r) {
    if (!ncclTeamRankIsMember(lsa, world, static_cast<int>(r)))
      throw Error("loom: NCCL symmetric heap of rank " + std::to_string(view_.rank) + " (device " +
                  std::to_string(device_) + "): peer rank " + std::to_string(r) +
                  " is not reachable by load/store (this rank's LSA team holds " +
                  std::to_string(lsa.nRanks) + " of " + std::to_string(view_.world) +
                  " ranks); every rank must share one NVLink domain: GIN is not supported");
    peers.index[r] = ncclTeamRankToTeam(lsa, world, static_cast<int>(r));
  }
  DeviceBuffer<unsigned char*> bases(view_.world);
  read_lsa_bases<<<1, 32>>>(window_, peers, view_.world, bases.get());
  LOOM_CUDA(cudaGetLastError());
  std::vector<unsigned char*> const host = bases.download();
  for (std::uint32_t r = 0; r < view_.world; ++r) {
    if (host[r] == nullptr)
      throw Error("loom: NCCL gave rank " + std::to_string(view_.rank) +
                  " a null window pointer for peer rank " + std::to_string(r));
    view_.bases[r] = host[r];
  }
}

void NcclSymmetricHeap::zero(cudaStream_t stream) const {
  ScopedDevice const on(device_);
  LOOM_CUDA(cudaMemsetAsync(allocation_, 0, window_bytes_, stream));
}

void NcclSymmetricHeap::destroy_dev_comm() noexcept {
  if (!has_dev_comm_) return;
  warn_if(ncclDevCommDestroy(comm_, &dev_comm_), "ncclDevCommDestroy");
  has_dev_comm_ = false;
}

void NcclSymmetricHeap::deregister_window() noexcept {
  if (!registered_) return;
  warn_if(ncclCommWindowDeregister(comm_, window_), "ncclCommWindowDeregister");
  registered_ = false;
  window_ = nullptr;
}

void NcclSymmetricHeap::free_memory() noexcept {
  if (allocation_ == nullptr) return;
  warn_if(ncclMemFree(allocation_), "ncclMemFree");
  allocation_ = nullptr;
}

NcclSymmetricHeap::~NcclSymmetricHeap() {
  ScopedDevice const on(device_, std::nothrow);
  destroy_dev_comm();
  deregister_window();
  free_memory();
}

NcclSymmetricHeapSet& NcclSymmetricHeapSet::operator=(NcclSymmetricHeapSet&& other) noexcept {
  if (this != &other) {
    destroy();
    heaps_ = std::move(other.heaps_);
    other.heaps_.clear();
  }
  return *this;
}

NcclSymmetricHeapSet::~NcclSymmetricHeapSet() {
  destroy();
}

void NcclSymmetricHeapSet::destroy() noexcept {
  if (heaps_.empty()) return;
  ScopedDevice const keep(heaps_.front()->device(), std::nothrow);
  // Each collective step for every rank in one group, in the reverse order of creation.
  auto each_grouped = [this](char const* what, void (NcclSymmetricHeap::*step)() noexcept) {
    warn_if(ncclGroupStart(), what);
    for (auto& h : heaps_) {
      cudaError_t const err = cudaSetDevice(h->device());
      if (err != cudaSuccess)
        std::fprintf(stderr, "loom: cudaSetDevice(%d) failed during %s: %s\n", h->device(), what,
                     cudaGetErrorString(err));
      ((*h).*step)();
    }
    warn_if(ncclGroupEnd(), what);
  };
  each_grouped("ncclDevCommDestroy group", &NcclSymmetricHeap::destroy_dev_comm);
  each_grouped("ncclCommWindowDeregister group", &NcclSymmetricHeap::deregister_window);
  for (auto& h : heaps_) {
    ScopedDevice const on(h->device(), std::nothrow);
    h->free_memory();
  }
  heaps_.clear();  // every heap's destructor now finds nothing left to undo
}

}  // namespace loom
