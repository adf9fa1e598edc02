// Public cache API (cache.hpp): validate every argument on the host, then dispatch to the CPU
// backend (cpu.cpp) or, in CUDA builds, the CUDA backend (cuda/) by the device of the views.
// Nothing is written before all checks have passed; value checks (slots, positions against the
// RoPE table) need host memory and run only for CPU views, and the CUDA kernels skip (write
// nothing for) any index that is out of range.
#include "cache/backend.hpp"
#include "core/validate.hpp"

namespace dsv41kv {

void insert(const InsertArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "insert");
  const detail::InsertViews v = detail::insert_views(args);
  const detail::InsertPlan p = detail::plan_insert("insert", v, true);
  if (p.device == Device::CPU) {
    detail::check_insert_values("insert", v, p);
    if (p.N == 0) return;
    detail::cpu::insert(args, p, ctx);
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (p.N == 0) return;
  detail::cuda::insert(args, p, ctx);
#else
  detail::no_cuda("insert");
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
  detail::no_cuda("gather");
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
  detail::no_cuda("save_ring_rows");
#endif
}

}  // namespace dsv41kv
