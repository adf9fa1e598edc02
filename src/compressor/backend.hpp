// Internal contract between the public compressor API (validation + dispatch, compressor.cpp),
// the CPU backend (cpu.cpp) and the CUDA backend (*.cu). Validation happens once, on the host,
// before any backend runs: plan_*() checks dtypes, shapes, strides and devices and returns the
// derived sizes; check_*_values() additionally checks data values (qsl, slots, positions) and
// is run only for host views (reading device memory would synchronise; the CUDA kernels bound
// every index they dereference and skip what is out of range instead).
#pragma once

#include <cstdint>

#include "dsv41kv/compressor.hpp"

namespace dsv41kv::detail {

struct CompressPlan {
  int ratio = 2;
  Device device = Device::CPU;
  int64_t N = 0;               // slot_mapping length (padding rows included)
  int64_t kv_row_stride = 0;   // floats between kv_score rows
  int64_t num_reqs = 0;        // ratio 2: qsl.shape[0] - 1; ratio 1: 0
  int64_t cap = 0;             // ratio 2: ring rows per block
  int64_t ring_blocks = 0;
  int64_t ring_block_stride = 0;  // floats
  int64_t ring_row_stride = 0;    // floats
  bool pcp = false;               // policy kOpenRow
  int64_t prev_rows = 0;          // G (0 when absent)
  int64_t prev_row_stride = 0;    // floats
  int64_t prev_indices = 0;       // R (0 when absent)
};
// compress(): latent_out required (compress_insert plans through plan_compress_insert).
CompressPlan plan_compress(const CompressArgs& a);
// Value checks of a CPU call; `op` names the operation in the messages.
void check_compress_values(const CompressArgs& a, const CompressPlan& p, const char* op);

struct InsertPlan {
  int ratio = 2;
  Device device = Device::CPU;
  int64_t N = 0;            // slots length
  int64_t table_rows = 0;   // rope table rows
  int64_t capacity = 0;     // cache.num_pages * cache.states_per_page
};
InsertPlan plan_insert(const InsertArgs& a);
void check_insert_values(const InsertArgs& a, const InsertPlan& p);

struct GatherPlan {
  Device device = Device::CPU;
  int64_t M = 0;
  int64_t out_row_stride = 0;
  int64_t capacity = 0;
};
GatherPlan plan_gather(const GatherArgs& a);

struct SaveRingRowsPlan {
  Device device = Device::CPU;
  int64_t G = 0;
  int64_t prev_row_stride = 0;
  int64_t cap = 0, ring_blocks = 0, ring_block_stride = 0, ring_row_stride = 0;
};
SaveRingRowsPlan plan_save_ring_rows(const SaveRingRowsArgs& a);

namespace cpu {
void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx);
void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx);
void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx);
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext& ctx);
}  // namespace cpu

#if defined(DSV41KV_WITH_CUDA)
namespace cuda {
void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx);
void insert(const InsertArgs& a, const InsertPlan& p, const ExecContext& ctx);
void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx);
void gather(const GatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void save_ring_rows(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p, const ExecContext& ctx);
}  // namespace cuda
#endif

}  // namespace dsv41kv::detail
