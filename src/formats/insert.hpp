// The RoPE + quantized insert of SPEC 5.1 as a format rule, shared by the cache's insert, the
// compressor's fused compress_insert and the SWA insert (SPEC 5.4): which tokens are written
// (slot >= 0 and closing its group), the RoPE at the group start row, the record written for one
// state, the checks of an insert's views and values, and the CPU loop over tokens. The device form
// of the per-state write is formats/cuda/record_writers.cuh.
//
// The SWA insert is this insert with ratio 1 (kSwaInsertRatio): every token closes its group of
// one and its RoPE row (p / 1) * 1 is its own position, so the rule, the checks and the loop are
// the same ones; only the allowed formats (the platform's record, SPEC 3.4) and the argument
// names differ (InsertKind).
#pragma once

#include <cstdint>
#include <string>

#include "core/cpu_form.hpp"
#include "core/parallel.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

inline constexpr int64_t kWrittenTokenGrain = 16;  // tokens per thread range

// Sizes of one insert, from views checked for dtype, shape, stride and device.
struct InsertPlan {
  int ratio = 2;
  Device device = Device::CPU;
  int64_t N = 0;           // slots length
  int64_t table_rows = 0;  // RoPE table rows
  int64_t capacity = 0;    // cache.num_pages * cache.states_per_page
};

// SPEC 5.4: the ratio of the SWA insert (one state per raw token, RoPE at the token's position).
inline constexpr int kSwaInsertRatio = 1;

// What an insert writes: a kv source's compressed cache (ratio 1 or 2, every record format) or a
// layer's SWA cache (ratio kSwaInsertRatio, the 584 / 528 records or plain rows: SPEC 3.4 names the
// platform's record, the plain rows are the kernel-level formats of tests).
enum class InsertKind : uint8_t { kCompressed, kSwa };

// The views of an insert (SPEC 5.1): `op` prefixes the messages, `latent_arg` and `slots_arg` name
// the rows and the slot mapping. `latent` may be absent unless require_latent (compress_insert's
// insert half, whose latent never leaves the fused op). E3 for a ratio outside {1, 2} (kCompressed;
// kSwa needs kSwaInsertRatio), E8 otherwise.
struct InsertViews {
  InsertKind kind = InsertKind::kCompressed;
  int ratio = 2;
  const TensorView* latent = nullptr;      // bf16 [rows >= N, 512], contiguous
  const TensorView* positions = nullptr;   // i64 [>= N]
  const TensorView* rope_table = nullptr;  // f32 [rows, 64], contiguous
  const TensorView* slots = nullptr;       // i64 [N]
  const char* slots_arg = "slots";
  const char* latent_arg = "latent";
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
// tests/formats/test_records.cpp. The attention keys are read with it. `form` picks the loops
// (the AVX-512 one for 584 and 528 records: 16 values per step, the same bits).
void read_state_f32(const CacheView& c, int64_t slot, float* out, CpuForm form = fastest_cpu_form());

// The host value checks of every op that writes one state per closing token with a slot (the
// insert, the index-K store of SPEC 8.1): for each token t < N with slot[t] >= 0, the slot below
// `capacity` (`capacity_text` explains it, e.g. "num_pages * states_per_page = 2 * 16"),
// positions[t] >= 0 and, when it closes its group, its RoPE row rope_row(p, ratio) < table_rows.
void check_written_token_values(const char* op, const char* slots_arg, const int64_t* slot, const int64_t* pos,
                                int64_t N, int ratio, int64_t capacity, const std::string& capacity_text,
                                int64_t table_rows);

// Whether token t is written: slot[t] >= 0, mask[t] (when given) and it closes its group.
inline bool writes_token(const int64_t* slot, const int64_t* pos, const uint8_t* mask, int ratio, int64_t t) {
  return slot[t] >= 0 && (mask == nullptr || mask[t]) && closes_group(pos[t], ratio);
}
// True when two tokens that would be written name the same slot.
bool has_duplicate_writes(const int64_t* slot, const int64_t* pos, const uint8_t* mask, int ratio, int64_t N);

// Runs f(t) for every token t < N that writes_token, parallel over tokens by ctx.num_threads;
// duplicate slots (invalid input) are written serially in token order, so the last one wins
// whatever the thread count.
template <class F>
void for_each_written_token(const int64_t* slot, const int64_t* pos, const uint8_t* mask, int ratio, int64_t N,
                            const ExecContext& ctx, F&& f) {
  ExecContext c = ctx;
  if (has_duplicate_writes(slot, pos, mask, ratio, N)) c.num_threads = 1;
  parallel_for(N, c, kWrittenTokenGrain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      if (writes_token(slot, pos, mask, ratio, t)) f(t);
  });
}

// CPU insert of tokens [0, N): token t is written when slot[t] >= 0, mask[t] (when given) and it
// closes its group (for_each_written_token).
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
