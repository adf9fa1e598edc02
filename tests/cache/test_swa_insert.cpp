// The SWA insert fused with the query RoPE (SPEC 5.4, 9.2): every SWA record format, the plain and
// the YaRN table, padded and unpadded heads, strided queries, in place, thread counts, non-finite
// queries; each against a literal evaluation of the SPEC in canary-filled backings compared whole.
// Then every bad argument: its error message and untouched outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dsv41kv/cache.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/rope.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

constexpr ErrorCode E8 = ErrorCode::kInvalidArgument;
constexpr uint16_t kQCanary = 0x7F81;  // a NaN payload no op produces (bf16_encode gives 0x7FC0)

std::string fmt_name(RecordFormat f) { return record_info(f).name; }

// SPEC 1.4 written out: y0 = fma(x0, c, -(x1 s)), y1 = fma(x1, c, x0 s), the products rounded.
void literal_rope(float x0, float x1, float c, float s, float& y0, float& y1) {
  const float p1 = x1 * s, p0 = x0 * s;
  y0 = std::fmaf(x0, c, -p1);
  y1 = std::fmaf(x1, c, p0);
}

struct SwaCase {
  RecordFormat format = RecordFormat::V4_584;
  int64_t T = 0, H = 0, H_pad = 0;
  int64_t S = 32, pages = 4, page_stride = 0, row_stride = 512;
  int64_t q_rows = 0, q_hs = 0, q_ts = 0, o_rows = 0, o_hs = 0, o_ts = 0;
  std::vector<uint16_t> kv;  // [T + 2, 512]
  std::vector<uint16_t> q;   // backing of q
  std::vector<int64_t> pos, slot;
  const float* table = nullptr;
  int64_t table_rows = 0;
  std::vector<uint8_t> u8;     // cache backing (packed, fp8)
  std::vector<uint16_t> bf16;  // cache backing (plain bf16)
  CanaryBuffer<uint16_t> q_out;
  float sigma = 0.25f;

  bool plain_bf16() const { return format == RecordFormat::PLAIN_BF16; }
  size_t q_size() const { return static_cast<size_t>((q_rows - 1) * q_ts + (H - 1) * q_hs + 512); }
  size_t o_size() const { return static_cast<size_t>((o_rows - 1) * o_ts + (H_pad - 1) * o_hs + 512); }

  CacheView cache() {
    CacheView c = CacheView::with_default_strides(
        plain_bf16() ? static_cast<void*>(bf16.data()) : static_cast<void*>(u8.data()), format, pages, S);
    c.page_stride = page_stride;
    c.row_stride = row_stride;
    c.fp8_scale = sigma;
    return c;
  }
  SwaInsertArgs args() {
    SwaInsertArgs a;
    a.kv = TensorView::contiguous(kv.data(), DType::BF16, {static_cast<int64_t>(kv.size() / 512), 512});
    a.q = TensorView::strided(q.data(), DType::BF16, {q_rows, H, 512}, {q_ts, q_hs, 1});
    a.positions = view_of(pos);
    a.rope_table = TensorView::contiguous(const_cast<float*>(table), DType::F32, {table_rows, 64});
    a.slot_swa = view_of(slot);
    a.cache = cache();
    a.q_out = q_out.view({o_rows, H_pad, 512}, {o_ts, o_hs, 1});
    return a;
  }
  const uint8_t* cache_bytes() const {
    return plain_bf16() ? reinterpret_cast<const uint8_t*>(bf16.data()) : u8.data();
  }
  size_t cache_size() const { return plain_bf16() ? bf16.size() * 2 : u8.size(); }

  // The cache backing SPEC 5.4 specifies: canary, then for each t with slot >= 0 the record of the
  // exact kv row and its literal rotation at row positions[t].
  std::vector<uint8_t> expected_cache() const {
    std::vector<uint8_t> e8(u8.size(), kByteCanary);
    std::vector<uint16_t> e16(bf16.size(), kBf16Canary);
    for (int64_t t = 0; t < T; ++t) {
      if (slot[t] < 0) continue;
      float x[512], y[512];
      for (int d = 0; d < 512; ++d) x[d] = y[d] = num::bf16_decode(kv[t * 512 + d]);
      const float* tr = table + pos[t] * 64;
      for (int i = 0; i < 32; ++i)
        literal_rope(x[448 + 2 * i], x[449 + 2 * i], tr[i], tr[32 + i], y[448 + 2 * i], y[449 + 2 * i]);
      const int64_t page = slot[t] / S, off = slot[t] % S;
      switch (format) {
        case RecordFormat::V4_584:
          rec::write_v4_584(e8.data() + page * page_stride, S, off, x, y);
          break;
        case RecordFormat::MXFP8_528:
          rec::write_mxfp8_528(e8.data() + page * page_stride, S, off, y);
          break;
        case RecordFormat::PLAIN_BF16:
          rec::write_plain_bf16(e16.data() + page * page_stride + off * row_stride, y);
          break;
        case RecordFormat::PLAIN_FP8:
          rec::write_plain_fp8(e8.data() + page * page_stride + off * row_stride, y, 1.0f / sigma);
          break;
        default:
          ADD_FAILURE() << "not an SWA format";
      }
    }
    if (!plain_bf16()) return e8;
    std::vector<uint8_t> out(e16.size() * 2);
    std::memcpy(out.data(), e16.data(), out.size());
    return out;
  }

  // q_out as SPEC 9.2 specifies it: canary, then for t < T every head: NoPE bits, the literal
  // rotation at row positions[t] rounded to bf16, and zero padded heads.
  std::vector<uint16_t> expected_q_out() const {
    std::vector<uint16_t> e(q_out.size(), kQCanary);
    for (int64_t t = 0; t < T; ++t) {
      const float* tr = table + pos[t] * 64;
      for (int64_t h = 0; h < H_pad; ++h) {
        uint16_t* o = e.data() + t * o_ts + h * o_hs;
        if (h >= H) {
          std::fill(o, o + 512, uint16_t{0});
          continue;
        }
        const uint16_t* in = q.data() + t * q_ts + h * q_hs;
        std::copy(in, in + 448, o);
        for (int i = 0; i < 32; ++i) {
          float y0, y1;
          literal_rope(num::bf16_decode(in[448 + 2 * i]), num::bf16_decode(in[449 + 2 * i]), tr[i], tr[32 + i], y0, y1);
          o[448 + 2 * i] = num::bf16_encode(y0);
          o[449 + 2 * i] = num::bf16_encode(y1);
        }
      }
    }
    return e;
  }
};

// T tokens: requests at odd and even starts, every 5th token without a slot, 2 padding rows
// (position 0, slot -1); distinct random slots; q with head and token padding in its backing.
SwaCase make_case(RecordFormat f, int64_t H, int64_t H_pad, const float* table, int64_t table_rows, Rng& rng,
                  int64_t T = 40) {
  SwaCase c;
  c.format = f;
  c.T = T;
  c.H = H;
  c.H_pad = H_pad;
  const bool plain = !record_info(f).packed;
  c.row_stride = plain ? 512 + 8 : 512;
  c.page_stride =
      plain ? c.S * c.row_stride + 24 : CacheView::with_default_strides(nullptr, f, 1, c.S).page_stride + 40;
  c.kv = random_bf16(static_cast<size_t>((T + 2) * 512), rng);
  c.q_rows = T + 1;
  c.q_hs = 512 + 16;
  c.q_ts = H * c.q_hs + 32;
  c.q = random_bf16(c.q_size(), rng, 2.0);
  c.o_rows = T + 3;
  c.o_hs = 512 + 8;
  c.o_ts = H_pad * c.o_hs + 16;
  c.q_out = CanaryBuffer<uint16_t>(c.o_size(), kQCanary);
  std::vector<int64_t> perm(static_cast<size_t>(c.S * c.pages));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  rng.shuffle(perm);
  const int64_t real = T - 2;
  int64_t p = rng.integer(0, table_rows - real - 1);
  for (int64_t t = 0; t < T; ++t) {
    if (t < real && t % 13 == 7) p = rng.integer(0, table_rows - real - 1);  // a new request
    c.pos.push_back(t < real ? p++ : 0);
    c.slot.push_back(t < real && t % 5 != 3 ? perm[static_cast<size_t>(t)] : -1);
  }
  c.table = table;
  c.table_rows = table_rows;
  if (f == RecordFormat::PLAIN_BF16)
    c.bf16.assign(static_cast<size_t>(c.pages * c.page_stride), kBf16Canary);
  else
    c.u8.assign(static_cast<size_t>(c.pages * c.page_stride), kByteCanary);
  return c;
}

const RecordFormat kSwaFormats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::PLAIN_BF16,
                                    RecordFormat::PLAIN_FP8};

// The layer tables of the published config: plain (layer 0, ratio 0) and YaRN (layer 20, ratio 1).
const RopeTable& layer_table(int layer) {
  static const ModelConfig cfg = deepseek_v41_flash();
  static const RopeTable plain = rope_table_for_layer(cfg, 0, 3000);
  static const RopeTable yarn = rope_table_for_layer(cfg, 20, 3000);
  return layer == 0 ? plain : yarn;
}

TEST(SwaInsert, EveryFormatBothTablesPaddedAndUnpaddedHeads) {
  const uint64_t seed = run_seed() ^ 0x5A1;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::pair<int64_t, int64_t> heads[] = {{8, 8}, {8, 64}, {16, 16}, {64, 64}, {40, 128}};
  for (RecordFormat f : kSwaFormats)
    for (int layer : {0, 20})
      for (auto [H, H_pad] : heads) {
        SCOPED_TRACE(fmt_name(f) + " layer " + std::to_string(layer) + " H " + std::to_string(H) + " H_pad " +
                     std::to_string(H_pad));
        const RopeTable& tab = layer_table(layer);
        SwaCase c = make_case(f, H, H_pad, tab.data.data(), tab.rows, rng);
        const std::vector<uint16_t> q_before = c.q, kv_before = c.kv;
        swa_insert_q_rope(c.args(), ExecContext{nullptr, 3});
        const auto ec = c.expected_cache();
        ASSERT_TRUE(bytes_equal(ec.data(), c.cache_bytes(), ec.size(), "SWA cache backing"));
        ASSERT_TRUE(bits_equal(c.expected_q_out(), c.q_out.vec(), "q_out backing"));
        EXPECT_TRUE(bits_equal(q_before, c.q, "q (input)"));
        EXPECT_TRUE(bits_equal(kv_before, c.kv, "kv (input)"));
      }
}

// The SWA insert is insert() with ratio 1 (one insert rule): same cache bytes for the same slots.
TEST(SwaInsert, CacheBytesEqualInsertWithRatioOne) {
  const uint64_t seed = run_seed() ^ 0x5A2;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::vector<float> table = random_rope_table(700, rng);
  for (RecordFormat f : kSwaFormats) {
    SCOPED_TRACE(fmt_name(f));
    SwaCase c = make_case(f, 4, 4, table.data(), 700, rng, 64);
    SwaCase d = c;
    swa_insert_q_rope(c.args());
    InsertArgs ia;
    ia.ratio = 1;
    ia.latent = TensorView::contiguous(d.kv.data(), DType::BF16, {d.T + 2, 512});
    ia.positions = view_of(d.pos);
    ia.rope_table = TensorView::contiguous(const_cast<float*>(d.table), DType::F32, {700, 64});
    ia.slots = view_of(d.slot);
    ia.cache = d.cache();
    insert(ia);
    EXPECT_TRUE(bytes_equal(d.cache_bytes(), c.cache_bytes(), c.cache_size(), "swa vs insert(ratio 1)"));
  }
}

TEST(SwaInsert, ThreadCountInPlaceAndEmpty) {
  const uint64_t seed = run_seed() ^ 0x5A3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const RopeTable& tab = layer_table(20);
  SwaCase base = make_case(RecordFormat::V4_584, 16, 16, tab.data.data(), tab.rows, rng, 70);
  SwaCase one = base, many = base;
  swa_insert_q_rope(one.args(), ExecContext{nullptr, 1});
  swa_insert_q_rope(many.args(), ExecContext{nullptr, 7});
  EXPECT_TRUE(bytes_equal(one.cache_bytes(), many.cache_bytes(), one.cache_size(), "cache, 1 vs 7 threads"));
  EXPECT_TRUE(bits_equal(one.q_out.vec(), many.q_out.vec(), "q_out, 1 vs 7 threads"));

  // in place: q_out is q (same data and strides, H_pad == H)
  SwaCase ip = base;
  SwaInsertArgs a = ip.args();
  a.q_out = a.q;
  swa_insert_q_rope(a);
  EXPECT_TRUE(bytes_equal(one.cache_bytes(), ip.cache_bytes(), one.cache_size(), "cache, in place"));
  for (int64_t t = 0; t < base.T; ++t)
    for (int64_t h = 0; h < base.H; ++h)
      ASSERT_EQ(
          std::memcmp(ip.q.data() + t * ip.q_ts + h * ip.q_hs, one.q_out.data() + t * one.o_ts + h * one.o_hs, 1024), 0)
          << "token " << t << " head " << h;
  // the rows of q beyond T and the gaps between heads and rows are not written
  for (size_t i = 0; i < ip.q.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / ip.q_ts, r = static_cast<int64_t>(i) % ip.q_ts;
    if (t < base.T && r / ip.q_hs < base.H && r % ip.q_hs < 512) continue;
    ASSERT_EQ(ip.q[i], base.q[i]) << "element " << i;
  }

  // T = 0: nothing is written
  SwaCase e = base;
  SwaInsertArgs ea = e.args();
  ea.slot_swa.shape[0] = 0;
  swa_insert_q_rope(ea);
  EXPECT_TRUE(e.q_out.untouched());
  EXPECT_TRUE(bytes_equal(base.cache_bytes(), e.cache_bytes(), base.cache_size(), "cache, T = 0"));
}

// Non-finite queries: a NaN NoPE payload is copied bit for bit, a NaN or Inf RoPE input gives the
// canonical bf16 NaN / the IEEE result (SPEC 2.1, 2.6).
TEST(SwaInsert, NonFiniteQueries) {
  Rng rng(run_seed() ^ 0x5A4);
  const RopeTable& tab = layer_table(0);
  SwaCase c = make_case(RecordFormat::MXFP8_528, 2, 64, tab.data.data(), tab.rows, rng, 6);
  c.q[0 * c.q_ts + 5] = 0x7F8F;             // NaN payload in a NoPE dim
  c.q[1 * c.q_ts + 448] = 0x7FC0;           // NaN in a RoPE pair
  c.q[2 * c.q_ts + c.q_hs + 501] = 0x7F80;  // +Inf in a RoPE pair
  c.kv[2 * 512 + 460] = 0x7F80;             // +Inf in the kv RoPE dims (poisoned 528 tile)
  swa_insert_q_rope(c.args());
  EXPECT_EQ(c.q_out[0 * c.o_ts + 5], 0x7F8F);
  EXPECT_EQ(c.q_out[1 * c.o_ts + 448], 0x7FC0);
  ASSERT_TRUE(bits_equal(c.expected_q_out(), c.q_out.vec(), "q_out backing"));
  const auto ec = c.expected_cache();
  ASSERT_TRUE(bytes_equal(ec.data(), c.cache_bytes(), ec.size(), "SWA cache backing"));
}

// ---------------------------------------------------------------- bad arguments

struct BadCase {
  const char* name;
  std::function<void(SwaCase&, SwaInsertArgs&)> mutate;
  std::vector<std::string> parts;
};

TEST(SwaInsertValidation, EveryBadArgumentNamedNothingWritten) {
  Rng rng(77);
  const std::vector<float> table = random_rope_table(400, rng);
  const SwaCase base = make_case(RecordFormat::V4_584, 8, 64, table.data(), 400, rng, 20);
  const std::vector<BadCase> cases = {
      {"kv dtype", [](SwaCase&, SwaInsertArgs& a) { a.kv.dtype = DType::F32; }, {"swa_insert_q_rope: kv: dtype f32"}},
      {"kv absent", [](SwaCase&, SwaInsertArgs& a) { a.kv = TensorView{}; }, {"kv: absent"}},
      {"kv rows", [](SwaCase&, SwaInsertArgs& a) { a.kv.shape[0] = 19; }, {"kv: 19 rows, expected at least 20"}},
      {"kv width", [](SwaCase&, SwaInsertArgs& a) { a.kv.shape[1] = 448; }, {"kv: shape[1] = 448"}},
      {"slot dtype", [](SwaCase&, SwaInsertArgs& a) { a.slot_swa.dtype = DType::I32; }, {"slot_swa: dtype i32"}},
      {"positions short", [](SwaCase&, SwaInsertArgs& a) { a.positions.shape[0] = 19; }, {"positions: 19 entries"}},
      {"table width", [](SwaCase&, SwaInsertArgs& a) { a.rope_table.shape[1] = 32; }, {"rope_table: shape[1] = 32"}},
      {"nvfp4 cache",
       [](SwaCase&, SwaInsertArgs& a) { a.cache.format = RecordFormat::NVFP4_288; },
       {"swa_insert_q_rope: cache: format nvfp4_288, expected v4_584 or mxfp8_528"}},
      {"cache stride", [](SwaCase&, SwaInsertArgs& a) { a.cache.page_stride = 100; }, {"cache: page_stride = 100"}},
      {"q absent", [](SwaCase&, SwaInsertArgs& a) { a.q = TensorView{}; }, {"q: absent"}},
      {"q dtype", [](SwaCase&, SwaInsertArgs& a) { a.q.dtype = DType::F32; }, {"q: dtype f32"}},
      {"q ndim", [](SwaCase&, SwaInsertArgs& a) { a.q.ndim = 2; }, {"q: 2 dimensions, expected 3"}},
      {"q width", [](SwaCase&, SwaInsertArgs& a) { a.q.shape[2] = 576; }, {"q: shape[2] = 576, expected 512"}},
      {"q heads", [](SwaCase&, SwaInsertArgs& a) { a.q.shape[1] = 0; }, {"q: 0 heads, expected >= 1"}},
      {"q rows", [](SwaCase&, SwaInsertArgs& a) { a.q.shape[0] = 19; }, {"q: 19 rows, expected at least T = 20"}},
      {"q inner stride", [](SwaCase&, SwaInsertArgs& a) { a.q.stride[2] = 2; }, {"q: inner stride 2, expected 1"}},
      {"q head stride",
       [](SwaCase&, SwaInsertArgs& a) { a.q.stride[1] = 500; },
       {"q: head stride 500, expected >= 512"}},
      {"q token stride",
       [](SwaCase&, SwaInsertArgs& a) { a.q.stride[0] = 7 * 528; },
       {"q: token stride 3696, expected >= (heads - 1) * head stride + 512 = 4208"}},
      {"q_out heads 32",
       [](SwaCase&, SwaInsertArgs& a) { a.q_out.shape[1] = 32; },
       {"q_out: 32 heads for H = 8 query heads, expected H_pad = H, or 64 or 128 (> H)"}},
      {"q_out heads 4", [](SwaCase&, SwaInsertArgs& a) { a.q_out.shape[1] = 4; }, {"q_out: 4 heads for H = 8"}},
      {"q_out rows",
       [](SwaCase&, SwaInsertArgs& a) { a.q_out.shape[0] = 3; },
       {"q_out: 3 rows, expected at least T = 20"}},
      {"q_out overlaps q",
       [](SwaCase& c, SwaInsertArgs& a) {
         a.q_out = TensorView::strided(c.q.data() + 512, DType::BF16, {20, 8, 512}, {c.q_ts, c.q_hs, 1});
       },
       {"q_out: overlaps q", "expected disjoint memory or q itself"}},
      {"q_out on q's data, padded",
       [](SwaCase& c, SwaInsertArgs& a) {
         a.q_out = TensorView::strided(c.q.data(), DType::BF16, {20, 64, 512}, {64 * c.q_hs, c.q_hs, 1});
       },
       {"q_out: overlaps q"}},
      {"q device",
       [](SwaCase&, SwaInsertArgs& a) { a.q.device = Device::CUDA; },
       {"q: on cuda, expected cpu like slot_swa"}},
      {"q_out device", [](SwaCase&, SwaInsertArgs& a) { a.q_out.device = Device::CUDA; }, {"q_out: on cuda"}},
      // device views are not read on the host: the CUDA backend's own check (16-byte query rows)
      // refuses them before any launch, a build without CUDA refuses every device view
      {"all on cuda, query rows not 16-byte",
       [](SwaCase&, SwaInsertArgs& a) {
         for (TensorView* v : {&a.kv, &a.q, &a.positions, &a.rope_table, &a.slot_swa, &a.q_out})
           v->device = Device::CUDA;
         a.cache.device = Device::CUDA;
         a.q.stride[1] = 516;
       },
       {built_with_cuda() ? "swa_insert_q_rope: q: strides [4256, 516, 1], expected multiples of 8 elements on cuda"
                          : "swa_insert_q_rope: the views are on cuda, but dsv41kv was built without CUDA"}},
      {"slot beyond cache",
       [](SwaCase& c, SwaInsertArgs&) { c.slot[4] = 128; },
       {"slot_swa: slot_swa[4] = 128, expected < num_pages * states_per_page = 4 * 32 = 128"}},
      {"kv position beyond table",
       [](SwaCase& c, SwaInsertArgs&) {
         c.pos[2] = 400;
         c.slot[2] = 5;
       },
       {"positions[2] = 400 needs RoPE table row 400"}},
      {"q position beyond table (token without slot)",
       [](SwaCase& c, SwaInsertArgs&) { c.pos[3] = 400; },
       {"positions[3] = 400 needs RoPE table row 400 for its queries"}},
      {"negative position (token without slot)",
       [](SwaCase& c, SwaInsertArgs&) { c.pos[18] = -1; },
       {"positions[18] = -1, expected >= 0 (its queries are rotated)"}},
      {"threads", [](SwaCase&, SwaInsertArgs&) {}, {"ctx.num_threads = -1"}},
  };
  for (const auto& bc : cases) {
    SCOPED_TRACE(bc.name);
    SwaCase c = base;
    ASSERT_EQ(c.slot[3], -1);  // the token the "without slot" cases change
    ASSERT_EQ(c.slot[18], -1);
    SwaInsertArgs a = c.args();
    bc.mutate(c, a);
    const ExecContext ctx{nullptr, std::string(bc.name) == "threads" ? -1 : 0};
    expect_error([&] { swa_insert_q_rope(a, ctx); }, E8, bc.parts);
    EXPECT_TRUE(c.q_out.untouched()) << "q_out written";
    EXPECT_TRUE(bits_equal(base.u8, c.u8, "cache"));
    EXPECT_TRUE(bits_equal(base.q, c.q, "q"));
  }
}

}  // namespace
}  // namespace dsv41kv::test
