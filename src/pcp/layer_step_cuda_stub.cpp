// Host-only build of the device PCP step (DSV41KV_CUDA=OFF): every entry point reports that the
// library was built without CUDA. The CUDA build uses layer_step_cuda.cpp.
#if !defined(DSV41KV_WITH_CUDA)
#include "core/validate.hpp"
#include "dsv41kv/pcp_step_cuda.hpp"

namespace dsv41kv::pcp {
struct LayerStepDeviceWorkspace::Impl {};
LayerStepDeviceWorkspace::LayerStepDeviceWorkspace() { detail::built_without_cuda("LayerStepDeviceWorkspace"); }
LayerStepDeviceWorkspace::~LayerStepDeviceWorkspace() = default;
LayerStepResult pcp_layer_step_cuda(const LayerStepArgs&, Communicator&, LayerStepDeviceWorkspace&) {
  detail::built_without_cuda("pcp_layer_step_cuda");
}

struct DeviceRank::Impl {};
DeviceRank::DeviceRank(int) { detail::built_without_cuda("DeviceRank"); }
DeviceRank::~DeviceRank() = default;
LayerStepResult DeviceRank::step(const LayerStepArgs&, Communicator&) { detail::built_without_cuda("DeviceRank::step"); }
void DeviceRank::all_gather_host(Communicator&, const void*, size_t, void*) { detail::built_without_cuda("DeviceRank::all_gather_host"); }
double DeviceRank::last_step_ms() const { return 0; }
}  // namespace dsv41kv::pcp
#endif
