// The AVX-512 form of the indexer's scores (avx512.hpp). Every function carries the AVX-512 target
// attribute and is called only where the CPU has it (cpu.cpp's dispatch).
//
// A group of 24 entries, 6 at a time: the keys decoded to binary64 [entry][d] (value * 2^-8: the
// fp16 route, widened twice, exact), D = q . k by register blocks of 32 heads (4 vectors of 8 lanes) x 6
// entries (24 accumulators; per d, 4 query loads and 6 key broadcasts feed 24 FMAs, exact like
// every operation on D), then per 8 entries an 8 x 8 transpose of each block of heads so that the
// head sum runs with entries in lanes: I = sum over h ascending of w[h] * max(0, D[h]) (one
// product and one sum per head, each rounded as the portable form rounds it; maxpd(0, D) returns
// D for a NaN or -0 as `D < 0 ? 0 : D` does), times sk, one rounding to fp32.
#include "core/cpu_form.hpp"

#if defined(DSV41KV_AVX512_FORMS)

#include <algorithm>

#include "formats/e4m3_avx512.hpp"
#include "indexer/avx512.hpp"

namespace dsv41kv::detail::indexer_avx512 {
namespace {

constexpr int kH = kIndexHeads;
constexpr int kDim = kIndexHeadDim;
constexpr int kTileEntries = 6;

// 32 codes as binary64 values * 2^-8 into out[0..32).
DSV41KV_AVX512 inline void decode32(const uint8_t* codes, double* out) {
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  const __m512i h = e4m3x16::fp16_bits(_mm512_cvtepu8_epi16(c));
  const __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  const __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  _mm512_store_pd(out, _mm512_cvtps_pd(_mm512_castps512_ps256(f0)));
  _mm512_store_pd(out + 8, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f0), 1))));
  _mm512_store_pd(out + 16, _mm512_cvtps_pd(_mm512_castps512_ps256(f1)));
  _mm512_store_pd(out + 24, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f1), 1))));
}

// The 128 codes of one entry; true when one of them is a NaN code.
DSV41KV_AVX512 inline bool decode_key(const uint8_t* codes, double* out) {
  for (int i = 0; i < kDim; i += 32) decode32(codes + i, out + i);
  static_assert(kDim == 128);
  return (e4m3x16::nan_lanes(_mm512_loadu_si512(codes)) | e4m3x16::nan_lanes(_mm512_loadu_si512(codes + 64))) != 0;
}

// D[e][h] for the 6 entries of k [6][128] and all 32 heads, every D an exact sum over d.
DSV41KV_AVX512 inline void d_tile(const double* q, const double* k, double* D) {
  __m512d acc[4][kTileEntries];
#pragma GCC unroll 8
  for (int a = 0; a < 4; ++a)
#pragma GCC unroll 8
    for (int e = 0; e < kTileEntries; ++e) acc[a][e] = _mm512_setzero_pd();
#pragma GCC unroll 4
  for (int d = 0; d < kDim; ++d) {
    __m512d qv[4];
#pragma GCC unroll 8
    for (int a = 0; a < 4; ++a) qv[a] = _mm512_load_pd(q + d * kH + 8 * a);
#pragma GCC unroll 8
    for (int e = 0; e < kTileEntries; ++e) {
      const __m512d kk = _mm512_set1_pd(k[e * kDim + d]);
#pragma GCC unroll 8
      for (int a = 0; a < 4; ++a) acc[a][e] = _mm512_fmadd_pd(qv[a], kk, acc[a][e]);
    }
  }
#pragma GCC unroll 8
  for (int a = 0; a < 4; ++a)
#pragma GCC unroll 8
    for (int e = 0; e < kTileEntries; ++e) _mm512_store_pd(D + e * kH + 8 * a, acc[a][e]);
}

// r[i][j] -> r[j][i] for an 8 x 8 block of binary64 values (moves only).
DSV41KV_AVX512 inline void transpose8(__m512d r[8]) {
  __m512d t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]);
  }
  const __m512i lo2 = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi2 = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      u[4 * i + j] = _mm512_permutex2var_pd(t[4 * i + j], lo2, t[4 * i + j + 2]);
      u[4 * i + j + 2] = _mm512_permutex2var_pd(t[4 * i + j], hi2, t[4 * i + j + 2]);
    }
  const __m512i lo4 = _mm512_set_epi64(11, 10, 9, 8, 3, 2, 1, 0), hi4 = _mm512_set_epi64(15, 14, 13, 12, 7, 6, 5, 4);
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_permutex2var_pd(u[i], lo4, u[i + 4]);
    r[i + 4] = _mm512_permutex2var_pd(u[i], hi4, u[i + 4]);
  }
}

}  // namespace

DSV41KV_AVX512 bool load_query(const uint8_t* q8, const float* w, Query& qy) {
  bool nan = false;
  for (int h = 0; h < kH; ++h) {
    alignas(64) double row[kDim];
    nan |= decode_key(q8 + h * kDim, row);
    for (int d = 0; d < kDim; ++d) qy.q[d * kH + h] = row[d] * 65536.0;  // (value * 2^-8) * 2^16, exact
    qy.w[h] = static_cast<double>(w[h]);
  }
  return !nan;
}

DSV41KV_AVX512 uint32_t scores(const Query& qy, const uint8_t* const* codes, const float* sk, int n, float* out,
                              double* unrounded) {
  alignas(64) double k[kTileEntries * kDim];  // decoded per tile: the query (32 KiB) stays in L1
  alignas(64) double D[kGroup * kH];
  uint32_t nan = 0;
  for (int e0 = 0; e0 < kGroup; e0 += kTileEntries) {
    for (int e = 0; e < kTileEntries; ++e)  // a short group repeats its last entry
      if (decode_key(codes[std::min(e0 + e, n - 1)], k + e * kDim)) nan |= 1u << (e0 + e);
    d_tile(qy.q, k, D + e0 * kH);
  }
  alignas(64) double res[kGroup];
  alignas(32) float res32[kGroup];
  for (int g = 0; g < kGroup; g += 8) {
    __m512d I = _mm512_setzero_pd();
    for (int hb = 0; hb < kH; hb += 8) {
      __m512d r[8];
      for (int e = 0; e < 8; ++e) r[e] = _mm512_load_pd(D + (g + e) * kH + hb);
      transpose8(r);  // r[h] = D of the 8 entries at head hb + h
      for (int h = 0; h < 8; ++h)
        I = _mm512_add_pd(I, _mm512_mul_pd(_mm512_set1_pd(qy.w[hb + h]), _mm512_max_pd(_mm512_setzero_pd(), r[h])));
    }
    alignas(64) double s[8];
    for (int e = 0; e < 8; ++e) s[e] = static_cast<double>(sk[std::min(g + e, n - 1)]);
    I = _mm512_mul_pd(I, _mm512_load_pd(s));
    _mm512_store_pd(res + g, I);
    _mm256_store_ps(res32 + g, _mm512_cvtpd_ps(I));
  }
  std::copy(res32, res32 + n, out);
  if (unrounded != nullptr) std::copy(res, res + n, unrounded);
  return nan & (n >= 32 ? ~0u : (1u << n) - 1u);
}

}  // namespace dsv41kv::detail::indexer_avx512

#endif  // DSV41KV_AVX512_FORMS
