// sparse_decode (SPEC 9.2-9.4, 9.7) against the binary64 reference over the same key sets, for
// every record format of both caches, the head counts, s_q 1..6, empty rows, every sink kind and
// masked entries; the split-K schedule and the thread count never change a bit; outputs live in
// canary-filled buffers whose rows beyond T stay untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "attention/backend.hpp"
#include "attention/decode_case.hpp"

namespace dsv41kv::test {
namespace {

class Decode : public AttentionTest {
 protected:
  // Runs the case and checks it against the reference.
  void expect_case_agrees(const DecodeSpec& s, const std::string& what, int threads = 0) {
    SCOPED_TRACE(what + ", " + seed_text());
    DecodeCase c = DecodeCase::make(s, rng());
    Outputs o(s.T, s.H);
    ASSERT_NO_THROW(sparse_decode(c.args(o), ExecContext{nullptr, threads}));
    expect_agrees(o, c.expected(), what);
  }
};

TEST_F(Decode, EveryRecordFormatOfBothCachesAgreesWithTheReference) {
  for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::PLAIN_BF16,
                         RecordFormat::PLAIN_FP8}) {
    DecodeSpec s;
    s.swa_format = f;
    s.ratio = 2;
    expect_case_agrees(s, std::string("c2a, SWA ") + record_info(f).name + ", compressed v4_584");
    s.ratio = 0;
    expect_case_agrees(s, std::string("swaonly, SWA ") + record_info(f).name);
  }
  for (RecordFormat f : {RecordFormat::MXFP8_528, RecordFormat::NVFP4_288, RecordFormat::PLAIN_BF16,
                         RecordFormat::PLAIN_FP8}) {
    DecodeSpec s;
    s.ratio = 1;
    s.cmp_format = f;
    s.cmp_extra = 0;  // the default page stride
    expect_case_agrees(s, std::string("c1a, SWA v4_584, compressed ") + record_info(f).name);
  }
}

TEST_F(Decode, HeadCountsIncludingPaddedHeads) {
  for (int H : {8, 16, 32, 64}) {
    DecodeSpec s;
    s.H = H;
    s.T = 3;
    expect_case_agrees(s, "H = " + std::to_string(H));
  }
  DecodeSpec s;
  s.H = 128;
  s.real_heads = 64;  // heads 64..127: q = 0, sink -inf
  s.T = 3;
  s.ratio = 1;
  expect_case_agrees(s, "H = 128 with 64 padded heads");
}

// s_q only shapes the call (T = requests * s_q): every row keeps its own key set, and the bits
// are those of the same rows decoded with s_q = 1.
TEST_F(Decode, QueriesPerRequestOneToSix) {
  for (int sq = 1; sq <= 6; ++sq) {
    SCOPED_TRACE("s_q = " + std::to_string(sq) + ", " + seed_text());
    DecodeSpec s;
    s.T = 2 * sq;
    s.s_q = sq;
    DecodeCase c = DecodeCase::make(s, rng());
    Outputs o(s.T, s.H);
    sparse_decode(c.args(o));
    expect_agrees(o, c.expected(), "s_q = " + std::to_string(sq));
    c.spec.s_q = 1;
    c.plan(0, 1);
    Outputs o1(s.T, s.H);
    sparse_decode(c.args(o1));
    EXPECT_TRUE(o.same_bits(o1)) << "s_q changed a result";
  }
}

// SPEC 9.3: a row without a valid key (length 0, or every entry masked) is 0 with lse +inf
// whatever the sink; a +inf sink gives 0 with the lse of the scores; a -inf sink has no effect.
TEST_F(Decode, EmptyRowsAndSinks) {
  SCOPED_TRACE(seed_text());
  DecodeSpec s;
  s.T = 5;  // rows 1 (length 0) and 2 (all masked) are empty
  DecodeCase c = DecodeCase::make(s, rng());
  Outputs o(s.T, s.H);
  sparse_decode(c.args(o));
  expect_agrees(o, c.expected(), "empty rows and sinks");
  for (int64_t t : {1, 2})
    for (int h = 0; h < s.H; ++h) {
      EXPECT_EQ(o.lse[static_cast<size_t>(t * s.H + h)], kInf) << "row " << t << " head " << h;
      for (int d = 0; d < kLatentDim; ++d)
        ASSERT_EQ(o.out[static_cast<size_t>((t * s.H + h) * kLatentDim + d)], 0) << "row " << t << " head " << h;
    }
  // +inf-sink heads of rows with keys: exact zeros, with the finite lse of their scores
  for (int64_t t : {0, 3, 4})
    for (int h = 0; h < s.H; ++h) {
      if (c.sink[static_cast<size_t>(h)] != kInf) continue;
      EXPECT_TRUE(std::isfinite(o.lse[static_cast<size_t>(t * s.H + h)]));
      for (int d = 0; d < kLatentDim; ++d)
        ASSERT_EQ(o.out[static_cast<size_t>((t * s.H + h) * kLatentDim + d)], 0) << "+inf sink, row " << t;
    }
  // heads are independent: moving the finite sinks to -inf (no effect) leaves the other heads'
  // bits as they were, and the result agrees with the reference
  const std::vector<float> sinks = c.sink;
  for (auto& v : c.sink)
    if (std::isfinite(v)) v = -kInf;
  Outputs o2(s.T, s.H);
  sparse_decode(c.args(o2));
  expect_agrees(o2, c.expected(), "finite sinks moved to -inf");
  for (int64_t t = 0; t < s.T; ++t)
    for (int h = 0; h < s.H; ++h) {
      if (std::isfinite(sinks[static_cast<size_t>(h)])) continue;
      const size_t at = static_cast<size_t>(t * s.H + h) * kLatentDim;
      EXPECT_EQ(std::memcmp(o.out.data() + at, o2.out.data() + at, 2 * kLatentDim), 0) << "row " << t << " head " << h;
    }
}

// Fixed key blocks merged in block order: any split count and any thread count give the same
// bits, and the schedule plans enough items to use every thread when T is small.
TEST_F(Decode, SplitKAndThreadsNeverChangeABit) {
  for (int ratio : {0, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio) + ", " + seed_text());
    DecodeSpec s;
    s.T = 4;
    s.ratio = ratio;
    DecodeCase c = DecodeCase::make(s, rng());
    c.plan(1, 1);
    Outputs base(s.T, s.H);
    sparse_decode(c.args(base), ExecContext{nullptr, 1});
    expect_agrees(base, c.expected(), "no split");
    const int64_t blocks = c.schedule.key_blocks;
    EXPECT_EQ(blocks, ratio == 0 ? 2 : 10);
    for (int64_t splits = 1; splits <= blocks; ++splits)
      for (int threads : {1, 2, 3, 8}) {
        c.plan(splits, threads);
        Outputs o(s.T, s.H);
        sparse_decode(c.args(o), ExecContext{nullptr, threads});
        EXPECT_TRUE(o.same_bits(base)) << splits << " splits on " << threads << " threads";
        EXPECT_TRUE(o.rows_beyond_untouched());
      }
  }
}

TEST_F(Decode, ScheduleUsesEveryThreadForSmallBatches) {
  auto splits = [](LayerType l, int64_t T, int threads) {
    DecodeScheduleArgs a;
    a.layer = l;
    a.num_tokens = T;
    return plan_decode_schedule(a, ExecContext{nullptr, threads});
  };
  const DecodeSchedule c1 = splits(LayerType::kC1A, 1, 8);
  EXPECT_EQ(c1.key_width, 640);
  EXPECT_EQ(c1.key_blocks, 10);
  EXPECT_EQ(c1.splits, 8);
  EXPECT_EQ(c1.cmp_states_per_page, 64);
  EXPECT_EQ(splits(LayerType::kC2A, 1, 8).cmp_states_per_page, 32);
  EXPECT_EQ(splits(LayerType::kC2A, 2, 8).splits, 4);
  EXPECT_EQ(splits(LayerType::kC2A, 1, 64).splits, 10);  // at most one item per key block
  EXPECT_EQ(splits(LayerType::kSwaOnly, 1, 8).key_width, 128);
  EXPECT_EQ(splits(LayerType::kSwaOnly, 1, 8).splits, 2);
  EXPECT_EQ(splits(LayerType::kSwaOnly, 1, 8).cmp_states_per_page, 0);
  EXPECT_EQ(splits(LayerType::kC1A, 16, 8).splits, 1);
  EXPECT_EQ(splits(LayerType::kC1A, 0, 8).splits, 1);
}

// Strided views: q with head and token strides beyond 512, outputs inside wider rows, index rows
// with a larger row stride and cache pages beyond the default stride.
TEST_F(Decode, StridedViews) {
  SCOPED_TRACE(seed_text());
  DecodeSpec s;
  s.T = 3;
  s.swa_extra = 640;
  DecodeCase c = DecodeCase::make(s, rng());
  const int64_t hs = 512 + 32, ts = s.H * hs + 64;
  std::vector<uint16_t> qs(static_cast<size_t>(s.T * ts), 0x7FC0);
  for (int64_t t = 0; t < s.T; ++t)
    for (int h = 0; h < s.H; ++h)
      std::memcpy(qs.data() + t * ts + h * hs, c.q.data() + (t * s.H + h) * kLatentDim, 2 * kLatentDim);
  std::vector<int32_t> swa_wide(static_cast<size_t>(s.T * 200), 7);
  for (int64_t t = 0; t < s.T; ++t)
    std::memcpy(swa_wide.data() + t * 200, c.swa_idx.data() + t * kSwaWindow, 4 * kSwaWindow);
  const int64_t ohs = 512 + 16, ots = s.H * ohs;
  CanaryBuffer<uint16_t> ow(static_cast<size_t>(s.T * ots), kOutCanary);
  CanaryBuffer<float> lw(static_cast<size_t>(s.T * (s.H + 3)), kLseCanary);
  Outputs o(s.T, s.H);
  SparseDecodeArgs a = c.args(o);
  a.q = TensorView::strided(qs.data(), DType::BF16, {s.T, s.H, kLatentDim}, {ts, hs, 1});
  a.swa_indices = TensorView::strided(swa_wide.data(), DType::I32, {s.T, kSwaWindow}, {200, 1});
  a.out = TensorView::strided(ow.data(), DType::BF16, {s.T, s.H, kLatentDim}, {ots, ohs, 1});
  a.lse = TensorView::strided(lw.data(), DType::F32, {s.T, s.H}, {s.H + 3, 1});
  sparse_decode(a);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int h = 0; h < s.H; ++h) {
      std::memcpy(o.out.data() + (t * s.H + h) * kLatentDim, ow.data() + t * ots + h * ohs, 2 * kLatentDim);
      for (int64_t d = kLatentDim; d < ohs; ++d) ASSERT_EQ(ow[static_cast<size_t>(t * ots + h * ohs + d)], kOutCanary);
      o.lse[static_cast<size_t>(t * s.H + h)] = lw[static_cast<size_t>(t * (s.H + 3) + h)];
    }
    for (int64_t k = s.H; k < s.H + 3; ++k)
      ASSERT_EQ(num::f2u(lw[static_cast<size_t>(t * (s.H + 3) + k)]), num::f2u(kLseCanary));
  }
  expect_agrees(o, c.expected(), "strided views");
}

// The CUDA decode schedule (host planning, no device needed): the V4.1-Flash decode shape (64
// heads, s_q 2, 128 + 512 keys = 10 blocks) on 132 SMs needs no split from batch 66 up; small
// batches get 16-head tiles and enough splits to give every SM a CTA, never more splits than
// blocks; the workspace is sized by the split.
TEST(DecodeSchedule, CudaPlanSplitsOnlySmallBatchesAndFillsTheSms) {
  using detail::plan_cuda_decode;
  for (const int64_t T : {256, 512}) {
    const detail::CudaDecodePlan c = plan_cuda_decode(T, 64, 10, 132);
    EXPECT_EQ(c.splits, 1) << T;
    EXPECT_EQ(c.head_tile, 64) << T;
  }
  const detail::CudaDecodePlan b2 = plan_cuda_decode(4, 64, 10, 132);  // batch 2, s_q 2
  EXPECT_EQ(b2.head_tile, 16);
  EXPECT_GE(4 * 4 * b2.splits, 132);
  EXPECT_LE(b2.splits, 10);
  const detail::CudaDecodePlan m = plan_cuda_decode(40, 64, 10, 132);
  EXPECT_EQ(m.head_tile, 64);
  EXPECT_EQ(m.splits, 4);
  const detail::CudaDecodePlan h8 = plan_cuda_decode(8, 8, 2, 132);
  EXPECT_EQ(h8.head_tile, 16);
  EXPECT_EQ(h8.splits, 2);
  EXPECT_EQ(plan_cuda_decode(100, 128, 10, 132).splits, 1);
  EXPECT_EQ(plan_cuda_decode(0, 64, 10, 132).splits, 1);
  EXPECT_EQ(plan_cuda_decode(16, 32, 10, 132).head_tile, 32);
  for (const auto& [H, tile, ok] : {std::tuple{8, 16, true}, std::tuple{8, 32, false}, std::tuple{16, 16, true},
                                    std::tuple{16, 64, false}, std::tuple{32, 32, true}, std::tuple{64, 16, true},
                                    std::tuple{128, 64, true}, std::tuple{64, 48, false}, std::tuple{64, 0, false}})
    EXPECT_EQ(detail::cuda_head_tile_ok(H, tile), ok) << H << " " << tile;
  DecodeSchedule s;
  s.num_tokens = 4;
  s.num_heads = 64;
  s.splits = 3;
  EXPECT_EQ(sparse_decode_workspace_floats(s), 0);  // a CPU schedule: the CPU backend needs none
  s.device = Device::CUDA;
  EXPECT_EQ(sparse_decode_workspace_floats(s), 4 * 3 * 64 * 513);
  s.splits = 1;
  EXPECT_EQ(sparse_decode_workspace_floats(s), 0);
}

}  // namespace
}  // namespace dsv41kv::test
