// divmod_fast (the multiply-shift division of the CUDA kernels) against / and % on the host:
// the device runs the same code with __umulhi for the 32x32 high product.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_divmod.hpp"

using dsv41kv::detail::divmod_fast;
using dsv41kv::detail::FastDivmod;

namespace {

void expect_exact(const FastDivmod& f, int64_t a) {
  int64_t q = -1, r = -1;
  divmod_fast(a, f, q, r);
  ASSERT_EQ(q, a / f.d) << "a = " << a << ", d = " << f.d;
  ASSERT_EQ(r, a % f.d) << "a = " << a << ", d = " << f.d;
}

std::vector<int64_t> divisors() {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= 1100; ++i) d.push_back(i);
  for (int k = 11; k <= 31; ++k)  // every power of two and its neighbours up to 2^31
    for (int64_t o : {-3, -1, 0, 1, 3}) d.push_back((int64_t{1} << k) + o);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) d.push_back(1 + static_cast<int64_t>(rng() % ((uint64_t{1} << 31) - 1)));
  for (int64_t big : {int64_t{1} << 32, (int64_t{1} << 40) + 7}) d.push_back(big);  // the slow path
  return d;
}

}  // namespace

TEST(FastDivmod, MatchesDivisionForEveryDivisorShape) {
  std::mt19937_64 rng(20261129);
  for (int64_t d : divisors()) {
    const FastDivmod f = FastDivmod::make(d);
    EXPECT_EQ(f.fast, d < (int64_t{1} << 31));
    // the edges of the fast range, multiples of d and their neighbours, random values
    for (int64_t a : {int64_t{0}, int64_t{1}, d - 1, d, d + 1, 2 * d - 1, 2 * d, (int64_t{1} << 31) - 1,
                      (int64_t{1} << 31) - 2, int64_t{1} << 31, (int64_t{1} << 31) + 1,
                      (int64_t{1} << 40) + 12345})
      if (a >= 0) expect_exact(f, a);
    for (int i = 0; i < 200; ++i) {
      const int64_t a = static_cast<int64_t>(rng() % (uint64_t{1} << 31));
      expect_exact(f, a);
      const int64_t m = (a / d) * d;  // a multiple of d and the value below it
      expect_exact(f, m);
      if (m > 0) expect_exact(f, m - 1);
    }
  }
}

TEST(FastDivmod, ExhaustiveForSmallDividendsOfRingAndPageSizes) {
  // the divisors the kernels meet (ring capacities, states per page) over every dividend below 2^20
  for (int64_t d : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 100, 128, 255, 256, 1000}) {
    const FastDivmod f = FastDivmod::make(d);
    for (int64_t a = 0; a < (int64_t{1} << 20); ++a) {
      int64_t q, r;
      divmod_fast(a, f, q, r);
      if (q != a / d || r != a % d) FAIL() << "a = " << a << ", d = " << d;
    }
  }
}
