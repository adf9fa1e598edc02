// dsv41kv: the compressor layer's projection on the GPU through cuBLAS (SPEC 4.1):
// kv_score = hidden . W^T with bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F) and fp32
// output without bf16 rounding. The cuBLAS handle and its workspace belong to a caller-created
// CublasProjection (created once, reused every step): project() allocates nothing, does not
// synchronise and can be captured in a CUDA graph.
//
// Not bit-identical to the CPU projection (projection.hpp fixes a 16-way accumulation order;
// cuBLAS picks its own split of the K loop): the GPU tests compare within fp32 rounding of the
// accumulation. Everything downstream of kv_score (compress, insert) is bit-identical.
// No CUDA type appears here: the stream travels as ExecContext::stream (void*).
#pragma once

#include <cstddef>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

class CublasProjection {
 public:
  // Creates the cuBLAS handle and a workspace of `workspace_bytes` on the current device.
  // Error(kCuda) on failure; E8 in a build without CUDA.
  explicit CublasProjection(size_t workspace_bytes = size_t{32} << 20);
  ~CublasProjection();
  CublasProjection(const CublasProjection&) = delete;
  CublasProjection& operator=(const CublasProjection&) = delete;

  // hidden: bf16 [T, H] (inner stride 1, row stride >= H, 16-byte aligned rows not required);
  // weight: bf16 [512*r, H] (inner stride 1); kv_score: f32 [T, 512*r] (inner stride 1, row
  // stride >= 512*r). All CUDA views; r in {1, 2} from weight.shape[0] (E3 otherwise); E8 for
  // any other mismatch. Runs on ctx.stream.
  void project(const TensorView& hidden, const TensorView& weight, const TensorView& kv_score,
               const ExecContext& ctx = {}) const;

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace dsv41kv
