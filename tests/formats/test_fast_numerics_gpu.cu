// The fast device forms of the number formats (formats/cuda/fast_numerics.cuh) against the exact
// forms of numerics.hpp they replace, on the device, exhaustively where the input space allows:
//   * e4m3x2_finite (hardware cvt.rn.satfinite.e4m3x2.f32) vs num::e4m3_encode: all 2^32 fp32
//     bit patterns that are finite; e4m3_decode_finite vs num::e4m3_decode on every finite byte;
//   * e2m1_quotient_code vs num::e2m1_encode(div_rn(v, sd)): every positive e4m3 scale sd and
//     2^24 values per scale (all magnitudes of 8 binades around sd, both signs) plus the exact
//     neighbourhoods of every threshold;
//   * e2m1_raw_bf16x2 (packed bf16 decisions in bf16x2 arithmetic, sm_90) vs e2m1_quotient_code:
//     every positive e4m3 scale and every finite bf16 pattern in each half (64 pairings per low
//     pattern; the halves are decided independently), and e2m1_raw_f32x2 likewise for fp32 pairs;
//   * e2m1_select_bf16x2 (mul.rn.bf16x2) vs the constants of the fp32 thresholds for every
//     positive e4m3 scale, and e2m1_pack8_raw (byte permutations) vs the per-pair shifts and masks;
//   * bf16x2_rn_hw vs bf16_encode, exp32_nonpos and exp32_mid vs exp32, on every input.
// Plus host-side versions of the e2m1 forms (they also run without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "formats/cuda/fast_numerics.cuh"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

using namespace dsv41kv::detail::cuda;

__global__ void e4m3_exhaustive_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < (1ull << 32);
       u += stride) {
    const float x = num::u2f(static_cast<uint32_t>(u));
    if (!num::is_finite(x)) continue;
    const uint32_t hw = e4m3x2_finite(x, x);
    const uint32_t sw = num::e4m3_encode(x);
    if ((hw & 0xFFu) != sw || (hw >> 8) != sw) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, static_cast<uint32_t>(u));
    }
  }
}

__global__ void e2m1_kernel(unsigned long long* mismatches, uint32_t* first_v) {
  const int sb = 1 + static_cast<int>(blockIdx.y);  // 0x01..0x7E
  const float sd = num::e4m3_decode(static_cast<uint8_t>(sb));
  float thr[7];
  e2m1_thresholds(sd, thr);
  const uint32_t base = num::f2u(num::mul_rn(sd, 1.0f / 16.0f));
  const uint32_t span = 1u << 23;  // 8 binades of magnitudes below sd*16
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < span; i += stride) {
    for (int sign = 0; sign < 2; ++sign) {
      const float v = num::u2f((base + i) | (sign ? 0x80000000u : 0u));
      if (e2m1_quotient_code(v, thr) != num::e2m1_encode(num::div_rn(v, sd))) {
        atomicAdd(mismatches, 1ull);
        atomicMin(first_v, num::f2u(v));
      }
    }
  }
  // threshold neighbourhoods (+-4096 ulps)
  if (blockIdx.x == 0)
    for (int k = 0; k < 7; ++k)
      for (int d = static_cast<int>(threadIdx.x) - 4096; d < 4096; d += static_cast<int>(blockDim.x))
        for (int sign = 0; sign < 2; ++sign) {
          const float v = num::u2f((num::f2u(thr[k]) + d) | (sign ? 0x80000000u : 0u));
          if (e2m1_quotient_code(v, thr) != num::e2m1_encode(num::div_rn(v, sd))) {
            atomicAdd(mismatches, 1ull);
            atomicMin(first_v, num::f2u(v));
          }
        }
}

// Exhaustive sweeps of the fast numerics (docs/changelog.md, "Bit-identity evidence"): every GPU run
// re-proves them on the hardware it runs on.
// bad[0]: bf16x2_rn_hw vs bf16_encode on every non-NaN pattern (paired with a hashed second value)
// bad[1]: exp32_nonpos vs exp32 on every pattern with !(x > 0)
// bad[2]: exp32_mid vs exp32 on every x in [-41, 0]
__global__ void shortcut_sweep_kernel(unsigned long long* bad) {
  unsigned long long b[3] = {0, 0, 0};
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    const float x = num::u2f(static_cast<uint32_t>(u));
    if (x == x) {
      float y = num::u2f(static_cast<uint32_t>(u * 2654435761ull));
      if (y != y) y = 0.0f;
      const uint32_t hw = bf16x2_rn_hw(x, y);
      const uint32_t sw = num::bf16_encode(x) | (static_cast<uint32_t>(num::bf16_encode(y)) << 16);
      b[0] += hw != sw;
    }
    if (!(x > 0.0f)) {
      const uint32_t e = num::f2u(num::exp32(x));
      b[1] += num::f2u(exp32_nonpos(x)) != e;
      if (x >= -41.0f) b[2] += num::f2u(exp32_mid(x)) != e;
    }
  }
  for (int i = 0; i < 3; ++i)
    if (b[i]) atomicAdd(&bad[i], b[i]);
}

__global__ void e2m1_bf16x2_kernel(unsigned long long* mismatches, uint32_t* first_w) {
  const int sb = 1 + static_cast<int>(blockIdx.y);  // 0x01..0x7E
  float thr[7];
  e2m1_thresholds(num::e4m3_decode(static_cast<uint8_t>(sb)), thr);
  const E2m1Select S = e2m1_select_of(thr);
  const uint32_t lo_pat = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. 65535
  if (lo_pat > 0xFFFFu) return;
  for (uint32_t j = 0; j < 64; ++j) {
    const uint32_t hi_pat = (lo_pat * 40503u + j * 1021u) & 0xFFFFu;
    const uint32_t w = (hi_pat << 16) | lo_pat;
    const float lo = num::u2f(lo_pat << 16), hi = num::u2f(hi_pat << 16);
    if (!num::is_finite(lo) || !num::is_finite(hi)) continue;  // the writer quantises finite tiles only
    const uint32_t want = e2m1_raw_of_codes(e2m1_quotient_code(lo, thr), e2m1_quotient_code(hi, thr));
    if (e2m1_raw_bf16x2(w, S) != want) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_w, w);
    }
  }
}

// e2m1_raw_f32x2 (fp32 values compared with the bf16 thresholds through their bf16 roundings
// down and up) against e2m1_quotient_code of each value: every bf16 pattern as the high half of
// the first value with low halves 0 (exactly a bf16 value, e.g. a threshold), 1, 0x7FFF, 0x8000,
// 0xFFFF and two others (just above a bf16 value, between, just below the next), paired with a
// second value of another pattern, for every positive e4m3 scale (blockIdx.y + 1).
__global__ void e2m1_f32x2_kernel(unsigned long long* mismatches, uint32_t* first_a) {
  const int sb = 1 + static_cast<int>(blockIdx.y);  // 0x01..0x7E
  float thr[7];
  e2m1_thresholds(num::e4m3_decode(static_cast<uint8_t>(sb)), thr);
  const E2m1Select S = e2m1_select_of(thr);
  const uint32_t hi_a = blockIdx.x * blockDim.x + threadIdx.x;  // 0 .. 65535
  if (hi_a > 0xFFFFu) return;
  constexpr uint32_t kLow[7] = {0u, 1u, 0x7FFFu, 0x8000u, 0xFFFFu, 0x1234u, 0xC001u};
  for (uint32_t j = 0; j < 7; ++j) {
    const uint32_t ua = (hi_a << 16) | kLow[j];
    const uint32_t ub = (((hi_a * 40503u + j * 1021u) & 0xFFFFu) << 16) | kLow[6 - j];
    const float a = num::u2f(ua), b = num::u2f(ub);
    if (!num::is_finite(a) || !num::is_finite(b)) continue;  // the writer quantises finite tiles only
    const uint32_t want = e2m1_raw_of_codes(e2m1_quotient_code(a, thr), e2m1_quotient_code(b, thr));
    if (e2m1_raw_f32x2(a, b, S) != want) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_a, ua);
    }
  }
}

// The packing e2m1_pack8_raw stands for (the tests' reference): byte b = code(2b) | code(2b+1) << 4
// of raw code word c[b] (codes in bits 0-3 and 16-19), pair by pair with shifts and masks.
DSV41KV_HD uint32_t pack8_per_pair(const uint32_t (&c)[4]) {
  uint32_t want = 0;
  for (int b = 0; b < 4; ++b) want |= ((c[b] & 0xFu) | ((c[b] >> 12) & 0xF0u)) << (8 * b);
  return want;
}
DSV41KV_HD bool select_equal(const E2m1Select& a, const E2m1Select& b) {
  return a.t0 == b.t0 && a.t1 == b.t1 && a.t3 == b.t3 && a.d40 == b.d40 && a.d51 == b.d51 && a.sd == b.sd &&
         a.dh == b.dh;
}

// The bf16x2 decision constants (mul.rn.bf16x2 on sm_90) against those of the fp32 thresholds for
// every positive e4m3 scale byte, and e2m1_pack8_raw (byte permutations) against the per-pair
// shifts and masks on pseudo-random raw code words (thread x, 4096 each).
__global__ void nv_pack_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  if (tid >= 1 && tid <= 0x7E) {
    const auto sb = static_cast<uint8_t>(tid);
    float thr[7];
    e2m1_thresholds(num::e4m3_decode(sb), thr);
    if (!select_equal(e2m1_select_bf16x2(sb), e2m1_select_of(thr))) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, tid);
    }
  }
  uint32_t x = tid * 2654435761u + 12345u;
  for (int j = 0; j < 4096; ++j) {
    uint32_t c[4];
    for (int b = 0; b < 4; ++b) {
      x = x * 1664525u + 1013904223u;
      c[b] = e2m1_raw_of_codes((x >> 8) & 0xFu, (x >> 20) & 0xFu);  // raw words, as e2m1_raw_bf16x2
    }
    const uint32_t swapped[4] = {c[2], c[3], c[0], c[1]};
    const uint32_t p = pack8_per_pair(c), ps = pack8_per_pair(swapped);
    if (e2m1_pack8_raw(c) != p || e2m1_pack8_raw(swapped, 0x2064u) != ((ps >> 16) | (ps << 16))) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, 0x80000000u | tid);
    }
  }
}

// e4m3_decode_finite (the hardware conversion on sm_89+) against num::e4m3_decode for every
// byte but the two NaNs: thread b decodes byte b.
__global__ void e4m3_decode_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint32_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > 0xFF || (b & 0x7F) == 0x7F) return;
  const auto byte = static_cast<uint8_t>(b);
  if (num::f2u(e4m3_decode_finite(byte)) != num::f2u(num::e4m3_decode(byte))) {
    atomicAdd(mismatches, 1ull);
    atomicMin(first, b);
  }
}

// The pair form (e4m3x2_decode_finite) against the software decode of each byte, every pair of
// finite bytes.
__global__ void e4m3x2_decode_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x > 0xFFFF || (x & 0x7F) == 0x7F || ((x >> 8) & 0x7F) == 0x7F) return;
  const float2 f = e4m3x2_decode_finite(static_cast<uint16_t>(x));
  if (num::f2u(f.x) != num::f2u(num::e4m3_decode(static_cast<uint8_t>(x & 0xFF))) ||
      num::f2u(f.y) != num::f2u(num::e4m3_decode(static_cast<uint8_t>(x >> 8)))) {
    atomicAdd(mismatches, 1ull);
    atomicMin(first, x);
  }
}

class FastNumericsGpu : public GpuTest {};

TEST_F(FastNumericsGpu, HardwareE4m3EqualsSoftwareOnEveryFiniteFloat) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(run_sweep(
      [](unsigned long long* cnt, uint32_t* first) { e4m3_exhaustive_kernel<<<2048, 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching bit pattern 0x" << std::hex << r.first
                                << " (rebuild with -DDSV41KV_CUDA_SOFT_FP8=1 to use the software encoder)";
}

TEST_F(FastNumericsGpu, HardwareE4m3DecodeEqualsSoftwareOnEveryFiniteByte) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(
      run_sweep([](unsigned long long* cnt, uint32_t* first) { e4m3_decode_kernel<<<1, 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching byte 0x" << std::hex << r.first;
}

TEST_F(FastNumericsGpu, HardwareE4m3PairDecodeEqualsSoftwareOnEveryFinitePair) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(
      run_sweep([](unsigned long long* cnt, uint32_t* first) { e4m3x2_decode_kernel<<<256, 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching pair 0x" << std::hex << r.first;
}

TEST_F(FastNumericsGpu, E2m1PackedBf16DecisionsEqualScalarOnEveryPair) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(run_sweep(
      [](unsigned long long* cnt, uint32_t* first) { e2m1_bf16x2_kernel<<<dim3(256, 0x7E), 256>>>(cnt, first); },
      r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching packed word 0x" << std::hex << r.first;
}

TEST_F(FastNumericsGpu, E2m1Fp32PairDecisionsEqualScalar) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(run_sweep(
      [](unsigned long long* cnt, uint32_t* first) { e2m1_f32x2_kernel<<<dim3(256, 0x7E), 256>>>(cnt, first); },
      r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching first value bits 0x" << std::hex << r.first;
}

TEST_F(FastNumericsGpu, NvfpThresholdProductsAndNibblePackingEqualTheScalarForms) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(
      run_sweep([](unsigned long long* cnt, uint32_t* first) { nv_pack_kernel<<<64, 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first failing thread 0x" << std::hex << r.first
                                << " (bit 31: packing, else the scale byte of a threshold)";
}

TEST_F(FastNumericsGpu, E2m1WithoutDivisionEqualsDivision) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(run_sweep(
      [](unsigned long long* cnt, uint32_t* first) { e2m1_kernel<<<dim3(256, 0x7E), 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching value bits 0x" << std::hex << r.first;
}

TEST_F(FastNumericsGpu, Bf16AndExp32FormsEqualTheExactOnesOnEveryInput) {
  unsigned long long* bad;
  GPU_CHECK(cudaMalloc(&bad, 3 * sizeof *bad));
  GPU_CHECK(cudaMemset(bad, 0, 3 * sizeof *bad));
  shortcut_sweep_kernel<<<132 * 16, 256>>>(bad);
  GPU_CHECK(cudaGetLastError());
  unsigned long long n[3] = {};
  GPU_CHECK(cudaMemcpy(n, bad, sizeof n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(n[0], 0ull) << "hardware bf16x2 conversion differs from bf16_encode";
  EXPECT_EQ(n[1], 0ull) << "exp32_nonpos differs from exp32";
  EXPECT_EQ(n[2], 0ull) << "exp32_mid differs from exp32 on [-41, 0]";
  cudaFree(bad);
}

// Host versions: these need no GPU.
TEST(FastNumericsHost, E2m1WithoutDivisionEqualsDivisionNearThresholds) {
  int64_t bad = 0;
  for (int sb = 1; sb <= 0x7E; ++sb) {
    const float sd = num::e4m3_decode(static_cast<uint8_t>(sb));
    float thr[7];
    e2m1_thresholds(sd, thr);
    for (int k = 0; k < 7; ++k)
      for (int d = -2000; d <= 2000; ++d)
        for (int sign = 0; sign < 2; ++sign) {
          const float v = num::u2f((num::f2u(thr[k]) + d) | (sign ? 0x80000000u : 0u));
          if (e2m1_quotient_code(v, thr) != num::e2m1_encode(num::div_rn(v, sd))) ++bad;
        }
  }
  EXPECT_EQ(bad, 0);
}

// e2m1_raw_bf16x2 relies on every threshold of every e4m3 scale, every difference its selects
// add and every sum they form being exact in bf16 (then the bf16x2 fmas select exactly).
TEST(FastNumericsHost, E2m1SelectConstantsAreExactInBf16) {
  auto exact = [](float v) { return (num::f2u(v) & 0xFFFFu) == 0u && num::is_finite(v); };
  for (int sb = 1; sb <= 0x7E; ++sb) {
    float thr[7];
    e2m1_thresholds(num::e4m3_decode(static_cast<uint8_t>(sb)), thr);
    for (int k = 0; k < 7; ++k) {
      EXPECT_TRUE(exact(thr[k])) << "scale byte " << sb << " threshold " << k;
      EXPECT_GT(thr[k], 0.0f);
    }
    const float d40 = thr[4] - thr[0], d51 = thr[5] - thr[1], sd = thr[2] - thr[0];
    const float dh = (thr[6] - thr[4]) - sd, dhl = sd + dh;
    for (float v : {d40, d51, sd, dh, dhl}) EXPECT_TRUE(exact(v)) << "scale byte " << sb << " difference " << v;
    // the selects' sums are the thresholds themselves
    EXPECT_EQ(thr[0] + d40, thr[4]);
    EXPECT_EQ(thr[1] + d51, thr[5]);
    EXPECT_EQ(thr[4] + dhl, thr[6]);
    float back[7];
    e2m1_select_thresholds(e2m1_select_of(thr), back);
    for (int k = 0; k < 7; ++k) EXPECT_EQ(back[k], thr[k]) << "scale byte " << sb << " threshold " << k;
  }
}

// The element-wise form of e2m1_raw_bf16x2 (what builds below sm_90 and the host run), against
// the division it stands for (e2m1_encode(div_rn(v, sd))) on every finite bf16 pattern per half.
TEST(FastNumericsHost, E2m1PackedBf16FallbackEqualsScalar) {
  int64_t bad = 0;
  for (int sb = 1; sb <= 0x7E; sb += 5) {
    float thr[7];
    e2m1_thresholds(num::e4m3_decode(static_cast<uint8_t>(sb)), thr);
    const E2m1Select S = e2m1_select_bf16x2(static_cast<uint8_t>(sb));
    for (uint32_t lo = 0; lo <= 0xFFFFu; ++lo) {
      const uint32_t hi = (lo * 40503u + 7u) & 0xFFFFu;
      const float flo = num::u2f(lo << 16), fhi = num::u2f(hi << 16);
      if (!num::is_finite(flo) || !num::is_finite(fhi)) continue;
      const float sd = num::e4m3_decode(static_cast<uint8_t>(sb));
      const uint32_t want = e2m1_raw_of_codes(num::e2m1_encode(num::div_rn(flo, sd)),
                                              num::e2m1_encode(num::div_rn(fhi, sd)));
      if (e2m1_raw_bf16x2((hi << 16) | lo, S) != want) ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(FastNumericsHost, NibblePackingEqualsPerPairShifts) {
  // every code word of pair b alone (the others zero), then pseudo-random combinations
  int64_t bad = 0;
  auto check = [&](const uint32_t (&c)[4]) {
    const uint32_t swapped[4] = {c[2], c[3], c[0], c[1]};
    const uint32_t ps = pack8_per_pair(swapped);
    bad += e2m1_pack8_raw(c) != pack8_per_pair(c);
    bad += e2m1_pack8_raw(swapped, 0x2064u) != ((ps >> 16) | (ps << 16));
  };
  uint32_t zero = e2m1_raw_of_codes(0, 0);
  for (int b = 0; b < 4; ++b)
    for (uint32_t lo = 0; lo < 16; ++lo)
      for (uint32_t hi = 0; hi < 16; ++hi) {
        uint32_t c[4] = {zero, zero, zero, zero};
        c[b] = e2m1_raw_of_codes(lo, hi);
        check(c);
      }
  Rng rng(run_seed());
  for (int i = 0; i < 200000; ++i) {
    uint32_t c[4];
    for (auto& v : c)
      v = e2m1_raw_of_codes(static_cast<uint32_t>(rng.integer(0, 15)), static_cast<uint32_t>(rng.integer(0, 15)));
    check(c);
  }
  EXPECT_EQ(bad, 0);
  // host form of the decision constants: those of the fp32 thresholds (the device form,
  // mul.rn.bf16x2, is checked by FastNumericsGpu.NvfpThresholdProducts...)
  for (int sb = 1; sb <= 0x7E; ++sb) {
    float thr[7];
    e2m1_thresholds(num::e4m3_decode(static_cast<uint8_t>(sb)), thr);
    EXPECT_TRUE(select_equal(e2m1_select_bf16x2(static_cast<uint8_t>(sb)), e2m1_select_of(thr))) << "scale byte " << sb;
  }
}

}  // namespace
}  // namespace dsv41kv::test
