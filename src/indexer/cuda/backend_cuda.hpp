// The indexer's CUDA backend entry points (indexer_cuda.cu): validated arguments and plans into
// kernel launches on ctx.stream: every indexer op.
#pragma once

#include "dsv41kv/indexer.hpp"
#include "indexer/backend.hpp"

namespace dsv41kv::detail::cuda {
void index_k_store(const IndexKStoreArgs& a, const IndexKStorePlan& p, const ExecContext& ctx);
void index_q_prep(const IndexQPrepArgs& a, const IndexQPrepPlan& p, const ExecContext& ctx);
void indexer_shortcut(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p, const ExecContext& ctx);
void indexer_topk(const IndexerTopkArgs& a, const IndexerTopkPlan& p, const ExecContext& ctx);
}  // namespace dsv41kv::detail::cuda
