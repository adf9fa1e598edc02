// indexer_topk and indexer_shortcut_topk (SPEC 8.3-8.7) on random steps over paged FP8 caches of
// random valid records: the scores against the dense binary64 reference, the top-k against a
// full sort of the scores, ties by index, the candidate source's blocks against a full sort of
// the block scores, the consumer's mask, the boundary n_c = 16384 of the candidates' effect, the
// shortcut against the scored path, and thread-count invariance. Every output lives in a
// canary-filled buffer with rows past the step, and the whole buffer is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/reference.hpp"
#include "indexer/indexer_step.hpp"
#include "support/compare.hpp"

namespace dsv41kv::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows past the step keep the canary.
void expect_rows_past_step_untouched(const IndexerStep& s, bool candidates) {
  for (int64_t i = s.T * kIndexTopk; i < static_cast<int64_t>(s.topk.size()); ++i)
    ASSERT_EQ(s.topk[static_cast<size_t>(i)], kIndexCanary) << "topk element " << i << " past the step";
  if (candidates) {
    for (int64_t i = s.T * kCandidateTopkBlocks; i < static_cast<int64_t>(s.cand.size()); ++i)
      ASSERT_EQ(s.cand[static_cast<size_t>(i)], kIndexCanary) << "candidates element " << i << " past the step";
  }
  for (int64_t i = s.T * s.scores_cols; i < static_cast<int64_t>(s.scores.size()); ++i)
    ASSERT_TRUE(std::isnan(s.scores[static_cast<size_t>(i)])) << "scores element " << i << " past the step";
}

std::vector<int32_t> row_vec(const int32_t* r, int64_t n) { return std::vector<int32_t>(r, r + n); }

// Every score of the step equals the binary64 reference rounded once to fp32 (both sum the heads
// in ascending order and D is exact, so they agree to the bit); invisible entries, columns past
// n_c and invalid tokens are -inf.
void expect_scores_match_reference(const IndexerStep& s) {
  std::vector<uint8_t> k8;
  std::vector<float> sk;
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t nc = s.nc(t);
    const float* row = s.scores_row(t);
    s.dense_keys(t, nc, k8, sk);
    const std::vector<double> ref = reference::indexer_scores(s.q8.data() + t * kIndexHeads * kIndexHeadDim,
                                                              s.w.data() + t * kIndexHeads, k8.data(), sk.data(), nc);
    for (int64_t i = 0; i < nc; ++i)
      ASSERT_EQ(num::f2u(row[i]), num::f2u(static_cast<float>(ref[static_cast<size_t>(i)])))
          << "token " << t << " entry " << i << ": " << row[i] << " vs reference " << ref[static_cast<size_t>(i)];
    for (int64_t i = nc; i < s.scores_cols; ++i) ASSERT_EQ(row[i], kNegInf) << "token " << t << " column " << i;
  }
}

void expect_topk_is_full_sort(const IndexerStep& s) {
  for (int64_t t = 0; t < s.T; ++t) {
    const auto want = topk_by_full_sort(s.scores_row(t), s.scores_cols);
    ASSERT_EQ(row_vec(s.topk_row(t), kIndexTopk), want) << "token " << t << " (n_c " << s.nc(t) << ")";
    if (!s.valid[static_cast<size_t>(t)]) {
      for (int j = 0; j < kIndexTopk; ++j) ASSERT_EQ(s.topk_row(t)[j], -1);
    }
  }
}

TEST(IndexerTopk, ScoresMatchTheBinary64ReferenceAndTopkAFullSort) {
  for (int ratio : {1, 2}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " seed " + std::to_string(seed));
      Rng rng(seed * 10 + static_cast<uint64_t>(ratio));
      // a decode, a chunk crossing 512 visible entries, a short prefill from position 0, and an
      // invalid token (a padding row)
      IndexerStep s = make_step(rng, ratio,
                                {{static_cast<int64_t>(rng.integer(600, 2000)), 1},
                                 {511 * ratio - 2, 5},
                                 {0, 3}},
                                64 / ratio, {6});
      indexer_topk(s.args(IndexerRole::kPlain));
      expect_scores_match_reference(s);
      expect_topk_is_full_sort(s);
      expect_rows_past_step_untouched(s, false);
      EXPECT_TRUE(s.cand.untouched());
      // without the scores output the top-k is the same
      const std::vector<int32_t> with = s.topk.vec();
      s.reset_outputs();
      indexer_topk(s.args(IndexerRole::kPlain, false));
      EXPECT_TRUE(bits_equal(with, s.topk.vec(), "topk without scores"));
      EXPECT_TRUE(s.scores.vec().size() > 0 && std::isnan(s.scores[0]));
    }
  }
}

// Equal scores rank by index: all keys equal gives 0..511; duplicated keys resolve their ties
// by index at the selection boundary.
TEST(IndexerTopk, TiesRankByIndex) {
  Rng rng(42);
  IndexerStep s = make_step(rng, 1, {{2999, 1}, {1999, 1}}, 64);
  // request 0: every entry a copy of entry 0; request 1: 6 distinct keys repeated in turn
  for (int64_t i = 1; i < 3000; ++i) {
    uint8_t* pg = const_cast<uint8_t*>(s.page_of(0, i));
    std::memcpy(pg + (i % s.S) * kIndexHeadDim, s.codes(0, 0), kIndexHeadDim);
    const float sc = s.scale(0, 0);
    std::memcpy(pg + IndexerKFp8Layout::scale_offset(s.S, i % s.S), &sc, 4);
  }
  for (int64_t i = 6; i < 2000; ++i) {
    uint8_t* pg = const_cast<uint8_t*>(s.page_of(1, i));
    std::memcpy(pg + (i % s.S) * kIndexHeadDim, s.codes(1, i % 6), kIndexHeadDim);
    const float sc = s.scale(1, i % 6);
    std::memcpy(pg + IndexerKFp8Layout::scale_offset(s.S, i % s.S), &sc, 4);
  }
  indexer_topk(s.args(IndexerRole::kPlain));
  for (int j = 0; j < kIndexTopk; ++j) ASSERT_EQ(s.topk_row(0)[j], j) << "all scores equal: the lowest indices";
  expect_topk_is_full_sort(s);
  // request 1: 2000 entries in 6 score classes of ~333 each; the top 512 take one class whole
  // and the lowest indices of the next
  const float* sc = s.scores_row(1);
  int distinct = 0;
  for (int c = 0; c < 6; ++c) distinct += sc[c] != sc[(c + 1) % 6];
  ASSERT_GE(distinct, 5) << "the six keys give distinct scores";
}

// The candidate source's rows against a full sort of the block scores, across the 2048-block
// boundary (n_c 16384 = 2048 blocks: every block kept), with the consumer masked to them.
TEST(IndexerTopk, CandidateSourceAndConsumer) {
  Rng rng(7);
  IndexerStep s = make_step(rng, 1, {{16383, 3}, {700, 2}}, 64, {3});
  indexer_topk(s.args(IndexerRole::kCandidateSource));
  expect_topk_is_full_sort(s);  // the source's own top-k is unmasked
  for (int64_t t = 0; t < s.T; ++t) {
    const int64_t nc = s.nc(t);
    ASSERT_EQ(row_vec(s.cand_row(t), kCandidateTopkBlocks), candidates_by_full_sort(s.scores_row(t), nc)) << "token " << t;
    const int64_t nb = (nc + 7) / 8;
    EXPECT_EQ(s.cand_row(t)[std::min<int64_t>(nb, kCandidateTopkBlocks) - (nc > 0 ? 1 : 0)] >= 0, nc > 0) << t;
    if (nc > 0 && nb <= kCandidateTopkBlocks) {
      for (int64_t b = 0; b < nb; ++b) ASSERT_EQ(s.cand_row(t)[b], b) << "every block kept, token " << t;
    }
    if (nc > 0) {
      bool newest = false;
      for (int j = 0; j < kCandidateTopkBlocks; ++j) newest = newest || s.cand_row(t)[j] == (nc - 1) / 8;
      EXPECT_TRUE(newest) << "the newest block is always kept, token " << t;
    }
  }
  expect_rows_past_step_untouched(s, true);
  const std::vector<int32_t> cand = s.cand.vec();

  // the consumer: a fresh query, masked to the source's blocks
  IndexerStep c = s;
  for (auto& x : c.q8) x = random_e4m3(rng);
  c.reset_outputs();
  c.cand.vec() = cand;
  indexer_topk(c.args(IndexerRole::kCandidateConsumer));
  EXPECT_TRUE(bits_equal(cand, c.cand.vec(), "the consumer does not write candidates"));
  IndexerStep plain = c;
  plain.reset_outputs();
  indexer_topk(plain.args(IndexerRole::kPlain));
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t nc = c.nc(t);
    std::vector<float> masked(plain.scores_row(t), plain.scores_row(t) + c.scores_cols);
    std::vector<bool> kept(static_cast<size_t>((nc + 7) / 8 + 1), false);
    for (int j = 0; j < kCandidateTopkBlocks && cand[static_cast<size_t>(t * kCandidateTopkBlocks + j)] >= 0; ++j)
      kept[static_cast<size_t>(cand[static_cast<size_t>(t * kCandidateTopkBlocks + j)])] = true;
    for (int64_t i = 0; i < nc; ++i)
      if (!kept[static_cast<size_t>(i / 8)]) masked[static_cast<size_t>(i)] = kNegInf;
    for (int64_t i = 0; i < c.scores_cols; ++i)
      ASSERT_EQ(num::f2u(c.scores_row(t)[i]), num::f2u(masked[static_cast<size_t>(i)])) << "token " << t << " entry " << i;
    ASSERT_EQ(row_vec(c.topk_row(t), kIndexTopk), topk_by_full_sort(masked.data(), c.scores_cols)) << "token " << t;
  }
  expect_rows_past_step_untouched(c, true);
}

// SPEC 8.7: the candidates change a consumer's top-k only when n_c > 16384. Keys of block 5 point
// along dims 64..127, all others along dims 0..63; the source's query sees only the latter (block
// 5 scores 0, the lowest block), the consumer's only the former (block 5's entries score highest).
// At n_c = 16384 every block is kept and the consumer equals the unmasked top-k; at n_c = 16385
// block 5 is the one block dropped, and the consumer's top-k loses its 8 entries.
TEST(IndexerTopk, CandidatesHaveAnEffectExactlyBeyond16384Entries) {
  Rng rng(11);
  IndexerStep s = make_step(rng, 1, {{16383, 2}}, 64);  // n_c = 16384, 16385
  auto positive = [&] { return static_cast<uint8_t>(rng.integer(0x08, 0x70)); };
  for (int64_t i = 0; i < s.nc(1); ++i) {
    uint8_t* pg = const_cast<uint8_t*>(s.page_of(0, i));
    uint8_t* k = pg + (i % s.S) * kIndexHeadDim;
    const bool b5 = i / 8 == 5;
    for (int d = 0; d < kIndexHeadDim; ++d) k[d] = ((d >= 64) == b5) ? positive() : 0;
    const float one = 1.0f;
    std::memcpy(pg + IndexerKFp8Layout::scale_offset(s.S, i % s.S), &one, 4);
  }
  auto set_query = [&](IndexerStep& st, bool upper) {
    std::fill(st.q8.begin(), st.q8.end(), uint8_t{0});
    std::fill(st.w.begin(), st.w.end(), 0.0f);
    for (int64_t t = 0; t < st.T; ++t) {
      for (int d = 0; d < kIndexHeadDim; ++d)
        st.q8[static_cast<size_t>(t * kIndexHeads * kIndexHeadDim + d)] = ((d >= 64) == upper) ? positive() : 0;
      st.w[static_cast<size_t>(t * kIndexHeads)] = 1.0f;
    }
  };
  set_query(s, false);
  indexer_topk(s.args(IndexerRole::kCandidateSource));
  IndexerStep c = s, plain = s;
  set_query(c, true);
  set_query(plain, true);
  c.reset_outputs();
  plain.reset_outputs();
  c.cand.vec() = s.cand.vec();
  indexer_topk(c.args(IndexerRole::kCandidateConsumer));
  indexer_topk(plain.args(IndexerRole::kPlain));

  auto has_block5 = [](const int32_t* row) {
    for (int j = 0; j < kIndexTopk; ++j)
      if (row[j] >= 40 && row[j] < 48) return true;
    return false;
  };
  // n_c = 16384: 2048 blocks, all kept; the consumer is the plain top-k, block 5 included
  for (int j = 0; j < kCandidateTopkBlocks; ++j) ASSERT_EQ(s.cand_row(0)[j], j);
  EXPECT_EQ(row_vec(c.topk_row(0), kIndexTopk), row_vec(plain.topk_row(0), kIndexTopk));
  EXPECT_TRUE(has_block5(plain.topk_row(0)));
  // n_c = 16385: 2049 blocks, block 5 dropped; the consumer's top-k differs from the plain one
  for (int64_t t = 1; t < 2; ++t) {
    SCOPED_TRACE("n_c " + std::to_string(s.nc(t)));
    bool has5 = false;
    for (int j = 0; j < kCandidateTopkBlocks; ++j) has5 = has5 || s.cand_row(t)[j] == 5;
    EXPECT_FALSE(has5);
    EXPECT_EQ(s.cand_row(t)[kCandidateTopkBlocks - 1], 2048) << "the newest block kept";
    EXPECT_TRUE(has_block5(plain.topk_row(t)));
    EXPECT_FALSE(has_block5(c.topk_row(t)));
    EXPECT_NE(row_vec(c.topk_row(t), kIndexTopk), row_vec(plain.topk_row(t), kIndexTopk));
  }
}

// SPEC 8.6: with every n_c <= 512 the shortcut's rows equal the scored path's, and the decision
// is max_seq_len / r <= 512.
TEST(IndexerShortcut, EqualsTheScoredPath) {
  for (int ratio : {1, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    Rng rng(300 + static_cast<uint64_t>(ratio));
    IndexerStep s = make_step(rng, ratio, {{512 * ratio - 1, 1}, {0, ratio + 2}, {100, 4}}, 64 / ratio, {2});
    ASSERT_TRUE(indexer_takes_shortcut(512 * ratio, ratio));
    indexer_topk(s.args(IndexerRole::kPlain));
    CanaryBuffer<int32_t> sc(s.topk.size(), kIndexCanary);
    IndexerShortcutArgs a;
    a.ratio = ratio;
    a.positions = TensorView::contiguous(s.pos.data(), DType::I64, {s.T});
    a.token_valid = TensorView::contiguous(s.valid.data(), DType::I32, {s.T});
    a.topk = sc.view({s.T + 2, kIndexTopk});
    indexer_shortcut_topk(a);
    EXPECT_TRUE(bits_equal(s.topk.vec(), sc.vec(), "shortcut vs scored"));
  }
  EXPECT_TRUE(indexer_takes_shortcut(0, 1));
  EXPECT_TRUE(indexer_takes_shortcut(512, 1));
  EXPECT_FALSE(indexer_takes_shortcut(513, 1));
  EXPECT_TRUE(indexer_takes_shortcut(1025, 2));  // n_c of the longest = 1025 / 2 = 512
  EXPECT_FALSE(indexer_takes_shortcut(1026, 2));
  EXPECT_FALSE(indexer_takes_shortcut(100, 1, true)) << "never while a CUDA graph is captured";
}

// The same outputs, bit for bit, with 1 and 4 threads (3 for the uneven split): one token (its
// entries split over the threads) and a step of more tokens than threads (tokens split), for every
// role.
TEST(IndexerTopk, ThreadCountInvariance) {
  Rng rng(99);
  for (const std::vector<RequestSpec>& reqs :
       {std::vector<RequestSpec>{{9000, 1}}, std::vector<RequestSpec>{{2000, 3}, {600, 2}, {1500, 2}}}) {
    IndexerStep base = make_step(rng, 1, reqs, 64);
    indexer_topk(base.args(IndexerRole::kCandidateSource), ExecContext{nullptr, 1});
    const std::vector<int32_t> cand = base.cand.vec();
    for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer}) {
      std::vector<std::vector<int32_t>> topk, cands;
      std::vector<std::vector<float>> scores;
      for (int threads : {1, 3, 4}) {
        IndexerStep s = base;
        s.reset_outputs();
        if (role == IndexerRole::kCandidateConsumer) s.cand.vec() = cand;
        indexer_topk(s.args(role), ExecContext{nullptr, threads});
        topk.push_back(s.topk.vec());
        cands.push_back(s.cand.vec());
        scores.push_back(s.scores.vec());
      }
      for (size_t k = 1; k < topk.size(); ++k) {
        SCOPED_TRACE(std::string(indexer_role_name(role)) + ", T = " + std::to_string(base.T) + ", run " + std::to_string(k));
        EXPECT_TRUE(bits_equal(topk[0], topk[k], "topk"));
        EXPECT_TRUE(bits_equal(cands[0], cands[k], "candidates"));
        EXPECT_TRUE(bits_equal(scores[0], scores[k], "scores"));
      }
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test
