// The indexer's CUDA backend entry points (indexer_cuda.cu): validated arguments and plans into
// kernel launches on ctx.stream. The index-K store and the Q preparation so far; the scores and
// the top-k have no CUDA backend yet (their plans refuse device views).
#pragma once

#include "dsv41kv/indexer.hpp"
#include "indexer/backend.hpp"

namespace dsv41kv::detail::cuda {
void index_k_store(const IndexKStoreArgs& a, const IndexKStorePlan& p, const ExecContext& ctx);
void index_q_prep(const IndexQPrepArgs& a, const IndexQPrepPlan& p, const ExecContext& ctx);
}  // namespace dsv41kv::detail::cuda
