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

// SPEC 8.3 in binary64, densely: I(t, i) = sum_h w[h] * max(0, D(h, i)) * sk[i] with
// D(h, i) = sum_d e4m3(q8[h, d]) * e4m3(k8[i, d]) for one query token (q8: 32 x 128 e4m3 codes,
// w: its 32 folded weights) and n keys (k8: n x 128 codes, row-major; sk: their fp32 scales),
// without the final rounding to fp32.
std::vector<double> indexer_scores(const uint8_t* q8, const float* w, const uint8_t* k8, const float* sk, int64_t n);

// The magnitude SPEC 8.8 scales its tolerance by, for one query and one key:
// sum_h |w[h]| * sum_d |e4m3(q8[h, d]) * e4m3(k8[d])| * |sk| in binary64. A score is within
// tolerance when |I - I_ref| <= 1e-5 * indexer_score_magnitude(...).
double indexer_score_magnitude(const uint8_t* q8, const float* w, const uint8_t* k8, float sk);
inline constexpr double kIndexerScoreRtol = 1e-5;

}  // namespace dsv41kv::reference
