// NCCL communicators for expert parallelism: checked NCCL calls (LOOM_NCCL) and an owning
// NcclCommunicator, created either for every GPU of one process (ncclCommInitAll) or for one rank
// of a multi-process job whose unique id travels through the rendezvous of runtime/bootstrap.hpp.
#pragma once

#include <nccl.h>

#include <chrono>
#include <vector>

#include "runtime/bootstrap.hpp"
#include "runtime/error.hpp"

namespace loom {

[[noreturn]] void throw_nccl_error(ncclResult_t result, char const* call, char const* file,
                                   int line);

// Reports a failed NCCL call on stderr; for destructors, which must not throw.
void warn_nccl_error(ncclResult_t result, char const* call);

// Throws unless the loaded libnccl.so.2 is the release these headers came from: the device API
// (window and device-communicator layouts) has no ABI across releases. Both init functions call it.
void require_matching_nccl_library();

}  // namespace loom

// Every NCCL call goes through LOOM_NCCL: a failure throws loom::Error with NCCL's error string,
// its last error message and where the call was made.
#define LOOM_NCCL(call)                                                       \
  do {                                                                        \
    ncclResult_t const loom_nccl_result_ = (call);                            \
    if (loom_nccl_result_ != ncclSuccess)                                     \
      ::loom::throw_nccl_error(loom_nccl_result_, #call, __FILE__, __LINE__); \
  } while (0)

namespace loom {

// Owns one ncclComm_t (destroyed with the object); moved, never copied. A communicator's rank
// drives exactly one device.
class NcclCommunicator {
 public:
  // One communicator per device, all owned by this process; rank r drives devices[r].
  static std::vector<NcclCommunicator> init_all(std::vector<int> const& devices);

  // This process's rank of a job described by `env` (see RankEnvironment::from_environment):
  // makes env.device current, rank 0 creates the unique id and shares it through env.rendezvous
  // (bounded by `rendezvous_timeout`; loopback only unless `allow_remote_rendezvous`), then every
  // rank joins with ncclCommInitRank, which returns once all `env.world` ranks have joined.
  static NcclCommunicator init_rank(
      RankEnvironment const& env,
      std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(60),
      bool allow_remote_rendezvous = false);

  NcclCommunicator(NcclCommunicator&& other) noexcept;
  NcclCommunicator& operator=(NcclCommunicator&& other) noexcept;
  NcclCommunicator(NcclCommunicator const&) = delete;
  NcclCommunicator& operator=(NcclCommunicator const&) = delete;
  ~NcclCommunicator();

  ncclComm_t get() const { return comm_; }
  std::uint32_t rank() const { return rank_; }
  std::uint32_t world() const { return world_; }
  int device() const { return device_; }

 private:
  // Takes ownership of `comm` (never throws); read_identity() then asks NCCL for its rank, size
  // and device.
  explicit NcclCommunicator(ncclComm_t comm) noexcept : comm_(comm) {}
  void read_identity();
  void destroy() noexcept;

  ncclComm_t comm_ = nullptr;
  std::uint32_t rank_ = 0;
  std::uint32_t world_ = 0;
  int device_ = -1;
};

}  // namespace loom
