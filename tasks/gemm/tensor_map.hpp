// Host: encodes the GEMM operands' TMA tensor maps with cuTensorMapEncodeTiled, obtained from the
// driver through the runtime (cudaGetDriverEntryPointByVersion), so nothing links -lcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "runtime/cuda/check.hpp"
#include "tasks/gemm/operands.hpp"

namespace loom::tasks::gemm {

static_assert(sizeof(CUtensorMap) == sizeof(TensorMapBytes));

namespace detail {
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 const fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LOOM_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                               cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      throw Error(
          "loom: the CUDA driver does not provide cuTensorMapEncodeTiled (TMA needs "
          "a CUDA 12+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

inline void encode_bf16_tiled(TensorMapBytes& out, void const* base, cuuint32_t rank,
                              cuuint64_t const* dims, cuuint64_t const* strides_bytes,
                              cuuint32_t const* box, char const* what) {
  CUtensorMap map;
  cuuint32_t const element_strides[3] = {1, 1, 1};
  CUresult const r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dims, strides_bytes,
      box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string("loom: gemm: cuTensorMapEncodeTiled failed for ") + what +
                " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  std::memcpy(out.bytes, &map, sizeof map);
}
}  // namespace detail

// An A operand's map: `rows` rows of k bf16 values, `ld` apart, read in boxes of {64, box_rows}
// (2-D {k, rows}, 128-byte swizzle; rows and columns past the extent read as zeros).
inline void encode_a_map(TensorMapBytes& out, void const* a, std::uint32_t k, std::uint64_t rows,
                         std::uint64_t ld, std::uint32_t box_rows, char const* what) {
  cuuint64_t const dims[2] = {k, rows};
  cuuint64_t const strides[1] = {ld * 2};
  cuuint32_t const box[2] = {kBlockK, box_rows};
  detail::encode_bf16_tiled(out, a, 2, dims, strides, box, what);
}

// Fills op.a_map (2-D {k, a_rows}, box {64, block_m}: encode_a_map) and op.b_map (3-D {k, n,
// experts}, box {64, block_n, 1}), both bf16 with 128-byte swizzle; reads past an extent come back
// as zeros. With bf16 output, also op.c_map (2-D {n_out, c_rows}, box {64, 64}, 128-byte swizzle;
// stores past an extent are dropped). op.a, op.b and op.c must be device pointers.
inline void encode_tensor_maps(GemmOperands& op) {
  encode_a_map(op.a_map, op.a, op.k, op.a_rows, op.lda, op.config.block_m, "A");
  cuuint64_t const b_dims[3] = {op.k, op.n, op.experts};
  cuuint64_t const b_strides[2] = {cuuint64_t{op.k} * 2, cuuint64_t{op.n} * op.k * 2};
  cuuint32_t const b_box[3] = {kBlockK, op.config.block_n, 1};
  detail::encode_bf16_tiled(op.b_map, op.b, 3, b_dims, b_strides, b_box, "B");
  if (op.output == OutputType::bf16) {
    cuuint64_t const c_dims[2] = {op.n_out, op.c_rows};
    cuuint64_t const c_strides[1] = {cuuint64_t{op.ldc} * 2};
    cuuint32_t const c_box[2] = {kStoreBoxCols, kStoreBoxRows};
    detail::encode_bf16_tiled(op.c_map, op.c, 2, c_dims, c_strides, c_box, "C");
    op.c_map_ready = 1;
  }
}

}  // namespace loom::tasks::gemm
