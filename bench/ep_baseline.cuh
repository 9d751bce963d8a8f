// The unfused expert-parallel MoE layer a user would write without Loom, kept as the EP
// benchmark's baseline: experts spread over the P GPUs of one process, NCCL all-to-all (grouped
// ncclSend / ncclRecv) for dispatch and combine, and the single-GPU UnfusedMoELayer
// (bench/moe_baseline.cuh) for each rank's experts.
//
// Placement: E experts, P ranks, expert e on rank e / (E/P) as its local expert e % (E/P).
// One call, every rank on its own stream, one host thread driving all of them:
//   plan      one block per rank: each token's destination ranks (those holding one of its
//             experts), rows per destination, and the packed row of each (token, destination),
//             destinations one after another, tokens in order within each
//   counts    rows per destination exchanged (grouped ncclSend / ncclRecv), copied to the host;
//             the host waits here, as real EP frameworks do, to size the transfers
//   pack      token rows and per-row records (the destination's local expert ids, -1 for slots
//             whose expert lives elsewhere, and the k weights) into the send buffer; a token goes
//             once to each destination, however many of its experts live there
//   dispatch  rows and records to their destinations (grouped ncclSend / ncclRecv), arriving
//             source rank after source rank
//   experts   the rank's UnfusedMoELayer on what it received, with the received routing: each
//             row's weighted sum over this rank's experts (it waits on the host once inside)
//   return    those partial rows back to their source ranks, in the order they were sent
//   combine   one block per token: out[t] = sum over destinations, in rank order, of the token's
//             partial rows (fp32, bf16 out); a token with no expert gets 0
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "bench/moe_baseline.cuh"
#include "runtime/cuda/nccl_comm.hpp"

namespace loom::moe {

// One rank's part of a call: device pointers on that rank's device. ids [tokens][k] are GLOBAL
// expert ids (outside [0, E): no expert), weights [tokens][k]; x [tokens][H], out [tokens][H].
struct UnfusedEpCall {
  bf16 const* x = nullptr;
  std::uint32_t tokens = 0;
  std::int32_t const* ids = nullptr;
  float const* weights = nullptr;
  bf16* out = nullptr;
};

class UnfusedEpMoE {
 public:
  // config.experts: E over all ranks; config.max_tokens: per rank. comms[r] is rank r of one
  // ncclCommInitAll group (NcclCommunicator::init_all) and must outlive this object. Every buffer
  // is sized here for the worst case: every token of every rank sent to every rank.
  UnfusedEpMoE(MoEConfig const& config, MoEWeights const& weights,
               std::vector<NcclCommunicator> const& comms,
               ExpertGemmDispatch dispatch = ExpertGemmDispatch::per_expert);
  ~UnfusedEpMoE();
  UnfusedEpMoE(UnfusedEpMoE const&) = delete;
  UnfusedEpMoE& operator=(UnfusedEpMoE const&) = delete;

  MoEConfig const& config() const { return config_; }
  std::uint32_t world() const { return static_cast<std::uint32_t>(ranks_.size()); }

  // calls[r] for every rank r. Each rank's work runs on a stream the object owns, created as a
  // blocking stream: it waits for what the caller queued on the legacy default stream. Returns
  // once the last kernel is queued; the host waits inside, for the counts and in each rank's
  // expert layer.
  void forward(std::vector<UnfusedEpCall> const& calls);
  // Waits for every rank's stream.
  void synchronize();

  // Rows each rank received in the last call (one per token and destination rank).
  std::vector<std::uint32_t> received_rows() const;

 private:
  struct Rank;
  void release() noexcept;

  MoEConfig config_;
  std::uint32_t experts_per_rank_ = 0;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace loom::moe
