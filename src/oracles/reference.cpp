// Binary64 references of SPEC formulas (include/dsv41kv/reference.hpp).
#include "dsv41kv/reference.hpp"

#include <algorithm>
#include <cmath>

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

}  // namespace dsv41kv::reference
