// Fast device forms of the number formats of numerics.hpp, each bit-identical to the exact form
// it replaces (the proof or the exhaustive test is stated beside it; docs/cuda.md, "Why it is
// bit-identical to the CPU", lists them):
//   * exp32_nonpos / exp32_mid: exp32 without branches, for x <= 0 / x in [-41, 0];
//   * e4m3x2_finite: cvt.rn.satfinite.e4m3x2.f32 (sm_89+) for finite inputs is e4m3_encode
//     (SPEC 2.2 defines the encoder as that instruction, apart from the NaN byte, and it is only
//     used on finite values). -DDSV41KV_CUDA_SOFT_FP8=1 uses the software encoder instead;
//   * e2m1_quotient_code: e2m1_encode(div_rn(v, sd)) without the division, by comparing |v|
//     with the exact products T*sd of the e2m1 decision thresholds T (see the proof below), and
//     its bf16x2 forms (E2m1Select);
//   * bf16_encode_packed: the hardware bf16x2 conversion where no value is a NaN;
//   * local_amax_bits: a tile's amax and finiteness from one unsigned max of |v| bit patterns.
#pragma once

#include <cuda_runtime.h>
#if !defined(DSV41KV_CUDA_SOFT_FP8)
#include <cuda_fp8.h>
#endif

#include <bit>
#include <cstdint>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::detail::cuda {

// ---------------------------------------------------------------- exp32 without branches

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
  const float s = num::exp32_shifted(x);
  const float j = num::sub_rn(s, num::kExp32Shift);
  const float p = num::exp32_poly(num::exp32_reduce(x, j));
  const uint32_t ju = num::f2u(s) - 0x4B400000u;
  const bool sub = static_cast<int>(ju) < -125;
  const uint32_t e1 = ju + (sub ? 64u + 127u : 127u);
  const uint32_t e2 = sub ? static_cast<uint32_t>(-64 + 127) : 127u;
  float v = num::mul_rn(num::mul_rn(p, num::u2f(e1 << 23)), num::u2f(e2 << 23));
  v = (x < -104.0f) ? 0.0f : v;
  v = num::is_nan(x) ? x : v;
  return v;
}

// exp32_nonpos without its special-case selects, for x in [-41, 0] only: there t >= -59.2, so
// ju lies in [-59, 0] (never the subnormal scaling, x is neither < -104 nor NaN) and the value
// is p * 2^ju, exactly what exp32_nonpos returns (its second factor is 1.0f). Outside that range
// the result is garbage and must not be used (pool2_try guards on x).
__device__ __forceinline__ float exp32_mid(float x) {
  const float s = num::exp32_shifted(x);
  const float j = num::sub_rn(s, num::kExp32Shift);
  const float p = num::exp32_poly(num::exp32_reduce(x, j));
  // (ju + 127) << 23 with ju = f2u(s) - 0x4B400000 (0x4B400000 << 23 == 0 mod 2^32)
  return num::mul_rn(p, num::u2f((num::f2u(s) << 23) + 0x3F800000u));
}

// ---------------------------------------------------------------- e2m1 and e4m3

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
// the host for every e4m3 scale: docs/changelog.md, "Bit-identity evidence"; the codes against
// the division on every GPU run: E2m1WithoutDivisionEqualsDivision in
// tests/formats/test_fast_numerics_gpu.cu).
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
  thr[0] = num::mul_rn(num::e2m1_threshold(0), sd);
  thr[1] = num::mul_rn(num::e2m1_threshold(1), sd);
  thr[2] = num::mul_rn(num::e2m1_threshold(2), sd);
  thr[3] = num::mul_rn(num::e2m1_threshold(3), sd);
  thr[4] = num::mul_rn(num::e2m1_threshold(4), sd);
  thr[5] = num::mul_rn(num::e2m1_threshold(5), sd);
  thr[6] = num::mul_rn(num::e2m1_threshold(6), sd);
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

// ---------------------------------------------------------------- bf16 vectors

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
// the hardware's), all E are encoded by bf16_encode. The hardware result is compared with
// bf16_encode for every non-NaN fp32 pattern on every GPU run
// (Bf16AndExp32FormsEqualTheExactOnesOnEveryInput in tests/formats/test_fast_numerics_gpu.cu;
// docs/changelog.md, "Bit-identity evidence").
__device__ __forceinline__ uint32_t bf16x2_rn_hw(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else  // builds for older architectures (CMAKE_CUDA_ARCHITECTURES < 80): the same bits in software
  return static_cast<uint32_t>(num::bf16_encode(lo)) | (static_cast<uint32_t>(num::bf16_encode(hi)) << 16);
#endif
}
// Two fp32 weights as bf16 pairs hi = bf16(p), lo = bf16(p - hi) (packed as bf16x2_rn_hw): the A
// operands of the two products P_hi V + P_lo V of sparse MLA, whose sum carries P to ~2^-17
// instead of bf16's 2^-9 (p - hi is exact in fp32; inputs are finite weights in [0, 1]).
__device__ __forceinline__ void split_bf16x2(float p0, float p1, uint32_t& hi, uint32_t& lo) {
  hi = bf16x2_rn_hw(p0, p1);
  lo = bf16x2_rn_hw(p0 - __uint_as_float(hi << 16), p1 - __uint_as_float(hi & 0xFFFF0000u));
}
// Neither value is a NaN (one setp.num: a == a && b == b). Not !isunordered(a, b): that is a
// host constexpr function (std::isunordered, reached through --expt-relaxed-constexpr) which
// nvcc 13 folds to "unordered" in device code, so the hardware path was dead code and every
// value went through bf16_encode (no F2FP.BF16 in the SASS: docs/changelog.md, v7).
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

// ---------------------------------------------------------------- tile quantization

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
// (FastNumericsGpu.HardwareE4m3DecodeEqualsSoftwareOnEveryFiniteByte).
DSV41KV_HD float e4m3_decode_finite(uint8_t b) {
#if defined(DSV41KV_CUDA_SOFT_FP8) || !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ < 890)
  return num::e4m3_decode(b);
#else
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
#endif
}

// e4m3_decode_finite of the two bytes of a 16-bit pair (low byte: x): one conversion for both.
DSV41KV_HD float2 e4m3x2_decode_finite(uint16_t pair) {
#if defined(DSV41KV_CUDA_SOFT_FP8) || !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ < 890)
  return float2{num::e4m3_decode(static_cast<uint8_t>(pair & 0xFFu)), num::e4m3_decode(static_cast<uint8_t>(pair >> 8))};
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return __half22float2(__half2(h));
#endif
}

// The NVFP4 scale of a finite tile with the given amax (num::nvfp4_quantize_tile): the e4m3
// scale byte and the e2m1 decision thresholds (e2m1_thresholds) of its decoded value.
__device__ __forceinline__ uint8_t nv_tile_scale_byte(float amax) {
  const float t = num::nvfp4_scale_value(amax);
  return static_cast<uint8_t>(e4m3x2_finite(t, t) & 0xFFu);
}
__device__ __forceinline__ uint8_t nv_tile_scale(float amax, float (&thr)[7]) {
  const uint8_t sb = nv_tile_scale_byte(amax);
  e2m1_thresholds(e4m3_decode_finite(sb), thr);
  return sb;
}

// Packed e2m1 decisions (sm_90, bf16x2): the codes of e2m1_quotient_code for two values per
// instruction, the threshold selects and the code assembly in bf16x2 arithmetic (the fma and
// fp16 pipes) rather than logic (the alu pipe, which limited the 256K ratio-1 NVFP4 kernel: under
// ncu the alu pipe was the busiest, about three quarters of its peak, and math-pipe throttle the
// largest stall after "not selected"; with the selects as fmas the alu load fell well below that
// and the kernel ran faster: docs/changelog.md, v27). Every constant below is c * sd for an e4m3
// scale sd (<= 4 significant bits) and a c of <= 4 significant bits, so it, and every sum the
// selects form, is exact in bf16 (FastNumericsHost.E2m1SelectConstantsAreExactInBf16 in
// tests/formats/test_fast_numerics_gpu.cu); bf16 values compare exactly in bf16.
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
// The bf16 bits of a constant (exact in bf16) in both halves of a word.
constexpr uint32_t bf16x2_constant(float v) { return (std::bit_cast<uint32_t>(v) >> 16) * 0x00010001u; }
DSV41KV_HD E2m1Select e2m1_select_bf16x2(uint8_t sb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t sd2 = (num::f2u(e4m3_decode_finite(sb)) >> 16) * 0x00010001u;
  auto mul = [sd2](uint32_t c2) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(c2), "r"(sd2));
    return r;
  };
  // the factors of sd of E2m1Select's fields, from the thresholds T_k of num::e2m1_threshold
  constexpr auto T = num::e2m1_threshold;
  constexpr uint32_t c_t0 = bf16x2_constant(T(0)), c_t1 = bf16x2_constant(T(1)), c_t3 = bf16x2_constant(T(3));
  constexpr uint32_t c_d40 = bf16x2_constant(T(4) - T(0)), c_d51 = bf16x2_constant(T(5) - T(1));
  constexpr uint32_t c_dh = bf16x2_constant((T(6) - T(4)) - (T(2) - T(0)));
  static_assert(c_t0 == 0x3E803E80u && c_t1 == 0x3F403F40u && c_t3 == 0x3FE03FE0u && c_d40 == 0x40104010u &&
                c_d51 == 0x40304030u && c_dh == 0x3FC03FC0u && (T(2) - T(0)) == 1.0f);
  return {mul(c_t0), mul(c_t1), mul(c_t3), mul(c_d40), mul(c_d51), sd2, mul(c_dh)};
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

}  // namespace dsv41kv::detail::cuda
