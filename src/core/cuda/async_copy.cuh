// Asynchronous global -> shared copies (cp.async, sm_80+) with L2 policies, their commit groups
// and waits; builds for older architectures copy synchronously with the same results.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41kv::detail::cuda {

// Asynchronous global -> shared copies (sm_80+), their commit and wait (this thread's copies):
// 16 bytes bypassing L1 (the kv rows, the attention's records; with an L2 policy: kRowsEvictFirst),
// 8 bytes, 4 bytes with an L2
// eviction policy (the RoPE table entries, see l2_policy_evict_last). Builds for older
// architectures copy synchronously (same results). Every form takes a 32-bit shared-window
// address (`_sa`).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem_src), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async4_sa(uint32_t d, const float* gmem_src, uint64_t pol) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(d), "l"(gmem_src), "l"(pol)
               : "memory");
}
// RoPE table entries are copied with an L2 evict-last policy (both ratios): every request reads
// the row of each of its positions, the 16 requests of a 256K prefill reach a position at
// different times, and in between tens of MB of kv rows stream through L2; with the default
// policy most RoPE rows came from DRAM again (ncu, 256K ratio 1 v4: DRAM reads ~7% above the
// bytes of rows, metadata and table, about those bytes with the policy, which made both ratios
// faster: docs/changelog.md, v15).
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// 8 bytes (an 8-byte aligned source: the 584 record's scales).
__device__ __forceinline__ void cp_async8_sa(uint32_t d, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const void* gmem_src) {
  *static_cast<float4*>(__cvta_shared_to_generic(d)) = *static_cast<const float4*>(gmem_src);
}
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src, uint64_t) {
  cp_async16_sa(d, gmem_src);
}
__device__ __forceinline__ void cp_async4_sa(uint32_t d, const float* gmem_src, uint64_t) {
  *static_cast<float*>(__cvta_shared_to_generic(d)) = *gmem_src;
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() { return 0; }
__device__ __forceinline__ void cp_async8_sa(uint32_t d, const void* gmem_src) {
  *static_cast<uint2*>(__cvta_shared_to_generic(d)) = *static_cast<const uint2*>(gmem_src);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif
// A 16-byte kv-row copy, with the L2 policy `pol` when kEvictFirst (kRowsEvictFirst), else the
// plain form.
template <bool kEvictFirst>
__device__ __forceinline__ void cp_async16_row(uint32_t d, const float* gmem_src, uint64_t pol) {
  if constexpr (kEvictFirst) cp_async16_sa(d, gmem_src, pol);
  else cp_async16_sa(d, gmem_src);
}

}  // namespace dsv41kv::detail::cuda
