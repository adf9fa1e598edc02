// Host-only build of the cuBLAS projection (DSV41KV_CUDA=OFF): reports that CUDA is missing.
#if !defined(DSV41KV_WITH_CUDA)
#include "core/validate.hpp"
#include "dsv41kv/projection_cuda.hpp"

namespace dsv41kv {
CublasProjection::CublasProjection(size_t) {
  detail::built_without_cuda("CublasProjection");
}
CublasProjection::~CublasProjection() = default;
void CublasProjection::project(const TensorView&, const TensorView&, const TensorView&,
                               const ExecContext&) const {
  detail::built_without_cuda("CublasProjection::project");
}
}  // namespace dsv41kv
#endif
