// The conformance module (SPEC 10.3, shared/conformance/README.md): the library's runner on the
// shipped write-path files, the element rule of the README (element_agrees) on the situations it
// must admit and reject, and the decoding the record checks use.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/paths.hpp"

namespace dsv41kv::test {
namespace {

using conformance::element_agrees;
using conformance::kLatentAtol;
using conformance::kLatentRtol;

double bf16(uint16_t code) { return num::bf16_decode(code); }

// ---------------------------------------------------------------- the shipped files

std::string shipped(const char* name) { return conformance_dir() + "/" + name; }

// Every case and check of one shipped file passes, and what the README only asks to report stays
// as good as the reference implementations make it.
void expect_file_agrees(const char* name) {
  const std::string path = shipped(name);
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no conformance file " << path;
  const conformance::FileResult r = conformance::run_file(path);
  ASSERT_EQ(r.cases.size(), 8u) << name;
  EXPECT_EQ(r.checks(), 48);
  EXPECT_EQ(r.failed(), 0) << name;
  int64_t differing = 0, elements = 0;
  for (const auto& c : r.cases) {
    SCOPED_TRACE(std::string(name) + " " + c.name);
    EXPECT_TRUE(c.pass());
    EXPECT_TRUE(c.error.empty()) << c.error;
    const conformance::LatentCheck& l = c.latent;
    EXPECT_TRUE(l.pass) << l.detail;
    EXPECT_TRUE(l.ring_pass) << l.detail;
    EXPECT_EQ(l.touched_nan_rows, 0) << l.detail;
    EXPECT_EQ(l.bad_elements, 0) << l.detail;
    EXPECT_GT(l.written_rows, 0);
    EXPECT_LT(l.written_rows, l.rows) << "every case has rows the step must leave NaN";
    EXPECT_LE(l.max_ulp, 1);
    differing += l.differing_elements;
    elements += l.written_rows * kLatentDim;
    ASSERT_EQ(c.formats.size(), static_cast<size_t>(kNumRecordFormats));
    for (int i = 0; i < kNumRecordFormats; ++i) {
      const conformance::FormatCheck& fc = c.formats[static_cast<size_t>(i)];
      SCOPED_TRACE(record_info(fc.format).name);
      EXPECT_EQ(fc.format, static_cast<RecordFormat>(i));
      EXPECT_TRUE(fc.pass) << fc.detail;
      EXPECT_TRUE(fc.from_reference_identical) << fc.from_reference_diff_bytes << " bytes differ: " << fc.detail;
      EXPECT_EQ(fc.from_reference_diff_bytes, 0);
      EXPECT_EQ(fc.stray_bytes, 0) << fc.detail;
      EXPECT_EQ(fc.beyond_tolerance, 0) << fc.detail;
      EXPECT_GT(fc.records, 0);
      EXPECT_GE(fc.identical * 100, fc.records * 95) << fc.identical << "/" << fc.records << " byte-identical";
    }
  }
  // The reference's approximate exp/rsqrt/division moves a bf16 rounding only near a midpoint:
  // latents that differ often (though each within the rule) mean a systematic error.
  EXPECT_LE(differing * 1000, elements) << differing << " of " << elements << " latent elements differ";
  ::testing::Test::RecordProperty(std::string("latent_elements_differing_") + name,
                                  std::to_string(differing) + "/" + std::to_string(elements));
}

TEST(Conformance, Ratio1FileAgrees) { expect_file_agrees("compress_r1_shared.safetensors"); }
TEST(Conformance, Ratio2FileAgrees) { expect_file_agrees("compress_r2_shared.safetensors"); }

// The runner lays the caches out as the file's metadata says; the library's default packed page
// strides (record_info().page_align) must give the same layout, or a caller using the defaults
// would not share pages with vLLM.
TEST(Conformance, DefaultPackedPageStridesMatchTheFiles) {
  int files = 0;
  for (const char* name : {"compress_r1_shared.safetensors", "compress_r2_shared.safetensors"}) {
    const std::string path = shipped(name);
    if (!std::filesystem::exists(path)) continue;
    ++files;
    const st::SafetensorsFile f = st::SafetensorsFile::load(path);
    const auto meta = nlohmann::json::parse(f.metadata("dsv41"));
    const int64_t S = meta.at("states_per_page");
    for (size_t ci = 0; ci < meta.at("cases").size(); ++ci) {
      const int64_t pages = meta.at("cases")[ci].at("num_pages");
      for (RecordFormat fm : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::NVFP4_288}) {
        const std::string t = "c" + std::to_string(ci) + ".cache_" + record_info(fm).name;
        ASSERT_EQ(f.info(t).shape.size(), 1u) << t;
        EXPECT_EQ(f.info(t).shape[0], pages * CacheView::with_default_strides(nullptr, fm, 1, S).page_stride)
            << name << " " << t;
      }
    }
  }
  if (files == 0) GTEST_SKIP() << "no conformance files under " << conformance_dir();
}

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

// ---------------------------------------------------------------- decode_with_step

TEST(Conformance, DecodeWithStep) {
  // plain bf16 row: value 1.5 (0x3FC0), step 2^-7
  uint8_t row[1024] = {};
  row[0] = 0xC0;
  row[1] = 0x3F;
  auto v = rec::decode_with_step(RecordFormat::PLAIN_BF16, row, 1, 0, 0, 1.0f);
  EXPECT_EQ(v.value, 1.5);
  EXPECT_EQ(v.step, 1.0 / 128);
  // plain fp8: e4m3 0x38 = 1.0, step 1/8, scaled by sigma
  row[3] = 0x38;
  v = rec::decode_with_step(RecordFormat::PLAIN_FP8, row, 1, 0, 3, 2.0f);
  EXPECT_EQ(v.value, 2.0);
  EXPECT_EQ(v.step, 0.25);
  // 528: value byte 0x40 (= 2.0) with UE8M0 scale 2^-3 (byte 124) in tile 0
  std::vector<uint8_t> page(2 * 528, 0);
  page[0] = 0x40;
  page[2 * 512] = 124;
  v = rec::decode_with_step(RecordFormat::MXFP8_528, page.data(), 2, 0, 0, 1.0f);
  EXPECT_EQ(v.value, 0.25);
  EXPECT_EQ(v.step, 0.25 / 8);
  // 288: nibble 7 (= 6) with e4m3 scale 0x38 (= 1.0): step 2
  std::vector<uint8_t> p4(288, 0);
  p4[0] = 0x70;  // dim 1 = nibble 7, dim 0 = 0
  p4[256] = 0x38;
  v = rec::decode_with_step(RecordFormat::NVFP4_288, p4.data(), 1, 0, 1, 1.0f);
  EXPECT_EQ(v.value, 6.0);
  EXPECT_EQ(v.step, 2.0);
}

}  // namespace
}  // namespace dsv41kv::test
