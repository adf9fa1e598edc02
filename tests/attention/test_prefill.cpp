// The prefill path (SPEC 9.5): the workspace capacity and greedy chunk plan, the workspace gather
// and the combined index rows against literal evaluations of the SPEC's rules (canary-filled
// outputs compared whole), sparse_prefill against the binary64 reference, and the whole chain
// against sparse_decode on the same key sets (SPEC 9.5's last sentence): the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "attention/decode_case.hpp"
#include "support/compare.hpp"

namespace dsv41kv::test {
namespace {

using Chunks = std::vector<PrefillChunk>;

Chunks plan(int r, int64_t max_len, int64_t mnbt, std::vector<int32_t> seq, std::vector<int32_t> g) {
  return plan_chunks(r, max_len, mnbt, seq, g);
}

TEST(PrefillPlan, WorkspaceRows) {
  // 4 * (ceil(max_model_len / r) [r > 0] + 128 + max_num_batched_tokens)
  EXPECT_EQ(prefill_workspace_rows(0, 1000, 100), 4 * (128 + 100));
  EXPECT_EQ(prefill_workspace_rows(1, 1000, 100), 4 * (1000 + 128 + 100));
  EXPECT_EQ(prefill_workspace_rows(2, 1001, 100), 4 * (501 + 128 + 100));
  EXPECT_EQ(prefill_workspace_rows(2, 1048576, 8192), 4 * (524288 + 128 + 8192));
}

TEST(PrefillPlan, GreedyChunks) {
  // r = 2, max_model_len 200, 40 batched tokens: cap_ws = 4 * (100 + 128 + 40) = 1072
  ASSERT_EQ(prefill_workspace_rows(2, 200, 40), 1072);
  // N = 100, 50, 10, 100, 0 ... ; G as given. Request 0: 1 * (100 + 40) = 140; + request 1:
  // 2 * (100 + 40) = 280; + request 2: 3 * (100 + 60) = 480; + request 3: 4 * (100 + 167)
  // = 1068 <= 1072; + request 4: 5 * (100 + 167) > 1072 -> a new chunk.
  const Chunks c = plan(2, 200, 40, {200, 100, 20, 200, 168}, {40, 10, 20, 167, 167});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].req_begin, 0);
  EXPECT_EQ(c[0].req_end, 4);
  EXPECT_EQ(c[0].n_ch, 100);
  EXPECT_EQ(c[0].m_ch, 100 + 167);
  EXPECT_EQ(c[1].req_begin, 4);
  EXPECT_EQ(c[1].req_end, 5);
  EXPECT_EQ(c[1].n_ch, 84);
  EXPECT_EQ(c[1].m_ch, 84 + 167);
  // ratio 0: N_b = 0, cap_ws = 4 * (128 + 40) = 672: chunks of 672 / max G requests
  const Chunks z = plan(0, 200, 40, {200, 200, 200, 200, 200}, {10, 150, 10, 100, 5});
  ASSERT_EQ(z.size(), 2u);  // 4 * 150 = 600 <= 672, 5 * 150 > 672
  EXPECT_EQ(z[0].req_end, 4);
  EXPECT_EQ(z[0].n_ch, 0);
  EXPECT_EQ(z[0].m_ch, 150);
  EXPECT_EQ(z[1].m_ch, 5);
  EXPECT_TRUE(plan(1, 10, 10, {}, {}).empty());
}

class Prefill : public AttentionTest {};

// A prefill step of R requests against paged caches, with its metadata built by the SPEC's
// formulas (SPEC 6.6: G_b, gather_start_b; the slot rule of 3.1) written out in the test.
struct PrefillStep {
  int ratio = 2;
  int64_t swa_S = 32, cmp_S = 32;
  std::vector<int32_t> seq, qlen, G, g0;
  std::vector<int32_t> swa_bt, cmp_bt;  // [R, cols]
  int64_t swa_cols = 0, cmp_cols = 0;
  std::unique_ptr<RandomCache> swa, cmp;
  int64_t R() const { return static_cast<int64_t>(seq.size()); }
  int64_t N(int64_t b) const { return ratio > 0 ? seq[static_cast<size_t>(b)] / ratio : 0; }
  int64_t swa_slot(int64_t b, int64_t pos) const {
    return int64_t{swa_bt[static_cast<size_t>(b * swa_cols + pos / swa_S)]} * swa_S + pos % swa_S;
  }
  int64_t cmp_slot(int64_t b, int64_t i) const {
    return int64_t{cmp_bt[static_cast<size_t>(b * cmp_cols + i / cmp_S)]} * cmp_S + i % cmp_S;
  }

  static PrefillStep make(int ratio, std::vector<int32_t> seq, std::vector<int32_t> qlen, Rng& rng) {
    PrefillStep s;
    s.ratio = ratio;
    s.cmp_S = ratio > 0 ? 64 / ratio : 0;
    s.seq = std::move(seq);
    s.qlen = std::move(qlen);
    for (int64_t b = 0; b < s.R(); ++b) {
      const int32_t prefix = s.seq[static_cast<size_t>(b)] - s.qlen[static_cast<size_t>(b)];
      s.G.push_back(s.qlen[static_cast<size_t>(b)] + std::min(prefix, 127));
      s.g0.push_back(s.seq[static_cast<size_t>(b)] - s.G.back());
    }
    auto tables = [&](int64_t per_page, auto entries, std::vector<int32_t>& bt, int64_t& cols) {
      for (int64_t b = 0; b < s.R(); ++b) cols = std::max(cols, (entries(b) + per_page - 1) / per_page + 1);
      std::vector<int32_t> ids(static_cast<size_t>(s.R() * cols));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
      rng.shuffle(ids);
      bt = ids;  // every table entry a distinct page (including page 0: kernels do not skip it)
      return static_cast<int64_t>(ids.size());
    };
    const int64_t swa_pages = tables(s.swa_S, [&](int64_t b) { return int64_t{s.seq[static_cast<size_t>(b)]}; },
                                     s.swa_bt, s.swa_cols);
    s.swa = std::make_unique<RandomCache>(RecordFormat::V4_584, s.swa_S, swa_pages, 64, rng);
    if (ratio > 0) {
      const int64_t cmp_pages = tables(s.cmp_S, [&](int64_t b) { return s.N(b); }, s.cmp_bt, s.cmp_cols);
      s.cmp = std::make_unique<RandomCache>(RecordFormat::NVFP4_288, s.cmp_S, cmp_pages, 0, rng);
    }
    return s;
  }

  WorkspaceGatherArgs gather_args(const PrefillChunk& c, TensorView ws) {
    WorkspaceGatherArgs a;
    a.ratio = ratio;
    a.chunk = c;
    a.seq_lens = view_of(seq);
    a.gather_lens = view_of(G);
    a.gather_starts = view_of(g0);
    a.swa_cache = swa->view;
    a.swa_block_table = TensorView::contiguous(swa_bt.data(), DType::I32, {R(), swa_cols});
    if (ratio > 0) {
      a.cmp_cache = cmp->view;
      a.cmp_block_table = TensorView::contiguous(cmp_bt.data(), DType::I32, {R(), cmp_cols});
    }
    a.workspace = ws;
    return a;
  }
};

TEST_F(Prefill, WorkspaceGatherWritesExactlyTheSpecifiedRows) {
  for (int ratio : {0, 1, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio) + ", " + seed_text());
    PrefillStep s = PrefillStep::make(ratio, {300, 40, 170}, {20, 40, 3}, rng());
    PrefillChunk c;
    c.req_begin = 0;
    c.req_end = 3;
    for (int64_t b = 0; b < 3; ++b) c.n_ch = std::max(c.n_ch, s.N(b));
    c.m_ch = c.n_ch + *std::max_element(s.G.begin(), s.G.end());
    const int64_t rows = 3 * c.m_ch + 5;
    std::vector<uint16_t> want(static_cast<size_t>(rows * kLatentDim), kBf16Sentinel);
    for (int64_t b = 0; b < 3; ++b) {
      std::vector<int64_t> cs, ss;
      for (int64_t i = 0; i < s.N(b); ++i) cs.push_back(s.cmp_slot(b, i));
      for (int64_t k = 0; k < s.G[static_cast<size_t>(b)]; ++k) ss.push_back(s.swa_slot(b, s.g0[static_cast<size_t>(b)] + k));
      if (ratio > 0) {
        const auto kc = dequantized(s.cmp->view, cs);
        std::copy(kc.begin(), kc.end(), want.begin() + b * c.m_ch * kLatentDim);
      }
      const auto ks = dequantized(s.swa->view, ss);
      std::copy(ks.begin(), ks.end(), want.begin() + (b * c.m_ch + c.n_ch) * kLatentDim);
    }
    for (int threads : {1, 3}) {
      CanaryBuffer<uint16_t> ws(want.size(), kBf16Sentinel);
      ASSERT_NO_THROW(gather_prefill_workspace(
          s.gather_args(c, TensorView::contiguous(ws.data(), DType::BF16, {rows, kLatentDim})),
          ExecContext{nullptr, threads}));
      EXPECT_TRUE(bits_equal(want, ws.vec(), "workspace")) << threads << " threads";
    }
  }
}

TEST_F(Prefill, CombinedIndexRowsFollowTheSpec) {
  for (int ratio : {0, 1, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio) + ", " + seed_text());
    // request 1 has a short prefix (the window starts at gather_start), request 2 more than 512
    // visible entries for ratio 1 (topk_len capped at 512)
    const std::vector<int32_t> seq = {300, 40, 700}, ql = {6, 40, 4};
    PrefillStep s = PrefillStep::make(ratio, seq, ql, rng());
    const Chunks cs = plan(ratio, 1024, 64, seq, s.G);
    ASSERT_EQ(cs.size(), 1u);
    const PrefillChunk c = cs[0];
    std::vector<int64_t> pos;
    std::vector<int32_t> t2r, topk;
    for (int64_t b = 0; b < 3; ++b)
      for (int32_t k = 0; k < ql[static_cast<size_t>(b)]; ++k) {
        pos.push_back(seq[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)] + k);
        t2r.push_back(static_cast<int32_t>(b));
      }
    const auto T = static_cast<int64_t>(pos.size());
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < kIndexTopk; ++j)  // entries beyond N_ch and negative ones become -1
        topk.push_back(static_cast<int32_t>(rng().integer(0, 12) == 0 ? -1 : rng().integer(-3, c.n_ch + 5)));
    CanaryBuffer<int32_t> idx(static_cast<size_t>((T + 2) * kPrefillIndexWidth), 0x5A5A5A5A);
    CanaryBuffer<int32_t> len(static_cast<size_t>(T + 2), 0x5A5A5A5A);
    PrefillIndexArgs a;
    a.ratio = ratio;
    a.chunk = c;
    a.positions = view_of(pos);
    a.token_to_req = view_of(t2r);
    a.gather_lens = view_of(s.G);
    a.gather_starts = view_of(s.g0);
    if (ratio > 0) a.topk = TensorView::contiguous(topk.data(), DType::I32, {T, kIndexTopk});
    a.indices = TensorView::contiguous(idx.data(), DType::I32, {T, kPrefillIndexWidth});
    a.lengths = TensorView::contiguous(len.data(), DType::I32, {T});
    ASSERT_NO_THROW(build_prefill_indices(a));
    std::vector<int32_t> want_idx(idx.size(), 0x5A5A5A5A), want_len(len.size(), 0x5A5A5A5A);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[static_cast<size_t>(t)], b = t2r[static_cast<size_t>(t)];
      int32_t* row = want_idx.data() + t * kPrefillIndexWidth;
      std::fill(row, row + kPrefillIndexWidth, -1);
      const int64_t tl = ratio > 0 ? std::min<int64_t>((p + 1) / ratio, 512) : 0;
      for (int64_t j = 0; j < tl; ++j) {
        const int32_t i = topk[static_cast<size_t>(t * kIndexTopk + j)];
        if (i >= 0 && i < c.n_ch) row[j] = static_cast<int32_t>(c.m_ch * b + i);
      }
      const int64_t st = std::max<int64_t>({p - 127, 0, s.g0[static_cast<size_t>(b)]});
      for (int64_t k = 0; k < p - st + 1; ++k)
        row[tl + k] = static_cast<int32_t>(c.m_ch * b + c.n_ch + (st - s.g0[static_cast<size_t>(b)]) + k);
      want_len[static_cast<size_t>(t)] = static_cast<int32_t>(tl + p - st + 1);
    }
    EXPECT_TRUE(bits_equal(want_idx, idx.vec(), "indices"));
    EXPECT_TRUE(bits_equal(want_len, len.vec(), "lengths"));
    // the last token (p = 699) sees a full window; for ratio 1 its 700 visible entries are capped at 512
    EXPECT_EQ(want_len[static_cast<size_t>(T - 1)], (ratio == 1 ? 512 : ratio == 2 ? 350 : 0) + 128);
  }
}

TEST_F(Prefill, SparsePrefillAgreesWithTheReference) {
  SCOPED_TRACE(seed_text());
  const int H = 16;
  const int64_t T = 7, s_kv = 300, topk = 200;
  RandomPrefill p(T, H, s_kv, topk, rng());
  Outputs base(T, H);
  for (int threads : {1, 2, 5}) {
    Outputs o(T, H);
    const SparsePrefillArgs a = p.args(o);
    sparse_prefill(a, ExecContext{nullptr, threads});
    if (threads == 1) {
      Expected e;
      e.H = H;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> rows;
        for (int32_t j = 0; j < p.len[static_cast<size_t>(t)]; ++j) {
          const int32_t i = p.idx[static_cast<size_t>(t * topk + j)];
          if (i >= 0 && i < s_kv) rows.push_back(i);
        }
        std::vector<uint16_t> keys;
        for (int64_t r : rows) keys.insert(keys.end(), p.kv.begin() + r * kLatentDim, p.kv.begin() + (r + 1) * kLatentDim);
        e.add(p.q.data() + t * H * kLatentDim, kLatentDim, keys, p.sink.data(), a.softmax_scale);
      }
      expect_agrees(o, e, "sparse_prefill");
      for (int h = 0; h < H; ++h) EXPECT_EQ(o.lse[static_cast<size_t>(H * 1 + h)], kInf);  // length 0
      for (int h = 0; h < H; ++h) EXPECT_EQ(o.lse[static_cast<size_t>(H * 3 + h)], kInf);  // all masked
      base = std::move(o);
    } else {
      EXPECT_TRUE(o.same_bits(base)) << threads << " threads";
    }
  }
}

// The prefill chain (chunk plan, gather, index rows, workspace attention) and the decode path
// over the same key sets (each token's window and its top-k entries through the block tables)
// give the same bits: the same dequantized keys in the same order through the same engine.
TEST_F(Prefill, AgreesWithDecodeOnTheSameKeySets) {
  for (int ratio : {0, 1, 2}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio) + ", " + seed_text());
    const int H = 16;
    const std::vector<int32_t> seq = {650, 90, 260, 33, 20}, ql = {5, 5, 2, 33, 20};
    PrefillStep s = PrefillStep::make(ratio, seq, ql, rng());
    // max_model_len at the longest request and a small max_num_batched_tokens make several chunks
    const Chunks chunks = plan(ratio, 650, 2, seq, s.G);
    ASSERT_GE(chunks.size(), 2u);
    std::vector<int64_t> pos;
    std::vector<int32_t> t2r, topk;
    for (int64_t b = 0; b < s.R(); ++b)
      for (int32_t k = 0; k < ql[static_cast<size_t>(b)]; ++k) {
        const int64_t p = seq[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)] + k;
        pos.push_back(p);
        t2r.push_back(static_cast<int32_t>(b));
        // a valid top-k row (SPEC 8.5: sorted ascending prefix of visible entries, then -1), with
        // a masked entry inside the prefix now and then
        const int64_t nc = ratio > 0 ? (p + 1) / ratio : 0, K = std::min<int64_t>(nc, kIndexTopk);
        std::vector<int32_t> all(static_cast<size_t>(nc));
        for (int64_t i = 0; i < nc; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        rng().shuffle(all);
        all.resize(static_cast<size_t>(K));
        std::sort(all.begin(), all.end());
        for (auto& v : all)
          if (rng().integer(0, 15) == 0) v = -1;
        all.resize(kIndexTopk, -1);
        topk.insert(topk.end(), all.begin(), all.end());
      }
    const auto T = static_cast<int64_t>(pos.size());
    std::vector<uint16_t> q(static_cast<size_t>(T * H * kLatentDim));
    for (auto& v : q) v = num::bf16_encode(static_cast<float>(rng().normal()));
    std::vector<float> sink(H);
    for (int h = 0; h < H; ++h) sink[static_cast<size_t>(h)] = h == 3 ? -kInf : static_cast<float>(rng().normal());

    // prefill: chunk by chunk (the chunk's tokens are contiguous: requests in order)
    Outputs pre(T, H);
    int64_t t0 = 0;
    for (const PrefillChunk& c : chunks) {
      int64_t tn = 0;
      for (int64_t b = c.req_begin; b < c.req_end; ++b) tn += ql[static_cast<size_t>(b)];
      const int64_t rows = c.num_reqs() * c.m_ch;
      std::vector<uint16_t> ws(static_cast<size_t>(rows * kLatentDim), kBf16Sentinel);
      gather_prefill_workspace(s.gather_args(c, TensorView::contiguous(ws.data(), DType::BF16, {rows, kLatentDim})));
      std::vector<int32_t> idx(static_cast<size_t>(tn * kPrefillIndexWidth)), len(static_cast<size_t>(tn));
      PrefillIndexArgs ia;
      ia.ratio = ratio;
      ia.chunk = c;
      ia.positions = TensorView::contiguous(pos.data() + t0, DType::I64, {tn});
      ia.token_to_req = TensorView::contiguous(t2r.data() + t0, DType::I32, {tn});
      ia.gather_lens = view_of(s.G);
      ia.gather_starts = view_of(s.g0);
      if (ratio > 0) ia.topk = TensorView::contiguous(topk.data() + t0 * kIndexTopk, DType::I32, {tn, kIndexTopk});
      ia.indices = TensorView::contiguous(idx.data(), DType::I32, {tn, kPrefillIndexWidth});
      ia.lengths = view_of(len);
      build_prefill_indices(ia);
      SparsePrefillArgs pa;
      pa.q = TensorView::contiguous(q.data() + t0 * H * kLatentDim, DType::BF16, {tn, H, kLatentDim});
      pa.kv = TensorView::contiguous(ws.data(), DType::BF16, {rows, kLatentDim});
      pa.indices = ia.indices;
      pa.topk_length = ia.lengths;
      pa.sink = view_of(sink);
      pa.softmax_scale = default_scale();
      pa.out = TensorView::contiguous(pre.out.data() + t0 * H * kLatentDim, DType::BF16, {tn, H, kLatentDim});
      pa.lse = TensorView::contiguous(pre.lse.data() + t0 * H, DType::F32, {tn, H});
      sparse_prefill(pa);
      t0 += tn;
    }
    ASSERT_EQ(t0, T);

    // decode: the window rows and the global top-k slots of every token (SPEC 6.6)
    std::vector<int32_t> swa_idx(static_cast<size_t>(T * kSwaWindow), -1), swa_len(static_cast<size_t>(T));
    std::vector<int32_t> cmp_idx(static_cast<size_t>(T * kIndexTopk), -1), cmp_len(static_cast<size_t>(T), 0);
    Expected e;
    e.H = H;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[static_cast<size_t>(t)], b = t2r[static_cast<size_t>(t)];
      const int64_t start = std::max<int64_t>(p - 127, 0);
      swa_len[static_cast<size_t>(t)] = static_cast<int32_t>(p - start + 1);
      std::vector<int64_t> ss, cs;
      for (int64_t k = 0; k <= p - start; ++k) {
        swa_idx[static_cast<size_t>(t * kSwaWindow + k)] = static_cast<int32_t>(s.swa_slot(b, start + k));
        ss.push_back(s.swa_slot(b, start + k));
      }
      if (ratio > 0) {
        cmp_len[static_cast<size_t>(t)] = static_cast<int32_t>(std::min<int64_t>((p + 1) / ratio, kIndexTopk));
        for (int64_t j = 0; j < cmp_len[static_cast<size_t>(t)]; ++j) {
          const int32_t i = topk[static_cast<size_t>(t * kIndexTopk + j)];
          if (i < 0) continue;
          cmp_idx[static_cast<size_t>(t * kIndexTopk + j)] = static_cast<int32_t>(s.cmp_slot(b, i));
          cs.push_back(s.cmp_slot(b, i));
        }
      }
      std::vector<uint16_t> keys = ratio > 0 ? dequantized(s.cmp->view, cs) : std::vector<uint16_t>{};
      append(keys, dequantized(s.swa->view, ss));
      e.add(q.data() + t * H * kLatentDim, kLatentDim, keys, sink.data(), default_scale());
    }
    DecodeScheduleArgs sa;
    sa.layer = ratio == 0 ? LayerType::kSwaOnly : static_cast<LayerType>(ratio);
    sa.num_tokens = T;
    sa.num_heads = H;
    const DecodeSchedule sched = plan_decode_schedule(sa, ExecContext{nullptr, 3});
    SparseDecodeArgs da;
    da.schedule = &sched;
    da.q = TensorView::contiguous(q.data(), DType::BF16, {T, H, kLatentDim});
    da.swa_cache = s.swa->view;
    da.swa_indices = TensorView::contiguous(swa_idx.data(), DType::I32, {T, kSwaWindow});
    da.swa_lens = view_of(swa_len);
    if (ratio > 0) {
      da.cmp_cache = s.cmp->view;
      da.cmp_indices = TensorView::contiguous(cmp_idx.data(), DType::I32, {T, kIndexTopk});
      da.cmp_lens = view_of(cmp_len);
    }
    da.sink = view_of(sink);
    da.softmax_scale = default_scale();
    Outputs dec(T, H);
    da.out = dec.out_view();
    da.lse = dec.lse_view();
    sparse_decode(da, ExecContext{nullptr, 3});
    expect_agrees(dec, e, "decode");
    expect_agrees(pre, e, "prefill");
    EXPECT_TRUE(pre.same_bits(dec)) << "prefill and decode differ on the same key sets";
  }
}

}  // namespace
}  // namespace dsv41kv::test
