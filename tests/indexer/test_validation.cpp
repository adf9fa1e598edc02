// Bad arguments of the indexer ops: every case throws E8 naming the op, the argument, the value and
// what was expected, before anything is written (the canary-filled outputs stay untouched).
#include <gtest/gtest.h>

#include "dsv41kv/device.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "indexer/indexer_step.hpp"
#include "support/canary.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

constexpr ErrorCode E8 = ErrorCode::kInvalidArgument;

// ---------------------------------------------------------------- indexer_k_store

struct StoreBase {
  int64_t N = 6, S = 8, pages = 4;
  std::vector<uint16_t> latent, wk, kn;
  std::vector<float> table;
  std::vector<int64_t> pos, slots;
  CanaryBuffer<uint8_t> cache;
  explicit StoreBase(Rng& rng)
      : latent(random_bf16(6 * 512, rng)),
        wk(random_bf16(128 * 512, rng, 0.05)),
        kn(random_bf16(128, rng, 0.1, 1.0)),
        table(random_rope_table(32, rng)),
        pos{10, 11, 12, 13, 14, 15},
        slots{0, 1, 2, 3, 4, 5},
        cache(static_cast<size_t>(4 * (8 * 132 + 16)), kByteCanary) {}
  IndexKStoreArgs args() {
    IndexKStoreArgs a;
    a.ratio = 1;
    a.latent = TensorView::contiguous(latent.data(), DType::BF16, {N, 512});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {N});
    a.slots = TensorView::contiguous(slots.data(), DType::I64, {N});
    a.wk = TensorView::contiguous(wk.data(), DType::BF16, {128, 512});
    a.k_norm = TensorView::contiguous(kn.data(), DType::BF16, {128});
    a.eps = 1e-6f;
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {32, 64});
    a.cache = IndexKCacheView{cache.data(), IndexKFormat::FP8_132, pages, S, 8 * 132 + 16};
    return a;
  }
};

struct StoreCase {
  const char* name;
  std::function<void(StoreBase&, IndexKStoreArgs&)> mutate;
  const char* fragment;
};

TEST(IndexerValidation, KStore) {
  const std::vector<StoreCase> cases = {
      {"ratio", [](StoreBase&, IndexKStoreArgs& a) { a.ratio = 3; }, "indexer_k_store: ratio = 3, expected 1 or 2"},
      {"latent dtype", [](StoreBase&, IndexKStoreArgs& a) { a.latent.dtype = DType::F32; }, "indexer_k_store: latent: dtype f32"},
      {"latent rows", [](StoreBase&, IndexKStoreArgs& a) { a.latent.shape[0] = 5; }, "latent: 5 rows, expected at least 6"},
      {"positions short", [](StoreBase&, IndexKStoreArgs& a) { a.positions.shape[0] = 5; }, "positions: 5 entries, expected at least 6"},
      {"slots dtype", [](StoreBase&, IndexKStoreArgs& a) { a.slots.dtype = DType::I32; }, "slots: dtype i32"},
      {"wk width", [](StoreBase&, IndexKStoreArgs& a) { a.wk.shape[1] = 448; a.wk.stride[0] = 448; }, "wk: shape[1] = 448, expected 512"},
      {"wk rows", [](StoreBase&, IndexKStoreArgs& a) { a.wk.shape[0] = 64; }, "wk: shape[0] = 64, expected 128"},
      {"wk absent", [](StoreBase&, IndexKStoreArgs& a) { a.wk = TensorView{}; }, "wk: absent"},
      {"k_norm length", [](StoreBase&, IndexKStoreArgs& a) { a.k_norm.shape[0] = 512; }, "k_norm: shape[0] = 512, expected 128"},
      {"eps", [](StoreBase&, IndexKStoreArgs& a) { a.eps = std::nanf(""); }, "eps: nan, expected a finite value >= 0"},
      {"table width", [](StoreBase&, IndexKStoreArgs& a) { a.rope_table.shape[1] = 32; }, "rope_table: shape[1] = 32"},
      {"cache stride", [](StoreBase&, IndexKStoreArgs& a) { a.cache.page_stride = 1000; }, "cache: page_stride = 1000 bytes for 8 states of fp8_132, expected >= 1056"},
      {"cache format", [](StoreBase&, IndexKStoreArgs& a) { a.cache.format = static_cast<IndexKFormat>(5); }, "cache: format: unknown value 5"},
      {"cache null", [](StoreBase&, IndexKStoreArgs& a) { a.cache.base = nullptr; }, "cache: base pointer is null"},
      {"cache pages", [](StoreBase&, IndexKStoreArgs& a) { a.cache.num_pages = 0; }, "cache: num_pages = 0"},
      {"cache overflow", [](StoreBase&, IndexKStoreArgs& a) { a.cache.num_pages = int64_t{1} << 55; }, "span more than 2^62 bytes"},
      {"cache device", [](StoreBase&, IndexKStoreArgs& a) { a.cache.device = Device::CUDA; }, "cache: on cuda, expected cpu like slots"},
      // valid device views are dispatched to the kernels in a CUDA build (tests/indexer/*_gpu)
      {"cuda views", [](StoreBase&, IndexKStoreArgs& a) {
         for (TensorView* v : {&a.latent, &a.positions, &a.slots, &a.wk, &a.k_norm, &a.rope_table}) v->device = Device::CUDA;
         a.cache.device = Device::CUDA;
         if (built_with_cuda()) a.wk.dtype = DType::F32;  // refused before any launch
       }, built_with_cuda() ? "indexer_k_store: wk: dtype f32" : "indexer_k_store: the views are on cuda, but dsv41kv was built without CUDA"},
      {"slot beyond the cache", [](StoreBase& b, IndexKStoreArgs&) { b.slots[4] = 32; }, "slots: slots[4] = 32, expected < num_pages * states_per_page = 4 * 8 = 32"},
      {"negative position", [](StoreBase& b, IndexKStoreArgs&) { b.pos[2] = -3; }, "positions[2] = -3, expected >= 0"},
      {"beyond the table", [](StoreBase& b, IndexKStoreArgs&) { b.pos[5] = 32; }, "positions[5] = 32 needs RoPE table row 32"},
  };
  Rng rng(1);
  const StoreBase base(rng);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    StoreBase b = base;
    IndexKStoreArgs a = b.args();
    c.mutate(b, a);
    expect_error([&] { indexer_k_store(a); }, E8, c.fragment);
    EXPECT_TRUE(b.cache.untouched());
  }
  StoreBase b = base;
  expect_error([&] { indexer_k_store(b.args(), ExecContext{nullptr, -1}); }, E8, "indexer_k_store: ctx.num_threads = -1");
  EXPECT_TRUE(b.cache.untouched());
  EXPECT_NO_THROW(indexer_k_store(b.args()));
  EXPECT_FALSE(b.cache.untouched());
}

// ---------------------------------------------------------------- indexer_prepare_q

struct QBase {
  int64_t T = 5;
  std::vector<uint16_t> q, w_raw;
  std::vector<float> table;
  std::vector<int64_t> pos;
  CanaryBuffer<uint8_t> q8;
  CanaryBuffer<float> w;
  explicit QBase(Rng& rng)
      : q(random_bf16(5 * 32 * 128, rng)),
        w_raw(random_bf16(5 * 32, rng)),
        table(random_rope_table(40, rng)),
        pos{0, 7, 39, 3, 3},
        q8(6 * 32 * 128, kByteCanary),
        w(6 * 32, -5.0f) {}
  IndexQPrepArgs args() {
    IndexQPrepArgs a;
    a.q = TensorView::contiguous(q.data(), DType::BF16, {T, 32, 128});
    a.w_raw = TensorView::contiguous(w_raw.data(), DType::BF16, {T, 32});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {40, 64});
    a.q8 = q8.view({6, 32, 128});
    a.w = w.view({6, 32});
    return a;
  }
};

struct QCase {
  const char* name;
  std::function<void(QBase&, IndexQPrepArgs&)> mutate;
  const char* fragment;
};

TEST(IndexerValidation, PrepareQ) {
  const std::vector<QCase> cases = {
      {"heads", [](QBase&, IndexQPrepArgs& a) { a.q = TensorView::contiguous(a.q.data, DType::BF16, {10, 16, 128}); }, "indexer_prepare_q: q: shape[1] = 16, expected 32"},
      {"head dim", [](QBase&, IndexQPrepArgs& a) { a.q = TensorView::contiguous(a.q.data, DType::BF16, {10, 32, 64}); }, "q: shape[2] = 64, expected 128"},
      {"q dtype", [](QBase&, IndexQPrepArgs& a) { a.q.dtype = DType::F32; }, "q: dtype f32"},
      {"q 2-D", [](QBase&, IndexQPrepArgs& a) { a.q = TensorView::contiguous(a.q.data, DType::BF16, {5, 4096}); }, "q: 2 dimensions, expected 3"},
      {"q strided", [](QBase&, IndexQPrepArgs& a) { a.q.stride[1] = 256; }, "q: not contiguous"},
      {"w_raw heads", [](QBase&, IndexQPrepArgs& a) { a.w_raw.shape[1] = 16; }, "w_raw: shape[1] = 16, expected 32"},
      {"w_raw rows", [](QBase&, IndexQPrepArgs& a) { a.w_raw.shape[0] = 4; }, "w_raw: shape[0] = 4, expected 5"},
      {"q8 rows", [](QBase&, IndexQPrepArgs& a) { a.q8.shape[0] = 4; }, "q8: shape[0] = 4, expected at least 5"},
      {"q8 dtype", [](QBase&, IndexQPrepArgs& a) { a.q8.dtype = DType::I32; }, "q8: dtype i32"},
      {"q8 head dim", [](QBase&, IndexQPrepArgs& a) { a.q8 = TensorView::contiguous(a.q8.data, DType::U8, {6, 32, 64}); }, "q8: shape[2] = 64, expected 128"},
      {"w dtype", [](QBase&, IndexQPrepArgs& a) { a.w.dtype = DType::BF16; }, "w: dtype bf16"},
      {"positions short", [](QBase&, IndexQPrepArgs& a) { a.positions.shape[0] = 4; }, "positions: 4 entries, expected at least 5"},
      {"beyond the table", [](QBase& b, IndexQPrepArgs&) { b.pos[3] = 40; }, "positions[3] = 40, expected a row of the RoPE table of 40 rows"},
      {"negative position", [](QBase& b, IndexQPrepArgs&) { b.pos[1] = -1; }, "positions[1] = -1"},
      {"device mix", [](QBase&, IndexQPrepArgs& a) { a.w.device = Device::CUDA; }, "w: on cuda, expected cpu like q"},
      {"cuda views", [](QBase&, IndexQPrepArgs& a) {
         for (TensorView* v : {&a.q, &a.w_raw, &a.positions, &a.rope_table, &a.q8, &a.w}) v->device = Device::CUDA;
         if (built_with_cuda()) a.w.dtype = DType::BF16;  // refused before any launch
       }, built_with_cuda() ? "indexer_prepare_q: w: dtype bf16" : "indexer_prepare_q: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  Rng rng(2);
  const QBase base(rng);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    QBase b = base;
    IndexQPrepArgs a = b.args();
    c.mutate(b, a);
    expect_error([&] { indexer_prepare_q(a); }, E8, c.fragment);
    EXPECT_TRUE(b.q8.untouched());
    EXPECT_TRUE(b.w.untouched());
  }
  QBase b = base;
  EXPECT_NO_THROW(indexer_prepare_q(b.args()));
  EXPECT_FALSE(b.q8.untouched());
}

// ---------------------------------------------------------------- indexer_topk

struct TopkCase {
  const char* name;
  IndexerRole role;
  std::function<void(IndexerStep&, IndexerTopkArgs&)> mutate;
  const char* fragment;
};

// A step of 3 requests (positions 100..102, 40..41, 1000), token 6 invalid, S = 16 states; the
// consumer cases start from the source's real candidates.
IndexerStep topk_base(std::vector<int32_t>& cand) {
  Rng rng(3);
  IndexerStep s = make_step(rng, 1, {{100, 3}, {40, 2}, {1000, 2}}, 16, {6});
  indexer_topk(s.args(IndexerRole::kCandidateSource));
  cand = s.cand.vec();
  s.reset_outputs();
  return s;
}

TEST(IndexerValidation, Topk) {
  using R = IndexerRole;
  const std::vector<TopkCase> cases = {
      {"ratio", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.ratio = 0; }, "indexer_topk: ratio = 0, expected 1 or 2"},
      {"role", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.role = static_cast<IndexerRole>(7); }, "indexer_topk: role: unknown value 7"},
      {"positions dtype", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.positions.dtype = DType::I32; }, "positions: dtype i32"},
      {"token_to_req length", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.token_to_req.shape[0] = 6; }, "token_to_req: 6 entries, expected T = 7"},
      {"token_valid dtype", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.token_valid.dtype = DType::I64; }, "token_valid: dtype i64"},
      {"q8 heads", R::kPlain, [](IndexerStep& s, IndexerTopkArgs& a) { a.q8 = TensorView::contiguous(s.q8.data(), DType::U8, {14, 16, 128}); }, "q8: shape[1] = 16, expected 32"},
      {"q8 head dim", R::kPlain, [](IndexerStep& s, IndexerTopkArgs& a) { a.q8 = TensorView::contiguous(s.q8.data(), DType::U8, {14, 32, 64}); }, "q8: shape[2] = 64, expected 128"},
      {"q8 rows", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.q8.shape[0] = 6; }, "q8: shape[0] = 6, expected at least 7"},
      {"w heads", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.w.shape[1] = 64; a.w.shape[0] = 3; }, "w: shape[1] = 64, expected 32"},
      {"block_table dtype", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.block_table.dtype = DType::I64; }, "block_table: dtype i64, expected i32"},
      {"k_cache mxfp4", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.k_cache.format = IndexKFormat::MXFP4_68; }, "k_cache: format mxfp4_68, expected fp8_132"},
      {"k_cache stride", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.k_cache.page_stride = 2000; }, "k_cache: page_stride = 2000 bytes for 16 states of fp8_132, expected >= 2112"},
      {"topk width", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.topk.shape[1] = 256; }, "topk: shape[1] = 256, expected 512"},
      {"topk rows", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.topk.shape[0] = 6; }, "topk: 6 rows, expected at least T = 7"},
      {"topk dtype", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.topk.dtype = DType::I64; }, "topk: dtype i64"},
      {"topk overlapping rows", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.topk.stride[0] = 256; }, "topk: row stride 256, expected >= 512"},
      {"candidates for plain", R::kPlain, [](IndexerStep& s, IndexerTopkArgs& a) { a.candidates = s.cand.view({9, 2048}); }, "candidates: present"},
      {"candidates absent", R::kCandidateSource, [](IndexerStep&, IndexerTopkArgs& a) { a.candidates = TensorView{}; }, "candidates: absent"},
      {"candidates width", R::kCandidateSource, [](IndexerStep&, IndexerTopkArgs& a) { a.candidates.shape[1] = 1024; }, "candidates: shape[1] = 1024, expected 2048"},
      {"candidates rows", R::kCandidateConsumer, [](IndexerStep&, IndexerTopkArgs& a) { a.candidates.shape[0] = 3; }, "candidates: 3 rows, expected at least T = 7"},
      {"scores rows", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.scores.shape[0] = 6; }, "scores: 6 rows, expected at least T = 7"},
      {"scores columns", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.scores.shape[1] = 1000; }, "scores: 1000 columns, expected at least n_c = 1001 of token 5"},
      {"scores dtype", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.scores.dtype = DType::I32; }, "scores: dtype i32"},
      {"request", R::kPlain, [](IndexerStep& s, IndexerTopkArgs&) { s.req[2] = 3; }, "token_to_req[2] = 3, expected a request 0 <= b < num_reqs = 3"},
      {"negative position", R::kPlain, [](IndexerStep& s, IndexerTopkArgs&) { s.pos[1] = -1; }, "positions[1] = -1, expected 0 <= position < 2^62"},
      {"beyond the block table", R::kPlain, [](IndexerStep& s, IndexerTopkArgs&) { s.pos[3] = 16 * s.bt_cols; }, "token 3 (request 1, position 1024) sees n_c = 1025 entries on 65 pages of 16 states, expected at most the block table's 64 pages per request"},
      {"page beyond the cache", R::kPlain, [](IndexerStep& s, IndexerTopkArgs&) { s.bt[static_cast<size_t>(s.bt_cols + 1)] = static_cast<int32_t>(s.num_pages); }, "block_table[1][1] = 191 (a page token 3 at position 40 reads), expected a page 0 <= id < k_cache.num_pages = 191"},
      {"negative page", R::kPlain, [](IndexerStep& s, IndexerTopkArgs&) { s.bt[2] = -1; }, "block_table[0][2] = -1"},
      {"consumer candidates not ascending", R::kCandidateConsumer, [](IndexerStep& s, IndexerTopkArgs&) { std::swap(s.cand_row(1)[2], s.cand_row(1)[3]); }, "candidates[1][3] = 2 after 3, expected a strictly ascending prefix of blocks below ceil(n_c / 8) = 13"},
      {"consumer candidate beyond n_c", R::kCandidateConsumer, [](IndexerStep& s, IndexerTopkArgs&) { s.cand_row(0)[13] = 13; }, "candidates[0][13] = 13 after 12"},
      {"consumer block after the padding", R::kCandidateConsumer, [](IndexerStep& s, IndexerTopkArgs&) { s.cand_row(4)[100] = 50; }, "candidates[4][100] = 50 after -1"},
      {"consumer candidates garbage", R::kCandidateConsumer, [](IndexerStep& s, IndexerTopkArgs&) { s.cand_row(5)[0] = -2; }, "candidates[5][0] = -2 after the row start"},
      {"score kernel", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.score_kernel = 3; }, "indexer_topk: score_kernel: 3, expected 0 (the library's choice), 1 (chunk) or 2 (warpgroup)"},
      {"warpgroup kernel for wide groups", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.score_kernel = 2; a.group_tokens = 4; }, "indexer_topk: score_kernel: 2 (warpgroup) for role plain, group_tokens 4"},
      {"device mix", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.topk.device = Device::CUDA; }, "topk: on cuda, expected cpu like positions"},
      {"cache device", R::kPlain, [](IndexerStep&, IndexerTopkArgs& a) { a.k_cache.device = Device::CUDA; }, "k_cache: on cuda, expected cpu like positions"},
      {"cuda views", R::kCandidateSource, [](IndexerStep&, IndexerTopkArgs& a) {
         for (TensorView* v : {&a.q8, &a.w, &a.positions, &a.token_to_req, &a.token_valid, &a.block_table, &a.topk,
                               &a.candidates, &a.scores})
           v->device = Device::CUDA;
         a.k_cache.device = Device::CUDA;
         // valid device views would be dispatched: refused first (no workspace)
       }, built_with_cuda() ? "indexer_topk: workspace: absent, expected u8 [indexer_topk_workspace_bytes(...)] on cuda"
                            : "indexer_topk: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  std::vector<int32_t> cand;
  const IndexerStep base = topk_base(cand);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    IndexerStep s = base;
    if (c.role == IndexerRole::kCandidateConsumer) s.cand.vec() = cand;
    IndexerTopkArgs a = s.args(c.role);
    c.mutate(s, a);
    const std::vector<int32_t> cand_in = s.cand.vec();
    expect_error([&] { indexer_topk(a); }, E8, c.fragment);
    EXPECT_TRUE(s.topk.untouched());
    EXPECT_EQ(s.cand.vec(), cand_in);
    for (float x : s.scores.vec()) ASSERT_TRUE(std::isnan(x));
  }
  // an invalid token's row is never read: garbage there is no error, and its rows are all -1
  IndexerStep s = base;
  s.req[6] = 99;
  s.pos[6] = -5;
  s.cand.vec() = cand;
  std::fill(s.cand_row(6), s.cand_row(6) + 4, 77);
  EXPECT_NO_THROW(indexer_topk(s.args(IndexerRole::kCandidateConsumer)));
  for (int j = 0; j < kIndexTopk; ++j) ASSERT_EQ(s.topk_row(6)[j], -1);
}

// ---------------------------------------------------------------- the shortcut

TEST(IndexerValidation, Shortcut) {
  std::vector<int64_t> pos = {0, 511, 100, 700};
  std::vector<int32_t> valid = {1, 1, 1, 0};
  CanaryBuffer<int32_t> topk(5 * 512, kIndexCanary);
  IndexerShortcutArgs a;
  a.ratio = 1;
  a.positions = TensorView::contiguous(pos.data(), DType::I64, {4});
  a.token_valid = TensorView::contiguous(valid.data(), DType::I32, {4});
  a.topk = topk.view({5, 512});
  auto expect = [&](IndexerShortcutArgs b, const char* fragment) {
    expect_error([&] { indexer_shortcut_topk(b); }, E8, fragment);
    EXPECT_TRUE(topk.untouched());
  };
  IndexerShortcutArgs b = a;
  b.ratio = 4;
  expect(b, "indexer_shortcut_topk: ratio = 4, expected 1 or 2");
  b = a;
  b.topk.shape[1] = 256;
  expect(b, "topk: shape[1] = 256, expected 512");
  b = a;
  b.token_valid.shape[0] = 3;
  expect(b, "token_valid: 3 entries, expected T = 4");
  b = a;
  b.topk.device = Device::CUDA;
  b.positions.device = Device::CUDA;
  b.token_valid.device = Device::CUDA;
  if (built_with_cuda()) b.topk.dtype = DType::I64;  // valid device views would be dispatched: refused first
  expect(b, built_with_cuda() ? "indexer_shortcut_topk: topk: dtype i64"
                              : "indexer_shortcut_topk: the views are on cuda, but dsv41kv was built without CUDA");
  pos[2] = 512;
  expect(a, "positions[2] = 512 sees n_c = 513 entries, expected n_c <= 512 for the shortcut");
  pos[2] = -1;
  expect(a, "positions[2] = -1, expected 0 <= position < 2^62");
  pos[2] = 100;
  EXPECT_NO_THROW(indexer_shortcut_topk(a)) << "the invalid token at 700 is not checked";
  for (int j = 0; j < 512; ++j) {
    ASSERT_EQ(topk[static_cast<size_t>(512 + j)], j);
    ASSERT_EQ(topk[static_cast<size_t>(3 * 512 + j)], -1);
    ASSERT_EQ(topk[static_cast<size_t>(4 * 512 + j)], kIndexCanary);
  }

  expect_error([] { indexer_takes_shortcut(-1, 1); }, E8, "indexer_takes_shortcut: max_seq_len_in_batch: -1, expected >= 0");
  expect_error([] { indexer_takes_shortcut(10, 0); }, E8, "indexer_takes_shortcut: ratio = 0, expected 1 or 2");
}

// The CUDA top-k's workspace: per token 4 KiB per 4096-entry chunk of the block table's width
// (a source 6 KiB; a consumer 8 chunks whatever the width, and its union's chunk count).
TEST(IndexerValidation, TopkWorkspaceBytes) {
  EXPECT_EQ(indexer_topk_workspace_bytes(3, 100, 64, IndexerRole::kPlain), 3 * 2 * 4096);
  EXPECT_EQ(indexer_topk_workspace_bytes(3, 64, 64, IndexerRole::kPlain), 3 * 1 * 4096);
  EXPECT_EQ(indexer_topk_workspace_bytes(3, 100, 64, IndexerRole::kCandidateSource), 3 * 2 * 6144);
  EXPECT_EQ(indexer_topk_workspace_bytes(3, 100, 64, IndexerRole::kCandidateConsumer), 3 * (8 * 4096 + 4));
  EXPECT_EQ(indexer_topk_workspace_bytes(0, 100, 64, IndexerRole::kPlain), 0);
  EXPECT_EQ(indexer_topk_workspace_bytes(1, int64_t{1} << 40, 64, IndexerRole::kPlain), (int64_t{1} << 31) / 4096 * 4096);
  expect_error([] { indexer_topk_workspace_bytes(-1, 1, 64, IndexerRole::kPlain); }, E8,
               "indexer_topk_workspace_bytes: T: -1, expected >= 0");
  expect_error([] { indexer_topk_workspace_bytes(1, 1, 0, IndexerRole::kPlain); }, E8,
               "indexer_topk_workspace_bytes: states_per_page: 0, expected > 0");
}

}  // namespace
}  // namespace dsv41kv::test
