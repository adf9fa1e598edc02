// The e4m3 decode of SPEC 2.2 in AVX-512 registers, for the CPU's AVX-512 forms (core/cpu_form.hpp):
// a code's bits moved into an fp16 (sign to bit 15, the 4 exponent and 3 mantissa bits to bits
// 13..7: exponent bias 7 becomes 15, subnormals stay subnormals) is exactly the code's value times
// 2^-8, which vcvtph2ps widens exactly (the GPU's e4m3_decode_finite takes the same route). The
// NaN codes (x & 0x7F == 0x7F) are not decoded; their lanes are reported apart. Checked against
// num::e4m3_decode on every code (tests/formats/test_records.cpp).
#pragma once

#include <cstdint>

#include "core/cpu_form.hpp"

#if defined(DSV41KV_AVX512_FORMS)

namespace dsv41kv::detail::e4m3x16 {

// The fp16 bits of codes zero-extended to 16-bit lanes: t = code << 7 puts the 7 low bits at
// 13..7 and the sign at 14; adding t's bit 14 to itself moves it to bit 15.
DSV41KV_AVX512 inline __m256i fp16_bits(__m256i w) {
  const __m256i t = _mm256_slli_epi16(w, 7);
  return _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
}
DSV41KV_AVX512 inline __m512i fp16_bits(__m512i w) {
  const __m512i t = _mm512_slli_epi16(w, 7);
  return _mm512_add_epi16(t, _mm512_and_si512(t, _mm512_set1_epi16(0x4000)));
}

// The values of 16 codes times 2^-8 (any finite code exactly).
DSV41KV_AVX512 inline __m512 scaled(__m128i codes) { return _mm512_cvtph_ps(fp16_bits(_mm256_cvtepu8_epi16(codes))); }

// The lanes of 16 or 64 codes that are NaN codes.
DSV41KV_AVX512 inline __mmask16 nan_lanes(__m128i codes) {
  const __m128i m = _mm_set1_epi8(0x7F);
  return _mm_cmpeq_epi8_mask(_mm_and_si128(codes, m), m);
}
DSV41KV_AVX512 inline __mmask64 nan_lanes(__m512i codes) {
  const __m512i m = _mm512_set1_epi8(0x7F);
  return _mm512_cmpeq_epi8_mask(_mm512_and_si512(codes, m), m);
}

// 2^8 as fp32: scaled() times it is the value.
inline constexpr float kUnscale = 256.0f;

}  // namespace dsv41kv::detail::e4m3x16

#endif  // DSV41KV_AVX512_FORMS
