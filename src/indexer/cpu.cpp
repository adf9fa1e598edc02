// CPU backend of the indexer: SPEC 8 literally, the reference its kernels will be compared with.
// Arguments were validated by the public API (indexer.cpp, plan.cpp) before any of this runs.
// Every output element is computed by one thread in an order that does not depend on the split,
// so results do not depend on the thread count: the K store and the Q preparation split tokens;
// the scores split tokens, or the entries of one token when a step has fewer tokens than threads
// (decode with a long context); the selection of a token runs on one thread.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/cpu_form.hpp"
#include "core/parallel.hpp"
#include "formats/insert.hpp"
#include "indexer/avx512.hpp"
#include "indexer/backend.hpp"
#include "indexer/rows.hpp"
#include "indexer/score.hpp"
#include "indexer/select.hpp"

namespace dsv41kv::detail::cpu {

// ---------------------------------------------------------------- K store (SPEC 8.1)

void index_k_store(const IndexKStoreArgs& a, const IndexKStorePlan& p, const ExecContext& ctx) {
  std::vector<float> wk(static_cast<size_t>(kIndexHeadDim) * kLatentDim);
  const auto* wsrc = a.wk.ptr<const uint16_t>();
  for (size_t i = 0; i < wk.size(); ++i) wk[i] = num::bf16_decode(wsrc[i]);
  const auto* latent = a.latent.ptr<const uint16_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* slot = a.slots.ptr<const int64_t>();
  const auto* table = a.rope_table.ptr<const float>();
  const auto* k_norm = a.k_norm.ptr<const uint16_t>();
  const IndexKCacheView& c = a.cache;
  for_each_written_token(slot, pos, nullptr, p.ratio, p.N, ctx, [&](int64_t t) {
    float x[kLatentDim], k[kIndexHeadDim];
    for (int d = 0; d < kLatentDim; ++d) x[d] = num::bf16_decode(latent[t * kLatentDim + d]);
    index_key_row(x, wk.data(), k_norm, a.eps, table + rope_row(pos[t], p.ratio) * kRopeDim, k);
    uint8_t* page = static_cast<uint8_t*>(c.base) + (slot[t] / c.states_per_page) * c.page_stride;
    const int64_t off = slot[t] % c.states_per_page;
    if (c.format == IndexKFormat::FP8_132)
      rec::write_index_k_fp8(page, c.states_per_page, off, k);
    else
      rec::write_index_k_mxfp4(page, c.states_per_page, off, k);
  });
}

// ---------------------------------------------------------------- Q preparation (SPEC 8.2)

void index_q_prep(const IndexQPrepArgs& a, const IndexQPrepPlan& p, const ExecContext& ctx) {
  const auto* q = a.q.ptr<const uint16_t>();
  const auto* w_raw = a.w_raw.ptr<const uint16_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* table = a.rope_table.ptr<const float>();
  auto* q8 = a.q8.ptr<uint8_t>();
  auto* w = a.w.ptr<float>();
  parallel_for(p.T, ctx, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int h = 0; h < kIndexHeads; ++h) {
        const int64_t row = t * kIndexHeads + h;
        w[row] = index_query_head(q + row * kIndexHeadDim, table + pos[t] * kRopeDim, w_raw[row],
                                  q8 + row * kIndexHeadDim);
      }
  });
}

// ---------------------------------------------------------------- scores (SPEC 8.3, 8.4)

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

void load_query(const IndexerTopkArgs& a, int64_t t, Query& qy) {
  load_query(a.q8.ptr<const uint8_t>() + t * kIndexHeads * kIndexHeadDim, a.w.ptr<const float>() + t * kIndexHeads, qy);
}

// Where the entries of one token's request live.
struct Keys {
  const uint8_t* base = nullptr;
  int64_t page_stride = 0, S = 0;
  const int32_t* pages = nullptr;  // the request's block-table row
  int64_t n = 0;                   // the visible entries (n_c)

  const uint8_t* page(int64_t i) const { return base + static_cast<int64_t>(pages[i / S]) * page_stride; }
  float score_of(const Query& qy, int64_t i) const {
    const uint8_t* pg = page(i);
    return score(qy, rec::index_k_fp8_codes(pg, S, i % S), rec::read_index_k_fp8_scale(pg, S, i % S));
  }
};

// The codes and scale of entries looked up in (mostly) ascending order: one division per page
// rather than per entry. Each lookup also prefetches the entry kAhead further on, on this page or
// the next one when that holds visible entries (hints only, never loads: the hardware's stream
// prefetch stops at every 4 KiB page, which a step of keys from DRAM crosses every 31 entries).
struct KeyCursor {
  static constexpr int64_t kAhead = 32;
  const Keys& keys;
  int64_t n = 0;                  // the visible entries: the block-table row holds their pages
  int64_t first = 0, end = 0;     // the entries [first, end) of the current page
  const uint8_t* pg = nullptr;
  const uint8_t* next = nullptr;  // the next page, once a prefetch reached it
  void at(int64_t i, const uint8_t*& codes, float& scale) {
    const int64_t S = keys.S;
    if (i < first || i >= end) {
      first = i / S * S;
      end = first + S;
      pg = keys.page(i);
      next = nullptr;
    }
    const int64_t r = i - first;
    codes = rec::index_k_fp8_codes(pg, S, r);
    scale = rec::read_index_k_fp8_scale(pg, S, r);
    int64_t ra = r + kAhead;
    const uint8_t* pa = pg;
    if (ra >= S) {
      if (kAhead >= S || end >= n) return;
      if (next == nullptr) next = keys.page(end);
      pa = next;
      ra -= S;
    }
    const uint8_t* ca = rec::index_k_fp8_codes(pa, S, ra);
    __builtin_prefetch(ca);
    __builtin_prefetch(ca + 64);
    if (ra % 16 == 0) __builtin_prefetch(pa + IndexerKFp8Layout::scale_offset(S, ra));
  }
};

constexpr int64_t kEntryGrain = 2048;  // entries per thread range when one token's entries are split

// The scores of the entries idx(0..n) into out[0..n), split over ctx's threads; by groups in the
// AVX-512 form when the token has its query `qa` (the same bits; an entry with a NaN code is
// scored the portable way).
template <class Index>
void score_entries(const Query& qy, const indexer_avx512::Query* qa, const Keys& keys, int64_t n, Index idx,
                   float* out, const ExecContext& ctx) {
  parallel_for(n, ctx, kEntryGrain, [&](int64_t b, int64_t e) {
#if defined(DSV41KV_AVX512_FORMS)
    if (qa != nullptr) {
      constexpr int G = indexer_avx512::kGroup;
      const uint8_t* codes[G];
      float sk[G];
      KeyCursor cur{keys, keys.n};
      for (int64_t j0 = b; j0 < e; j0 += G) {
        const int m = static_cast<int>(std::min<int64_t>(G, e - j0));
        for (int j = 0; j < m; ++j) cur.at(idx(j0 + j), codes[j], sk[j]);
        for (uint32_t nan = indexer_avx512::scores(*qa, codes, sk, m, out + j0); nan != 0; nan &= nan - 1)
          out[j0 + __builtin_ctz(nan)] = keys.score_of(qy, idx(j0 + __builtin_ctz(nan)));
      }
      return;
    }
#else
    (void)qa;
#endif
    for (int64_t j = b; j < e; ++j) out[j] = keys.score_of(qy, idx(j));
  });
}

struct TokenScratch {
  Query query;
  indexer_avx512::Query query_avx512;
  std::vector<float> scores, blocks, select;
  std::vector<int64_t> entries;  // a consumer's candidate entries, ascending
  std::vector<int32_t> picked;
};

// One token of indexer_topk: its rows of topk (and candidates for a source, scores when asked)
// written whole.
void topk_token(const IndexerTopkArgs& a, const IndexerTopkPlan& p, int64_t t, TokenScratch& s,
                const ExecContext& entry_ctx, CpuForm form) {
  int32_t* topk = a.topk.ptr<int32_t>() + t * p.topk_stride;
  std::fill(topk, topk + kIndexTopk, -1);
  int32_t* cand = a.role == IndexerRole::kPlain ? nullptr : a.candidates.ptr<int32_t>() + t * p.cand_stride;
  if (a.role == IndexerRole::kCandidateSource) std::fill(cand, cand + kCandidateTopkBlocks, -1);
  float* scores_row = a.scores.present() ? a.scores.ptr<float>() + t * p.scores_stride : nullptr;
  if (scores_row) std::fill(scores_row, scores_row + p.scores_cols, kNegInf);
  if (a.token_valid.present() && a.token_valid.ptr<const int32_t>()[t] == 0) return;

  const int64_t nc = visible_entries(a.positions.ptr<const int64_t>()[t], a.ratio);
  Keys keys;
  keys.base = static_cast<const uint8_t*>(a.k_cache.base);
  keys.page_stride = a.k_cache.page_stride;
  keys.S = a.k_cache.states_per_page;
  keys.pages = a.block_table.ptr<const int32_t>() + a.token_to_req.ptr<const int32_t>()[t] * p.bt_stride;
  keys.n = nc;
  load_query(a, t, s.query);
  const indexer_avx512::Query* qa = nullptr;
#if defined(DSV41KV_AVX512_FORMS)
  if (form == CpuForm::kAvx512 &&
      indexer_avx512::load_query(a.q8.ptr<const uint8_t>() + t * kIndexHeads * kIndexHeadDim,
                                 a.w.ptr<const float>() + t * kIndexHeads, s.query_avx512))
    qa = &s.query_avx512;
#else
  (void)form;
#endif

  if (a.role == IndexerRole::kCandidateConsumer) {
    // SPEC 8.7: only the entries of the source's candidate blocks are scored; every other score is
    // -inf and never selected. The entries are listed ascending (the blocks are), so ranking them
    // by position in the list ranks them by index.
    s.entries.clear();
    for (int j = 0; j < kCandidateTopkBlocks && cand[j] >= 0; ++j)
      for (int64_t i = int64_t{cand[j]} * kCandidateBlockSize;
           i < std::min<int64_t>(nc, (int64_t{cand[j]} + 1) * kCandidateBlockSize); ++i)
        s.entries.push_back(i);
    const auto m = static_cast<int64_t>(s.entries.size());
    s.scores.resize(static_cast<size_t>(m));
    score_entries(s.query, qa, keys, m, [&](int64_t j) { return s.entries[static_cast<size_t>(j)]; },
                  s.scores.data(), entry_ctx);
    s.picked.resize(kIndexTopk);
    const int64_t k = select_top(s.scores.data(), m, kIndexTopk, true, s.picked.data(), s.select);
    for (int64_t j = 0; j < k; ++j) topk[j] = static_cast<int32_t>(s.entries[static_cast<size_t>(s.picked[j])]);
    if (scores_row)
      for (int64_t j = 0; j < m; ++j) scores_row[s.entries[static_cast<size_t>(j)]] = s.scores[static_cast<size_t>(j)];
    return;
  }

  s.scores.resize(static_cast<size_t>(nc));
  score_entries(s.query, qa, keys, nc, [](int64_t i) { return i; }, s.scores.data(), entry_ctx);
  select_top(s.scores.data(), nc, kIndexTopk, true, topk, s.select);
  if (scores_row) std::copy(s.scores.begin(), s.scores.end(), scores_row);

  if (a.role == IndexerRole::kCandidateSource && nc > 0) {
    // SPEC 8.7: block score = the max of the block's visible scores (a NaN never wins the max), the
    // newest block forced to +inf; keep the top min(2048, ceil(n_c / 8)) by (score desc, block asc).
    const int64_t nb = candidate_blocks(nc);
    s.blocks.assign(static_cast<size_t>(nb), kNegInf);
    for (int64_t i = 0; i < nc; ++i) {
      float& b = s.blocks[static_cast<size_t>(i / kCandidateBlockSize)];
      if (s.scores[static_cast<size_t>(i)] > b) b = s.scores[static_cast<size_t>(i)];
    }
    s.blocks[static_cast<size_t>(nb - 1)] = kPosInf;
    select_top(s.blocks.data(), nb, kCandidateTopkBlocks, false, cand, s.select);
  }
}

}  // namespace

void indexer_topk(const IndexerTopkArgs& a, const IndexerTopkPlan& p, const ExecContext& ctx, CpuForm form) {
  const int threads = cpu_threads(ctx);
  if (p.T >= threads) {
    ExecContext serial = ctx;
    serial.num_threads = 1;
    parallel_for(p.T, ctx, 1, [&](int64_t b, int64_t e) {
      auto s = std::make_unique<TokenScratch>();
      for (int64_t t = b; t < e; ++t) topk_token(a, p, t, *s, serial, form);
    });
    return;
  }
  auto s = std::make_unique<TokenScratch>();
  for (int64_t t = 0; t < p.T; ++t) topk_token(a, p, t, *s, ctx, form);
}

// ---------------------------------------------------------------- shortcut (SPEC 8.6)

void indexer_shortcut(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p, const ExecContext& ctx) {
  const auto* pos = a.positions.ptr<const int64_t>();
  parallel_for(p.T, ctx, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int32_t* row = a.topk.ptr<int32_t>() + t * p.topk_stride;
      const bool valid = !a.token_valid.present() || a.token_valid.ptr<const int32_t>()[t] != 0;
      const int64_t nc = valid ? visible_entries(pos[t], a.ratio) : 0;
      for (int64_t j = 0; j < kIndexTopk; ++j) row[j] = j < nc ? static_cast<int32_t>(j) : -1;
    }
  });
}

}  // namespace dsv41kv::detail::cpu
