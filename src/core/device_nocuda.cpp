// Host-only build of the device query (DSV41KV_CUDA=OFF). The CUDA build uses device.cu.
#if !defined(DSV41KV_WITH_CUDA)
#include "dsv41kv/device.hpp"

namespace dsv41kv {
bool built_with_cuda() { return false; }
bool cuda_device_available() { return false; }
std::string cuda_device_description() { return "built without CUDA (DSV41KV_CUDA=OFF)"; }
}  // namespace dsv41kv
#endif
