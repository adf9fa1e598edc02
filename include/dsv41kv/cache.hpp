// dsv41kv: the paged-cache ops of the write path (SPEC section 5 and 7.5): the RoPE + quantized
// insert of latent rows, the dequantize-gather reader, and save_ring_rows (the PCP ring write).
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
