// The selection of SPEC 8.5 and 8.7: the top K of a row of keys ranked by (key descending, index
// ascending), written in ascending index order. A histogram of the keys' top bits finds the bin of
// the K-th largest key, a partial selection (nth_element) among that bin's keys finds the key, and
// one pass by index writes the result: O(n) for a row of a million entries, never a full sort.
#pragma once

#include <cstdint>
#include <vector>

namespace dsv41kv::detail {

// The top min(K, #eligible) entries of key[0..n) by (key desc, index asc), written to out in
// ascending index order; returns how many. Eligible: the finite keys when finite_only (SPEC 8.5:
// non-finite scores, the -inf of invisible and masked entries among them, are never selected),
// else every key but NaN (SPEC 8.7's block scores, the +inf of the newest block among them).
// Equal keys (+0 and -0 too) rank by index. `scratch` is reused between calls.
int64_t select_top(const float* key, int64_t n, int64_t K, bool finite_only, int32_t* out,
                   std::vector<float>& scratch);

}  // namespace dsv41kv::detail
