// dsv41kv: the compressor (SPEC section 4): fused save-compress-norm, alone or fused with the
// RoPE + quantized cache insert of SPEC 5 (the cache ops themselves: cache.hpp).
//
// Every function validates all of its arguments on the host before touching any output and
// throws dsv41kv::Error (E3 for a bad ratio, E8 otherwise) naming the argument, the value and
// what was expected. The backend is the device of the views (all on one device); CUDA calls
// run on ctx.stream, allocate nothing and never synchronise with the host.
#pragma once

#include <cstdint>

#include "dsv41kv/cache.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv {

// Ring policy of ratio-2 compression (SPEC 4.5 / 7.5).
enum class RingPolicy : uint8_t {
  kTail = 0,     // non-PCP: request programs store the last min(len, cap) rows of each chunk
  kOpenRow = 1,  // PCP: no tail store; predecessors may come from prev_rows; the ring is
                 // written afterwards by save_ring_rows
};

// Arguments of compress(). N = slot_mapping.shape[0] (padding rows included).
struct CompressArgs {
  int ratio = 2;              // 1 or 2 (E3 otherwise)
  TensorView kv_score;        // f32 [rows >= N, 512*ratio], inner stride 1, row stride % 16 == 0
  TensorView positions;       // i64 [>= N], contiguous
  TensorView slot_mapping;    // i64 [N]: ratio 2 ring slots (SPEC 6.3); ratio 1 compressed
                              //   slots, used only as a validity mask
  TensorView norm_weight;     // bf16 [512]
  float eps = 0.0f;           // rms_norm_eps from the model config (never defaulted)
  TensorView latent_out;      // bf16 [rows >= N, 512], contiguous; only closing rows written
  // ratio 2 only
  TensorView ring;            // f32 [blocks, cap, 1024], strides [block_stride, row_stride, 1]
                              //   row_stride >= 1024 and % 16 == 0, block_stride >= cap*row_stride
  TensorView qsl;             // i32 [num_reqs + 1], contiguous, monotone, qsl[0] == 0
  TensorView token_to_req;    // i32 [N], contiguous
  RingPolicy policy = RingPolicy::kTail;
  // PCP (policy kOpenRow) only, both optional
  TensorView prev_rows;        // f32 [G, 1024] gathered last rows, row stride % 16 == 0
  TensorView prev_row_indices; // i64 [R <= num_reqs]: row of prev_rows holding the predecessor
                               //   of request j's first token, or -1 (ring)
};
void compress(const CompressArgs& args, const ExecContext& ctx = {});

// compress() then insert() of every closing token, as one call. On CUDA this is one fused
// launch in which the latent stays on chip unless `args.compress.latent_out` is given; on the
// CPU it is the two ops in sequence per token block. `insert_slots` is the compressed-cache
// slot mapping; `compress.latent_out` may be absent (ndim 0) to skip writing latents.
struct CompressInsertArgs {
  CompressArgs compress;
  TensorView rope_table;      // f32 [table_rows, 64]
  TensorView insert_slots;    // i64 [N]
  CacheView cache;
};
void compress_insert(const CompressInsertArgs& args, const ExecContext& ctx = {});

}  // namespace dsv41kv
