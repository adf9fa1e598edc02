// TMA tensor maps encoded on the host (the driver's cuTensorMapEncodeTiled, through the runtime's
// entry-point query: no libcuda link) for kernels that copy boxes with core/cuda/tma.cuh. A map is
// plain data passed by value as a __grid_constant__ kernel parameter, so graph capture records it
// with the launch. Only for devices of compute capability >= 9.0.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <string>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail::cuda {

// The driver's encoder (looked up once; Error(kCuda) when the driver is older than CUDA 12.0's).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A tiled fp32 tensor map of kRank dimensions (dims, byte strides of dims 1.., box; element
// strides 1), or Error(kCuda) naming what() when the driver refuses it (the text is built only
// then: this runs at every launch of a TMA kernel).
template <int kRank, class What>
CUtensorMap f32_tensor_map(const float* base, const cuuint64_t (&dim)[kRank], const cuuint64_t (&stride)[kRank - 1],
                           const cuuint32_t (&box)[kRank], CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                           What what) {
  CUtensorMap m{};
  cuuint32_t elem_stride[kRank];
  for (int k = 0; k < kRank; ++k) elem_stride[k] = 1;
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, kRank, const_cast<float*>(base), dim,
                                          stride, box, elem_stride, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail(ErrorCode::kCuda,
         "cuTensorMapEncodeTiled refused " + what() + " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return m;
}

}  // namespace dsv41kv::detail::cuda
