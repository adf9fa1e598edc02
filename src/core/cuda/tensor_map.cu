// The tensor-map encoder (tensor_map.hpp).
#include "core/cuda/tensor_map.hpp"

#include <cuda_runtime.h>

namespace dsv41kv::detail::cuda {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || f == nullptr) {
      (void)cudaGetLastError();
      fail(ErrorCode::kCuda, std::string("CUDA driver entry point cuTensorMapEncodeTiled not found (") +
                                 cudaGetErrorString(e) + ", query result " + std::to_string(static_cast<int>(q)) +
                                 "): the driver is older than CUDA 12.0's");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace dsv41kv::detail::cuda
