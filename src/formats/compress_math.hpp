// The one shared pooling/RMSNorm routine of SPEC section 4.6, written once for host and device.
// Op order is normative: the CPU path and the CUDA path (a warp of 32 lanes, lane l owning the
// dims d with d % 32 == l) produce bit-identical latents.
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

// rs = 1 / sqrt(sum/512 + eps), IEEE sqrt and division.
DSV41KV_HD float rms_inverse(float sum, float eps) {
  const float var = num::mul_rn(sum, 1.0f / 512.0f);  // exact scaling by 2^-9
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

// Whole-row reference: pooled vector of (a, b) (a null for ratio 1), RMSNorm, bf16 latent.
// `pooled` is scratch of 512 floats.
DSV41KV_HD void compress_row(const float* a, const float* b, const uint16_t* norm_w, float eps,
                             float* pooled, uint16_t* latent) {
  float part[32];
  for (int l = 0; l < 32; ++l) part[l] = 0.0f;
  for (int d = 0; d < kLatentDim; ++d) {
    const float p = pooled_dim(a, b, d);
    pooled[d] = p;
    part[d % 32] = num::fma_rn(p, p, part[d % 32]);
  }
  const float rs = rms_inverse(reduce32(part), eps);
  for (int d = 0; d < kLatentDim; ++d) latent[d] = latent_value(pooled[d], rs, norm_w[d]);
}

}  // namespace dsv41kv::cmath
