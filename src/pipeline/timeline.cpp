// Timeline (timeline.hpp).
#include "pipeline/timeline.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include "core/cuda/cuda_util.hpp"
#endif

namespace dsv41kv::detail {

Timeline::Timeline(Device device, int marks)
    : device_(device), host_(static_cast<size_t>(marks)), recorded_(static_cast<size_t>(marks), false) {
#if defined(DSV41KV_WITH_CUDA)
  if (device_ != Device::CUDA) return;
  for (int i = 0; i < marks; ++i) {
    cudaEvent_t e = nullptr;
    DSV41KV_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
#endif
}

Timeline::~Timeline() {
#if defined(DSV41KV_WITH_CUDA)
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void Timeline::mark(int i, const ExecContext& ctx) {
  const auto u = static_cast<size_t>(i);
  recorded_.at(u) = true;
  if (events_.empty()) {
    host_[u] = std::chrono::steady_clock::now();
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  DSV41KV_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[u]), as_stream(ctx.stream)));
#else
  (void)ctx;
#endif
}

double Timeline::ms(int from, int to) const {
  const auto a = static_cast<size_t>(from), b = static_cast<size_t>(to);
  if (!recorded_.at(a) || !recorded_.at(b)) return 0.0;
  if (events_.empty()) return std::chrono::duration<double, std::milli>(host_[b] - host_[a]).count();
#if defined(DSV41KV_WITH_CUDA)
  const auto ea = static_cast<cudaEvent_t>(events_[a]), eb = static_cast<cudaEvent_t>(events_[b]);
  DSV41KV_CUDA_CHECK(cudaEventSynchronize(eb));
  float ms = 0;
  DSV41KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ea, eb));
  return static_cast<double>(ms);
#else
  return 0.0;
#endif
}

}  // namespace dsv41kv::detail
