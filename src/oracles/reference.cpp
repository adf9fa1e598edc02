// Binary64 references of SPEC formulas (include/dsv41kv/reference.hpp).
#include "dsv41kv/reference.hpp"

#include <algorithm>
#include <cmath>

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

}  // namespace dsv41kv::reference
