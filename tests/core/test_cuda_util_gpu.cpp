// The CUDA launch helpers of core/cuda on the device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/cuda/cuda_util.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class CudaUtilGpu : public GpuTest {};

// The launch helper asks for PDL only on devices that have it (compute capability >= 9.0); the
// answer is cached per device and must stay the device's.
TEST_F(CudaUtilGpu, DeviceSupportsPdlMatchesComputeCapability) {
  int dev = 0, major = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  EXPECT_EQ(detail::device_supports_pdl(), major >= 9);
  EXPECT_EQ(detail::device_supports_pdl(), major >= 9);  // the cached answer
}

}  // namespace
}  // namespace dsv41kv::test
