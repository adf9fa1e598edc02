// The RoPE + quantized insert of SPEC 5.1 as a format rule, shared by the cache's insert and the
// compressor's fused compress_insert: which tokens are written (slot >= 0 and closing its group),
// the RoPE at the group start row, the record written for one state, the checks of an insert's
// views and values, and the CPU loop over tokens. The device form of the per-state write is
// formats/cuda/record_writers.cuh.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

// Sizes of one insert, from views checked for dtype, shape, stride and device.
struct InsertPlan {
  int ratio = 2;
  Device device = Device::CPU;
  int64_t N = 0;           // slots length
  int64_t table_rows = 0;  // RoPE table rows
  int64_t capacity = 0;    // cache.num_pages * cache.states_per_page
};

// The views of an insert (SPEC 5.1): `op` prefixes the messages, `slots_arg` names the slot
// mapping. `latent` may be absent unless require_latent (compress_insert's insert half, whose
// latent never leaves the fused op). E3 for a ratio outside {1, 2}, E8 otherwise.
struct InsertViews {
  int ratio = 2;
  const TensorView* latent = nullptr;      // bf16 [rows >= N, 512], contiguous
  const TensorView* positions = nullptr;   // i64 [>= N]
  const TensorView* rope_table = nullptr;  // f32 [rows, 64], contiguous
  const TensorView* slots = nullptr;       // i64 [N]
  const char* slots_arg = "slots";
  const CacheView* cache = nullptr;
};
InsertPlan plan_insert(const char* op, const InsertViews& v, bool require_latent);
// Host values: slots below the cache capacity, positions >= 0 for written tokens, and the RoPE
// row of every closing token inside the table.
void check_insert_values(const char* op, const InsertViews& v, const InsertPlan& p);

// x = the latent row as floats (exact), y = x with the forward RoPE of SPEC 1.4 on dims 448..511
// at table row `trow` (64 floats: 32 cos, 32 sin).
void rope_latent_row(const uint16_t* latent, const float* trow, float* x, float* y);
// The record of one state at `slot` of `c` (SPEC 3.3, 5.2) from x and y; `fp8_inv` is
// fp32(1 / sigma) for plain fp8 rows.
void write_state(const CacheView& c, int64_t slot, const float* x, const float* y, float fp8_inv);
// The dequantized state at `slot` of `c` as 512 bf16 values (SPEC 5.3, the inverse of write_state).
void read_state(const CacheView& c, int64_t slot, uint16_t* out);
// The same values widened to fp32 (bf16_decode of read_state, bit for bit), by table lookups and
// one exact product where the product needs no bf16 rounding (a UE8M0 scale byte of 20 .. 254:
// every e4m3 value times the scale is 0 or a normal fp32 of at most 4 significant bits; an NVFP4
// tile with a non-NaN scale: e2m1 times e4m3 has at most 6 significant bits and lies in the normal
// range), through the readers otherwise. Checked on every code and scale byte by
// tests/formats/test_records.cpp. The attention keys are read with it.
void read_state_f32(const CacheView& c, int64_t slot, float* out);

// CPU insert of tokens [0, N): token t is written when slot[t] >= 0, mask[t] (when given) and it
// closes its group. Parallel over tokens by ctx.num_threads; duplicate slots (invalid input) are
// written serially in token order, so the last one wins whatever the thread count.
struct InsertRows {
  const uint16_t* latent = nullptr;  // [N, 512]
  const int64_t* pos = nullptr;
  const float* table = nullptr;      // [rows, 64]
  const int64_t* slot = nullptr;
  const uint8_t* mask = nullptr;     // optional [N]
  CacheView cache;
};
void insert_rows_cpu(const InsertRows& io, int ratio, int64_t N, const ExecContext& ctx);

}  // namespace dsv41kv::detail
