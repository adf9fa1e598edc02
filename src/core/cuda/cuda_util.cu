// CUDA error handling (cuda_util.hpp).
#include "core/cuda/cuda_util.hpp"
#include "core/cuda/device_info.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <string>

namespace dsv41kv::detail {

void cuda_fail(cudaError_t e, const char* expr, const char* file, int line) {
  // Clear a non-sticky error so that the next call on this thread does not report it again.
  (void)cudaGetLastError();
  std::string f = file ? file : "?";
  const size_t cut = f.rfind("/src/");
  if (cut != std::string::npos) f = f.substr(cut + 1);
  fail(ErrorCode::kCuda, f + ":" + std::to_string(line) + ": " + expr + ": " +
                             cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void require_aligned16(const void* p, const char* op, const char* arg) {
  if (p != nullptr && !is_aligned(p, 16)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    invalid_argument(std::string(op) + ": " + arg + ": data pointer " + buf +
                     " is not 16-byte aligned, expected a 16-byte aligned device pointer (the "
                     "CUDA backend moves rows with 16-byte vectors)");
  }
}

bool device_supports_pdl() {
  // 0 = not asked yet, 1 = compute capability >= 9.0, 2 = older; a device id beyond the table is
  // asked every time. Races only repeat the same query.
  static std::array<std::atomic<int8_t>, 64> known{};
  int dev = 0;
  DSV41KV_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < static_cast<int>(known.size());
  if (cached) {
    const int8_t k = known[static_cast<size_t>(dev)].load(std::memory_order_relaxed);
    if (k != 0) return k == 1;
  }
  int major = 0;
  DSV41KV_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const bool yes = major >= 9;
  if (cached) known[static_cast<size_t>(dev)].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

}  // namespace dsv41kv::detail

namespace dsv41kv::detail {
namespace {
__global__ void fill_words_kernel(uint32_t* __restrict__ dst, uint32_t word, size_t count) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = word;
}
}  // namespace

void fill_words(void* dst, uint32_t word, size_t count, void* stream) {
  if (count == 0) return;
  constexpr unsigned kThreads = 256;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  fill_words_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kThreads, 0, as_stream(stream)>>>(
      static_cast<uint32_t*>(dst), word, count);
  DSV41KV_CUDA_CHECK_LAUNCH("fill_words_kernel");
}

}  // namespace dsv41kv::detail

namespace dsv41kv::detail::cuda {
int sm_count() {
  static thread_local int dev_cached = -1, sms = 0;
  int dev = 0;
  DSV41KV_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != dev_cached) {
    DSV41KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    dev_cached = dev;
  }
  return sms;
}
}  // namespace dsv41kv::detail::cuda
