// The one shared pooling/RMSNorm routine of SPEC section 4.6, written once for host and device.
// Op order is normative: the CPU path and the CUDA path (a warp of 32 lanes, lane l owning the
// dims d with d % 32 == l) produce bit-identical latents. The RMSNorm part serves every RMSNorm
// of the library with its width as a template parameter: the 512-d latent (SPEC 4.6) and the
// 128-d index key (SPEC 8.1: "the op order of 4.6 with 32 partials of 4 elements").
#pragma once

#include <cstdint>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::cmath {

// pool2 for one dimension: a = predecessor [kv|score] row, b = current row.
DSV41KV_HD float pool2(float a_kv, float a_score, float b_kv, float b_score) {
  const float m = num::max_f(a_score, b_score);
  const float ea = num::exp32(num::sub_rn(a_score, m));
  const float eb = num::exp32(num::sub_rn(b_score, m));
  const float den = num::add_rn(ea, eb);
  const float wa = num::div_rn(ea, den);
  const float wb = num::div_rn(eb, den);
  return num::add_rn(num::mul_rn(a_kv, wa), num::mul_rn(b_kv, wb));
}

// Pooled value of dim d. `a` may be null for ratio 1 (then pooled = b.kv[d]).
DSV41KV_HD float pooled_dim(const float* a, const float* b, int d) {
  if (a == nullptr) return b[d];
  return pool2(a[d], a[kLatentDim + d], b[d], b[kLatentDim + d]);
}

// The 32-partial tree: part[l] after "for h in 16..1: part[l] += part[l+h]"; returns part[0].
DSV41KV_HD float reduce32(float* part) {
  for (int h = 16; h >= 1; h >>= 1)
    for (int l = 0; l < h; ++l) part[l] = num::add_rn(part[l], part[l + h]);
  return part[0];
}

// rs = 1 / sqrt(sum/Dim + eps), IEEE sqrt and division (Dim a power of two: sum/Dim is the exact
// scaling by 2^-9 for the latent, 2^-7 for the index key).
template <int Dim = kLatentDim>
DSV41KV_HD float rms_inverse(float sum, float eps) {
  static_assert(Dim > 0 && (Dim & (Dim - 1)) == 0 && Dim % 32 == 0, "a power of two of at least 32 dims");
  const float var = num::mul_rn(sum, 1.0f / static_cast<float>(Dim));
  const float r = num::sqrt_rn(num::add_rn(var, eps));
#if defined(__CUDA_ARCH__)
  // the correctly rounded reciprocal: the same value as div_rn(1, r) for every r (both are
  // RN(1 / r); checked for every float by CompressMathGpu.ReciprocalEqualsDivision), without the
  // general division's extra steps
  return __frcp_rn(r);
#else
  return num::div_rn(1.0f, r);
#endif
}

// latent[d] = bf16((pooled[d] * rs) * w[d])
DSV41KV_HD uint16_t latent_value(float pooled, float rs, uint16_t w_bf16) {
  return num::bf16_encode(num::mul_rn(num::mul_rn(pooled, rs), num::bf16_decode(w_bf16)));
}

// RMSNorm of a Dim-wide fp32 row x with bf16 weights w: part[d % 32] = fma(x[d], x[d], part[d % 32])
// for d ascending (Dim / 32 elements per partial), the 32-partial tree, rs, then
// out[d] = bf16((x[d] * rs) * w[d]).
template <int Dim>
DSV41KV_HD void rmsnorm_row(const float* x, const uint16_t* w, float eps, uint16_t* out) {
  float part[32];
  for (int l = 0; l < 32; ++l) part[l] = 0.0f;
  for (int d = 0; d < Dim; ++d) part[d % 32] = num::fma_rn(x[d], x[d], part[d % 32]);
  const float rs = rms_inverse<Dim>(reduce32(part), eps);
  for (int d = 0; d < Dim; ++d) out[d] = latent_value(x[d], rs, w[d]);
}

// Whole-row reference: pooled vector of (a, b) (a null for ratio 1), RMSNorm, bf16 latent.
// `pooled` is scratch of 512 floats.
DSV41KV_HD void compress_row(const float* a, const float* b, const uint16_t* norm_w, float eps,
                             float* pooled, uint16_t* latent) {
  for (int d = 0; d < kLatentDim; ++d) pooled[d] = pooled_dim(a, b, d);
  rmsnorm_row<kLatentDim>(pooled, norm_w, eps, latent);
}

}  // namespace dsv41kv::cmath
