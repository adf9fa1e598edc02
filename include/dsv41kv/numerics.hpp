// dsv41kv: the number formats of SPEC section 2 and the portable fp32 primitives that the
// CPU and CUDA paths share. Everything here is written once as host+device code so that both
// backends round identically (SPEC 0.4): explicit *_rn operations on the device, and host code
// compiled with -ffp-contract=off.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "dsv41kv/common.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace dsv41kv::num {

// ---------------------------------------------------------------- bit casts and exact ops

DSV41KV_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
DSV41KV_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Correctly rounded fp32 operations. On the host they rely on -ffp-contract=off (set for every
// target by the build); on the device the intrinsics forbid contraction and approximation.
DSV41KV_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSV41KV_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DSV41KV_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
DSV41KV_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DSV41KV_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
DSV41KV_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
DSV41KV_HD float abs_f(float a) { return u2f(f2u(a) & 0x7FFFFFFFu); }
DSV41KV_HD bool is_nan(float a) { return (f2u(a) & 0x7FFFFFFFu) > 0x7F800000u; }
DSV41KV_HD bool is_finite(float a) { return (f2u(a) & 0x7F800000u) != 0x7F800000u; }
// max that ignores nothing special: inputs are finite where it is used; a NaN operand returns
// the other operand exactly like fmaxf, and tiles with non-finite values are handled apart.
DSV41KV_HD float max_f(float a, float b) { return (a > b || is_nan(b)) ? a : b; }

// Exact power of two 2^e as fp32 for -126 <= e <= 127.
DSV41KV_HD float exp2i(int e) { return u2f(static_cast<uint32_t>(e + 127) << 23); }

// ---------------------------------------------------------------- bf16 (SPEC 2.1)

DSV41KV_HD uint16_t bf16_encode(float x) {
  const uint32_t u = f2u(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // DECISION: canonical NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
DSV41KV_HD float bf16_decode(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }
DSV41KV_HD float bf16_round(float x) { return bf16_decode(bf16_encode(x)); }

// ---------------------------------------------------------------- e4m3fn (SPEC 2.2)

DSV41KV_HD float e4m3_decode(uint8_t q) {
  const uint32_t s = (q >> 7) & 1u, e = (q >> 3) & 0xFu, m = q & 7u;
  float v;
  if (e == 15 && m == 7) {
    v = u2f(0x7FC00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * (1.0f / 512.0f);  // exact
  } else {
    v = u2f(((e - 7 + 127) << 23) | (m << 20));
  }
  return s ? -v : v;
}

// Round-to-nearest-even, saturating to +-448, NaN -> 0x7F (equivalent to
// cvt.rn.satfinite.e4m3x2.f32 apart from the canonical NaN).
DSV41KV_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = f2u(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << 7);
  if (a >= 0x43E00000u) return sign | 0x7E;  // |x| >= 448 (incl. Inf) saturates
  uint32_t code;
  if (a >= 0x3C800000u) {  // |x| >= 2^-6: normal e4m3
    const uint32_t fe = a >> 23;          // fp32 biased exponent, 121..135
    const uint32_t m = a & 0x7FFFFFu;
    uint32_t mr = (m + 0x7FFFFu + ((m >> 20) & 1u)) >> 20;  // RNE to 3 bits, may carry to 8
    uint32_t e = fe - 127 + 7;
    code = (e << 3) + mr;  // a carry (mr == 8) increments the exponent naturally
  } else {
    // Subnormal range: multiples of 2^-9. a * 2^9 is exact; round half to even.
    const float q = u2f(a) * 512.0f;  // < 8
    const uint32_t fl = static_cast<uint32_t>(q);
    const float frac = q - static_cast<float>(fl);  // exact
    uint32_t r = fl;
    if (frac > 0.5f || (frac == 0.5f && (fl & 1u))) r = fl + 1;
    code = r;  // r == 8 is 0x08, the smallest normal 2^-6
  }
  return sign | static_cast<uint8_t>(code);
}

// ---------------------------------------------------------------- e2m1 (SPEC 2.3)

DSV41KV_HD float e2m1_decode(uint8_t nibble) {
  const uint32_t m = nibble & 7u;
  // 0, 0.5, 1, 1.5 for m < 4; 2, 3, 4, 6 = 2^(m/2-1) * (1 or 1.5) above
  const float mag = m < 4 ? static_cast<float>(m) * 0.5f
                          : static_cast<float>(1u << (m / 2 - 1)) * ((m & 1u) ? 1.5f : 1.0f);
  return (nibble & 8u) ? -mag : mag;
}

// The decision thresholds T_0 .. T_6 of e2m1_encode: the midpoints between neighbouring
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. A magnitude exactly at a threshold goes to the even code:
// down at T_0, T_2, T_4, T_6, up at T_1, T_3, T_5. The device forms (formats/cuda/fast_numerics.cuh)
// compare with these thresholds times the tile scale.
DSV41KV_HD constexpr float e2m1_threshold(int k) {
  return k == 0 ? 0.25f : k == 1 ? 0.75f : k == 2 ? 1.25f : k == 3 ? 1.75f : k == 4 ? 2.5f : k == 5 ? 3.5f : 5.0f;
}

// Round-to-nearest, ties to the even code, saturating at 6. Never called on NaN (SPEC 2.6).
DSV41KV_HD uint8_t e2m1_encode(float x) {
  const float a = abs_f(x);
  uint8_t c;
  if (a <= e2m1_threshold(0)) c = 0;
  else if (a < e2m1_threshold(1)) c = 1;
  else if (a <= e2m1_threshold(2)) c = 2;
  else if (a < e2m1_threshold(3)) c = 3;
  else if (a <= e2m1_threshold(4)) c = 4;
  else if (a < e2m1_threshold(5)) c = 5;
  else if (a <= e2m1_threshold(6)) c = 6;
  else c = 7;
  return static_cast<uint8_t>(c | ((f2u(x) >> 31) << 3));
}

// ---------------------------------------------------------------- UE8M0 (SPEC 2.4)

// ceil(log2(x)) for a positive finite fp32 x, exactly, from its bits.
DSV41KV_HD int ceil_log2(float x) {
  const uint32_t u = f2u(x) & 0x7FFFFFFFu;
  const int E = static_cast<int>(u >> 23);
  const uint32_t M = u & 0x7FFFFFu;
  if (E != 0) return (E - 127) + (M != 0 ? 1 : 0);
  int k = 31;
  while (k > 0 && !((M >> k) & 1u)) --k;  // k = floor(log2 M), M > 0
  return k - 149 + (M != (1u << k) ? 1 : 0);
}

inline constexpr uint32_t kAmaxFloorBits = 0x38D1B717u;   // fp32(1e-4)
inline constexpr uint32_t kInv448Bits = 0x3B124925u;      // fp32(1/448)
inline constexpr uint32_t kInv6Bits = 0x3E2AAAABu;        // fp32(1/6)

// UE8M0 exponent of a tile with the given finite amax (before the 1e-4 floor).
// x = max(amax, 1e-4) * (1/448) lies in [2.2e-7, FLT_MAX / 448]: a positive normal number, so
// ceil_log2's subnormal search is never needed (the kernels spent a loop and three branch
// instructions per tile on it).
DSV41KV_HD int ue8m0_exponent(float amax) {
  const float a = max_f(amax, u2f(kAmaxFloorBits));
  const uint32_t u = f2u(mul_rn(a, u2f(kInv448Bits)));
  return (static_cast<int>(u >> 23) - 127) + ((u & 0x7FFFFFu) != 0 ? 1 : 0);
}
DSV41KV_HD uint8_t ue8m0_byte(int e) {
  const int b = e + 127;
  return static_cast<uint8_t>(b < 0 ? 0 : (b > 255 ? 255 : b));
}

// Quantize an n-element tile with one UE8M0 scale: values -> q[0..n), returns the scale byte.
// Non-finite tiles are poisoned: scale 255, every value 0x7F (SPEC 2.6).
DSV41KV_HD uint8_t ue8m0_quantize_tile(const float* v, int n, uint8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && is_finite(v[i]);
    amax = max_f(amax, abs_f(v[i]));
  }
  if (!finite) {
    for (int i = 0; i < n; ++i) q[i] = 0x7F;
    return 255;
  }
  const int e = ue8m0_exponent(amax);
  const float inv = exp2i(-e);  // e in [-22, 120]: 2^-e is a normal fp32
  for (int i = 0; i < n; ++i) q[i] = e4m3_encode(mul_rn(v[i], inv));
  return ue8m0_byte(e);
}
DSV41KV_HD float ue8m0_scale(uint8_t byte) {
  // 2^(byte-127); byte 0 is 2^-127 (subnormal fp32), 255 is treated as 2^128 = Inf.
  if (byte == 0) return u2f(0x00400000u);
  return u2f(static_cast<uint32_t>(byte) << 23);
}

// ---------------------------------------------------------------- NVFP4 tile (SPEC 2.5)

// The value whose e4m3 code is the scale byte of a finite NVFP4 tile with this amax:
// clamp(amax * fp32(1/6), 2^-9, 448) (DECISION 4: the multiply by fp32(1/6), not a division).
DSV41KV_HD float nvfp4_scale_value(float amax) {
  const float t = mul_rn(amax, u2f(kInv6Bits));
  const float lo = 1.0f / 512.0f;
  return t < lo ? lo : (t > 448.0f ? 448.0f : t);
}

// Quantize 16 values: packed[0..8) (even element in the low nibble), returns the e4m3 scale.
DSV41KV_HD uint8_t nvfp4_quantize_tile(const float* v, uint8_t* packed) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 16; ++i) {
    finite = finite && is_finite(v[i]);
    amax = max_f(amax, abs_f(v[i]));
  }
  if (!finite) {
    for (int i = 0; i < 8; ++i) packed[i] = 0;
    return 0x7F;
  }
  const uint8_t sbyte = e4m3_encode(nvfp4_scale_value(amax));
  const float sd = e4m3_decode(sbyte);
  for (int i = 0; i < 8; ++i) {
    const uint8_t a = e2m1_encode(div_rn(v[2 * i], sd));
    const uint8_t b = e2m1_encode(div_rn(v[2 * i + 1], sd));
    packed[i] = static_cast<uint8_t>(a | (b << 4));
  }
  return sbyte;
}

// ---------------------------------------------------------------- exp32 (SPEC 4.6)

// The parts of exp32, shared with its branch-free device forms (formats/cuda/fast_numerics.cuh):
// the shifted product s = x * log2(e) + 1.5 * 2^23, whose low bits hold j = round-half-even(x *
// log2(e)) and j = s - 1.5 * 2^23 exactly (for |x * log2(e)| < 2^22); the Cody-Waite reduction
// r = x - j * ln2 with ln2 = 0.693359375 - 2.12194440e-4 (the high part's product is exact); and
// the degree-7 polynomial in Horner form with explicit fma (Cephes coefficients).
inline constexpr float kExp32Shift = 12582912.0f;  // 1.5 * 2^23
DSV41KV_HD float exp32_shifted(float x) { return add_rn(mul_rn(x, 1.44269502162933349609375f), kExp32Shift); }
DSV41KV_HD float exp32_reduce(float x, float j) {
  const float r = fma_rn(j, -0.693359375f, x);
  return fma_rn(j, 2.12194440e-4f, r);
}
DSV41KV_HD float exp32_poly(float r) {
  float p = 1.9875691500e-4f;
  p = fma_rn(p, r, 1.3981999507e-3f);
  p = fma_rn(p, r, 8.3334519073e-3f);
  p = fma_rn(p, r, 4.1665795894e-2f);
  p = fma_rn(p, r, 1.6666665459e-1f);
  p = fma_rn(p, r, 5.0000001201e-1f);
  p = fma_rn(p, r, 1.0f);
  return fma_rn(p, r, 1.0f);
}

// Portable fp32 exponential: exp32(x) = exp32_poly(r) * 2^j. exp32(0) == 1 exactly;
// exp32(x) == 0 for x < -104; error <= 2 ulp (tested against binary64 over the whole range).
DSV41KV_HD float exp32(float x) {
  if (is_nan(x)) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 88.72283935546875f) return u2f(0x7F800000u);
  const float j = sub_rn(exp32_shifted(x), kExp32Shift);
  const float p = exp32_poly(exp32_reduce(x, j));
  int ji = static_cast<int>(j);
  if (ji < -125) {  // subnormal result: scale in two exact-then-one-rounding steps
    return mul_rn(mul_rn(p, exp2i(ji + 64)), exp2i(-64));
  }
  if (ji > 127) return mul_rn(mul_rn(p, exp2i(127)), exp2i(ji - 127));
  return mul_rn(p, exp2i(ji));
}

// ---------------------------------------------------------------- RoPE pair (SPEC 1.4)

// Forward GPT-J rotation of one pair with the reference contraction:
// y0 = fma(x0, c, -(x1*s)), y1 = fma(x1, c, x0*s), products rounded to fp32.
DSV41KV_HD void rope_forward(float x0, float x1, float c, float s, float& y0, float& y1) {
  const float x1s = mul_rn(x1, s);
  const float x0s = mul_rn(x0, s);
  y0 = fma_rn(x0, c, -x1s);
  y1 = fma_rn(x1, c, x0s);
}
DSV41KV_HD void rope_inverse(float x0, float x1, float c, float s, float& y0, float& y1) {
  const float x1s = mul_rn(x1, s);
  const float x0s = mul_rn(x0, s);
  y0 = fma_rn(x0, c, x1s);
  y1 = fma_rn(x1, c, -x0s);
}

// The forward rotation of one vector's 64 RoPE dims v[0..64) in place: the 32 GPT-J pairs
// (v[2i], v[2i+1]) with c = trow[i], s = trow[32 + i] of one table row (32 cos | 32 sin). `v`
// points at the first RoPE dim: dim 448 of a 512-d latent, dim 64 of a 128-d index head.
DSV41KV_HD void rope_forward_dims(float* v, const float* trow) {
  for (int i = 0; i < 32; ++i) rope_forward(v[2 * i], v[2 * i + 1], trow[i], trow[32 + i], v[2 * i], v[2 * i + 1]);
}

}  // namespace dsv41kv::num
