// Internal contract between the public compressor API (validation + dispatch, compressor.cpp),
// the CPU backend (cpu.cpp) and the CUDA backend (cuda/). Validation happens once, on the host,
// before any backend runs (plan.cpp): plan_*() checks dtypes, shapes, strides and devices and
// returns the derived sizes; check_*_values() additionally checks data values (qsl, slots,
// positions) and is run only for host views (reading device memory would synchronise; the CUDA
// kernels bound every index they dereference and skip what is out of range instead).
#pragma once

#include <cstdint>

#include "dsv41kv/compressor.hpp"
#include "formats/insert.hpp"

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
// compress(): latent_out required.
CompressPlan plan_compress(const CompressArgs& a);
// Value checks of a CPU call; `op` names the operation in the messages.
void check_compress_values(const CompressArgs& a, const CompressPlan& p, const char* op);

// compress_insert(): both halves, checked to describe the same N and device; the insert half is
// the insert rule's views over (latent_out, positions, rope_table, insert_slots, cache).
InsertViews insert_half(const CompressInsertArgs& a);
void plan_compress_insert(const CompressInsertArgs& a, CompressPlan& cp, InsertPlan& ip);

namespace cpu {
void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx);
void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx);
}  // namespace cpu

// (defined in CUDA builds only: core/dispatch.hpp calls them only there)
namespace cuda {
void compress(const CompressArgs& a, const CompressPlan& p, const ExecContext& ctx);
void compress_insert(const CompressInsertArgs& a, const CompressPlan& cp, const InsertPlan& ip,
                     const ExecContext& ctx);
}  // namespace cuda

}  // namespace dsv41kv::detail
