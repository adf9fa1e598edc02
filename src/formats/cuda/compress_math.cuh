// The device forms of the pooling and RMSNorm routine of compress_math.hpp (SPEC 4.6), each
// bit-identical to the exact form it replaces.
//
// pool2: pool2_fast needs only
// one exp32 when one score is the maximum, because exp32(+-0) == 1 exactly (numerics.hpp); the
// other branch keeps two exp32 calls. The exponential is the branch-free exp32_nonpos, and on the
// device the two weights 1/den and ex/den share one reciprocal seed (pool2_try, checked for every
// ex of its range).
#pragma once

#include <cuda_runtime.h>

#include "formats/compress_math.hpp"
#include "dsv41kv/numerics.hpp"
#include "formats/cuda/fast_numerics.cuh"

namespace dsv41kv::detail::cuda {

// pool2 of compress_math.hpp with one exp32 in the common case, with branches. With
// m = max_f(as, bs): if as - m == 0 (as is the max, or equal) then ea = exp32(+-0) == 1 and
// eb = exp32(bs - m); if bs - m == 0 then eb == 1. Only when neither difference is zero
// (non-finite scores) both exponentials are evaluated, exactly as pool2 does. Both differences
// are <= 0 or NaN (m is the max), so exp32_nonpos == exp32 on them; den = add_rn(1, ex) ==
// add_rn(ea, eb) (addition commutes); the weight with numerator 1 is div_rn(1, den).
DSV41KV_HD float pool2_exact(float a_kv, float a_score, float b_kv, float b_score) {
  const float m = num::max_f(a_score, b_score);
  const float da = num::sub_rn(a_score, m);
  const float db = num::sub_rn(b_score, m);
  const bool za = (da == 0.0f);
  const float ex = exp32_nonpos(za ? db : da);  // the exponential that is not exp32(0)
  float ea, eb;
  if (za) {
    ea = 1.0f;
    eb = ex;
  } else {
    ea = ex;
    eb = (db == 0.0f) ? 1.0f : exp32_nonpos(db);
  }
  const float den = num::add_rn(ea, eb);
  const float wa = num::div_rn(ea, den);
  const float wb = num::div_rn(eb, den);
  return num::add_rn(num::mul_rn(a_kv, wa), num::mul_rn(b_kv, wb));
}

// ex in [2^-60, 1]: the range where pool2_try's shared-reciprocal quotients are used.
DSV41KV_HD bool pool_fast_range(float ex) { return num::f2u(ex) - 0x21800000u <= 0x1E000000u; }

// w1 = 1/den and wx = ex/den for den = add_rn(1, ex), sharing one reciprocal seed, with the
// operation sequence of the compiler's div.rn.f32 fast path (r0 = rcp.approx; r = r0 +
// r0*(1 - den*r0); q0 = a*r; q = q0 + r*(a - den*q0), all fma; for a = 1, q0 = r). Equal to
// div_rn(1, den) and div_rn(ex, den) for every ex with pool_fast_range(ex) (every such ex is
// checked on every GPU run: PoolWeightsEqualTheIeeeDivisionsOnTheirRange in
// tests/compressor/test_compress_math_gpu.cu); not for every other ex.
__device__ __forceinline__ void pool_weights_fast(float ex, float& w1, float& wx) {
  const float den = num::add_rn(1.0f, ex);
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(den));
  const float e = __fmaf_rn(-den, r0, 1.0f);
  const float r = __fmaf_rn(r0, e, r0);
  w1 = __fmaf_rn(r, __fmaf_rn(-den, r, 1.0f), r);
  const float q0 = __fmaf_rn(ex, r, 0.0f);
  wx = __fmaf_rn(r, __fmaf_rn(-den, q0, ex), q0);
}

// pool2 without branches for the common case; ok = false when the value must come from
// pool2_exact instead. With d = sub_rn(a_score, b_score) and x = -|d|:
//  * ok = (x >= -41): false for NaN/Inf differences, so ok implies both scores finite;
//  * for finite scores pool2_exact's max is m = (a > b ? a : b) and its zero difference is
//    za = (a_score - m == 0) == (a_score >= b_score) (no flush to zero: a - b == 0 iff a == b;
//    for a == b, m = b and a - b is +-0); its other difference is b - a (za) or a - b (!za),
//    both == x because RN is symmetric (b - a == -(a - b)); for a == b pool2_exact takes
//    exp32(+0) and this exp32(-0), both exactly 1;
//  * for x in [-41, 0]: exp32_mid(x) == exp32_nonpos(x) == exp32(x) (see exp32_mid; both checked
//    for every input on every GPU run: tests/formats/test_fast_numerics_gpu.cu), and exp32(x)
//    lies in [2^-60, 1] (checked on the host for every x in [-41, -0]: docs/changelog.md,
//    "Bit-identity evidence"), the range where the two weights 1/den and ex/den share one
//    reciprocal seed and follow the operation sequence of the compiler's div.rn.f32 fast path
//    (r0 = rcp.approx; r = r0 + r0*(1 - den*r0); q0 = a*r; q = q0 + r*(a - den*q0), all fma; for
//    a = 1, q0 = r); for every ex in [2^-60, 1] both equal div_rn's bits (pool_weights_fast:
//    checked exhaustively on every GPU run, tests/compressor/test_compress_math_gpu.cu).
__device__ __forceinline__ float pool2_try(float a_kv, float a_score, float b_kv, float b_score,
                                           bool& ok) {
  const float d = num::sub_rn(a_score, b_score);
  const bool za = a_score >= b_score;
  const float x = -fabsf(d);  // exact; abs/neg become operand modifiers
  ok = x >= -41.0f;
  const float ex = exp32_mid(x);
  float w1, wx;
  pool_weights_fast(ex, w1, wx);
  const float wa = za ? w1 : wx;
  const float wb = za ? wx : w1;
  return num::add_rn(num::mul_rn(a_kv, wa), num::mul_rn(b_kv, wb));
}

// pool2 (bit-identical): device: pool2_try, else pool2_exact; host: pool2_exact.
DSV41KV_HD float pool2_fast(float a_kv, float a_score, float b_kv, float b_score) {
#if defined(__CUDA_ARCH__)
  bool ok;
  const float v = pool2_try(a_kv, a_score, b_kv, b_score, ok);
  if (ok) return v;
#endif
  return pool2_exact(a_kv, a_score, b_kv, b_score);
}

// pool2 of N consecutive dims (float4 groups): pool2_try on all of them (independent, no
// branches), then pool2_exact for the few that need it.
template <int N>
__device__ __forceinline__ void pool2_vec(const float4 (&akv)[N], const float4 (&asc)[N],
                                          const float4 (&bkv)[N], const float4 (&bsc)[N],
                                          float4 (&out)[N]) {
  bool ok[N][4];
  bool all = true;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    out[k].x = pool2_try(akv[k].x, asc[k].x, bkv[k].x, bsc[k].x, ok[k][0]);
    out[k].y = pool2_try(akv[k].y, asc[k].y, bkv[k].y, bsc[k].y, ok[k][1]);
    out[k].z = pool2_try(akv[k].z, asc[k].z, bkv[k].z, bsc[k].z, ok[k][2]);
    out[k].w = pool2_try(akv[k].w, asc[k].w, bkv[k].w, bsc[k].w, ok[k][3]);
    all = all && ok[k][0] && ok[k][1] && ok[k][2] && ok[k][3];
  }
  if (!all) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (!ok[k][0]) out[k].x = pool2_exact(akv[k].x, asc[k].x, bkv[k].x, bsc[k].x);
      if (!ok[k][1]) out[k].y = pool2_exact(akv[k].y, asc[k].y, bkv[k].y, bsc[k].y);
      if (!ok[k][2]) out[k].z = pool2_exact(akv[k].z, asc[k].z, bkv[k].z, bsc[k].z);
      if (!ok[k][3]) out[k].w = pool2_exact(akv[k].w, asc[k].w, bkv[k].w, bsc[k].w);
    }
  }
}

// SPEC 4.6's reduction of the 32 partial sums (cmath::reduce32) on a warp whose lane l holds
// part[l]: the shuffle-down tree h = 16 .. 1 adds, at every level, exactly the pairs reduce32 adds
// (lane l < h takes lane l + h), so lane 0 ends with reduce32's value, which every lane receives.
__device__ __forceinline__ float warp_reduce32(float part) {
  part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, 16));
  part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, 8));
  part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, 4));
  part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, 2));
  part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, 1));
  return __shfl_sync(0xFFFFFFFFu, part, 0);
}
// The same tree as a butterfly: lanes l and l ^ h add the same two values (in either order: IEEE
// addition is commutative, and a NaN sum is the canonical NaN either way), so after each level
// they hold the same value and every lane ends with lane 0's sum, without the broadcast.
__device__ __forceinline__ float warp_reduce32_butterfly(float part) {
#pragma unroll
  for (int h = 16; h >= 1; h >>= 1) part = num::add_rn(part, __shfl_xor_sync(0xFFFFFFFFu, part, h));
  return part;
}

}  // namespace dsv41kv::detail::cuda
