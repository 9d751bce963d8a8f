// The symmetric heap on GPUs: one NCCL symmetric window per rank (ncclMemAlloc'd, zeroed,
// registered with NCCL_WIN_COLL_SYMMETRIC) and a device communicator (one LSA barrier, no GIN).
// view() gives kernels a SymmetricView whose bases[r] is rank r's window as this rank's device
// reaches it by load/store over NVLink (NCCL's LSA pointers), so peer(), put, signal and wait of
// runtime/symmetric.hpp work unchanged on the GPU. Every rank must be LSA-reachable (one NVLink
// domain); GIN (network) ranks are not supported here.
//
// Two ways to own heaps, matching the two kinds of communicator:
//   NcclSymmetricHeap(comm, bytes)           one rank per process (NcclCommunicator::init_rank);
//   NcclSymmetricHeap::create_all(comms, b)  every rank in this process (init_all). The window
//                                            registration, device-communicator creation and their
//                                            teardown are collective, so they are grouped
//                                            (ncclGroupStart/End) across the process's ranks.
// A heap must be destroyed before its communicator.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/cuda/nccl_comm.hpp"
#include "runtime/symmetric.hpp"

namespace loom {

class NcclSymmetricHeapSet;

class NcclSymmetricHeap {
 public:
  // Collective over `comm`'s ranks (each in its own process): every rank passes the same `bytes`
  // (the SymmetricLayout's size). Blocks until every rank has registered its window.
  NcclSymmetricHeap(NcclCommunicator const& comm, std::uint64_t bytes);

  // Collective over this process's communicators (from NcclCommunicator::init_all, in rank order).
  static NcclSymmetricHeapSet create_all(std::vector<NcclCommunicator> const& comms,
                                         std::uint64_t bytes);

  // Collective like the constructor (device communicator destroyed, window deregistered, memory
  // freed). A heap owned by an NcclSymmetricHeapSet has been torn down by the set already.
  ~NcclSymmetricHeap();
  NcclSymmetricHeap(NcclSymmetricHeap const&) = delete;
  NcclSymmetricHeap& operator=(NcclSymmetricHeap const&) = delete;

  // bases[r]: rank r's window in this device's address space (bases[rank] is this rank's own);
  // bytes: the size asked for; rank and world: the communicator's.
  SymmetricView view() const { return view_; }
  // This rank's window as bases[rank] names it, so view().peer(r, local() + offset) is rank r's
  // copy of the same object. Device memory of device().
  void* local() const { return view_.bases[view_.rank]; }
  // Zeroes the whole window on `stream` (a stream of device(), or 0). No peer may write into this
  // window meanwhile: order that with a signal or a barrier.
  void zero(cudaStream_t stream) const;

  std::uint64_t bytes() const { return view_.bytes; }
  std::uint64_t window_bytes() const { return window_bytes_; }  // bytes rounded up for NCCL
  int device() const { return device_; }
  ncclWindow_t window() const { return window_; }
  ncclDevComm const& dev_comm() const { return dev_comm_; }

 private:
  friend class NcclSymmetricHeapSet;
  struct Deferred {};

  // Allocates and zeroes the window memory only; the collective steps follow.
  NcclSymmetricHeap(NcclCommunicator const& comm, std::uint64_t bytes, Deferred);
  // The collective steps; each may run inside a group. The caller sets registered_ and
  // has_dev_comm_ once the step (or its group) has completed.
  void register_window();
  void create_dev_comm();
  // Local: reads every peer's LSA pointer into view_; throws if a peer is unreachable.
  void resolve_peer_bases();
  void destroy_dev_comm() noexcept;   // collective
  void deregister_window() noexcept;  // collective
  void free_memory() noexcept;

  ncclComm_t comm_;
  int device_;
  std::uint64_t window_bytes_;
  void* allocation_ = nullptr;  // from ncclMemAlloc
  ncclWindow_t window_ = nullptr;
  ncclDevComm dev_comm_{};
  bool registered_ = false;
  bool has_dev_comm_ = false;
  SymmetricView view_{};
};

// The heaps of every rank of one process; tears them down together (the collective steps grouped,
// which destroying them one by one could not do without deadlocking).
class NcclSymmetricHeapSet {
 public:
  NcclSymmetricHeapSet(NcclSymmetricHeapSet&&) noexcept = default;
  NcclSymmetricHeapSet& operator=(NcclSymmetricHeapSet&& other) noexcept;
  ~NcclSymmetricHeapSet();

  std::size_t size() const { return heaps_.size(); }
  NcclSymmetricHeap& operator[](std::size_t rank) { return *heaps_[rank]; }
  NcclSymmetricHeap const& operator[](std::size_t rank) const { return *heaps_[rank]; }

 private:
  friend class NcclSymmetricHeap;
  NcclSymmetricHeapSet() = default;
  void destroy() noexcept;

  std::vector<std::unique_ptr<NcclSymmetricHeap>> heaps_;
};

}  // namespace loom
