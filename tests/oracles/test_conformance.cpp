// The conformance module (SPEC 10.3, shared/conformance/README.md): the element rule of the README
// (element_agrees) on the situations it must admit and reject.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/numerics.hpp"

namespace dsv41kv::test {
namespace {

using conformance::element_agrees;
using conformance::kLatentAtol;
using conformance::kLatentRtol;

double bf16(uint16_t code) { return num::bf16_decode(code); }

// ---------------------------------------------------------------- element_agrees

// The exact value lies on the midpoint of two neighbouring bf16 values; a few fp32 ulps of error
// on either side round it down or up. Where one bf16 step exceeds the rtol term (small
// mantissas: 2^-7 / 1.m > 0.004), only the ulp term admits the pair.
TEST(ElementAgrees, NeighboursAtARoundingMidpointAgree) {
  for (uint16_t lo_code : {uint16_t{0x3F80}, uint16_t{0xBE80}, uint16_t{0x4040}, uint16_t{0x3C23}}) {
    SCOPED_TRACE(lo_code);
    const auto hi_code = static_cast<uint16_t>(lo_code + 1);  // one step away from zero
    const float mid = static_cast<float>(0.5 * (bf16(lo_code) + bf16(hi_code)));
    ASSERT_EQ(static_cast<double>(mid), 0.5 * (bf16(lo_code) + bf16(hi_code))) << "midpoint exact in fp32";
    const float away = std::nextafter(mid, std::copysign(INFINITY, mid));
    const float toward = std::nextafter(mid, 0.0f);
    const double rounded_away = bf16(num::bf16_encode(away)), rounded_toward = bf16(num::bf16_encode(toward));
    ASSERT_EQ(rounded_away, bf16(hi_code));
    ASSERT_EQ(rounded_toward, bf16(lo_code));
    ASSERT_GT(std::fabs(rounded_away - rounded_toward), kLatentAtol + kLatentRtol * std::fabs(rounded_away))
        << "the rtol term alone would reject this pair";
    EXPECT_TRUE(element_agrees(rounded_away, rounded_toward));
    EXPECT_TRUE(element_agrees(rounded_toward, rounded_away));
  }
}

// A near-cancellation in ratio-2 pooling leaves a value near 3e-6 whose bf16 roundings in two
// correct implementations lie two steps (2 * 2^-26) apart: more than one step, within atol.
TEST(ElementAgrees, TwoStepsApartNearZeroAgree) {
  const uint16_t b_code = num::bf16_encode(3e-6f);
  const double b = bf16(b_code), a = bf16(static_cast<uint16_t>(b_code + 2));
  ASSERT_GE(b, 0x1p-19);
  ASSERT_LT(a, 0x1p-18);
  ASSERT_EQ(a - b, 2 * 0x1p-26);
  EXPECT_TRUE(element_agrees(a, b));
  EXPECT_TRUE(element_agrees(b, a));
  EXPECT_TRUE(element_agrees(-a, -b));
  // across zero and at zero, atol is the bound
  EXPECT_TRUE(element_agrees(4e-7, -4e-7));
  EXPECT_FALSE(element_agrees(b, -b));
  EXPECT_TRUE(element_agrees(1e-6, 0.0));
  EXPECT_FALSE(element_agrees(1.1e-6, 0.0));
  // 1.05e-6 off at b: beyond 1e-6 + max(0.004 * 3e-6, 2^-26) = 1.0149e-6
  EXPECT_FALSE(element_agrees(b + 1.05e-6, b));
}

// Bounds computed for each case: 1e-6 + max(0.004 |b|, ulp_bf16(b)).
TEST(ElementAgrees, BeyondTheBoundFails) {
  // at 1.0: ulp 2^-7 = 0.0078125 > 0.004, bound 0.0078135. 0.5% off agrees; two steps do not.
  EXPECT_TRUE(element_agrees(1.005, 1.0));
  EXPECT_TRUE(element_agrees(bf16(0x3F81), 1.0));
  EXPECT_FALSE(element_agrees(bf16(0x3F82), 1.0));
  EXPECT_FALSE(element_agrees(1.0079, 1.0));
  // at 1.75: ulp 2^-7, 0.004 * 1.75 = 0.007, bound 0.0078135; 0.5% is 0.00875
  EXPECT_FALSE(element_agrees(1.75 * 1.005, 1.75));
  EXPECT_FALSE(element_agrees(-1.75 * 1.005, -1.75));
  EXPECT_TRUE(element_agrees(1.75 * 1.004, 1.75));
  // at 100.0 (0x42C8): ulp 0.5 > 0.4, bound 0.500001. One step agrees; two and three do not.
  ASSERT_EQ(bf16(0x42C8), 100.0);
  EXPECT_TRUE(element_agrees(bf16(0x42C9), 100.0));
  EXPECT_TRUE(element_agrees(bf16(0x42C7), 100.0));
  EXPECT_FALSE(element_agrees(bf16(0x42CA), 100.0));
  EXPECT_FALSE(element_agrees(bf16(0x42CB), 100.0));
  EXPECT_FALSE(element_agrees(bf16(0x42C5), 100.0));
  // at 255.0 (0x437F): the rtol term 1.02 exceeds the ulp 1.0, bound 1.020001 (a max, not a sum)
  ASSERT_EQ(bf16(0x437F), 255.0);
  EXPECT_TRUE(element_agrees(256.0, 255.0));
  EXPECT_TRUE(element_agrees(256.02, 255.0));
  EXPECT_FALSE(element_agrees(256.03, 255.0));
  EXPECT_FALSE(element_agrees(257.0, 255.0));
}

TEST(ElementAgrees, NonFinite) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(element_agrees(nan, nan));
  EXPECT_TRUE(element_agrees(inf, inf));
  EXPECT_TRUE(element_agrees(-inf, -inf));
  EXPECT_FALSE(element_agrees(inf, -inf));
  EXPECT_FALSE(element_agrees(1.0, inf));
  EXPECT_FALSE(element_agrees(inf, 1.0));
  EXPECT_FALSE(element_agrees(nan, 1.0));
  EXPECT_FALSE(element_agrees(1.0, nan));
  EXPECT_FALSE(element_agrees(nan, inf));
}

}  // namespace
}  // namespace dsv41kv::test
