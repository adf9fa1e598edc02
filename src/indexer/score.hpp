// The score of SPEC 8.3 for one (token, entry), the portable form (the CPU backend's, and the
// reference its AVX-512 form, avx512.hpp, is checked against bit for bit). Private to indexer/.
#pragma once

#include <array>
#include <cstdint>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

// e4m3_decode of every byte as a double (exact).
inline const std::array<double, 256>& e4m3_lut() {
  static const std::array<double, 256> lut = [] {
    std::array<double, 256> l{};
    for (int c = 0; c < 256; ++c) l[static_cast<size_t>(c)] = num::e4m3_decode(static_cast<uint8_t>(c));
    return l;
  }();
  return lut;
}

// The query of one token, decoded once: q[h * 128 + d] = e4m3_decode(q8[h][d]), w[h].
struct Query {
  double q[kIndexHeads * kIndexHeadDim];
  double w[kIndexHeads];
};

inline void load_query(const uint8_t* q8, const float* w, Query& qy) {
  const auto& lut = e4m3_lut();
  for (int i = 0; i < kIndexHeads * kIndexHeadDim; ++i) qy.q[i] = lut[q8[i]];
  for (int h = 0; h < kIndexHeads; ++h) qy.w[h] = w[h];
}

// I(t, i) before its rounding to fp32, for the key with e4m3 codes k8 and scale sk. Each product
// of two e4m3 values is a multiple of 2^-18 below 2^18 in magnitude, so every partial sum of D's
// 128 products is a multiple of 2^-18 below 2^25: exact in binary64 whatever the order, and the 8
// lanes below let the compiler vectorise it. Then I = sum_h w[h] * max(0, D_h) in binary64 with
// heads ascending (a NaN D stays NaN), times sk (a power of two in a valid cache: exact).
inline double score_unrounded(const Query& qy, const uint8_t* k8, float sk) {
  constexpr int kLanes = 8;  // partial sums of D
  const auto& lut = e4m3_lut();
  double k[kIndexHeadDim];
  for (int d = 0; d < kIndexHeadDim; ++d) k[d] = lut[k8[d]];
  double acc = 0.0;
  for (int h = 0; h < kIndexHeads; ++h) {
    const double* q = qy.q + h * kIndexHeadDim;
    double l[kLanes];
    for (int j = 0; j < kLanes; ++j) l[j] = 0.0;
    for (int d0 = 0; d0 < kIndexHeadDim; d0 += kLanes)
      for (int j = 0; j < kLanes; ++j) l[j] += q[d0 + j] * k[d0 + j];
    for (int h2 = kLanes / 2; h2 >= 1; h2 >>= 1)
      for (int j = 0; j < h2; ++j) l[j] += l[j + h2];
    const double D = l[0];
    acc += qy.w[h] * (D < 0.0 ? 0.0 : D);
  }
  return acc * static_cast<double>(sk);
}

// I(t, i): rounded once to fp32.
inline float score(const Query& qy, const uint8_t* k8, float sk) { return static_cast<float>(score_unrounded(qy, k8, sk)); }

}  // namespace dsv41kv::detail
