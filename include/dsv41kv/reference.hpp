// dsv41kv::reference: binary64 evaluations of SPEC formulas (exact exp, sqrt and division, no
// intermediate rounding), by which the oracles and the tests judge the library's fp32 results.
// More formulas will join them (e.g. the attention of SPEC 9.2).
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41kv::reference {

// SPEC 4.6 in binary64: the latent row (512 values, before the final bf16 rounding) of the token
// whose kv_score row is `cur` ([kv | score]); `pred` is its predecessor row for ratio 2 (the
// previous token of its chunk, else its ring row) and null for ratio 1. `norm_weight` holds the
// 512 bf16 RMSNorm weights.
std::vector<double> latent(const float* pred, const float* cur, const uint16_t* norm_weight, double eps);

}  // namespace dsv41kv::reference
