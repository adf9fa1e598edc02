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
