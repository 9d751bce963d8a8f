#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "runtime/cuda/check.hpp"
#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/cuda/scoped_device.hpp"

namespace loom {

void throw_nccl_error(ncclResult_t result, char const* call, char const* file, int line) {
  char const* last = ncclGetLastError(nullptr);
  throw Error(std::string("loom: NCCL error ") + ncclGetErrorString(result) + " in " + call +
              " at " + file + ":" + std::to_string(line) +
              (last && *last ? std::string(" (") + last + ")" : std::string()));
}

void warn_nccl_error(ncclResult_t result, char const* call) {
  char const* last = ncclGetLastError(nullptr);
  std::fprintf(stderr, "loom: NCCL error %s in %s%s%s%s\n", ncclGetErrorString(result), call,
               last && *last ? " (" : "", last ? last : "", last && *last ? ")" : "");
}

void require_matching_nccl_library() {
  int loaded = 0;
  LOOM_NCCL(ncclGetVersion(&loaded));
  if (loaded != NCCL_VERSION_CODE)
    throw Error("loom: built against NCCL " + std::to_string(NCCL_MAJOR) + "." +
                std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + " (version code " +
                std::to_string(NCCL_VERSION_CODE) +
                ") but the loaded libnccl.so.2 reports version code " + std::to_string(loaded) +
                "; the device API has no stable ABI: put the matching library first in "
                "LD_LIBRARY_PATH");
}

void NcclCommunicator::read_identity() {
  int rank = 0, world = 0;
  LOOM_NCCL(ncclCommUserRank(comm_, &rank));
  LOOM_NCCL(ncclCommCount(comm_, &world));
  LOOM_NCCL(ncclCommCuDevice(comm_, &device_));
  rank_ = static_cast<std::uint32_t>(rank);
  world_ = static_cast<std::uint32_t>(world);
}

std::vector<NcclCommunicator> NcclCommunicator::init_all(std::vector<int> const& devices) {
  if (devices.empty()) throw Error("loom: NcclCommunicator::init_all needs at least one device");
  require_matching_nccl_library();
  int const available = cuda_device_count();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= available)
      throw Error("loom: NcclCommunicator::init_all: device " + std::to_string(devices[i]) +
                  " (rank " + std::to_string(i) + ") does not exist; this machine has " +
                  std::to_string(available) + " CUDA device(s)");
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        throw Error("loom: NcclCommunicator::init_all: device " + std::to_string(devices[i]) +
                    " is named twice (ranks " + std::to_string(j) + " and " + std::to_string(i) +
                    "); every rank needs its own GPU");
  }
  ScopedDevice const keep(devices.front());  // ncclCommInitAll switches devices
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  LOOM_NCCL(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  // Adopt every handle before anything can throw, so none leaks.
  std::vector<NcclCommunicator> out;
  out.reserve(comms.size());
  for (ncclComm_t c : comms) out.push_back(NcclCommunicator(c));
  for (auto& c : out) c.read_identity();
  return out;
}

NcclCommunicator NcclCommunicator::init_rank(RankEnvironment const& env,
                                             std::chrono::milliseconds rendezvous_timeout,
                                             bool allow_remote_rendezvous) {
  int const available = cuda_device_count();
  if (env.device < 0 || env.device >= available)
    throw Error("loom: rank " + std::to_string(env.rank) + " was given CUDA device " +
                std::to_string(env.device) + " but this machine has " + std::to_string(available) +
                " device(s)");
  require_matching_nccl_library();
  LOOM_CUDA(cudaSetDevice(env.device));

  ncclUniqueId id{};
  Blob mine;
  if (env.rank == 0) {
    LOOM_NCCL(ncclGetUniqueId(&id));
    mine.assign(reinterpret_cast<unsigned char const*>(&id),
                reinterpret_cast<unsigned char const*>(&id) + sizeof id);
  }
  RendezvousOptions options;
  options.timeout = rendezvous_timeout;
  options.allow_remote = allow_remote_rendezvous;
  Blob const shared = share_blob(env.rendezvous, env.rank, env.world, mine, options);
  if (shared.size() != sizeof id)
    throw Error("loom: rank " + std::to_string(env.rank) + " received a " +
                std::to_string(shared.size()) + "-byte unique id through '" + env.rendezvous +
                "'; NCCL's is " + std::to_string(sizeof id) + " bytes");
  std::memcpy(&id, shared.data(), sizeof id);

  ncclComm_t comm = nullptr;
  LOOM_NCCL(ncclCommInitRank(&comm, static_cast<int>(env.world), id, static_cast<int>(env.rank)));
  NcclCommunicator out(comm);
  out.read_identity();
  if (out.rank() != env.rank || out.world() != env.world || out.device() != env.device)
    throw Error("loom: NCCL reports rank " + std::to_string(out.rank()) + " of " +
                std::to_string(out.world()) + " on device " + std::to_string(out.device()) +
                ", but this process was started as rank " + std::to_string(env.rank) + " of " +
                std::to_string(env.world) + " on device " + std::to_string(env.device));
  return out;
}

NcclCommunicator::NcclCommunicator(NcclCommunicator&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_(other.rank_),
      world_(other.world_),
      device_(other.device_) {}

NcclCommunicator& NcclCommunicator::operator=(NcclCommunicator&& other) noexcept {
  if (this != &other) {
    destroy();
    comm_ = std::exchange(other.comm_, nullptr);
    rank_ = other.rank_;
    world_ = other.world_;
    device_ = other.device_;
  }
  return *this;
}

NcclCommunicator::~NcclCommunicator() {
  destroy();
}

void NcclCommunicator::destroy() noexcept {
  if (comm_ == nullptr) return;
  ncclResult_t const r = ncclCommDestroy(comm_);
  if (r != ncclSuccess) warn_nccl_error(r, "ncclCommDestroy");
  comm_ = nullptr;
}

}  // namespace loom
