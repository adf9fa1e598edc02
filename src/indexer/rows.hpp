// The per-row rules of the indexer's writes, written once for the CPU backend (and the kernels to
// come): the index key of one compressed entry (SPEC 8.1) and one query head with its folded
// weight (SPEC 8.2), composed of the formats layer's primitives (lin::dot_fixed, the RMSNorm of
// SPEC 4.6, the RoPE pair rotation, the index FP8 quantization).
#pragma once

#include <cstdint>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "formats/compress_math.hpp"
#include "formats/linear.hpp"

namespace dsv41kv::detail {

// SPEC 8.1 up to the record: x = the bf16 latent widened [512], wk = the widened wk [128, 512]
// row-major, k_norm bf16 [128], trow = the RoPE table row (p / r) * r. k[0..128) receives
//   bf16(wk . x)  ->  bf16(rmsnorm_128(., k_norm, eps))  ->  bf16(forward RoPE on dims 64..127)
// as floats (every value a bf16). index_key_finish is the part after the projection, on
// k[o] = bf16(wk[o] . x): the kernel computes those 128 dot products in parallel, each with
// lin::dot_fixed, then calls it.
DSV41KV_HD void index_key_finish(const uint16_t* k_norm, float eps, const float* trow, float* k) {
  uint16_t kn[kIndexHeadDim];
  cmath::rmsnorm_row<kIndexHeadDim>(k, k_norm, eps, kn);
  for (int d = 0; d < kIndexHeadDim; ++d) k[d] = num::bf16_decode(kn[d]);
  num::rope_forward_dims(k + kIndexHeadDim / 2, trow);
  for (int d = kIndexHeadDim / 2; d < kIndexHeadDim; ++d) k[d] = num::bf16_round(k[d]);
}
DSV41KV_HD void index_key_row(const float* x, const float* wk, const uint16_t* k_norm, float eps, const float* trow,
                              float* k) {
  for (int o = 0; o < kIndexHeadDim; ++o)
    k[o] = num::bf16_round(lin::dot_fixed(x, wk + o * kLatentDim, kLatentDim));
  index_key_finish(k_norm, eps, trow, k);
}

// 2^-6 = 128^-0.5 * 32^-0.5, the softmax-free scale SPEC 8.2 folds into the weights.
inline constexpr float kIndexWeightScale = 0.015625f;

// SPEC 8.2 for one head: q = the head's 128 bf16 values (before RoPE), trow = the table row of
// the token's position. Writes the 128 e4m3 codes to q8 and returns the folded weight
// w = (float(w_raw) * 2^e) * 2^-6.
DSV41KV_HD float index_query_head(const uint16_t* q, const float* trow, uint16_t w_raw, uint8_t* q8) {
  float v[kIndexHeadDim];
  for (int d = 0; d < kIndexHeadDim; ++d) v[d] = num::bf16_decode(q[d]);
  num::rope_forward_dims(v + kIndexHeadDim / 2, trow);
  for (int d = kIndexHeadDim / 2; d < kIndexHeadDim; ++d) v[d] = num::bf16_round(v[d]);
  const float scale = index_fp8_quantize(v, q8);
  return num::mul_rn(num::mul_rn(num::bf16_decode(w_raw), scale), kIndexWeightScale);
}

}  // namespace dsv41kv::detail
