// The fused save-compress-norm kernel (SPEC 4.4-4.6, 7.5), optionally fused with the RoPE +
// quantized insert of SPEC 5.1 (template parameter F), so that the latent stays in registers.
//
// Programs follow the reference decomposition exactly (as the CPU backend does):
//   ratio 1: program t < N;  ratio 2: request programs j < num_reqs, then pair programs
//   k < ceil(N / 2) over the flat token array.
// A program runs on a group of G warps (G = 1: one warp, 4 warps per 128-thread block, each warp
// chunks of kChunk consecutive programs, for large grids; G = 4: one 128-thread block per
// program, for small grids such as decode).
//
// Per program (token t that closes a group, predecessor row a, current row b = kv_score[t]):
//  1. load layout: thread gt loads dims d = 4*gt + 128*G*k (k < 4/G) of a.kv, a.score, b.kv,
//     b.score as 16-byte vectors, all loads in flight before the first use;
//  2. pooled[d] = pool2(a, b) (ratio 1: b.kv) -> shared memory (padded: index d + 4*(d/32),
//     conflict-free for every access below);
//  3. warp 0 lane l: part = fma over d = l, l+32, ..., l+480 ascending (the normative order),
//     then the shuffle-down tree h = 16..1 (= SPEC 4.6's reduction), rs = 1/sqrt(sum/512 + eps);
//  4. writer layout: thread gt owns dims [E*gt, E*gt+E), E = 16/G: latent = bf16((pooled*rs)*w),
//     optional latent_out store, RoPE at the group start row, cooperative record write.
// Request programs (ratio 2) read the predecessor from the ring (or prev_rows under PCP) and then
// run the tail store (policy kTail): every ring read of the program completes before its first
// ring write (the pooled values are consumed and the group synchronised before the store).
//
// Every index read from device memory is bounded before it is dereferenced (SPEC 0.4 item 3:
// the host cannot check device values without a synchronisation): a request with an out-of-range
// qsl, a slot >= capacity or < 0, a token_to_req outside [0, num_reqs), a negative position, a
// RoPE row beyond the table: the program (or its insert half) writes nothing.
#pragma once

#include "compressor/cuda/params.hpp"

namespace dsv41kv::detail::cuda {

inline constexpr int kPooledFloats = kLatentDim + kLatentDim / 8;  // 512 + padding 4 per 32

__device__ __forceinline__ int pooled_index(int d) { return d + 4 * (d / 32); }

// Insert decision of a token (SPEC 5.1): the cache slot and RoPE table row, or slot -1.
template <int R, int F>
__device__ __forceinline__ void insert_decision(const CompressParams& p, int64_t islot,
                                                int64_t pos_t, int64_t& slot_out,
                                                int64_t& row_out) {
  slot_out = -1;
  row_out = 0;
  if constexpr (F != kNoRecord) {
    const int64_t row = rope_row(pos_t, R);
    const bool ins = islot >= 0 && islot < p.cache.capacity && pos_t >= 0 &&
                     closes_group(pos_t, R) && row < p.table_rows;
    if (ins) {
      slot_out = islot;
      row_out = row;
    }
  }
}

// The ring row of ring slot `slot` (already bounded): block slot / cap, row slot % cap.
__device__ __forceinline__ float* ring_row(const CompressParams& p, int64_t slot) {
  int64_t blk, row;
  divmod_fast(slot, p.cap_div, blk, row);
  return p.ring + blk * p.ring_bs + row * p.ring_rs;
}

// The predecessor row of a ratio-2 request program whose first token closes a group (SPEC 4.4,
// 7.5): under PCP the gathered row prev_rows[g] when the link found one (g: prev_row_indices of
// the request, -1 when none or not PCP), otherwise the ring row of position ps - 1 in the block
// of the first token's ring slot `sl` (already bounded).
__device__ __forceinline__ const float* request_predecessor_row(const CompressParams& p, int64_t g, int64_t sl,
                                                                 int64_t ps) {
  const float* arow = nullptr;
  if (g >= 0 && g < p.prev_count) arow = p.prev + g * p.prev_stride;
  if (arow == nullptr) {
    int64_t blk, rem, quo, row_pred;
    divmod_fast(sl, p.cap_div, blk, rem);
    divmod_fast(ps - 1, p.cap_div, quo, row_pred);
    arow = p.ring + blk * p.ring_bs + row_pred * p.ring_rs;
  }
  return arow;
}

}  // namespace dsv41kv::detail::cuda
