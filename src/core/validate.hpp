// The one validation kit of every op (compressor, cache, metadata, projection, PCP, link): checks
// of views, scalars and host index data that throw dsv41kv::Error before any output is touched.
//
// Every message reads "<op>: <argument>: <what was found>, expected <what is required>" and ends
// with the view's description where one is involved. View checks never read tensor data, so they
// hold for device views too; the value checks (check_*) read host memory and run only for host
// views (reading device memory would synchronise; the CUDA kernels bound every index they
// dereference instead).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

// E8 "<op>: <arg>: <msg>".
[[noreturn]] void bad_arg(const char* op, const char* arg, const std::string& msg);
// E8 "<op>: the views are on cuda, but dsv41kv was built without CUDA (expected cpu views)".
[[noreturn]] void no_cuda(const char* op);
// E8 "<what>: dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)": the CUDA-only entry points of a
// build without CUDA.
[[noreturn]] void built_without_cuda(const char* what);
// E8 "<op>: the views are on cuda, but <op> has no CUDA backend yet (expected cpu views)": an op
// whose kernels are still to come, in every build.
[[noreturn]] void no_cuda_backend(const char* op);

// ctx.num_threads >= 0 and, when given, valid compress tuning values.
void check_exec_context(const ExecContext& ctx, const char* op);
void check_compress_tuning(const CompressTuning& t, const char* op);

// ---------------------------------------------------------------- views (valid for device views)

// Present (else "absent, expected <what>"), no negative extent, addressed span below 2^62 bytes.
void need_present(const char* op, const TensorView& v, const char* arg, const char* what);
void need_dtype(const char* op, const TensorView& v, const char* arg, DType dt);
void need_ndim(const char* op, const TensorView& v, const char* arg, int nd);
void need_contiguous(const char* op, const TensorView& v, const char* arg);
// A non-null data pointer when the view has elements.
void need_data(const char* op, const TensorView& v, const char* arg);
// v (when present) on `dev`, like the view named `ref`.
void need_device(const char* op, const TensorView& v, const char* arg, Device dev, const char* ref);
// v (when present) on `dev` (no reference view).
void need_on(const char* op, const TensorView& v, const char* arg, Device dev);

// A contiguous 1-D vector of dtype dt with at least min_len entries; returns its length.
int64_t need_vector(const char* op, const TensorView& v, const char* arg, DType dt, const char* what,
                    int64_t min_len = 0);
// A 2-D view of dtype dt with inner stride 1 and rows that do not overlap (any row count).
void need_matrix(const char* op, const TensorView& v, const char* arg, DType dt, const char* what);
// A 2-D view of dtype dt, [rows >= min_rows, cols], inner stride 1.
void need_rows(const char* op, const TensorView& v, const char* arg, DType dt, int64_t cols, int64_t min_rows,
               const char* what);
// Row stride a multiple of 16 elements (aligned vector rows), rows not overlapping.
void need_row_stride16(const char* op, const TensorView& v, const char* arg);
// An i32 block table [rows >= 0, cols >= 1], inner stride 1, rows not overlapping.
void need_block_table(const char* op, const TensorView& v, const char* arg, const char* what);

// A ratio-2 compressor ring f32 [blocks, cap, 1024], strides [block_stride, row_stride, 1]
// (SPEC 3.2: row_stride >= 1024 and % 16 == 0, block_stride >= cap * row_stride).
struct RingGeom {
  int64_t blocks = 0, cap = 0, block_stride = 0, row_stride = 0;
};
RingGeom need_ring(const char* op, const TensorView& v, const char* arg);

// ---------------------------------------------------------------- scalars

// 1 or 2 (SPEC 1.2), else `code` (E2 metadata, E3 compressor) with `what` naming the role.
void need_ratio(const char* op, int ratio, ErrorCode code, const char* what);

// ---------------------------------------------------------------- host values

// qsl of num_reqs + 1 entries: qsl[0] == 0, non-decreasing, and qsl[num_reqs] <= N; with
// num_actual >= 0 also qsl[num_reqs] == num_actual. `arg` names the view in messages.
void check_qsl(const char* op, const char* arg, std::span<const int32_t> qsl, int64_t N, int64_t num_actual = -1);
// Every v[i] < limit (negative entries mean "skip"); `limit_text` explains the limit
// ("num_pages * states_per_page = 2 * 16").
void check_slots_below(const char* op, const char* arg, std::span<const int64_t> v, int64_t limit,
                       const std::string& limit_text);

}  // namespace dsv41kv::detail
