// The attention's CUDA backend entry points (attention_cuda.cu): validated arguments and plans into
// kernel launches on ctx.stream: every attention op (the host-only plans, the decode schedule and
// the chunk plan, stay on the host).
#pragma once

#include "attention/backend.hpp"
#include "core/cuda/device_info.hpp"
#include "dsv41kv/attention.hpp"

namespace dsv41kv::detail::cuda {
void sparse_decode(const SparseDecodeArgs& a, const DecodePlan& p, const ExecContext& ctx);
void sparse_prefill(const SparsePrefillArgs& a, const PrefillPlan& p, const ExecContext& ctx);
void attention_output_rope(const OutputRopeArgs& a, const OutputRopePlan& p, const ExecContext& ctx);
void gather_prefill_workspace(const WorkspaceGatherArgs& a, const GatherPlan& p, const ExecContext& ctx);
void build_prefill_indices(const PrefillIndexArgs& a, const IndexPlan& p, const ExecContext& ctx);
}  // namespace dsv41kv::detail::cuda
