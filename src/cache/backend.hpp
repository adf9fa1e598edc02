// Internal contract between the public cache API (validation + dispatch, cache.cpp), the CPU
// backend (cpu.cpp) and the CUDA backend (cuda/). Validation happens once, on the host, before
// any backend runs (plan.cpp): plan_*() checks dtypes, shapes, strides and devices and returns the
// derived sizes; check_*_values() additionally checks data values and runs only for host views
// (the CUDA kernels bound every index they dereference and skip what is out of range).
#pragma once

#include <cstdint>

#include "dsv41kv/cache.hpp"
#include "formats/insert.hpp"

namespace dsv41kv::detail {

// insert(): the views of the insert rule (formats/insert.hpp).
InsertViews insert_views(const InsertArgs& a);

// swa_insert_q_rope(): the insert rule's views (kind kSwa) and the query geometry.
InsertViews swa_insert_views(const SwaInsertArgs& a);
struct SwaInsertPlan {
  InsertPlan insert;  // N = T
  int64_t heads = 0, heads_out = 0;           // H, H_pad
  int64_t q_token_stride = 0, q_head_stride = 0;
  int64_t out_token_stride = 0, out_head_stride = 0;
};
SwaInsertPlan plan_swa_insert(const SwaInsertArgs& a, const InsertViews& v);
// The insert's value checks, then every position of the call inside the RoPE table (the queries of
// all T tokens are rotated, whatever their slot).
void check_swa_insert_values(const SwaInsertArgs& a, const InsertViews& v, const SwaInsertPlan& p);

struct GatherPlan {
  Device device = Device::CPU;
  int64_t M = 0;
  int64_t out_row_stride = 0;
  int64_t capacity = 0;
};
GatherPlan plan_gather(const GatherArgs& a);
void check_gather_values(const GatherArgs& a, const GatherPlan& p);

struct SaveRingRowsPlan {
  Device device = Device::CPU;
  int64_t G = 0;
  int64_t prev_row_stride = 0;
  int64_t cap = 0, ring_blocks = 0, ring_block_stride = 0, ring_row_stride = 0;
};
SaveRingRowsPlan plan_save_ring_rows(const SaveRingRowsArgs& a);
void check_save_ring_rows_values(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p);

namespace cpu {
void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx);
void swa_insert_q_rope(const SwaInsertArgs& a, const SwaInsertPlan& p, const ExecContext& ctx);
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext& ctx);
}  // namespace cpu

// (defined in CUDA builds only: core/dispatch.hpp calls them only there)
namespace cuda {
void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx);
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext& ctx);
void swa_insert_q_rope(const SwaInsertArgs& a, const SwaInsertPlan& p, const ExecContext& ctx);
}  // namespace cuda

}  // namespace dsv41kv::detail
