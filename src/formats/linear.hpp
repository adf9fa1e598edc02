// The one fixed-order dot product of the dense products the library computes itself on the CPU
// (the kv_score projection of SPEC 4.1, the index key wk * latent of SPEC 8.1): fp32 operands
// (widened bf16), 16 partial sums over k % 16 in ascending k, each step an fp32 multiply then an
// fp32 add (no FMA), then the fixed tree 8, 4, 2, 1. The order depends only on the length, not on
// the batch, the blocking or the thread count, so a row's result is the same whoever computes it.
#pragma once

#include <cstdint>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::lin {

inline constexpr int kDotLanes = 16;

DSV41KV_HD float dot_fixed(const float* x, const float* w, int64_t H) {
  float acc[kDotLanes];
  for (int l = 0; l < kDotLanes; ++l) acc[l] = 0.0f;
  const int64_t Hm = H - H % kDotLanes;
  for (int64_t k0 = 0; k0 < Hm; k0 += kDotLanes)
    for (int l = 0; l < kDotLanes; ++l) acc[l] = num::add_rn(acc[l], num::mul_rn(x[k0 + l], w[k0 + l]));
  for (int64_t k = Hm; k < H; ++k) acc[k % kDotLanes] = num::add_rn(acc[k % kDotLanes], num::mul_rn(x[k], w[k]));
  for (int h = kDotLanes / 2; h >= 1; h >>= 1)
    for (int l = 0; l < h; ++l) acc[l] = num::add_rn(acc[l], acc[l + h]);
  return acc[0];
}

}  // namespace dsv41kv::lin
