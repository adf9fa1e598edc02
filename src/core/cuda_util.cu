// CUDA error handling (cuda_util.hpp).
#include "core/cuda_util.hpp"

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

}  // namespace dsv41kv::detail
