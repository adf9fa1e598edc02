// Public attention API (attention.hpp): validate every argument on the host, then run the CPU
// backend (cpu.cpp) or the CUDA kernels (cuda/) by the device of the views. Nothing is written
// before all checks have passed; values in device memory are not read on the host.
#include "attention/backend.hpp"
#include "attention/cuda/backend_cuda.hpp"
#include "core/dispatch.hpp"

namespace dsv41kv {

void sparse_decode(const SparseDecodeArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "sparse_decode");
  const detail::DecodePlan p = detail::plan_sparse_decode(args);
  detail::dispatch(
      "sparse_decode", p.device, p.heads.T == 0, [&] { detail::check_sparse_decode_values(args, p); },
      [&] { detail::cpu::sparse_decode(args, p, ctx); }, [&] { detail::cuda::sparse_decode(args, p, ctx); });
}

void sparse_prefill(const SparsePrefillArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "sparse_prefill");
  const detail::PrefillPlan p = detail::plan_sparse_prefill(args);
  detail::dispatch(
      "sparse_prefill", p.device, p.heads.T == 0, [&] { detail::check_sparse_prefill_values(args, p); },
      [&] { detail::cpu::sparse_prefill(args, p, ctx); }, [&] { detail::cuda::sparse_prefill(args, p, ctx); });
}

void gather_prefill_workspace(const WorkspaceGatherArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "gather_prefill_workspace");
  const detail::GatherPlan p = detail::plan_prefill_gather(args);
  detail::dispatch(
      "gather_prefill_workspace", p.device, args.chunk.num_reqs() == 0,
      [&] { detail::check_prefill_gather_values(args, p); },
      [&] { detail::cpu::gather_prefill_workspace(args, p, ctx); },
      [&] { detail::cuda::gather_prefill_workspace(args, p, ctx); });
}

void build_prefill_indices(const PrefillIndexArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "build_prefill_indices");
  const detail::IndexPlan p = detail::plan_prefill_indices(args);
  detail::dispatch(
      "build_prefill_indices", p.device, p.T == 0, [&] { detail::check_prefill_index_values(args, p); },
      [&] { detail::cpu::build_prefill_indices(args, p, ctx); },
      [&] { detail::cuda::build_prefill_indices(args, p, ctx); });
}

void attention_output_rope(const OutputRopeArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "attention_output_rope");
  const detail::OutputRopePlan p = detail::plan_output_rope(args);
  detail::dispatch(
      "attention_output_rope", p.device, p.T == 0, [&] { detail::check_output_rope_values(args, p); },
      [&] { detail::cpu::attention_output_rope(args, p, ctx); },
      [&] { detail::cuda::attention_output_rope(args, p, ctx); });
}

}  // namespace dsv41kv
