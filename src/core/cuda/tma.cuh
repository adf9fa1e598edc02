// Hopper (sm_90) tensor-memory-accelerator copies and the mbarriers that count them, shared by
// every kernel that streams rows into shared memory: barrier init and its fence to the async
// proxy, arrive-with-expected-bytes, the phase-parity wait, and bulk tensor copies from a tensor
// map (core/cuda/tensor_map.hpp) with the mbarrier completing on their bytes. All addresses are
// 32-bit shared-window addresses. Builds for older architectures get no-ops: their callers never
// launch a TMA path there (they test device_is_sm90_or_newer on the host).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41kv::detail::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// A barrier expecting one arrival per phase.
__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar) : "memory");
}
// A barrier expecting `count` arrivals per phase (threads that hand a buffer over).
__device__ __forceinline__ void mbarrier_init_count(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release: this thread's earlier shared-memory accesses precede the phase's end).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(bar) : "memory");
}
// The initialised barriers visible to the async proxy (the copies' complete_tx).
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// The calling thread's earlier generic-proxy accesses of shared memory ordered before later
// async-proxy writes (a copy into a slot the thread has read).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// One arrival that also sets the phase's expected transaction bytes.
template <uint32_t kBytes>
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "n"(kBytes) : "memory");
}
// The same with a byte count known only at run time (0: a plain arrival).
__device__ __forceinline__ void mbarrier_arrive_expect_tx_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// A 1-d bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory
// into shared memory at `dst`, completing its bytes on `bar` (no tensor map: the source rows are
// contiguous runs of a page).
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Waits until the barrier's phase of the given parity has completed (acquire: the copies' bytes
// are visible to the calling thread).
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// The box at coordinates (x, y, z) of a 3-d tensor map into `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, int32_t z,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}
// Issued by one lane chosen with elect.sync (the whole warp calls; every operand warp-uniform, so
// that it lives in a uniform register: otherwise ptxas wraps the copy in a loop over the active
// lanes' distinct operand values): the arrival with kBytes expected on `bar`, then the box at
// (0, 0, z) of a 3-d tensor map with the L2 policy `pol`.
template <uint32_t kBytes>
__device__ __forceinline__ void tma_elect_expect_load_3d(uint32_t dst, const CUtensorMap* map, int32_t z, uint32_t bar,
                                                         uint64_t pol) {
  asm volatile(
      "{ .reg .pred p;\n\t"
      "elect.sync _|p, 0xffffffff;\n\t"
      "@p mbarrier.arrive.expect_tx.shared.b64 _, [%2], %3;\n\t"
      "@p cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%5, %5, %4}], [%2], %6;\n\t"
      "}" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "n"(kBytes), "r"(z), "r"(0), "l"(pol)
      : "memory");
}
// Likewise without the arrival: the box at (0, y) of a 2-d tensor map, on `bar`, policy `pol`.
__device__ __forceinline__ void tma_elect_load_2d(uint32_t dst, const CUtensorMap* map, int32_t y, uint32_t bar,
                                                  uint64_t pol) {
  asm volatile(
      "{ .reg .pred p;\n\t"
      "elect.sync _|p, 0xffffffff;\n\t"
      "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%4, %3}], [%2], %5;\n\t"
      "}" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(y), "r"(0), "l"(pol)
      : "memory");
}
#else
__device__ __forceinline__ void mbarrier_init(uint32_t) {}
__device__ __forceinline__ void mbarrier_init_count(uint32_t, uint32_t) {}
__device__ __forceinline__ void mbarrier_arrive(uint32_t) {}
__device__ __forceinline__ void mbarrier_init_fence() {}
__device__ __forceinline__ void fence_proxy_async_shared() {}
template <uint32_t kBytes>
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t) {}
__device__ __forceinline__ void mbarrier_arrive_expect_tx_bytes(uint32_t, uint32_t) {}
__device__ __forceinline__ void bulk_copy_g2s(uint32_t, const void*, uint32_t, uint32_t) {}
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t, uint32_t) {}
__device__ __forceinline__ void tma_load_3d(uint32_t, const CUtensorMap*, int32_t, int32_t, int32_t, uint32_t) {}
template <uint32_t kBytes>
__device__ __forceinline__ void tma_elect_expect_load_3d(uint32_t, const CUtensorMap*, int32_t, uint32_t, uint64_t) {}
__device__ __forceinline__ void tma_elect_load_2d(uint32_t, const CUtensorMap*, int32_t, uint32_t, uint64_t) {}
#endif

}  // namespace dsv41kv::detail::cuda
