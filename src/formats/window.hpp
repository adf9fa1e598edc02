// The sliding-window rules of the read path (SPEC 1.1, 6.6, 9.1, 9.5), shared by the metadata
// builders (the decode window rows, the prefill gather lengths) and the attention that consumes
// them: a query at position p sees the window [swa_window_start(p), p] of its own SWA cache, and a
// prefill request gathers the last G_b tokens of its sequence, its queries and up to 127 earlier
// tokens.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

// The window's start is swa_window_start and its width kSwaWindow (records.hpp, with the group
// rules); the length of the window of a query at position p >= 0:
DSV41KV_HD constexpr int64_t window_len(int64_t p) { return p - swa_window_start(p) + 1; }

// SPEC 6.6, prefill request: prefix_len = seq_len - query_len, G = query_len + min(prefix_len, 127)
// tokens gathered, starting at position seq_len - G.
DSV41KV_HD constexpr int64_t prefill_gather_len(int64_t seq_len, int64_t query_len) {
  const int64_t prefix = seq_len - query_len;
  constexpr int64_t before = kSwaWindow - 1;
  return query_len + (prefix < before ? prefix : before);
}
DSV41KV_HD constexpr int64_t prefill_gather_start(int64_t seq_len, int64_t query_len) {
  return seq_len - prefill_gather_len(seq_len, query_len);
}

static_assert(window_len(5) == 6 && window_len(1000) == 128);
static_assert(prefill_gather_len(10, 10) == 10 && prefill_gather_len(300, 4) == 131 &&
              prefill_gather_start(300, 4) == 169 && prefill_gather_start(50, 20) == 0);

}  // namespace dsv41kv::detail
