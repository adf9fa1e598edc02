// Launch interface of the CUDA cache kernels (kernels.cu): flat parameter structs (device
// pointers and sizes already validated and bounded on the host) and one launcher per kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv41kv/records.hpp"
#include "formats/cuda/record_writers.cuh"

namespace dsv41kv::detail::cuda {

// RoPE + quantized insert of latent rows (SPEC 5.1).
struct InsertParams {
  const uint16_t* latent = nullptr;  // bf16 [>= N, 512]
  const int64_t* pos = nullptr;
  const int64_t* slot = nullptr;     // [N]
  int64_t N = 0;
  int ratio = 1;
  const float* table = nullptr;
  int64_t table_rows = 0;
  CacheDst cache;
};
void launch_insert(RecordFormat f, const InsertParams& p, cudaStream_t stream);

// The query RoPE of the SWA insert (SPEC 9.2): q_out[t][h] = q[t][h] rotated on dims 448..511 at
// table row pos[t] for h < H, zeros for H <= h < H_pad. Rows, heads: strides in elements, multiples
// of 8 (16-byte vectors; the host checks).
struct QRopeParams {
  const uint16_t* q = nullptr;
  int64_t q_ts = 0, q_hs = 0;
  uint16_t* out = nullptr;
  int64_t o_ts = 0, o_hs = 0;
  int64_t T = 0;
  int H = 0, H_pad = 0;
  const int64_t* pos = nullptr;  // [T]
  const float* table = nullptr;
  int64_t table_rows = 0;
};
void launch_q_rope(const QRopeParams& p, cudaStream_t stream);

// Dequantize-gather (SPEC 5.3).
struct GatherParams {
  const uint8_t* base = nullptr;
  int64_t S = 1, page_stride_bytes = 0, row_stride_bytes = 0, capacity = 0;
  float fp8_scale = 1.0f;
  const int64_t* slot = nullptr;  // [M]
  int64_t M = 0;
  uint16_t* out = nullptr;        // bf16 rows, stride out_stride elements
  int64_t out_stride = 0;
};
void launch_gather(RecordFormat f, const GatherParams& p, cudaStream_t stream);

// save_ring_rows (SPEC 7.5).
struct SaveRowsParams {
  const float* prev = nullptr;
  int64_t prev_stride = 0;
  const int64_t* slot = nullptr;  // [G]
  int64_t G = 0;
  float* ring = nullptr;
  int64_t ring_bs = 0, ring_rs = 0, cap = 1, ring_slots = 0;
};
void launch_save_ring_rows(const SaveRowsParams& p, cudaStream_t stream);

}  // namespace dsv41kv::detail::cuda
