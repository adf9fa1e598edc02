// Internal contract between the public indexer API (validation + dispatch, indexer.cpp), its
// validation (plan.cpp) and the CPU backend (cpu.cpp). plan_*() checks dtypes, shapes, strides and
// devices and returns the derived sizes; check_*_values() checks the host index data (slots,
// positions, requests, pages, candidates). Both run before any output is written.
#pragma once

#include <cstdint>

#include "core/cpu_form.hpp"
#include "dsv41kv/indexer.hpp"

namespace dsv41kv::detail {

// A valid index-K cache view (present base, pages, S, a page stride >= the payload, a span below
// 2^62 bytes); `op` and `arg` name it in messages.
void validate_index_k_cache(const IndexKCacheView& c, const char* op, const char* arg);

struct IndexKStorePlan {
  Device device = Device::CPU;
  int ratio = 2;
  int64_t N = 0;
  int64_t table_rows = 0;
  int64_t capacity = 0;  // cache.num_pages * cache.states_per_page
};
IndexKStorePlan plan_index_k_store(const IndexKStoreArgs& a);
void check_index_k_store_values(const IndexKStoreArgs& a, const IndexKStorePlan& p);

struct IndexQPrepPlan {
  Device device = Device::CPU;
  int64_t T = 0;
  int64_t table_rows = 0;
};
IndexQPrepPlan plan_index_q_prep(const IndexQPrepArgs& a);
void check_index_q_prep_values(const IndexQPrepArgs& a, const IndexQPrepPlan& p);

struct IndexerTopkPlan {
  Device device = Device::CPU;
  int64_t T = 0;
  int64_t num_reqs = 0;
  int64_t bt_cols = 0, bt_stride = 0;
  int64_t topk_stride = 0;
  int64_t cand_stride = 0;                  // candidate source / consumer
  int64_t scores_cols = 0, scores_stride = 0;  // when scores is present
  int64_t ws_chunks = 0;                    // CUDA: chunks per token in the workspace (topk_chunks)
  int group_tokens = 2;                     // CUDA: tokens per scoring block
  int score_blocks_per_sm = 2;              // CUDA: the scoring kernel's register cap (1 or 2)
  int score_kernel = 1;                     // CUDA: 1 chunk, 2 warpgroup (where the device has wgmma)
  bool score_kernel_forced = false;         // requested as 2 (else the library's choice)
};

// The CUDA top-k's chunking (topk_cuda.cu): a scoring block covers kTopkChunk entries (plain,
// source) or candidate positions (consumer, 8 per candidate block) and leaves its top 512 in the
// workspace; a candidate source also leaves kTopkChunk / 8 block scores per chunk.
inline constexpr int64_t kTopkChunk = 4096;
inline constexpr int kTopkMaxGroup = 8;
// A consumer's group: its tokens' candidate rows are merged into one union read once.
inline constexpr int kTopkConsumerGroup = 2;
// The entries a block table of max_pages pages of S states can name, capped at 2^31 (n_c is below).
inline int64_t topk_entry_bound(int64_t max_pages, int64_t S) {
  int64_t e = 0;
  if (__builtin_mul_overflow(max_pages, S, &e) || e > (int64_t{1} << 31)) e = int64_t{1} << 31;
  return e;
}
// Chunks per token for a block table of `entries` = max_pages * S entries per request.
inline int64_t topk_chunks(IndexerRole role, int64_t entries) {
  if (role == IndexerRole::kCandidateConsumer)
    return int64_t{kTopkConsumerGroup} * kCandidateTopkBlocks * kCandidateBlockSize / kTopkChunk;
  return entries > 0 ? (entries + kTopkChunk - 1) / kTopkChunk : 1;
}
// Workspace bytes per token: score f32 and index i32 of 512 candidates per chunk, then one f32 per
// block (source) or the i32 chunk count of the token's union (consumer).
inline int64_t topk_ws_token_bytes(IndexerRole role, int64_t chunks) {
  int64_t b = chunks * kIndexTopk * 8;
  if (role == IndexerRole::kCandidateSource) b += chunks * (kTopkChunk / kCandidateBlockSize) * 4;
  if (role == IndexerRole::kCandidateConsumer) b += 4;
  return b;
}
IndexerTopkPlan plan_indexer_topk(const IndexerTopkArgs& a);
void check_indexer_topk_values(const IndexerTopkArgs& a, const IndexerTopkPlan& p);

struct IndexerShortcutPlan {
  Device device = Device::CPU;
  int64_t T = 0;
  int64_t topk_stride = 0;
};
IndexerShortcutPlan plan_indexer_shortcut(const IndexerShortcutArgs& a);
void check_indexer_shortcut_values(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p);

// n_c(p) = (p + 1) / r (SPEC 8.4): the entries a token at position p sees.
inline int64_t visible_entries(int64_t p, int ratio) { return closed_groups(p + 1, static_cast<int64_t>(ratio)); }
// ceil(n / 8): the candidate blocks over n entries (SPEC 8.7).
inline int64_t candidate_blocks(int64_t n) { return (n + kCandidateBlockSize - 1) / kCandidateBlockSize; }

namespace cpu {
void index_k_store(const IndexKStoreArgs& a, const IndexKStorePlan& p, const ExecContext& ctx);
void index_q_prep(const IndexQPrepArgs& a, const IndexQPrepPlan& p, const ExecContext& ctx);
// The scores in `form` (the API takes the fastest this CPU runs; the tests force each to show that
// both give the same bits).
void indexer_topk(const IndexerTopkArgs& a, const IndexerTopkPlan& p, const ExecContext& ctx,
                  CpuForm form = fastest_cpu_form());
void indexer_shortcut(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p, const ExecContext& ctx);
}  // namespace cpu

}  // namespace dsv41kv::detail
