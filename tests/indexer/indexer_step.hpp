// A random step of the indexer's scoring side for the tests: requests of consecutive positions,
// a block table of distinct random pages, a paged FP8 index-K cache of random valid records (every
// code finite, as in the shipped conformance files, so subnormals, -0 and the extreme codes occur),
// random queries (q8, w), and canary-filled outputs. Also the full-sort evaluation of SPEC 8.5 and
// 8.7 the selection is checked against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rng.hpp"
#include "support/canary.hpp"

namespace dsv41kv::test {

inline constexpr int32_t kIndexCanary = -7;  // topk / candidates before an op

// A random finite e4m3 code (every byte but 0x7F and 0xFF).
inline uint8_t random_e4m3(Rng& rng) {
  for (;;) {
    const auto c = static_cast<uint8_t>(rng.next() & 0xFF);
    if ((c & 0x7F) != 0x7F) return c;
  }
}

struct RequestSpec {
  int64_t first_pos = 0;  // position of the request's first token of the step
  int64_t tokens = 1;
};

struct IndexerStep {
  int ratio = 1;
  int64_t T = 0, S = 64, num_pages = 0, page_stride = 0, bt_cols = 0, num_reqs = 0;
  std::vector<int64_t> pos;
  std::vector<int32_t> req, valid, bt;
  std::vector<uint8_t> kcache;
  std::vector<uint8_t> q8;
  std::vector<float> w;
  CanaryBuffer<int32_t> topk, cand;
  CanaryBuffer<float> scores;
  int64_t scores_cols = 0;

  int64_t nc(int64_t t) const { return valid[static_cast<size_t>(t)] ? (pos[static_cast<size_t>(t)] + 1) / ratio : 0; }
  int64_t max_nc() const {
    int64_t m = 0;
    for (int64_t t = 0; t < T; ++t) m = std::max(m, nc(t));
    return m;
  }
  IndexKCacheView cache() {
    IndexKCacheView c;
    c.base = kcache.data();
    c.num_pages = num_pages;
    c.states_per_page = S;
    c.page_stride = page_stride;
    return c;
  }
  // The codes and scale of entry i of token t's request.
  const uint8_t* page_of(int64_t t, int64_t i) const {
    return kcache.data() + static_cast<int64_t>(bt[static_cast<size_t>(req[static_cast<size_t>(t)] * bt_cols + i / S)]) *
                               page_stride;
  }
  const uint8_t* codes(int64_t t, int64_t i) const { return rec::index_k_fp8_codes(page_of(t, i), S, i % S); }
  float scale(int64_t t, int64_t i) const { return rec::read_index_k_fp8_scale(page_of(t, i), S, i % S); }
  // Entries [0, n) of token t's request as dense arrays (for reference::indexer_scores).
  void dense_keys(int64_t t, int64_t n, std::vector<uint8_t>& k8, std::vector<float>& sk) const {
    k8.resize(static_cast<size_t>(n * kIndexHeadDim));
    sk.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::copy(codes(t, i), codes(t, i) + kIndexHeadDim, k8.begin() + i * kIndexHeadDim);
      sk[static_cast<size_t>(i)] = scale(t, i);
    }
  }
  // Fresh canary outputs: topk and candidates [T + 2, width] (two rows past the step), scores
  // [T + 1, max n_c + 3].
  void reset_outputs() {
    topk = CanaryBuffer<int32_t>(static_cast<size_t>((T + 2) * kIndexTopk), kIndexCanary);
    cand = CanaryBuffer<int32_t>(static_cast<size_t>((T + 2) * kCandidateTopkBlocks), kIndexCanary);
    scores_cols = max_nc() + 3;
    scores = CanaryBuffer<float>(static_cast<size_t>((T + 1) * scores_cols), std::numeric_limits<float>::quiet_NaN());
  }
  IndexerTopkArgs args(IndexerRole role, bool with_scores = true) {
    IndexerTopkArgs a;
    a.ratio = ratio;
    a.role = role;
    a.q8 = TensorView::contiguous(q8.data(), DType::U8, {T, kIndexHeads, kIndexHeadDim});
    a.w = TensorView::contiguous(w.data(), DType::F32, {T, kIndexHeads});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    a.token_to_req = TensorView::contiguous(req.data(), DType::I32, {T});
    a.token_valid = TensorView::contiguous(valid.data(), DType::I32, {T});
    a.block_table = TensorView::contiguous(bt.data(), DType::I32, {num_reqs, bt_cols});
    a.k_cache = cache();
    a.topk = topk.view({T + 2, kIndexTopk});
    if (role != IndexerRole::kPlain) a.candidates = cand.view({T + 2, kCandidateTopkBlocks});
    if (with_scores) a.scores = scores.view({T + 1, scores_cols});
    return a;
  }
  const int32_t* topk_row(int64_t t) const { return topk.data() + t * kIndexTopk; }
  int32_t* cand_row(int64_t t) { return cand.data() + t * kCandidateTopkBlocks; }
  const float* scores_row(int64_t t) const { return scores.data() + t * scores_cols; }
};

// A step of the given requests (ratio r, S states per page): every token valid except the
// indices in `invalid`; keys with scales 2^e, e in [-8, 8]; queries of random finite codes and
// normal weights. The cache has one spare page beyond those the block table names, and a page
// stride `extra_stride` (52: rows not 16-byte aligned) bytes beyond the default.
inline IndexerStep make_step(Rng& rng, int ratio, const std::vector<RequestSpec>& reqs, int64_t S,
                             const std::vector<int64_t>& invalid = {}, int64_t extra_stride = 52) {
  IndexerStep s;
  s.ratio = ratio;
  s.S = S;
  s.num_reqs = static_cast<int64_t>(reqs.size());
  int64_t max_pages = 1;
  for (const auto& r : reqs) {
    for (int64_t k = 0; k < r.tokens; ++k) {
      s.pos.push_back(r.first_pos + k);
      s.req.push_back(static_cast<int32_t>(&r - reqs.data()));
    }
    max_pages = std::max(max_pages, ((r.first_pos + r.tokens) / ratio + S - 1) / S);
  }
  s.T = static_cast<int64_t>(s.pos.size());
  s.valid.assign(static_cast<size_t>(s.T), 1);
  for (int64_t t : invalid) s.valid[static_cast<size_t>(t)] = 0;
  s.bt_cols = max_pages + 1;
  s.num_pages = s.num_reqs * max_pages + 2;
  std::vector<int32_t> perm(static_cast<size_t>(s.num_pages - 1));
  std::iota(perm.begin(), perm.end(), 1);
  rng.shuffle(perm);
  s.bt.assign(static_cast<size_t>(s.num_reqs * s.bt_cols), 0);
  size_t next = 0;
  for (int64_t b = 0; b < s.num_reqs; ++b)
    for (int64_t j = 0; j < max_pages; ++j) s.bt[static_cast<size_t>(b * s.bt_cols + j)] = perm[next++];
  s.page_stride = IndexerKFp8Layout::default_page_stride(S) + extra_stride;
  s.kcache.assign(static_cast<size_t>(s.num_pages * s.page_stride), 0xA5);
  for (int64_t p = 0; p < s.num_pages; ++p) {
    uint8_t* page = s.kcache.data() + p * s.page_stride;
    for (int64_t r = 0; r < S; ++r) {
      for (int d = 0; d < kIndexHeadDim; ++d) page[r * kIndexHeadDim + d] = random_e4m3(rng);
      const float sc = std::ldexp(1.0f, static_cast<int>(rng.integer(-8, 8)));
      std::memcpy(page + IndexerKFp8Layout::scale_offset(S, r), &sc, 4);
    }
  }
  s.q8.resize(static_cast<size_t>(s.T * kIndexHeads * kIndexHeadDim));
  for (auto& c : s.q8) c = random_e4m3(rng);
  s.w.resize(static_cast<size_t>(s.T * kIndexHeads));
  for (auto& x : s.w) x = static_cast<float>(rng.normal() * 0.01);
  s.reset_outputs();
  return s;
}

// SPEC 8.5 by a full sort: the entries with a finite score ranked by (score desc, index asc), the
// first min(512, count) of them sorted ascending, then -1.
inline std::vector<int32_t> topk_by_full_sort(const float* scores, int64_t n, int64_t K = kIndexTopk) {
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(scores[i])) idx.push_back(static_cast<int32_t>(i));
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  });
  if (static_cast<int64_t>(idx.size()) > K) idx.resize(static_cast<size_t>(K));
  std::sort(idx.begin(), idx.end());
  idx.resize(static_cast<size_t>(K), -1);
  return idx;
}

// SPEC 8.7's candidate row by a full sort of the block scores (max of a block's entries, the
// newest block +inf).
inline std::vector<int32_t> candidates_by_full_sort(const float* scores, int64_t nc) {
  const int64_t nb = (nc + kCandidateBlockSize - 1) / kCandidateBlockSize;
  std::vector<float> block(static_cast<size_t>(nb), -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < nc; ++i)
    block[static_cast<size_t>(i / kCandidateBlockSize)] =
        std::max(block[static_cast<size_t>(i / kCandidateBlockSize)], scores[i]);
  if (nb > 0) block[static_cast<size_t>(nb - 1)] = std::numeric_limits<float>::infinity();
  std::vector<int32_t> idx(static_cast<size_t>(nb));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return block[static_cast<size_t>(a)] != block[static_cast<size_t>(b)] ? block[static_cast<size_t>(a)] > block[static_cast<size_t>(b)]
                                                                          : a < b;
  });
  if (nb > kCandidateTopkBlocks) idx.resize(kCandidateTopkBlocks);
  std::sort(idx.begin(), idx.end());
  idx.resize(kCandidateTopkBlocks, -1);
  return idx;
}

}  // namespace dsv41kv::test
