// The AVX-512 form of the indexer's scores (src/indexer/avx512.cpp, taken at run time where the CPU
// has AVX-512) gives the bits of the portable form: indexer_topk through both on random steps of
// every role, the scores, top-k and candidate rows compared bit for bit (canary rows included),
// with entry counts of every residue mod the group of 24, NaN codes in keys and queries (scored
// the portable way), extreme and non-finite scales and weights. Skipped, with a message, on a CPU
// without AVX-512.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "indexer/avx512.hpp"
#include "indexer/backend.hpp"
#include "indexer/score.hpp"
#include "indexer/indexer_step.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

class IndexerForms : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!detail::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the portable form runs here";
    seed_ = seed_for(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string seed_text() const { return "seed " + std::to_string(seed_) + " (run_seed() ^ test name)"; }
  uint64_t seed_ = 0;

  // The step through both forms; every output buffer bit for bit.
  static void expect_forms_agree(const IndexerStep& step, IndexerRole role, const std::vector<int32_t>& cand,
                                 int threads, const std::string& what) {
    IndexerStep portable = step, avx512 = step;
    for (auto [s, form] : {std::pair{&portable, detail::CpuForm::kPortable}, {&avx512, detail::CpuForm::kAvx512}}) {
      s->reset_outputs();
      if (role == IndexerRole::kCandidateConsumer) s->cand.vec() = cand;
      const IndexerTopkArgs a = s->args(role);
      const detail::IndexerTopkPlan p = detail::plan_indexer_topk(a);
      detail::check_indexer_topk_values(a, p);
      detail::cpu::indexer_topk(a, p, ExecContext{nullptr, threads}, form);
    }
    EXPECT_TRUE(bits_equal(portable.scores.vec(), avx512.scores.vec(), what + ": scores"));
    EXPECT_TRUE(bits_equal(portable.topk.vec(), avx512.topk.vec(), what + ": topk"));
    EXPECT_TRUE(bits_equal(portable.cand.vec(), avx512.cand.vec(), what + ": candidates"));
  }
};

TEST_F(IndexerForms, EveryRoleGivesTheSameBits) {
  SCOPED_TRACE(seed_text());
  Rng rng(seed_);
  // a long decode (its entries split over threads), a chunk, short requests of every residue mod 24
  IndexerStep step = make_step(rng, 1, {{static_cast<int64_t>(rng.integer(5000, 9000)), 1}, {700, 3}, {22, 1},
                                        {23, 1}, {24, 1}, {46, 1}, {0, 2}},
                               64, {5});
  step.reset_outputs();
  {
    IndexerStep src = step;
    indexer_topk(src.args(IndexerRole::kCandidateSource));
    const std::vector<int32_t> cand = src.cand.vec();
    for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer})
      for (int threads : {1, 2, 3})
        expect_forms_agree(step, role, cand, threads,
                           std::string(indexer_role_name(role)) + ", " + std::to_string(threads) + " threads");
  }
  // ratio 2 and 32 states per page
  IndexerStep r2 = make_step(rng, 2, {{static_cast<int64_t>(rng.integer(3000, 6000)), 2}, {99, 1}}, 32);
  expect_forms_agree(r2, IndexerRole::kPlain, {}, 2, "ratio 2");
}

// The group kernel against the portable score before the final rounding to fp32 (binary64 bit for
// bit: the head sum's order shows there, where the fp32 scores of the op would hide it nearly
// always): random queries with weights of every magnitude and sign, groups of 1 .. 24 entries.
TEST_F(IndexerForms, GroupKernelEqualsThePortableScoreInBinary64) {
  SCOPED_TRACE(seed_text());
  Rng rng(seed_);
  std::vector<uint8_t> q8(kIndexHeads * kIndexHeadDim), keys(detail::indexer_avx512::kGroup * kIndexHeadDim);
  std::vector<float> w(kIndexHeads), sk(detail::indexer_avx512::kGroup);
  auto query = std::make_unique<detail::Query>();
  auto query_avx512 = std::make_unique<detail::indexer_avx512::Query>();
  int64_t compared = 0;
  for (int round = 0; round < 200; ++round) {
    for (auto& c : q8) c = random_e4m3(rng);
    for (auto& x : w) x = static_cast<float>(std::ldexp(rng.normal(), static_cast<int>(rng.integer(-20, 20))));
    for (auto& c : keys) c = random_e4m3(rng);
    for (auto& x : sk) x = std::ldexp(1.0f, static_cast<int>(rng.integer(-22, 30)));
    detail::load_query(q8.data(), w.data(), *query);
    ASSERT_TRUE(detail::indexer_avx512::load_query(q8.data(), w.data(), *query_avx512));
    const int n = static_cast<int>(rng.integer(1, detail::indexer_avx512::kGroup));
    const uint8_t* codes[detail::indexer_avx512::kGroup];
    for (int j = 0; j < n; ++j) codes[j] = keys.data() + j * kIndexHeadDim;
    double got[detail::indexer_avx512::kGroup];
    float got32[detail::indexer_avx512::kGroup];
    ASSERT_EQ(detail::indexer_avx512::scores(*query_avx512, codes, sk.data(), n, got32, got), 0u);
    for (int j = 0; j < n; ++j, ++compared) {
      const double want = detail::score_unrounded(*query, codes[j], sk[static_cast<size_t>(j)]);
      ASSERT_EQ(num::f2u(got32[j]), num::f2u(static_cast<float>(want))) << "round " << round << " entry " << j;
      uint64_t a, b;
      std::memcpy(&a, &got[j], 8);
      std::memcpy(&b, &want, 8);
      ASSERT_EQ(a, b) << "round " << round << " entry " << j << ": " << got[j] << " vs " << want;
    }
  }
  EXPECT_GT(compared, 1000);
}

// Inputs no valid step has but the op accepts: NaN codes in some keys (every such entry) and in one
// token's query (the whole token), scales from 2^-22 to 2^120, zero, negative, subnormal,
// infinite and NaN, weights of +-0, huge, infinite and NaN.
TEST_F(IndexerForms, NonFiniteAndExtremeInputsGiveTheSameBits) {
  SCOPED_TRACE(seed_text());
  Rng rng(seed_);
  IndexerStep s = make_step(rng, 1, {{3000, 1}, {2000, 1}, {1500, 1}, {1000, 1}}, 64);
  const float kInf = std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < s.num_pages; ++p) {
    uint8_t* page = s.kcache.data() + p * s.page_stride;
    for (int64_t r = 0; r < s.S; ++r) {
      if (rng.integer(0, 40) == 0) page[r * kIndexHeadDim + rng.integer(0, kIndexHeadDim - 1)] = rng.integer(0, 1) ? 0x7F : 0xFF;
      const int64_t k = rng.integer(0, 30);
      if (k > 7) continue;
      const float sc = k == 0 ? 0.0f : k == 1 ? -0.5f : k == 2 ? 1e-40f : k == 3 ? std::ldexp(1.0f, 120)
                     : k == 4 ? std::ldexp(1.0f, -22) : k == 5 ? 3.0f : k == 6 ? kInf : -kInf;
      std::memcpy(page + IndexerKFp8Layout::scale_offset(s.S, r), &sc, 4);
    }
  }
  // a NaN scale in request 3's keys only (its token has finite weights: one NaN source per score)
  const int64_t p3 = s.bt[static_cast<size_t>(3 * s.bt_cols)];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(s.kcache.data() + p3 * s.page_stride + IndexerKFp8Layout::scale_offset(s.S, 5), &nan, 4);
  s.q8[static_cast<size_t>(1 * kIndexHeads * kIndexHeadDim + 77)] = 0x7F;  // token 1: a NaN query code
  s.w[static_cast<size_t>(0 * kIndexHeads + 3)] = kInf;                    // token 0: +-inf, 0, -0, huge
  s.w[static_cast<size_t>(0 * kIndexHeads + 9)] = -kInf;
  s.w[static_cast<size_t>(0 * kIndexHeads + 10)] = 0.0f;
  s.w[static_cast<size_t>(0 * kIndexHeads + 11)] = -0.0f;
  s.w[static_cast<size_t>(0 * kIndexHeads + 12)] = 3e38f;
  s.w[static_cast<size_t>(2 * kIndexHeads + 30)] = nan;  // token 2: one NaN weight
  for (int threads : {1, 2}) expect_forms_agree(s, IndexerRole::kPlain, {}, threads, std::to_string(threads) + " threads");
}

}  // namespace
}  // namespace dsv41kv::test
