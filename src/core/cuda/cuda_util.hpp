// CUDA error handling shared by every CUDA translation unit of the library (and the GPU tests
// and the bench): a failing runtime call becomes dsv41kv::Error(ErrorCode::kCuda) naming the
// call, the file and the line. Include only where <cuda_runtime.h> is available (CUDA builds).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

// Throws Error(kCuda, "<file>:<line>: <expr>: <cudaGetErrorName>: <cudaGetErrorString>").
[[noreturn]] void cuda_fail(cudaError_t e, const char* expr, const char* file, int line);

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// True when p is a multiple of `align` bytes.
inline bool is_aligned(const void* p, uintptr_t align) {
  return (reinterpret_cast<uintptr_t>(p) % align) == 0;
}
// E8 naming `op`/`arg` when the device pointer is not 16-byte aligned (the CUDA kernels load
// and store rows with 16-byte vectors).
void require_aligned16(const void* p, const char* op, const char* arg);

#if defined(__CUDACC__)
// q = a / b, r = a % b for a >= 0, b > 0, with a 32-bit division when both fit (the common
// case; a 64-bit division is a long emulated sequence on the GPU).
__device__ __forceinline__ void divmod(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((static_cast<uint64_t>(a) | static_cast<uint64_t>(b)) >> 32) == 0) {
    const uint32_t a32 = static_cast<uint32_t>(a), b32 = static_cast<uint32_t>(b);
    const uint32_t q32 = a32 / b32;
    q = q32;
    r = a32 - q32 * b32;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// Programmatic dependent launch (PDL, sm_90+). A kernel launched with it (launch_kernel, pdl =
// true) may start while the previous kernel of the stream is still running, so it must execute
// pdl_wait() before its first global-memory access: that waits until the previous grid has
// completed and its writes are visible (it returns at once when there is no such dependency).
// pdl_allow_dependents() lets the next PDL kernel of the stream start its blocks (they wait in
// their own pdl_wait); without it they start when this grid exits.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif

}  // namespace dsv41kv::detail

#define DSV41KV_CUDA_CHECK(expr)                                                   \
  do {                                                                             \
    const cudaError_t dsv41kv_err_ = (expr);                                       \
    if (dsv41kv_err_ != cudaSuccess)                                               \
      ::dsv41kv::detail::cuda_fail(dsv41kv_err_, #expr, __FILE__, __LINE__);       \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronising, naming the
// kernel (`name`, a string literal) in the message.
#define DSV41KV_CUDA_CHECK_LAUNCH(name)                                              \
  do {                                                                             \
    const cudaError_t dsv41kv_err_ = cudaPeekAtLastError();                        \
    if (dsv41kv_err_ != cudaSuccess)                                               \
      ::dsv41kv::detail::cuda_fail(dsv41kv_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)

namespace dsv41kv::detail {
// True when the current device has compute capability >= 9.0, where programmatic dependent
// launch exists (cached per device). The default sm_90a/sm_90 build runs only there; a build for
// older architectures (DSV41KV_CUDA_ARCHS) launches plainly on an older device, as FlashInfer's
// device_support_pdl decides.
bool device_supports_pdl();
// The current device has compute capability >= 9.0: tensor maps and TMA copies (the same test
// as device_supports_pdl).
inline bool device_is_sm90_or_newer() { return device_supports_pdl(); }

// Launches `kernel` on `stream` (errors: Error(kCuda)); pdl = true adds programmatic stream
// serialization where the device supports it (see pdl_wait: the kernel must call it before
// touching global memory).
// launch_kernel_smem: the same with `smem` bytes of dynamic shared memory (above 48 KiB the
// kernel must have opted in with cudaFuncAttributeMaxDynamicSharedMemorySize).
template <class... P, class... A>
void launch_kernel_smem(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                        A&&... args) {
  cudaLaunchConfig_t c = {};
  c.gridDim = grid;
  c.blockDim = block;
  c.dynamicSmemBytes = smem;
  c.stream = stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = at;
  c.numAttrs = pdl && device_supports_pdl() ? 1 : 0;
  DSV41KV_CUDA_CHECK(cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...));
}
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                   A&&... args) {
  launch_kernel_smem(kernel, grid, block, 0, stream, pdl, std::forward<A>(args)...);
}
}  // namespace dsv41kv::detail
