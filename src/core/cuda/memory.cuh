// Device memory primitives shared by every CUDA kernel of the library: 16-byte vector loads and
// stores (plain, "early" volatile loads, with an L2 policy, any alignment), stores of packed words
// at any alignment, shared-window addresses and warp shuffles of 64-bit values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41kv::detail::cuda {

// ---------------------------------------------------------------- vector memory helpers

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// Loads issued exactly where they are written ("early"): volatile asm, so the compiler can
// neither sink them below a later early-exit branch (it does that to plain loads whose value
// is used only after the branch) nor drop them. For read-only inputs of a kernel only (they
// are not ordered against the kernel's own stores).
// The form is ld.relaxed.gpu (LDG.STRONG.GPU): coherent at GPU scope (after a PDL grid
// dependency wait it sees the previous kernel's writes like any load) without the system-scope
// ld.volatile (LDG.STRONG.SYS) used before. In an A/B on the H200 (decode of a 16-layer graph,
// plain launches) it was never slower: ratio 1 faster for every record with per-layer and with
// shared buffers, ratio 2 faster with shared buffers and unchanged per-layer. A weak ld.global
// was close to it either way (better for ratio-1 nvfp4, worse for ratio 2 per-layer)
// (docs/changelog.md, v16 and "Tried and did not pay").
#define DSV41KV_LDQ "ld.relaxed.gpu.global"
__device__ __forceinline__ int64_t ld_early(const int64_t* p) {
  int64_t v;
  asm volatile(DSV41KV_LDQ ".s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int32_t ld_early(const int32_t* p) {
  int32_t v;
  asm volatile(DSV41KV_LDQ ".s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld2u_early(const uint16_t* p) {
  uint2 v;
  asm volatile(DSV41KV_LDQ ".v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ld4_early(const float* p) {
  float4 v;
  asm volatile(DSV41KV_LDQ ".v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}
#undef DSV41KV_LDQ
// Read-only 16- and 8-byte loads through the non-coherent path, not allocated in L1 (a record a
// kernel reads once; its bytes were written by an earlier kernel, not by this one).
__device__ __forceinline__ uint4 ld16_once(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld8_once(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// L2 evict-first policy for kv rows that a kernel reads once (see kRowsEvictFirst in
// compressor/cuda/warp_program.cuh), and a 16-byte load with an L2 policy.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ float4 ld4_policy(const float* p, uint64_t pol) {
  float4 v;
  asm("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p), "l"(pol));
  return v;
}
#else
__device__ __forceinline__ uint64_t l2_policy_evict_first() { return 0; }
__device__ __forceinline__ float4 ld4_policy(const float* p, uint64_t) { return ld4(p); }
#endif
// A 16-byte kv-row load: evict-first when kEvictFirst (kRowsEvictFirst), else the plain load.
template <bool kEvictFirst>
__device__ __forceinline__ float4 ld4_row(const float* p) {
  if constexpr (kEvictFirst) return ld4_policy(p, l2_policy_evict_first());
  else return ld4(p);
}

__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
// Ring rows may start at any float (the ring block stride is arbitrary, SPEC 3.2): these take
// the (program-uniform) alignment of the row.
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
__device__ __forceinline__ float4 ld4_any(const float* p, bool al) {
  if (al) return ld4(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}
__device__ __forceinline__ void st4_any(float* p, float4 v, bool al) {
  if (al) {
    st4(p, v);
  } else {
    p[0] = v.x;
    p[1] = v.y;
    p[2] = v.z;
    p[3] = v.w;
  }
}

// Stores NW 32-bit words (4*NW bytes) at dst with the widest stores its alignment allows.
template <int NW>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t (&w)[NW]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if constexpr (NW % 4 == 0) {
    if ((a & 15u) == 0) {
#pragma unroll
      for (int i = 0; i < NW; i += 4)
        *reinterpret_cast<uint4*>(dst + 4 * i) = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
      return;
    }
  }
  if constexpr (NW % 2 == 0) {
    if ((a & 7u) == 0) {
#pragma unroll
      for (int i = 0; i < NW; i += 2)
        *reinterpret_cast<uint2*>(dst + 4 * i) = make_uint2(w[i], w[i + 1]);
      return;
    }
  }
  if ((a & 3u) == 0) {
#pragma unroll
    for (int i = 0; i < NW; ++i) *reinterpret_cast<uint32_t*>(dst + 4 * i) = w[i];
    return;
  }
#pragma unroll
  for (int i = 0; i < NW; ++i)
#pragma unroll
    for (int b = 0; b < 4; ++b) dst[4 * i + b] = static_cast<uint8_t>(w[i] >> (8 * b));
}
// Two bytes (lo, hi) at dst.
__device__ __forceinline__ void store_u16(uint8_t* dst, uint32_t v) {
  if ((reinterpret_cast<uintptr_t>(dst) & 1u) == 0) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(v);
  } else {
    dst[0] = static_cast<uint8_t>(v);
    dst[1] = static_cast<uint8_t>(v >> 8);
  }
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ int64_t shfl64(int64_t v, int src) {
  return static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(v), src));
}
template <class T>
__device__ __forceinline__ const T* shflptr(const T* v, int src) {
  return reinterpret_cast<const T*>(
      __shfl_sync(0xFFFFFFFFu, static_cast<long long>(reinterpret_cast<uintptr_t>(v)), src));
}

}  // namespace dsv41kv::detail::cuda
