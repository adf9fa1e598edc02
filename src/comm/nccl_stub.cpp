// NcclCommunicator when the library is built without NCCL (DSV41KV_NCCL=OFF or no CUDA): the
// symbols exist so callers need no #ifdef; using them throws kBackendUnsupported.
#if !defined(DSV41KV_WITH_NCCL)

#include "dsv41kv/nccl_comm.hpp"

namespace dsv41kv {
namespace {
[[noreturn]] void no_nccl(const char* what) {
  fail(ErrorCode::kBackendUnsupported,
       std::string(what) + ": this build has no NCCL (configure with CUDA and NCCL found, DSV41KV_NCCL=ON)");
}
}  // namespace

bool nccl_available() { return false; }
std::string nccl_version_string() { return "built without NCCL"; }
std::vector<uint8_t> NcclCommunicator::create_unique_id() { no_nccl("NcclCommunicator::create_unique_id"); }
NcclCommunicator::NcclCommunicator(int, int, const std::vector<uint8_t>&, int, std::chrono::milliseconds) {
  no_nccl("NcclCommunicator");
}
NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::all_gather(const void*, size_t, void*, Device, const ExecContext&) { no_nccl("all_gather"); }
void NcclCommunicator::barrier() { no_nccl("barrier"); }
void NcclCommunicator::wait(void*, std::chrono::milliseconds) { no_nccl("wait"); }
void NcclCommunicator::check_async_error(const char*) { no_nccl("check_async_error"); }
void NcclCommunicator::abort() noexcept { aborted_ = true; }
void NcclCommunicator::add_to_counters(const Counters&) {}
void NcclCommunicator::abort_and_fail(const std::string& message) { fail(ErrorCode::kComm, message); }
void NcclCommunicator::require_usable(const char* what) const { no_nccl(what); }

}  // namespace dsv41kv

#endif  // !DSV41KV_WITH_NCCL
