// dsv41kv: the paged-cache ops (SPEC section 5 and 7.5): the RoPE + quantized insert of latent
// rows, the SWA insert fused with the query RoPE, the dequantize-gather reader, and save_ring_rows
// (the PCP ring write).
//
// Every function validates all of its arguments on the host before touching any output and
// throws dsv41kv::Error (E3 for a bad ratio, E8 otherwise) naming the argument, the value and
// what was expected. The backend is the device of the views (all on one device); CUDA calls
// run on ctx.stream, allocate nothing and never synchronise with the host.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv {

// Arguments of insert(). N = slots.shape[0].
struct InsertArgs {
  int ratio = 2;              // 1 or 2: only closing tokens ((p+1) % ratio == 0) are written
  TensorView latent;          // bf16 [rows >= N, 512], contiguous
  TensorView positions;       // i64 [>= N], contiguous
  TensorView rope_table;      // f32 [table_rows, 64] (32 cos | 32 sin), contiguous
  TensorView slots;           // i64 [N]: compressed-cache slot or -1
  CacheView cache;            // the destination; format chosen by cache.format
};
void insert(const InsertArgs& args, const ExecContext& ctx = {});

// The SWA insert of one layer fused with its query RoPE (SPEC 5.4, 9.2), T = slot_swa.shape[0]
// (padding rows included), p = positions[t]:
//  - SWA cache: for every t < T with slot_swa[t] >= 0, the record of kv[t] with the forward RoPE
//    of SPEC 1.4 at table row p, the token's own position, written by the cache format's record
//    writer: the insert of SPEC 5.1 with ratio 1 (every token closes its group of one), so the
//    bytes equal insert()'s for ratio 1. Nothing else of the cache is written.
//  - queries: for every t < T and head h < H, q_out[t][h] = q[t][h] with the forward RoPE on dims
//    448..511 at row p, in fp32 and rounded to bf16 (dims 0..447 copied bit for bit); the padded
//    heads H..H_pad-1 of q_out[t] are written as zeros (bf16 +0.0: finite scores, which the
//    attention masks with sink -inf and drops). Rows t >= T of q_out are not written.
// rope_table is the layer's table (plain for ratio-0 layers, YaRN for ratio > 0, SPEC 1.4) and
// needs a row for every position of the call. q_out may be q itself (same data and strides,
// H_pad == H: rotated in place); any other overlap of q and q_out is an error.
// CUDA views: the insert kernel with ratio 1 and a query RoPE kernel on ctx.stream; q and q_out
// need 16-byte aligned data and token and head strides that are multiples of 8 elements (E8), kv
// and the table 16-byte aligned; positions are not read on the host (a row whose position has no
// table row is not written).
struct SwaInsertArgs {
  TensorView kv;          // bf16 [rows >= T, 512], contiguous: the layer's normalized kv rows
  TensorView q;           // bf16 [rows >= T, H >= 1, 512]: inner stride 1, head stride >= 512,
                          // token stride >= H * head stride
  TensorView positions;   // i64 [>= T], contiguous
  TensorView rope_table;  // f32 [table_rows, 64] (32 cos | 32 sin), contiguous
  TensorView slot_swa;    // i64 [T]: SWA slot (SPEC 6.4) or -1
  CacheView cache;        // the layer's SWA cache: v4_584 / mxfp8_528 (SPEC 3.4) or plain bf16 / fp8 rows
  TensorView q_out;       // bf16 [rows >= T, H_pad, 512], strides as q; H_pad == H, or 64 / 128 > H
};
void swa_insert_q_rope(const SwaInsertArgs& args, const ExecContext& ctx = {});

// Dequantize-gather (SPEC 5.3): out[i] = decode(state at slots[i]) for slots[i] >= 0; rows with
// slots[i] < 0 are left untouched.
struct GatherArgs {
  CacheView cache;
  TensorView slots;           // i64 [M]
  TensorView out;             // bf16 [M, 512], row stride >= 512, inner stride 1
};
void gather(const GatherArgs& args, const ExecContext& ctx = {});

// save_ring_rows (SPEC 7.5): for every gathered row g with ring_write_slots[g] >= 0, copy the
// 1024 floats of prev_rows[g] into ring row ring_write_slots[g] (slot = block*cap + row).
struct SaveRingRowsArgs {
  TensorView prev_rows;         // f32 [G, 1024]
  TensorView ring_write_slots;  // i64 [G]
  TensorView ring;              // f32 [blocks, cap, 1024] (strides as in CompressArgs)
};
void save_ring_rows(const SaveRingRowsArgs& args, const ExecContext& ctx = {});

}  // namespace dsv41kv
