// Metadata builder tests (SPEC 3.2, 6, 10.1.6): ring capacity, token_to_req, ring slots, token
// slots with null pages, ratio-1/2 compressed slots with the PAD rule, the decode/prefill
// split, and one bad-input test per validation rule, each checking the error code, the message
// and that the canary-filled output was not touched.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsv41kv/device.hpp"
#include "dsv41kv/metadata.hpp"
#include "support/errors.hpp"

using namespace dsv41kv;
using dsv41kv::test::expect_error;

namespace {

constexpr int64_t kCanary64 = 0x5A5A5A5A5A5A5A5ALL;
constexpr int32_t kCanary32 = 0x5A5A5A5A;

TensorView i32v(std::vector<int32_t>& v) {
  return TensorView::contiguous(v.data(), DType::I32, {static_cast<int64_t>(v.size())});
}
TensorView i64v(std::vector<int64_t>& v) {
  return TensorView::contiguous(v.data(), DType::I64, {static_cast<int64_t>(v.size())});
}
TensorView table(std::vector<int32_t>& v, int64_t rows, int64_t cols) {
  return TensorView::contiguous(v.data(), DType::I32, {rows, cols});
}

template <class T>
bool all_equal(const std::vector<T>& v, T x) {
  for (const T& e : v)
    if (e != x) return false;
  return true;
}

// The SPEC 10.1.6 batch.
struct Spec1016 {
  std::vector<int32_t> qsl{0, 3, 5, 7};
  std::vector<int64_t> positions{13, 14, 15, 7, 8, 0, 1, 0, 0, 0};
  std::vector<int32_t> ring_bt{5, 2, 0};
  std::vector<int32_t> t2r = std::vector<int32_t>(10, kCanary32);
  std::vector<int64_t> slots = std::vector<int64_t>(10, kCanary64);
  int64_t num_actual = 7;
};

}  // namespace

// ============================================================================ ring capacity

TEST(RingCapacity, ExamplesOfSpec32) {
  const std::pair<int64_t, int64_t> cases[] = {{0, 8},  {1, 8},   {5, 8},   {6, 8},  {7, 16},
                                               {14, 16}, {15, 32}, {30, 32}, {31, 64}, {62, 64},
                                               {63, 128}};
  for (auto [spec, cap] : cases) EXPECT_EQ(ring_capacity(spec), cap) << "spec " << spec;
  expect_error([] { ring_capacity(-1); }, ErrorCode::kInvalidArgument,
               {"E8: ", "ring_capacity", "num_speculative_tokens = -1", "expected >= 0"});
}

// ============================================================================ SPEC 6.2

TEST(DecodeSplit, LongestPrefixOfShortRequests) {
  const std::vector<int32_t> q{1, 1, 2, 1, 5, 1, 1};
  EXPECT_EQ(num_decode_requests(q.data(), 7, 0), 2);  // threshold 1
  EXPECT_EQ(num_decode_requests(q.data(), 7, 1), 4);  // threshold 2; the later 1s are prefills
  EXPECT_EQ(num_decode_requests(q.data(), 7, 4), 7);  // threshold 5
  EXPECT_EQ(num_decode_requests(q.data(), 3, 0), 2);
  EXPECT_EQ(num_decode_requests(nullptr, 0, 3), 0);
  const std::vector<int32_t> prefill_first{9, 1, 1};
  EXPECT_EQ(num_decode_requests(prefill_first.data(), 3, 2), 0);
  const std::vector<int32_t> empty_chunk{0, 1};  // a zero-length chunk counts as a decode
  EXPECT_EQ(num_decode_requests(empty_chunk.data(), 2, 0), 2);
  expect_error([&] { num_decode_requests(q.data(), -1, 0); }, ErrorCode::kInvalidArgument,
               {"num_reqs = -1"});
  expect_error([&] { num_decode_requests(q.data(), 2, -2); }, ErrorCode::kInvalidArgument,
               {"num_speculative_tokens = -2"});
  expect_error([] { num_decode_requests(nullptr, 2, 0); }, ErrorCode::kInvalidArgument,
               {"query_lens", "null"});
}

// ============================================================================ SPEC 10.1.6

TEST(RingMetadata, Spec10_1_6Example) {
  Spec1016 b;
  const std::vector<int32_t> qsl_before = b.qsl;
  build_token_to_req({i32v(b.qsl), i32v(b.t2r), b.num_actual});
  EXPECT_EQ(b.t2r, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 0, 0, 0}));
  EXPECT_EQ(b.qsl, qsl_before);  // passed through unchanged

  RingSlotArgs ra;
  ra.token_to_req = i32v(b.t2r);
  ra.positions = i64v(b.positions);
  ra.ring_block_table = table(b.ring_bt, 3, 1);
  ra.num_actual_tokens = b.num_actual;
  ra.cap = ring_capacity(0);
  ra.ring_slots = i64v(b.slots);
  build_ring_slots(ra);
  EXPECT_EQ(b.slots, (std::vector<int64_t>{45, 46, 47, 23, 16, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.ring_bt, (std::vector<int32_t>{5, 2, 0}));

  // num_actual_tokens = -1 takes qsl[num_reqs]
  std::vector<int32_t> t2r(10, kCanary32);
  build_token_to_req({i32v(b.qsl), i32v(t2r)});
  EXPECT_EQ(t2r, (std::vector<int32_t>{0, 0, 0, 1, 1, 2, 2, 0, 0, 0}));
}

TEST(RingMetadata, StridedTableNegativeBlocksAndRangeCheck) {
  Spec1016 b;
  build_token_to_req({i32v(b.qsl), i32v(b.t2r), b.num_actual});
  // ring block table [3, 1] viewed inside a [3, 4] allocation (row stride 4)
  std::vector<int32_t> bt{5, 99, 99, 99, -3, 99, 99, 99, 7, 99, 99, 99};
  RingSlotArgs ra;
  ra.token_to_req = i32v(b.t2r);
  ra.positions = i64v(b.positions);
  ra.ring_block_table = TensorView::strided(bt.data(), DType::I32, {3, 1}, {4, 1});
  ra.num_actual_tokens = b.num_actual;
  ra.cap = 16;
  ra.ring_slots = i64v(b.slots);
  ra.num_ring_blocks = 8;
  build_ring_slots(ra);
  // request 1 has a negative block: treated as null; request 2 block 7, positions 0, 1
  EXPECT_EQ(b.slots, (std::vector<int64_t>{93, 94, 95, -1, -1, 112, 113, -1, -1, -1}));

  std::fill(b.slots.begin(), b.slots.end(), kCanary64);
  ra.num_ring_blocks = 7;  // block 7 is out of range
  expect_error([&] { build_ring_slots(ra); }, ErrorCode::kInvalidArgument,
               {"build_ring_slots: ring_block_table", "ring_block_table[2][0] = 7",
                "num_ring_blocks = 7"});
  EXPECT_TRUE(all_equal(b.slots, kCanary64));
}

// ============================================================================ token slots (6.4)

TEST(TokenSlots, NullAndNegativePagesGiveMinusOne) {
  // two requests, page size 4; request 0 at positions 2..9 (pages 0, 1, 2), request 1 at
  // positions 0, 1 (page 0, negative id) and 4 (page 1 = 6); two padding rows
  std::vector<int32_t> bt{3, 0, 8, -5, 6, 0};  // [2, 3]; 0 and negative entries are null
  const std::vector<int32_t> bt_before = bt;
  std::vector<int32_t> t2r{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0};
  std::vector<int64_t> pos{2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 4, 0, 0};
  std::vector<int64_t> out(13, kCanary64);
  TokenSlotArgs a;
  a.token_to_req = i32v(t2r);
  a.positions = i64v(pos);
  a.block_table = table(bt, 2, 3);
  a.num_actual_tokens = 11;
  a.page = 4;
  a.slots = i64v(out);
  build_token_slots(a);
  EXPECT_EQ(out, (std::vector<int64_t>{14, 15, -1, -1, -1, -1, 32, 33, -1, -1, 24, -1, -1}));
  EXPECT_EQ(bt, bt_before);  // the caller's table is never modified
}

TEST(TokenSlots, SwaPageOf32) {
  std::vector<int32_t> bt{4, 9};
  std::vector<int32_t> t2r{0, 0, 0};
  std::vector<int64_t> pos{0, 31, 32};
  std::vector<int64_t> out(3, kCanary64);
  TokenSlotArgs a;
  a.token_to_req = i32v(t2r);
  a.positions = i64v(pos);
  a.block_table = table(bt, 1, 2);
  a.num_actual_tokens = 3;
  a.slots = i64v(out);
  build_token_slots(a);  // page defaults to 32
  EXPECT_EQ(out, (std::vector<int64_t>{128, 159, 288}));
}

// ============================================================================ compressed (6.5)

namespace {
struct CompBatch {
  // request 0: positions 5..12 (8 tokens); request 1: positions 0..3; 2 padding rows
  std::vector<int32_t> t2r{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0};
  std::vector<int64_t> pos{5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2, 3, 0, 0};
  std::vector<int32_t> bt{7, 3, 0, 2, 11, 12};  // [2, 3]
  std::vector<int64_t> tslots{1, 2, -1, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1, -1};
  std::vector<int64_t> out = std::vector<int64_t>(14, kCanary64);
  CompressedSlotArgs args(int ratio, int64_t S, bool with_tslots) {
    CompressedSlotArgs a;
    a.ratio = ratio;
    a.token_to_req = i32v(t2r);
    a.positions = i64v(pos);
    a.block_table = table(bt, 2, 3);
    if (with_tslots) a.token_slots = i64v(tslots);
    a.num_actual_tokens = 12;
    a.states_per_page = S;
    a.slots = i64v(out);
    return a;
  }
};
}  // namespace

TEST(CompressedSlots, Ratio2PadRuleAndNonClosingTokens) {
  CompBatch b;
  build_compressed_slots(b.args(2, 2, true));
  // request 0: closing positions 5, 7, 9, 11 -> states 2, 3, 4, 5 -> pages 1, 1, 2, 2 of S = 2
  //   (bt row 0 = [7, 3, 0]): p5 -> 3*2+0 = 6; p7 has token slot -1 (PAD rule) -> -1;
  //   p9, p11 -> logical page 2 = null -> -1. Even positions -> -1.
  // request 1: closing 1, 3 -> states 0, 1 -> page 0 of row 1 (= 2) -> 4, 5.
  EXPECT_EQ(b.out, (std::vector<int64_t>{6, -1, -1, -1, -1, -1, -1, -1, -1, 4, -1, 5, -1, -1}));
  EXPECT_EQ(b.bt, (std::vector<int32_t>{7, 3, 0, 2, 11, 12}));

  // without token_slots every token is valid: p7 -> state 3 -> 3*2+1 = 7
  std::fill(b.out.begin(), b.out.end(), kCanary64);
  build_compressed_slots(b.args(2, 2, false));
  EXPECT_EQ(b.out, (std::vector<int64_t>{6, -1, 7, -1, -1, -1, -1, -1, -1, 4, -1, 5, -1, -1}));

  // S = 32 (C2A): everything on logical page 0
  std::fill(b.out.begin(), b.out.end(), kCanary64);
  build_compressed_slots(b.args(2, 32, true));
  EXPECT_EQ(b.out, (std::vector<int64_t>{7 * 32 + 2, -1, -1, -1, 7 * 32 + 4, -1, 7 * 32 + 5, -1,
                                         -1, 2 * 32 + 0, -1, 2 * 32 + 1, -1, -1}));
}

TEST(CompressedSlots, Ratio1EqualsTokenSlotsWithPadRule) {
  // S_1 = 4; position 12 would need column 3 of 3 (see MetadataValidation), so token 7 moves
  // to position 4 (positions need not be consecutive for the builders)
  CompBatch c;
  c.pos[7] = 4;
  build_compressed_slots(c.args(1, 4, true));
  // row 0 = [7, 3, 0]: p5, p6 -> page 3 -> 13, 14; p7 -> token slot -1 -> -1; p8..p11 -> page 0
  // (null) -> -1; p4 -> 12. Row 1 = [2, 11, 12]: p0..3 -> 8..11.
  EXPECT_EQ(c.out, (std::vector<int64_t>{13, 14, -1, -1, -1, -1, -1, 12, 8, 9, 10, 11, -1, -1}));

  // Ratio 1 without the PAD rule equals build_token_slots with page = S_1
  std::vector<int64_t> ts(14, kCanary64);
  TokenSlotArgs ta;
  ta.token_to_req = i32v(c.t2r);
  ta.positions = i64v(c.pos);
  ta.block_table = table(c.bt, 2, 3);
  ta.num_actual_tokens = 12;
  ta.page = 4;
  ta.slots = i64v(ts);
  build_token_slots(ta);
  std::fill(c.out.begin(), c.out.end(), kCanary64);
  build_compressed_slots(c.args(1, 4, false));
  EXPECT_EQ(c.out, ts);
}

TEST(CompressedSlots, OutputMayAliasTokenSlots) {
  CompBatch b;
  CompressedSlotArgs a = b.args(2, 2, true);
  a.slots = a.token_slots;
  build_compressed_slots(a);
  EXPECT_EQ(b.tslots, (std::vector<int64_t>{6, -1, -1, -1, -1, -1, -1, -1, -1, 4, -1, 5, -1, -1}));
}

TEST(CompressedSlots, RatioOutsideOneTwoIsE2) {
  for (int r : {0, 3, 4, 128, -1}) {
    CompBatch b;
    expect_error([&] { build_compressed_slots(b.args(r, 2, true)); }, ErrorCode::kMetadataRatio,
                 {"E2: ", "build_compressed_slots", "ratio = " + std::to_string(r),
                  "expected 1 or 2"});
    EXPECT_TRUE(all_equal(b.out, kCanary64));
  }
}

// ============================================================================ random property

TEST(MetadataProperty, RandomBatchesMatchTheFormulas) {
  std::mt19937 rng(31);
  for (int it = 0; it < 300; ++it) {
    const int nr = std::uniform_int_distribution<int>(0, 6)(rng);
    const int cols = 6;
    const int64_t S = std::uniform_int_distribution<int>(1, 8)(rng);
    const int64_t cap = ring_capacity(std::uniform_int_distribution<int>(0, 20)(rng));
    std::vector<int32_t> qsl{0}, bt(static_cast<size_t>(std::max(nr, 1) * cols)),
        rbt(static_cast<size_t>(std::max(nr, 1)));
    std::vector<int64_t> pos;
    for (auto& x : bt) x = std::uniform_int_distribution<int>(-2, 20)(rng);
    for (auto& x : rbt) x = std::uniform_int_distribution<int>(-1, 9)(rng);
    for (int j = 0; j < nr; ++j) {
      const int len = std::uniform_int_distribution<int>(0, 5)(rng);
      const int start = std::uniform_int_distribution<int>(0, static_cast<int>(S) * cols - len)(rng);
      for (int k = 0; k < len; ++k) pos.push_back(start + k);
      qsl.push_back(qsl.back() + len);
    }
    const int64_t na = qsl.back();
    const int64_t N = na + std::uniform_int_distribution<int>(0, 3)(rng);
    pos.resize(static_cast<size_t>(N), 0);
    std::vector<int32_t> t2r(static_cast<size_t>(N), kCanary32);
    build_token_to_req({i32v(qsl), i32v(t2r), na});
    for (int j = 0; j < nr; ++j)
      for (int t = qsl[static_cast<size_t>(j)]; t < qsl[static_cast<size_t>(j) + 1]; ++t)
        ASSERT_EQ(t2r[static_cast<size_t>(t)], j);
    for (int64_t t = na; t < N; ++t) ASSERT_EQ(t2r[static_cast<size_t>(t)], 0);

    std::vector<int64_t> ring(static_cast<size_t>(N), kCanary64), tok(ring), comp(ring);
    {
      RingSlotArgs ra;
      ra.token_to_req = i32v(t2r);
      ra.positions = i64v(pos);
      ra.ring_block_table = table(rbt, nr, 1);
      ra.num_actual_tokens = na;
      ra.cap = cap;
      ra.ring_slots = i64v(ring);
      build_ring_slots(ra);
      TokenSlotArgs ta;
      ta.token_to_req = i32v(t2r);
      ta.positions = i64v(pos);
      ta.block_table = table(bt, nr, cols);
      ta.num_actual_tokens = na;
      ta.page = S;
      ta.slots = i64v(tok);
      build_token_slots(ta);
      CompressedSlotArgs ca;
      ca.ratio = 2;
      ca.token_to_req = i32v(t2r);
      ca.positions = i64v(pos);
      ca.block_table = table(bt, nr, cols);
      ca.token_slots = i64v(tok);
      ca.num_actual_tokens = na;
      ca.states_per_page = S;
      ca.slots = i64v(comp);
      build_compressed_slots(ca);
    }
    for (int64_t t = 0; t < N; ++t) {
      const size_t u = static_cast<size_t>(t);
      if (t >= na) {
        ASSERT_EQ(ring[u], -1);
        ASSERT_EQ(tok[u], -1);
        ASSERT_EQ(comp[u], -1);
        continue;
      }
      const int b = t2r[u];
      const int64_t p = pos[u];
      const int32_t rb = rbt[static_cast<size_t>(b)];
      ASSERT_EQ(ring[u], rb == 0 || rb < 0 ? -1 : rb * cap + p % cap);
      const int32_t pg = bt[static_cast<size_t>(b * cols + p / S)];
      ASSERT_EQ(tok[u], pg <= 0 ? -1 : pg * S + p % S);
      int64_t want = -1;
      if (p % 2 == 1 && tok[u] != -1) {
        const int64_t s = p / 2;
        const int32_t cp = bt[static_cast<size_t>(b * cols + s / S)];
        if (cp > 0) want = cp * S + s % S;
      }
      ASSERT_EQ(comp[u], want) << "iteration " << it << " token " << t;
    }
  }
}

// ============================================================================ validation

TEST(MetadataValidation, Qsl) {
  {  // non-monotone
    Spec1016 b;
    b.qsl = {0, 3, 2, 7};
    expect_error([&] { build_token_to_req({i32v(b.qsl), i32v(b.t2r), 7}); },
                 ErrorCode::kInvalidArgument,
                 {"E8: build_token_to_req: qsl", "qsl[2] = 2 < qsl[1] = 3", "non-decreasing"});
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // qsl[0] != 0
    Spec1016 b;
    b.qsl = {1, 3, 5, 7};
    expect_error([&] { build_token_to_req({i32v(b.qsl), i32v(b.t2r), 7}); },
                 ErrorCode::kInvalidArgument, {"qsl[0] = 1", "expected 0"});
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // end mismatch
    Spec1016 b;
    expect_error([&] { build_token_to_req({i32v(b.qsl), i32v(b.t2r), 6}); },
                 ErrorCode::kInvalidArgument,
                 {"qsl[num_reqs = 3] = 7", "expected num_actual_tokens = 6"});
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // qsl end beyond N (num_actual_tokens taken from qsl)
    Spec1016 b;
    b.qsl = {0, 3, 5, 11};
    expect_error([&] { build_token_to_req({i32v(b.qsl), i32v(b.t2r)}); },
                 ErrorCode::kInvalidArgument, {"qsl[num_reqs = 3] = 11", "expected <= N = 10"});
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // num_actual_tokens > N
    Spec1016 b;
    expect_error([&] { build_token_to_req({i32v(b.qsl), i32v(b.t2r), 11}); },
                 ErrorCode::kInvalidArgument, {"num_actual_tokens", "11", "N = 10"});
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // wrong dtype of qsl and of the output
    Spec1016 b;
    std::vector<int64_t> q64{0, 3, 5, 7};
    expect_error([&] { build_token_to_req({i64v(q64), i32v(b.t2r), 7}); },
                 ErrorCode::kInvalidArgument, {"qsl: dtype i64, expected i32"});
    std::vector<int64_t> out64(10, kCanary64);
    expect_error([&] { build_token_to_req({i32v(b.qsl), i64v(out64), 7}); },
                 ErrorCode::kInvalidArgument, {"token_to_req: dtype i64, expected i32"});
    EXPECT_TRUE(all_equal(out64, kCanary64));
    EXPECT_TRUE(all_equal(b.t2r, kCanary32));
  }
  {  // validate_qsl directly
    std::vector<int32_t> q{0, 2, 4};
    EXPECT_NO_THROW(validate_qsl(i32v(q), 4, 4, "qsl"));
    expect_error([&] { validate_qsl(i32v(q), 4, 3, "my_qsl"); }, ErrorCode::kInvalidArgument,
                 {"my_qsl: num_actual_tokens = 4", "N = 3"});
    TensorView dev = i32v(q);
    dev.device = Device::CUDA;
    expect_error([&] { validate_qsl(dev, 4, 4, "qsl"); }, ErrorCode::kInvalidArgument,
                 {"qsl: on cuda, expected a host"});
    std::vector<int32_t> q2{0, 2, 4, 4, 4};
    TensorView strided = TensorView::strided(q2.data(), DType::I32, {3}, {2});
    expect_error([&] { validate_qsl(strided, 4, 4, "qsl"); }, ErrorCode::kInvalidArgument,
                 {"expected contiguous"});
  }
}

TEST(MetadataValidation, RingSlots) {
  auto fresh = [](Spec1016& b) {
    build_token_to_req({i32v(b.qsl), i32v(b.t2r), 7});
    RingSlotArgs ra;
    ra.token_to_req = i32v(b.t2r);
    ra.positions = i64v(b.positions);
    ra.ring_block_table = table(b.ring_bt, 3, 1);
    ra.num_actual_tokens = 7;
    ra.cap = 8;
    ra.ring_slots = i64v(b.slots);
    return ra;
  };
  struct Case {
    std::function<void(Spec1016&, RingSlotArgs&)> mutate;
    std::vector<std::string> parts;
  };
  std::vector<int32_t> pos32(10, 0);
  std::vector<int64_t> short_pos(9, 0);
  std::vector<int64_t> wide_bt64(3, 1);
  const std::vector<Case> cases = {
      {[&](Spec1016&, RingSlotArgs& a) {
         a.positions = TensorView::contiguous(pos32.data(), DType::I32, {10});
       },
       {"build_ring_slots: positions: dtype i32, expected i64"}},
      {[&](Spec1016&, RingSlotArgs& a) { a.positions = i64v(short_pos); },
       {"positions: 9 entries, expected at least 10"}},
      {[&](Spec1016&, RingSlotArgs& a) {
         a.ring_block_table = TensorView::contiguous(wide_bt64.data(), DType::I64, {3, 1});
       },
       {"ring_block_table: dtype i64, expected i32"}},
      {[&](Spec1016& b, RingSlotArgs& a) {
         a.ring_block_table = TensorView::contiguous(b.ring_bt.data(), DType::I32, {3});
       },
       {"ring_block_table: 1 dimensions, expected 2"}},
      {[&](Spec1016& b, RingSlotArgs& a) {
         a.ring_slots = TensorView::contiguous(b.slots.data(), DType::I64, {9});
       },
       {"ring_slots: 9 entries, expected N = 10"}},
      {[&](Spec1016&, RingSlotArgs& a) { a.num_actual_tokens = 11; },
       {"num_actual_tokens: 11", "N = 10"}},
      {[&](Spec1016&, RingSlotArgs& a) { a.cap = 0; }, {"cap: 0, expected > 0"}},
      {[&](Spec1016& b, RingSlotArgs&) { b.positions[4] = -8; },
       {"positions: positions[4] = -8 (request 1), expected >= 0"}},
      {[&](Spec1016& b, RingSlotArgs&) { b.t2r[6] = 3; },
       {"token_to_req: token_to_req[6] = 3", "[0, 3)"}},
      {[&](Spec1016&, RingSlotArgs& a) { a.ring_slots.device = Device::CUDA; },
       {"ring_slots: on cuda, expected cpu like token_to_req"}},
      {[&](Spec1016& b, RingSlotArgs& a) {
         a.token_to_req = TensorView::strided(b.t2r.data(), DType::I32, {5}, {2});
         a.ring_slots = TensorView::contiguous(b.slots.data(), DType::I64, {5});
         a.num_actual_tokens = 5;
       },
       {"token_to_req: stride 2, expected contiguous"}},
      {[&](Spec1016&, RingSlotArgs& a) { a.ring_block_table = TensorView{}; },
       {"ring_block_table: absent"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Spec1016 b;
    RingSlotArgs a = fresh(b);
    cases[i].mutate(b, a);
    SCOPED_TRACE("case " + std::to_string(i));
    expect_error([&] { build_ring_slots(a); }, ErrorCode::kInvalidArgument, cases[i].parts);
    EXPECT_TRUE(all_equal(b.slots, kCanary64));
  }
}

TEST(MetadataValidation, TokenAndCompressedSlots) {
  {  // out-of-range block column (token slots): position 12 with page 4 needs column 3 of 3
    CompBatch b;
    TokenSlotArgs a;
    a.token_to_req = i32v(b.t2r);
    a.positions = i64v(b.pos);
    a.block_table = table(b.bt, 2, 3);
    a.num_actual_tokens = 12;
    a.page = 4;
    a.slots = i64v(b.out);
    expect_error([&] { build_token_slots(a); }, ErrorCode::kInvalidArgument,
                 {"build_token_slots: block_table",
                  "token 7 (request 0, position 12) needs logical page 3", "expected < 3 columns"});
    EXPECT_TRUE(all_equal(b.out, kCanary64));
    a.page = 0;
    expect_error([&] { build_token_slots(a); }, ErrorCode::kInvalidArgument, {"page: 0"});
    a.page = 8;
    a.num_pages = 12;  // row 1 holds page id 12
    b.pos[8] = 8;      // request 1's first token now on logical page 1 (= 11): fine
    b.pos[9] = 9;
    b.pos[10] = 16;    // logical page 2 (= 12) >= num_pages
    expect_error([&] { build_token_slots(a); }, ErrorCode::kInvalidArgument,
                 {"block_table[1][2] = 12 (token 10, position 16)", "num_pages = 12"});
    EXPECT_TRUE(all_equal(b.out, kCanary64));
    a.num_pages = 13;
    EXPECT_NO_THROW(build_token_slots(a));
  }
  {  // compressed ratio 1: position 12 needs column 3 of 3 (S_1 = 4)
    CompBatch b;
    expect_error([&] { build_compressed_slots(b.args(1, 4, true)); }, ErrorCode::kInvalidArgument,
                 {"build_compressed_slots: block_table", "token 7 (request 0, position 12)",
                  "logical page 3", "expected < 3 columns"});
    EXPECT_TRUE(all_equal(b.out, kCanary64));
  }
  {  // compressed ratio 2: non-closing and PAD-masked tokens never read the table
    CompBatch b;
    b.pos[6] = 13;      // closing, state 6 -> column 3 of 3, but its token slot is -1
    b.tslots[6] = -1;   // token 7 (position 12) is non-closing: state 6 -> column 3, not read
    EXPECT_NO_THROW(build_compressed_slots(b.args(2, 2, true)));
    EXPECT_EQ(b.out, (std::vector<int64_t>{6, -1, -1, -1, -1, -1, -1, -1, -1, 4, -1, 5, -1, -1}));
    std::fill(b.out.begin(), b.out.end(), kCanary64);
    expect_error([&] { build_compressed_slots(b.args(2, 2, false)); },
                 ErrorCode::kInvalidArgument,
                 {"token 6 (request 0, position 13) closes state 6 in logical page 3"});
    EXPECT_TRUE(all_equal(b.out, kCanary64));
  }
}

TEST(MetadataValidation, CompressedSlotsStructure) {
  struct Case {
    std::function<void(CompBatch&, CompressedSlotArgs&)> mutate;
    std::vector<std::string> parts;
  };
  std::vector<int32_t> ts32(14, 0);
  std::vector<int64_t> short_ts(13, 0);
  const std::vector<Case> cases = {
      {[&](CompBatch&, CompressedSlotArgs& a) {
         a.token_slots = TensorView::contiguous(ts32.data(), DType::I32, {14});
       },
       {"token_slots: dtype i32, expected i64"}},
      {[&](CompBatch&, CompressedSlotArgs& a) { a.token_slots = i64v(short_ts); },
       {"token_slots: 13 entries, expected at least 14"}},
      {[&](CompBatch&, CompressedSlotArgs& a) { a.states_per_page = 0; },
       {"states_per_page: 0, expected > 0"}},
      {[&](CompBatch&, CompressedSlotArgs& a) { a.num_pages = -2; }, {"num_pages: -2"}},
      {[&](CompBatch& b, CompressedSlotArgs& a) {
         a.block_table = TensorView::strided(b.bt.data(), DType::I32, {2, 3}, {3, 2});
       },
       {"block_table: inner stride 2, expected 1"}},
      {[&](CompBatch& b, CompressedSlotArgs& a) {
         a.block_table = TensorView::strided(b.bt.data(), DType::I32, {2, 3}, {2, 1});
       },
       {"block_table: row stride 2, expected >= 3"}},
      {[&](CompBatch& b, CompressedSlotArgs& a) {
         // row * stride would overflow int64: no allocation spans that
         a.block_table = TensorView::strided(b.bt.data(), DType::I32, {2, 3}, {int64_t{1} << 61, 1});
       },
       {"block_table: spans more than 2^62 bytes"}},
      {[&](CompBatch&, CompressedSlotArgs& a) { a.token_slots.device = Device::CUDA; },
       {"token_slots: on cuda, expected cpu"}},
      {[&](CompBatch&, CompressedSlotArgs& a) { a.num_actual_tokens = -1; },
       {"num_actual_tokens: -1"}},
      {[&](CompBatch& b, CompressedSlotArgs&) { b.t2r[3] = -1; },
       {"token_to_req[3] = -1"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CompBatch b;
    CompressedSlotArgs a = b.args(2, 2, true);
    cases[i].mutate(b, a);
    SCOPED_TRACE("case " + std::to_string(i));
    expect_error([&] { build_compressed_slots(a); }, ErrorCode::kInvalidArgument, cases[i].parts);
    EXPECT_TRUE(all_equal(b.out, kCanary64));
  }
}

TEST(MetadataValidation, DeviceViewsGetStructuralChecksOnly) {
  // Structural errors are reported for device views too (no device memory is read: the
  // pointers below are never dereferenced).
  Spec1016 b;
  RingSlotArgs a;
  a.token_to_req = i32v(b.t2r);
  a.positions = TensorView::contiguous(b.positions.data(), DType::I32, {10});
  a.ring_block_table = table(b.ring_bt, 3, 1);
  a.num_actual_tokens = 7;
  a.ring_slots = i64v(b.slots);
  for (TensorView* v : {&a.token_to_req, &a.positions, &a.ring_block_table, &a.ring_slots})
    v->device = Device::CUDA;
  expect_error([&] { build_ring_slots(a); }, ErrorCode::kInvalidArgument,
               {"positions: dtype i32, expected i64"});
  if (built_with_cuda()) GTEST_SKIP() << "CUDA build: valid device views would be dispatched";
  a.positions = TensorView::contiguous(b.positions.data(), DType::I64, {10}, Device::CUDA);
  b.t2r[0] = 99;  // a bad value is not read for device views: the error is the missing backend
  expect_error([&] { build_ring_slots(a); }, ErrorCode::kInvalidArgument,
               {"build_ring_slots", "built without CUDA"});
  TensorView q = i32v(b.qsl), t = i32v(b.t2r);
  q.device = t.device = Device::CUDA;
  expect_error([&] { build_token_to_req({q, t, 7}); }, ErrorCode::kInvalidArgument,
               {"build_token_to_req", "built without CUDA"});
  EXPECT_TRUE(all_equal(b.slots, kCanary64));
}
