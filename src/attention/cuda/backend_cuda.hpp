// The attention's CUDA backend entry points (attention_cuda.cu): validated arguments and plans into
// kernel launches on ctx.stream. The decode attention over the paged caches, the prefill
// attention over a bf16 workspace and the output inverse RoPE so far; the workspace gather and the
// index rows have a CPU backend only.
#pragma once

#include "attention/backend.hpp"
#include "dsv41kv/attention.hpp"

namespace dsv41kv::detail::cuda {
void sparse_decode(const SparseDecodeArgs& a, const DecodePlan& p, const ExecContext& ctx);
void sparse_prefill(const SparsePrefillArgs& a, const PrefillPlan& p, const ExecContext& ctx);
void attention_output_rope(const OutputRopeArgs& a, const OutputRopePlan& p, const ExecContext& ctx);
}  // namespace dsv41kv::detail::cuda
