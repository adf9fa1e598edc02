// The indexer's CUDA kernels (the index-K store, the Q preparation) against the CPU backend on
// fresh random inputs: whole canary-filled caches and outputs byte for byte, both index-K formats,
// both ratios, non-closing and slot-less tokens, NaN and tiny vectors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/gpu_util.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

class IndexerGpu : public GpuTest {};

std::vector<float> table_of(int64_t rows, Rng& rng) {
  std::vector<float> t(static_cast<size_t>(rows * 64));
  for (auto& v : t) v = static_cast<float>(rng.uniform(-1.0, 1.0));
  return t;
}

TEST_F(IndexerGpu, KStoreMatchesCpuBothFormatsAndRatios) {
  for (IndexKFormat f : {IndexKFormat::FP8_132, IndexKFormat::MXFP4_68})
    for (int r : {1, 2}) {
      const std::string what = std::string(index_k_format_name(f)) + " r" + std::to_string(r);
      const int64_t N = 150, S = 64 / r, pages = 8, rows = 400;
      IndexKCacheView c = IndexKCacheView::with_default_strides(nullptr, f, pages, S);
      c.page_stride += 24;
      std::vector<uint8_t> cache(static_cast<size_t>(pages * c.page_stride), kByteCanary);
      std::vector<uint16_t> latent = random_bf16(static_cast<size_t>(N * 512), rng(), 2.0);
      for (int d = 0; d < 512; ++d) latent[static_cast<size_t>(7 * 512 + d)] = num::bf16_encode(1e-30f);  // tiny
      latent[static_cast<size_t>(9 * 512 + 3)] = 0x7FC0;                                                   // NaN
      std::vector<uint16_t> wk = random_bf16(128 * 512, rng(), 0.05), kn = random_bf16(128, rng(), 0.5, 1.5);
      std::vector<float> table = table_of(rows, rng());
      std::vector<int64_t> pos(static_cast<size_t>(N)), slot(static_cast<size_t>(N));
      std::vector<int64_t> perm(static_cast<size_t>(pages * S));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      rng().shuffle(perm);
      for (int64_t t = 0; t < N; ++t) {
        pos[static_cast<size_t>(t)] = rng().integer(0, rows - 1);
        slot[static_cast<size_t>(t)] = t % 9 == 5 ? -1 : perm[static_cast<size_t>(t)];  // distinct slots
      }
      DeviceBuffer<uint8_t> dcache(cache);
      DeviceBuffer<uint16_t> dlat(latent), dwk(wk), dkn(kn);
      DeviceBuffer<float> dtab(table);
      DeviceBuffer<int64_t> dpos(pos), dslot(slot);
      IndexKStoreArgs h;
      h.ratio = r;
      h.latent = TensorView::contiguous(latent.data(), DType::BF16, {N, 512});
      h.positions = TensorView::contiguous(pos.data(), DType::I64, {N});
      h.slots = TensorView::contiguous(slot.data(), DType::I64, {N});
      h.wk = TensorView::contiguous(wk.data(), DType::BF16, {128, 512});
      h.k_norm = TensorView::contiguous(kn.data(), DType::BF16, {128});
      h.eps = 1e-6f;
      h.rope_table = TensorView::contiguous(table.data(), DType::F32, {rows, 64});
      h.cache = c;
      h.cache.base = cache.data();
      IndexKStoreArgs d = h;
      d.latent = dlat.view({N, 512});
      d.positions = dpos.view1();
      d.slots = dslot.view1();
      d.wk = dwk.view({128, 512});
      d.k_norm = dkn.view({128});
      d.rope_table = dtab.view({rows, 64});
      d.cache.base = dcache.data();
      d.cache.device = Device::CUDA;
      indexer_k_store(h);
      indexer_k_store(d);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(bits_equal(cache, dcache.download(), what + ": index-K cache"));
    }
}

TEST_F(IndexerGpu, PrepareQMatchesCpu) {
  const int64_t T = 97, rows = 300, out_rows = T + 5;
  std::vector<uint16_t> q = random_bf16(static_cast<size_t>(T * 32 * 128), rng(), 3.0);
  for (int d = 0; d < 128; ++d) q[static_cast<size_t>(5 * 4096 + 2 * 128 + d)] = num::bf16_encode(1e-20f);
  q[static_cast<size_t>(11 * 4096 + 7)] = 0x7F80;  // +inf
  std::vector<uint16_t> w_raw = random_bf16(static_cast<size_t>(T * 32), rng());
  std::vector<float> table = table_of(rows, rng());
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (auto& p : pos) p = rng().integer(0, rows - 1);
  std::vector<uint8_t> q8(static_cast<size_t>(out_rows * 4096), kByteCanary);
  std::vector<float> w(static_cast<size_t>(out_rows * 32), -7.0f);
  DeviceBuffer<uint16_t> dq(q), dwr(w_raw);
  DeviceBuffer<float> dtab(table), dw(w);
  DeviceBuffer<int64_t> dpos(pos);
  DeviceBuffer<uint8_t> dq8(q8);
  IndexQPrepArgs h;
  h.q = TensorView::contiguous(q.data(), DType::BF16, {T, 32, 128});
  h.w_raw = TensorView::contiguous(w_raw.data(), DType::BF16, {T, 32});
  h.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
  h.rope_table = TensorView::contiguous(table.data(), DType::F32, {rows, 64});
  h.q8 = TensorView::contiguous(q8.data(), DType::U8, {out_rows, 32, 128});
  h.w = TensorView::contiguous(w.data(), DType::F32, {out_rows, 32});
  IndexQPrepArgs d;
  d.q = dq.view({T, 32, 128});
  d.w_raw = dwr.view({T, 32});
  d.positions = dpos.view1();
  d.rope_table = dtab.view({rows, 64});
  d.q8 = dq8.view({out_rows, 32, 128});
  d.w = dw.view({out_rows, 32});
  indexer_prepare_q(h);
  indexer_prepare_q(d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(bits_equal(q8, dq8.download(), "q8"));
  EXPECT_TRUE(bits_equal(w, dw.download(), "w"));
}

}  // namespace
}  // namespace dsv41kv::test

namespace dsv41kv::test {
namespace {

TEST_F(IndexerGpu, ShortcutMatchesCpu) {
  for (int r : {1, 2}) {
    const int64_t T = 41;
    std::vector<int64_t> pos(static_cast<size_t>(T));
    std::vector<int32_t> valid(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      pos[static_cast<size_t>(t)] = rng().integer(0, 512 * r - 1);
      valid[static_cast<size_t>(t)] = t % 6 == 2 ? 0 : 1;
    }
    std::vector<int32_t> topk(static_cast<size_t>((T + 3) * 520), 12345);
    DeviceBuffer<int64_t> dpos(pos);
    DeviceBuffer<int32_t> dvalid(valid), dtopk(topk);
    IndexerShortcutArgs h, d;
    h.ratio = d.ratio = r;
    h.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    h.token_valid = TensorView::contiguous(valid.data(), DType::I32, {T});
    h.topk = TensorView::strided(topk.data(), DType::I32, {T + 3, 512}, {520, 1});
    d.positions = dpos.view1();
    d.token_valid = dvalid.view1();
    d.topk = dtopk.strided({T + 3, 512}, {520, 1});
    indexer_shortcut_topk(h);
    indexer_shortcut_topk(d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dtopk.download() == topk) << "ratio " << r;
  }
}

}  // namespace
}  // namespace dsv41kv::test

#include "indexer/indexer_step.hpp"

namespace dsv41kv::test {
namespace {

// The step's views on the device (the same shapes), run, and its outputs downloaded back.
struct DeviceStep {
  DeviceBuffer<uint8_t> q8, kcache;
  DeviceBuffer<float> w, scores;
  DeviceBuffer<int64_t> pos;
  DeviceBuffer<int32_t> req, valid, bt, topk, cand;
  explicit DeviceStep(const IndexerStep& s)
      : q8(s.q8), kcache(s.kcache), w(s.w), scores(s.scores.vec()), pos(s.pos), req(s.req), valid(s.valid), bt(s.bt),
        topk(s.topk.vec()), cand(s.cand.vec()) {}
  IndexerTopkArgs args(IndexerStep& s, IndexerRole role) {
    IndexerTopkArgs a = s.args(role);
    a.q8 = q8.view({s.T, kIndexHeads, kIndexHeadDim});
    a.w = w.view({s.T, kIndexHeads});
    a.positions = pos.view1();
    a.token_to_req = req.view1();
    a.token_valid = valid.view1();
    a.block_table = bt.view({s.num_reqs, s.bt_cols});
    a.k_cache.base = kcache.data();
    a.k_cache.device = Device::CUDA;
    a.topk = topk.view({s.T + 2, kIndexTopk});
    if (role != IndexerRole::kPlain) a.candidates = cand.view({s.T + 2, kCandidateTopkBlocks});
    a.scores = scores.view({s.T + 1, s.scores_cols});
    return a;
  }
};

// The scores are bit for bit the CPU's (the same binary64 evaluation), so the top-k rows and the
// candidate blocks are the same rows, ties included; rows past the step stay untouched.
TEST_F(IndexerGpu, TopkMatchesCpuEveryRole) {
  for (int ratio : {1, 2}) {
    IndexerStep s = make_step(rng(), ratio, {{16383 * ratio + ratio - 1, 3}, {700, 2}, {3000, 1}, {5, 2}}, 64 / ratio, {3});
    for (int t = 0; t < 40; ++t) s.q8[static_cast<size_t>(t)] = 0;  // zero products: ties
    DeviceStep src(s);
    indexer_topk(s.args(IndexerRole::kCandidateSource));
    indexer_topk(src.args(s, IndexerRole::kCandidateSource));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string r = " ratio " + std::to_string(ratio);
    EXPECT_TRUE(bits_equal(s.scores.vec(), src.scores.download(), "source scores" + r));
    EXPECT_TRUE(bits_equal(s.topk.vec(), src.topk.download(), "source topk" + r));
    EXPECT_TRUE(bits_equal(s.cand.vec(), src.cand.download(), "candidates" + r));
    // a consumer with its own query, masked to the source's blocks; a plain layer
    IndexerStep c = s;
    for (auto& x : c.q8) x = random_e4m3(rng());
    c.reset_outputs();
    c.cand.vec() = s.cand.vec();
    for (IndexerRole role : {IndexerRole::kCandidateConsumer, IndexerRole::kPlain}) {
      IndexerStep h = c;
      DeviceStep d(h);
      indexer_topk(h.args(role));
      indexer_topk(d.args(h, role));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string what = std::string(indexer_role_name(role)) + r;
      EXPECT_TRUE(bits_equal(h.scores.vec(), d.scores.download(), what + ": scores"));
      EXPECT_TRUE(bits_equal(h.topk.vec(), d.topk.download(), what + ": topk"));
      EXPECT_TRUE(bits_equal(h.cand.vec(), d.cand.download(), what + ": candidates untouched"));
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test
