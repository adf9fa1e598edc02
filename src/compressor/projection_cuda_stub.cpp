// Host-only build of the cuBLAS projection (DSV41KV_CUDA=OFF): reports that CUDA is missing.
#if !defined(DSV41KV_WITH_CUDA)
#include "dsv41kv/projection_cuda.hpp"

namespace dsv41kv {
CublasProjection::CublasProjection(size_t) {
  invalid_argument("CublasProjection: dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)");
}
CublasProjection::~CublasProjection() = default;
void CublasProjection::project(const TensorView&, const TensorView&, const TensorView&,
                               const ExecContext&) const {
  invalid_argument("CublasProjection::project: dsv41kv was built without CUDA");
}
}  // namespace dsv41kv
#endif
