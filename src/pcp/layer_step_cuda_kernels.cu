// The one kernel of the device PCP step (layer_step_cuda.cpp): the last kv_score rows of this
// rank's local requests, gathered into the send buffer of the rows all-gather (SPEC 7.5).
#include "core/cuda/cuda_util.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::pcp {
namespace {

__global__ void gather_last_rows(const float* __restrict__ kv, int64_t kv_stride,
                                 const int64_t* __restrict__ tokens, float* __restrict__ out) {
  const int64_t j = blockIdx.x;
  const float* src = kv + tokens[j] * kv_stride;
  float* dst = out + j * kRingRowFloats;
  for (int c = static_cast<int>(threadIdx.x); c < kRingRowFloats; c += static_cast<int>(blockDim.x))
    dst[c] = src[c];
}

}  // namespace

void launch_gather_last_rows(const float* kv, int64_t kv_stride, const int64_t* tokens, float* out, int64_t rows,
                             cudaStream_t stream) {
  if (rows <= 0) return;
  gather_last_rows<<<static_cast<unsigned>(rows), 256, 0, stream>>>(kv, kv_stride, tokens, out);
  DSV41KV_CUDA_CHECK_LAUNCH("gather_last_rows");
}

}  // namespace dsv41kv::pcp
