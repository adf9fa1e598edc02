// Host-side validation of the indexer ops (SPEC 0.4 item 3, 8) with the validation kit
// (core/validate.hpp): E8 with a message "<op>: <argument>: <what was found>, expected <what is
// required>". The view checks come first, then the value checks of the host index data; nothing
// is written before both have passed.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "core/validate.hpp"
#include "dsv41kv/device.hpp"
#include "formats/insert.hpp"
#include "indexer/backend.hpp"

namespace dsv41kv::detail {
namespace {

// A contiguous view of dtype dt, ndim = dims.size(), shape[0] >= min_rows (exactly min_rows when
// exact_rows) and shape[d] == dims[d] for d >= 1.
void need_shape(const char* op, const TensorView& v, const char* arg, DType dt, std::initializer_list<int64_t> dims,
                int64_t min_rows, bool exact_rows, const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, static_cast<int>(dims.size()));
  int d = 0;
  for (int64_t want : dims) {
    if (d > 0 && v.shape[static_cast<size_t>(d)] != want)
      bad_arg(op, arg, fmt::format("shape[{}] = {}, expected {} ({}; {})", d, v.shape[static_cast<size_t>(d)], want,
                                   what, v.describe()));
    ++d;
  }
  if (exact_rows ? v.shape[0] != min_rows : v.shape[0] < min_rows)
    bad_arg(op, arg,
            fmt::format("shape[0] = {}, expected {}{} ({}; {})", v.shape[0], exact_rows ? "" : "at least ", min_rows,
                        what, v.describe()));
  need_contiguous(op, v, arg);
  need_data(op, v, arg);
}

// An i32 [rows >= T, width] output matrix (inner stride 1, rows not overlapping).
void need_index_rows(const char* op, const TensorView& v, const char* arg, int64_t width, int64_t T,
                     const char* what) {
  need_matrix(op, v, arg, DType::I32, what);
  if (v.shape[1] != width)
    bad_arg(op, arg, fmt::format("shape[1] = {}, expected {} ({}; {})", v.shape[1], width, what, v.describe()));
  if (v.shape[0] < T)
    bad_arg(op, arg, fmt::format("{} rows, expected at least T = {} ({}; {})", v.shape[0], T, what, v.describe()));
}

// An i32 [T] vector of one entry per token (token_to_req, token_valid).
void need_token_vector(const char* op, const TensorView& v, const char* arg, int64_t T, const char* what) {
  need_vector(op, v, arg, DType::I32, what);
  if (v.shape[0] != T)
    bad_arg(op, arg, fmt::format("{} entries, expected T = {} (one per token; {})", v.shape[0], T, v.describe()));
}

void need_ratio_of(const char* op, int ratio) {
  need_ratio(op, ratio, ErrorCode::kInvalidArgument, "the kv source's compress ratio, SPEC 1.2");
}

// The indexer has a CPU backend only: views on a CUDA device are rejected with that reason (in
// every build, so that the message does not depend on how the library was built).
void need_cpu_backend(const char* op, Device device) {
  if (device != Device::CPU)
    invalid_argument(fmt::format("{}: the views are on {}, but the indexer has no CUDA backend yet (its Hopper "
                                 "kernels come in a later issue), expected cpu views",
                                 op, device_name(device)));
}

// Every present view, and the cache when given, on `device` like the view named `ref` (one device
// per call); then, for the ops without a CUDA backend (`cuda_backend` false), the CPU-only check.
void need_one_device(const char* op, Device device, const char* ref,
                     std::initializer_list<std::pair<const TensorView*, const char*>> views,
                     const IndexKCacheView* cache = nullptr, const char* cache_arg = "", bool cuda_backend = false) {
  for (const auto& [v, name] : views) need_device(op, *v, name, device, ref);
  if (cache != nullptr && cache->device != device)
    bad_arg(op, cache_arg,
            fmt::format("on {}, expected {} like {} (all views of one call on one device)",
                        device_name(cache->device), device_name(device), ref));
  if (!cuda_backend) need_cpu_backend(op, device);
}

void need_table(const char* op, const TensorView& t) {
  need_rows(op, t, "rope_table", DType::F32, kRopeDim, 1, "f32 [table_rows >= 1, 64]");
  need_contiguous(op, t, "rope_table");
}

// Positions of the tokens that are read: 0 <= p < 2^62 (so that n_c and page arithmetic cannot
// overflow).
void check_position(const char* op, int64_t t, int64_t p) {
  if (p < 0 || p >= (int64_t{1} << 62))
    bad_arg(op, "positions", fmt::format("positions[{}] = {}, expected 0 <= position < 2^62", t, p));
}

bool token_is_valid(const TensorView& token_valid, int64_t t) {
  return !token_valid.present() || token_valid.ptr<const int32_t>()[t] != 0;
}

}  // namespace

void validate_index_k_cache(const IndexKCacheView& c, const char* op, const char* arg) {
  if (c.format != IndexKFormat::FP8_132 && c.format != IndexKFormat::MXFP4_68)
    bad_arg(op, arg, fmt::format("format: unknown value {}, expected fp8_132 (0) or mxfp4_68 (1)",
                                 static_cast<int>(c.format)));
  if (c.base == nullptr) bad_arg(op, arg, "base pointer is null");
  if (c.num_pages <= 0) bad_arg(op, arg, fmt::format("num_pages = {}, expected > 0", c.num_pages));
  if (c.states_per_page <= 0) bad_arg(op, arg, fmt::format("states_per_page = {}, expected > 0", c.states_per_page));
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t payload = 0, backing = 0, capacity = 0;
  if (__builtin_mul_overflow(c.states_per_page, int64_t{index_k_record_bytes(c.format)}, &payload) ||
      payload > kLimit || __builtin_mul_overflow(c.num_pages, c.page_stride, &backing) || backing > kLimit ||
      __builtin_mul_overflow(c.num_pages, c.states_per_page, &capacity))
    bad_arg(op, arg,
            fmt::format("{} pages of {} states, page stride {} span more than 2^62 bytes, expected the view of an "
                        "allocation",
                        c.num_pages, c.states_per_page, c.page_stride));
  if (c.page_stride < payload)
    bad_arg(op, arg,
            fmt::format("page_stride = {} bytes for {} states of {}, expected >= {}", c.page_stride, c.states_per_page,
                        index_k_format_name(c.format), payload));
}

// ---------------------------------------------------------------- K store

IndexKStorePlan plan_index_k_store(const IndexKStoreArgs& a) {
  const char* op = "indexer_k_store";
  need_ratio_of(op, a.ratio);
  IndexKStorePlan p;
  p.ratio = a.ratio;
  p.N = need_vector(op, a.slots, "slots", DType::I64, "i64 [N] compressed-cache slots");
  p.device = a.slots.device;
  need_rows(op, a.latent, "latent", DType::BF16, kLatentDim, p.N, "bf16 [rows >= N, 512]");
  need_contiguous(op, a.latent, "latent");
  need_vector(op, a.positions, "positions", DType::I64, "i64 [>= N] positions", p.N);
  need_shape(op, a.wk, "wk", DType::BF16, {kIndexHeadDim, kLatentDim}, kIndexHeadDim, true, "bf16 [128, 512]");
  need_shape(op, a.k_norm, "k_norm", DType::BF16, {kIndexHeadDim}, kIndexHeadDim, true, "bf16 [128]");
  if (!(num::is_finite(a.eps) && a.eps >= 0.0f))
    bad_arg(op, "eps", fmt::format("{}, expected a finite value >= 0 (config.rms_norm_eps)", a.eps));
  need_table(op, a.rope_table);
  p.table_rows = a.rope_table.shape[0];
  validate_index_k_cache(a.cache, op, "cache");
  p.capacity = a.cache.num_pages * a.cache.states_per_page;
  need_one_device(op, p.device, "slots",
                  {{&a.latent, "latent"}, {&a.positions, "positions"}, {&a.wk, "wk"}, {&a.k_norm, "k_norm"},
                   {&a.rope_table, "rope_table"}},
                  &a.cache, "cache", true);
  return p;
}

void check_index_k_store_values(const IndexKStoreArgs& a, const IndexKStorePlan& p) {
  check_written_token_values(
      "indexer_k_store", "slots", a.slots.ptr<const int64_t>(), a.positions.ptr<const int64_t>(), p.N, p.ratio,
      p.capacity, fmt::format("num_pages * states_per_page = {} * {}", a.cache.num_pages, a.cache.states_per_page),
      p.table_rows);
}

// ---------------------------------------------------------------- Q preparation

IndexQPrepPlan plan_index_q_prep(const IndexQPrepArgs& a) {
  const char* op = "indexer_prepare_q";
  IndexQPrepPlan p;
  need_present(op, a.q, "q", "bf16 [T, 32, 128]");
  p.T = a.q.shape[0];
  p.device = a.q.device;
  need_shape(op, a.q, "q", DType::BF16, {p.T, kIndexHeads, kIndexHeadDim}, p.T, true,
             "bf16 [T, 32, 128]: index_n_heads 32, index_head_dim 128");
  need_shape(op, a.w_raw, "w_raw", DType::BF16, {p.T, kIndexHeads}, p.T, true, "bf16 [T, 32]");
  need_vector(op, a.positions, "positions", DType::I64, "i64 [>= T] positions", p.T);
  need_table(op, a.rope_table);
  p.table_rows = a.rope_table.shape[0];
  need_shape(op, a.q8, "q8", DType::U8, {p.T, kIndexHeads, kIndexHeadDim}, p.T, false, "u8 [rows >= T, 32, 128]");
  need_shape(op, a.w, "w", DType::F32, {p.T, kIndexHeads}, p.T, false, "f32 [rows >= T, 32]");
  need_one_device(op, p.device, "q",
                  {{&a.w_raw, "w_raw"}, {&a.positions, "positions"}, {&a.rope_table, "rope_table"}, {&a.q8, "q8"},
                   {&a.w, "w"}},
                  nullptr, "", true);
  return p;
}

void check_index_q_prep_values(const IndexQPrepArgs& a, const IndexQPrepPlan& p) {
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.T; ++t)
    if (pos[t] < 0 || pos[t] >= p.table_rows)
      bad_arg("indexer_prepare_q", "positions",
              fmt::format("positions[{}] = {}, expected a row of the RoPE table of {} rows (0 <= position < {})", t,
                          pos[t], p.table_rows, p.table_rows));
}

// ---------------------------------------------------------------- scores and top-k

IndexerTopkPlan plan_indexer_topk(const IndexerTopkArgs& a) {
  const char* op = "indexer_topk";
  need_ratio_of(op, a.ratio);
  if (a.role != IndexerRole::kPlain && a.role != IndexerRole::kCandidateSource &&
      a.role != IndexerRole::kCandidateConsumer)
    bad_arg(op, "role", fmt::format("unknown value {}, expected plain, candidate_source or candidate_consumer",
                                    static_cast<int>(a.role)));
  IndexerTopkPlan p;
  p.T = need_vector(op, a.positions, "positions", DType::I64, "i64 [T] positions");
  p.device = a.positions.device;
  need_token_vector(op, a.token_to_req, "token_to_req", p.T, "i32 [T] request of each token");
  if (a.token_valid.present()) need_token_vector(op, a.token_valid, "token_valid", p.T, "i32 [T], 0 = invalid token");
  need_shape(op, a.q8, "q8", DType::U8, {p.T, kIndexHeads, kIndexHeadDim}, p.T, false,
             "u8 [rows >= T, 32, 128]: index_n_heads 32, index_head_dim 128");
  need_shape(op, a.w, "w", DType::F32, {p.T, kIndexHeads}, p.T, false, "f32 [rows >= T, 32]");
  need_block_table(op, a.block_table, "block_table", "i32 [num_reqs, max_pages] index-K pages");
  p.num_reqs = a.block_table.shape[0];
  p.bt_cols = a.block_table.shape[1];
  p.bt_stride = a.block_table.stride[0];
  validate_index_k_cache(a.k_cache, op, "k_cache");
  if (a.k_cache.format != IndexKFormat::FP8_132)
    bad_arg(op, "k_cache",
            fmt::format("format {}, expected fp8_132 (SPEC 8.3 scores e4m3 keys with one fp32 scale; MXFP4 keys "
                        "can be stored but are not scored)",
                        index_k_format_name(a.k_cache.format)));
  need_index_rows(op, a.topk, "topk", kIndexTopk, p.T, "i32 [rows >= T, 512] top-k buffer");
  p.topk_stride = a.topk.stride[0];
  if (a.role == IndexerRole::kPlain) {
    if (a.candidates.present())
      bad_arg(op, "candidates",
              fmt::format("present ({}) for role plain, expected absent (only a candidate source writes it and a "
                          "candidate consumer reads it)",
                          a.candidates.describe()));
  } else {
    need_index_rows(op, a.candidates, "candidates", kCandidateTopkBlocks, p.T,
                    "i32 [rows >= T, 2048] candidate-block buffer");
    p.cand_stride = a.candidates.stride[0];
  }
  if (a.scores.present()) {
    need_matrix(op, a.scores, "scores", DType::F32, "f32 [rows >= T, cols] scores");
    if (a.scores.shape[0] < p.T)
      bad_arg(op, "scores", fmt::format("{} rows, expected at least T = {} ({})", a.scores.shape[0], p.T,
                                        a.scores.describe()));
    p.scores_cols = a.scores.shape[1];
    p.scores_stride = a.scores.stride[0];
  }
  need_one_device(op, p.device, "positions",
                  {{&a.token_to_req, "token_to_req"}, {&a.token_valid, "token_valid"}, {&a.q8, "q8"}, {&a.w, "w"},
                   {&a.block_table, "block_table"}, {&a.topk, "topk"}, {&a.candidates, "candidates"},
                   {&a.scores, "scores"}},
                  &a.k_cache, "k_cache", true);
  if (a.group_tokens < 0 || a.group_tokens > kTopkMaxGroup)
    bad_arg(op, "group_tokens", fmt::format("{}, expected 0 (the library's choice) .. {}", a.group_tokens, kTopkMaxGroup));
  p.group_tokens = a.group_tokens == 0 ? 2 : a.group_tokens;
  if (a.score_blocks_per_sm < 0 || a.score_blocks_per_sm > 2)
    bad_arg(op, "score_blocks_per_sm", fmt::format("{}, expected 0 (the library's choice), 1 or 2", a.score_blocks_per_sm));
  p.score_blocks_per_sm = a.score_blocks_per_sm == 0 ? 2 : a.score_blocks_per_sm;
  if (a.role == IndexerRole::kCandidateConsumer) p.group_tokens = std::min(p.group_tokens, kTopkConsumerGroup);
  if (a.score_kernel < 0 || a.score_kernel > 2)
    bad_arg(op, "score_kernel", fmt::format("{}, expected 0 (the library's choice), 1 (chunk) or 2 (warpgroup)",
                                            a.score_kernel));
  {
    // the warpgroup kernel's conditions: bulk copies of whole rows and 4-state scale runs (16-byte
    // aligned), two tokens per block; a consumer's copies are whole 8-entry blocks of one page
    const bool aligned = reinterpret_cast<uintptr_t>(a.k_cache.base) % 16 == 0 && a.k_cache.page_stride % 16 == 0;
    const int64_t S_div = a.role == IndexerRole::kCandidateConsumer ? 8 : 4;
    const bool fits = p.group_tokens <= 2 && aligned && a.k_cache.states_per_page % S_div == 0;
    if (a.score_kernel == 2 && !fits)
      bad_arg(op, "score_kernel",
              fmt::format("2 (warpgroup) for role {}, group_tokens {}, k_cache base {} page_stride {} S {}, expected "
                          "group_tokens <= 2, a 16-byte aligned base and page stride and S % {} == 0 (else 0 or 1)",
                          indexer_role_name(a.role), p.group_tokens, a.k_cache.base, a.k_cache.page_stride,
                          a.k_cache.states_per_page, S_div));
    p.score_kernel = a.score_kernel == 1 || !fits ? 1 : 2;
    p.score_kernel_forced = a.score_kernel == 2;
  }
  p.ws_chunks = topk_chunks(a.role, topk_entry_bound(p.bt_cols, a.k_cache.states_per_page));
  if (p.device != Device::CPU && built_with_cuda()) {
    // CUDA: the chunks' candidates and block scores between the scoring and the selecting kernel
    // (a build without CUDA refuses device views at the dispatch, with that message first)
    const int64_t need = p.T * topk_ws_token_bytes(a.role, p.ws_chunks);
    need_present(op, a.workspace, "workspace", "u8 [indexer_topk_workspace_bytes(...)] on cuda");
    need_dtype(op, a.workspace, "workspace", DType::U8);
    need_ndim(op, a.workspace, "workspace", 1);
    need_contiguous(op, a.workspace, "workspace");
    need_data(op, a.workspace, "workspace");
    if (a.workspace.shape[0] < need)
      bad_arg(op, "workspace",
              fmt::format("{} bytes, expected at least indexer_topk_workspace_bytes(T = {}, max_pages = {}, S = {}, "
                          "{}) = {}",
                          a.workspace.shape[0], p.T, p.bt_cols, a.k_cache.states_per_page, indexer_role_name(a.role),
                          need));
    if (reinterpret_cast<uintptr_t>(a.workspace.data) % 16 != 0)
      bad_arg(op, "workspace", fmt::format("address {}, expected 16-byte alignment", a.workspace.data));
    need_device(op, a.workspace, "workspace", p.device, "positions");
    if ((p.T + p.group_tokens - 1) / p.group_tokens > 65535)
      bad_arg(op, "positions",
              fmt::format("T = {} tokens in groups of {}, expected at most 65535 groups on cuda (grid.y)", p.T,
                          p.group_tokens));
  }
  return p;
}

void check_indexer_topk_values(const IndexerTopkArgs& a, const IndexerTopkPlan& p) {
  const char* op = "indexer_topk";
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* req = a.token_to_req.ptr<const int32_t>();
  const auto* bt = a.block_table.ptr<const int32_t>();
  const int64_t S = a.k_cache.states_per_page;
  for (int64_t t = 0; t < p.T; ++t) {
    if (!token_is_valid(a.token_valid, t)) continue;  // an invalid token reads nothing
    check_position(op, t, pos[t]);
    const int64_t b = req[t];
    if (b < 0 || b >= p.num_reqs)
      bad_arg(op, "token_to_req",
              fmt::format("token_to_req[{}] = {}, expected a request 0 <= b < num_reqs = {} (block_table rows)", t, b,
                          p.num_reqs));
    const int64_t nc = visible_entries(pos[t], a.ratio);
    if (nc > std::numeric_limits<int32_t>::max())
      bad_arg(op, "positions",
              fmt::format("positions[{}] = {} sees n_c = {} entries, expected at most 2^31 - 1 (top-k entries are "
                          "i32)",
                          t, pos[t], nc));
    const int64_t pages = (nc + S - 1) / S;
    if (pages > p.bt_cols)
      bad_arg(op, "positions",
              fmt::format("token {} (request {}, position {}) sees n_c = {} entries on {} pages of {} states, "
                          "expected at most the block table's {} pages per request",
                          t, b, pos[t], nc, pages, S, p.bt_cols));
    for (int64_t j = 0; j < pages; ++j) {
      const int64_t page = bt[b * p.bt_stride + j];
      if (page < 0 || page >= a.k_cache.num_pages)
        bad_arg(op, "block_table",
                fmt::format("block_table[{}][{}] = {} (a page token {} at position {} reads), expected a page "
                            "0 <= id < k_cache.num_pages = {}",
                            b, j, page, t, pos[t], a.k_cache.num_pages));
    }
    if (a.scores.present() && p.scores_cols < nc)
      bad_arg(op, "scores",
              fmt::format("{} columns, expected at least n_c = {} of token {} (position {})", p.scores_cols, nc, t,
                          pos[t]));
    if (a.role == IndexerRole::kCandidateConsumer) {
      const int32_t* row = a.candidates.ptr<const int32_t>() + t * p.cand_stride;
      const int64_t nb = candidate_blocks(nc);
      int64_t prev = -1;
      bool ended = false;
      for (int64_t j = 0; j < kCandidateTopkBlocks; ++j) {
        const int64_t c = row[j];
        const bool ok = ended ? c == -1 : (c == -1 || (c > prev && c < nb));
        if (!ok)
          bad_arg(op, "candidates",
                  fmt::format("candidates[{}][{}] = {} after {}, expected a strictly ascending prefix of blocks "
                              "below ceil(n_c / 8) = {} (n_c = {}), then -1",
                              t, j, c, j == 0 ? std::string("the row start") : fmt::format("{}", row[j - 1]), nb, nc));
        ended = ended || c == -1;
        prev = c;
      }
    }
  }
}

// ---------------------------------------------------------------- shortcut

IndexerShortcutPlan plan_indexer_shortcut(const IndexerShortcutArgs& a) {
  const char* op = "indexer_shortcut_topk";
  need_ratio_of(op, a.ratio);
  IndexerShortcutPlan p;
  p.T = need_vector(op, a.positions, "positions", DType::I64, "i64 [T] positions");
  p.device = a.positions.device;
  if (a.token_valid.present()) need_token_vector(op, a.token_valid, "token_valid", p.T, "i32 [T], 0 = invalid token");
  need_index_rows(op, a.topk, "topk", kIndexTopk, p.T, "i32 [rows >= T, 512] top-k buffer");
  p.topk_stride = a.topk.stride[0];
  need_one_device(op, p.device, "positions", {{&a.token_valid, "token_valid"}, {&a.topk, "topk"}}, nullptr, "", true);
  return p;
}

void check_indexer_shortcut_values(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p) {
  const char* op = "indexer_shortcut_topk";
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.T; ++t) {
    if (!token_is_valid(a.token_valid, t)) continue;
    check_position(op, t, pos[t]);
    const int64_t nc = visible_entries(pos[t], a.ratio);
    if (nc > kIndexTopk)
      bad_arg(op, "positions",
              fmt::format("positions[{}] = {} sees n_c = {} entries, expected n_c <= 512 for the shortcut (SPEC 8.6: "
                          "the step must score, see indexer_takes_shortcut)",
                          t, pos[t], nc));
  }
}

}  // namespace dsv41kv::detail
