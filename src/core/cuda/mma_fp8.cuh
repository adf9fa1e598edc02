// Tensor-core products of e4m3 operands with an fp32 result that meets a 1e-5 relative bound
// (the indexer's SPEC 8.8): e4m3 codes widened to f16 in registers (exact: every e4m3 value,
// 2^-9 .. 448 and zero, is an f16 value) and multiplied by mma.sync m16n8k16 f16 x f16 -> f32.
//
// Why not mma.sync m16n8k32 e4m3 x e4m3 -> f32 (sm_89+): on Ada and Hopper its accumulator keeps
// about 13 mantissa bits (products aligned to the largest exponent and truncated; SageAttention2
// and the DeepSeek-V3 report measured it), an error of ~2^-13 of the largest product per
// instruction against SPEC 8.8's 1e-5 of the sum of |products|: a random test fails it. The f16
// form keeps fp32 accumulation (errors ~2^-23 of the running sum), at half the e4m3 rate.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16): with g = lane / 4 and c = lane % 4,
//   A (16 x 16, row):  a0 = (row g, cols 2c, 2c+1), a1 = (row g+8, cols 2c..), a2 = (row g,
//                      cols 8+2c..), a3 = (row g+8, cols 8+2c..); lower half = lower column
//   B (16 x 8, col):   b0 = (k rows 2c, 2c+1; col g), b1 = (k rows 8+2c..; col g)
//   C (16 x 8, f32):   c0, c1 = (row g, cols 2c, 2c+1), c2, c3 = (row g+8, cols 2c, 2c+1)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp8.h>

namespace dsv41kv::detail {

// Two e4m3 codes (lo byte -> lower half) as an f16x2 register, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(static_cast<uint16_t>(two_codes & 0xFFFFu)));
  return r;
#else
  const __half_raw lo = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(two_codes & 0xFFu), __NV_E4M3);
  const __half_raw hi = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>((two_codes >> 8) & 0xFFu), __NV_E4M3);
  return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
#endif
}

// Four e4m3 codes of a word (byte j = element j) as two f16x2 registers: out[0] = elements 0, 1,
// out[1] = elements 2, 3.
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_f16x2(w);
  hi = e4m3x2_to_f16x2(w >> 16);
}

// d += A * B for one m16n8k16 tile (f16 inputs, f32 accumulators), layouts above.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  // Not reached: the library builds its kernels for sm_90 (a trap, never a wrong result).
  (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();
#endif
}

}  // namespace dsv41kv::detail
#endif
