// The CUDA sparse attention (sparse_decode over the paged caches, sparse_prefill over a bf16
// workspace; the tensor-core mainloop of attention/cuda/sparse_mla.cuh) against the binary64
// reference and the CPU backend with the SPEC 9.7 rule, on fresh random calls: every record format
// of both caches, head counts 8..128 (padded), s_q 1..6, forced splits and head tiles, empty and
// masked rows, sinks -inf / +inf / finite, garbage past the lengths, rows beyond T untouched;
// decode and prefill bit for bit on the same keys.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/backend.hpp"
#include "attention/cuda/backend_cuda.hpp"
#include "attention/decode_case.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class AttentionGpu : public GpuTest {};

// A host cache's backing on the device (the same view with device bytes).
struct DeviceCache {
  DeviceBuffer<uint8_t> u8;
  DeviceBuffer<uint16_t> bf16;
  CacheView view;
  explicit DeviceCache(const RandomCache& c) : view(c.view) {
    if (c.view.format == RecordFormat::PLAIN_BF16) {
      bf16.upload_new(c.bf16.vec());
      view.base = bf16.data();
    } else {
      u8.upload_new(c.u8.vec());
      view.base = u8.data();
    }
    view.device = Device::CUDA;
  }
};

// The device outputs downloaded into host Outputs (canaries included).
void download(const DeviceBuffer<uint16_t>& out, const DeviceBuffer<float>& lse, Outputs& o) {
  const std::vector<uint16_t> a = out.download();
  const std::vector<float> b = lse.download();
  for (size_t i = 0; i < a.size(); ++i) o.out[i] = a[i];
  for (size_t i = 0; i < b.size(); ++i) o.lse[i] = b[i];
}

// The CPU backend's outputs as the expectation of the SPEC 9.7 rule (the CPU is the reference of
// the house; it is itself checked against the binary64 reference).
Expected expected_of(const Outputs& cpu) {
  Expected e;
  e.H = static_cast<int>(cpu.H);
  const size_t n = static_cast<size_t>(cpu.T * cpu.H);
  for (size_t i = 0; i < n * kLatentDim; ++i) e.out.push_back(num::bf16_decode(cpu.out[i]));
  for (size_t i = 0; i < n; ++i) e.lse.push_back(cpu.lse[i]);
  return e;
}

// The device copies of a decode case's inputs (the caches, index rows, queries and sinks).
struct DeviceDecode {
  DeviceCache swa;
  std::unique_ptr<DeviceCache> cmp;
  DeviceBuffer<uint16_t> q;
  DeviceBuffer<float> sink;
  DeviceBuffer<int32_t> si, sl, ci, cl;
  explicit DeviceDecode(const DecodeCase& c)
      : swa(*c.swa), q(c.q), sink(c.sink), si(c.swa_idx), sl(c.swa_len),
        ci(c.spec.ratio > 0 ? c.cmp_idx : std::vector<int32_t>(1)), cl(c.spec.ratio > 0 ? c.cmp_len : std::vector<int32_t>(1)) {
    if (c.spec.ratio > 0) cmp = std::make_unique<DeviceCache>(*c.cmp);
  }
  // sparse_decode on the device with c's (CUDA) schedule into canary-filled outputs like `like`.
  Outputs run(DecodeCase& c) {
    const DecodeSpec& s = c.spec;
    Outputs gpu(s.T, s.H);
    DeviceBuffer<uint16_t> dout(gpu.out.vec());
    DeviceBuffer<float> dlse(gpu.lse.vec());
    const int64_t wsn = sparse_decode_workspace_floats(c.schedule);
    DeviceBuffer<float> dws(std::vector<float>(static_cast<size_t>(std::max<int64_t>(wsn, 1)), kLseCanary));
    SparseDecodeArgs a = c.args(gpu);
    const int64_t rows = s.T + s.extra_index_rows;
    a.q = q.view({s.T, s.H, kLatentDim});
    a.swa_cache = swa.view;
    a.swa_indices = si.view({rows, kSwaWindow});
    a.swa_lens = sl.view1();
    if (s.ratio > 0) {
      a.cmp_cache = cmp->view;
      a.cmp_indices = ci.view({rows, kIndexTopk});
      a.cmp_lens = cl.view1();
    }
    a.sink = sink.view1();
    a.out = dout.view({s.T, s.H, kLatentDim});
    a.lse = dlse.view({s.T, s.H});
    if (wsn > 0) a.workspace = dws.view1();
    sparse_decode(a);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    download(dout, dlse, gpu);
    return gpu;
  }
};

std::string decode_name(const DecodeCase& c) {
  const DecodeSpec& s = c.spec;
  return std::string(record_info(s.swa_format).name) + " + " + (s.ratio > 0 ? record_info(s.cmp_format).name : "-") +
         " r" + std::to_string(s.ratio) + " H " + std::to_string(s.H) + " s_q " + std::to_string(s.s_q) + " T " +
         std::to_string(s.T) + " splits " + std::to_string(c.schedule.splits) + " tile " +
         std::to_string(c.schedule.head_tile);
}

// A decode case of latent-sized states (the GPU tests' inputs, fixture.hpp).
DecodeSpec latent_spec(int H, int s_q, int ratio, int64_t T, RecordFormat swa, RecordFormat cmp) {
  return DecodeSpec{.H = H, .T = T, .s_q = s_q, .swa_format = swa, .ratio = ratio, .cmp_format = cmp, .latent_sized = true};
}

TEST_F(AttentionGpu, DecodeAgreesWithTheReferenceAndTheCpu) {
  struct Shape {
    int H, real, s_q, ratio;
    int64_t T;
  };
  const RecordFormat swa_formats[] = {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::PLAIN_BF16,
                                      RecordFormat::PLAIN_FP8};
  for (const Shape sh : {Shape{64, 0, 2, 2, 12}, Shape{128, 64, 1, 1, 5}, Shape{8, 0, 6, 2, 12},
                         Shape{16, 0, 3, 0, 9}})
    for (RecordFormat sf : swa_formats)
      for (RecordFormat cf : kAllRecordFormats) {
        if (sh.ratio == 0 && cf != RecordFormat::V4_584) continue;
        DecodeSpec s = latent_spec(sh.H, sh.s_q, sh.ratio, sh.T, sf, cf);
        s.real_heads = sh.real;
        DecodeCase c = DecodeCase::make(s, rng());
        Outputs cpu(s.T, s.H);
        sparse_decode(c.args(cpu));
        c.plan_cuda();
        DeviceDecode d(c);
        const Outputs gpu = d.run(c);
        const Expected e = c.expected();
        expect_agrees(gpu, e, "cuda " + decode_name(c));
        expect_agrees(cpu, e, "cpu " + decode_name(c));
      }
}

// Every head count x s_q x forced split (1, some, one block each) x head tile the kernels have,
// with lengths 0 / partial / full, masked entries, sinks -inf / +inf / finite (DecodeCase), for a
// 584 + 584 ratio-1 and a 528 + 288 ratio-2 layer and a swaonly one: against the CPU backend.
TEST_F(AttentionGpu, DecodeSweepsHeadsQueriesSplitsAndTiles) {
  struct Pair {
    RecordFormat swa, cmp;
    int ratio;
  };
  for (const Pair pr : {Pair{RecordFormat::V4_584, RecordFormat::V4_584, 1},
                        Pair{RecordFormat::MXFP8_528, RecordFormat::NVFP4_288, 2},
                        Pair{RecordFormat::V4_584, RecordFormat::V4_584, 0}})
    for (const int H : {8, 16, 64, 128})
      for (const int s_q : {1, 2, 6}) {
        const DecodeSpec s = latent_spec(H, s_q, pr.ratio, 12, pr.swa, pr.cmp);
        DecodeCase c = DecodeCase::make(s, rng());
        Outputs cpu(s.T, s.H);
        sparse_decode(c.args(cpu));
        const Expected e = expected_of(cpu);
        DeviceDecode d(c);
        const int64_t blocks = c.schedule.key_blocks;
        for (const int64_t splits : {int64_t{1}, std::min<int64_t>(3, blocks), blocks})
          for (const int tile : {16, 32, 64}) {
            if (!detail::cuda_head_tile_ok(H, tile)) continue;
            c.plan_cuda(splits, tile);
            expect_agrees(d.run(c), e, "cuda vs cpu " + decode_name(c));
          }
      }
}

// Page strides that leave records, scales or rows short of 16-byte alignment: the 64-head
// kernel's staged gather (cp.async chunks) must give way to the register reads for that cache
// (an odd byte stride: every format byte by byte; 8 bytes: the 288 record's values), while the
// other cache of the same call stays staged. Against the CPU backend.
TEST_F(AttentionGpu, DecodeReadsPagesThatCannotBeStaged) {
  struct Case {
    RecordFormat swa, cmp;
    int64_t swa_extra, cmp_extra;
  };
  for (const Case k : {Case{RecordFormat::V4_584, RecordFormat::NVFP4_288, 0, 8},
                       Case{RecordFormat::MXFP8_528, RecordFormat::V4_584, 3, 0},
                       Case{RecordFormat::PLAIN_FP8, RecordFormat::MXFP8_528, 0, 5}}) {
    DecodeSpec s = latent_spec(64, 2, 2, 12, k.swa, k.cmp);
    s.swa_extra = k.swa_extra;
    s.cmp_extra = k.cmp_extra;
    DecodeCase c = DecodeCase::make(s, rng());
    Outputs cpu(s.T, s.H);
    sparse_decode(c.args(cpu));
    const Expected e = expected_of(cpu);
    c.plan_cuda(1, 64);
    DeviceDecode d(c);
    expect_agrees(d.run(c), e, "cuda vs cpu, extra strides " + std::to_string(k.swa_extra) + " / " +
                                   std::to_string(k.cmp_extra) + " " + decode_name(c));
  }
}

// The CUDA schedule itself: batch 128 and 256 of the V4.1-Flash shape need no split with 64-head
// tiles; batch 2 fills the SMs with 16-head tiles and splits.
TEST_F(AttentionGpu, DecodeScheduleFillsTheDevice) {
  for (const int64_t T : {4, 256, 512}) {
    DecodeScheduleArgs a;
    a.layer = LayerType::kC2A;
    a.num_tokens = T;
    a.num_heads = 64;
    a.s_q = 2;
    a.device = Device::CUDA;
    const DecodeSchedule s = plan_decode_schedule(a);
    EXPECT_EQ(s.device, Device::CUDA);
    const int sms = detail::cuda::sm_count();
    const int64_t ctas = T * (64 / s.head_tile) * s.splits;
    if (T * 1 >= sms) {
      EXPECT_EQ(s.splits, 1) << T;
      EXPECT_EQ(s.head_tile, 64) << T;
    } else {
      EXPECT_GE(ctas, sms) << T;
    }
  }
}

// Decode over the paged caches and prefill over a workspace holding the same dequantized keys at
// the same list positions (masked entries as -1) give the same bits: one mainloop, the same
// blocks and merge order, exact dequantization (SPEC 5.3, 9.5).
TEST_F(AttentionGpu, DecodeAndPrefillAgreeOnTheSameKeys) {
  for (const int H : {8, 64, 128}) {
    const DecodeSpec s = latent_spec(H, 2, 2, 10, RecordFormat::V4_584, RecordFormat::MXFP8_528);
    DecodeCase c = DecodeCase::make(s, rng());
    c.plan_cuda(1, H <= 16 ? 16 : 64);
    DeviceDecode d(c);
    const Outputs dec = d.run(c);
    // the workspace: token t's list entries in order (compressed, then SWA)
    std::vector<uint16_t> kv;
    const int64_t width = kPrefillIndexWidth;
    std::vector<int32_t> idx(static_cast<size_t>(s.T * width), -1), len(static_cast<size_t>(s.T));
    int64_t rows = 0;
    for (int64_t t = 0; t < s.T; ++t) {
      int64_t j = 0;
      const auto add = [&](const RandomCache& cache, const std::vector<int32_t>& ix, const std::vector<int32_t>& ln,
                           int64_t w) {
        for (int32_t e = 0; e < ln[static_cast<size_t>(t)]; ++e, ++j) {
          const int32_t slot = ix[static_cast<size_t>(t * w + e)];
          if (slot < 0 || slot >= cache.capacity()) continue;
          append(kv, dequantized(cache.view, {slot}));
          idx[static_cast<size_t>(t * width + j)] = static_cast<int32_t>(rows++);
        }
      };
      add(*c.cmp, c.cmp_idx, c.cmp_len, kIndexTopk);
      add(*c.swa, c.swa_idx, c.swa_len, kSwaWindow);
      len[static_cast<size_t>(t)] = static_cast<int32_t>(j);
    }
    kv.resize(static_cast<size_t>(std::max<int64_t>(rows, 1) * kLatentDim), 0);
    Outputs pre(s.T, s.H);
    DeviceBuffer<uint16_t> dkv(kv), dout(pre.out.vec());
    DeviceBuffer<int32_t> didx(idx), dlen(len);
    DeviceBuffer<float> dlse(pre.lse.vec());
    SparsePrefillArgs a;
    a.q = d.q.view({s.T, s.H, kLatentDim});
    a.kv = dkv.view({std::max<int64_t>(rows, 1), kLatentDim});
    a.indices = didx.view({s.T, width});
    a.topk_length = dlen.view1();
    a.sink = d.sink.view1();
    a.softmax_scale = c.scale;
    a.out = dout.view({s.T, s.H, kLatentDim});
    a.lse = dlse.view({s.T, s.H});
    sparse_prefill(a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    download(dout, dlse, pre);
    EXPECT_TRUE(pre.same_bits(dec)) << "H " << H;
    expect_agrees(pre, c.expected(), "prefill of the decode keys H " + std::to_string(H));
  }
}

TEST_F(AttentionGpu, PrefillAgreesWithTheReference) {
  // 640-wide rows (512 + 128) and 1152-wide ones (1024 + 128), lengths 0, full and below the width
  for (const auto& [H, topk] : {std::pair{8, int64_t{kPrefillIndexWidth}}, std::pair{16, int64_t{kPrefillIndexWidth}},
                                std::pair{64, int64_t{kPrefillIndexWidth}}, std::pair{128, int64_t{kPrefillIndexWidth}},
                                std::pair{64, int64_t{1152}}}) {
    const int64_t T = 9, s_kv = 1400;
    std::vector<uint16_t> kv(static_cast<size_t>(s_kv * kLatentDim)), q(static_cast<size_t>(T * H * kLatentDim));
    for (auto& v : kv) v = random_bf16_value(rng(), 1.0);  // latent-sized (fixture.hpp)
    for (auto& v : q) v = num::bf16_encode(static_cast<float>(rng().normal()));
    std::vector<int32_t> idx(static_cast<size_t>(T * topk)), len(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      len[static_cast<size_t>(t)] = static_cast<int32_t>(t == 1 ? 0 : t == 2 ? topk : rng().integer(1, topk));
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t k = rng().integer(0, 9);
        idx[static_cast<size_t>(t * topk + j)] = static_cast<int32_t>(
            t == 3 || k == 0 ? -1 : k == 1 ? rng().integer(s_kv, 1 << 20) : rng().integer(0, s_kv - 1));
      }
    }
    std::vector<float> sink(static_cast<size_t>(H));
    for (int h = 0; h < H; ++h)
      sink[static_cast<size_t>(h)] = h == 2 ? kInf : h == 5 ? -kInf : static_cast<float>(rng().normal());
    Outputs gpu(T, H);
    DeviceBuffer<uint16_t> dq(q), dkv(kv), dout(gpu.out.vec());
    DeviceBuffer<int32_t> didx(idx), dlen(len);
    DeviceBuffer<float> dsink(sink), dlse(gpu.lse.vec());
    SparsePrefillArgs a;
    a.q = dq.view({T, H, kLatentDim});
    a.kv = dkv.view({s_kv, kLatentDim});
    a.indices = didx.view({T, topk});
    a.topk_length = dlen.view1();
    a.sink = dsink.view1();
    a.softmax_scale = default_scale();
    a.out = dout.view({T, H, kLatentDim});
    a.lse = dlse.view({T, H});
    sparse_prefill(a);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    download(dout, dlse, gpu);
    Expected e;
    e.H = H;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<uint16_t> keys;
      for (int32_t j = 0; j < len[static_cast<size_t>(t)]; ++j) {
        const int32_t i = idx[static_cast<size_t>(t * topk + j)];
        if (i >= 0 && i < s_kv) keys.insert(keys.end(), kv.begin() + i * kLatentDim, kv.begin() + (i + 1) * kLatentDim);
      }
      e.add(q.data() + t * H * kLatentDim, kLatentDim, keys, sink.data(), a.softmax_scale);
    }
    expect_agrees(gpu, e, "cuda prefill H " + std::to_string(H) + " width " + std::to_string(topk));
  }
}

}  // namespace
}  // namespace dsv41kv::test

namespace dsv41kv::test {
namespace {

// SPEC 9.6 on CUDA: bit for bit the CPU's inverse RoPE, padded heads dropped, in place.
TEST_F(AttentionGpu, OutputRopeMatchesCpu) {
  const int64_t T = 33, rows = 200;
  for (const auto& [H, real, in_place] : {std::tuple{64, 64, false}, std::tuple{128, 64, false}, std::tuple{8, 8, true}}) {
    std::vector<uint16_t> o(static_cast<size_t>(T * H * kLatentDim));
    for (auto& v : o) v = random_bf16_value(rng(), 2.0);
    std::vector<float> table(static_cast<size_t>(rows * 64));
    for (auto& v : table) v = static_cast<float>(rng().uniform(-1.0, 1.0));
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (auto& p : pos) p = rng().integer(0, rows - 1);
    std::vector<uint16_t> out(static_cast<size_t>((T + 2) * real * kLatentDim), kOutCanary);
    std::vector<uint16_t> ho = o;
    DeviceBuffer<uint16_t> d_o(o), d_out(out);
    DeviceBuffer<float> dtab(table);
    DeviceBuffer<int64_t> dpos(pos);
    OutputRopeArgs h, d;
    h.o = TensorView::contiguous(ho.data(), DType::BF16, {T, H, kLatentDim});
    h.num_real_heads = real;
    h.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    h.rope_table = TensorView::contiguous(table.data(), DType::F32, {rows, 64});
    h.out = in_place ? h.o : TensorView::contiguous(out.data(), DType::BF16, {T + 2, real, kLatentDim});
    d.o = d_o.view({T, H, kLatentDim});
    d.num_real_heads = real;
    d.positions = dpos.view1();
    d.rope_table = dtab.view({rows, 64});
    d.out = in_place ? d.o : d_out.view({T + 2, real, kLatentDim});
    attention_output_rope(h);
    attention_output_rope(d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (in_place) {
      EXPECT_TRUE(d_o.download() == ho) << "in place H " << H;
    } else {
      EXPECT_TRUE(d_out.download() == out) << "H " << H << " real " << real;
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test

namespace dsv41kv::test {
namespace {

// SPEC 9.5 steps 1-2 on CUDA, bit for bit the CPU's, and the whole prefill chain on the device
// (gather -> index rows -> attention) within SPEC 9.7 of the CPU chain.
TEST_F(AttentionGpu, PrefillChainMatchesCpu) {
  for (int ratio : {0, 1, 2}) {
    // three prefill requests over paged caches
    const int64_t swa_S = 32, cmp_S = ratio > 0 ? 64 / ratio : 1, R = 3;
    RandomCache swa(RecordFormat::V4_584, swa_S, 40, 0, rng(), true);
    std::unique_ptr<RandomCache> cmp;
    if (ratio > 0) cmp = std::make_unique<RandomCache>(RecordFormat::MXFP8_528, cmp_S, 30, 0, rng(), true);
    std::vector<int32_t> seq = {300, 77, 160}, qlen = {40, 77, 9}, G(3), g0(3);
    for (int64_t b = 0; b < R; ++b) {
      const int64_t prefix = seq[static_cast<size_t>(b)] - qlen[static_cast<size_t>(b)];
      G[static_cast<size_t>(b)] = static_cast<int32_t>(qlen[static_cast<size_t>(b)] + std::min<int64_t>(prefix, 127));
      g0[static_cast<size_t>(b)] = seq[static_cast<size_t>(b)] - G[static_cast<size_t>(b)];
    }
    const int64_t swa_cols = 12, cmp_cols = 12;
    std::vector<int32_t> swa_bt(static_cast<size_t>(R * swa_cols)), cmp_bt(static_cast<size_t>(R * cmp_cols));
    for (auto& v : swa_bt) v = static_cast<int32_t>(rng().integer(0, 39));
    for (auto& v : cmp_bt) v = static_cast<int32_t>(rng().integer(0, 29));
    PrefillChunkArgs pa;
    pa.ratio = ratio;
    pa.max_model_len = 400;
    pa.max_num_batched_tokens = 200;
    pa.seq_lens = view_of(seq);
    pa.gather_lens = view_of(G);
    const std::vector<PrefillChunk> chunks = plan_prefill_chunks(pa);
    ASSERT_FALSE(chunks.empty());
    const PrefillChunk c = chunks[0];
    const int64_t ws_rows = c.num_reqs() * c.m_ch;
    std::vector<uint16_t> ws(static_cast<size_t>(ws_rows * kLatentDim), kOutCanary);
    DeviceCache dswa(swa);
    std::unique_ptr<DeviceCache> dcmp;
    if (ratio > 0) dcmp = std::make_unique<DeviceCache>(*cmp);
    DeviceBuffer<int32_t> dseq(seq), dG(G), dg0(g0), dsbt(swa_bt), dcbt(cmp_bt);
    DeviceBuffer<uint16_t> dws(ws);
    WorkspaceGatherArgs h;
    h.ratio = ratio;
    h.chunk = c;
    h.seq_lens = view_of(seq);
    h.gather_lens = view_of(G);
    h.gather_starts = view_of(g0);
    h.swa_cache = swa.view;
    h.swa_block_table = TensorView::contiguous(swa_bt.data(), DType::I32, {R, swa_cols});
    if (ratio > 0) {
      h.cmp_cache = cmp->view;
      h.cmp_block_table = TensorView::contiguous(cmp_bt.data(), DType::I32, {R, cmp_cols});
    }
    h.workspace = TensorView::contiguous(ws.data(), DType::BF16, {ws_rows, kLatentDim});
    WorkspaceGatherArgs d = h;
    d.seq_lens = dseq.view1();
    d.gather_lens = dG.view1();
    d.gather_starts = dg0.view1();
    d.swa_cache = dswa.view;
    d.swa_block_table = dsbt.view({R, swa_cols});
    if (ratio > 0) {
      d.cmp_cache = dcmp->view;
      d.cmp_block_table = dcbt.view({R, cmp_cols});
    }
    d.workspace = dws.view({ws_rows, kLatentDim});
    gather_prefill_workspace(h);
    gather_prefill_workspace(d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dws.download() == ws) << "workspace, ratio " << ratio;
    // the index rows of the chunk's query tokens
    std::vector<int64_t> pos;
    std::vector<int32_t> t2r;
    for (int64_t b = c.req_begin; b < c.req_end; ++b)
      for (int64_t i = 0; i < qlen[static_cast<size_t>(b)]; ++i) {
        pos.push_back(seq[static_cast<size_t>(b)] - qlen[static_cast<size_t>(b)] + i);
        t2r.push_back(static_cast<int32_t>(b));
      }
    const auto T = static_cast<int64_t>(pos.size());
    std::vector<int32_t> topk(static_cast<size_t>(T * kIndexTopk));
    for (auto& v : topk) v = static_cast<int32_t>(rng().integer(-1, 200));
    std::vector<int32_t> idx(static_cast<size_t>((T + 1) * kPrefillIndexWidth), 7777), len(static_cast<size_t>(T + 1), 7777);
    DeviceBuffer<int64_t> dpos(pos);
    DeviceBuffer<int32_t> dt2r(t2r), dtopk(topk), didx(idx), dlen(len);
    PrefillIndexArgs hi;
    hi.ratio = ratio;
    hi.chunk = c;
    hi.positions = view_of(pos);
    hi.token_to_req = view_of(t2r);
    hi.gather_lens = view_of(G);
    hi.gather_starts = view_of(g0);
    if (ratio > 0) hi.topk = TensorView::contiguous(topk.data(), DType::I32, {T, kIndexTopk});
    hi.indices = TensorView::contiguous(idx.data(), DType::I32, {T + 1, kPrefillIndexWidth});
    hi.lengths = TensorView::contiguous(len.data(), DType::I32, {T + 1});
    PrefillIndexArgs di = hi;
    di.positions = dpos.view1();
    di.token_to_req = dt2r.view1();
    di.gather_lens = dG.view1();
    di.gather_starts = dg0.view1();
    if (ratio > 0) di.topk = dtopk.view({T, kIndexTopk});
    di.indices = didx.view({T + 1, kPrefillIndexWidth});
    di.lengths = dlen.view1();
    hi.indices.shape[0] = di.indices.shape[0] = T + 1;
    build_prefill_indices(hi);
    build_prefill_indices(di);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(didx.download() == idx) << "index rows, ratio " << ratio;
    EXPECT_TRUE(dlen.download() == len) << "lengths, ratio " << ratio;
  }
}

}  // namespace
}  // namespace dsv41kv::test
