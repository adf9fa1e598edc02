// The AVX-512 form of the indexer's scores (SPEC 8.3), chosen at run time where the CPU has it
// (core/cpu_form.hpp): I(t, i) for groups of entries as a small GEMM in binary64 lanes, [32 heads x
// 128] x [128 x entries], the keys decoded once per entry (formats/e4m3_avx512.hpp). The same bits
// as the portable score (score.hpp): every product of two e4m3 values and every partial sum of D is
// exact in binary64, so D is the same number whatever the order (docs/numerics.md); the head sum
// w[h] * max(0, D) runs over h ascending with the same operations, then times sk and one rounding
// to fp32. Entries with a NaN code are reported to the caller, which scores them the portable way
// (a NaN's bits depend on the order in which it meets the other operands). Private to indexer/.
#pragma once

#include <cstdint>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail::indexer_avx512 {

inline constexpr int kGroup = 24;  // entries per call

// One token's query for the AVX-512 scores: q[d * 32 + h] = e4m3(q8[h][d]) * 2^8 (exact: the keys
// are decoded as value * 2^-8, so every product is the product of the two values), w[h].
struct Query {
  alignas(64) double q[kIndexHeadDim * kIndexHeads];
  double w[kIndexHeads];
};

// The query of q8 [32][128] and w [32]; false when q8 holds a NaN code (the token then takes the
// portable form).
bool load_query(const uint8_t* q8, const float* w, Query& qy);

// out[j] = I of entry j for j < n <= kGroup (codes[j]: its 128 e4m3 codes, sk[j]: its scale), and
// unrounded[j] (when given) the binary64 value before the rounding (score.hpp's score_unrounded).
// Returns the bit mask of the entries holding a NaN code: their values are left to the caller.
uint32_t scores(const Query& qy, const uint8_t* const* codes, const float* sk, int n, float* out,
                double* unrounded = nullptr);

}  // namespace dsv41kv::detail::indexer_avx512
