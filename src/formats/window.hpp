// The sliding-window rules of the read path (SPEC 1.1, 6.6, 9.1, 9.5), shared by the metadata
// builders (the decode window rows, the prefill gather lengths) and the attention that consumes
// them: a query at position p sees the window [window_start(p), p] of its own SWA cache, and a
// prefill request gathers the last G_b tokens of its sequence, its queries and up to 127 earlier
// tokens.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

// sliding_window (SPEC 1.1): keys per query, the query's own token included; the width of the
// decode window rows (SPEC 6.6, 9.4).
inline constexpr int64_t kSwaWindow = 128;
// index_topk (SPEC 1.1): the width of a top-k row and of the decode top-k key list (SPEC 8.5, 9.4).
inline constexpr int64_t kTopkTokens = 512;

// SPEC 6.6 / 9.1: the first position of the window of a query at position p >= 0, and its length.
DSV41KV_HD constexpr int64_t window_start(int64_t p) { return p > kSwaWindow - 1 ? p - (kSwaWindow - 1) : 0; }
DSV41KV_HD constexpr int64_t window_len(int64_t p) { return p - window_start(p) + 1; }

// SPEC 6.6, prefill request: prefix_len = seq_len - query_len, G = query_len + min(prefix_len, 127)
// tokens gathered, starting at position seq_len - G.
DSV41KV_HD constexpr int64_t prefill_gather_len(int64_t seq_len, int64_t query_len) {
  const int64_t prefix = seq_len - query_len;
  return query_len + (prefix < kSwaWindow - 1 ? prefix : kSwaWindow - 1);
}
DSV41KV_HD constexpr int64_t prefill_gather_start(int64_t seq_len, int64_t query_len) {
  return seq_len - prefill_gather_len(seq_len, query_len);
}

static_assert(window_start(0) == 0 && window_start(127) == 0 && window_start(128) == 1 && window_len(5) == 6 &&
              window_len(1000) == 128);
static_assert(prefill_gather_len(10, 10) == 10 && prefill_gather_len(300, 4) == 131 &&
              prefill_gather_start(300, 4) == 169 && prefill_gather_start(50, 20) == 0);

}  // namespace dsv41kv::detail
