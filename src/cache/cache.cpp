// Public cache API (cache.hpp): validate every argument on the host, then dispatch to the CPU
// backend (cpu.cpp) or, in CUDA builds, the CUDA backend (cuda/) by the device of the views.
// Nothing is written before all checks have passed; value checks (slots, positions against the
// RoPE table) need host memory and run only for CPU views, and the CUDA kernels skip (write
// nothing for) any index that is out of range.
#include "cache/backend.hpp"
#include "core/dispatch.hpp"

namespace dsv41kv {

void insert(const InsertArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "insert");
  const detail::InsertViews v = detail::insert_views(args);
  const detail::InsertPlan p = detail::plan_insert("insert", v, true);
  detail::dispatch(
      "insert", p.device, p.N == 0, [&] { detail::check_insert_values("insert", v, p); },
      [&] { detail::cpu::insert(args, p, ctx); }, [&] { detail::cuda::insert(args, p, ctx); });
}

void swa_insert_q_rope(const SwaInsertArgs& args, const ExecContext& ctx) {
  static constexpr const char* op = "swa_insert_q_rope";
  detail::check_exec_context(ctx, op);
  const detail::InsertViews v = detail::swa_insert_views(args);
  const detail::SwaInsertPlan p = detail::plan_swa_insert(args, v);
  detail::dispatch(
      op, p.insert.device, p.insert.N == 0, [&] { detail::check_swa_insert_values(args, v, p); },
      [&] { detail::cpu::swa_insert_q_rope(args, p, ctx); }, [&] { detail::cuda::swa_insert_q_rope(args, p, ctx); });
}

void gather(const GatherArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "gather");
  const detail::GatherPlan p = detail::plan_gather(args);
  detail::dispatch(
      "gather", p.device, p.M == 0, [&] { detail::check_gather_values(args, p); },
      [&] { detail::cpu::gather(args, p, ctx); }, [&] { detail::cuda::gather(args, p, ctx); });
}

void save_ring_rows(const SaveRingRowsArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "save_ring_rows");
  const detail::SaveRingRowsPlan p = detail::plan_save_ring_rows(args);
  detail::dispatch(
      "save_ring_rows", p.device, p.G == 0, [&] { detail::check_save_ring_rows_values(args, p); },
      [&] { detail::cpu::save_ring_rows(args, p, ctx); }, [&] { detail::cuda::save_ring_rows(args, p, ctx); });
}

}  // namespace dsv41kv
