// dsv41kv: per-step metadata builders (SPEC section 6): ring capacity, token-to-request indices,
// ring slot mapping, token slot mappings and the ratio-2 compressed slot mapping with its PAD
// rule. CPU builders take host views; the CUDA builders (same functions, device views) run on
// ctx.stream with launch geometry fixed by the padded count N.
//
// Every builder validates all of its arguments before it writes anything and throws
// dsv41kv::Error naming the argument, the value found and what was expected: E2 for a
// compressed-cache ratio outside {1, 2}, E8 otherwise. Structural checks (presence, dtypes,
// shapes, strides, one device per call) apply to every view; value checks (qsl, request
// indices, positions, block ids) need to read the data and run only for host views (reading
// device memory would synchronise; the CUDA builders bound every index they dereference and
// emit -1 instead). All views of one call must be on one device; a CUDA view in a build without
// CUDA is an E8 ("built without CUDA").
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

// cap = max(8, next_pow2(num_speculative_tokens + 2)) (SPEC 3.2). Throws E8 when negative.
int64_t ring_capacity(int64_t num_speculative_tokens);

// Checks qsl (i32 [num_reqs+1], contiguous): qsl[0] == 0, non-decreasing,
// qsl[num_reqs] == num_actual_tokens <= N. Host views only (E8 otherwise). `arg` prefixes
// the messages (e.g. "build_token_to_req: qsl").
void validate_qsl(const TensorView& qsl, int64_t num_actual_tokens, int64_t N, const char* arg);

// SPEC 6.2 decode/prefill split: the number of leading requests with
// query_lens[j] <= 1 + num_speculative_tokens (the decode part); every later request is a
// prefill, even a short one. E8 for num_reqs < 0, num_speculative_tokens < 0, or a null
// pointer with num_reqs > 0.
int64_t num_decode_requests(const int32_t* query_lens, int64_t num_reqs,
                            int64_t num_speculative_tokens);

// token_to_req[t] = request of token t for t < qsl[num_reqs]; 0 for padding rows t < N.
// Host views: qsl is validated (validate_qsl) against num_actual_tokens and N.
struct TokenToReqArgs {
  TensorView qsl;           // i32 [num_reqs + 1], contiguous
  TensorView token_to_req;  // i32 [N] output, contiguous
  // -1: num_actual_tokens = qsl[num_reqs] (the CUDA builder reads it on the device);
  // >= 0: must equal qsl[num_reqs] (E8, host views) and be <= N (all views).
  int64_t num_actual_tokens = -1;
};
void build_token_to_req(const TokenToReqArgs& args, const ExecContext& ctx = {});

// SPEC 6.3: ring_slot[i] = -1 for i >= num_actual_tokens or ring block <= 0 (null block),
// else b*cap + positions[i] % cap with b = ring_block_table[token_to_req[i]][0].
struct RingSlotArgs {
  TensorView token_to_req;      // i32 [N]
  TensorView positions;         // i64 [>= N]
  TensorView ring_block_table;  // i32 [num_reqs, >= 1] (row stride may exceed 1)
  int64_t num_actual_tokens = 0;
  int64_t cap = 8;              // > 0 (ring_capacity() of the config)
  TensorView ring_slots;        // i64 [N] output
  // >= 0: number of ring blocks of the ring tensor; a ring block id >= it used by a real
  // token is an E8 (host views; the CUDA builder emits -1). -1: not checked.
  int64_t num_ring_blocks = -1;
};
void build_ring_slots(const RingSlotArgs& args, const ExecContext& ctx = {});

// SPEC 6.4: token slot mapping with page size `page` (SWA: 32 tokens; compressed ratio 1:
// S_1 states = tokens): slot[t] = bt[b][p / page] * page + p % page, or -1 when the physical
// page id is <= 0 (null page; the table is never modified) or for padding rows
// t >= num_actual_tokens. A logical page beyond the block-table row is an error (E8) naming the
// token, its request and position (CPU; the CUDA builder writes -1 and cannot report).
struct TokenSlotArgs {
  TensorView token_to_req;  // i32 [N]
  TensorView positions;     // i64 [>= N]
  TensorView block_table;   // i32 [num_reqs, max_pages]
  int64_t num_actual_tokens = 0;
  int64_t page = 32;
  TensorView slots;         // i64 [N] output
  // >= 0: number of physical pages of the cache; a page id >= it used by a real token is an
  // E8 (host views; the CUDA builder emits -1). -1: not checked.
  int64_t num_pages = -1;
};
void build_token_slots(const TokenSlotArgs& args, const ExecContext& ctx = {});

// SPEC 6.5: compressed slot mapping of ratio r (1 or 2; E2 otherwise) with the PAD rule:
// cslot[t] = (p+1) % r == 0 && tslot[t] != -1 && page > 0 ? page * S_r + s % S_r : -1 with
// s = p / r, page = bt[b][s / S_r]. Rows t >= num_actual_tokens are -1. Logical pages beyond
// the row: as for build_token_slots, checked only for tokens that would get a slot (closing,
// token slot != -1): a non-closing token never reads the table. `token_slots` is the
// token's ordinary slot (a masked replica under PCP has -1); absent means "all valid".
struct CompressedSlotArgs {
  int ratio = 2;
  TensorView token_to_req;  // i32 [N]
  TensorView positions;     // i64 [>= N]
  TensorView block_table;   // i32 [num_reqs, max_pages]
  TensorView token_slots;   // i64 [N] or absent
  int64_t num_actual_tokens = 0;
  int64_t states_per_page = 32;  // S_r
  TensorView slots;         // i64 [N] output
  int64_t num_pages = -1;   // as TokenSlotArgs::num_pages (checked for tokens that get a slot)
};
void build_compressed_slots(const CompressedSlotArgs& args, const ExecContext& ctx = {});

}  // namespace dsv41kv
