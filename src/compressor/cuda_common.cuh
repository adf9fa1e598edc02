// Device building blocks of the CUDA compressor backend: vector loads/stores, the fast but
// bit-identical forms of the shared primitives, and the cooperative record writers.
//
// Bit identity with the CPU reference (SPEC 0.4 item 2) comes from calling the same
// host/device primitives of numerics.hpp / records.hpp / compress_math.hpp element by element.
// Four shortcuts replace a primitive by a provably equal computation; the first three have
// host-side and exhaustive device tests (tests/gpu/test_fast_math_gpu.cu), all four are covered
// by the whole-backing CUDA-vs-CPU record tests:
//   * pool2_fast: the pool2 weights need only one exp32 when one score is the maximum, because
//     exp32(+-0) == 1 exactly (numerics.hpp); the other branch keeps two exp32 calls. The
//     exponential is the branch-free exp32_nonpos, and on the device the two weights 1/den and
//     ex/den share one reciprocal seed (pool2_try, checked for every ex of its range).
//   * e4m3x2_finite: cvt.rn.satfinite.e4m3x2.f32 (sm_89+) for finite inputs is e4m3_encode
//     (SPEC 2.2 defines the encoder as that instruction, apart from the NaN byte, and it is only
//     used on finite values). -DDSV41KV_CUDA_SOFT_FP8=1 uses the software encoder instead.
//   * e2m1_quotient_code: e2m1_encode(div_rn(v, sd)) without the division, by comparing |v|
//     with the exact products T*sd of the e2m1 decision thresholds T (see the proof below).
//   * local_amax_bits: a tile's amax and finiteness from one unsigned max of |v| bit patterns.
//
// Thread layout used by the writers ("writer layout"): a program (one token) is executed by
// 512/E threads; thread gt owns the E consecutive dims [E*gt, E*gt + E). E = 16 (one warp per
// token) or E = 4 (four warps per token). Every quantization tile (64, 32 or 16 dims) spans
// tile/E consecutive lanes of one warp, reduced with xor-shuffles over all 32 lanes.
#pragma once

#include <cuda_runtime.h>
#if !defined(DSV41KV_CUDA_SOFT_FP8)
#include <cuda_fp8.h>
#endif

#include <cstdint>

#include "compressor/compress_math.hpp"
#include "core/cuda_util.hpp"
#include "core/fast_divmod.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail::cuda {

// Record writer selector of the kernels: a RecordFormat value, or kNoRecord (compress only).
inline constexpr int kNoRecord = -1;
inline constexpr int kV4 = static_cast<int>(RecordFormat::V4_584);
inline constexpr int kMx = static_cast<int>(RecordFormat::MXFP8_528);
inline constexpr int kNv = static_cast<int>(RecordFormat::NVFP4_288);
inline constexpr int kBf16 = static_cast<int>(RecordFormat::PLAIN_BF16);
inline constexpr int kFp8 = static_cast<int>(RecordFormat::PLAIN_FP8);

// ---------------------------------------------------------------- fast, bit-identical math

// exp32 of numerics.hpp for x <= 0 or NaN (the only arguments pool2 gives it: x = score - max),
// without branches; the same value as exp32 for every x that is not > 0 (NaN payloads too):
//  * the reduction and the polynomial are evaluated for every x; the special results
//    (NaN -> x, x < -104 -> 0) are selected afterwards (exclusive conditions); the two cases of
//    exp32 that need x > 0 (x > 88.72... -> +Inf; ji > 127) cannot occur;
//  * ji = (int)j is read from the bits of s = t + 1.5*2^23: for |t| < 2^22 (every x in range),
//    s lies in [2^23, 2^24) where the ulp is 1, so f2u(s) = 0x4B400000 + j exactly (and
//    j = s - 1.5*2^23 is exact) -- no float-to-int conversion;
//  * both scalings of exp32 are one form (p * s1) * s2: subnormal results (ji < -125):
//    s1 = 2^(ji+64), s2 = 2^-64; otherwise s1 = 2^ji, s2 = 1, and the product with 1.0f is
//    exact, so the value is p * 2^ji as in exp32.
// Out-of-range x give garbage intermediates that are never selected (fp32 arithmetic does not
// trap; the integer operations are on unsigned values).
DSV41KV_HD float exp32_nonpos(float x) {
  const float t = num::mul_rn(x, 1.44269502162933349609375f);
  const float s = num::add_rn(t, 12582912.0f);
  const float j = num::sub_rn(s, 12582912.0f);
  float r = num::fma_rn(j, -0.693359375f, x);
  r = num::fma_rn(j, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = num::fma_rn(p, r, 1.3981999507e-3f);
  p = num::fma_rn(p, r, 8.3334519073e-3f);
  p = num::fma_rn(p, r, 4.1665795894e-2f);
  p = num::fma_rn(p, r, 1.6666665459e-1f);
  p = num::fma_rn(p, r, 5.0000001201e-1f);
  p = num::fma_rn(p, r, 1.0f);
  p = num::fma_rn(p, r, 1.0f);
  const uint32_t ju = num::f2u(s) - 0x4B400000u;
  const bool sub = static_cast<int>(ju) < -125;
  const uint32_t e1 = ju + (sub ? 64u + 127u : 127u);
  const uint32_t e2 = sub ? static_cast<uint32_t>(-64 + 127) : 127u;
  float v = num::mul_rn(num::mul_rn(p, num::u2f(e1 << 23)), num::u2f(e2 << 23));
  v = (x < -104.0f) ? 0.0f : v;
  v = num::is_nan(x) ? x : v;
  return v;
}

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
// div_rn(1, den) and div_rn(ex, den) for every ex with pool_fast_range(ex) (every such ex was
// checked on the H200); not for every other ex.
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

// exp32_nonpos without its special-case selects, for x in [-41, 0] only: there t >= -59.2, so
// ju lies in [-59, 0] (never the subnormal scaling, x is neither < -104 nor NaN) and the value
// is p * 2^ju, exactly what exp32_nonpos returns (its second factor is 1.0f). Outside that range
// the result is garbage and must not be used (pool2_try guards on x).
__device__ __forceinline__ float exp32_mid(float x) {
  const float t = num::mul_rn(x, 1.44269502162933349609375f);
  const float s = num::add_rn(t, 12582912.0f);
  const float j = num::sub_rn(s, 12582912.0f);
  float r = num::fma_rn(j, -0.693359375f, x);
  r = num::fma_rn(j, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = num::fma_rn(p, r, 1.3981999507e-3f);
  p = num::fma_rn(p, r, 8.3334519073e-3f);
  p = num::fma_rn(p, r, 4.1665795894e-2f);
  p = num::fma_rn(p, r, 1.6666665459e-1f);
  p = num::fma_rn(p, r, 5.0000001201e-1f);
  p = num::fma_rn(p, r, 1.0f);
  p = num::fma_rn(p, r, 1.0f);
  // (ju + 127) << 23 with ju = f2u(s) - 0x4B400000 (0x4B400000 << 23 == 0 mod 2^32)
  return num::mul_rn(p, num::u2f((num::f2u(s) << 23) + 0x3F800000u));
}

// pool2 without branches for the common case; ok = false when the value must come from
// pool2_exact instead. With d = sub_rn(a_score, b_score) and x = -|d|:
//  * ok = (x >= -41): false for NaN/Inf differences, so ok implies both scores finite;
//  * for finite scores pool2_exact's max is m = (a > b ? a : b) and its zero difference is
//    za = (a_score - m == 0) == (a_score >= b_score) (no flush to zero: a - b == 0 iff a == b;
//    for a == b, m = b and a - b is +-0); its other difference is b - a (za) or a - b (!za),
//    both == x because RN is symmetric (b - a == -(a - b)); for a == b pool2_exact takes
//    exp32(+0) and this exp32(-0), both exactly 1;
//  * for x in [-41, 0]: exp32_mid(x) == exp32_nonpos(x) == exp32(x) (see exp32_mid; exp32_nonpos
//    checked for all 2^32 inputs on the H200), and exp32(x) lies in [2^-60, 1] (checked on the
//    host for every x in [-41, -0]: docs/perf-notes.md v4), the range where
//    the two weights 1/den and ex/den share one reciprocal seed and follow the operation
//    sequence of the compiler's div.rn.f32 fast path (r0 = rcp.approx; r = r0 + r0*(1 - den*r0);
//    q0 = a*r; q = q0 + r*(a - den*q0), all fma; for a = 1, q0 = r); for every ex in
//    [2^-60, 1] both equal div_rn's bits (checked exhaustively on the H200, docs/perf-notes.md).
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

// e2m1_encode(div_rn(v, sd)) for finite v and an e4m3 scale value sd in [2^-9, 448], without
// the division. e2m1_encode decides by comparing q = RN(|v|/sd) with the thresholds
// T in {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} (<= or < alternately). Proof that the comparison of
// q with T equals the comparison of the exact |v| with T*sd:
//  - T*sd is exact in fp32 (T has <= 3 significant bits, sd <= 4; no under/overflow);
//  - q == T exactly iff |v| == T*sd: the fp32 neighbours of T*sd give quotients
//    T +- ulp(T*sd)/sd, and ulp(T*sd)/sd > ulp(T)/2 (strictly, because sd's significand is < 2),
//    so they round away from T; the one case where the neighbour below lies in a finer binade
//    (T*sd a power of two) needs T and sd powers of two, where the division is exact;
//  - RN is monotone, so every other |v| lands on the same side of T as |v|/sd.
// The sign is the sign bit of v (sd > 0), as the sign of the quotient (also for -0).
// The count of thresholds passed is found by a binary search (3 compares instead of 7): the
// thresholds are strictly increasing (T*sd exact, sd > 0) and passing one (> or >=) implies
// passing every lower one (a >= thr[j] > thr[k] for k < j), so the count is the index of the
// first threshold not passed: bit 2 = (a >= thr[3]), bit 1 = (a >= thr[5] or thr[1]), bit 0 =
// (a > thr[6], thr[4], thr[2] or thr[0]); equal to the 7-compare count for every a (checked on
// the host for every e4m3 scale, docs/perf-notes.md v4).
DSV41KV_HD uint8_t e2m1_quotient_code(float v, const float (&thr)[7]) {
  const float a = num::abs_f(v);
  const bool b2 = a >= thr[3];
  const bool b1 = a >= (b2 ? thr[5] : thr[1]);
  const float tl = b2 ? thr[4] : thr[0];
  const float th = b2 ? thr[6] : thr[2];
  const bool b0 = a > (b1 ? th : tl);
  const uint32_t c = (b2 ? 4u : 0u) | (b1 ? 2u : 0u) | (b0 ? 1u : 0u);
  return static_cast<uint8_t>(c | ((num::f2u(v) >> 31) << 3));
}
DSV41KV_HD void e2m1_thresholds(float sd, float (&thr)[7]) {
  thr[0] = num::mul_rn(0.25f, sd);
  thr[1] = num::mul_rn(0.75f, sd);
  thr[2] = num::mul_rn(1.25f, sd);
  thr[3] = num::mul_rn(1.75f, sd);
  thr[4] = num::mul_rn(2.5f, sd);
  thr[5] = num::mul_rn(3.5f, sd);
  thr[6] = num::mul_rn(5.0f, sd);
}

// Two e4m3 bytes (lo = a, hi = b) of finite inputs; equal to e4m3_encode of each.
__device__ __forceinline__ uint32_t e4m3x2_finite(float a, float b) {
#if defined(DSV41KV_CUDA_SOFT_FP8) || !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ < 890)
  return static_cast<uint32_t>(num::e4m3_encode(a)) |
         (static_cast<uint32_t>(num::e4m3_encode(b)) << 8);
#else
  float2 f;
  f.x = a;
  f.y = b;
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3));
#endif
}

// ---------------------------------------------------------------- vector memory helpers

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// Loads issued exactly where they are written ("early"): volatile asm, so the compiler can
// neither sink them below a later early-exit branch (it does that to plain loads whose value
// is used only after the branch) nor drop them. For read-only inputs of a kernel only (they
// are not ordered against the kernel's own stores).
// The form is ld.relaxed.gpu (LDG.STRONG.GPU): coherent at GPU scope (after a PDL grid
// dependency wait it sees the previous kernel's writes like any load) without the system-scope
// ld.volatile (LDG.STRONG.SYS) used before. A/B on the H200 (session 5, decode per layer, 16-layer
// graph, plain launches): ratio 1 v4 / mxfp8 / nvfp4 2.30 / 2.21 / 2.45 -> 2.27 / 2.16 / 2.38 us
// (per-layer buffers), 2.15 / 2.23 / 2.43 -> 2.11 / 2.19 / 2.41 (shared); ratio 2 shared
// 3.30 / 3.23 / 3.41 -> 3.23 / 3.14 / 3.32, per-layer unchanged. A weak ld.global was within
// +-0.05 us of it (better for ratio-1 nvfp4, worse for ratio 2 per-layer).
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

// L2 evict-first policy for kv rows that a kernel reads once (see kRowsEvictFirst in
// cuda_compress.cuh), and a 16-byte load with an L2 policy.
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

// Loads E consecutive bf16 (16-byte aligned source for E = 16, 8-byte for E = 4) as floats.
template <int E>
__device__ __forceinline__ void load_bf16(const uint16_t* src, float (&x)[E], uint16_t (&bits)[E]) {
  static_assert(E == 16 || E == 4);
  if constexpr (E == 16) {
    const uint4 u0 = *reinterpret_cast<const uint4*>(src);
    const uint4 u1 = *reinterpret_cast<const uint4*>(src + 8);
    const uint32_t w[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      bits[2 * i] = static_cast<uint16_t>(w[i] & 0xFFFFu);
      bits[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
    }
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    bits[0] = static_cast<uint16_t>(u.x & 0xFFFFu);
    bits[1] = static_cast<uint16_t>(u.x >> 16);
    bits[2] = static_cast<uint16_t>(u.y & 0xFFFFu);
    bits[3] = static_cast<uint16_t>(u.y >> 16);
  }
#pragma unroll
  for (int i = 0; i < E; ++i) x[i] = num::bf16_decode(bits[i]);
}

// num::bf16_encode of E values, packed two per word (even index in the low half), with the
// hardware conversion cvt.rn.bf16x2.f32 (round to nearest even, no flush to zero: the rounding
// bf16_encode implements on the bits, subnormals, zeros, infinities and overflow to infinity
// included) when no value is a NaN; if any is (bf16_encode's canonical NaN 0x7FC0 differs from
// the hardware's), all E are encoded by bf16_encode. The hardware result was compared with
// bf16_encode for every non-NaN fp32 pattern on the H200 (docs/perf-notes.md v5).
__device__ __forceinline__ uint32_t bf16x2_rn_hw(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else  // builds for older architectures (CMAKE_CUDA_ARCHITECTURES < 80): the same bits in software
  return static_cast<uint32_t>(num::bf16_encode(lo)) | (static_cast<uint32_t>(num::bf16_encode(hi)) << 16);
#endif
}
// Neither value is a NaN (one setp.num: a == a && b == b). Not !isunordered(a, b): that is a
// host constexpr function (std::isunordered, reached through --expt-relaxed-constexpr) which
// nvcc 13 folds to "unordered" in device code, so the hardware path was dead code and every
// value went through bf16_encode (v7 in docs/perf-notes.md: no F2FP.BF16 in the SASS).
__device__ __forceinline__ bool bf16_hw_ok2(float a, float b) { return a == a && b == b; }
// num::bf16_encode of each value, packed, in software (the NaN fallback below).
template <int E>
__device__ __forceinline__ void bf16_encode_packed_sw(const float (&v)[E], uint32_t (&w)[E / 2]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i)
    w[i] = static_cast<uint32_t>(num::bf16_encode(v[2 * i])) |
           (static_cast<uint32_t>(num::bf16_encode(v[2 * i + 1])) << 16);
}
template <int E>
__device__ __forceinline__ void bf16_encode_packed(const float (&v)[E], uint32_t (&w)[E / 2]) {
  bool ok = true;
#pragma unroll
  for (int i = 0; i < E / 2; ++i) {
    w[i] = bf16x2_rn_hw(v[2 * i], v[2 * i + 1]);
    ok = ok && bf16_hw_ok2(v[2 * i], v[2 * i + 1]);
  }
  if (!ok) bf16_encode_packed_sw<E>(v, w);
}
// The hardware conversion alone (NaN -> 0x7FFF, every other value as num::bf16_encode), and the
// fix-up that makes such words equal to bf16_encode_packed's (a no-op unless a value is NaN).
template <int E>
__device__ __forceinline__ void bf16_encode_packed_hw(const float (&v)[E], uint32_t (&w)[E / 2]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) w[i] = bf16x2_rn_hw(v[2 * i], v[2 * i + 1]);
}
template <int E>
__device__ __forceinline__ void bf16_fix_nan(const float (&v)[E], uint32_t (&w)[E / 2]) {
  bool ok = true;
#pragma unroll
  for (int i = 0; i < E / 2; ++i) ok = ok && bf16_hw_ok2(v[2 * i], v[2 * i + 1]);
  if (!ok) bf16_encode_packed_sw<E>(v, w);
}
// The floats of packed bf16 words (num::bf16_decode of each half).
template <int E>
__device__ __forceinline__ void bf16_decode_packed(const uint32_t (&w)[E / 2], float (&x)[E]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) {
    x[2 * i] = num::u2f(w[i] << 16);
    x[2 * i + 1] = num::u2f(w[i] & 0xFFFF0000u);
  }
}

// Packs E bf16 bit patterns into E/2 words.
template <int E>
__device__ __forceinline__ void pack_bf16(const uint16_t (&b)[E], uint32_t (&w)[E / 2]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i)
    w[i] = static_cast<uint32_t>(b[2 * i]) | (static_cast<uint32_t>(b[2 * i + 1]) << 16);
}

// ---------------------------------------------------------------- RoPE in the writer layout

// The cos/sin values of the RoPE pairs a thread owns (dims >= 448 only; others load nothing),
// from the table row `trow` (64 floats, 16-byte aligned). d0 = first dim of the thread.
template <int E>
__device__ __forceinline__ void rope_load(int d0, const float* trow, float (&c)[E / 2],
                                          float (&s)[E / 2]) {
  if (d0 < kNopeDim) return;
  const int j0 = (d0 - kNopeDim) / 2;  // first pair index
  if constexpr (E == 16) {
    const float4 c0 = ld4(trow + j0), c1 = ld4(trow + j0 + 4);
    const float4 s0 = ld4(trow + 32 + j0), s1 = ld4(trow + 32 + j0 + 4);
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w;
    c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w;
    s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
  } else {
    const float2 cc = *reinterpret_cast<const float2*>(trow + j0);
    const float2 ss = *reinterpret_cast<const float2*>(trow + 32 + j0);
    c[0] = cc.x; c[1] = cc.y;
    s[0] = ss.x; s[1] = ss.y;
  }
}
// y = x, then the forward RoPE of SPEC 1.4 on the pairs of dims >= 448 this thread owns, with
// cos/sin from rope_load.
template <int E>
__device__ __forceinline__ void rope_apply(int d0, const float (&c)[E / 2], const float (&s)[E / 2],
                                           const float (&x)[E], float (&y)[E]) {
#pragma unroll
  for (int i = 0; i < E; ++i) y[i] = x[i];
  if (d0 < kNopeDim) return;
#pragma unroll
  for (int i = 0; i < E / 2; ++i)
    num::rope_forward(x[2 * i], x[2 * i + 1], c[i], s[i], y[2 * i], y[2 * i + 1]);
}
// Both: table row `trow` (64 floats, 16-byte aligned), d0 = first dim of the thread.
template <int E>
__device__ __forceinline__ void rope_thread(int d0, const float* trow, const float (&x)[E],
                                            float (&y)[E]) {
  float c[E / 2], s[E / 2];
  rope_load<E>(d0, trow, c, s);
  rope_apply<E>(d0, c, s, x, y);
}

// ---------------------------------------------------------------- cooperative record writers

// Where records go: a validated CacheView flattened for the kernels.
// (field order: what the writers read first, see CompressParams)
struct CacheDst {
  uint8_t* base = nullptr;          // page 0, byte 0
  int64_t S = 1;                    // states per page
  int64_t page_stride_bytes = 0;
  int64_t capacity = 0;             // num_pages * S: slots >= capacity are skipped
  FastDivmod S_div;                 // division by S (slot -> page, row)
  int64_t row_stride_bytes = 0;     // plain rows
  float fp8_inv = 1.0f;             // plain fp8: fp32(1 / sigma), IEEE division on the host
};

// Tile amax and finiteness in one integer pass: the largest |v| bit pattern
// (f2u(v) & 0x7FFFFFFF). For finite values the unsigned order of these patterns is the order of
// |v|, so u2f(max) is exactly the amax that num::ue8m0_quantize_tile / nvfp4_quantize_tile
// compute with max_f (their maximum of non-negative finite values, starting from +0); a pattern
// >= 0x7F800000 means the tile holds an Inf or a NaN (those tiles are poisoned, SPEC 2.6, and
// their amax is never used).
template <int E>
__device__ __forceinline__ uint32_t local_amax_bits(const float (&v)[E]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < E; ++i) m = max(m, num::f2u(v[i]) & 0x7FFFFFFFu);
  return m;
}
// Max over `kLanes` consecutive lanes (a power of two dividing 32); every lane must call it.
template <int kLanes>
__device__ __forceinline__ uint32_t tile_reduce_bits(uint32_t m) {
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  return m;
}
__device__ __forceinline__ bool bits_finite(uint32_t m) { return m < 0x7F800000u; }

// UE8M0 quantization of this thread's E values of a tile whose reduced amax/finiteness are
// given: value bytes into w, returns the scale byte (num::ue8m0_quantize_tile, element-wise).
template <int E>
__device__ __forceinline__ uint8_t ue8m0_thread(const float (&v)[E], float amax, bool finite,
                                                uint32_t (&w)[E / 4]) {
  if (!finite) {
#pragma unroll
    for (int i = 0; i < E / 4; ++i) w[i] = 0x7F7F7F7Fu;
    return 255;
  }
  const int e = num::ue8m0_exponent(amax);
  const float inv = num::exp2i(-e);
#pragma unroll
  for (int i = 0; i < E / 4; ++i) {
    const uint32_t lo = e4m3x2_finite(num::mul_rn(v[4 * i], inv), num::mul_rn(v[4 * i + 1], inv));
    const uint32_t hi =
        e4m3x2_finite(num::mul_rn(v[4 * i + 2], inv), num::mul_rn(v[4 * i + 3], inv));
    w[i] = lo | (hi << 16);
  }
  return num::ue8m0_byte(e);
}

// num::e4m3_decode of a byte that is not NaN (not 0x7F / 0xFF), by the hardware conversion on
// sm_89+: e4m3 -> f16 is exact (every e4m3 value, 2^-9 .. 448 and zero, is an f16 normal or
// zero) and f16 -> f32 is exact; 2-3 instructions instead of the software decode's ~17 with a
// branch, on the NVFP4 writer's dependent chain (amax -> scale byte -> decoded scale ->
// thresholds). Checked against the software decode for every such byte
// (FastMathGpu.HardwareE4m3DecodeEqualsSoftwareOnEveryFiniteByte).
DSV41KV_HD float e4m3_decode_finite(uint8_t b) {
#if defined(DSV41KV_CUDA_SOFT_FP8) || !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ < 890)
  return num::e4m3_decode(b);
#else
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
#endif
}

// The NVFP4 scale of a finite tile with the given amax (num::nvfp4_quantize_tile): the e4m3
// scale byte and the e2m1 decision thresholds (e2m1_thresholds) of its decoded value.
__device__ __forceinline__ uint8_t nv_tile_scale_byte(float amax) {
  float t = num::mul_rn(amax, num::u2f(num::kInv6Bits));
  const float lo = 1.0f / 512.0f;
  t = t < lo ? lo : (t > 448.0f ? 448.0f : t);
  return static_cast<uint8_t>(e4m3x2_finite(t, t) & 0xFFu);
}
__device__ __forceinline__ uint8_t nv_tile_scale(float amax, float (&thr)[7]) {
  const uint8_t sb = nv_tile_scale_byte(amax);
  e2m1_thresholds(e4m3_decode_finite(sb), thr);
  return sb;
}

// Packed e2m1 decisions (sm_90, bf16x2): the codes of e2m1_quotient_code for two values per
// instruction, the threshold selects and the code assembly in bf16x2 arithmetic (the fma and
// fp16 pipes) rather than logic (the alu pipe, which limited the 256K ratio-1 NVFP4 kernel: alu
// 75% busy, math-pipe-throttle the largest stall after "not selected"; with the selects as
// fmas 60%, session 14). Every constant below is c * sd for an e4m3 scale sd (<= 4 significant
// bits) and a c of <= 4 significant bits, so it, and every sum the selects form, is exact in
// bf16 (FastMathHost.E2m1SelectConstantsAreExactInBf16); bf16 values compare exactly in bf16.
//
// The decision constants of one tile (bf16 in both halves): the thresholds c * sd for c = 0.25,
// 0.75, 1.75 and the differences the selects add (e2m1_thresholds: T0 .. T6 = 0.25, 0.75, 1.25,
// 1.75, 2.5, 3.5, 5 times sd).
struct E2m1Select {
  uint32_t t0;   // T0 = 0.25 sd
  uint32_t t1;   // T1 = 0.75 sd
  uint32_t t3;   // T3 = 1.75 sd (the first decision)
  uint32_t d40;  // T4 - T0 = 2.25 sd
  uint32_t d51;  // T5 - T1 = 2.75 sd
  uint32_t sd;   // T2 - T0 = sd
  uint32_t dh;   // (T6 - T4) - (T2 - T0) = 1.5 sd
};
// The constants from the seven fp32 thresholds of e2m1_thresholds (host and tests: exact
// differences of bf16-exact values).
DSV41KV_HD E2m1Select e2m1_select_of(const float (&thr)[7]) {
  auto b2 = [](float v) { return (num::f2u(v) >> 16) * 0x00010001u; };
  return {b2(thr[0]),          b2(thr[1]),          b2(thr[3]),
          b2(thr[4] - thr[0]), b2(thr[5] - thr[1]), b2(thr[2] - thr[0]),
          b2((thr[6] - thr[4]) - (thr[2] - thr[0]))};
}
// ... and back: the seven thresholds (the element-wise fallbacks).
DSV41KV_HD void e2m1_select_thresholds(const E2m1Select& S, float (&thr)[7]) {
  auto f = [](uint32_t b2) { return num::u2f(b2 << 16); };
  thr[0] = f(S.t0);
  thr[1] = f(S.t1);
  thr[2] = f(S.t0) + f(S.sd);
  thr[3] = f(S.t3);
  thr[4] = f(S.t0) + f(S.d40);
  thr[5] = f(S.t1) + f(S.d51);
  thr[6] = thr[4] + (f(S.sd) + f(S.dh));
}
// The constants of the e4m3 scale byte `sb` (a finite, positive scale): on sm_90 six bf16x2
// multiplies of sd (exact, see above) instead of fp32 products, shifts and duplications.
DSV41KV_HD E2m1Select e2m1_select_bf16x2(uint8_t sb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t sd2 = (num::f2u(e4m3_decode_finite(sb)) >> 16) * 0x00010001u;
  auto mul = [sd2](uint32_t c2) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(c2), "r"(sd2));
    return r;
  };
  return {mul(0x3E803E80u), mul(0x3F403F40u), mul(0x3FE03FE0u), mul(0x40104010u),
          mul(0x40304030u), sd2,              mul(0x3FC03FC0u)};
#else
  float thr[7];
  e2m1_thresholds(e4m3_decode_finite(sb), thr);
  return e2m1_select_of(thr);
#endif
}

// The raw code word of two values: each half the bf16 pattern of 128 + n, n = the value's e2m1
// code (e2m1_quotient_code: magnitude bits 0-2, sign bit 3), so n sits in bits 0-3 (low half)
// and 16-19 (high half), bits 4-7 and 20-23 are zero and bits 8-15, 24-31 hold 0x43
// (e2m1_pack8_raw takes the low byte of each half).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// `ge`: the |v| bf16 patterns the two >= decisions compare, `gt` those of the > decision (the
// same for bf16 values; e2m1_raw_f32x2 passes fp32 values' roundings down and up); `sgn`: the
// values' signs at bits 15 and 31. Decisions as 1.0 / 0.0 (set.*.bf16x2), selects
// t = fma(m, T_hi - T_lo, T_lo), the magnitude code as 128 + m0 + 2 m1 + 4 m2 (its bits 3-7 are
// zero), then the sign bit: the same three decisions as e2m1_quotient_code (|v| >= T3; >= T5 or
// T1; > T6, T4, T2 or T0).
__device__ __forceinline__ uint32_t e2m1_raw_abs(uint32_t ge, uint32_t gt, uint32_t sgn, const E2m1Select& S) {
  uint32_t m2, m1, m0, t1, tl, dhl, t0, c;
  asm("set.ge.bf16x2.bf16x2 %0, %1, %2;" : "=r"(m2) : "r"(ge), "r"(S.t3));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(t1) : "r"(m2), "r"(S.d51), "r"(S.t1));  // T5 or T1
  asm("set.ge.bf16x2.bf16x2 %0, %1, %2;" : "=r"(m1) : "r"(ge), "r"(t1));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(tl) : "r"(m2), "r"(S.d40), "r"(S.t0));   // T4 or T0
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(dhl) : "r"(m2), "r"(S.dh), "r"(S.sd));   // T6-T4 or T2-T0
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(t0) : "r"(m1), "r"(dhl), "r"(tl));       // T6, T4, T2 or T0
  asm("set.gt.bf16x2.bf16x2 %0, %1, %2;" : "=r"(m0) : "r"(gt), "r"(t0));
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(c) : "r"(m0), "r"(0x43004300u));                 // 128 + m0
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(c) : "r"(m1), "r"(0x40004000u), "r"(c));     // + 2 m1
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(c) : "r"(m2), "r"(0x40804080u), "r"(c));     // + 4 m2
  return c | ((sgn >> 12) & 0x00080008u);
}
#endif
DSV41KV_HD uint32_t e2m1_raw_of_codes(uint32_t lo, uint32_t hi) { return (0x4300u + lo) | ((0x4300u + hi) << 16); }
// The raw code word of the two bf16 values packed in `w` (even element in the low half).
DSV41KV_HD uint32_t e2m1_raw_bf16x2(uint32_t w, const E2m1Select& S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = w & 0x7FFF7FFFu;  // |v| of both halves (the writer's amax computes it too)
  return e2m1_raw_abs(a, a, w, S);
#else  // element-wise (older architectures, the host)
  float thr[7];
  e2m1_select_thresholds(S, thr);
  return e2m1_raw_of_codes(e2m1_quotient_code(num::u2f(w << 16), thr),
                           e2m1_quotient_code(num::u2f(w & 0xFFFF0000u), thr));
#endif
}

// The raw code word of two finite fp32 values a (low half) and b (high half), as
// e2m1_raw_bf16x2 does for bf16 values: the thresholds are exact in bf16, so for a non-negative
// fp32 x, x >= T  <=>  down(x) >= T  and  x > T  <=>  up(x) > T, with down / up the bf16 values
// next to x below and above (T is itself one of the bf16 values, and both roundings are
// monotone): the two >= decisions compare |x| truncated to bf16, the > decision |x| rounded up
// (bits + 0xFFFF, then the high half; finite x, so at most +Inf). The same decisions as
// e2m1_quotient_code in fp32.
DSV41KV_HD uint32_t e2m1_raw_f32x2(float a, float b, const E2m1Select& S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t ua = num::f2u(a), ub = num::f2u(b);
  const uint32_t hi = __byte_perm(ua, ub, 0x7632);  // sign and truncated |x| of both
  const uint32_t dn = hi & 0x7FFF7FFFu;
  const uint32_t up = __byte_perm((ua & 0x7FFFFFFFu) + 0xFFFFu, (ub & 0x7FFFFFFFu) + 0xFFFFu, 0x7632);
  return e2m1_raw_abs(dn, up, hi, S);
#else
  float thr[7];
  e2m1_select_thresholds(S, thr);
  return e2m1_raw_of_codes(e2m1_quotient_code(a, thr), e2m1_quotient_code(b, thr));
#endif
}

// __byte_perm on the host (the tests' and the host fallbacks' form).
DSV41KV_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * k)) & 7u))) & 0xFFu) << (8 * k);
  return r;
#endif
}
// Eight e2m1 codes in record order from four raw code words c[b] (values 2b, 2b+1): byte b =
// code(2b) | code(2b+1) << 4. One byte permutation per two words gathers their four codes (the
// halves' low bytes), x + (x >> 4) puts codes 2k+1 next to 2k in bytes 0 and 2, and one more
// permutation joins the two: 5 instructions for 8 values.
// `sel`: the final permutation; 0x2064 instead of 0x6420 puts the second four values' codes in
// the low half (the rotated writer reads of RowRotated).
DSV41KV_HD uint32_t e2m1_pack8_raw(const uint32_t (&c)[4], uint32_t sel = 0x6420u) {
  const uint32_t p01 = byte_perm(c[0], c[1], 0x6420u), p23 = byte_perm(c[2], c[3], 0x6420u);
  // (+ rather than |: the two terms' bits are disjoint, and ptxas makes the sum one LEA.HI)
  return byte_perm(p01 + (p01 >> 4), p23 + (p23 >> 4), sel);
}

// Writes the record of one state (slot already bounded) cooperatively: thread gt of the
// program owns dims [E*gt, E*gt + E); x = latent values, y = x after RoPE. All 32 lanes of every
// warp of the program must call it (shuffles).
// write_record_at: the same with the slot already split into (page, r) = divmod(slot, c.S).
template <int F, int E>
__device__ __forceinline__ void write_record_at(const CacheDst& c, int64_t page, int64_t r, int gt,
                                                const float (&x)[E], const float (&y)[E]) {
  static_assert(E == 16 || E == 4);
  const int d0 = E * gt;
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  if constexpr (F == kV4) {
    const uint32_t mb = tile_reduce_bits<64 / E>(local_amax_bits<E>(x));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint8_t* val = pg + V4Layout::value_offset(c.S, r);
    uint8_t* sc = pg + V4Layout::scale_offset(c.S, r);
    if (d0 < kNopeDim) {
      uint32_t w[E / 4];
      const uint8_t sb = ue8m0_thread<E>(x, amax, fin, w);
      store_words<E / 4>(val + d0, w);
      if (d0 % 64 == 0) sc[d0 / 64] = sb;
    } else {
      uint32_t w[E / 2];
      bf16_encode_packed<E>(y, w);
      store_words<E / 2>(val + kNopeDim + 2 * (d0 - kNopeDim), w);
      if (d0 == kNopeDim) sc[7] = 0;
    }
  } else if constexpr (F == kMx) {
    const uint32_t mb = tile_reduce_bits<32 / E>(local_amax_bits<E>(y));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint32_t w[E / 4];
    const uint8_t sb = ue8m0_thread<E>(y, amax, fin, w);
    store_words<E / 4>(pg + Mxfp8Layout::value_offset(c.S, r) + d0, w);
    if (d0 % 32 == 0) pg[Mxfp8Layout::scale_offset(c.S, r) + d0 / 32] = sb;
  } else if constexpr (F == kNv) {
    const uint32_t mb = tile_reduce_bits<16 / E>(local_amax_bits<E>(y));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint8_t nib[E];
    uint8_t sb;
    if (!fin) {
#pragma unroll
      for (int i = 0; i < E; ++i) nib[i] = 0;
      sb = 0x7F;
    } else {
      // num::nvfp4_quantize_tile, element-wise
      float thr[7];
      sb = nv_tile_scale(amax, thr);
#pragma unroll
      for (int i = 0; i < E; ++i) nib[i] = e2m1_quotient_code(y[i], thr);
    }
    uint8_t* val = pg + Nvfp4Layout::value_offset(c.S, r) + d0 / 2;
    if constexpr (E == 16) {
      uint32_t w[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        w[k] = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[k] |= static_cast<uint32_t>(nib[8 * k + 2 * b] | (nib[8 * k + 2 * b + 1] << 4))
                  << (8 * b);
      }
      store_words<2>(val, w);
    } else {
      store_u16(val, static_cast<uint32_t>(nib[0] | (nib[1] << 4)) |
                         (static_cast<uint32_t>(nib[2] | (nib[3] << 4)) << 8));
    }
    if (d0 % 16 == 0) pg[Nvfp4Layout::scale_offset(c.S, r) + d0 / 16] = sb;
  } else if constexpr (F == kBf16) {
    uint32_t w[E / 2];
    bf16_encode_packed<E>(y, w);
    store_words<E / 2>(pg + r * c.row_stride_bytes + 2 * d0, w);
  } else if constexpr (F == kFp8) {
    uint32_t w[E / 4];
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      w[i] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w[i] |= static_cast<uint32_t>(rec::plain_fp8_encode(y[4 * i + b], c.fp8_inv)) << (8 * b);
    }
    store_words<E / 4>(pg + r * c.row_stride_bytes + d0, w);
  }
}

// The V4 record of one state written by one warp in the writer layout E = 16 (the streaming
// kernel), without the divergence of write_record_at<kV4, 16> (where lanes 0-27 quantise the
// NoPE tiles and lanes 28-31 then rotate and encode 8 RoPE pairs each, one path after the
// other): lanes 0-27 quantise their NoPE dims as there, and then every lane l rotates RoPE pair l
// (dims 448 + 2l, 449 + 2l with cos/sin entries l and 32 + l of the table row) and stores one
// bf16x2 word at value byte 448 + 4l. xr0/xr1 are the latent values of the pair (the same
// bf16-rounded values the owning lane holds in x), cs/sn its table entries. Element-wise the
// same operations as write_record_at (num::rope_forward, bf16_encode_packed, ue8m0_thread), so
// the same bytes. All 32 lanes must call it (shuffles).
__device__ __forceinline__ void write_v4_warp(const CacheDst& c, int64_t page, int64_t r, int lane,
                                              const float (&x)[16], float xr0, float xr1,
                                              float cs, float sn) {
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  uint8_t* val = pg + V4Layout::value_offset(c.S, r);
  uint8_t* sc = pg + V4Layout::scale_offset(c.S, r);
  const uint32_t mb = tile_reduce_bits<4>(local_amax_bits<16>(x));
  if (lane < kNopeDim / 16) {
    uint32_t w[4];
    const uint8_t sb = ue8m0_thread<16>(x, num::u2f(mb), bits_finite(mb), w);
    store_words<4>(val + 16 * lane, w);
    if (lane % 4 == 0) sc[lane / 4] = sb;
  }
  if (lane == kNopeDim / 16) sc[7] = 0;
  float y[2];
  num::rope_forward(xr0, xr1, cs, sn, y[0], y[1]);
  uint32_t w[1];
  bf16_encode_packed<2>(y, w);
  store_words<1>(val + kNopeDim + 4 * lane, w);
}

// The NVFP4 record of one state written by one warp in the writer layout E = 16 (the streaming
// kernel), the way write_v4_warp does V4: lanes 0-27 quantise their NoPE tile (dims 16l..16l+15,
// whose values are the bf16 latent itself, `lw` packed two per word) with e2m1_raw_bf16x2, and
// every lane l quantises the RoPE pair l it rotated (q0, q1: dims 448 + 2l, 449 + 2l; RoPE tile
// 28 + l/8 spans 8 lanes, reduced with shuffles) and stores its one value byte. Replaces
// write_record_at<kNv, 16>, where lanes 28-31 first gathered 16 rotated values with 16 shuffles
// per lane and then ran 16 scalar e2m1 decisions each while the other lanes ran theirs: the same
// scale and the same decisions per element (nv_tile_scale, e2m1_quotient_code), so the same bytes.
// All 32 lanes must call it (shuffles).
// write_nv_warp_at: the same with the record's value and scale addresses already computed.
// rot: the lane's rotation r of its four 4-value chunks (RowRotated: lw[2c], lw[2c+1] hold dims
// 16 lane + 4 (c ^ r) .. + 3), given as the pack selector of r & 1 (e2m1_pack8_raw) and r & 2; 0 for
// dims in order.
struct NvRot {
  uint32_t sel = 0x6420u;  // e2m1_pack8_raw selector: 0x2064 when r & 1
  bool swap = false;       // r & 2: the two code words change places
};
// kAligned8: `val` is 8-byte aligned (the caller checked the cache's base and page stride), so
// the code words go out as one 8-byte store without store_words' alignment branches.
template <bool kAligned8 = false>
__device__ __forceinline__ void write_nv_warp_at(uint8_t* val, uint8_t* sc, int lane, const uint32_t (&lw)[8],
                                                 float q0, float q1, NvRot rot = {}) {
  if (lane < kNopeDim / 16) {
    // tile amax from the packed bf16 words: |v| bits of a bf16 value are its fp32 |v| bits >> 16
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = __vmaxu2(m, lw[i] & 0x7FFF7FFFu);
    const uint32_t mb = max(m & 0xFFFFu, m >> 16) << 16;
    uint32_t out[2] = {0u, 0u};
    uint8_t sb = 0x7F;
    if (bits_finite(mb)) {
      sb = nv_tile_scale_byte(num::u2f(mb));
      const E2m1Select S = e2m1_select_bf16x2(sb);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint32_t cc[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) cc[b] = e2m1_raw_bf16x2(lw[4 * k + b], S);
        out[k] = e2m1_pack8_raw(cc, rot.sel);
      }
    }
    if (rot.swap) {
      const uint32_t o0 = out[0];
      out[0] = out[1];
      out[1] = o0;
    }
    if constexpr (kAligned8) *reinterpret_cast<uint2*>(val + 8 * lane) = make_uint2(out[0], out[1]);
    else store_words<2>(val + 8 * lane, out);
    sc[lane] = sb;
  }
  // RoPE tiles: pair `lane` of tile 28 + lane/8
  const uint32_t mb = tile_reduce_bits<8>(max(num::f2u(q0) & 0x7FFFFFFFu, num::f2u(q1) & 0x7FFFFFFFu));
  uint32_t byte = 0;
  uint8_t sb = 0x7F;
  if (bits_finite(mb)) {
    // both values' decisions in bf16x2 (e2m1_raw_f32x2) rather than two scalar ones
    sb = nv_tile_scale_byte(num::u2f(mb));
    const uint32_t c = e2m1_raw_f32x2(q0, q1, e2m1_select_bf16x2(sb));
    byte = (c & 0x0Fu) | ((c >> 12) & 0xF0u);
  }
  val[kNopeDim / 2 + lane] = static_cast<uint8_t>(byte);
  if (lane % 8 == 0) sc[kNopeDim / 16 + lane / 8] = sb;
}
__device__ __forceinline__ void write_nv_warp(const CacheDst& c, int64_t page, int64_t r, int lane,
                                              const uint32_t (&lw)[8], float q0, float q1) {
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  write_nv_warp_at(pg + Nvfp4Layout::value_offset(c.S, r), pg + Nvfp4Layout::scale_offset(c.S, r), lane, lw, q0,
                   q1);
}

template <int F, int E>
__device__ __forceinline__ void write_record(const CacheDst& c, int64_t slot, int gt,
                                             const float (&x)[E], const float (&y)[E]) {
  int64_t page, r;
  divmod_fast(slot, c.S_div, page, r);
  write_record_at<F, E>(c, page, r, gt, x, y);
}

}  // namespace dsv41kv::detail::cuda
