// dsv41kv::reference: binary64 evaluations of SPEC formulas (exact exp, sqrt and division, no
// intermediate rounding), by which the oracles and the tests judge the library's fp32 results.
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

// SPEC 9.2 and 9.3 in binary64 (dense over a given key set), for one query token with H heads:
// q[h] = the 512 bf16 values at q + h * q_head_stride; the key set = num_keys bf16 rows of 512
// values at keys (K = V, contiguous); sink [H] (-inf: no effect, +inf: output 0); scale the softmax
// scale. out [H * 512]: o_h = sum_j e^(z_j - m) v_j / (sum_j e^(z_j - m) + e^(sink_h - m)) with
// z_j = scale * (q_h . k_j), m = max(max_j z_j, sink_h); lse [H]: log sum_j e^(z_j), without the
// sink. No key: out 0 and lse +inf for every head.
struct AttentionResult {
  std::vector<double> out;
  std::vector<double> lse;
};
AttentionResult sparse_attention(const uint16_t* q, int64_t q_head_stride, int num_heads, const uint16_t* keys,
                                 int64_t num_keys, const float* sink, double scale);

}  // namespace dsv41kv::reference
