// The validation kit (validate.hpp).
#include "core/validate.hpp"

#include <fmt/format.h>

#include "dsv41kv/records.hpp"
#include "dsv41kv/tuning.hpp"

namespace dsv41kv::detail {

void bad_arg(const char* op, const char* arg, const std::string& msg) {
  invalid_argument(fmt::format("{}: {}: {}", op, arg, msg));
}

void no_cuda(const char* op) {
  invalid_argument(
      fmt::format("{}: the views are on cuda, but dsv41kv was built without CUDA (expected cpu views)", op));
}

void no_cuda_backend(const char* op) {
  invalid_argument(
      fmt::format("{}: the views are on cuda, but {} has no CUDA backend yet (expected cpu views)", op, op));
}

void built_without_cuda(const char* what) {
  invalid_argument(fmt::format("{}: dsv41kv was built without CUDA (DSV41KV_CUDA=OFF)", what));
}

void check_exec_context(const ExecContext& ctx, const char* op) {
  if (ctx.num_threads < 0)
    invalid_argument(
        fmt::format("{}: ctx.num_threads = {}, expected >= 0 (0 = hardware concurrency)", op, ctx.num_threads));
  if (ctx.compress_tuning != nullptr) check_compress_tuning(*ctx.compress_tuning, op);
}

void check_compress_tuning(const CompressTuning& t, const char* op) {
  const char* arg = "ctx.compress_tuning";
  if (t.program_warps != 0 && t.program_warps != 1 && t.program_warps != 4)
    bad_arg(op, arg, fmt::format("program_warps = {}, expected 0, 1 or 4", t.program_warps));
  if (t.stream_chunk != 0 && t.stream_chunk != kStreamChunkSmall && t.stream_chunk != kStreamChunkLarge)
    bad_arg(op, arg,
            fmt::format("stream_chunk = {}, expected 0, {} or {}", t.stream_chunk, kStreamChunkLarge, kStreamChunkSmall));
  if (t.stream_rows < 0 || t.stream_rows > 2)
    bad_arg(op, arg, fmt::format("stream_rows = {}, expected 0, 1 or 2", t.stream_rows));
  const StreamTaper& tp = t.taper;
  if (tp.nhead < 0 || tp.nhead > kStreamHeadMax || tp.ntail < 0 || tp.ntail > kStreamTailMax)
    bad_arg(op, arg,
            fmt::format("taper: {} head and {} tail parts, expected at most {} and {}", tp.nhead, tp.ntail,
                        kStreamHeadMax, kStreamTailMax));
  auto parts = [&](const char* which, const double* waves, const int* chunks, int n) {
    for (int k = 0; k < n; ++k)
      if (!(waves[k] > 0.0 && waves[k] <= 1000.0) || chunks[k] < 1 || chunks[k] >= kStreamChunkSmall)
        bad_arg(op, arg,
                fmt::format("taper: {} part {}: {:f} waves, chunk {}, expected waves in (0, 1000] and a chunk in "
                            "[1, {}]",
                            which, k, waves[k], chunks[k], kStreamChunkSmall - 1));
  };
  parts("head", tp.head_waves, tp.head_chunk, tp.nhead);
  parts("tail", tp.tail_waves, tp.tail_chunk, tp.ntail);
}

void need_present(const char* op, const TensorView& v, const char* arg, const char* what) {
  if (!v.present()) bad_arg(op, arg, fmt::format("absent, expected {}", what));
  for (int d = 0; d < v.ndim; ++d)
    if (v.shape[static_cast<size_t>(d)] < 0)
      bad_arg(op, arg,
              fmt::format("shape[{}] = {} is negative ({})", d, v.shape[static_cast<size_t>(d)], v.describe()));
  v.require_span(op, arg);
}

void need_dtype(const char* op, const TensorView& v, const char* arg, DType dt) {
  if (v.dtype != dt)
    bad_arg(op, arg, fmt::format("dtype {}, expected {} ({})", dtype_name(v.dtype), dtype_name(dt), v.describe()));
}

void need_ndim(const char* op, const TensorView& v, const char* arg, int nd) {
  if (v.ndim != nd) bad_arg(op, arg, fmt::format("{} dimensions, expected {} ({})", v.ndim, nd, v.describe()));
}

void need_contiguous(const char* op, const TensorView& v, const char* arg) {
  if (!v.is_contiguous())
    bad_arg(op, arg, fmt::format("not contiguous ({}), expected row-major contiguous", v.describe()));
}

void need_data(const char* op, const TensorView& v, const char* arg) {
  if (v.numel() > 0 && v.data == nullptr)
    bad_arg(op, arg, fmt::format("data pointer is null for {} elements", v.numel()));
}

void need_device(const char* op, const TensorView& v, const char* arg, Device dev, const char* ref) {
  if (v.present() && v.device != dev)
    bad_arg(op, arg,
            fmt::format("on {}, expected {} like {} (all views of one call on one device)", device_name(v.device),
                        device_name(dev), ref));
}

void need_on(const char* op, const TensorView& v, const char* arg, Device dev) {
  if (v.present() && v.device != dev)
    bad_arg(op, arg, fmt::format("on {}, expected {} ({})", device_name(v.device), device_name(dev), v.describe()));
}

int64_t need_vector(const char* op, const TensorView& v, const char* arg, DType dt, const char* what,
                    int64_t min_len) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 1);
  if (v.shape[0] < min_len)
    bad_arg(op, arg,
            fmt::format("{} entries, expected at least {} ({}; {})", v.shape[0], min_len, what, v.describe()));
  if (!v.is_contiguous())
    bad_arg(op, arg, fmt::format("stride {}, expected contiguous (stride 1; {})", v.stride[0], v.describe()));
  need_data(op, v, arg);
  return v.shape[0];
}

namespace {

// A 2-D view's elements in rows: contiguous inside a row, rows that do not overlap.
void need_row_major(const char* op, const TensorView& v, const char* arg) {
  if (v.shape[1] > 1 && v.stride[1] != 1)
    bad_arg(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[1], v.describe()));
  if (v.shape[0] > 1 && v.stride[0] < v.shape[1])
    bad_arg(op, arg,
            fmt::format("row stride {}, expected >= {} (rows must not overlap; {})", v.stride[0], v.shape[1],
                        v.describe()));
}

}  // namespace

void need_matrix(const char* op, const TensorView& v, const char* arg, DType dt, const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 2);
  need_row_major(op, v, arg);
  need_data(op, v, arg);
}

void need_rows(const char* op, const TensorView& v, const char* arg, DType dt, int64_t cols, int64_t min_rows,
               const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 2);
  if (v.shape[1] != cols)
    bad_arg(op, arg, fmt::format("shape[1] = {}, expected {} ({})", v.shape[1], cols, v.describe()));
  if (v.shape[0] < min_rows)
    bad_arg(op, arg, fmt::format("{} rows, expected at least {} ({})", v.shape[0], min_rows, v.describe()));
  if (v.stride[1] != 1 && v.shape[1] > 1)
    bad_arg(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[1], v.describe()));
  need_data(op, v, arg);
}

void need_row_stride16(const char* op, const TensorView& v, const char* arg) {
  const int64_t rs = v.stride[0];
  if (rs % 16 != 0)
    bad_arg(op, arg, fmt::format("row stride {} elements, expected a multiple of 16 ({})", rs, v.describe()));
  if (v.shape[0] > 1 && rs < v.shape[1])
    bad_arg(op, arg,
            fmt::format("row stride {} elements, expected >= {} (rows must not overlap; {})", rs, v.shape[1],
                        v.describe()));
}

void need_block_table(const char* op, const TensorView& v, const char* arg, const char* what) {
  need_present(op, v, arg, what);
  if (v.dtype != DType::I32)
    bad_arg(op, arg, fmt::format("dtype {}, expected i32 ({}; {})", dtype_name(v.dtype), what, v.describe()));
  need_ndim(op, v, arg, 2);
  if (v.shape[1] < 1)
    bad_arg(op, arg, fmt::format("shape [{}, {}], expected [num_reqs >= 0, >= 1] ({})", v.shape[0], v.shape[1], what));
  need_row_major(op, v, arg);
  if (v.shape[0] > 0 && v.data == nullptr)
    bad_arg(op, arg, fmt::format("data pointer is null for {} rows", v.shape[0]));
}

RingGeom need_ring(const char* op, const TensorView& v, const char* arg) {
  need_present(op, v, arg, "f32 [blocks, cap, 1024] ring");
  need_dtype(op, v, arg, DType::F32);
  need_ndim(op, v, arg, 3);
  if (v.shape[2] != kRingRowFloats)
    bad_arg(op, arg, fmt::format("shape[2] = {}, expected 1024 ([kv | score] row; {})", v.shape[2], v.describe()));
  if (v.shape[0] < 1) bad_arg(op, arg, fmt::format("{} blocks, expected >= 1 ({})", v.shape[0], v.describe()));
  if (v.shape[1] < 1)
    bad_arg(op, arg, fmt::format("capacity (shape[1]) = {}, expected >= 1 ({})", v.shape[1], v.describe()));
  if (v.stride[2] != 1) bad_arg(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[2], v.describe()));
  if (v.stride[1] < kRingRowFloats || v.stride[1] % 16 != 0)
    bad_arg(op, arg,
            fmt::format("row stride {} floats, expected >= 1024 and a multiple of 16 ({})", v.stride[1],
                        v.describe()));
  if (v.stride[0] < v.shape[1] * v.stride[1])
    bad_arg(op, arg,
            fmt::format("block stride {} floats, expected >= cap * row_stride = {} ({})", v.stride[0],
                        v.shape[1] * v.stride[1], v.describe()));
  need_data(op, v, arg);
  return {v.shape[0], v.shape[1], v.stride[0], v.stride[1]};
}

void need_ratio(const char* op, int ratio, ErrorCode code, const char* what) {
  if (ratio != 1 && ratio != 2) fail(code, fmt::format("{}: ratio = {}, expected 1 or 2 ({})", op, ratio, what));
}

void check_qsl(const char* op, const char* arg, std::span<const int32_t> q, int64_t N, int64_t num_actual) {
  if (q.empty()) bad_arg(op, arg, "0 entries, expected num_reqs + 1 >= 1");
  const int64_t nr = static_cast<int64_t>(q.size()) - 1;
  if (q[0] != 0) bad_arg(op, arg, fmt::format("qsl[0] = {}, expected 0", q[0]));
  for (int64_t j = 0; j < nr; ++j)
    if (q[static_cast<size_t>(j + 1)] < q[static_cast<size_t>(j)])
      bad_arg(op, arg,
              fmt::format("qsl[{}] = {} < qsl[{}] = {}, expected non-decreasing", j + 1, q[static_cast<size_t>(j + 1)],
                          j, q[static_cast<size_t>(j)]));
  const int64_t last = q[static_cast<size_t>(nr)];
  if (num_actual >= 0 && last != num_actual)
    bad_arg(op, arg, fmt::format("qsl[num_reqs = {}] = {}, expected num_actual_tokens = {}", nr, last, num_actual));
  if (last > N) bad_arg(op, arg, fmt::format("qsl[num_reqs = {}] = {}, expected <= N = {}", nr, last, N));
}

void check_slots_below(const char* op, const char* arg, std::span<const int64_t> v, int64_t limit,
                       const std::string& limit_text) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] >= limit)
      bad_arg(op, arg,
              fmt::format("{}[{}] = {}, expected < {} = {} (or < 0 to skip)", arg, i, v[i], limit_text, limit));
}

}  // namespace dsv41kv::detail

namespace dsv41kv {
void validate_compress_tuning(const CompressTuning& t) { detail::check_compress_tuning(t, "compress_tuning"); }
}  // namespace dsv41kv
