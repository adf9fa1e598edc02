// The top-k selection of SPEC 8.5 / 8.7 (indexer/select.hpp) against a full sort, on random rows
// up to n_c = 1M with ties, -0, infinities and NaN: the selected set, its ascending order and its
// length must be exactly the full sort's under the (key desc, index asc) ranking.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsv41kv/rng.hpp"
#include "indexer/indexer_step.hpp"
#include "indexer/select.hpp"

namespace dsv41kv::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The CI also runs the suite under AddressSanitizer on two cores: there the million-entry case
// runs one row.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kMillionRows = 1;
#else
constexpr int kMillionRows = 3;
#endif

// A random row of n keys: values drawn from a pool of `distinct` values (ties), with some -0/+0,
// -inf (invisible or masked entries), and, where `specials`, +inf and NaN.
std::vector<float> random_row(Rng& rng, int64_t n, int64_t distinct, bool specials) {
  std::vector<float> pool(static_cast<size_t>(distinct));
  for (auto& v : pool) v = static_cast<float>(rng.normal());
  std::vector<float> row(static_cast<size_t>(n));
  for (auto& v : row) {
    const int64_t k = rng.integer(0, 99);
    if (k < 3) v = -kInf;
    else if (k == 3) v = (rng.next() & 1) ? 0.0f : -0.0f;
    else if (specials && k == 4) v = kInf;
    else if (specials && k == 5) v = std::numeric_limits<float>::quiet_NaN();
    else v = pool[static_cast<size_t>(rng.integer(0, distinct - 1))];
  }
  return row;
}

void expect_select_matches_full_sort(const std::vector<float>& row, int64_t K, bool finite_only, const std::string& what) {
  std::vector<int32_t> got(static_cast<size_t>(K) + 1, -9);
  std::vector<float> scratch;
  const int64_t n = static_cast<int64_t>(row.size());
  const int64_t k = detail::select_top(row.data(), n, K, finite_only, got.data(), scratch);
  std::vector<float> keys = row;
  if (!finite_only)  // eligible: every key but NaN; rank +-inf as the values they are
    for (auto& v : keys)
      if (std::isinf(v)) v = v > 0 ? std::numeric_limits<float>::max() : std::numeric_limits<float>::lowest();
  std::vector<int32_t> want = topk_by_full_sort(keys.data(), n, K);
  int64_t want_k = 0;
  while (want_k < K && want[static_cast<size_t>(want_k)] >= 0) ++want_k;
  ASSERT_EQ(k, want_k) << what;
  got.resize(static_cast<size_t>(k));
  want.resize(static_cast<size_t>(k));
  ASSERT_EQ(got, want) << what;
}

TEST(IndexerSelect, EqualsAFullSortOnRandomRows) {
  Rng rng(2024);
  for (int64_t n : {0, 1, 7, 511, 512, 513, 4096, 100000}) {
    for (int64_t distinct : {int64_t{1}, int64_t{5}, n / 3 + 1, n + 1}) {
      for (bool specials : {false, true}) {
        const auto row = random_row(rng, n, std::max<int64_t>(distinct, 1), specials);
        const std::string what = "n " + std::to_string(n) + " distinct " + std::to_string(distinct);
        expect_select_matches_full_sort(row, kIndexTopk, true, what + " (top-k)");
        expect_select_matches_full_sort(row, kCandidateTopkBlocks, false, what + " (blocks)");
      }
    }
  }
}

// n_c = 1M, the longest context of the model: still a partial selection, still the full sort's.
TEST(IndexerSelect, MillionEntryRows) {
  Rng rng(1 << 20);
  for (int r = 0; r < kMillionRows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const auto row = random_row(rng, int64_t{1} << 20, r == 0 ? 1000 : (int64_t{1} << 19), r == 2);
    expect_select_matches_full_sort(row, kIndexTopk, true, "1M top-k");
    if (r == 0) expect_select_matches_full_sort(row, kCandidateTopkBlocks, false, "1M blocks");
  }
}

// Ties at the boundary go to the lowest indices; +0 and -0 are one value; -inf, +inf and NaN are
// never selected by the top-k, while blocks (not finite_only) take +inf first.
TEST(IndexerSelect, TiesAndSpecialValues) {
  std::vector<float> row(1000, 1.0f);
  row[10] = 2.0f;
  row[999] = 2.0f;
  row[500] = kInf;
  row[501] = std::numeric_limits<float>::quiet_NaN();
  row[502] = -kInf;
  row[3] = -0.0f;
  row[4] = 0.0f;
  std::vector<int32_t> out(kIndexTopk);
  std::vector<float> scratch;
  ASSERT_EQ(detail::select_top(row.data(), 1000, kIndexTopk, true, out.data(), scratch), kIndexTopk);
  // 2.0 at 10 and 999, then the 510 lowest indices holding 1.0 (not the zeros at 3, 4 nor the
  // non-finite 500..502)
  std::vector<int32_t> want;
  int ones = 0;
  for (int i = 0; i < 999; ++i) {
    if (i == 10) want.push_back(i);
    else if (row[static_cast<size_t>(i)] == 1.0f && ones < kIndexTopk - 2) want.push_back(i), ++ones;
  }
  want.push_back(999);
  EXPECT_EQ(out, want);
  ASSERT_EQ(detail::select_top(row.data(), 1000, 2, false, out.data(), scratch), 2);
  EXPECT_EQ(out[0], 10);
  EXPECT_EQ(out[1], 500) << "+inf first, then the first 2.0";
  std::vector<float> zeros = {0.0f, -0.0f, -1.0f, 0.0f};
  ASSERT_EQ(detail::select_top(zeros.data(), 4, 2, true, out.data(), scratch), 2);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 1) << "-0 ties with +0 and ranks by index";
  std::vector<float> none = {-kInf, std::numeric_limits<float>::quiet_NaN(), kInf};
  EXPECT_EQ(detail::select_top(none.data(), 3, kIndexTopk, true, out.data(), scratch), 0);
}

}  // namespace
}  // namespace dsv41kv::test
