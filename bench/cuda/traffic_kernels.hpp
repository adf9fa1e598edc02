// The traffic kernels of dsv41kv-access-ceiling: the 256K ratio-1 fused kernel's grid, metadata
// round, row reads and record stores without its arithmetic (access_ceiling.hpp says what they
// model). Shared by traffic_kernels.cu and the host side, access_ceiling.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "access_ceiling.hpp"

namespace dsv41kv::bench {

inline constexpr int kRowFloats = 512;            // a ratio-1 kv row: 512 fp32
inline constexpr int kRowBytes = kRowFloats * 4;  // 2048
inline constexpr int kChunk = 8;                  // tokens per warp, as the fused kernel's 256K grid
inline constexpr int kPageStates = 64;            // states per cache page (the bench's workload)
inline constexpr int kRopeFloats = 64;            // a RoPE table row: cos of pairs 0..31, then their sin

struct TrafficParams {
  const float* kv;       // [T, 512] fp32 rows
  const int64_t* slots;  // [T] slot mapping of token t (all inputs: read only; else: the record's slot)
  const int64_t* pos;    // [T] position of token t (all inputs only)
  const int64_t* ins;    // [T] insert slot of token t (all inputs only: the record's slot)
  const float* table;    // [rows, 64] RoPE table, row = position (all inputs only)
  uint8_t* cache;        // pages of kPageStates records
  int64_t T;             // tokens
  int value_bytes, scale_bytes;  // record layout (values region, then scales region of a page)
  int64_t page_stride;           // bytes per page
};

// Enqueues the traffic kernel of mechanism `m` on `st` (one warp per kChunk tokens); the
// cp.async and bulk-copy kernels need compute capability >= 9.0. Returns cudaGetLastError().
cudaError_t launch_traffic(RowMechanism m, bool all_inputs, const TrafficParams& p, cudaStream_t st);

}  // namespace dsv41kv::bench
