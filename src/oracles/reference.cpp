// Binary64 references of SPEC formulas (include/dsv41kv/reference.hpp).
#include "dsv41kv/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::reference {

std::vector<double> latent(const float* pred, const float* cur, const uint16_t* norm_weight, double eps) {
  std::vector<double> pooled(kLatentDim);
  double ss = 0;
  for (int d = 0; d < kLatentDim; ++d) {
    double v = cur[d];
    if (pred != nullptr) {
      const double a = pred[kLatentDim + d], b = cur[kLatentDim + d], m = std::max(a, b);
      const double ea = std::exp(a - m), eb = std::exp(b - m);
      v = (pred[d] * ea + cur[d] * eb) / (ea + eb);
    }
    pooled[static_cast<size_t>(d)] = v;
    ss += v * v;
  }
  const double rs = 1.0 / std::sqrt(ss / kLatentDim + eps);
  for (int d = 0; d < kLatentDim; ++d)
    pooled[static_cast<size_t>(d)] *= rs * num::bf16_decode(norm_weight[d]);
  return pooled;
}

std::vector<double> indexer_scores(const uint8_t* q8, const float* w, const uint8_t* k8, const float* sk, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double I = 0.0;
    for (int h = 0; h < kIndexHeads; ++h) {
      double D = 0.0;
      for (int d = 0; d < kIndexHeadDim; ++d)
        D += static_cast<double>(num::e4m3_decode(q8[h * kIndexHeadDim + d])) *
             static_cast<double>(num::e4m3_decode(k8[i * kIndexHeadDim + d]));
      I += static_cast<double>(w[h]) * std::max(0.0, D) * static_cast<double>(sk[i]);
    }
    out[static_cast<size_t>(i)] = I;
  }
  return out;
}

double indexer_score_magnitude(const uint8_t* q8, const float* w, const uint8_t* k8, float sk) {
  double m = 0.0;
  for (int h = 0; h < kIndexHeads; ++h) {
    double a = 0.0;
    for (int d = 0; d < kIndexHeadDim; ++d)
      a += std::fabs(static_cast<double>(num::e4m3_decode(q8[h * kIndexHeadDim + d])) *
                     static_cast<double>(num::e4m3_decode(k8[d])));
    m += std::fabs(static_cast<double>(w[h])) * a;
  }
  return m * std::fabs(static_cast<double>(sk));
}

AttentionResult sparse_attention(const uint16_t* q, int64_t q_head_stride, int num_heads, const uint16_t* keys,
                                 int64_t num_keys, const float* sink, double scale) {
  const auto H = static_cast<size_t>(num_heads);
  AttentionResult r{std::vector<double>(H * kLatentDim, 0.0),
                    std::vector<double>(H, std::numeric_limits<double>::infinity())};
  if (num_keys == 0) return r;
  std::vector<double> kv(static_cast<size_t>(num_keys) * kLatentDim), z(static_cast<size_t>(num_keys));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = num::bf16_decode(keys[i]);
  for (size_t h = 0; h < H; ++h) {
    const uint16_t* qh = q + static_cast<int64_t>(h) * q_head_stride;
    double zmax = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < num_keys; ++j) {
      double dot = 0;
      for (int d = 0; d < kLatentDim; ++d) dot += num::bf16_decode(qh[d]) * kv[static_cast<size_t>(j * kLatentDim + d)];
      z[static_cast<size_t>(j)] = scale * dot;
      zmax = std::max(zmax, z[static_cast<size_t>(j)]);
    }
    double sum = 0;  // sum_j e^(z_j - zmax)
    for (int64_t j = 0; j < num_keys; ++j) sum += std::exp(z[static_cast<size_t>(j)] - zmax);
    r.lse[h] = zmax + std::log(sum);
    const double s = sink[h];
    if (s == std::numeric_limits<double>::infinity()) continue;  // output 0
    const double m = std::max(zmax, s);
    double den = std::exp(s - m);  // 0 for s = -inf
    std::vector<double> acc(kLatentDim, 0.0);
    for (int64_t j = 0; j < num_keys; ++j) {
      const double w = std::exp(z[static_cast<size_t>(j)] - m);
      den += w;
      for (int d = 0; d < kLatentDim; ++d) acc[static_cast<size_t>(d)] += w * kv[static_cast<size_t>(j * kLatentDim + d)];
    }
    for (int d = 0; d < kLatentDim; ++d) r.out[h * kLatentDim + static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] / den;
  }
  return r;
}

}  // namespace dsv41kv::reference
