// The unfused MoE layer a user would write without Loom, kept as the benchmark's baseline: the
// same function as GpuMoELayer, computed the usual way, one library call or small kernel per step.
//
// One call (T tokens, k slots per token, on one stream):
//   router   (with the fused-router forward only): logits = x · Wrᵀ with cuBLAS (fp32 out), then
//            one thread per token scores them and picks the top k (moe/routing.hpp, as the fused
//            layer does)
//   sort     a key per (token, slot) pair (its expert, E for "no expert"), a CUB histogram of
//            the keys (rows per expert), a CUB radix sort of the pairs by key (stable)
//   counts   the per-expert row counts copied to the host: cuBLAS takes each expert's row count
//            as a host argument, so the host waits here (the one synchronisation of a call)
//   gather   x rows into the permuted [routed][H] matrix, expert after expert
//   up       one cuBLAS GEMM per non-empty expert: [n_e][H] · W1_eᵀ -> [n_e][up_cols] (bf16
//            in/out, fp32 compute); W1_e packed as [up_cols][H] = gate rows, then up rows
//   act      silu(gate) * up for SwiGLU (GELU / ReLU otherwise) -> h [routed][D], bf16
//   down     one cuBLAS GEMM per non-empty expert: [n_e][D] · W2_eᵀ -> y [routed][H], bf16
//   combine  out[t] = sum_j w[t,j] y[row of (t,j)], fp32 in top-k order, bf16 out
// The up and down steps either issue one cublasGemmEx per expert or one cublasGemmGroupedBatchedEx
// over all non-empty experts (ExpertGemmDispatch).
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <vector>

#include "moe/weights.hpp"
#include "runtime/cuda/cublas.hpp"
#include "runtime/cuda/device_buffer.hpp"
#include "runtime/cuda/event.hpp"

namespace loom::moe {

enum class ExpertGemmDispatch : std::uint8_t { per_expert, grouped };

char const* to_string(ExpertGemmDispatch d);

class UnfusedMoELayer {
 public:
  UnfusedMoELayer(MoEConfig const& config, MoEWeights const& weights,
                  ExpertGemmDispatch dispatch = ExpertGemmDispatch::per_expert);
  ~UnfusedMoELayer();
  UnfusedMoELayer(UnfusedMoELayer const&) = delete;
  UnfusedMoELayer& operator=(UnfusedMoELayer const&) = delete;

  MoEConfig const& config() const { return config_; }
  ExpertGemmDispatch dispatch() const { return dispatch_; }
  void set_dispatch(ExpertGemmDispatch dispatch) { dispatch_ = dispatch; }

  // x [tokens][H] -> out [tokens][H], device pointers, with the baseline's own router. Returns
  // once the last kernel is queued; it waits on the host once inside, for the expert counts.
  void forward(bf16 const* x, std::uint32_t tokens, bf16* out, cudaStream_t stream = nullptr);
  // With the caller's routing (device pointers, [tokens][k]; ids outside [0, E) mean no expert).
  // The routing is read in place, not copied.
  void forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids, float const* weights,
               bf16* out, cudaStream_t stream = nullptr);

  // Rows per expert of the last call (already on the host).
  std::vector<std::uint32_t> expert_tokens() const;
  // The routing of the last call made with the baseline's router (synchronises).
  std::vector<std::int32_t> topk_ids() const;
  std::vector<float> topk_weights() const;

 private:
  void route(bf16 const* x, std::uint32_t tokens, cudaStream_t stream);
  void run_experts(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                   float const* weights, bf16* out, cudaStream_t stream);
  // result_e [n_e][w_rows] = in_e [n_e][in_cols] · w_eᵀ for every non-empty expert e; `stage`
  // picks the grouped dispatch's pointer arrays (0: up, 1: down).
  void expert_gemms(int stage, bf16 const* w, std::uint32_t w_rows, bf16 const* in,
                    std::uint32_t in_cols, bf16* result, cudaStream_t stream);

  MoEConfig config_;
  ExpertGemmDispatch dispatch_;
  CublasHandle cublas_;
  // Weights: [E][H], [E][up_cols][H], [E][H][D].
  DeviceBuffer<bf16> router_w_, w1_, w2_;
  // Router: logits [T][E], chosen weights and ids [T][k].
  DeviceBuffer<float> logits_, router_weights_;
  DeviceBuffer<std::int32_t> router_ids_;
  // Sort, per (token, slot) pair [T*k]: expert keys, pair indices, and each pair's permuted row.
  DeviceBuffer<std::uint32_t> keys_, sorted_keys_, pairs_, sorted_pairs_, row_of_pair_;
  DeviceBuffer<int> counts_;  // [E + 1] rows per expert; the last bin: no expert
  DeviceBuffer<unsigned char> cub_temp_;
  std::size_t cub_temp_bytes_ = 0;
  DeviceBuffer<bf16> permuted_, up_out_, h_, y_;  // [T*k][H], [T*k][up_cols], [T*k][D], [T*k][H]
  int* host_counts_ = nullptr;                    // pinned, [E + 1]
  CudaEvent counts_ready_{cudaEventDisableTiming};
  std::vector<std::uint32_t> offsets_;  // [E + 1] first permuted row of each expert
  std::uint32_t routed_tokens_ = 0;     // tokens of the last call with the baseline's router
  std::vector<std::uint32_t> busy_;     // non-empty experts of the call, in order

  // Grouped dispatch: per stage, the A, B, C pointers of each busy expert ([2][3][E], pinned on
  // the host, uploaded once per call) and the host-side shape arrays cuBLAS reads.
  void** host_group_ptrs_ = nullptr;
  DeviceBuffer<void*> group_ptrs_;
  std::vector<cublasOperation_t> op_t_, op_n_;
  std::vector<int> m_, n_, k_, ones_;
  std::vector<float> alpha_, beta_;
};

}  // namespace loom::moe
