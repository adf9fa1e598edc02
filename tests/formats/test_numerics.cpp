// Format unit tests (SPEC 2 and 10.7): bf16, e4m3, e2m1, ceil_log2, UE8M0 and NVFP4 tiles,
// exp32 and the RoPE pair contraction, checked against the independent binary64 references of
// reference.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "dsv41kv/numerics.hpp"
#include "formats/reference.hpp"

using namespace dsv41kv;
namespace ref = dsv41kv::test::ref;
using ref::bits;
using ref::from_bits;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::string hex(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", u);
  return b;
}

}  // namespace

// ============================================================================ bf16 (SPEC 2.1)

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float v = num::bf16_decode(static_cast<uint16_t>(c));
    ASSERT_EQ(bits(v), c << 16);
    const bool nan = (c & 0x7FFFu) > 0x7F80u;
    ASSERT_EQ(num::bf16_encode(v), nan ? 0x7FC0 : c) << hex(c);
  }
}

TEST(Bf16, TiesToEvenNanAndOverflow) {
  EXPECT_EQ(num::bf16_encode(from_bits(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(num::bf16_encode(from_bits(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(num::bf16_encode(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(num::bf16_encode(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(num::bf16_encode(from_bits(0xBF818000u)), 0xBF82);  // sign symmetric
  EXPECT_EQ(num::bf16_encode(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(num::bf16_encode(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(num::bf16_encode(-0.0f), 0x8000);
  // NaN (any payload, any sign) -> canonical 0x7FC0
  for (uint32_t u : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u,
                     0xFFFFFFFFu, 0x7F808000u})
    EXPECT_EQ(num::bf16_encode(from_bits(u)), 0x7FC0) << hex(u);
  // Infinity and overflow by rounding
  EXPECT_EQ(num::bf16_encode(kInf), 0x7F80);
  EXPECT_EQ(num::bf16_encode(-kInf), 0xFF80);
  EXPECT_EQ(num::bf16_encode(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(num::bf16_encode(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(num::bf16_encode(from_bits(0x7F7F8000u)), 0x7F80);  // tie above max-odd -> Inf
  EXPECT_EQ(num::bf16_encode(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(num::bf16_encode(from_bits(0x7F7E8000u)), 0x7F7E);  // tie, even below
}

TEST(Bf16, MatchesReferenceOnSampledPatterns) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2'000'000; ++i) {
    const uint32_t u = rng();
    ASSERT_EQ(num::bf16_encode(from_bits(u)), ref::bf16(from_bits(u))) << hex(u);
  }
  // every exponent, low mantissa patterns around the rounding boundary
  for (uint32_t e = 0; e < 512; ++e)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      for (uint32_t hi : {0u, 1u, 0x7Eu, 0x7Fu}) {
        const uint32_t u = (e << 23) | (hi << 16) | lo;
        ASSERT_EQ(num::bf16_encode(from_bits(u)), ref::bf16(from_bits(u))) << hex(u);
      }
}

// ============================================================================ e4m3 (SPEC 2.2)

TEST(E4m3, EveryCodeDecodesExactlyAndReencodes) {
  for (int c = 0; c < 256; ++c) {
    const auto q = static_cast<uint8_t>(c);
    const float v = num::e4m3_decode(q);
    const double want = ref::e4m3_value(q);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(num::e4m3_encode(v), 0x7F) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), want) << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << c;  // includes -0 for 0x80
    EXPECT_EQ(num::e4m3_encode(v), q) << c;
  }
  EXPECT_EQ(num::e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(num::e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(num::e4m3_decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(num::e4m3_decode(0x07), 7 * std::ldexp(1.0f, -9));
}

TEST(E4m3, EveryTiePointRoundsToEven) {
  const auto& t = ref::e4m3_table();
  for (int c = 0; c + 1 < 127; ++c) {
    const double mid = (t[static_cast<size_t>(c)] + t[static_cast<size_t>(c + 1)]) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // midpoints are exact in fp32
    const int even = (c % 2 == 0) ? c : c + 1;
    for (int s = 0; s < 2; ++s) {
      const float x = s ? -m : m;
      const uint8_t sb = s ? 0x80 : 0;
      EXPECT_EQ(num::e4m3_encode(x), sb | even) << "tie between codes " << c << " and " << c + 1;
      // just below / above the tie
      const float below = std::nextafter(m, 0.0f), above = std::nextafter(m, kInf);
      EXPECT_EQ(num::e4m3_encode(s ? -below : below), sb | c) << c;
      EXPECT_EQ(num::e4m3_encode(s ? -above : above), sb | (c + 1)) << c;
    }
  }
}

TEST(E4m3, SaturationNanSignedZeroAndSmallest) {
  for (float x : {448.0f, 449.0f, 463.99f, 464.0f, 464.01f, 480.0f, 1e30f,
                  std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(num::e4m3_encode(x), 0x7E) << x;
    EXPECT_EQ(num::e4m3_encode(-x), 0xFE) << x;
  }
  EXPECT_EQ(num::e4m3_encode(std::nextafter(448.0f, 0.0f)), 0x7E);  // rounds up to 448
  EXPECT_EQ(num::e4m3_encode(432.0f), 0x7E);                         // tie 416|448 -> even 0x7E
  EXPECT_EQ(num::e4m3_encode(std::nextafter(432.0f, 0.0f)), 0x7D);
  for (uint32_t u : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu})
    EXPECT_EQ(num::e4m3_encode(from_bits(u)), 0x7F) << hex(u);
  EXPECT_EQ(num::e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(num::e4m3_encode(-0.0f), 0x80);
  // negative values that round to zero keep the sign
  for (float x : {1e-30f, 1e-45f, std::ldexp(1.0f, -10), std::ldexp(1.0f, -11), 1e-4f})
    EXPECT_EQ(num::e4m3_encode(-x), 0x80) << x;
  const float t10 = std::ldexp(1.0f, -10);
  EXPECT_EQ(num::e4m3_encode(t10), 0x00);  // exactly 2^-10 ties to 0
  EXPECT_EQ(num::e4m3_encode(std::nextafter(t10, 1.0f)), 0x01);
  EXPECT_EQ(num::e4m3_encode(std::nextafter(t10, 0.0f)), 0x00);
  EXPECT_EQ(num::e4m3_encode(-std::nextafter(t10, 1.0f)), 0x81);
  EXPECT_EQ(num::e4m3_encode(3 * t10), 0x02);   // tie 1|2 -> 2
  EXPECT_EQ(num::e4m3_encode(5 * t10), 0x02);   // tie 2|3 -> 2
  EXPECT_EQ(num::e4m3_encode(15 * t10), 0x08);  // tie 7 (subnormal max) | 8 (min normal) -> 8
}

TEST(E4m3, MatchesReferenceOnMillionsOfPatterns) {
  // Every exponent (both signs), 2048 mantissas each: all the low/high patterns plus a stride.
  int64_t n = 0;
  for (uint32_t se = 0; se < 512; ++se) {
    for (uint32_t k = 0; k < 2048; ++k) {
      const uint32_t m = (k < 1024) ? (k * 8191u) & 0x7FFFFFu : ((k - 1024) * 0x1FFFu + 0x7FF) & 0x7FFFFFu;
      const uint32_t u = (se << 23) | m;
      ASSERT_EQ(num::e4m3_encode(from_bits(u)), ref::e4m3(from_bits(u))) << hex(u);
      ++n;
    }
  }
  // The range where e4m3 is not trivially 0 or saturated (|x| in [2^-11, 2^9)), dense: every
  // 61st pattern of each binade (both signs), plus the patterns around every 2^20 boundary.
  for (uint32_t s = 0; s < 2; ++s) {
    for (uint32_t e = 127 - 11; e < 127 + 9; ++e) {
      for (uint32_t m = 0; m < (1u << 23); m += 61) {
        const uint32_t u = (s << 31) | (e << 23) | m;
        ASSERT_EQ(num::e4m3_encode(from_bits(u)), ref::e4m3(from_bits(u))) << hex(u);
        ++n;
      }
      for (uint32_t hi = 0; hi < 8; ++hi)
        for (uint32_t lo : {0u, 1u, 0x7FFFFu, 0x80000u, 0x80001u, 0xFFFFFu}) {
          const uint32_t u = (s << 31) | (e << 23) | (hi << 20) | lo;
          ASSERT_EQ(num::e4m3_encode(from_bits(u)), ref::e4m3(from_bits(u))) << hex(u);
          ++n;
        }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i, ++n) {
    const uint32_t u = rng();
    ASSERT_EQ(num::e4m3_encode(from_bits(u)), ref::e4m3(from_bits(u))) << hex(u);
  }
  EXPECT_GT(n, 4'000'000);
}

// ============================================================================ e2m1 (SPEC 2.3)

TEST(E2m1, EveryCodeDecodesAndReencodes) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = num::e2m1_decode(static_cast<uint8_t>(c));
    EXPECT_EQ(std::fabs(v), mags[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(num::e2m1_encode(v), c) << c;
  }
  // high nibble bits are ignored by decode
  EXPECT_EQ(num::e2m1_decode(0xF3), 1.5f);
  EXPECT_EQ(num::e2m1_decode(0x7B), -1.5f);
}

TEST(E2m1, TiePointsSaturationAndSign) {
  struct Case { float x; uint8_t code; };
  for (Case k : {Case{0.25f, 0}, Case{0.75f, 2}, Case{1.25f, 2}, Case{1.75f, 4}, Case{2.5f, 4},
                 Case{3.5f, 6}, Case{5.0f, 6}}) {
    EXPECT_EQ(num::e2m1_encode(k.x), k.code) << k.x;
    EXPECT_EQ(num::e2m1_encode(-k.x), k.code | 8) << k.x;
    // neighbours of each tie go to the nearest code
    EXPECT_EQ(num::e2m1_encode(std::nextafter(k.x, 0.0f)), ref::e2m1(std::nextafter(k.x, 0.0f)));
    EXPECT_EQ(num::e2m1_encode(std::nextafter(k.x, kInf)), ref::e2m1(std::nextafter(k.x, kInf)));
  }
  EXPECT_EQ(num::e2m1_encode(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(num::e2m1_encode(std::nextafter(5.0f, 6.0f)), 7);
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, 1e30f, kInf}) {
    EXPECT_EQ(num::e2m1_encode(x), 7) << x;
    EXPECT_EQ(num::e2m1_encode(-x), 15) << x;
  }
  EXPECT_EQ(num::e2m1_encode(0.0f), 0);
  EXPECT_EQ(num::e2m1_encode(-0.0f), 8);
  EXPECT_EQ(num::e2m1_encode(-0.1f), 8);   // negative, rounds to zero
  EXPECT_EQ(num::e2m1_encode(-0.25f), 8);  // negative tie to zero
  EXPECT_EQ(num::e2m1_encode(-1e-40f), 8);
}

TEST(E2m1, MatchesReferenceOnSampledPatterns) {
  std::mt19937 rng(3);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t u = rng();
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) continue;  // never applied to NaN
    ASSERT_EQ(num::e2m1_encode(from_bits(u)), ref::e2m1(from_bits(u))) << hex(u);
  }
  // dense over [0, 8): every 257th pattern of the binades 2^-3 .. 2^2, both signs
  for (uint32_t s = 0; s < 2; ++s)
    for (uint32_t e = 124; e <= 129; ++e)
      for (uint32_t m = 0; m < (1u << 23); m += 257) {
        const uint32_t u = (s << 31) | (e << 23) | m;
        ASSERT_EQ(num::e2m1_encode(from_bits(u)), ref::e2m1(from_bits(u))) << hex(u);
      }
}

// ============================================================================ ceil_log2, UE8M0 (SPEC 2.4)

TEST(CeilLog2, EveryPowerOfTwoAndNeighbours) {
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    ASSERT_EQ(static_cast<double>(p), std::ldexp(1.0, k));
    EXPECT_EQ(num::ceil_log2(p), k) << k;
    EXPECT_EQ(ref::ceil_log2(p), k) << k;
    const float up = std::nextafter(p, kInf);
    EXPECT_EQ(num::ceil_log2(up), ref::ceil_log2(up)) << k;
    EXPECT_EQ(num::ceil_log2(up), k + 1) << k;
    if (k > -149) {
      const float down = std::nextafter(p, 0.0f);
      EXPECT_EQ(num::ceil_log2(down), ref::ceil_log2(down)) << k;
      EXPECT_EQ(num::ceil_log2(down), k == -148 ? -149 : k) << k;  // below 2^-148: 2^-149
    }
    // a few more in-binade values: 1.5 * 2^k and the largest value of the binade below
    if (k > -148) {
      const float mid = std::ldexp(1.5f, k - 1);
      EXPECT_EQ(num::ceil_log2(mid), k) << k;
    }
  }
  EXPECT_EQ(num::ceil_log2(std::numeric_limits<float>::max()), 128);
  EXPECT_EQ(num::ceil_log2(from_bits(0x00000003u)), -147);  // 3 * 2^-149 -> 2^-147
  EXPECT_EQ(num::ceil_log2(from_bits(0x007FFFFFu)), -126);
}

TEST(CeilLog2, MatchesFrexpOnSampledPatterns) {
  std::mt19937 rng(11);
  for (int i = 0; i < 1'000'000; ++i) {
    const uint32_t u = rng() & 0x7FFFFFFFu;
    if (u == 0 || u >= 0x7F800000u) continue;
    ASSERT_EQ(num::ceil_log2(from_bits(u)), ref::ceil_log2_frexp(from_bits(u))) << hex(u);
  }
  for (uint32_t u = 1; u < 0x7F800000u; u += 4099)
    ASSERT_EQ(num::ceil_log2(from_bits(u)), ref::ceil_log2_frexp(from_bits(u))) << hex(u);
}

TEST(Ue8m0, FloorAndExponentRange) {
  EXPECT_EQ(num::ue8m0_exponent(0.0f), -22);
  EXPECT_EQ(num::ue8m0_byte(num::ue8m0_exponent(0.0f)), 105);
  EXPECT_EQ(num::ue8m0_exponent(1e-30f), -22);
  EXPECT_EQ(num::ue8m0_exponent(1e-4f), -22);
  EXPECT_EQ(num::ue8m0_exponent(std::numeric_limits<float>::max()), 120);
  EXPECT_EQ(bits(1e-4f), 0x38D1B717u);
  EXPECT_EQ(bits(1.0f / 448.0f), 0x3B124925u);
  EXPECT_EQ(bits(1.0f / 6.0f), 0x3E2AAAABu);
  EXPECT_EQ(num::ue8m0_byte(-200), 0);
  EXPECT_EQ(num::ue8m0_byte(200), 255);
  // exponent of every amax binade boundary equals the reference computation
  for (int k = -149; k <= 127; ++k) {
    for (float a : {std::ldexp(1.0f, k), std::nextafter(std::ldexp(1.0f, k), kInf),
                    std::ldexp(1.75f, k - 1)}) {
      const float x = ref::mul(std::max(a, 1e-4f), 1.0f / 448.0f);
      EXPECT_EQ(num::ue8m0_exponent(a), ref::ceil_log2(x)) << a;
    }
  }
  // 448 * 2^k is the largest amax with exponent k (x = 448 * fp32(1/448) is just above 1?)
  for (int k = -10; k <= 20; ++k) {
    const float a = std::ldexp(448.0f, k);
    EXPECT_EQ(num::ue8m0_exponent(a), ref::ceil_log2(ref::mul(a, 1.0f / 448.0f))) << k;
  }
  // every finite amax (a stride through all bit patterns, every binade, + the largest): the
  // normal-only exponent of ue8m0_exponent equals the general ceil_log2 of the same product
  for (uint64_t u = 0; u <= 0x7F7FFFFFu; u += 1021) {
    const float a = from_bits(static_cast<uint32_t>(u));
    ASSERT_EQ(num::ue8m0_exponent(a), num::ceil_log2(num::mul_rn(std::max(a, 1e-4f), 1.0f / 448.0f))) << hex(static_cast<uint32_t>(u));
  }
  EXPECT_EQ(num::ue8m0_exponent(from_bits(0x7F7FFFFFu)), ref::ceil_log2(ref::mul(from_bits(0x7F7FFFFFu), 1.0f / 448.0f)));
  EXPECT_EQ(num::ue8m0_scale(127), 1.0f);
  EXPECT_EQ(num::ue8m0_scale(105), std::ldexp(1.0f, -22));
  EXPECT_EQ(num::ue8m0_scale(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(num::ue8m0_scale(254), std::ldexp(1.0f, 127));
}

TEST(Ue8m0, TileQuantizationMatchesReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-40, 40);
  for (int n : {32, 64}) {
    std::vector<float> v(static_cast<size_t>(n));
    std::vector<uint8_t> q(v.size()), qr(v.size());
    for (int it = 0; it < 20000; ++it) {
      const float scale = std::ldexp(1.0f, expo(rng));
      for (auto& x : v) x = nd(rng) * scale;
      if (it % 7 == 0) v[static_cast<size_t>(it) % v.size()] = -0.0f;
      if (it % 11 == 0) v[0] = std::ldexp(448.0f, expo(rng));  // exact boundary amax
      const uint8_t s = num::ue8m0_quantize_tile(v.data(), n, q.data());
      const uint8_t sr = ref::ue8m0_tile(v.data(), n, qr.data());
      ASSERT_EQ(s, sr) << "iteration " << it;
      ASSERT_EQ(q, qr) << "iteration " << it;
      // dequantized within one e4m3 step, no saturation
      for (size_t i = 0; i < v.size(); ++i) {
        const double dec = ref::e4m3_value(q[i]) * std::ldexp(1.0, s - 127);
        const double x = v[i];
        const double step = std::max(std::fabs(x) / 8, std::ldexp(1.0, s - 127 - 9));
        ASSERT_LE(std::fabs(dec - x), step) << x;
        ASSERT_NE(q[i] & 0x7F, 0x7F);
      }
    }
  }
}

TEST(Ue8m0, ZeroAndPoisonedTiles) {
  float v[64] = {};
  uint8_t q[64];
  EXPECT_EQ(num::ue8m0_quantize_tile(v, 64, q), 105);
  for (uint8_t b : q) EXPECT_EQ(b, 0x00);
  v[3] = -0.0f;
  EXPECT_EQ(num::ue8m0_quantize_tile(v, 64, q), 105);
  EXPECT_EQ(q[3], 0x80);
  for (float bad : {kNaN, kInf, -kInf, -kNaN}) {
    for (int i = 0; i < 64; ++i) v[i] = static_cast<float>(i) - 20.0f;
    v[17] = bad;
    std::fill(q, q + 64, uint8_t{0});
    EXPECT_EQ(num::ue8m0_quantize_tile(v, 64, q), 255);
    for (uint8_t b : q) EXPECT_EQ(b, 0x7F);
  }
  // finite extremes stay finite: FLT_MAX gives exponent 120
  for (auto& x : v) x = 1.0f;
  v[0] = -std::numeric_limits<float>::max();
  EXPECT_EQ(num::ue8m0_quantize_tile(v, 32, q), 127 + 120);
  EXPECT_NE(q[0], 0xFF);
}

// ============================================================================ NVFP4 (SPEC 2.5)

TEST(Nvfp4, ZeroTileUsesSmallestScale) {
  float v[16] = {};
  uint8_t p[8];
  std::fill(p, p + 8, uint8_t{0xEE});
  EXPECT_EQ(num::nvfp4_quantize_tile(v, p), 0x01);
  for (uint8_t b : p) EXPECT_EQ(b, 0x00);
  v[0] = -0.0f;
  v[5] = -0.0f;
  EXPECT_EQ(num::nvfp4_quantize_tile(v, p), 0x01);
  EXPECT_EQ(p[0], 0x08);  // element 0 in the low nibble
  EXPECT_EQ(p[2], 0x80);  // element 5 in the high nibble of byte 2
  for (int i : {1, 3, 4, 5, 6, 7}) EXPECT_EQ(p[i], 0x00);
}

TEST(Nvfp4, PoisonedTile) {
  for (float bad : {kNaN, kInf, -kInf}) {
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
    v[9] = bad;
    uint8_t p[8];
    std::fill(p, p + 8, uint8_t{0xEE});
    EXPECT_EQ(num::nvfp4_quantize_tile(v, p), 0x7F);
    for (uint8_t b : p) EXPECT_EQ(b, 0x00);
  }
}

TEST(Nvfp4, TileMatchesReferenceAndIsWithinOneScale) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 8);
  float v[16];
  uint8_t p[8], pr[8];
  for (int it = 0; it < 100000; ++it) {
    const float scale = std::ldexp(1.0f, expo(rng));
    for (float& x : v) x = nd(rng) * scale;
    if (it % 13 == 0) v[it % 16] = 6.0f * std::ldexp(1.0f, expo(rng));
    if (it % 17 == 0)
      for (float& x : v) x *= 1e-6f;  // amax/6 below 2^-9: clamped scale
    const uint8_t s = num::nvfp4_quantize_tile(v, p);
    const uint8_t sr = ref::nvfp4_tile(v, pr);
    ASSERT_EQ(s, sr) << it;
    for (int i = 0; i < 8; ++i) ASSERT_EQ(p[i], pr[i]) << it << " byte " << i;
    const double sd = ref::e4m3_value(s);
    ASSERT_GT(sd, 0.0);
    double amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(static_cast<double>(x)));
    // Within one scale only where the e4m3 scale is normal and unclamped: t = amax/6 in
    // [2^-6, 448]. A subnormal scale (t < 2^-6) is rounded with an absolute step of 2^-9, so
    // e.g. t = 1.4 * 2^-9 gives sd = 2^-9 and |v|/sd up to 8.4, saturating at 6 (as specified).
    if (amax > 6.0 * 448.0 || amax < 6.0 * std::ldexp(1.0, -6)) continue;
    for (int i = 0; i < 16; ++i) {
      const uint8_t nib = (i & 1) ? (p[i / 2] >> 4) : (p[i / 2] & 0xF);
      const double dec = ref::e2m1_value(nib) * sd;
      ASSERT_LE(std::fabs(dec - v[i]), sd) << it << " element " << i;
    }
  }
}

// ============================================================================ exp32 (SPEC 4.6)

namespace {
// error of exp32(x) in units of the fp32 ulp of the exact result
double exp32_ulp_error(float x) {
  const double want = std::exp(static_cast<double>(x));
  const double got = num::exp32(x);
  if (std::isinf(static_cast<float>(want))) return std::isinf(got) ? 0.0 : 1e9;  // overflow
  if (want == 0.0) return got == 0.0 ? 0.0 : 1e9;
  int k = 0;
  std::frexp(want, &k);  // want in [2^(k-1), 2^k)
  const double ulp = std::ldexp(1.0, std::max(k - 1, -126) - 23);
  return std::fabs(got - want) / ulp;
}
}  // namespace

TEST(Exp32, SpecialValues) {
  EXPECT_EQ(bits(num::exp32(0.0f)), bits(1.0f));
  EXPECT_EQ(bits(num::exp32(-0.0f)), bits(1.0f));
  for (float x : {std::nextafter(-104.0f, -kInf), -105.0f, -1e4f, -1e30f, -kInf})
    EXPECT_EQ(bits(num::exp32(x)), 0u) << x;
  EXPECT_TRUE(std::isnan(num::exp32(kNaN)));
  EXPECT_EQ(num::exp32(kInf), kInf);
  EXPECT_EQ(num::exp32(100.0f), kInf);
  EXPECT_EQ(num::exp32(-104.0f), 0.0f);  // exp(-104) = 6.8e-46 < 2^-150: rounds to 0
  EXPECT_EQ(num::exp32(-103.0f), ref::from_bits(0x00000001u));  // 1.32 * 2^-149: not flushed
  EXPECT_LE(exp32_ulp_error(-104.0f), 2.0);
  EXPECT_LE(exp32_ulp_error(1.0f), 2.0);
}

TEST(Exp32, WithinTwoUlpOverTheRange) {
  double worst = 0;
  float worst_x = 0;
  auto check = [&](float x) {
    const double e = exp32_ulp_error(x);
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  };
  // every ~1000th fp32 pattern of [-104, 88.7]
  const uint32_t pos_end = bits(88.7f), neg_end = bits(-104.0f);
  for (uint32_t u = 0; u <= pos_end; u += 997) check(from_bits(u));
  for (uint32_t u = 0x80000000u; u <= neg_end; u += 997) check(from_bits(u));
  // [-1, 0]: every pattern of [-1, -2^-8] and every 16th of (-2^-8, 0) (where exp(x) is within
  // an ulp or so of 1 + x); DSV41KV_EXHAUSTIVE=1 checks every pattern of [-1, 0] (~1e9, slow).
  const bool exhaustive = std::getenv("DSV41KV_EXHAUSTIVE") != nullptr;
  const uint32_t dense_lo = bits(-std::ldexp(1.0f, -8));
  for (uint32_t u = dense_lo; u <= bits(-1.0f); ++u) check(from_bits(u));
  for (uint32_t u = 0x80000000u; u < dense_lo; u += exhaustive ? 1u : 16u) check(from_bits(u));
  // boundaries
  for (float x : {88.7f, 88.72f, 88.72283935546875f, -87.33f, -87.34f, -103.97f, -103.28f, -1.0f,
                  1.0f, 0.5f, -0.5f, 0.34657359f, -0.34657359f, 1e-8f, -1e-8f})
    check(x);
  EXPECT_LE(worst, 2.0) << "worst x = " << worst_x << " (" << hex(bits(worst_x)) << ")";
  RecordProperty("exp32_max_ulp", std::to_string(worst));
  std::printf("exp32 max error %.3f ulp at x = %.9g\n", worst, static_cast<double>(worst_x));
}

TEST(Exp32, DifferenceOfEqualScoresIsExactlyOne) {
  // pool2 relies on exp32(m - m) == 1 for the larger score
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  for (int i = 0; i < 1000; ++i) {
    const float a = nd(rng);
    EXPECT_EQ(num::exp32(num::sub_rn(a, a)), 1.0f);
  }
}

// ============================================================================ RoPE pair (SPEC 1.4)

TEST(RopePair, ForwardAndInverseContraction) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<double> ang(-10.0, 10.0);
  for (int i = 0; i < 200000; ++i) {
    const float x0 = nd(rng), x1 = nd(rng);
    const double a = ang(rng);
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float y0, y1;
    num::rope_forward(x0, x1, c, s, y0, y1);
    // reference: products rounded to fp32 (volatile: never fused), then one fma each
    volatile float x1s = x1 * s, x0s = x0 * s;
    ASSERT_EQ(bits(y0), bits(std::fma(x0, c, -x1s)));
    ASSERT_EQ(bits(y1), bits(std::fma(x1, c, static_cast<float>(x0s))));
    num::rope_inverse(x0, x1, c, s, y0, y1);
    ASSERT_EQ(bits(y0), bits(std::fma(x0, c, static_cast<float>(x1s))));
    ASSERT_EQ(bits(y1), bits(std::fma(x1, c, -x0s)));
  }
  // the contraction differs from the unfused formula in general: make sure the test can tell
  int differ = 0;
  for (int i = 0; i < 10000; ++i) {
    const float x0 = nd(rng), x1 = nd(rng);
    const double a = ang(rng);
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float y0, y1;
    num::rope_forward(x0, x1, c, s, y0, y1);
    volatile float p = x0 * c, q = x1 * s;
    differ += bits(y0) != bits(static_cast<float>(p - q));
  }
  EXPECT_GT(differ, 0);
}
