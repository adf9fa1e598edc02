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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "dsv41kv/numerics.hpp"
#include "indexer/indexer_step.hpp"

namespace dsv41kv::test {
namespace {

// The step's views on the device (the same shapes), the workspace its size helper names, run, and
// its outputs downloaded back.
struct DeviceStep {
  DeviceBuffer<uint8_t> q8, kcache, ws;
  DeviceBuffer<float> w, scores;
  DeviceBuffer<int64_t> pos;
  DeviceBuffer<int32_t> req, valid, bt, topk, cand;
  explicit DeviceStep(const IndexerStep& s, IndexerRole role)
      : q8(s.q8), kcache(s.kcache),
        ws(std::vector<uint8_t>(static_cast<size_t>(indexer_topk_workspace_bytes(s.T, s.bt_cols, s.S, role)), 0xEE)),
        w(s.w), scores(s.scores.vec()), pos(s.pos), req(s.req), valid(s.valid), bt(s.bt), topk(s.topk.vec()),
        cand(s.cand.vec()) {}
  IndexerTopkArgs args(IndexerStep& s, IndexerRole role, bool with_scores, int group, int blocks = 0, int kernel = 0) {
    IndexerTopkArgs a = s.args(role, with_scores);
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
    if (with_scores) a.scores = scores.view({s.T + 1, s.scores_cols});
    a.workspace = ws.view1();
    a.group_tokens = group;
    a.score_blocks_per_sm = blocks;
    a.score_kernel = kernel;
    return a;
  }
};

// SPEC 8.8's bound of |dI| for every (token, entry) of the step: 1e-5 * sum_h |w| * sum_d |q k| * sk,
// summed as sum_d |k_d| * u_d with u_d = sum_h |w_h| |q_hd| (the same value in real arithmetic;
// a margin of 1e-4 of it covers the host's own rounding).
std::vector<double> tolerances(const IndexerStep& s) {
  const int64_t cols = s.scores_cols;
  std::vector<double> tol(static_cast<size_t>(s.T * cols), 0.0);
  std::vector<double> u(kIndexHeadDim);
  for (int64_t t = 0; t < s.T; ++t) {
    std::fill(u.begin(), u.end(), 0.0);
    for (int h = 0; h < kIndexHeads; ++h)
      for (int d = 0; d < kIndexHeadDim; ++d)
        u[static_cast<size_t>(d)] += std::fabs(s.w[static_cast<size_t>(t * kIndexHeads + h)]) *
                                     std::fabs(num::e4m3_decode(s.q8[static_cast<size_t>((t * kIndexHeads + h) * kIndexHeadDim + d)]));
    for (int64_t i = 0; i < s.nc(t) && i < cols; ++i) {
      const uint8_t* k = s.codes(t, i);
      double acc = 0.0;
      for (int d = 0; d < kIndexHeadDim; ++d) acc += std::fabs(num::e4m3_decode(k[d])) * u[static_cast<size_t>(d)];
      tol[static_cast<size_t>(t * cols + i)] = 1e-5 * acc * s.scale(t, i) * 1.0001;
    }
  }
  return tol;
}

// A selected row (top-k or candidates) against the reference's: the same count, a strictly
// ascending prefix then -1, and a difference of sets only among entries whose reference key lies
// within its tolerance (plus the boundary's) of the reference boundary key.
void expect_same_set(const int32_t* ref, const int32_t* got, int K, const std::vector<double>& key,
                     const std::vector<double>& tol, const std::string& what) {
  int nref = 0, ngot = 0;
  while (nref < K && ref[nref] >= 0) ++nref;
  while (ngot < K && got[ngot] >= 0) ++ngot;
  ASSERT_EQ(nref, ngot) << what << ": selected count";
  for (int j = ngot; j < K; ++j) ASSERT_EQ(got[j], -1) << what << ": position " << j << " after the prefix";
  for (int j = 1; j < ngot; ++j) ASSERT_LT(got[j - 1], got[j]) << what << ": prefix not strictly ascending at " << j;
  for (int j = 0; j < ngot; ++j)
    ASSERT_TRUE(got[j] >= 0 && static_cast<size_t>(got[j]) < key.size()) << what << ": entry " << got[j];
  double bmin = std::numeric_limits<double>::infinity(), btol = 0.0;  // the reference's lowest selected key
  for (int j = 0; j < nref; ++j)
    if (key[static_cast<size_t>(ref[j])] < bmin) {
      bmin = key[static_cast<size_t>(ref[j])];
      btol = tol[static_cast<size_t>(ref[j])];
    }
  std::vector<int32_t> a(ref, ref + nref), b(got, got + ngot), diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  for (int32_t e : diff) {
    const double k = key[static_cast<size_t>(e)], tl = tol[static_cast<size_t>(e)];
    EXPECT_TRUE(std::fabs(k - bmin) <= tl + btol)
        << what << ": entry " << e << " (reference key " << k << ") differs from the reference selection, boundary "
        << bmin << ", tolerance " << tl + btol;
  }
}

struct TopkCase {
  IndexerRole role = IndexerRole::kPlain;
  bool with_scores = true;
  int group = 0;
  int blocks = 0;  // score_blocks_per_sm
  int kernel = 0;  // score_kernel
};

// The CPU's outputs of a step for a role (with scores): the reference of check_topk.
IndexerStep cpu_reference(const IndexerStep& step, IndexerRole role) {
  IndexerStep h = step;
  indexer_topk(h.args(role, true));
  return h;
}

// Runs the step on CUDA and compares with the CPU's outputs `h` (cpu_reference) within the
// tolerances `tol`: scores within SPEC 8.8 (the same -inf), top-k and candidates as sets with the
// boundary rule, and every row past the step (and the candidates of a role that does not write
// them) untouched.
void check_topk(const IndexerStep& step, const IndexerStep& h, const std::vector<double>& tol, const TopkCase& c,
                const std::string& what) {
  IndexerStep fresh = step;
  DeviceStep d(fresh, c.role);
  indexer_topk(d.args(fresh, c.role, c.with_scores, c.group, c.blocks, c.kernel));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  const std::vector<float> scores = d.scores.download();
  const std::vector<int32_t> topk = d.topk.download(), cand = d.cand.download();
  const int64_t cols = h.scores_cols;
  if (c.with_scores) {
    int bad = 0;
    for (int64_t t = 0; t < h.T; ++t)
      for (int64_t i = 0; i < cols; ++i) {
        const float r = h.scores[static_cast<size_t>(t * cols + i)], g = scores[static_cast<size_t>(t * cols + i)];
        const bool ok = std::isfinite(r) ? std::fabs(static_cast<double>(g) - r) <= tol[static_cast<size_t>(t * cols + i)]
                                         : (std::isnan(r) ? std::isnan(g) : g == r);
        if (!ok && ++bad <= 5) ADD_FAILURE() << what << ": scores[" << t << "][" << i << "] = " << g << ", CPU " << r;
      }
    EXPECT_EQ(bad, 0) << what << ": scores outside SPEC 8.8";
    for (size_t i = static_cast<size_t>(h.T * cols); i < scores.size(); ++i)
      ASSERT_TRUE(std::isnan(scores[i])) << what << ": scores row past T written";
  } else {
    EXPECT_TRUE(bits_equal(step.scores.vec(), scores, what + ": scores absent, untouched"));
  }
  for (int64_t t = 0; t < h.T; ++t) {
    const std::string row = what + " token " + std::to_string(t);
    std::vector<double> key(static_cast<size_t>(cols)), tl(static_cast<size_t>(cols));
    for (int64_t i = 0; i < cols; ++i) {
      key[static_cast<size_t>(i)] = h.scores[static_cast<size_t>(t * cols + i)];
      tl[static_cast<size_t>(i)] = tol[static_cast<size_t>(t * cols + i)];
    }
    expect_same_set(h.topk_row(t), topk.data() + t * kIndexTopk, kIndexTopk, key, tl, row + " topk");
    if (c.role == IndexerRole::kCandidateSource) {
      const int64_t nc = h.nc(t), nb = (nc + kCandidateBlockSize - 1) / kCandidateBlockSize;
      std::vector<double> bk(static_cast<size_t>(std::max<int64_t>(nb, 1)), -INFINITY), bt(bk.size(), 0.0);
      for (int64_t i = 0; i < nc; ++i) {
        const size_t b = static_cast<size_t>(i / kCandidateBlockSize);
        bk[b] = std::max(bk[b], key[static_cast<size_t>(i)]);
        bt[b] = std::max(bt[b], tl[static_cast<size_t>(i)]);
      }
      if (nb > 0) bk[static_cast<size_t>(nb - 1)] = INFINITY;
      expect_same_set(h.cand.data() + t * kCandidateTopkBlocks, cand.data() + t * kCandidateTopkBlocks, kCandidateTopkBlocks, bk, bt,
                      row + " candidates");
    }
  }
  for (size_t i = static_cast<size_t>(h.T * kIndexTopk); i < topk.size(); ++i)
    ASSERT_EQ(topk[i], kIndexCanary) << what << ": topk row past T written";
  if (c.role == IndexerRole::kCandidateSource) {
    for (size_t i = static_cast<size_t>(h.T * kCandidateTopkBlocks); i < cand.size(); ++i)
      ASSERT_EQ(cand[i], kIndexCanary) << what << ": candidates row past T written";
  } else {
    EXPECT_TRUE(bits_equal(step.cand.vec(), cand, what + ": candidates untouched"));
  }
}

const char* role_tag(IndexerRole r) { return indexer_role_name(r); }

// The consumer's candidates: the CPU source's rows of the same step (its own queries).
IndexerStep with_source_candidates(const IndexerStep& s, Rng& rng) {
  IndexerStep src = s;
  indexer_topk(src.args(IndexerRole::kCandidateSource));
  IndexerStep c = s;
  for (auto& x : c.q8) x = random_e4m3(rng);
  c.reset_outputs();
  c.cand.vec() = src.cand.vec();
  return c;
}

// Every role, both ratios, around the 512 boundary and past 16K entries (where the candidates
// matter), decode rows of 1, 2 and 6 tokens per request, a prefill run, invalid tokens, with and
// without the scores output, several group sizes, aligned and unaligned key rows, both scoring
// kernels (the warpgroup one where it applies: aligned rows, groups of up to 2).
TEST_F(IndexerGpu, TopkMatchesCpuEveryRole) {
  for (int ratio : {1, 2}) {
    // n_c 511; 512, 512 + (ratio 1); 513..; 20000..; around 16384; a prefill run; tiny
    const std::vector<RequestSpec> reqs = {{511 * ratio - 1, 1},          {512 * ratio - 1, 2},
                                           {513 * ratio - 1, 6},          {20000 * ratio, 2},
                                           {16384 * ratio - 3, 3},        {3000, 16},
                                           {5, 2}};
    for (int64_t extra : {int64_t{52}, int64_t{0}}) {
      IndexerStep s = make_step(rng(), ratio, reqs, 64 / ratio, {3, 20}, extra);
      for (int t = 0; t < 40; ++t) s.q8[static_cast<size_t>(t)] = 0;  // zero products
      const IndexerStep cons = with_source_candidates(s, rng());
      const std::vector<double> tol = tolerances(s), tol_cons = tolerances(cons);
      for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer}) {
        const bool is_cons = role == IndexerRole::kCandidateConsumer;
        const IndexerStep& step = is_cons ? cons : s;
        const IndexerStep ref = cpu_reference(step, role);
        for (int kernel : {1, 2})
          for (bool sc : {true, false})
            for (int group : {0, 1, 6, 8}) {
              if (!sc && group != 0) continue;
              if (kernel == 2 && (extra != 0 || group > 2)) continue;
              const std::string what = std::string(role_tag(role)) + " r" + std::to_string(ratio) + " stride+" +
                                       std::to_string(extra) + (sc ? " scores" : " no scores") + " group " +
                                       std::to_string(group) + " kernel " + std::to_string(kernel);
              check_topk(step, ref, is_cons ? tol_cons : tol, {role, sc, group, 0, kernel}, what);
            }
        check_topk(step, ref, is_cons ? tol_cons : tol, {role, true, 0, 1, 1},
                   std::string(role_tag(role)) + " r" + std::to_string(ratio) + " one block per SM");
      }
    }
  }
}

// Ties at the selection boundary: every key of the request the same record, so every visible
// score is the same value on each backend, and SPEC 8.5's rule takes the lowest entries (and
// 8.7's the lowest blocks besides the newest): the rows must equal the CPU's exactly. Two shapes:
// few groups (many blocks per request, one hand-off each) and more groups than SMs (one block per
// request through several hand-offs, where the running top 512 is pruned among equal keys).
TEST_F(IndexerGpu, TopkTiesTakeTheLowestEntries) {
  std::vector<RequestSpec> many;
  for (int b = 0; b < 140; ++b) many.push_back({9000 + b, 2});
  for (const std::vector<RequestSpec>& reqs : {std::vector<RequestSpec>{{20000, 2}, {700, 1}}, many}) {
    IndexerStep s = make_step(rng(), 1, reqs, 64, {}, 0);
    const uint8_t* first = s.kcache.data() + int64_t{s.bt[0]} * s.page_stride;
    std::vector<uint8_t> rec(first, first + kIndexHeadDim);
    float sc0;
    std::memcpy(&sc0, first + IndexerKFp8Layout::scale_offset(s.S, 0), 4);
    for (int64_t p = 0; p < s.num_pages; ++p) {
      uint8_t* page = s.kcache.data() + p * s.page_stride;
      for (int64_t r = 0; r < s.S; ++r) {
        std::memcpy(page + r * kIndexHeadDim, rec.data(), kIndexHeadDim);
        std::memcpy(page + IndexerKFp8Layout::scale_offset(s.S, r), &sc0, 4);
      }
    }
    for (auto& x : s.w) x = std::fabs(x) + 1e-3f;  // a positive score unless every D is <= 0
    for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource}) {
      IndexerStep h = s;
      indexer_topk(h.args(role));
      for (int kernel : {1, 2}) {
        const std::string what = std::string(role_tag(role)) + " " + std::to_string(reqs.size()) +
                                 " requests kernel " + std::to_string(kernel);
        IndexerStep g = s;
        DeviceStep d(g, role);
        indexer_topk(d.args(g, role, false, 0, 0, kernel));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(bits_equal(h.topk.vec(), d.topk.download(), what + ": tied topk"));
        EXPECT_TRUE(bits_equal(h.cand.vec(), d.cand.download(), what + ": tied candidates"));
      }
    }
  }
}

// A request of 256K entries (ratio 1 and 2): 64 chunks of the workspace, 2 decode tokens and, for
// the source, 32768 blocks of which 2048 are kept; then a consumer of those blocks.
TEST_F(IndexerGpu, TopkLongContext) {
  for (int ratio : {1, 2}) {
    const int64_t n = int64_t{262144};
    IndexerStep s = make_step(rng(), ratio, {{n * ratio - 2 + ratio - 1, 2}}, 64, {}, 0);
    const IndexerStep ref = cpu_reference(s, IndexerRole::kCandidateSource);
    const std::vector<double> tol = tolerances(s);
    for (int kernel : {1, 2})
      check_topk(s, ref, tol, {IndexerRole::kCandidateSource, false, 0, 0, kernel},
                 "256K source r" + std::to_string(ratio) + " kernel " + std::to_string(kernel));
    const IndexerStep c = with_source_candidates(s, rng());
    const IndexerStep cref = cpu_reference(c, IndexerRole::kCandidateConsumer);
    const std::vector<double> ctol = tolerances(c);
    for (int kernel : {1, 2})
      check_topk(c, cref, ctol, {IndexerRole::kCandidateConsumer, true, 0, 0, kernel},
                 "256K consumer r" + std::to_string(ratio) + " kernel " + std::to_string(kernel));
  }
}

// A batch of more groups than SMs: one warpgroup block per group covers the whole request, so a
// token's candidates pass several hand-offs, compactions and thresholds; S = 32 (a stage spans two
// pages) and requests of different lengths.
TEST_F(IndexerGpu, TopkManyGroups) {
  std::vector<RequestSpec> reqs;
  for (int b = 0; b < 150; ++b) reqs.push_back({static_cast<int64_t>(b % 3 == 0 ? 9000 + 17 * b : 4100 + b), 2});
  IndexerStep s = make_step(rng(), 1, reqs, 32, {7, 100}, 0);
  const std::vector<double> tol = tolerances(s);
  const IndexerStep cons = with_source_candidates(s, rng());
  const std::vector<double> tol_cons = tolerances(cons);
  for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer}) {
    const bool is_cons = role == IndexerRole::kCandidateConsumer;
    const IndexerStep& step = is_cons ? cons : s;
    const IndexerStep ref = cpu_reference(step, role);
    for (int kernel : {1, 2})
      check_topk(step, ref, is_cons ? tol_cons : tol, {role, true, 0, 0, kernel},
                 std::string(role_tag(role)) + " 150 requests kernel " + std::to_string(kernel));
  }
}

// The workspace is checked before anything is written: absent, too small, misaligned.
TEST_F(IndexerGpu, TopkWorkspaceValidation) {
  IndexerStep s = make_step(rng(), 1, {{3000, 2}}, 64);
  DeviceStep d(s, IndexerRole::kPlain);
  IndexerTopkArgs a = d.args(s, IndexerRole::kPlain, true, 0);
  const int64_t need = indexer_topk_workspace_bytes(s.T, s.bt_cols, s.S, IndexerRole::kPlain);
  IndexerTopkArgs none = a;
  none.workspace = TensorView();
  EXPECT_THROW(indexer_topk(none), Error);
  IndexerTopkArgs small = a;
  small.workspace = d.ws.view({need - 1});
  EXPECT_THROW(indexer_topk(small), Error);
  IndexerTopkArgs odd = a;
  odd.workspace = TensorView::contiguous(static_cast<uint8_t*>(a.workspace.data) + 4, DType::U8, {need},
                                         Device::CUDA);  // inside the buffer's 16 bytes of slack
  EXPECT_THROW(indexer_topk(odd), Error);
  IndexerTopkArgs group = a;
  group.group_tokens = 9;
  EXPECT_THROW(indexer_topk(group), Error);
  IndexerTopkArgs blocks = a;
  blocks.score_blocks_per_sm = 3;
  EXPECT_THROW(indexer_topk(blocks), Error);
  IndexerTopkArgs kernel = a;
  kernel.score_kernel = 3;
  EXPECT_THROW(indexer_topk(kernel), Error);
  IndexerTopkArgs wide = a;  // the warpgroup kernel takes at most 2 tokens per block
  wide.score_kernel = 2;
  wide.group_tokens = 4;
  EXPECT_THROW(indexer_topk(wide), Error);
  IndexerTopkArgs unaligned = a;  // this step's page stride is not a multiple of 16
  unaligned.score_kernel = 2;
  EXPECT_THROW(indexer_topk(unaligned), Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(d.topk.download() == s.topk.vec());
  EXPECT_TRUE(bits_equal(s.scores.vec(), d.scores.download(), "scores untouched"));
}

}  // namespace
}  // namespace dsv41kv::test
