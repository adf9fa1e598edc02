// Host-only build of the device PCP step (DSV41KV_CUDA=OFF): every entry point reports that the
// library was built without CUDA. The CUDA build uses layer_step_cuda.cu.
#if !defined(DSV41KV_WITH_CUDA)
#include <string>

#include "dsv41kv/pcp_step_cuda.hpp"

namespace dsv41kv::pcp {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  invalid_argument(std::string(op) + ": dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)");
}
}  // namespace

struct LayerStepDeviceWorkspace::Impl {};
LayerStepDeviceWorkspace::LayerStepDeviceWorkspace() { no_cuda("LayerStepDeviceWorkspace"); }
LayerStepDeviceWorkspace::~LayerStepDeviceWorkspace() = default;
LayerStepResult pcp_layer_step_cuda(const LayerStepArgs&, Communicator&, LayerStepDeviceWorkspace&) {
  no_cuda("pcp_layer_step_cuda");
}

struct DeviceRank::Impl {};
DeviceRank::DeviceRank(int) { no_cuda("DeviceRank"); }
DeviceRank::~DeviceRank() = default;
LayerStepResult DeviceRank::step(const LayerStepArgs&, Communicator&) { no_cuda("DeviceRank::step"); }
void DeviceRank::all_gather_host(Communicator&, const void*, size_t, void*) { no_cuda("DeviceRank::all_gather_host"); }
double DeviceRank::last_step_ms() const { return 0; }
}  // namespace dsv41kv::pcp
#endif
