// The read path's metadata (SPEC 6.2, 6.4 SWA slots, 6.6, 6.7): every builder against a literal
// evaluation of the SPEC on random batches (decodes with s_q 1 and 2, prefills at odd and even
// starts, short prefills after long ones, empty requests, padding rows, null-block requests,
// negative page ids), the whole canary-filled outputs compared; then every bad input: its message
// and untouched outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsv41kv/metadata.hpp"
#include "metadata/slots.hpp"
#include "support/canary.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

constexpr int32_t kCanary32 = 0x5A5A5A5A;
constexpr int64_t kCanary64 = 0x5A5A5A5A5A5A5A5ALL;
constexpr ErrorCode E8 = ErrorCode::kInvalidArgument;

// A random step (SPEC 6.1): decodes first, then prefills; positions num_computed + i; padding rows.
struct ReadBatch {
  int64_t spec = 0, num_reqs = 0, num_decodes = 0, A = 0, N = 0, max_tokens = 0;
  std::vector<int32_t> qsl{0}, t2r;
  std::vector<int64_t> pos, seq_lens;
  int64_t swa_cols = 0;
  std::vector<int32_t> swa_bt;  // [num_reqs, swa_cols] (one row when there is no request)
  std::vector<int64_t> slot_swa;

  int64_t qlen(int64_t b) const { return qsl[static_cast<size_t>(b + 1)] - qsl[static_cast<size_t>(b)]; }
  int64_t decode_tokens() const { return qsl[static_cast<size_t>(num_decodes)]; }
  int32_t swa_page(int64_t b, int64_t lp) const { return swa_bt[static_cast<size_t>(b * swa_cols + lp)]; }
};

ReadBatch make_batch(Rng& rng) {
  ReadBatch r;
  r.spec = rng.integer(0, 1);
  const int64_t thr = 1 + r.spec;
  r.num_decodes = rng.integer(0, 5);
  const int64_t prefills = rng.integer(0, 3);
  r.num_reqs = r.num_decodes + prefills;
  std::vector<int64_t> lens, computed;
  for (int64_t b = 0; b < r.num_reqs; ++b) {
    int64_t q;
    if (b < r.num_decodes)
      q = rng.integer(0, 9) == 0 ? 0 : rng.integer(1, thr);  // s_q 1 or 2 (spec decode)
    else if (b == r.num_decodes)
      q = rng.integer(thr + 1, 40);  // ends the decode part
    else
      q = rng.integer(1, 40);  // may be short: still a prefill
    lens.push_back(q);
    computed.push_back(rng.integer(0, 9) < 3 ? rng.integer(0, 3) : rng.integer(0, 300));
  }
  for (int64_t b = 0; b < r.num_reqs; ++b) {
    r.qsl.push_back(static_cast<int32_t>(r.qsl.back() + lens[static_cast<size_t>(b)]));
    r.seq_lens.push_back(computed[static_cast<size_t>(b)] + lens[static_cast<size_t>(b)]);
    for (int64_t i = 0; i < lens[static_cast<size_t>(b)]; ++i) {
      r.pos.push_back(computed[static_cast<size_t>(b)] + i);
      r.t2r.push_back(static_cast<int32_t>(b));
    }
  }
  r.A = r.qsl.back();
  r.N = r.A + rng.integer(0, 3);
  r.max_tokens = r.N + rng.integer(0, 4);
  r.pos.resize(static_cast<size_t>(r.N), 0);
  r.t2r.resize(static_cast<size_t>(r.N), 0);
  r.swa_cols = 400 / 32 + 1;
  r.swa_bt.resize(static_cast<size_t>(std::max<int64_t>(r.num_reqs, 1) * r.swa_cols));
  for (int64_t b = 0; b < std::max<int64_t>(r.num_reqs, 1); ++b) {
    const bool null_request = rng.integer(0, 5) == 0;
    for (int64_t c = 0; c < r.swa_cols; ++c)
      r.swa_bt[static_cast<size_t>(b * r.swa_cols + c)] = null_request ? 0 : static_cast<int32_t>(rng.integer(-2, 40));
  }
  r.slot_swa.assign(static_cast<size_t>(r.N), kCanary64);
  TokenSlotArgs ts;
  ts.token_to_req = view_of(r.t2r);
  ts.positions = view_of(r.pos);
  ts.block_table = view_of(r.swa_bt, {r.num_reqs, r.swa_cols});
  ts.num_actual_tokens = r.A;
  ts.page = 32;
  ts.slots = view_of(r.slot_swa);
  build_token_slots(ts);
  return r;
}

// Decode token t's request (decodes come first).
int64_t request_of(const ReadBatch& r, int64_t t) { return r.t2r[static_cast<size_t>(t)]; }

// f(batch, rng) on n random batches from a fresh seed (named, with the iteration, on failure).
template <class F>
void for_random_batches(uint64_t salt, int n, F&& f) {
  const uint64_t seed = run_seed() ^ salt;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int it = 0; it < n && !::testing::Test::HasFatalFailure(); ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    ReadBatch r = make_batch(rng);
    f(r, rng);
  }
}

// ============================================================================ SPEC 6.2, 6.4

TEST(ReadPathSplit, SharedRuleAndSwaSlotsOfPage32) {
  for_random_batches(0x6A1, 200, [&](ReadBatch& r, [[maybe_unused]] Rng& rng) {
    const DecodeSplit sp = split_decode_prefill(view_of(r.qsl), r.spec);
    std::vector<int32_t> lens;
    for (int64_t b = 0; b < r.num_reqs; ++b) lens.push_back(static_cast<int32_t>(r.qlen(b)));
    ASSERT_EQ(sp.num_decodes, num_decode_requests(lens.data(), r.num_reqs, r.spec));
    ASSERT_EQ(sp.num_decodes, r.num_decodes);
    ASSERT_EQ(sp.num_reqs, r.num_reqs);
    ASSERT_EQ(sp.num_decode_tokens, r.decode_tokens());
    ASSERT_EQ(sp.num_prefills, r.num_reqs - r.num_decodes);
    ASSERT_EQ(sp.num_prefill_tokens, r.A - r.decode_tokens());
    // SPEC 6.4 SWA: slot_swa = bt_swa[b][p / 32] * 32 + p % 32, -1 for pages <= 0 and padding rows
    for (int64_t t = 0; t < r.N; ++t) {
      int64_t want = -1;
      if (t < r.A) {
        const int64_t p = r.pos[static_cast<size_t>(t)];
        const int32_t pg = r.swa_page(request_of(r, t), p / 32);
        want = pg > 0 ? pg * 32 + p % 32 : -1;
      }
      ASSERT_EQ(r.slot_swa[static_cast<size_t>(t)], want) << "token " << t;
    }
  });
  // the worked split: threshold 2 (spec 1): [1, 2, 1] decode, 3 prefill, then a short prefill
  std::vector<int32_t> q{0, 1, 3, 4, 7, 8};
  const DecodeSplit s = split_decode_prefill(view_of(q), 1);
  EXPECT_EQ(s.num_decodes, 3);
  EXPECT_EQ(s.num_decode_tokens, 4);
  EXPECT_EQ(s.num_prefills, 2);
  EXPECT_EQ(s.num_prefill_tokens, 4);
  EXPECT_EQ(split_decode_prefill(view_of(q), 0).num_decodes, 1);
}

// ============================================================================ window rows (6.6)

struct WindowOut {
  std::vector<int32_t> idx, len;
  explicit WindowOut(int64_t rows, int64_t cols = 128)
      : idx(static_cast<size_t>(rows * cols), kCanary32), len(static_cast<size_t>(rows), kCanary32) {}
};

SwaWindowArgs window_args(ReadBatch& r, WindowOut& o) {
  SwaWindowArgs a;
  a.qsl = view_of(r.qsl);
  a.num_speculative_tokens = r.spec;
  a.positions = view_of(r.pos);
  a.slot_swa = view_of(r.slot_swa);
  a.block_table = view_of(r.swa_bt, {r.num_reqs, r.swa_cols});
  a.indices = view_of(o.idx, {r.max_tokens, 128});
  a.lengths = view_of(o.len);
  return a;
}

TEST(SwaWindow, RandomBatchesMatchTheLiteralRows) {
  for_random_batches(0x6A2, 200, [&](ReadBatch& r, [[maybe_unused]] Rng& rng) {
    WindowOut o(r.max_tokens);
    const DecodeSplit sp = build_swa_window(window_args(r, o), ExecContext{nullptr, 1});
    ASSERT_EQ(sp.num_decode_tokens, r.decode_tokens());
    WindowOut e(r.max_tokens);
    for (int64_t t = 0; t < r.max_tokens; ++t) {
      int32_t* row = e.idx.data() + t * 128;
      if (t >= r.decode_tokens()) {
        e.len[static_cast<size_t>(t)] = 0;  // the row keeps its canary
        continue;
      }
      if (r.slot_swa[static_cast<size_t>(t)] < 0) {
        std::fill(row, row + 128, -1);
        e.len[static_cast<size_t>(t)] = 0;
        continue;
      }
      const int64_t p = r.pos[static_cast<size_t>(t)], start = std::max<int64_t>(p - 127, 0), n = p - start + 1;
      for (int64_t k = 0; k < 128; ++k) {
        int32_t v = -1;
        if (k < n) {
          const int32_t pg = r.swa_page(request_of(r, t), (start + k) / 32);
          v = pg > 0 ? static_cast<int32_t>(pg * 32 + (start + k) % 32) : -1;
        }
        row[k] = v;
      }
      e.len[static_cast<size_t>(t)] = static_cast<int32_t>(n);
    }
    ASSERT_EQ(o.idx, e.idx);
    ASSERT_EQ(o.len, e.len);
  });
}

TEST(SwaWindow, WorkedExample) {
  // one decode at position 200 (window 73..200: pages 2..6), one decode at 5 with a slot of -1
  // (invalid token), then a prefill; page 4 of request 0 is null.
  std::vector<int32_t> qsl{0, 1, 2, 12};
  std::vector<int64_t> pos{200, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0};
  std::vector<int64_t> slot{7 * 32 + 8, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1};
  std::vector<int32_t> bt{9, 9, 3, 5, 0, 6, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};  // [3, 7] + spare
  std::vector<int32_t> idx(5 * 128, kCanary32), len(5, kCanary32);
  SwaWindowArgs a;
  a.qsl = view_of(qsl);
  a.positions = view_of(pos);
  a.slot_swa = view_of(slot);
  a.block_table = view_of(bt, {3, 7});
  a.indices = view_of(idx, {5, 128});
  a.lengths = view_of(len);
  build_swa_window(a);
  EXPECT_EQ(len, (std::vector<int32_t>{128, 0, 0, 0, 0}));
  // position 73 + k: page (73 + k) / 32 of row 0 = [9, 9, 3, 5, 0, 6, 7]
  for (int k = 0; k < 128; ++k) {
    const int u = 73 + k;
    const int pg = bt[static_cast<size_t>(u / 32)];
    EXPECT_EQ(idx[static_cast<size_t>(k)], pg > 0 ? pg * 32 + u % 32 : -1) << k;
  }
  EXPECT_EQ(idx[0], 3 * 32 + 9);    // position 73: logical page 2 -> page 3
  EXPECT_EQ(idx[55], -1);           // position 128: logical page 4 is null
  EXPECT_EQ(idx[127], 7 * 32 + 8);  // position 200: logical page 6 -> page 7
  for (int k = 0; k < 128; ++k) EXPECT_EQ(idx[static_cast<size_t>(128 + k)], -1);  // invalid token
  for (size_t i = 2 * 128; i < idx.size(); ++i) EXPECT_EQ(idx[i], kCanary32);      // not a decode row
}

// ============================================================================ prefill gather (6.6)

TEST(PrefillGather, RandomBatchesMatchTheFormula) {
  for_random_batches(0x6A3, 200, [&](ReadBatch& r, [[maybe_unused]] Rng& rng) {
    const int64_t n = r.num_reqs - r.num_decodes + rng.integer(0, 3);
    std::vector<int64_t> g(static_cast<size_t>(n), kCanary64), gs(g);
    PrefillGatherArgs a;
    a.qsl = view_of(r.qsl);
    a.num_speculative_tokens = r.spec;
    a.seq_lens = view_of(r.seq_lens);
    a.gather_lens = view_of(g);
    a.gather_starts = view_of(gs);
    build_prefill_gather(a);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = r.num_decodes + i;
      int64_t G = 0, start = 0;
      if (b < r.num_reqs) {
        const int64_t q = r.qlen(b), prefix = r.seq_lens[static_cast<size_t>(b)] - q;
        G = q + std::min<int64_t>(prefix, 127);
        start = r.seq_lens[static_cast<size_t>(b)] - G;
      }
      ASSERT_EQ(g[static_cast<size_t>(i)], G) << "prefill " << i;
      ASSERT_EQ(gs[static_cast<size_t>(i)], start) << "prefill " << i;
    }
  });
  // worked: prefix 0, 1, 127, 128, 500 with query lengths 5
  std::vector<int32_t> q{0, 5, 10, 15, 20, 25};
  std::vector<int64_t> sl{5, 6, 132, 133, 505}, g(6, kCanary64), gs(6, kCanary64);
  PrefillGatherArgs a;
  a.qsl = view_of(q);
  a.seq_lens = view_of(sl);
  a.gather_lens = view_of(g);
  a.gather_starts = view_of(gs);
  build_prefill_gather(a);
  EXPECT_EQ(g, (std::vector<int64_t>{5, 6, 132, 132, 132, 0}));
  EXPECT_EQ(gs, (std::vector<int64_t>{0, 0, 0, 1, 373, 0}));
}

// ============================================================================ top-k slots (6.6)

struct TopkCase {
  int64_t S = 0, cols = 0;
  std::vector<int32_t> bt, topk;  // topk [max_tokens, K]
  int64_t K = 0;
};

TopkCase make_topk(const ReadBatch& r, Rng& rng) {
  TopkCase c;
  c.S = rng.integer(0, 1) ? 32 : 4;
  c.K = rng.integer(0, 2) == 0 ? 512 : rng.integer(1, 40);
  c.cols = 12;
  c.bt.resize(static_cast<size_t>(std::max<int64_t>(r.num_reqs, 1) * c.cols));
  for (auto& x : c.bt) x = static_cast<int32_t>(rng.integer(-2, 30));
  c.topk.resize(static_cast<size_t>(r.max_tokens * c.K));
  for (int64_t t = 0; t < r.max_tokens; ++t) {
    int32_t* row = c.topk.data() + t * c.K;
    if (t >= r.decode_tokens()) {
      for (int64_t k = 0; k < c.K; ++k) row[k] = static_cast<int32_t>(rng.integer(-5, 1 << 30));  // never read
      continue;
    }
    const int64_t n = rng.integer(0, c.K);  // a valid prefix, then -1
    for (int64_t k = 0; k < c.K; ++k) row[k] = k < n ? static_cast<int32_t>(rng.integer(0, c.S * c.cols - 1)) : -1;
    if (n > 2 && rng.integer(0, 3) == 0) row[rng.integer(0, n - 1)] = -1;  // a -1 inside the prefix
  }
  return c;
}

TEST(DecodeTopkSlots, RandomBatchesMatchTheLiteralRows) {
  for_random_batches(0x6A4, 200, [&](ReadBatch& r, [[maybe_unused]] Rng& rng) {
    TopkCase c = make_topk(r, rng);
    WindowOut o(r.max_tokens, c.K);
    DecodeTopkSlotArgs a;
    a.qsl = view_of(r.qsl);
    a.num_speculative_tokens = r.spec;
    a.slot_swa = view_of(r.slot_swa);
    a.topk = view_of(c.topk, {r.max_tokens, c.K});
    a.block_table = view_of(c.bt, {r.num_reqs, c.cols});
    a.states_per_page = c.S;
    a.indices = view_of(o.idx, {r.max_tokens, c.K});
    a.lengths = view_of(o.len);
    build_decode_topk_slots(a);
    WindowOut e(r.max_tokens, c.K);
    for (int64_t t = 0; t < r.max_tokens; ++t) {
      if (t >= r.decode_tokens()) {
        e.len[static_cast<size_t>(t)] = 0;
        continue;
      }
      const bool valid = r.slot_swa[static_cast<size_t>(t)] >= 0;
      int32_t n = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t i = c.topk[static_cast<size_t>(t * c.K + k)];
        int32_t g = -1;
        if (valid && i >= 0) {
          const int32_t pg = c.bt[static_cast<size_t>(request_of(r, t) * c.cols + i / c.S)];
          g = pg > 0 ? static_cast<int32_t>(pg * c.S + i % c.S) : -1;
        }
        e.idx[static_cast<size_t>(t * c.K + k)] = g;
        n += g >= 0;
      }
      e.len[static_cast<size_t>(t)] = n;
    }
    ASSERT_EQ(o.idx, e.idx);
    ASSERT_EQ(o.len, e.len);
  });
}

// ============================================================================ sparse-MLA metadata (6.7)

TEST(SparseMlaMetadata, EveryLayerTypeOfTheModelOnEveryProfile) {
  const ModelConfig cfg = deepseek_v41_flash();
  for_random_batches(0x6A5, 60, [&](ReadBatch& r, [[maybe_unused]] Rng& rng) {
    std::vector<int32_t> cbt(static_cast<size_t>(std::max<int64_t>(r.num_reqs, 1) * 8));
    for (auto& x : cbt) x = static_cast<int32_t>(rng.integer(-1, 50));
    for (const ComputeDevice& dev : {ComputeDevice::cpu(), ComputeDevice::cpu(true), ComputeDevice::cuda(9, 0)})
      for (int ratio = 0; ratio <= 2; ++ratio) {
        if (!cfg.has_ratio(ratio)) continue;  // built once per layer type present
        SCOPED_TRACE(dev.describe() + " ratio " + std::to_string(ratio));
        std::vector<int32_t> t2r(static_cast<size_t>(r.N), kCanary32);
        build_token_to_req({view_of(r.qsl), view_of(t2r), r.A});
        const std::vector<int32_t> t2r_before = t2r;
        std::vector<int64_t> cs(static_cast<size_t>(r.N), kCanary64);
        SparseMlaMetadataArgs a;
        a.type = layer_type_of_ratio(ratio);
        a.device = dev;
        a.num_speculative_tokens = r.spec;
        a.qsl = view_of(r.qsl);
        a.positions = view_of(r.pos);
        a.req_id_per_token = view_of(t2r);
        if (ratio > 0) {
          a.block_table = view_of(cbt, {r.num_reqs, 8});
          a.token_slots = view_of(r.slot_swa);
          a.compressed_slots = view_of(cs);
        }
        const SparseMlaMetadata m = build_sparse_mla_metadata(a);
        const int64_t block = dev.sm100_profile ? 128 : 64;  // the CPU, its SM100 profile, sm_90
        EXPECT_EQ(m.kernel_block_size, block);
        EXPECT_EQ(m.type, a.type);
        EXPECT_EQ(m.ratio, ratio);
        EXPECT_EQ(m.num_actual_tokens, r.A);
        EXPECT_EQ(m.num_tokens, r.N);
        EXPECT_EQ(m.split.num_decodes, r.num_decodes);
        EXPECT_EQ(m.topk_tokens, ratio > 0 ? 512 : 0);
        EXPECT_EQ(m.states_per_page, ratio > 0 ? block / ratio : 0);
        EXPECT_EQ(m.req_id_per_token.data, t2r.data());
        EXPECT_EQ(t2r, t2r_before);
        if (ratio == 0) {
          EXPECT_FALSE(m.compressed_slots.present());
          continue;
        }
        // SPEC 6.5 literally, S_r = block / r
        const int64_t S = block / ratio;
        for (int64_t t = 0; t < r.N; ++t) {
          int64_t want = -1;
          const int64_t p = r.pos[static_cast<size_t>(t)];
          if (t < r.A && (p + 1) % ratio == 0 && r.slot_swa[static_cast<size_t>(t)] != -1) {
            const int64_t s = p / ratio;
            const int32_t pg = cbt[static_cast<size_t>(request_of(r, t) * 8 + s / S)];
            want = pg > 0 ? pg * S + s % S : -1;
          }
          ASSERT_EQ(cs[static_cast<size_t>(t)], want) << "token " << t;
        }
      }
  });
}

// ============================================================================ bad inputs

// The fixed batch of the validation cases: decodes at 150 (s_q 1) and 40, 41 (s_q 2), a prefill
// of 3 tokens, two padding rows.
struct Fixed {
  std::vector<int32_t> qsl{0, 1, 3, 6};
  std::vector<int64_t> pos{150, 40, 41, 7, 8, 9, 0, 0};
  std::vector<int64_t> slot{5 * 32 + 22, 2 * 32 + 8, 2 * 32 + 9, 1, 2, 3, -1, -1};
  std::vector<int32_t> bt{1, 2, 3, 4, 5, 6, 7, 2, 2, 2, 2, 2, 2, 2, 8, 8, 8, 8, 8, 8, 8};  // [3, 7]
  std::vector<int32_t> idx = std::vector<int32_t>(10 * 128, kCanary32), len = std::vector<int32_t>(10, kCanary32);
  std::vector<int32_t> topk = std::vector<int32_t>(10 * 16, -1);
  std::vector<int64_t> seq{151, 42, 10}, g = std::vector<int64_t>(2, kCanary64),
                                         gs = std::vector<int64_t>(2, kCanary64);
  std::vector<int32_t> t2r{0, 1, 1, 2, 2, 2, 0, 0};
  std::vector<int64_t> cs = std::vector<int64_t>(8, kCanary64);
  Fixed() {
    for (int t = 0; t < 3; ++t)
      for (int k = 0; k < 5; ++k) topk[static_cast<size_t>(t * 16 + k)] = t * 7 + k;
  }
  bool untouched() const {
    return std::all_of(idx.begin(), idx.end(), [](int32_t v) { return v == kCanary32; }) &&
           std::all_of(len.begin(), len.end(), [](int32_t v) { return v == kCanary32; }) &&
           std::all_of(g.begin(), g.end(), [](int64_t v) { return v == kCanary64; }) &&
           std::all_of(gs.begin(), gs.end(), [](int64_t v) { return v == kCanary64; }) &&
           std::all_of(cs.begin(), cs.end(), [](int64_t v) { return v == kCanary64; });
  }
  SwaWindowArgs window() {
    SwaWindowArgs a;
    a.qsl = view_of(qsl);
    a.num_speculative_tokens = 1;
    a.positions = view_of(pos);
    a.slot_swa = view_of(slot);
    a.block_table = view_of(bt, {3, 7});
    a.indices = view_of(idx, {10, 128});
    a.lengths = view_of(len);
    return a;
  }
  DecodeTopkSlotArgs topk_args() {
    DecodeTopkSlotArgs a;
    a.qsl = view_of(qsl);
    a.num_speculative_tokens = 1;
    a.slot_swa = view_of(slot);
    a.topk = view_of(topk, {10, 16});
    a.block_table = view_of(bt, {3, 7});
    a.states_per_page = 4;
    a.indices = TensorView::contiguous(idx.data(), DType::I32, {10, 16});
    a.lengths = view_of(len);
    return a;
  }
  PrefillGatherArgs gather() {
    PrefillGatherArgs a;
    a.qsl = view_of(qsl);
    a.num_speculative_tokens = 1;
    a.seq_lens = view_of(seq);
    a.gather_lens = view_of(g);
    a.gather_starts = view_of(gs);
    return a;
  }
  SparseMlaMetadataArgs sparse() {
    SparseMlaMetadataArgs a;
    a.type = LayerType::kC2A;
    a.num_speculative_tokens = 1;
    a.qsl = view_of(qsl);
    a.positions = view_of(pos);
    a.block_table = view_of(bt, {3, 7});
    a.req_id_per_token = view_of(t2r);
    a.compressed_slots = view_of(cs);
    return a;
  }
};

template <class Args>
struct Bad {
  const char* name;
  std::function<void(Fixed&, Args&)> mutate;
  ErrorCode code;
  std::vector<std::string> parts;
};

template <class Args, class Make, class Call>
void run_bad(const std::vector<Bad<Args>>& cases, Make make, Call call) {
  {
    Fixed f;  // the unmutated call is valid
    Args a = make(f);
    EXPECT_NO_THROW(call(a, ExecContext{}));
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Fixed f;
    Args a = make(f);
    c.mutate(f, a);
    const ExecContext ctx{nullptr, std::string(c.name) == "threads" ? -1 : 0};
    expect_error([&] { call(a, ctx); }, c.code, c.parts);
    EXPECT_TRUE(f.untouched()) << "an output was written";
  }
}

void all_on_cuda(std::initializer_list<TensorView*> vs) {
  for (TensorView* v : vs) v->device = Device::CUDA;
}

TEST(ReadPathValidation, SwaWindow) {
  using A = SwaWindowArgs;
  const std::vector<Bad<A>> cases = {
      {"threads", [](Fixed&, A&) {}, E8, {"build_swa_window: ctx.num_threads = -1"}},
      {"qsl dtype", [](Fixed&, A& a) { a.qsl.dtype = DType::I64; }, E8, {"build_swa_window: qsl: dtype i64"}},
      {"qsl start", [](Fixed& f, A&) { f.qsl[0] = 1; }, E8, {"build_swa_window: qsl: qsl[0] = 1, expected 0"}},
      {"qsl order", [](Fixed& f, A&) { f.qsl[2] = 0; }, E8, {"qsl[2] = 0 < qsl[1] = 1, expected non-decreasing"}},
      {"spec", [](Fixed&, A& a) { a.num_speculative_tokens = -1; }, E8, {"num_speculative_tokens: -1, expected >= 0"}},
      {"positions dtype", [](Fixed&, A& a) { a.positions.dtype = DType::I32; }, E8, {"positions: dtype i32"}},
      {"positions short",
       [](Fixed&, A& a) { a.positions.shape[0] = 2; },
       E8,
       {"positions: 2 entries, expected at least 3 (num_decode_tokens)"}},
      {"slot short", [](Fixed&, A& a) { a.slot_swa.shape[0] = 1; }, E8, {"slot_swa: 1 entries, expected at least 3"}},
      {"table dtype", [](Fixed&, A& a) { a.block_table.dtype = DType::I64; }, E8, {"block_table: dtype i64"}},
      {"table rows",
       [](Fixed&, A& a) { a.block_table.shape[0] = 1; },
       E8,
       {"block_table: 1 rows, expected at least num_decodes = 2"}},
      {"indices width",
       [](Fixed&, A& a) {
         a.indices.shape[1] = 64;
         a.indices.stride[0] = 64;
       },
       E8,
       {"indices: shape[1] = 64, expected 128"}},
      {"indices rows",
       [](Fixed&, A& a) { a.indices.shape[0] = 9; },
       E8,
       {"indices: 9 rows, expected max_tokens = 10 (the length of lengths)"}},
      {"lengths short",
       [](Fixed&, A& a) {
         a.lengths.shape[0] = 2;
         a.indices.shape[0] = 2;
       },
       E8,
       {"lengths: 2 entries, expected at least 3 (num_decode_tokens)"}},
      {"lengths dtype", [](Fixed&, A& a) { a.lengths.dtype = DType::I64; }, E8, {"lengths: dtype i64"}},
      {"page", [](Fixed&, A& a) { a.page = 0; }, E8, {"page: 0, expected 0 < tokens per page < 2^31"}},
      {"num_pages", [](Fixed&, A& a) { a.num_pages = -2; }, E8, {"num_pages: -2, expected -1 (unchecked) or >= 0"}},
      {"negative position", [](Fixed& f, A&) { f.pos[1] = -4; }, E8, {"positions[1] = -4 (request 1), expected >= 0"}},
      {"beyond the row",
       [](Fixed& f, A&) { f.pos[0] = 7 * 32; },
       E8,
       {"block_table: token 0 (request 0, position 224): window position 224 lies in logical page 7 (32 per page), "
        "expected < 7 columns"}},
      {"page id range",
       [](Fixed&, A& a) { a.num_pages = 5; },
       E8,
       {"block_table[0][4] = 5 (token 0 (request 0, position 150): window position 128), expected a page id < "
        "num_pages = 5"}},
      {"slot beyond i32",
       [](Fixed& f, A& a) {
         f.bt[4] = 0x7FFFFFFF;
         a.page = 32;
       },
       E8,
       {"block_table[0][4] = 2147483647", "expected a slot < 2^31"}},
      {"device mixed",
       [](Fixed&, A& a) { a.lengths.device = Device::CUDA; },
       E8,
       {"lengths: on cuda, expected cpu like qsl"}},
      {"host split differs",
       [](Fixed&, A& a) {
         static DecodeSplit wrong;
         wrong = split_decode_prefill(a.qsl, a.num_speculative_tokens);
         wrong.num_decodes += 1;
         a.split = &wrong;
       },
       E8,
       {"build_swa_window: split: {num_reqs", "expected the split of qsl {num_reqs"}},
      {"on cuda",
       [](Fixed&, A& a) {
         all_on_cuda({&a.qsl, &a.positions, &a.slot_swa, &a.block_table, &a.indices, &a.lengths});
       },
       E8,
       {"build_swa_window: split: null with device views, expected the split the host made of its copy of qsl"}},
  };
  run_bad<A>(
      cases, [](Fixed& f) { return f.window(); }, [](const A& a, const ExecContext& c) { build_swa_window(a, c); });
}

TEST(ReadPathValidation, PrefillGather) {
  using A = PrefillGatherArgs;
  const std::vector<Bad<A>> cases = {
      {"threads", [](Fixed&, A&) {}, E8, {"build_prefill_gather: ctx.num_threads = -1"}},
      {"qsl absent", [](Fixed&, A& a) { a.qsl = TensorView{}; }, E8, {"build_prefill_gather: qsl: absent"}},
      {"seq dtype", [](Fixed&, A& a) { a.seq_lens.dtype = DType::I32; }, E8, {"seq_lens: dtype i32"}},
      {"seq short",
       [](Fixed&, A& a) { a.seq_lens.shape[0] = 2; },
       E8,
       {"seq_lens: 2 entries, expected at least 3 (num_reqs)"}},
      {"starts length",
       [](Fixed&, A& a) { a.gather_starts.shape[0] = 1; },
       E8,
       {"gather_starts: 1 entries, expected 2 (the length of gather_lens)"}},
      {"outputs short",
       [](Fixed&, A& a) {
         a.gather_lens.shape[0] = 0;
         a.gather_starts.shape[0] = 0;
       },
       E8,
       {"gather_lens: 0 entries, expected at least 1 (num_prefills)"}},
      {"seq below query",
       [](Fixed& f, A&) { f.seq[2] = 2; },
       E8,
       {"seq_lens[2] = 2 < query_len = 3 (prefill request 2)"}},
      {"on cuda",
       [](Fixed&, A& a) {
         all_on_cuda({&a.qsl, &a.seq_lens, &a.gather_lens, &a.gather_starts});
       },
       E8,
       {"build_prefill_gather: the views are on cuda, but build_prefill_gather has no CUDA backend yet"}},
  };
  run_bad<A>(
      cases, [](Fixed& f) { return f.gather(); }, [](const A& a, const ExecContext& c) { build_prefill_gather(a, c); });
}

TEST(ReadPathValidation, DecodeTopkSlots) {
  using A = DecodeTopkSlotArgs;
  const std::vector<Bad<A>> cases = {
      {"threads", [](Fixed&, A&) {}, E8, {"build_decode_topk_slots: ctx.num_threads = -1"}},
      {"topk dtype", [](Fixed&, A& a) { a.topk.dtype = DType::I64; }, E8, {"build_decode_topk_slots: topk: dtype i64"}},
      {"topk rows", [](Fixed&, A& a) { a.topk.shape[0] = 2; }, E8, {"topk: 2 entries, expected at least 3"}},
      {"indices width", [](Fixed&, A& a) { a.indices.shape[1] = 8; }, E8, {"indices: shape[1] = 8, expected 16"}},
      {"S",
       [](Fixed&, A& a) { a.states_per_page = 0; },
       E8,
       {"states_per_page: 0, expected 0 < states per page < 2^31"}},
      {"beyond the row",
       [](Fixed& f, A&) { f.topk[16 + 2] = 7 * 4; },
       E8,
       {"block_table: token 1 (request 1): topk[1][2] = 28 lies in logical page 7 (4 per page), expected < 7 columns"}},
      {"page id range",
       [](Fixed&, A& a) { a.num_pages = 2; },
       E8,
       {"block_table[0][1] = 2 (token 0 (request 0): topk[0][4] = 4), expected a page id < num_pages = 2"}},
      {"on cuda",
       [](Fixed&, A& a) {
         all_on_cuda({&a.qsl, &a.slot_swa, &a.topk, &a.block_table, &a.indices, &a.lengths});
       },
       E8,
       {"build_decode_topk_slots: split: null with device views"}},
  };
  run_bad<A>(
      cases, [](Fixed& f) { return f.topk_args(); },
      [](const A& a, const ExecContext& c) { build_decode_topk_slots(a, c); });
}

TEST(ReadPathValidation, SparseMlaMetadata) {
  using A = SparseMlaMetadataArgs;
  const std::vector<Bad<A>> cases = {
      {"threads", [](Fixed&, A&) {}, E8, {"build_sparse_mla_metadata: ctx.num_threads = -1"}},
      {"type", [](Fixed&, A& a) { a.type = static_cast<LayerType>(3); }, E8, {"type: unknown layer type 3"}},
      {"req dtype", [](Fixed&, A& a) { a.req_id_per_token.dtype = DType::I64; }, E8, {"req_id_per_token: dtype i64"}},
      {"req short",
       [](Fixed&, A& a) {
         a.req_id_per_token.shape[0] = 5;
         a.compressed_slots.shape[0] = 5;
       },
       E8,
       {"req_id_per_token: 5 entries, expected N >= num_actual_tokens = qsl[num_reqs] = 6"}},
      {"req wrong",
       [](Fixed& f, A&) { f.t2r[2] = 0; },
       E8,
       {"req_id_per_token[2] = 0, expected 1 (the request of token 2 by qsl)"}},
      {"req padding", [](Fixed& f, A&) { f.t2r[7] = 2; }, E8, {"req_id_per_token[7] = 2 (padding row), expected 0"}},
      {"slots absent", [](Fixed&, A& a) { a.compressed_slots = TensorView{}; }, E8, {"compressed_slots: absent"}},
      {"swaonly with a table",
       [](Fixed&, A& a) {
         a.type = LayerType::kSwaOnly;
         a.compressed_slots = TensorView{};
       },
       E8,
       {"block_table: present, expected absent for swaonly layers"}},
      {"S", [](Fixed&, A& a) { a.states_per_page = -3; }, E8, {"states_per_page: -3"}},
      {"compressed slots checked",
       [](Fixed&, A& a) { a.block_table.shape[1] = 0; },
       E8,
       {"build_compressed_slots: block_table"}},
      {"compressed values checked",
       [](Fixed& f, A&) { f.pos[5] = 7 * 2 * 32 + 1; },
       E8,
       {"build_compressed_slots: block_table: token 5 (request 2, position 449)"}},
      {"on cuda",
       [](Fixed&, A& a) {
         all_on_cuda({&a.qsl, &a.positions, &a.block_table, &a.req_id_per_token, &a.compressed_slots});
       },
       E8,
       {"build_sparse_mla_metadata: the views are on cuda, but build_sparse_mla_metadata has no CUDA backend yet"}},
  };
  run_bad<A>(
      cases, [](Fixed& f) { return f.sparse(); },
      [](const A& a, const ExecContext& c) { (void)build_sparse_mla_metadata(a, c); });
}

// The index-row entry both backends share (metadata/slots.hpp): the slot, or -1 for the null page
// and where a CPU builder reports an error (a page id >= num_pages, a slot beyond int32), which is
// what a device builder writes there.
TEST(ReadPathRowEntry, NullPagesBoundsAndInt32) {
  EXPECT_EQ(detail::row_entry(3, 32, 5, -1), 101);
  EXPECT_EQ(detail::row_entry(3, 32, 5, 4), 101);
  EXPECT_EQ(detail::row_entry(0, 32, 5, -1), -1);
  EXPECT_EQ(detail::row_entry(-7, 32, 5, -1), -1);
  EXPECT_EQ(detail::row_entry(4, 32, 5, 4), -1);
  EXPECT_EQ(detail::row_entry((int64_t{1} << 26) - 1, 32, 31, -1), 0x7FFFFFFF);  // the largest i32 slot
  EXPECT_EQ(detail::row_entry(int64_t{1} << 26, 32, 0, -1), -1);                 // 2^31
  EXPECT_EQ(detail::row_entry(int64_t{1} << 26, 64, 0, -1), -1);            // 2^32: beyond int32
}

}  // namespace
}  // namespace dsv41kv::test
