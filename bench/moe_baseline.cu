#include <algorithm>
#include <cub/device/device_histogram.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "bench/moe_baseline.cuh"
#include "moe/routing.hpp"
#include "runtime/cuda/cublas.hpp"

namespace loom::moe {

namespace {

void check_launch() {
  LOOM_CUDA(cudaGetLastError());
}

// Bits a radix sort needs for keys in [0, experts].
int key_bits(std::uint32_t experts) {
  int bits = 1;
  while ((std::uint32_t{1} << bits) <= experts) ++bits;
  return bits;
}

// One thread per token: scores its E logits in place and picks the top k, exactly as the fused
// layer's route task does (moe/routing.hpp).
__global__ void score_and_select(float* logits, std::uint32_t tokens, std::uint32_t experts,
                                 std::uint32_t k, RouterScore score, bool renormalize,
                                 std::int32_t* ids, float* weights) {
  std::uint32_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float* row = logits + std::size_t{t} * experts;
  score_logits(row, experts, score);
  select_top_k(row, experts, k, renormalize, ids + std::size_t{t} * k,
               weights + std::size_t{t} * k);
}

// Sort key of each (token, slot) pair: its expert, or `experts` when it has none.
__global__ void expert_keys(std::int32_t const* ids, std::uint32_t pairs, std::uint32_t experts,
                            std::uint32_t* keys, std::uint32_t* pair_index) {
  std::uint32_t const p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  std::int32_t const e = ids[p];
  keys[p] =
      e >= 0 && static_cast<std::uint32_t>(e) < experts ? static_cast<std::uint32_t>(e) : experts;
  pair_index[p] = p;
}

// One block per permuted row: copies token row x[pair / k] into it (16-byte loads; H is a
// multiple of 64) and records where the pair went. Rows sorted past the last expert (no expert)
// are skipped.
__global__ void gather_rows(bf16 const* x, std::uint32_t hidden, std::uint32_t k,
                            std::uint32_t experts, std::uint32_t const* sorted_keys,
                            std::uint32_t const* sorted_pairs, bf16* permuted,
                            std::uint32_t* row_of_pair) {
  std::uint32_t const row = blockIdx.x;
  if (sorted_keys[row] >= experts) return;
  std::uint32_t const pair = sorted_pairs[row];
  if (threadIdx.x == 0) row_of_pair[pair] = row;
  auto const* src = reinterpret_cast<uint4 const*>(x + std::size_t{pair / k} * hidden);
  auto* dst = reinterpret_cast<uint4*>(permuted + std::size_t{row} * hidden);
  for (std::uint32_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
}

// h[r][i] = act(up_out[r][...]) for `rows` rows: silu(gate) * up with gate in columns [0, D) and
// up in [D, 2D) for SwiGLU; gelu / relu of the single D-wide half otherwise.
__global__ void activate(bf16 const* up_out, std::uint32_t rows, std::uint32_t ffn,
                         Activation activation, bf16* h) {
  std::size_t const n = std::size_t{rows} * ffn;
  std::uint32_t const up_cols = activation == Activation::swiglu ? 2 * ffn : ffn;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::size_t const r = i / ffn, c = i % ffn;
    float const g = __bfloat162float(up_out[r * up_cols + c]);
    float v;
    if (activation == Activation::swiglu)
      v = silu(g) * __bfloat162float(up_out[r * up_cols + ffn + c]);
    else if (activation == Activation::gelu)
      v = gelu_tanh(g);
    else
      v = relu(g);
    h[i] = __float2bfloat16(v);
  }
}

// One block per token: out[t] = sum_j w[t,j] y[row_of_pair[t*k+j]] over the slots with an
// expert, accumulated in fp32 in top-k order, 8 columns per thread step.
__global__ void combine_weighted(bf16 const* y, std::uint32_t hidden, std::uint32_t k,
                                 std::uint32_t experts, std::int32_t const* ids,
                                 float const* weights, std::uint32_t const* row_of_pair,
                                 bf16* out) {
  std::uint32_t const t = blockIdx.x;
  for (std::uint32_t c8 = threadIdx.x; c8 < hidden / 8; c8 += blockDim.x) {
    float acc[8] = {};
    for (std::uint32_t j = 0; j < k; ++j) {
      std::uint32_t const p = t * k + j;
      std::int32_t const e = ids[p];
      if (e < 0 || static_cast<std::uint32_t>(e) >= experts) continue;
      float const w = weights[p];
      uint4 const v = reinterpret_cast<uint4 const*>(y + std::size_t{row_of_pair[p]} * hidden)[c8];
      auto const* pairs = reinterpret_cast<__nv_bfloat162 const*>(&v);
      for (int i = 0; i < 4; ++i) {
        float2 const f = __bfloat1622float2(pairs[i]);
        acc[2 * i] += w * f.x;
        acc[2 * i + 1] += w * f.y;
      }
    }
    uint4 packed;
    auto* o = reinterpret_cast<__nv_bfloat162*>(&packed);
    for (int i = 0; i < 4; ++i) o[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    reinterpret_cast<uint4*>(out + std::size_t{t} * hidden)[c8] = packed;
  }
}

std::uint32_t blocks_for(std::size_t n, std::uint32_t threads) {
  return static_cast<std::uint32_t>((n + threads - 1) / threads);
}

}  // namespace

char const* to_string(ExpertGemmDispatch d) {
  return d == ExpertGemmDispatch::grouped ? "grouped" : "per_expert";
}

UnfusedMoELayer::UnfusedMoELayer(MoEConfig const& config, MoEWeights const& weights,
                                 ExpertGemmDispatch dispatch)
    : config_(config), dispatch_(dispatch) {
  validate(config);
  check_shapes(config, weights);
  std::size_t const e = config.experts, h = config.hidden, d = config.ffn;
  std::size_t const up_cols = config.up_columns();
  std::size_t const pairs = std::size_t{config.max_tokens} * config.top_k;

  router_w_ = DeviceBuffer<bf16>(weights.router);
  w2_ = DeviceBuffer<bf16>(weights.down);
  // W1 packed per expert as one [up_cols][H] matrix: gate rows, then (SwiGLU) up rows.
  w1_ = DeviceBuffer<bf16>(e * up_cols * h);
  for (std::size_t x = 0; x < e; ++x) {
    LOOM_CUDA(cudaMemcpy(w1_.get() + x * up_cols * h, weights.gate.data() + x * d * h,
                         d * h * sizeof(bf16), cudaMemcpyHostToDevice));
    if (config.activation == Activation::swiglu)
      LOOM_CUDA(cudaMemcpy(w1_.get() + x * up_cols * h + d * h, weights.up.data() + x * d * h,
                           d * h * sizeof(bf16), cudaMemcpyHostToDevice));
  }

  logits_ = DeviceBuffer<float>(std::size_t{config.max_tokens} * e);
  router_weights_ = DeviceBuffer<float>(pairs);
  router_ids_ = DeviceBuffer<std::int32_t>(pairs);
  keys_ = DeviceBuffer<std::uint32_t>(pairs);
  sorted_keys_ = DeviceBuffer<std::uint32_t>(pairs);
  pairs_ = DeviceBuffer<std::uint32_t>(pairs);
  sorted_pairs_ = DeviceBuffer<std::uint32_t>(pairs);
  row_of_pair_ = DeviceBuffer<std::uint32_t>(pairs);
  counts_ = DeviceBuffer<int>(e + 1);
  permuted_ = DeviceBuffer<bf16>(pairs * h);
  up_out_ = DeviceBuffer<bf16>(pairs * up_cols);
  h_ = DeviceBuffer<bf16>(pairs * d);
  y_ = DeviceBuffer<bf16>(pairs * h);

  // CUB scratch: the larger of what the sort and the histogram need at max_tokens.
  std::size_t sort_bytes = 0, histogram_bytes = 0;
  int const n = static_cast<int>(pairs);
  LOOM_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_.get(), sorted_keys_.get(),
                                            pairs_.get(), sorted_pairs_.get(), n, 0,
                                            key_bits(config.experts)));
  LOOM_CUDA(cub::DeviceHistogram::HistogramEven(
      nullptr, histogram_bytes, keys_.get(), counts_.get(), static_cast<int>(e + 2),
      std::uint32_t{0}, static_cast<std::uint32_t>(e + 1), n));
  cub_temp_bytes_ = std::max(sort_bytes, histogram_bytes);
  cub_temp_ = DeviceBuffer<unsigned char>(cub_temp_bytes_);

  LOOM_CUDA(cudaMallocHost(&host_counts_, (e + 1) * sizeof(int)));
  LOOM_CUDA(cudaMallocHost(&host_group_ptrs_, 6 * e * sizeof(void*)));
  std::fill(host_counts_, host_counts_ + e + 1, 0);
  group_ptrs_ = DeviceBuffer<void*>(6 * e);
  op_t_.assign(e, CUBLAS_OP_T);
  op_n_.assign(e, CUBLAS_OP_N);
  m_.assign(2 * e, 0);
  n_.assign(2 * e, 0);
  k_.assign(2 * e, 0);
  ones_.assign(e, 1);
  alpha_.assign(e, 1.0f);
  beta_.assign(e, 0.0f);
  offsets_.assign(e + 1, 0);
}

UnfusedMoELayer::~UnfusedMoELayer() {
  if (host_counts_) cudaFreeHost(host_counts_);
  if (host_group_ptrs_) cudaFreeHost(host_group_ptrs_);
}

void UnfusedMoELayer::forward(bf16 const* x, std::uint32_t tokens, bf16* out, cudaStream_t stream) {
  route(x, tokens, stream);
  run_experts(x, tokens, router_ids_.get(), router_weights_.get(), out, stream);
}

void UnfusedMoELayer::forward(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                              float const* weights, bf16* out, cudaStream_t stream) {
  run_experts(x, tokens, ids, weights, out, stream);
}

void UnfusedMoELayer::route(bf16 const* x, std::uint32_t tokens, cudaStream_t stream) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this baseline");
  routed_tokens_ = tokens;
  if (tokens == 0) return;
  float const one = 1.0f, zero = 0.0f;
  int const e = static_cast<int>(config_.experts), h = static_cast<int>(config_.hidden);
  check_cublas(cublasSetStream(cublas_.get(), stream), "cublasSetStream");
  // logits [T][E] (row-major) = x [T][H] · Wrᵀ, i.e. column-major [E][T] = Wr · xᵀ.
  check_cublas(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, e, static_cast<int>(tokens), h,
                            &one, router_w_.get(), CUDA_R_16BF, h, x, CUDA_R_16BF, h, &zero,
                            logits_.get(), CUDA_R_32F, e, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (router)");
  score_and_select<<<blocks_for(tokens, 128), 128, 0, stream>>>(
      logits_.get(), tokens, config_.experts, config_.top_k, config_.router, config_.renormalize,
      router_ids_.get(), router_weights_.get());
  check_launch();
}

void UnfusedMoELayer::run_experts(bf16 const* x, std::uint32_t tokens, std::int32_t const* ids,
                                  float const* weights, bf16* out, cudaStream_t stream) {
  if (tokens > config_.max_tokens)
    throw Error("loom: " + std::to_string(tokens) + " tokens exceed max_tokens=" +
                std::to_string(config_.max_tokens) + " of this baseline");
  std::uint32_t const experts = config_.experts, k = config_.top_k;
  std::uint32_t const hidden = config_.hidden, ffn = config_.ffn;
  std::uint32_t const pairs = tokens * k;
  if (tokens == 0) {
    std::fill(host_counts_, host_counts_ + experts + 1, 0);
    return;
  }
  check_cublas(cublasSetStream(cublas_.get(), stream), "cublasSetStream");

  // Sort: keys, the rows per expert (sent to the host), the permutation.
  expert_keys<<<blocks_for(pairs, 256), 256, 0, stream>>>(ids, pairs, experts, keys_.get(),
                                                          pairs_.get());
  check_launch();
  std::size_t temp_bytes = cub_temp_bytes_;
  LOOM_CUDA(cub::DeviceHistogram::HistogramEven(
      cub_temp_.get(), temp_bytes, keys_.get(), counts_.get(), static_cast<int>(experts + 2),
      std::uint32_t{0}, experts + 1, static_cast<int>(pairs), stream));
  LOOM_CUDA(cudaMemcpyAsync(host_counts_, counts_.get(), (experts + 1) * sizeof(int),
                            cudaMemcpyDeviceToHost, stream));
  counts_ready_.record(stream);
  temp_bytes = cub_temp_bytes_;
  LOOM_CUDA(cub::DeviceRadixSort::SortPairs(cub_temp_.get(), temp_bytes, keys_.get(),
                                            sorted_keys_.get(), pairs_.get(), sorted_pairs_.get(),
                                            static_cast<int>(pairs), 0, key_bits(experts), stream));
  gather_rows<<<pairs, 128, 0, stream>>>(x, hidden, k, experts, sorted_keys_.get(),
                                         sorted_pairs_.get(), permuted_.get(), row_of_pair_.get());
  check_launch();

  // The host needs each expert's row count for cuBLAS: wait for them (sort and gather run on).
  counts_ready_.synchronize();
  busy_.clear();
  for (std::uint32_t e = 0; e < experts; ++e) {
    offsets_[e + 1] = offsets_[e] + static_cast<std::uint32_t>(host_counts_[e]);
    if (host_counts_[e] > 0) busy_.push_back(e);
  }
  std::uint32_t const routed = offsets_[experts];

  if (routed > 0) {
    std::uint32_t const up_cols = config_.up_columns();
    expert_gemms(0, w1_.get(), up_cols, permuted_.get(), hidden, up_out_.get(), stream);
    std::size_t const act_n = std::size_t{routed} * ffn;
    std::uint32_t const act_blocks =
        static_cast<std::uint32_t>(std::min<std::size_t>(blocks_for(act_n, 256), 65535u * 4));
    activate<<<act_blocks, 256, 0, stream>>>(up_out_.get(), routed, ffn, config_.activation,
                                             h_.get());
    check_launch();
    expert_gemms(1, w2_.get(), hidden, h_.get(), ffn, y_.get(), stream);
  }
  combine_weighted<<<tokens, 128, 0, stream>>>(y_.get(), hidden, k, experts, ids, weights,
                                               row_of_pair_.get(), out);
  check_launch();
}

void UnfusedMoELayer::expert_gemms(int stage, bf16 const* w, std::uint32_t w_rows, bf16 const* in,
                                   std::uint32_t in_cols, bf16* result, cudaStream_t stream) {
  float const one = 1.0f, zero = 0.0f;
  int const m = static_cast<int>(w_rows), kk = static_cast<int>(in_cols);
  std::size_t const w_stride = std::size_t{w_rows} * in_cols;
  auto operands = [&](std::uint32_t e) {
    struct {
      bf16 const* a;
      bf16 const* b;
      bf16* c;
    } o{w + e * w_stride, in + std::size_t{offsets_[e]} * in_cols,
        result + std::size_t{offsets_[e]} * w_rows};
    return o;
  };
  if (dispatch_ == ExpertGemmDispatch::per_expert) {
    // Row-major result_e [n_e][m] is column-major [m][n_e] = W_e · in_eᵀ.
    for (std::uint32_t e : busy_) {
      auto const o = operands(e);
      check_cublas(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, m, host_counts_[e], kk,
                                &one, o.a, CUDA_R_16BF, kk, o.b, CUDA_R_16BF, kk, &zero, o.c,
                                CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (expert)");
    }
    return;
  }

  // Grouped: one group of one problem per busy expert. The pointer arrays of both stages go up
  // in one copy at the first stage, since the host knows all of them once the counts are in.
  std::size_t const experts = config_.experts;
  std::size_t const groups = busy_.size();
  if (stage == 0) {
    std::uint32_t const up_cols = config_.up_columns();
    for (int s = 0; s < 2; ++s) {
      void** base = host_group_ptrs_ + s * 3 * experts;
      for (std::size_t g = 0; g < groups; ++g) {
        std::uint32_t const e = busy_[g];
        std::uint32_t const rows = s == 0 ? up_cols : config_.hidden;
        std::uint32_t const cols = s == 0 ? config_.hidden : config_.ffn;
        bf16 const* ws = s == 0 ? w1_.get() : w2_.get();
        bf16 const* ins = s == 0 ? permuted_.get() : h_.get();
        bf16* outs = s == 0 ? up_out_.get() : y_.get();
        base[g] = const_cast<bf16*>(ws + e * std::size_t{rows} * cols);
        base[experts + g] = const_cast<bf16*>(ins + std::size_t{offsets_[e]} * cols);
        base[2 * experts + g] = outs + std::size_t{offsets_[e]} * rows;
      }
    }
    LOOM_CUDA(cudaMemcpyAsync(group_ptrs_.get(), host_group_ptrs_, 6 * experts * sizeof(void*),
                              cudaMemcpyHostToDevice, stream));
  }
  int* ms = m_.data() + stage * experts;
  int* ns = n_.data() + stage * experts;
  int* ks = k_.data() + stage * experts;
  for (std::size_t g = 0; g < groups; ++g) {
    ms[g] = m;
    ns[g] = host_counts_[busy_[g]];
    ks[g] = kk;
  }
  void** dev = group_ptrs_.get() + stage * 3 * experts;
  check_cublas(
      cublasGemmGroupedBatchedEx(cublas_.get(), op_t_.data(), op_n_.data(), ms, ns, ks,
                                 alpha_.data(), const_cast<void const* const*>(dev), CUDA_R_16BF,
                                 ks, const_cast<void const* const*>(dev + experts), CUDA_R_16BF, ks,
                                 beta_.data(), dev + 2 * experts, CUDA_R_16BF, ms,
                                 static_cast<int>(groups), ones_.data(), CUBLAS_COMPUTE_32F),
      "cublasGemmGroupedBatchedEx (experts)");
}

std::vector<std::uint32_t> UnfusedMoELayer::expert_tokens() const {
  return std::vector<std::uint32_t>(host_counts_, host_counts_ + config_.experts);
}

std::vector<std::int32_t> UnfusedMoELayer::topk_ids() const {
  auto all = router_ids_.download();
  all.resize(std::size_t{routed_tokens_} * config_.top_k);
  return all;
}

std::vector<float> UnfusedMoELayer::topk_weights() const {
  auto all = router_weights_.download();
  all.resize(std::size_t{routed_tokens_} * config_.top_k);
  return all;
}

}  // namespace loom::moe
