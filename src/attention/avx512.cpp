// The AVX-512 form of the attention engine's block loops (avx512.hpp). Every function carries the
// AVX-512 target attribute and is called only where the CPU has it (kernel.hpp's dispatch).
//
// Register blocks: the scores take up to 4 head chunks (64 heads) x 6 keys per pass (24
// accumulators; per d, 4 query loads and 6 key broadcasts feed 24 FMAs), over d in tiles that keep
// the tile's queries in L1 (a score's partial sum waits in z between tiles: stored and reloaded
// as the fp32 it is, the chain goes on unchanged); the PV product takes 4 chunks x 6 dims per pass,
// and merges each tile into the fold so far as it leaves the registers when asked.
#include "core/cpu_form.hpp"

#if defined(DSV41KV_AVX512_FORMS)

#include <algorithm>
#include <cmath>

#include "attention/avx512.hpp"
#include "dsv41kv/attention.hpp"

namespace dsv41kv::detail::attn::avx512 {
namespace {

constexpr int kL = 16;  // lanes of a head chunk
constexpr int kB = kDecodeKeyBlock;
constexpr int kD = kLatentDim;
constexpr int kDTile = 512;  // dims per score pass: 64 heads x 128 dims of q = 32 KiB

// Accumulators of chunks [0, NC) x keys [0, NK) over dims [d0, d1): from 0 when d0 == 0 (else the
// partial sums stored in z), times the scale when d1 == kD.
template <int NC, int NK>
DSV41KV_AVX512 inline void scores_tile(const float* q, const float* k, int d0, int d1, __m512 sc, float* z) {
  __m512 acc[NC][NK];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) acc[c][j] = d0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(z + c * kB * kL + j * kL);
  for (int d = d0; d < d1; ++d) {
    __m512 qv[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + c * kD * kL + d * kL);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const __m512 kk = _mm512_set1_ps(k[j * kD + d]);
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) acc[c][j] = _mm512_fmadd_ps(qv[c], kk, acc[c][j]);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j)
      _mm512_storeu_ps(z + c * kB * kL + j * kL, d1 == kD ? _mm512_mul_ps(sc, acc[c][j]) : acc[c][j]);
}

template <int NC>
DSV41KV_AVX512 void scores_chunks(const float* q, const float* kb, int n, __m512 sc, float* z) {
  for (int d0 = 0; d0 < kD; d0 += kDTile) {
    const int d1 = d0 + kDTile;
    int j = 0;
    for (; j + 6 <= n; j += 6) scores_tile<NC, 6>(q, kb + j * kD, d0, d1, sc, z + j * kL);
    switch (n - j) {
      case 5: scores_tile<NC, 5>(q, kb + j * kD, d0, d1, sc, z + j * kL); break;
      case 4: scores_tile<NC, 4>(q, kb + j * kD, d0, d1, sc, z + j * kL); break;
      case 3: scores_tile<NC, 3>(q, kb + j * kD, d0, d1, sc, z + j * kL); break;
      case 2: scores_tile<NC, 2>(q, kb + j * kD, d0, d1, sc, z + j * kL); break;
      case 1: scores_tile<NC, 1>(q, kb + j * kD, d0, d1, sc, z + j * kL); break;
      default: break;
    }
  }
}

// acc[c][d0 + i] for chunks [0, NC) and dims [d0, d0 + ND); with MERGE, acc is the fold so far and
// takes acc * fa + (the chain) * fb, the chunk's merge factors fa[c], fb[c].
template <int NC, int ND, bool MERGE>
DSV41KV_AVX512 inline void pv_tile(const float* p, const float* kb, int n, int d0, float* acc, const __m512* fa,
                                   const __m512* fb) {
  __m512 a[NC][ND];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i) a[c][i] = _mm512_setzero_ps();
  for (int j = 0; j < n; ++j) {
    __m512 pv[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) pv[c] = _mm512_loadu_ps(p + c * kB * kL + j * kL);
    const float* kj = kb + j * kD + d0;
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i) {
      const __m512 x = _mm512_set1_ps(kj[i]);
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) a[c][i] = _mm512_fmadd_ps(pv[c], x, a[c][i]);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i) {
      float* r = acc + c * kD * kL + (d0 + i) * kL;
      if constexpr (MERGE)
        _mm512_storeu_ps(r, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(r), fa[c]), _mm512_mul_ps(a[c][i], fb[c])));
      else
        _mm512_storeu_ps(r, a[c][i]);
    }
}

template <int NC, bool MERGE>
DSV41KV_AVX512 void pv_chunks(const float* p, const float* kb, int n, float* acc, const float* fa, const float* fb) {
  __m512 va[NC], vb[NC];
  for (int c = 0; c < NC; ++c) {
    va[c] = MERGE ? _mm512_loadu_ps(fa + c * kL) : _mm512_setzero_ps();
    vb[c] = MERGE ? _mm512_loadu_ps(fb + c * kL) : _mm512_setzero_ps();
  }
  constexpr int kLast = kD % 6;  // 512 = 85 * 6 + 2
  int d0 = 0;
  for (; d0 + 6 <= kD; d0 += 6) pv_tile<NC, 6, MERGE>(p, kb, n, d0, acc, va, vb);
  if constexpr (kLast > 0) pv_tile<NC, kLast, MERGE>(p, kb, n, d0, acc, va, vb);
}

template <bool MERGE>
DSV41KV_AVX512 void pv_all(const float* p, const float* kb, int n, int chunks, float* acc, const float* fa,
                           const float* fb) {
  for (int c = 0; c < chunks; c += 4) {
    const float* pc = p + c * kB * kL;
    float* ac = acc + c * kD * kL;
    const float* ca = MERGE ? fa + c * kL : nullptr;
    const float* cb = MERGE ? fb + c * kL : nullptr;
    switch (std::min(chunks - c, 4)) {
      case 4: pv_chunks<4, MERGE>(pc, kb, n, ac, ca, cb); break;
      case 3: pv_chunks<3, MERGE>(pc, kb, n, ac, ca, cb); break;
      case 2: pv_chunks<2, MERGE>(pc, kb, n, ac, ca, cb); break;
      default: pv_chunks<1, MERGE>(pc, kb, n, ac, ca, cb); break;
    }
  }
}

// exp of 8 binary64 arguments rounded to fp32, with the lanes whose rounding it cannot vouch for in
// `hard` (the caller takes std::exp there). In range (-87 <= x <= 0, so that exp(x) is a normal
// fp32 number): x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite, k * C1 exact), exp(r) by the
// degree-12 Taylor polynomial (Horner, one rounding per step), times 2^k (exact). Its relative
// error is below 2^-50, 8 units in the last place of the binary64 result v; a lane is hard when v
// lies within 2^10 units of a midpoint between two fp32 numbers (the 29 bits below fp32 precision
// within 2^10 of 2^28). Elsewhere v, the exact exp(x) and any exp within 2^10 - 8 units of it
// (std::exp: within one) round to the same fp32 number. Below -104, exp(x) < 2^-150 (exp(-104)
// is 3% below it), half the least fp32 subnormal: +0. Between -104 and -87 (subnormal results)
// and for NaN: hard.
DSV41KV_AVX512 inline __m256 exp_f32(__m512d x, __mmask8& hard) {
  const __mmask8 in = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-87.0), _CMP_GE_OQ) &
                      _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_LE_OQ);
  const __mmask8 zero = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-104.0), _CMP_LT_OQ);
  x = _mm512_maskz_mov_pd(in, x);
  const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.93147180369123816490e-01), x);  // C1: 32 bits
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.90821492927058770002e-10), r);          // C2
  constexpr double kInvFact[13] = {1.0,
                                   1.0,
                                   1.0 / 2,
                                   1.0 / 6,
                                   1.0 / 24,
                                   1.0 / 120,
                                   1.0 / 720,
                                   1.0 / 5040,
                                   1.0 / 40320,
                                   1.0 / 362880,
                                   1.0 / 3628800,
                                   1.0 / 39916800,
                                   1.0 / 479001600};
  __m512d p = _mm512_set1_pd(kInvFact[12]);
#pragma GCC unroll 12
  for (int i = 11; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[i]));
  const __m512d v = _mm512_scalef_pd(p, k);
  const __m512i low = _mm512_and_si512(_mm512_castpd_si512(v), _mm512_set1_epi64(0x1FFFFFFF));
  const __m512i dist = _mm512_abs_epi64(_mm512_sub_epi64(low, _mm512_set1_epi64(0x10000000)));
  hard = static_cast<__mmask8>((~in & ~zero) | _mm512_mask_cmp_epi64_mask(in, dist, _mm512_set1_epi64(1 << 10), _MM_CMPINT_LE));
  return _mm512_cvtpd_ps(_mm512_maskz_mov_pd(in, v));
}

// num::max_f(a, b) = (a > b || b is NaN) ? a : b, lane by lane.
DSV41KV_AVX512 inline __m512 max_f(__m512 a, __m512 b) {
  const __mmask16 take_a = _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(take_a, b, a);
}

}  // namespace

DSV41KV_AVX512 void block_scores(const float* qc, const float* kb, int n, float scale, int chunks, float* z) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int c = 0; c < chunks; c += 4) {
    const float* q = qc + c * kD * kL;
    float* zc = z + c * kB * kL;
    switch (std::min(chunks - c, 4)) {
      case 4: scores_chunks<4>(q, kb, n, sc, zc); break;
      case 3: scores_chunks<3>(q, kb, n, sc, zc); break;
      case 2: scores_chunks<2>(q, kb, n, sc, zc); break;
      default: scores_chunks<1>(q, kb, n, sc, zc); break;
    }
  }
}

DSV41KV_AVX512 void exp_f32(const double* x, int n, float* out) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __mmask8 hard;
    _mm256_storeu_ps(out + i, exp_f32(_mm512_loadu_pd(x + i), hard));
    for (int j = 0; j < 8; ++j)
      if ((hard >> j) & 1) out[i + j] = static_cast<float>(std::exp(x[i + j]));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(std::exp(x[i]));
}

DSV41KV_AVX512 void block_softmax(float* z, int n, int chunks, float* m, float* l) {
  alignas(64) double x[kL];
  alignas(64) float p[kL];
  for (int c = 0; c < chunks; ++c) {
    float* zc = z + c * kB * kL;
    __m512 mv = _mm512_loadu_ps(zc);
    for (int j = 1; j < n; ++j) mv = max_f(mv, _mm512_loadu_ps(zc + j * kL));
    const __m512d m_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(mv));
    const __m512d m_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(mv), 1)));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m512 zj = _mm512_loadu_ps(zc + j * kL);
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(zj));
      const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(zj), 1)));
      const __m512d x_lo = _mm512_sub_pd(lo, m_lo), x_hi = _mm512_sub_pd(hi, m_hi);
      __mmask8 hard_lo, hard_hi;
      const __m256 p_lo = exp_f32(x_lo, hard_lo), p_hi = exp_f32(x_hi, hard_hi);
      __m512 pj = _mm512_insertf32x8(_mm512_castps256_ps512(p_lo), p_hi, 1);
      if ((hard_lo | hard_hi) != 0) {  // rare: std::exp on those lanes
        _mm512_store_pd(x, x_lo);
        _mm512_store_pd(x + 8, x_hi);
        _mm512_store_ps(p, pj);
        const unsigned hard = hard_lo | (static_cast<unsigned>(hard_hi) << 8);
        for (int i = 0; i < kL; ++i)
          if ((hard >> i) & 1) p[i] = static_cast<float>(std::exp(x[i]));
        pj = _mm512_load_ps(p);
      }
      _mm512_storeu_ps(zc + j * kL, pj);
      sum = _mm512_add_ps(sum, pj);
    }
    _mm512_storeu_ps(m + c * kL, mv);
    _mm512_storeu_ps(l + c * kL, sum);
  }
}

DSV41KV_AVX512 void block_pv(const float* p, const float* kb, int n, int chunks, float* acc) {
  pv_all<false>(p, kb, n, chunks, acc, nullptr, nullptr);
}

DSV41KV_AVX512 void block_pv_merge(const float* p, const float* kb, int n, int chunks, float* run_acc, const float* fa,
                                   const float* fb) {
  pv_all<true>(p, kb, n, chunks, run_acc, fa, fb);
}

}  // namespace dsv41kv::detail::attn::avx512

#endif  // DSV41KV_AVX512_FORMS
