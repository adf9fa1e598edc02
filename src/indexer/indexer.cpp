// Public indexer API (indexer.hpp): validate every argument on the host (plan.cpp), then run the
// CPU backend (cpu.cpp) or the CUDA kernels (cuda/) by the device of the views. Nothing is
// written before all checks have passed; values in device memory are not read on the host.
#include "dsv41kv/indexer.hpp"

#include <fmt/format.h>

#include "core/dispatch.hpp"
#include "indexer/backend.hpp"
#include "indexer/cuda/backend_cuda.hpp"

namespace dsv41kv {

const char* index_k_format_name(IndexKFormat f) {
  switch (f) {
    case IndexKFormat::FP8_132: return "fp8_132";
    case IndexKFormat::MXFP4_68: return "mxfp4_68";
  }
  return "unknown";
}

int index_k_record_bytes(IndexKFormat f) {
  return f == IndexKFormat::MXFP4_68 ? IndexerKMxfp4Layout::kRecordBytes : IndexerKFp8Layout::kRecordBytes;
}

IndexKCacheView IndexKCacheView::with_default_strides(void* base, IndexKFormat f, int64_t num_pages,
                                                      int64_t states_per_page, Device device) {
  IndexKCacheView c;
  c.base = base;
  c.format = f;
  c.num_pages = num_pages;
  c.states_per_page = states_per_page;
  c.page_stride = f == IndexKFormat::MXFP4_68 ? IndexerKMxfp4Layout::default_page_stride(states_per_page)
                                              : IndexerKFp8Layout::default_page_stride(states_per_page);
  c.device = device;
  return c;
}

const char* indexer_role_name(IndexerRole r) {
  switch (r) {
    case IndexerRole::kPlain: return "plain";
    case IndexerRole::kCandidateSource: return "candidate_source";
    case IndexerRole::kCandidateConsumer: return "candidate_consumer";
  }
  return "unknown";
}


void indexer_k_store(const IndexKStoreArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "indexer_k_store");
  const detail::IndexKStorePlan p = detail::plan_index_k_store(args);
  detail::dispatch(
      "indexer_k_store", p.device, p.N == 0, [&] { detail::check_index_k_store_values(args, p); },
      [&] { detail::cpu::index_k_store(args, p, ctx); }, [&] { detail::cuda::index_k_store(args, p, ctx); });
}

void indexer_prepare_q(const IndexQPrepArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "indexer_prepare_q");
  const detail::IndexQPrepPlan p = detail::plan_index_q_prep(args);
  detail::dispatch(
      "indexer_prepare_q", p.device, p.T == 0, [&] { detail::check_index_q_prep_values(args, p); },
      [&] { detail::cpu::index_q_prep(args, p, ctx); }, [&] { detail::cuda::index_q_prep(args, p, ctx); });
}

void indexer_topk(const IndexerTopkArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "indexer_topk");
  const detail::IndexerTopkPlan p = detail::plan_indexer_topk(args);
  detail::dispatch(
      "indexer_topk", p.device, p.T == 0, [&] { detail::check_indexer_topk_values(args, p); },
      [&] { detail::cpu::indexer_topk(args, p, ctx); }, [&] { detail::cuda::indexer_topk(args, p, ctx); });
}

int64_t indexer_topk_workspace_bytes(int64_t T, int64_t max_pages, int64_t states_per_page, IndexerRole role) {
  const char* op = "indexer_topk_workspace_bytes";
  if (T < 0) detail::bad_arg(op, "T", fmt::format("{}, expected >= 0", T));
  if (max_pages < 0) detail::bad_arg(op, "max_pages", fmt::format("{}, expected >= 0", max_pages));
  if (states_per_page <= 0) detail::bad_arg(op, "states_per_page", fmt::format("{}, expected > 0", states_per_page));
  if (role != IndexerRole::kPlain && role != IndexerRole::kCandidateSource && role != IndexerRole::kCandidateConsumer)
    detail::bad_arg(op, "role", fmt::format("unknown value {}", static_cast<int>(role)));
  const int64_t per = detail::topk_ws_token_bytes(role, detail::topk_chunks(role, detail::topk_entry_bound(max_pages, states_per_page)));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(T, per, &bytes))
    detail::bad_arg(op, "T", fmt::format("{} tokens of {} bytes each overflow 64 bits", T, per));
  return bytes;
}

bool indexer_takes_shortcut(int64_t max_seq_len_in_batch, int ratio, bool capturing_cuda_graph) {
  detail::need_ratio("indexer_takes_shortcut", ratio, ErrorCode::kInvalidArgument,
                     "the kv source's compress ratio, SPEC 1.2");
  if (max_seq_len_in_batch < 0)
    detail::bad_arg("indexer_takes_shortcut", "max_seq_len_in_batch",
                    fmt::format("{}, expected >= 0", max_seq_len_in_batch));
  return !capturing_cuda_graph && max_seq_len_in_batch / ratio <= kIndexTopk;
}

void indexer_shortcut_topk(const IndexerShortcutArgs& args, const ExecContext& ctx) {
  detail::check_exec_context(ctx, "indexer_shortcut_topk");
  const detail::IndexerShortcutPlan p = detail::plan_indexer_shortcut(args);
  detail::dispatch(
      "indexer_shortcut_topk", p.device, p.T == 0, [&] { detail::check_indexer_shortcut_values(args, p); },
      [&] { detail::cpu::indexer_shortcut(args, p, ctx); }, [&] { detail::cuda::indexer_shortcut(args, p, ctx); });
}

}  // namespace dsv41kv
