// Independent double-precision reference encoders for the format tests (SPEC 2). They share
// no code with include/dsv41kv/numerics.hpp: every magnitude table is built from the format
// definition, and rounding is decided by comparing against the exact midpoint in binary64
// (all e4m3/e2m1/bf16 magnitudes and their midpoints are exact in binary64).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dsv41kv::test::ref {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Magnitude of e4m3 code c (0..0x7E), from the definition of SPEC 2.2.
inline double e4m3_magnitude(int c) {
  const int E = (c >> 3) & 0xF, M = c & 7;
  if (E == 0) return std::ldexp(static_cast<double>(M), -9);
  return std::ldexp(1.0 + M / 8.0, E - 7);
}
inline const std::array<double, 127>& e4m3_table() {
  static const std::array<double, 127> t = [] {
    std::array<double, 127> a{};
    for (int c = 0; c < 127; ++c) a[static_cast<size_t>(c)] = e4m3_magnitude(c);
    return a;
  }();
  return t;
}

// Nearest entry of an ascending magnitude table, ties to the even index (= even code).
template <size_t N>
inline int nearest_even(const std::array<double, N>& t, double a) {
  if (a >= t[N - 1]) return static_cast<int>(N - 1);
  // hi = first entry > a, lo = hi - 1 (t[0] == 0 <= a)
  const auto it = std::upper_bound(t.begin(), t.end(), a);
  const int hi = static_cast<int>(it - t.begin());
  const int lo = hi - 1;
  const double mid = (t[static_cast<size_t>(lo)] + t[static_cast<size_t>(hi)]) / 2;  // exact
  if (a < mid) return lo;
  if (a > mid) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

// e4m3 encode: NaN -> 0x7F, clamp to +-448, nearest magnitude (ties to even), sign of x.
inline uint8_t e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const double a = std::min(std::fabs(static_cast<double>(x)), 448.0);
  const int c = nearest_even(e4m3_table(), a);
  return static_cast<uint8_t>(c | (std::signbit(x) ? 0x80 : 0));
}
inline double e4m3_value(uint8_t q) {
  if ((q & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double m = e4m3_magnitude(q & 0x7F);
  return (q & 0x80) ? -m : m;
}

inline const std::array<double, 8>& e2m1_table() {
  static const std::array<double, 8> t = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return t;
}
// e2m1 encode (x not NaN): |x| >= 6 -> 7, nearest (ties to even code), sign of x.
inline uint8_t e2m1(float x) {
  const double a = std::fabs(static_cast<double>(x));
  const int c = nearest_even(e2m1_table(), a);
  return static_cast<uint8_t>(c | (std::signbit(x) ? 0x8 : 0));
}
inline double e2m1_value(uint8_t n) {
  const double m = e2m1_table()[n & 7u];
  return (n & 8u) ? -m : m;
}

// bf16 encode by nearest value: the two bf16 candidates around |x| (truncation and the next
// code); 0x7F80 counts as 2^128 (the value the rounding of an unbounded exponent would give).
inline uint16_t bf16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t u = bits(x);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7FFFFFFFu;
  if (a == 0x7F800000u) return static_cast<uint16_t>((sign | a) >> 16);
  const uint32_t lo = a >> 16, hi = lo + 1;
  auto val = [](uint32_t code) {
    if (code == 0x7F80u) return std::ldexp(1.0, 128);
    return static_cast<double>(from_bits(code << 16));
  };
  const double v = static_cast<double>(from_bits(a));
  const double mid = (val(lo) + val(hi)) / 2;  // exact in binary64
  uint32_t c;
  if (v < mid) c = lo;
  else if (v > mid) c = hi;
  else c = (lo % 2 == 0) ? lo : hi;
  return static_cast<uint16_t>((sign >> 16) | c);
}

// ceil(log2(x)) of a positive finite float by exact comparison with powers of two.
inline int ceil_log2(float x) {
  const double v = static_cast<double>(x);
  int e = -149;
  while (std::ldexp(1.0, e) < v) ++e;
  return e;
}
// Same, via frexp (exact): x = m * 2^k, m in [0.5, 1).
inline int ceil_log2_frexp(float x) {
  int k = 0;
  const double m = std::frexp(static_cast<double>(x), &k);
  return m == 0.5 ? k - 1 : k;
}

// fp32 product / quotient rounded once (binary64 result of two floats is exact for the
// product; the quotient is rounded twice, which is harmless: binary64 has > 2*24+2 bits).
inline float mul(float a, float b) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b));
}
inline float div(float a, float b) {
  return static_cast<float>(static_cast<double>(a) / static_cast<double>(b));
}

// UE8M0 tile reference (SPEC 2.4 + 2.6): returns the scale byte, fills q.
inline uint8_t ue8m0_tile(const float* v, int n, uint8_t* q) {
  bool finite = true;
  double amax = 0;
  for (int i = 0; i < n; ++i) {
    finite = finite && std::isfinite(v[i]);
    amax = std::max(amax, std::fabs(static_cast<double>(v[i])));
  }
  if (!finite) {
    for (int i = 0; i < n; ++i) q[i] = 0x7F;
    return 255;
  }
  const float a = std::max(static_cast<float>(amax), from_bits(0x38D1B717u));
  const int e = ceil_log2(mul(a, from_bits(0x3B124925u)));
  for (int i = 0; i < n; ++i) {
    // exact scaling in binary64, then one rounding to fp32 (exact unless fp32 underflow, where
    // the value is far below the e4m3 rounding threshold 2^-10 anyway)
    q[i] = e4m3(static_cast<float>(std::ldexp(static_cast<double>(v[i]), -e)));
  }
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 255));
}

// NVFP4 tile reference (SPEC 2.5 + 2.6): returns the scale byte, fills packed[8].
inline uint8_t nvfp4_tile(const float* v, uint8_t* packed) {
  bool finite = true;
  float amax = 0;
  for (int i = 0; i < 16; ++i) {
    finite = finite && std::isfinite(v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  if (!finite) {
    std::fill(packed, packed + 8, uint8_t{0});
    return 0x7F;
  }
  float t = mul(amax, from_bits(0x3E2AAAABu));
  t = std::clamp(t, std::ldexp(1.0f, -9), 448.0f);
  const uint8_t sbyte = e4m3(t);
  const float sd = static_cast<float>(e4m3_value(sbyte));
  for (int i = 0; i < 8; ++i) {
    const uint8_t lo = e2m1(div(v[2 * i], sd)), hi = e2m1(div(v[2 * i + 1], sd));
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return sbyte;
}

// MXFP4 index-key block reference (SPEC 3.5; poisoned blocks as docs/design.md decides): returns
// the UE8M0 byte, fills packed[16].
inline uint8_t mxfp4_block(const float* v, uint8_t* packed) {
  bool finite = true;
  float amax = 0;
  for (int i = 0; i < 32; ++i) {
    finite = finite && std::isfinite(v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  if (!finite) {
    std::fill(packed, packed + 16, uint8_t{0});
    return 255;
  }
  amax = std::max(amax, static_cast<float>(std::ldexp(6.0, -126)));
  const int e = std::clamp(ceil_log2(mul(amax, from_bits(0x3E2AAAABu))), -127, 127);
  for (int j = 0; j < 16; ++j) {
    const uint8_t lo = e2m1(static_cast<float>(std::ldexp(static_cast<double>(v[2 * j]), -e)));
    const uint8_t hi = e2m1(static_cast<float>(std::ldexp(static_cast<double>(v[2 * j + 1]), -e)));
    packed[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return static_cast<uint8_t>(e + 127);
}

}  // namespace dsv41kv::test::ref
