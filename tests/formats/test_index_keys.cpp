// The index-key quantization rules (SPEC 2.4, 3.5, 8.1, 8.2): the FP8 vector of 128 values with one
// fp32 scale 2^e (keys and query heads), the MXFP4 block of 32 values, and the 132- and 68-byte
// record writers and readers. Expected values come from the independent binary64 encoders of
// reference.hpp; records are written into canary-filled pages with a non-default page stride and
// the whole page is compared (SPEC 10.2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rng.hpp"
#include "formats/reference.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"

using namespace dsv41kv;
namespace ref = dsv41kv::test::ref;
using dsv41kv::test::bits_equal;
using dsv41kv::test::kByteCanary;

namespace {

constexpr int D = kIndexHeadDim;

// The FP8 rule against the reference tile: the codes and the scale 2^(byte - 127) (+Inf for 255).
void expect_fp8_matches_reference(const std::vector<float>& v, const std::string& what) {
  ASSERT_EQ(v.size(), static_cast<size_t>(D));
  std::vector<uint8_t> q(D, 0x11), rq(D, 0x22);
  const float scale = index_fp8_quantize(v.data(), q.data());
  const uint8_t byte = ref::ue8m0_tile(v.data(), D, rq.data());
  EXPECT_TRUE(bits_equal(rq, q, what + " codes"));
  const float want = byte == 255 ? std::numeric_limits<float>::infinity()
                                 : static_cast<float>(std::ldexp(1.0, byte - 127));
  EXPECT_EQ(num::f2u(scale), num::f2u(want)) << what << ": scale " << scale << ", expected " << want;
}

void expect_mxfp4_matches_reference(const float* v, const std::string& what) {
  uint8_t q[16], rq[16];
  std::memset(q, 0x11, 16);
  const uint8_t byte = index_mxfp4_quantize_block(v, q);
  const uint8_t rbyte = ref::mxfp4_block(v, rq);
  EXPECT_EQ(int{byte}, int{rbyte}) << what;
  EXPECT_TRUE(test::bytes_equal(rq, q, 16, what + " codes"));
}

// e4m3 magnitudes from the definition, ascending (codes 0..0x7E).
std::vector<double> e4m3_magnitudes() {
  std::vector<double> m;
  for (int c = 0; c <= 0x7E; ++c) m.push_back(ref::e4m3_magnitude(c));
  return m;
}

}  // namespace

// ============================================================================ FP8 vectors (keys, query heads)

// amax = 0: the 1e-4 floor gives e = ceil_log2(fp32(1e-4) * fp32(1/448)) = -22 (SPEC 2.4: byte 105),
// every code zero with the value's sign.
TEST(IndexFp8, ZeroVectorTakesTheFloorExponent) {
  std::vector<float> v(D, 0.0f);
  for (int d = 0; d < D; d += 3) v[static_cast<size_t>(d)] = -0.0f;
  std::vector<uint8_t> q(D, 0x11);
  const float scale = index_fp8_quantize(v.data(), q.data());
  EXPECT_EQ(scale, std::ldexp(1.0f, -22));
  for (int d = 0; d < D; ++d) EXPECT_EQ(int{q[static_cast<size_t>(d)]}, d % 3 == 0 ? 0x80 : 0x00) << d;
  expect_fp8_matches_reference(v, "zero");
}

// amax below 1e-4: still the floor's exponent; the values are scaled by 2^22 and rounded.
TEST(IndexFp8, TinyAmaxUsesTheFloor) {
  for (float tiny : {1e-6f, 9.99e-5f, std::ldexp(1.0f, -40), std::numeric_limits<float>::denorm_min()}) {
    std::vector<float> v(D);
    for (int d = 0; d < D; ++d) v[static_cast<size_t>(d)] = tiny * static_cast<float>((d % 7) - 3) / 3.0f;
    std::vector<uint8_t> q(D);
    EXPECT_EQ(index_fp8_quantize(v.data(), q.data()), std::ldexp(1.0f, -22)) << tiny;
    expect_fp8_matches_reference(v, "tiny");
  }
}

// The exponent is ceil_log2 of the fp32 product amax * fp32(1/448), exactly: amax at 448 * 2^k
// (whose product with fp32(1/448) is not exactly 2^k), at 2^k, and at their float neighbours, for
// every exponent the keys can have.
TEST(IndexFp8, ExponentAtEveryPowerOfTwoAndItsNeighbours) {
  for (int k = -30; k <= 118; ++k) {
    for (float base : {448.0f * std::ldexp(1.0f, k), std::ldexp(1.0f, k)}) {
      for (float amax : {std::nextafter(base, 0.0f), base, std::nextafter(base, INFINITY)}) {
        std::vector<float> v(D, 0.0f);
        v[5] = amax;
        v[9] = -amax / 3.0f;
        v[100] = amax / 448.0f;
        expect_fp8_matches_reference(v, "amax " + std::to_string(amax));
        std::vector<uint8_t> q(D);
        const float s = index_fp8_quantize(v.data(), q.data());
        // the largest value never saturates: |amax| * 2^-e <= 448
        EXPECT_LE(std::fabs(num::e4m3_decode(q[5])), 448.0f);
        EXPECT_LE(static_cast<double>(std::max(amax, 1e-4f)) / s, 448.0 * (1 + 1e-6)) << amax;
      }
    }
  }
}

// Values that land exactly on an e4m3 midpoint after the scaling round to the even mantissa.
TEST(IndexFp8, TiePointsRoundToEven) {
  const std::vector<double> mag = e4m3_magnitudes();
  for (int e : {-22, -5, 0, 3, 60}) {
    // amax = 448 * 2^e' picks some exponent; read it back and place midpoints at that scale
    std::vector<float> v(D, 0.0f);
    v[0] = static_cast<float>(std::ldexp(300.0, e));
    std::vector<uint8_t> q(D);
    const float s = index_fp8_quantize(v.data(), q.data());
    int d = 1;
    for (size_t c = 0; c + 1 < mag.size() && d < D; c += 9, ++d) {
      const double mid = (mag[c] + mag[c + 1]) / 2;
      v[static_cast<size_t>(d)] = static_cast<float>((d % 2 ? 1 : -1) * mid * s);
      ASSERT_EQ(std::fabs(static_cast<double>(v[static_cast<size_t>(d)])), mid * s) << "midpoint exact in fp32";
    }
    ASSERT_EQ(index_fp8_quantize(v.data(), q.data()), s) << "the midpoints stay below amax";
    for (int j = 1; j < d; ++j) {
      const int even = (static_cast<size_t>(9 * (j - 1)) % 2 == 0) ? 9 * (j - 1) : 9 * (j - 1) + 1;
      EXPECT_EQ(q[static_cast<size_t>(j)] & 0x7F, even) << "e " << e << " dim " << j;
    }
    expect_fp8_matches_reference(v, "ties e=" + std::to_string(e));
  }
}

TEST(IndexFp8, NonFiniteVectorsArePoisoned) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> v(D, 1.0f);
    v[77] = bad;
    std::vector<uint8_t> q(D, 0);
    const float s = index_fp8_quantize(v.data(), q.data());
    EXPECT_EQ(num::f2u(s), 0x7F800000u) << "scale 2^128 = +Inf (byte 255)";
    for (uint8_t c : q) EXPECT_EQ(int{c}, 0x7F);
    expect_fp8_matches_reference(v, "poisoned");
  }
}

TEST(IndexFp8, RandomVectorsMatchTheReference) {
  Rng rng(20260311);
  for (int it = 0; it < 2000; ++it) {
    std::vector<float> v(D);
    const double scale = std::ldexp(1.0, static_cast<int>(rng.integer(-40, 40)));
    for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
    expect_fp8_matches_reference(v, "random " + std::to_string(it));
    if (::testing::Test::HasFailure()) break;
  }
}

// ============================================================================ MXFP4 blocks

// amax = 0: the floor 6 * 2^-126 gives amax * fp32(1/6) = 2^-126 exactly (6 * fp32(1/6) = 1 + 2^-25
// rounds to 1), so e = -126 and byte 1; codes zero with the value's sign.
TEST(IndexMxfp4, ZeroBlockTakesTheFloorExponent) {
  float v[32] = {};
  v[3] = -0.0f;
  uint8_t q[16];
  EXPECT_EQ(int{index_mxfp4_quantize_block(v, q)}, 1);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(int{q[j]}, j == 1 ? 0x80 : 0x00) << j;
  expect_mxfp4_matches_reference(v, "zero");
}

TEST(IndexMxfp4, TinyAmaxUsesTheFloor) {
  for (float tiny : {std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -130), std::ldexp(5.0f, -126)}) {
    float v[32];
    for (int i = 0; i < 32; ++i) v[i] = tiny * static_cast<float>((i % 5) - 2) / 2.0f;
    uint8_t q[16];
    EXPECT_EQ(int{index_mxfp4_quantize_block(v, q)}, 1) << tiny;
    expect_mxfp4_matches_reference(v, "tiny");
  }
}

// amax = 6 * 2^k gives e = k exactly; the e2m1 thresholds at that scale round to the even code.
TEST(IndexMxfp4, TiePointsRoundToTheEvenCode) {
  const float thresholds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int even[7] = {0, 2, 2, 4, 4, 6, 6};
  for (int k : {-120, -3, 0, 7, 120}) {
    float v[32] = {};
    v[0] = std::ldexp(6.0f, k);
    for (int i = 0; i < 7; ++i) {
      v[1 + i] = std::ldexp(thresholds[i], k);
      v[9 + i] = -std::ldexp(thresholds[i], k);
    }
    uint8_t q[16];
    EXPECT_EQ(int{index_mxfp4_quantize_block(v, q)}, k + 127);
    auto code = [&](int i) { return (i & 1) ? (q[i / 2] >> 4) : (q[i / 2] & 0xF); };
    EXPECT_EQ(code(0), 7);
    for (int i = 0; i < 7; ++i) {
      EXPECT_EQ(code(1 + i), even[i]) << "k " << k << " threshold " << thresholds[i];
      EXPECT_EQ(code(9 + i), even[i] | 8) << "k " << k << " threshold -" << thresholds[i];
    }
    expect_mxfp4_matches_reference(v, "ties k=" + std::to_string(k));
  }
}

TEST(IndexMxfp4, NonFiniteBlocksArePoisoned) {
  float v[32];
  for (int i = 0; i < 32; ++i) v[i] = 1.0f;
  v[31] = std::numeric_limits<float>::quiet_NaN();
  uint8_t q[16];
  std::memset(q, 0x33, 16);
  EXPECT_EQ(int{index_mxfp4_quantize_block(v, q)}, 255);
  for (uint8_t c : q) EXPECT_EQ(int{c}, 0);
  v[31] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(int{index_mxfp4_quantize_block(v, q)}, 255);
  expect_mxfp4_matches_reference(v, "poisoned");
}

TEST(IndexMxfp4, RandomBlocksMatchTheReference) {
  Rng rng(77);
  for (int it = 0; it < 4000; ++it) {
    float v[32];
    const double scale = std::ldexp(1.0, static_cast<int>(rng.integer(-100, 100)));
    for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
    expect_mxfp4_matches_reference(v, "random " + std::to_string(it));
    if (::testing::Test::HasFailure()) break;
  }
}

// ============================================================================ 132- and 68-byte records

// Each writer touches exactly its state's value and scale bytes of a canary page (S = 5, a page
// stride beyond the payload); the readers give back the codes, the scale and the decoded values.
TEST(IndexKRecords, Fp8WriterTouchesOnlyItsStateAndReadsBack) {
  constexpr int64_t S = 5, stride = S * IndexerKFp8Layout::kRecordBytes + 44;
  Rng rng(5);
  for (int64_t r = 0; r < S; ++r) {
    std::vector<float> k(D);
    for (auto& x : k) x = static_cast<float>(rng.normal() * 0.3);
    std::vector<uint8_t> page(2 * stride, kByteCanary), want = page;
    rec::write_index_k_fp8(page.data() + stride, S, r, k.data());
    uint8_t* w = want.data() + stride;
    const float scale = index_fp8_quantize(k.data(), w + r * D);
    std::memcpy(w + S * D + r * 4, &scale, 4);  // little-endian host
    EXPECT_TRUE(bits_equal(want, page, "fp8 page, state " + std::to_string(r)));
    const uint8_t* pg = page.data() + stride;
    EXPECT_EQ(rec::index_k_fp8_codes(pg, S, r), pg + r * D);
    EXPECT_EQ(rec::read_index_k_fp8_scale(pg, S, r), scale);
    for (int d = 0; d < D; ++d)
      EXPECT_EQ(static_cast<double>(rec::read_index_k_fp8(pg, S, r, d)),
                ref::e4m3_value(pg[r * D + d]) * static_cast<double>(scale));
  }
}

TEST(IndexKRecords, Mxfp4WriterTouchesOnlyItsStateAndReadsBack) {
  constexpr int64_t S = 6, stride = S * IndexerKMxfp4Layout::kRecordBytes + 12;
  Rng rng(6);
  for (int64_t r = 0; r < S; ++r) {
    std::vector<float> k(D);
    for (auto& x : k) x = static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(r) * 7 - 20));
    if (r == 4) k[70] = std::numeric_limits<float>::infinity();  // block 2 poisoned, the others not
    std::vector<uint8_t> page(2 * stride, kByteCanary), want = page;
    rec::write_index_k_mxfp4(page.data() + stride, S, r, k.data());
    uint8_t* w = want.data() + stride;
    for (int b = 0; b < 4; ++b) w[S * 64 + r * 4 + b] = ref::mxfp4_block(k.data() + 32 * b, w + r * 64 + 16 * b);
    EXPECT_TRUE(bits_equal(want, page, "mxfp4 page, state " + std::to_string(r)));
    const uint8_t* pg = page.data() + stride;
    for (int d = 0; d < D; ++d) {
      const uint8_t byte = pg[r * 64 + d / 2], sbyte = pg[S * 64 + r * 4 + d / 32];
      const double want_v = ref::e2m1_value((d & 1) ? (byte >> 4) : (byte & 0xF)) * std::ldexp(1.0, sbyte - 127);
      const double got = rec::read_index_k_mxfp4(pg, S, r, d);
      if (sbyte == 255) {
        EXPECT_TRUE(std::isnan(got)) << "a poisoned block decodes to NaN (code 0 x 2^128 = 0 x Inf in fp32)";
      } else {
        EXPECT_EQ(got, want_v) << "state " << r << " dim " << d;
      }
    }
  }
}
