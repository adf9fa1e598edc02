// Host-only build of the device PCP link (DSV41KV_CUDA=OFF): every entry point reports that
// the library was built without CUDA. The CUDA build uses link_cuda.cu.
#if !defined(DSV41KV_WITH_CUDA)
#include <string>

#include "dsv41kv/pcp_cuda.hpp"

namespace dsv41kv::pcp {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  invalid_argument(std::string(op) + ": dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)");
}
}  // namespace

LinkDeviceWorkspace::LinkDeviceWorkspace(int64_t) { no_cuda("LinkDeviceWorkspace"); }
LinkDeviceWorkspace::~LinkDeviceWorkspace() = default;
void link_local_keys_cuda(const LinkDeviceInput&, const TensorView&, const TensorView&,
                          const ExecContext&) {
  no_cuda("link_local_keys_cuda");
}
void link_resolve_cuda(const LinkDeviceInput&, const TensorView&, int, LinkDeviceWorkspace&,
                       const LinkDeviceOutputs&, const ExecContext&) {
  no_cuda("link_resolve_cuda");
}
}  // namespace dsv41kv::pcp
#endif
