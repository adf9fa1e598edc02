// Record layout tests (SPEC 3.3, 3.6, 5.2, 5.3): static layouts, default page strides, and a
// write/read round trip of every per-state writer into a canary-filled page buffer with a
// non-default page stride. The expected bytes come from the binary64 references of
// reference.hpp; the whole backing is compared byte for byte (SPEC 10.2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "formats/insert.hpp"
#include "formats/reference.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"

using namespace dsv41kv;
namespace ref = dsv41kv::test::ref;
using dsv41kv::test::bits_equal;
using dsv41kv::test::kBf16Canary;
using dsv41kv::test::kByteCanary;

// ============================================================================ static layouts

TEST(RecordLayout, OffsetsAndSizes) {
  EXPECT_EQ(V4Layout::kRecordBytes, 584);
  EXPECT_EQ(V4Layout::value_offset(32, 5), 5 * 576);
  EXPECT_EQ(V4Layout::scale_offset(32, 5), 32 * 576 + 5 * 8);
  EXPECT_EQ(Mxfp8Layout::value_offset(64, 3), 3 * 512);
  EXPECT_EQ(Mxfp8Layout::scale_offset(64, 3), 64 * 512 + 3 * 16);
  EXPECT_EQ(Nvfp4Layout::value_offset(64, 7), 7 * 256);
  EXPECT_EQ(Nvfp4Layout::scale_offset(64, 7), 64 * 256 + 7 * 32);
  EXPECT_EQ(V4Layout::payload_bytes(16), 16 * 584);

  struct Want { RecordFormat f; const char* name; bool packed; int vb, sb, rb, align; DType el; };
  for (const Want& w : {Want{RecordFormat::V4_584, "v4_584", true, 576, 8, 584, 576, DType::U8},
                        Want{RecordFormat::MXFP8_528, "mxfp8_528", true, 512, 16, 528, 512, DType::U8},
                        Want{RecordFormat::NVFP4_288, "nvfp4_288", true, 256, 32, 288, 512, DType::U8},
                        Want{RecordFormat::PLAIN_BF16, "bf16", false, 0, 0, 1024, 1, DType::BF16},
                        Want{RecordFormat::PLAIN_FP8, "fp8", false, 0, 0, 512, 1, DType::U8}}) {
    const RecordInfo& ri = record_info(w.f);
    EXPECT_EQ(ri.format, w.f);
    EXPECT_STREQ(ri.name, w.name);
    EXPECT_EQ(ri.packed, w.packed);
    EXPECT_EQ(ri.value_bytes, w.vb) << w.name;
    EXPECT_EQ(ri.scale_bytes, w.sb) << w.name;
    EXPECT_EQ(ri.record_bytes, w.rb) << w.name;
    EXPECT_EQ(ri.page_align, w.align) << w.name;
    EXPECT_EQ(ri.element, w.el) << w.name;
    EXPECT_EQ(parse_record_format(w.name), w.f);
  }
  EXPECT_EQ(parse_record_format("584"), RecordFormat::V4_584);
  EXPECT_EQ(parse_record_format("528"), RecordFormat::MXFP8_528);
  EXPECT_EQ(parse_record_format("288"), RecordFormat::NVFP4_288);
  try {
    parse_record_format("fp4");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'fp4'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(record_info(static_cast<RecordFormat>(9)), Error);
}

TEST(RecordLayout, DefaultPageStridesOfSpec36) {
  struct Want { RecordFormat f; int64_t S, stride; };
  for (const Want& w : {Want{RecordFormat::V4_584, 32, 19008}, Want{RecordFormat::V4_584, 64, 37440},
                        Want{RecordFormat::MXFP8_528, 64, 33792},
                        Want{RecordFormat::MXFP8_528, 32, 16896},
                        Want{RecordFormat::NVFP4_288, 64, 18432},
                        Want{RecordFormat::NVFP4_288, 32, 9216},
                        // SPEC 10.1: reference test page strides ceil(S*584/576)*576 etc.
                        Want{RecordFormat::V4_584, 256, 256 * 584 / 576 * 576 + 576},
                        Want{RecordFormat::V4_584, 16, 9792},
                        Want{RecordFormat::PLAIN_BF16, 4, 4 * 512},
                        Want{RecordFormat::PLAIN_FP8, 16, 16 * 512}}) {
    const CacheView c = CacheView::with_default_strides(nullptr, w.f, 3, w.S);
    EXPECT_EQ(c.page_stride, w.stride) << record_info(w.f).name << " S=" << w.S;
    EXPECT_EQ(c.backing_elements(), 3 * w.stride);
    EXPECT_EQ(c.row_stride, 512);
  }
  // indexer-K FP8 pages (132 B/state, 576 alignment)
  EXPECT_EQ(round_up(64 * 132, 576), 8640);
  EXPECT_EQ(round_up(32 * 132, 576), 4608);
  EXPECT_EQ(CacheView::with_default_strides(nullptr, RecordFormat::PLAIN_BF16, 3, 4).backing_bytes(),
            3u * 4 * 512 * 2);
}

TEST(RecordLayout, ValidateCacheNamesTheArgument) {
  std::vector<uint8_t> buf(100000);
  CacheView c = CacheView::with_default_strides(buf.data(), RecordFormat::V4_584, 2, 16);
  EXPECT_NO_THROW(validate_cache(c, "cache"));
  c.page_stride = 16 * 584 - 1;
  try {
    validate_cache(c, "cache");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cache: page_stride = 9343"), std::string::npos) << e.what();
  }
  c.page_stride = 16 * 584;  // payload exactly: allowed (need not be aligned)
  EXPECT_NO_THROW(validate_cache(c, "cache"));
  CacheView p = CacheView::with_default_strides(buf.data(), RecordFormat::PLAIN_FP8, 2, 4);
  p.row_stride = 500;
  EXPECT_THROW(validate_cache(p, "cache"), Error);
  p.row_stride = 520;
  p.page_stride = 3 * 520 + 512;  // payload (S-1)*row_stride + 512
  EXPECT_NO_THROW(validate_cache(p, "cache"));
  p.fp8_scale = 0.0f;
  EXPECT_THROW(validate_cache(p, "cache"), Error);
  // sizes whose products overflow int64 (the page stride check alone would wrap and pass)
  CacheView big = CacheView::with_default_strides(buf.data(), RecordFormat::V4_584, 2, 16);
  big.states_per_page = int64_t{1} << 61;  // payload 2^61 * 584 wraps
  big.page_stride = int64_t{1} << 62;
  EXPECT_THROW(validate_cache(big, "cache"), Error);
  big = CacheView::with_default_strides(buf.data(), RecordFormat::V4_584, 2, 16);
  big.num_pages = int64_t{1} << 52;  // num_pages * page_stride beyond 2^62
  try {
    validate_cache(big, "cache");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("span more than 2^62 bytes"), std::string::npos) << e.what();
  }
  CacheView rows = CacheView::with_default_strides(buf.data(), RecordFormat::PLAIN_BF16, 2, 4);
  rows.row_stride = int64_t{1} << 62;
  rows.page_stride = int64_t{1} << 62;
  EXPECT_THROW(validate_cache(rows, "cache"), Error);
}

// ============================================================================ round trips

namespace {


// A latent row: 512 bf16-exact values with a different magnitude per 64-dim tile (incl. a
// zero tile, a tile with -0, tiny and huge tiles), and its rotated twin y (RoPE on 448..511).
struct Latent {
  float x[512];
  float y[512];
};

Latent make_latent(std::mt19937& rng, int variant) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 12);
  std::uniform_real_distribution<double> ang(-3.2, 3.2);
  Latent l{};
  for (int t = 0; t < 16; ++t) {  // 16 tiles of 32 (every 584 tile spans two)
    const float scale = std::ldexp(1.0f, expo(rng));
    for (int i = 0; i < 32; ++i) l.x[32 * t + i] = num::bf16_round(nd(rng) * scale);
  }
  if (variant % 3 == 0)
    for (int i = 64; i < 128; ++i) l.x[i] = 0.0f;  // zero NoPE tile (UE8M0 floor, byte 105)
  if (variant % 3 == 1) {
    for (int i = 128; i < 192; ++i) l.x[i] = (i % 2) ? -0.0f : 0.0f;
    l.x[0] = num::bf16_round(448.0f * 1024.0f);  // exact e4m3-max boundary amax
  }
  if (variant % 4 == 2)
    for (int i = 200; i < 216; ++i) l.x[i] = num::bf16_round(std::ldexp(1.0f, -120) * (i - 207));
  for (int d = 0; d < 448; ++d) l.y[d] = l.x[d];
  for (int i = 0; i < 32; ++i) {
    const double a = ang(rng);
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    num::rope_forward(l.x[448 + 2 * i], l.x[448 + 2 * i + 1], c, s, l.y[448 + 2 * i],
                      l.y[448 + 2 * i + 1]);
  }
  return l;
}

struct Slot {
  int64_t page, r;
};

// Expected bytes of one record written at (page base, r), from the references.
void expect_v4(uint8_t* page, int64_t S, int64_t r, const Latent& l) {
  uint8_t* val = page + r * 576;
  uint8_t* sc = page + S * 576 + r * 8;
  for (int k = 0; k < 7; ++k) sc[k] = ref::ue8m0_tile(l.x + 64 * k, 64, val + 64 * k);
  for (int i = 0; i < 64; ++i) {
    const uint16_t b = ref::bf16(l.y[448 + i]);
    val[448 + 2 * i] = static_cast<uint8_t>(b & 0xFF);
    val[448 + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  sc[7] = 0;
}
void expect_mxfp8(uint8_t* page, int64_t S, int64_t r, const Latent& l) {
  for (int k = 0; k < 16; ++k)
    page[S * 512 + r * 16 + k] = ref::ue8m0_tile(l.y + 32 * k, 32, page + r * 512 + 32 * k);
}
void expect_nvfp4(uint8_t* page, int64_t S, int64_t r, const Latent& l) {
  for (int k = 0; k < 32; ++k)
    page[S * 256 + r * 32 + k] = ref::nvfp4_tile(l.y + 16 * k, page + r * 256 + 8 * k);
}

// within one quantization step of the UE8M0 scale `s` (e4m3: 3 mantissa bits)
void check_ue8m0_step(double dec, double v, uint8_t s, int d) {
  const double step = std::max(std::fabs(v) / 8, std::ldexp(1.0, s - 127 - 9));
  EXPECT_LE(std::fabs(dec - v), step) << "dim " << d;
}

const std::vector<Slot> kSlots = {{1, 5}, {2, 0}, {0, 15}, {1, 6}, {2, 15}};
constexpr int64_t kS = 16;
constexpr int64_t kPages = 3;

}  // namespace

TEST(RecordRoundTrip, V4_584) {
  const int64_t stride = V4Layout::default_page_stride(kS) + 1000 + 3;  // non-default, unaligned
  std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
  std::mt19937 rng(21);
  for (size_t i = 0; i < kSlots.size(); ++i) {
    const Latent l = make_latent(rng, static_cast<int>(i));
    const Slot sl = kSlots[i];
    uint8_t* page = buf.data() + sl.page * stride;
    rec::write_v4_584(page, kS, sl.r, l.x, l.y);
    expect_v4(want.data() + sl.page * stride, kS, sl.r, l);
    EXPECT_TRUE(bits_equal(want, buf, "584 backing"));
    EXPECT_EQ(page[kS * 576 + sl.r * 8 + 7], 0);
    for (int d = 0; d < 512; ++d) {
      const uint16_t got = rec::read_v4_584(page, kS, sl.r, d);
      if (d >= 448) {
        EXPECT_EQ(got, ref::bf16(l.y[d])) << "RoPE dim " << d;  // stored bf16, exact
        continue;
      }
      const uint8_t q = page[sl.r * 576 + d], s = page[kS * 576 + sl.r * 8 + d / 64];
      const double exact = ref::e4m3_value(q) * std::ldexp(1.0, s - 127);
      EXPECT_EQ(static_cast<double>(num::bf16_decode(got)), exact) << "dim " << d;  // exact dequant
      check_ue8m0_step(exact, l.x[d], s, d);
    }
  }
}

TEST(RecordRoundTrip, Mxfp8_528) {
  const int64_t stride = Mxfp8Layout::default_page_stride(kS) + 517;
  std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
  std::mt19937 rng(22);
  for (size_t i = 0; i < kSlots.size(); ++i) {
    const Latent l = make_latent(rng, static_cast<int>(i));
    const Slot sl = kSlots[i];
    uint8_t* page = buf.data() + sl.page * stride;
    rec::write_mxfp8_528(page, kS, sl.r, l.y);
    expect_mxfp8(want.data() + sl.page * stride, kS, sl.r, l);
    EXPECT_TRUE(bits_equal(want, buf, "528 backing"));
    for (int d = 0; d < 512; ++d) {
      const uint16_t got = rec::read_mxfp8_528(page, kS, sl.r, d);
      const uint8_t q = page[sl.r * 512 + d], s = page[kS * 512 + sl.r * 16 + d / 32];
      const double exact = ref::e4m3_value(q) * std::ldexp(1.0, s - 127);
      EXPECT_EQ(static_cast<double>(num::bf16_decode(got)), exact) << "dim " << d;
      check_ue8m0_step(exact, l.y[d], s, d);
    }
  }
}

TEST(RecordRoundTrip, Nvfp4_288) {
  const int64_t stride = Nvfp4Layout::default_page_stride(kS) + 77;
  std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
  std::mt19937 rng(23);
  for (size_t i = 0; i < kSlots.size(); ++i) {
    const Latent l = make_latent(rng, static_cast<int>(i));
    const Slot sl = kSlots[i];
    uint8_t* page = buf.data() + sl.page * stride;
    rec::write_nvfp4_288(page, kS, sl.r, l.y);
    expect_nvfp4(want.data() + sl.page * stride, kS, sl.r, l);
    EXPECT_TRUE(bits_equal(want, buf, "288 backing"));
    for (int d = 0; d < 512; ++d) {
      const uint16_t got = rec::read_nvfp4_288(page, kS, sl.r, d);
      const uint8_t b = page[sl.r * 256 + d / 2];
      const uint8_t nib = (d & 1) ? (b >> 4) : (b & 0xF);
      const double sd = ref::e4m3_value(page[kS * 256 + sl.r * 32 + d / 16]);
      const double exact = ref::e2m1_value(nib) * sd;
      EXPECT_EQ(static_cast<double>(num::bf16_decode(got)), exact) << "dim " << d;
      // within one scale (SPEC 10.1.3) where the tile's e4m3 scale is normal and unclamped
      double amax = 0;
      for (int i = d / 16 * 16; i < d / 16 * 16 + 16; ++i)
        amax = std::max(amax, std::fabs(static_cast<double>(l.y[i])));
      if (amax <= 6.0 * 448.0 && amax >= 6.0 * std::ldexp(1.0, -6)) {
        EXPECT_LE(std::fabs(exact - l.y[d]), sd) << "dim " << d;
      }
    }
  }
}

TEST(RecordRoundTrip, PoisonedTilesStayInsideTheRecord) {
  std::mt19937 rng(24);
  Latent l = make_latent(rng, 0);
  l.x[70] = std::numeric_limits<float>::quiet_NaN();  // NoPE tile 1 (584), tile 2 (528)
  l.y[70] = l.x[70];
  l.y[460] = std::numeric_limits<float>::infinity();  // RoPE dim: 584 stores bf16 Inf
  {
    const int64_t stride = V4Layout::default_page_stride(kS) + 8;
    std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
    rec::write_v4_584(buf.data() + stride, kS, 3, l.x, l.y);
    expect_v4(want.data() + stride, kS, 3, l);
    EXPECT_TRUE(bits_equal(want, buf, "584 poisoned"));
    uint8_t* page = buf.data() + stride;
    EXPECT_EQ(page[kS * 576 + 3 * 8 + 1], 255);
    for (int d = 64; d < 128; ++d) EXPECT_EQ(page[3 * 576 + d], 0x7F);
    EXPECT_EQ(rec::read_v4_584(page, kS, 3, 460), 0x7F80);
    EXPECT_EQ(rec::read_v4_584(page, kS, 3, 70), 0x7FC0);
  }
  {
    const int64_t stride = Mxfp8Layout::default_page_stride(kS);
    std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
    rec::write_mxfp8_528(buf.data(), kS, 0, l.y);
    expect_mxfp8(want.data(), kS, 0, l);
    EXPECT_TRUE(bits_equal(want, buf, "528 poisoned"));
    EXPECT_EQ(buf[kS * 512 + 2], 255);
    EXPECT_EQ(buf[kS * 512 + 14], 255);
  }
  {
    const int64_t stride = Nvfp4Layout::default_page_stride(kS);
    std::vector<uint8_t> buf(static_cast<size_t>(kPages * stride), kByteCanary), want = buf;
    rec::write_nvfp4_288(buf.data() + 2 * stride, kS, kS - 1, l.y);
    expect_nvfp4(want.data() + 2 * stride, kS, kS - 1, l);
    EXPECT_TRUE(bits_equal(want, buf, "288 poisoned"));
    EXPECT_EQ(buf[2 * stride + kS * 256 + (kS - 1) * 32 + 4], 0x7F);
    EXPECT_EQ(buf[2 * stride + kS * 256 + (kS - 1) * 32 + 28], 0x7F);
  }
}

TEST(RecordRoundTrip, PlainBf16Rows) {
  const int64_t row_stride = 520, page_stride = kS * row_stride + 24;  // elements
  std::vector<uint16_t> buf(static_cast<size_t>(kPages * page_stride), kBf16Canary), want = buf;
  std::mt19937 rng(25);
  for (size_t i = 0; i < kSlots.size(); ++i) {
    const Latent l = make_latent(rng, static_cast<int>(i));
    const Slot sl = kSlots[i];
    const int64_t off = sl.page * page_stride + sl.r * row_stride;
    rec::write_plain_bf16(buf.data() + off, l.y);
    for (int d = 0; d < 512; ++d) want[static_cast<size_t>(off + d)] = ref::bf16(l.y[d]);
    ASSERT_EQ(buf, want) << "slot " << i;
    for (int d = 0; d < 448; ++d)  // NoPE dims equal the (bf16-exact) latent
      EXPECT_EQ(num::bf16_decode(buf[static_cast<size_t>(off + d)]), l.x[d]);
  }
}

TEST(RecordRoundTrip, PlainFp8Rows) {
  const int64_t row_stride = 515, page_stride = kS * row_stride + 100;
  std::vector<uint8_t> buf(static_cast<size_t>(kPages * page_stride), kByteCanary), want = buf;
  std::mt19937 rng(26);
  std::normal_distribution<float> nd(0.0f, 40.0f);
  for (float sigma : {0.5f, 3.0f, 0.01f}) {
    const float inv = 1.0f / sigma;
    for (size_t i = 0; i < kSlots.size(); ++i) {
      float y[512];
      for (float& v : y) v = nd(rng);
      y[7] = 1e6f;   // saturates
      y[8] = -1e6f;
      y[9] = -0.0f;
      const Slot sl = kSlots[i];
      const int64_t off = sl.page * page_stride + sl.r * row_stride;
      rec::write_plain_fp8(buf.data() + off, y, inv);
      for (int d = 0; d < 512; ++d) {
        float v = ref::mul(num::bf16_decode(ref::bf16(y[d])), inv);
        v = std::clamp(v, -448.0f, 448.0f);
        want[static_cast<size_t>(off + d)] = ref::e4m3(v);
      }
      ASSERT_EQ(buf, want) << "sigma " << sigma << " slot " << i;
      for (int d = 0; d < 512; ++d) {
        const double dec = num::bf16_decode(rec::read_plain_fp8(buf.data() + off, d, sigma));
        const double e = ref::e4m3_value(buf[static_cast<size_t>(off + d)]) * sigma;
        EXPECT_EQ(dec, static_cast<double>(num::bf16_decode(ref::bf16(static_cast<float>(e)))));
        if (std::fabs(y[d]) * inv < 448.0f) {
          EXPECT_LE(std::fabs(dec - y[d]),
                    std::max(std::fabs(static_cast<double>(y[d])) / 8, sigma * std::ldexp(1.0, -9)))
              << "dim " << d;
        }
      }
    }
  }
  EXPECT_EQ(rec::plain_fp8_encode(std::numeric_limits<float>::quiet_NaN(), 2.0f), 0x7F);
  EXPECT_EQ(rec::plain_fp8_encode(-std::numeric_limits<float>::infinity(), 2.0f), 0xFE);
}

// ============================================================================ read_state_f32

// read_state_f32 in `form` equals the widened bf16 of read_state bit for bit, on every value code
// with every scale byte of each format (the UE8M0 bytes below 20 and 255 and the NaN NVFP4 scales
// included), and on plain rows.
static void expect_f32_reader_on_every_code_and_scale(dsv41kv::detail::CpuForm form) {
  auto expect_state = [form](const CacheView& c, int64_t slot, const char* what, int scale) {
    uint16_t bf[512];
    float f[512];
    dsv41kv::detail::read_state(c, slot, bf);
    dsv41kv::detail::read_state_f32(c, slot, f, form);
    for (int d = 0; d < 512; ++d)
      ASSERT_EQ(num::f2u(f[d]), num::f2u(num::bf16_decode(bf[d]))) << what << " scale byte " << scale << " dim " << d;
  };
  // one state per page; its values run through every code (584: 448 e4m3 values, 528: 512, 288:
  // 512 nibbles), every tile with the same scale byte; the 584 RoPE dims hold bf16 codes
  std::vector<uint8_t> page(1024, 0);
  for (int s = 0; s < 256; ++s) {
    const auto sb = static_cast<uint8_t>(s);
    CacheView c = CacheView::with_default_strides(page.data(), RecordFormat::V4_584, 1, 1);
    for (int d = 0; d < 448; ++d) page[static_cast<size_t>(d)] = static_cast<uint8_t>(d + s);
    for (int i = 0; i < 128; ++i) page[static_cast<size_t>(448 + i)] = static_cast<uint8_t>(i * 37 + s);
    for (int k = 0; k < 7; ++k) page[static_cast<size_t>(576 + k)] = sb;
    expect_state(c, 0, "v4_584", s);
    c = CacheView::with_default_strides(page.data(), RecordFormat::MXFP8_528, 1, 1);
    for (int d = 0; d < 512; ++d) page[static_cast<size_t>(d)] = static_cast<uint8_t>(d + s);
    for (int k = 0; k < 16; ++k) page[static_cast<size_t>(512 + k)] = sb;
    expect_state(c, 0, "mxfp8_528", s);
    c = CacheView::with_default_strides(page.data(), RecordFormat::NVFP4_288, 1, 1);
    for (int j = 0; j < 256; ++j) page[static_cast<size_t>(j)] = static_cast<uint8_t>(j * 17 + s);
    for (int k = 0; k < 32; ++k) page[static_cast<size_t>(256 + k)] = sb;
    expect_state(c, 0, "nvfp4_288", s);
  }
  for (float sigma : {1.0f, 0.0625f, 3.3f, 1e-30f}) {
    CacheView c = CacheView::with_default_strides(page.data(), RecordFormat::PLAIN_FP8, 1, 1);
    c.fp8_scale = sigma;
    for (int d = 0; d < 512; ++d) page[static_cast<size_t>(d)] = static_cast<uint8_t>(d);
    expect_state(c, 0, "fp8", 0);
  }
  std::vector<uint16_t> row(512);
  for (int d = 0; d < 512; ++d) row[static_cast<size_t>(d)] = static_cast<uint16_t>(d * 131 + 7);
  expect_state(CacheView::with_default_strides(row.data(), RecordFormat::PLAIN_BF16, 1, 1), 0, "bf16", 0);
}

TEST(ReadStateF32, EqualsTheWidenedReaderOnEveryCodeAndScale) {
  expect_f32_reader_on_every_code_and_scale(dsv41kv::detail::CpuForm::kPortable);
}

// The AVX-512 form (584 and 528 records 16 values at a time, taken where the CPU has AVX-512).
TEST(ReadStateF32, Avx512FormEqualsTheWidenedReaderOnEveryCodeAndScale) {
  if (!dsv41kv::detail::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the portable form runs here";
  expect_f32_reader_on_every_code_and_scale(dsv41kv::detail::CpuForm::kAvx512);
}
