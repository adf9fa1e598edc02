// RoPE + quantized insert (SPEC 5.1/5.2) for every record format against expected backings built
// by calling rec::write_* directly at the expected offsets; SPEC 10.1.2 (MXFP8), 10.1.3 (NVFP4),
// 10.1.5 (plain rows); the dequantize-gather reader (SPEC 5.3, 10.1.4 style round trip).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "support/batch.hpp"
#include "support/compare.hpp"

namespace dsv41kv::test {
namespace {

// A standalone insert setup: N tokens of latents, positions, slots into a canary cache.
struct InsertCase {
  RecordFormat format;
  int ratio;
  int64_t S, num_pages, page_stride, row_stride;
  std::vector<uint16_t> latent;  // [rows, 512]
  std::vector<int64_t> positions, slots;
  std::vector<float> table;
  int64_t table_rows;
  std::vector<uint8_t> u8;
  std::vector<uint16_t> bf16;
  float sigma = 0.5f;

  bool plain_bf16() const { return format == RecordFormat::PLAIN_BF16; }
  void* base() { return plain_bf16() ? static_cast<void*>(bf16.data()) : static_cast<void*>(u8.data()); }
  size_t backing_bytes() const { return plain_bf16() ? bf16.size() * 2 : u8.size(); }

  static InsertCase make(RecordFormat f, int ratio, int64_t S, int64_t num_pages,
                         int64_t page_stride, int64_t row_stride, std::vector<int64_t> positions,
                         std::vector<int64_t> slots, Rng& rng, int64_t extra_rows = 2) {
    InsertCase c;
    c.format = f;
    c.ratio = ratio;
    c.S = S;
    c.num_pages = num_pages;
    c.page_stride = page_stride;
    c.row_stride = row_stride;
    c.positions = std::move(positions);
    c.slots = std::move(slots);
    c.latent = random_bf16((c.slots.size() + static_cast<size_t>(extra_rows)) * 512, rng);
    int64_t maxp = 0;
    for (int64_t p : c.positions) maxp = std::max(maxp, p);
    c.table_rows = maxp + 1;
    c.table = random_rope_table(c.table_rows, rng);
    if (c.plain_bf16()) c.bf16.assign(static_cast<size_t>(num_pages * page_stride), kBf16Canary);
    else c.u8.assign(static_cast<size_t>(num_pages * page_stride), kByteCanary);
    return c;
  }

  CacheView cache() {
    CacheView cv;
    cv.base = base();
    cv.format = format;
    cv.num_pages = num_pages;
    cv.states_per_page = S;
    cv.page_stride = page_stride;
    cv.row_stride = row_stride;
    cv.fp8_scale = sigma;
    return cv;
  }

  InsertArgs args() {
    InsertArgs a;
    a.ratio = ratio;
    a.latent = TensorView::contiguous(latent.data(), DType::BF16,
                                      {static_cast<int64_t>(latent.size() / 512), 512});
    a.positions = view_of(positions);
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {table_rows, 64});
    a.slots = view_of(slots);
    a.cache = cache();
    return a;
  }

  // Canary + rec::write_* for every token with slot >= 0 at a closing position.
  std::vector<uint8_t> expected() const {
    std::vector<uint8_t> exp;
    std::vector<uint16_t> expb;
    if (plain_bf16()) expb.assign(bf16.size(), kBf16Canary);
    else exp.assign(u8.size(), kByteCanary);
    void* eb = plain_bf16() ? static_cast<void*>(expb.data()) : static_cast<void*>(exp.data());
    for (size_t t = 0; t < slots.size(); ++t) {
      const int64_t p = positions[t];
      if (slots[t] < 0 || (p + 1) % ratio != 0) continue;
      write_expected(eb, format, S, page_stride, row_stride, sigma, slots[t], latent.data() + t * 512,
                     table.data(), (p / ratio) * ratio);
    }
    if (plain_bf16()) {
      exp.resize(expb.size() * 2);
      std::memcpy(exp.data(), expb.data(), exp.size());
    }
    return exp;
  }
  const uint8_t* bytes() const {
    return plain_bf16() ? reinterpret_cast<const uint8_t*>(bf16.data()) : u8.data();
  }
};

const RecordFormat kFormats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528,
                                 RecordFormat::NVFP4_288, RecordFormat::PLAIN_BF16,
                                 RecordFormat::PLAIN_FP8};

int64_t default_stride(RecordFormat f, int64_t S) {
  return CacheView::with_default_strides(nullptr, f, 1, S).page_stride;
}

// Every format, both ratios, custom page stride (larger than the default), slot -1, non-closing
// tokens with valid slots, padding rows: whole backing byte for byte.
TEST(Insert, EveryFormatMatchesDirectWriters) {
  for (RecordFormat f : kFormats) {
    for (int ratio : {1, 2}) {
      SCOPED_TRACE(std::string(record_info(f).name) + " ratio " + std::to_string(ratio));
      Rng rng(31 + static_cast<int>(f) * 3 + ratio);
      const int64_t S = 8, pages = 3;
      const bool plain = !record_info(f).packed;
      const int64_t row_stride = plain ? 512 + 32 : 512;
      const int64_t stride = plain ? S * row_stride + 48 : default_stride(f, S) + 64;
      // 14 tokens: positions 4..17, every token has a slot (insert must skip non-closing ones),
      // slot[5] = -1, plus 2 padding rows with slot -1.
      std::vector<int64_t> pos, slots;
      std::vector<int64_t> perm(static_cast<size_t>(S * pages));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      rng.shuffle(perm);
      for (int i = 0; i < 14; ++i) {
        pos.push_back(4 + i);
        slots.push_back(perm[static_cast<size_t>(i)]);
      }
      slots[5] = -1;
      pos.push_back(0);
      pos.push_back(0);
      slots.push_back(-1);
      slots.push_back(-1);
      InsertCase c = InsertCase::make(f, ratio, S, pages, stride, row_stride, pos, slots, rng);
      insert(c.args());
      const auto exp = c.expected();
      ASSERT_TRUE(bytes_equal(exp.data(), c.bytes(), exp.size(), "backing"));
      // Non-closing tokens really were not written: count written states.
      int written = 0;
      for (size_t t = 0; t < slots.size(); ++t)
        if (slots[t] >= 0 && (pos[t] + 1) % ratio == 0) ++written;
      EXPECT_EQ(written, ratio == 1 ? 13 : 6);
    }
  }
}

// SPEC 10.1.2: MXFP8 record, 64 states/page, 2 pages of stride ceil(64*528/512)*512, 12 tokens at
// positions 0..11, slot = token index except slot[3] = -1.
TEST(Insert, Mxfp8Record_10_1_2) {
  for (int ratio : {1, 2}) {
    Rng rng(40 + ratio);
    std::vector<int64_t> pos, slots;
    for (int i = 0; i < 12; ++i) {
      pos.push_back(i);
      slots.push_back(i == 3 ? -1 : i);
    }
    const int64_t stride = (64 * 528 + 511) / 512 * 512;
    InsertCase c = InsertCase::make(RecordFormat::MXFP8_528, ratio, 64, 2, stride, 512, pos, slots, rng, 0);
    insert(c.args());
    // Independent offsets: 512 value bytes at r*512, 16 scale bytes at 64*512 + r*16.
    std::vector<uint8_t> exp(c.u8.size(), kByteCanary);
    for (int t = 0; t < 12; ++t) {
      if (slots[static_cast<size_t>(t)] < 0 || (t + 1) % ratio != 0) continue;
      float x[512], y[512];
      rope_xy(c.latent.data() + t * 512, c.table.data(), (t / ratio) * ratio, x, y);
      for (int k = 0; k < 16; ++k)
        exp[static_cast<size_t>(64 * 512 + t * 16 + k)] =
            num::ue8m0_quantize_tile(y + 32 * k, 32, exp.data() + t * 512 + 32 * k);
      // MXFP8 round-trip bound (10.1.8): |dec - y| <= 16 * 2^ceil(log2(max(amax,1e-4)/448))
      for (int d = 0; d < 512; ++d) {
        const uint8_t q = c.u8[static_cast<size_t>(t * 512 + d)];
        const uint8_t s = c.u8[static_cast<size_t>(64 * 512 + t * 16 + d / 32)];
        const float dec = num::e4m3_decode(q) * num::ue8m0_scale(s);
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(y[(d / 32) * 32 + i]));
        const double bound = 16.0 * std::ldexp(1.0, num::ue8m0_exponent(amax));
        EXPECT_LE(std::fabs(dec - y[d]), bound);
      }
    }
    EXPECT_TRUE(bytes_equal(exp.data(), c.u8.data(), exp.size(), "mxfp8 backing"));
  }
}

// SPEC 10.1.3: NVFP4 record: scale bytes exact, each decoded value within one scale of the rotated
// value, untouched bytes exact.
TEST(Insert, Nvfp4Record_10_1_3) {
  Rng rng(50);
  std::vector<int64_t> pos, slots;
  for (int i = 0; i < 12; ++i) {
    pos.push_back(i);
    slots.push_back(i == 3 ? -1 : i);
  }
  const int64_t stride = (64 * 288 + 511) / 512 * 512;
  InsertCase c = InsertCase::make(RecordFormat::NVFP4_288, 1, 64, 2, stride, 512, pos, slots, rng, 0);
  insert(c.args());
  const auto exp = c.expected();
  EXPECT_TRUE(bytes_equal(exp.data(), c.u8.data(), exp.size(), "nvfp4 backing"));
  for (int t = 0; t < 12; ++t) {
    if (t == 3) continue;
    float x[512], y[512];
    rope_xy(c.latent.data() + t * 512, c.table.data(), t, x, y);
    for (int d = 0; d < 512; ++d) {
      const float sc = num::e4m3_decode(c.u8[static_cast<size_t>(64 * 256 + t * 32 + d / 16)]);
      const float dec = num::bf16_decode(rec::read_nvfp4_288(c.u8.data(), 64, t, d));
      EXPECT_LE(std::fabs(dec - y[d]), sc) << "token " << t << " dim " << d;
    }
  }
}

// SPEC 10.1.5: plain rows, 9 tokens at positions 5..13, 4 states/page, 3 pages, page stride
// 5*512 elements pre-filled (3.0 / 165), random distinct slots with slot[2] = -1, sigma = 0.5.
TEST(Insert, PlainRows_10_1_5) {
  for (RecordFormat f : {RecordFormat::PLAIN_BF16, RecordFormat::PLAIN_FP8}) {
    for (int ratio : {1, 2}) {
      SCOPED_TRACE(std::string(record_info(f).name) + " ratio " + std::to_string(ratio));
      Rng rng(60 + ratio + 2 * static_cast<int>(f));
      std::vector<int64_t> perm(12);
      for (int i = 0; i < 12; ++i) perm[static_cast<size_t>(i)] = i;
      rng.shuffle(perm);
      std::vector<int64_t> pos, slots;
      for (int i = 0; i < 9; ++i) {
        pos.push_back(5 + i);
        slots.push_back(i == 2 ? -1 : perm[static_cast<size_t>(i)]);
      }
      InsertCase c = InsertCase::make(f, ratio, 4, 3, 5 * 512, 512, pos, slots, rng, 0);
      insert(c.args());
      const auto exp = c.expected();
      ASSERT_TRUE(bytes_equal(exp.data(), c.bytes(), exp.size(), "plain backing"));
      // Tolerances against an unfused double reference.
      for (int t = 0; t < 9; ++t) {
        if (slots[static_cast<size_t>(t)] < 0 || (pos[static_cast<size_t>(t)] + 1) % ratio != 0) continue;
        const int64_t row = (pos[static_cast<size_t>(t)] / ratio) * ratio;
        std::vector<double> ref(512);
        const uint16_t* lat = c.latent.data() + t * 512;
        for (int d = 0; d < 448; ++d) ref[static_cast<size_t>(d)] = num::bf16_decode(lat[d]);
        for (int i = 0; i < 32; ++i) {
          const double x0 = num::bf16_decode(lat[448 + 2 * i]), x1 = num::bf16_decode(lat[449 + 2 * i]);
          const double cs = c.table[static_cast<size_t>(row * 64 + i)];
          const double sn = c.table[static_cast<size_t>(row * 64 + 32 + i)];
          ref[static_cast<size_t>(448 + 2 * i)] = x0 * cs - x1 * sn;
          ref[static_cast<size_t>(449 + 2 * i)] = x1 * cs + x0 * sn;
        }
        const int64_t slot = slots[static_cast<size_t>(t)];
        const int64_t off = (slot / 4) * 5 * 512 + (slot % 4) * 512;
        if (f == RecordFormat::PLAIN_BF16) {
          const uint16_t* got = c.bf16.data() + off;
          for (int d = 0; d < 448; ++d) ASSERT_EQ(got[d], lat[d]) << "NoPE dim " << d;
          EXPECT_TRUE(bf16_close(got + 448, ref.data() + 448, 64, 0.008, 1e-6, "RoPE"));
        } else {
          std::vector<float> dec(512);
          for (int d = 0; d < 512; ++d) dec[static_cast<size_t>(d)] = num::e4m3_decode(c.u8[static_cast<size_t>(off + d)]) * 0.5f;
          EXPECT_TRUE(all_close(dec.data(), ref.data(), 512, 0.13, 1e-2, "fp8 row"));
        }
      }
    }
  }
}

// Duplicate slots among written tokens: the last token wins, independent of threads.
TEST(Insert, DuplicateSlotsLastWriterWins) {
  Rng rng(70);
  std::vector<int64_t> pos(64), slots(64);
  for (int i = 0; i < 64; ++i) {
    pos[static_cast<size_t>(i)] = i;
    slots[static_cast<size_t>(i)] = i % 5;
  }
  InsertCase c = InsertCase::make(RecordFormat::V4_584, 1, 8, 1, default_stride(RecordFormat::V4_584, 8),
                                  512, pos, slots, rng, 0);
  insert(c.args(), ExecContext{nullptr, 4});
  const auto exp = c.expected();  // serial order: last writer wins
  EXPECT_TRUE(bytes_equal(exp.data(), c.u8.data(), exp.size(), "backing"));
}

// Gather (SPEC 5.3): insert ratio 1, then gather = rec::read_* bit-exactly; rows with slot -1
// keep the -123 sentinel; invariant to the thread count.
TEST(Gather, RoundTripEveryFormat) {
  for (RecordFormat f : kFormats) {
    SCOPED_TRACE(record_info(f).name);
    Rng rng(80 + static_cast<int>(f));
    const int64_t S = 16, pages = 4;
    const bool plain = !record_info(f).packed;
    const int64_t row_stride = plain ? 512 + 16 : 512;
    const int64_t stride = plain ? S * row_stride + 32 : default_stride(f, S);
    std::vector<int64_t> pos, slots;
    for (int i = 0; i < S * pages; ++i) {
      pos.push_back(i);
      slots.push_back(i % 7 == 3 ? -1 : (i * 37) % (S * pages));
    }
    InsertCase c = InsertCase::make(f, 1, S, pages, stride, row_stride, pos, slots, rng, 0);
    insert(c.args());
    // gather: M = 70 rows, some -1, out row stride 520
    const int64_t M = 70, ostride = 520;
    std::vector<int64_t> gslots(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) gslots[static_cast<size_t>(i)] = (i % 9 == 4) ? -1 : (i * 13) % (S * pages);
    CanaryBuffer<uint16_t> out(static_cast<size_t>(M * ostride), kBf16Sentinel);
    GatherArgs g;
    g.cache = c.cache();
    g.slots = view_of(gslots);
    g.out = out.view({M, 512}, {ostride, 1});
    gather(g, ExecContext{nullptr, 1});
    std::vector<uint16_t> exp(out.size(), kBf16Sentinel);
    for (int64_t i = 0; i < M; ++i) {
      const int64_t s = gslots[static_cast<size_t>(i)];
      if (s < 0) continue;
      const int64_t page = s / S, off = s % S;
      for (int d = 0; d < 512; ++d) {
        uint16_t v = 0;
        switch (f) {
          case RecordFormat::V4_584: v = rec::read_v4_584(c.u8.data() + page * stride, S, off, d); break;
          case RecordFormat::MXFP8_528: v = rec::read_mxfp8_528(c.u8.data() + page * stride, S, off, d); break;
          case RecordFormat::NVFP4_288: v = rec::read_nvfp4_288(c.u8.data() + page * stride, S, off, d); break;
          case RecordFormat::PLAIN_BF16: v = c.bf16[static_cast<size_t>(page * stride + off * row_stride + d)]; break;
          case RecordFormat::PLAIN_FP8:
            v = rec::read_plain_fp8(c.u8.data() + page * stride + off * row_stride, d, c.sigma);
            break;
        }
        exp[static_cast<size_t>(i * ostride + d)] = v;
      }
    }
    ASSERT_TRUE(bits_equal(exp, out.vec(), "gather output"));
    CanaryBuffer<uint16_t> out4(out.size(), kBf16Sentinel);
    g.out = out4.view({M, 512}, {ostride, 1});
    gather(g, ExecContext{nullptr, 4});
    EXPECT_TRUE(bits_equal(out.vec(), out4.vec(), "gather, 4 threads"));
    // 584 NoPE round trip of bf16 latents is within the UE8M0/e4m3 step; bf16 rows are exact.
    if (f == RecordFormat::PLAIN_BF16) {
      for (int64_t i = 0; i < M; ++i) {
        const int64_t s = gslots[static_cast<size_t>(i)];
        if (s < 0) continue;
        // find the token that wrote s last (slots are a permutation except -1 rows)
        for (size_t t = 0; t < slots.size(); ++t) {
          if (slots[t] != s) continue;
          for (int d = 0; d < 448; ++d)
            ASSERT_EQ(out[static_cast<size_t>(i * ostride + d)], c.latent[t * 512 + static_cast<size_t>(d)]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test
