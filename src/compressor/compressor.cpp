// Public compressor API (compressor.hpp): validate every argument on the host, then dispatch
// to the CPU backend (cpu.cpp) or, in CUDA builds, the CUDA backend (*.cu) by the device of the
// views. Nothing is written before all checks have passed. Value checks (qsl, token_to_req,
// slot ranges, positions against the RoPE table) need host memory and run only for CPU views;
// for CUDA views only dtypes/shapes/strides/devices are checked, and the CUDA kernels skip
// (write nothing for) any index that is out of range.
#include <fmt/format.h>

#include "compressor/backend.hpp"
#include "compressor/validate.hpp"

namespace dsv41kv {
namespace {

#if !defined(DSV41KV_WITH_CUDA)
[[noreturn]] void no_cuda(const char* op) {
  invalid_argument(fmt::format("{}: the views are on cuda, but dsv41kv was built without CUDA",
                               op));
}
#endif

}  // namespace

void compress(const CompressArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "compress");
  const detail::CompressPlan p = detail::plan_compress(args);
  if (p.device == Device::CPU) {
    detail::check_compress_values(args, p, "compress");
    if (p.N == 0) return;
    detail::cpu::compress(args, p, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (p.N == 0) return;
  detail::cuda::compress(args, p, ctx);
#else
  no_cuda("compress");
#endif
}

void insert(const InsertArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "insert");
  const detail::InsertPlan p = detail::plan_insert(args);
  if (p.device == Device::CPU) {
    detail::check_insert_values(args, p);
    if (p.N == 0) return;
    detail::cpu::insert(args, p, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (p.N == 0) return;
  detail::cuda::insert(args, p, ctx);
#else
  no_cuda("insert");
#endif
}

void compress_insert(const CompressInsertArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "compress_insert");
  detail::CompressPlan cp;
  detail::InsertPlan ip;
  detail::plan_compress_insert(args, cp, ip);
  if (cp.device == Device::CPU) {
    detail::check_compress_values(args.compress, cp, "compress_insert");
    detail::check_insert_values_impl(detail::insert_half(args), ip, "compress_insert");
    if (cp.N == 0) return;
    detail::cpu::compress_insert(args, cp, ip, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (cp.N == 0) return;
  detail::cuda::compress_insert(args, cp, ip, ctx);
#else
  no_cuda("compress_insert");
#endif
}

void gather(const GatherArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "gather");
  const detail::GatherPlan p = detail::plan_gather(args);
  if (p.device == Device::CPU) {
    detail::check_gather_values(args, p);
    if (p.M == 0) return;
    detail::cpu::gather(args, p, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (p.M == 0) return;
  detail::cuda::gather(args, p, ctx);
#else
  no_cuda("gather");
#endif
}

void save_ring_rows(const SaveRingRowsArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "save_ring_rows");
  const detail::SaveRingRowsPlan p = detail::plan_save_ring_rows(args);
  if (p.device == Device::CPU) {
    detail::check_save_ring_rows_values(args, p);
    if (p.G == 0) return;
    detail::cpu::save_ring_rows(args, p, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (p.G == 0) return;
  detail::cuda::save_ring_rows(args, p, ctx);
#else
  no_cuda("save_ring_rows");
#endif
}

}  // namespace dsv41kv
