// The host side of the device PCP link (pcp_cuda.hpp) that every build has: its sizes from the
// views' shapes (the same rules as the host link), and, in builds without CUDA, entry points that
// report it. The kernels are link_cuda.cu.
#include <algorithm>

#include "core/validate.hpp"
#include "dsv41kv/pcp.hpp"
#include "dsv41kv/pcp_cuda.hpp"

namespace dsv41kv::pcp {

int64_t link_device_num_rows(const LinkDeviceInput& in) {
  return link_num_rows(in.ring_slots.shape[0], in.max_num_seqs);
}
int64_t link_device_R(const LinkDeviceInput& in) {
  return std::min(in.qsl.shape[0] - 1, link_device_num_rows(in));
}

#if !defined(DSV41KV_WITH_CUDA)
LinkDeviceWorkspace::LinkDeviceWorkspace(int64_t) { detail::built_without_cuda("LinkDeviceWorkspace"); }
LinkDeviceWorkspace::~LinkDeviceWorkspace() = default;
void link_local_keys_cuda(const LinkDeviceInput&, const TensorView&, const TensorView&,
                          const ExecContext&) {
  detail::built_without_cuda("link_local_keys_cuda");
}
void link_resolve_cuda(const LinkDeviceInput&, const TensorView&, int, LinkDeviceWorkspace&,
                       const LinkDeviceOutputs&, const ExecContext&) {
  detail::built_without_cuda("link_resolve_cuda");
}
#endif
}  // namespace dsv41kv::pcp
