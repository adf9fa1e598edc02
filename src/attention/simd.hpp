// Eight fp32 lanes for the attention engine's inner loops (kernel.hpp): AVX + FMA registers where
// the build targets them (the host flags carry -mfma, DSV41KV_HOST_FMA), else eight scalars. Every
// operation is the lane-wise IEEE operation of the scalar primitives in numerics.hpp (fma_rn,
// mul_rn, add_rn: one rounding each, round to nearest even), so both forms give the same bits.
// Private to attention/.
#pragma once

#include "dsv41kv/numerics.hpp"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define DSV41KV_ATTN_AVX 1
#endif

namespace dsv41kv::detail::attn {

#if defined(DSV41KV_ATTN_AVX)
struct V8 {
  __m256 v;
};
inline V8 v8_zero() { return {_mm256_setzero_ps()}; }
inline V8 v8_load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void v8_store(float* p, V8 a) { _mm256_storeu_ps(p, a.v); }
inline V8 v8_set(float x) { return {_mm256_set1_ps(x)}; }
inline V8 v8_fma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c, one rounding
inline V8 v8_mul(V8 a, V8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V8 v8_add(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
#else
struct V8 {
  float v[8];
};
inline V8 v8_zero() { return {}; }
inline V8 v8_load(const float* p) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = p[i];
  return r;
}
inline void v8_store(float* p, V8 a) {
  for (int i = 0; i < 8; ++i) p[i] = a.v[i];
}
inline V8 v8_set(float x) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = x;
  return r;
}
inline V8 v8_fma(V8 a, V8 b, V8 c) {
  for (int i = 0; i < 8; ++i) c.v[i] = num::fma_rn(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline V8 v8_mul(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.v[i] = num::mul_rn(a.v[i], b.v[i]);
  return a;
}
inline V8 v8_add(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.v[i] = num::add_rn(a.v[i], b.v[i]);
  return a;
}
#endif

}  // namespace dsv41kv::detail::attn
