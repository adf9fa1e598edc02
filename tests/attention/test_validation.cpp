// Bad arguments of the attention ops: every case throws E8 naming the op, the argument, the value
// and what was expected, before anything is written (canary-filled outputs stay untouched).
#include <gtest/gtest.h>

#include "dsv41kv/device.hpp"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/decode_case.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

// Every view of a decode case on the device, with a CUDA schedule for it (H = 16: 16-head tiles).
void cuda_views(DecodeCase& c, SparseDecodeArgs& a) {
  for (TensorView* v : {&a.q, &a.swa_indices, &a.swa_lens, &a.cmp_indices, &a.cmp_lens, &a.sink, &a.out, &a.lse})
    v->device = Device::CUDA;
  a.swa_cache.device = a.cmp_cache.device = Device::CUDA;
  c.schedule.device = Device::CUDA;
  c.schedule.head_tile = 16;
}

constexpr ErrorCode E8 = ErrorCode::kInvalidArgument;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

class Validation : public AttentionTest {};

// ---------------------------------------------------------------- sparse_decode

struct DecodeBad {
  const char* name;
  std::function<void(DecodeCase&, SparseDecodeArgs&)> mutate;
  std::vector<std::string> parts;
};

TEST_F(Validation, SparseDecode) {
  SCOPED_TRACE(seed_text());
  // c2a: H 16, T 5, SWA 9 pages of 32 (288 slots), compressed 7 pages of 32 (224 slots)
  const std::vector<DecodeBad> cases = {
      {"q dtype", [](DecodeCase&, SparseDecodeArgs& a) { a.q.dtype = DType::F32; }, {"sparse_decode: q: dtype f32"}},
      {"head count", [](DecodeCase&, SparseDecodeArgs& a) { a.q.shape[1] = 12; }, {"q: 12 heads, expected one of 8, 16, 32, 64, 128"}},
      {"head size", [](DecodeCase&, SparseDecodeArgs& a) { a.q.shape[2] = 448; }, {"q: shape[2] = 448, expected 512"}},
      {"q 2-D", [](DecodeCase&, SparseDecodeArgs& a) { a.q.ndim = 2; }, {"q: 2 dimensions, expected 3"}},
      {"q inner stride", [](DecodeCase&, SparseDecodeArgs& a) { a.q.stride[2] = 2; }, {"q: inner stride 2, expected 1"}},
      {"q heads overlap", [](DecodeCase&, SparseDecodeArgs& a) { a.q.stride[1] = 256; }, {"q: head stride 256, expected >= 512"}},
      {"out heads", [](DecodeCase&, SparseDecodeArgs& a) { a.out.shape[1] = 8; }, {"out: 8 heads (shape[1]), expected 16"}},
      {"out rows", [](DecodeCase&, SparseDecodeArgs& a) { a.out.shape[0] = 4; }, {"out: 4 rows, expected at least 5"}},
      {"out rows overlap", [](DecodeCase&, SparseDecodeArgs& a) { a.out.stride[0] = 512; }, {"out: row stride 512, expected >= 8192"}},
      {"out dtype", [](DecodeCase&, SparseDecodeArgs& a) { a.out.dtype = DType::F32; }, {"out: dtype f32, expected bf16"}},
      {"lse width", [](DecodeCase&, SparseDecodeArgs& a) { a.lse.shape[1] = 15; }, {"lse: shape[1] = 15, expected 16"}},
      {"lse rows", [](DecodeCase&, SparseDecodeArgs& a) { a.lse.shape[0] = 2; }, {"lse: 2 rows, expected at least 5"}},
      {"lse dtype", [](DecodeCase&, SparseDecodeArgs& a) { a.lse.dtype = DType::BF16; }, {"lse: dtype bf16, expected f32"}},
      {"sink short", [](DecodeCase&, SparseDecodeArgs& a) { a.sink.shape[0] = 15; }, {"sink: 15 entries, expected at least 16"}},
      {"sink long", [](DecodeCase& c, SparseDecodeArgs& a) { c.sink.push_back(0); a.sink = view_of(c.sink); }, {"sink: 17 entries, expected H = 16"}},
      {"sink NaN", [](DecodeCase& c, SparseDecodeArgs&) { c.sink[3] = kNaN; }, {"sink: sink[3] is NaN"}},
      {"scale zero", [](DecodeCase&, SparseDecodeArgs& a) { a.softmax_scale = 0; }, {"softmax_scale: 0, expected a finite value > 0"}},
      {"scale NaN", [](DecodeCase&, SparseDecodeArgs& a) { a.softmax_scale = kNaN; }, {"softmax_scale: nan"}},
      {"s_q beyond 6", [](DecodeCase&, SparseDecodeArgs& a) { a.s_q = 7; }, {"s_q: 7, expected 1 .. 6"}},
      {"s_q divides T", [](DecodeCase&, SparseDecodeArgs& a) { a.s_q = 2; }, {"s_q: 2 does not divide T = 5"}},
      {"schedule absent", [](DecodeCase&, SparseDecodeArgs& a) { a.schedule = nullptr; }, {"schedule: absent"}},
      {"schedule tokens", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.num_tokens = 6; }, {"schedule: planned for T = 6, H = 16, s_q = 1, expected T = 5"}},
      {"schedule heads", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.num_heads = 64; }, {"planned for T = 5, H = 64"}},
      {"schedule s_q", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.s_q = 5; }, {"s_q = 5, expected T = 5, H = 16, s_q = 1"}},
      {"schedule splits", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.splits = 11; }, {"11 splits, expected a c2a schedule of key width 640, 10 key blocks and 1 .. 10 splits"}},
      {"schedule no splits", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.splits = 0; }, {"0 splits"}},
      {"schedule width", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.key_width = 128; }, {"key width 128"}},
      {"swaonly with a compressed list", [](DecodeCase& c, SparseDecodeArgs&) { c.schedule.layer = LayerType::kSwaOnly; c.schedule.key_width = 128; c.schedule.key_blocks = 2; c.schedule.splits = 1; }, {"cmp_indices: present, expected absent for a swaonly schedule"}},
      {"compressed list absent", [](DecodeCase&, SparseDecodeArgs& a) { a.cmp_indices = TensorView{}; }, {"cmp_indices: absent"}},
      {"compressed cache absent", [](DecodeCase&, SparseDecodeArgs& a) { a.cmp_cache = CacheView{}; }, {"sparse_decode: cmp_cache: base pointer is null"}},
      {"page size vs block size", [](DecodeCase&, SparseDecodeArgs& a) { a.cmp_cache.states_per_page = 64; a.cmp_cache.num_pages = 3; a.cmp_cache.page_stride = 37440; }, {"cmp_cache: states_per_page = 64, expected 32 (the c2a schedule's block size / ratio)"}},
      {"swa index list wider than its buffer", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_indices.shape[1] = 256; a.swa_indices.stride[0] = 256; a.swa_indices.shape[0] = 3; }, {"swa_indices: shape[1] = 256, expected 128"}},
      {"cmp index list narrower", [](DecodeCase&, SparseDecodeArgs& a) { a.cmp_indices.shape[1] = 256; }, {"cmp_indices: shape[1] = 256, expected 512"}},
      {"swa index rows", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_indices.shape[0] = 4; }, {"swa_indices: 4 rows, expected at least 5"}},
      {"swa index dtype", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_indices.dtype = DType::I64; }, {"swa_indices: dtype i64, expected i32"}},
      {"swa lens dtype", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_lens.dtype = DType::I64; }, {"swa_lens: dtype i64, expected i32"}},
      {"swa lens short", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_lens.shape[0] = 4; }, {"swa_lens: 4 entries, expected at least 5"}},
      {"swa length beyond the row", [](DecodeCase& c, SparseDecodeArgs&) { c.swa_len[2] = 129; }, {"swa_lens: swa_lens[2] = 129, expected 0 .. 128 (the width of swa_indices)"}},
      {"swa length negative", [](DecodeCase& c, SparseDecodeArgs&) { c.swa_len[4] = -1; }, {"swa_lens[4] = -1, expected 0 .. 128"}},
      {"cmp length beyond the row", [](DecodeCase& c, SparseDecodeArgs&) { c.cmp_len[0] = 513; }, {"cmp_lens: cmp_lens[0] = 513, expected 0 .. 512"}},
      {"swa slot beyond the cache", [](DecodeCase& c, SparseDecodeArgs&) { c.swa_idx[3 * 128 + 0] = 288; c.swa_len[3] = std::max(c.swa_len[3], 1); }, {"swa_indices: swa_indices[3][0] = 288, expected < swa_cache num_pages * states_per_page = 9 * 32 = 288"}},
      {"cmp slot beyond the cache", [](DecodeCase& c, SparseDecodeArgs&) { c.cmp_idx[0 * 512 + 511] = 1000; }, {"cmp_indices[0][511] = 1000, expected < cmp_cache num_pages * states_per_page = 7 * 32 = 224"}},
      {"swa cache 288", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_cache.format = RecordFormat::NVFP4_288; a.swa_cache.page_stride = 9216; }, {"swa_cache: format nvfp4_288 is a compressed-cache record only"}},
      {"swa page stride", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_cache.page_stride = 100; }, {"sparse_decode: swa_cache: page_stride = 100"}},
      {"cmp pages", [](DecodeCase&, SparseDecodeArgs& a) { a.cmp_cache.num_pages = 0; }, {"sparse_decode: cmp_cache: num_pages = 0"}},
      {"out device", [](DecodeCase&, SparseDecodeArgs& a) { a.out.device = Device::CUDA; }, {"out: on cuda, expected cpu like q"}},
      {"cache device", [](DecodeCase&, SparseDecodeArgs& a) { a.swa_cache.device = Device::CUDA; }, {"swa_cache: on cuda, expected cpu like q"}},
      // device views are not read on the host: a CUDA build's backend refuses query rows its
      // vector loads cannot read before any launch, a build without CUDA every device view
      {"cuda views", [](DecodeCase& c, SparseDecodeArgs& a) {
         cuda_views(c, a);
         a.q.stride[1] = 516;
         a.q.stride[0] = 516 * a.q.shape[1]; },
       {built_with_cuda() ? "expected multiples of 8 elements on cuda (16-byte rows)"
                          : "sparse_decode: the views are on cuda, but dsv41kv was built without CUDA"}},
      // the CUDA path's schedule and split-K workspace (checked on the host in every build)
      {"cuda views, cpu schedule", [](DecodeCase& c, SparseDecodeArgs& a) { cuda_views(c, a); c.schedule.device = Device::CPU; },
       {"sparse_decode: schedule: planned for cpu, expected a schedule planned for cuda"}},
      {"cuda head tile", [](DecodeCase& c, SparseDecodeArgs& a) { cuda_views(c, a); c.schedule.head_tile = 64; },
       {"sparse_decode: schedule: head_tile = 64, expected 16, 32 or 64 dividing H = 16"}},
      {"cuda split without workspace", [](DecodeCase& c, SparseDecodeArgs& a) { cuda_views(c, a); c.schedule.splits = 3; },
       {"sparse_decode: workspace: absent, expected f32 split-K workspace"}},
      {"cuda split, small workspace", [](DecodeCase& c, SparseDecodeArgs& a) {
         cuda_views(c, a);
         c.schedule.splits = 3;
         static float w[16];
         a.workspace = TensorView::contiguous(w, DType::F32, {16}, Device::CUDA); },
       {"sparse_decode: workspace: 16 elements, expected >= 123120 (sparse_decode_workspace_floats: T 5 x splits 3 x H 16 x 513)"}},
  };
  DecodeSpec s;
  s.T = 5;
  {
    DecodeCase c = DecodeCase::make(s, rng());
    Outputs o(s.T, s.H);
    ASSERT_NO_THROW(sparse_decode(c.args(o))) << "the base case is valid";
  }
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    DecodeCase c = DecodeCase::make(s, rng());
    Outputs o(s.T, s.H);
    SparseDecodeArgs a = c.args(o);
    bad.mutate(c, a);
    expect_error([&] { sparse_decode(a); }, E8, bad.parts);
    EXPECT_TRUE(o.out.untouched() && o.lse.untouched()) << "outputs written before the error";
  }
}

// ---------------------------------------------------------------- sparse_prefill

TEST_F(Validation, SparsePrefill) {
  const int64_t T = 3, H = 8, s_kv = 10, topk = 4;
  std::vector<uint16_t> q(static_cast<size_t>(T * H * kLatentDim), 0), kv(static_cast<size_t>(s_kv * kLatentDim), 0);
  std::vector<int32_t> idx = {0, 1, 2, 3, 9, 10, -1, 4, 5, 5, 5, 5}, len = {4, 2, 0};
  std::vector<float> sink(H, 0.0f);
  const std::vector<BadCase<SparsePrefillArgs>> cases = {
      {"kv width", [](SparsePrefillArgs& a) { a.kv.shape[1] = 448; }, "sparse_prefill: kv: shape[1] = 448, expected 512"},
      {"kv dtype", [](SparsePrefillArgs& a) { a.kv.dtype = DType::U8; }, "kv: dtype u8, expected bf16"},
      {"kv rows overlap", [](SparsePrefillArgs& a) { a.kv.stride[0] = 256; }, "kv: row stride 256, expected >= 512"},
      {"index rows", [](SparsePrefillArgs& a) { a.indices.shape[0] = 2; }, "indices: 2 rows, expected at least 3"},
      {"index dtype", [](SparsePrefillArgs& a) { a.indices.dtype = DType::I64; }, "indices: dtype i64, expected i32"},
      {"length beyond the row", [&](SparsePrefillArgs&) { len[1] = 5; }, "topk_length: topk_length[1] = 5, expected 0 .. 4 (the width of indices)"},
      {"length negative", [&](SparsePrefillArgs&) { len[2] = -2; }, "topk_length[2] = -2"},
      {"lengths short", [](SparsePrefillArgs& a) { a.topk_length.shape[0] = 2; }, "topk_length: 2 entries, expected at least 3"},
      {"head count", [](SparsePrefillArgs& a) { a.q.shape[1] = 4; a.out.shape[1] = 4; a.lse.shape[1] = 4; a.sink.shape[0] = 4; }, "q: 4 heads, expected one of"},
      {"q head size", [](SparsePrefillArgs& a) { a.q.shape[2] = 576; }, "q: shape[2] = 576, expected 512"},
      {"sink +nan", [&](SparsePrefillArgs&) { sink[7] = kNaN; }, "sink: sink[7] is NaN"},
      {"cuda", [](SparsePrefillArgs& a) {
         for (TensorView* v : {&a.q, &a.kv, &a.indices, &a.topk_length, &a.sink, &a.out, &a.lse}) v->device = Device::CUDA;
         a.kv.stride[0] = 516; },
       built_with_cuda() ? "sparse_prefill: kv: row stride 516, expected a multiple of 8 elements on cuda"
                         : "sparse_prefill: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    len = {4, 2, 0};
    sink.assign(H, 0.0f);
    Outputs o(T, H);
    SparsePrefillArgs a = prefill_args(q, T, H, kv, idx, topk, len, sink, 0.5f);
    a.out = o.out_view();
    a.lse = o.lse_view();
    bad.mutate(a);
    expect_error([&] { sparse_prefill(a); }, E8, bad.part);
    EXPECT_TRUE(o.out.untouched() && o.lse.untouched()) << "outputs written before the error";
  }
}

// ---------------------------------------------------------------- the prefill plan, gather and rows

TEST_F(Validation, PrefillChunkPlan) {
  std::vector<int32_t> seq = {100, 50}, g = {30, 20};
  auto run = [&](int r, int64_t len, int64_t mnbt) { return plan_chunks(r, len, mnbt, seq, g); };
  expect_error([&] { run(3, 200, 10); }, E8, "plan_prefill_chunks: ratio: 3, expected 0, 1 or 2");
  expect_error([&] { run(1, 0, 10); }, E8, "max_model_len: 0, expected 1 .. 2^40");
  expect_error([&] { run(1, 200, 0); }, E8, "max_num_batched_tokens: 0");
  expect_error([&] { run(1, 99, 10); }, E8, "plan_prefill_chunks: seq_lens: seq_lens[0] = 100, expected 1 .. max_model_len = 99");
  g[1] = 51;
  expect_error([&] { run(1, 200, 10); }, E8, "gather_lens: gather_lens[1] = 51, expected 1 .. seq_lens[1] = 50");
  g[1] = 0;
  expect_error([&] { run(1, 200, 10); }, E8, "gather_lens[1] = 0, expected 1");
  // cap_ws = 4 * (0 + 128 + 1) = 516 for ratio 0; a request needing more rows than that
  seq = {600, 50};
  g = {600, 20};
  expect_error([&] { run(0, 600, 1); }, E8, "request 0 needs N_b + G_b = 0 + 600 workspace rows, expected <= cap_ws = 516");
  seq = {100, 50};
  g = {30, 20};
  PrefillChunkArgs a;
  a.ratio = 1;
  a.max_model_len = 200;
  a.max_num_batched_tokens = 10;
  a.seq_lens = view_of(seq);
  a.gather_lens = view_of(g);
  a.gather_lens.shape[0] = 1;
  expect_error([&] { plan_prefill_chunks(a); }, E8, "gather_lens: 1 entries, expected at least 2");
  a.gather_lens = view_of(g);
  a.seq_lens.device = Device::CUDA;
  expect_error([&] { plan_prefill_chunks(a); }, E8, "seq_lens: on cuda, expected cpu");
}

TEST_F(Validation, PrefillGather) {
  // two requests, ratio 2: SWA pages of 32, compressed pages of 32; request 1 in a chunk alone
  auto swa = std::make_unique<RandomCache>(RecordFormat::V4_584, 32, 6, 0, rng());
  auto cmp = std::make_unique<RandomCache>(RecordFormat::V4_584, 32, 4, 0, rng());
  std::vector<int32_t> seq = {70, 60}, G = {40, 60}, g0 = {30, 0};
  std::vector<int32_t> swa_bt = {1, 2, 3, 4, 5, 0}, cmp_bt = {1, 2, 3, 0};  // [2, 3], [2, 2]
  const std::vector<BadCase<WorkspaceGatherArgs>> cases = {
      {"ratio", [](WorkspaceGatherArgs& a) { a.ratio = 4; }, "gather_prefill_workspace: ratio: 4, expected 0, 1 or 2"},
      {"chunk range", [](WorkspaceGatherArgs& a) { a.chunk.req_end = 3; }, "chunk: requests [0, 3), expected 0 <= req_begin <= req_end <= 2"},
      {"chunk constants", [](WorkspaceGatherArgs& a) { a.chunk.m_ch = 10; }, "chunk: N_ch = 35, M_ch = 10, expected 0 <= N_ch <= M_ch"},
      {"chunk beyond i32 rows", [](WorkspaceGatherArgs& a) { a.chunk.m_ch = int64_t{1} << 30; }, "chunk: 2 requests of M_ch = 1073741824 workspace rows, expected fewer than 2^31 rows"},
      {"N_ch below N_b", [](WorkspaceGatherArgs& a) { a.chunk.n_ch = 34; }, "chunk: N_ch = 34, expected >= N_b = seq_lens[0] / 2 = 35"},
      {"G beyond M_ch - N_ch", [&](WorkspaceGatherArgs&) { G[1] = 61; seq[1] = 61; }, "gather_lens: gather_lens[1] = 61, expected 0 .. M_ch - N_ch = 60"},
      {"gather beyond seq_len", [&](WorkspaceGatherArgs&) { g0[0] = 31; }, "gather_starts: gather_starts[0] = 31 with gather_lens 40"},
      {"gather start negative", [&](WorkspaceGatherArgs&) { g0[1] = -1; }, "gather_starts[1] = -1"},
      {"seq_len zero", [&](WorkspaceGatherArgs&) { seq[1] = 0; G[1] = 0; }, "seq_lens: seq_lens[1] = 0, expected >= 1"},
      {"swa page beyond the cache", [&](WorkspaceGatherArgs&) { swa_bt[4] = 6; }, "swa_block_table: swa_block_table[1][1] = 6 for the positions of request 1, expected a page id in [0, 6)"},
      {"cmp page negative", [&](WorkspaceGatherArgs&) { cmp_bt[1] = -1; }, "cmp_block_table[0][1] = -1"},
      {"table too narrow", [](WorkspaceGatherArgs& a) { a.swa_block_table.shape[1] = 2; a.swa_block_table.stride[0] = 3; }, "swa_block_table: request 0 needs column 2 for its positions 30 .. 69, expected < 2"},
      {"table rows", [](WorkspaceGatherArgs& a) { a.cmp_block_table.shape[0] = 1; }, "cmp_block_table: 1 rows, expected at least R = 2"},
      {"workspace rows", [](WorkspaceGatherArgs& a) { a.workspace.shape[0] = 189; }, "workspace: 189 rows, expected at least 190"},
      {"workspace dtype", [](WorkspaceGatherArgs& a) { a.workspace.dtype = DType::F32; }, "workspace: dtype f32"},
      {"lengths mismatch", [](WorkspaceGatherArgs& a) { a.gather_starts.shape[0] = 3; }, "gather_starts: 3 entries, expected R = 2"},
      {"cmp table for ratio 0", [](WorkspaceGatherArgs& a) { a.ratio = 0; a.chunk.n_ch = 0; }, "cmp_block_table: present, expected absent for ratio 0"},
      {"swa cache 288", [](WorkspaceGatherArgs& a) { a.swa_cache.format = RecordFormat::NVFP4_288; a.swa_cache.page_stride = 9216; }, "swa_cache: format nvfp4_288"},
      {"cuda", [](WorkspaceGatherArgs& a) {
         for (TensorView* v : {&a.seq_lens, &a.gather_lens, &a.gather_starts, &a.swa_block_table, &a.cmp_block_table, &a.workspace}) v->device = Device::CUDA;
         a.swa_cache.device = a.cmp_cache.device = Device::CUDA;
         a.workspace.stride[0] = 516; },  // a CUDA build dispatches valid device views: refused before any launch
       built_with_cuda() ? "gather_prefill_workspace: workspace: row stride 516"
                         : "gather_prefill_workspace: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  auto run = [&](const std::function<void(WorkspaceGatherArgs&)>& mutate, CanaryBuffer<uint16_t>& ws) {
    seq = {70, 60};
    G = {40, 60};
    g0 = {30, 0};
    swa_bt = {1, 2, 3, 4, 5, 0};
    cmp_bt = {1, 2, 3, 0};
    WorkspaceGatherArgs a;
    a.ratio = 2;
    a.chunk = {0, 2, 35, 95};
    a.seq_lens = view_of(seq);
    a.gather_lens = view_of(G);
    a.gather_starts = view_of(g0);
    a.swa_cache = swa->view;
    a.swa_block_table = TensorView::contiguous(swa_bt.data(), DType::I32, {2, 3});
    a.cmp_cache = cmp->view;
    a.cmp_block_table = TensorView::contiguous(cmp_bt.data(), DType::I32, {2, 2});
    a.workspace = TensorView::contiguous(ws.data(), DType::BF16, {190, kLatentDim});
    mutate(a);
    gather_prefill_workspace(a);
  };
  {
    CanaryBuffer<uint16_t> ws(static_cast<size_t>(2 * 95 * kLatentDim), kBf16Sentinel);
    ASSERT_NO_THROW(run([](WorkspaceGatherArgs&) {}, ws)) << "the base case is valid";
  }
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    CanaryBuffer<uint16_t> ws(static_cast<size_t>(2 * 95 * kLatentDim), kBf16Sentinel);
    expect_error([&] { run(bad.mutate, ws); }, E8, bad.part);
    EXPECT_TRUE(ws.untouched()) << "workspace written before the error";
  }
}

TEST_F(Validation, PrefillIndices) {
  std::vector<int64_t> pos = {65, 69, 59};
  std::vector<int32_t> t2r = {0, 0, 1}, G = {40, 60}, g0 = {30, 0};
  std::vector<int32_t> topk(3 * 512, -1);
  const std::vector<BadCase<PrefillIndexArgs>> cases = {
      {"request outside the chunk", [&](PrefillIndexArgs& a) { a.chunk = {0, 1, 35, 95}; }, "build_prefill_indices: token_to_req: token_to_req[2] = 1, expected a request of the chunk [0, 1)"},
      {"position before the gathered tokens", [&](PrefillIndexArgs&) { pos[0] = 29; }, "positions: positions[0] = 29 of request 0, expected inside its gathered tokens [30, 70)"},
      {"position after the gathered tokens", [&](PrefillIndexArgs&) { pos[2] = 60; }, "positions[2] = 60 of request 1, expected inside its gathered tokens [0, 60)"},
      {"G beyond the chunk", [&](PrefillIndexArgs&) { G[0] = 61; }, "gather_lens: gather_lens[0] = 61, expected 0 .. M_ch - N_ch = 60"},
      {"index width", [](PrefillIndexArgs& a) { a.indices.shape[1] = 512; }, "indices: shape[1] = 512, expected 640"},
      {"index rows", [](PrefillIndexArgs& a) { a.indices.shape[0] = 2; }, "indices: 2 rows, expected at least 3"},
      {"lengths short", [](PrefillIndexArgs& a) { a.lengths.shape[0] = 2; }, "lengths: 2 entries, expected at least 3"},
      {"topk absent", [](PrefillIndexArgs& a) { a.topk = TensorView{}; }, "topk: absent"},
      {"topk width", [](PrefillIndexArgs& a) { a.topk.shape[1] = 640; a.topk.stride[0] = 640; a.topk.shape[0] = 2; }, "topk: shape[1] = 640, expected 512"},
      {"topk for ratio 0", [](PrefillIndexArgs& a) { a.ratio = 0; a.chunk.n_ch = 0; }, "topk: present, expected absent for ratio 0"},
      {"positions dtype", [](PrefillIndexArgs& a) { a.positions.dtype = DType::I32; }, "positions: dtype i32, expected i64"},
      {"cuda", [](PrefillIndexArgs& a) {
         for (TensorView* v : {&a.positions, &a.token_to_req, &a.gather_lens, &a.gather_starts, &a.topk, &a.indices, &a.lengths}) v->device = Device::CUDA;
         if (built_with_cuda()) a.lengths.dtype = DType::I64; },  // valid device views would be dispatched
       built_with_cuda() ? "build_prefill_indices: lengths: dtype i64"
                         : "build_prefill_indices: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  auto run = [&](const std::function<void(PrefillIndexArgs&)>& mutate, CanaryBuffer<int32_t>& idx,
                 CanaryBuffer<int32_t>& len) {
    pos = {65, 69, 59};
    G = {40, 60};
    PrefillIndexArgs a;
    a.ratio = 2;
    a.chunk = {0, 2, 35, 95};
    a.positions = view_of(pos);
    a.token_to_req = view_of(t2r);
    a.gather_lens = view_of(G);
    a.gather_starts = view_of(g0);
    a.topk = TensorView::contiguous(topk.data(), DType::I32, {3, 512});
    a.indices = idx.view({3, 640});
    a.lengths = len.view({3});
    mutate(a);
    build_prefill_indices(a);
  };
  {
    CanaryBuffer<int32_t> idx(3 * 640, 0x5A5A5A5A), len(3, 0x5A5A5A5A);
    ASSERT_NO_THROW(run([](PrefillIndexArgs&) {}, idx, len)) << "the base case is valid";
  }
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    CanaryBuffer<int32_t> idx(3 * 640, 0x5A5A5A5A), len(3, 0x5A5A5A5A);
    expect_error([&] { run(bad.mutate, idx, len); }, E8, bad.part);
    EXPECT_TRUE(idx.untouched() && len.untouched()) << "outputs written before the error";
  }
}

// ---------------------------------------------------------------- the decode schedule and the output RoPE

TEST_F(Validation, DecodeSchedule) {
  auto plan = [](auto mutate) {
    DecodeScheduleArgs a;
    a.layer = LayerType::kC2A;
    a.num_tokens = 6;
    mutate(a);
    return plan_decode_schedule(a);
  };
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.num_heads = 12; }); }, E8,
               "plan_decode_schedule: num_heads: 12, expected one of 8, 16, 32, 64, 128");
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.s_q = 7; }); }, E8, "s_q: 7, expected 1 .. 6");
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.s_q = 4; }); }, E8, "s_q: 4 does not divide num_tokens = 6");
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.block_size = 63; }); }, E8,
               "block_size: 63, expected a positive multiple of the ratio 2");
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.num_tokens = -1; }); }, E8, "num_tokens: -1, expected >= 0");
  expect_error([&] { plan([](DecodeScheduleArgs& a) { a.layer = static_cast<LayerType>(5); }); }, E8,
               "layer: 5, expected swaonly (0), c1a (1) or c2a (2)");
  EXPECT_NO_THROW(plan([](DecodeScheduleArgs& a) { a.layer = LayerType::kSwaOnly; a.block_size = 63; }));
}

TEST_F(Validation, OutputRope) {
  const int64_t T = 3, H = 16;
  std::vector<uint16_t> o(static_cast<size_t>(T * H * kLatentDim), 0x3F80);
  std::vector<int64_t> pos = {0, 3, 7};
  std::vector<float> table(8 * 64, 0.5f);
  const std::vector<BadCase<OutputRopeArgs>> cases = {
      {"no real heads", [](OutputRopeArgs& a) { a.num_real_heads = 0; }, "attention_output_rope: num_real_heads: 0, expected 1 .. H = 16"},
      {"too many real heads", [](OutputRopeArgs& a) { a.num_real_heads = 17; }, "num_real_heads: 17, expected 1 .. H = 16"},
      {"out heads", [](OutputRopeArgs& a) { a.out.shape[1] = 16; }, "out: 16 heads (shape[1]), expected 8"},
      {"out rows", [](OutputRopeArgs& a) { a.out.shape[0] = 2; }, "out: 2 rows, expected at least 3"},
      {"position beyond the table", [&](OutputRopeArgs&) { pos[2] = 8; }, "positions: positions[2] = 8, expected a row of the RoPE table [0, 8)"},
      {"negative position", [&](OutputRopeArgs&) { pos[0] = -1; }, "positions[0] = -1"},
      {"table width", [](OutputRopeArgs& a) { a.rope_table.shape[1] = 32; }, "rope_table: shape[1] = 32, expected 64"},
      {"o head size", [](OutputRopeArgs& a) { a.o.shape[2] = 256; }, "o: shape[2] = 256, expected 512"},
      {"in place with other strides", [&](OutputRopeArgs& a) { a.out = TensorView::contiguous(o.data(), DType::BF16, {T, 8, kLatentDim}); }, "out: shares its data with o but has strides [4096, 512] instead of o's [8192, 512]"},
      {"cuda", [](OutputRopeArgs& a) {
         for (TensorView* v : {&a.o, &a.positions, &a.rope_table, &a.out}) v->device = Device::CUDA;
         a.out.stride[1] = 516;  // a CUDA build dispatches valid device views: refused before any launch
         a.out.stride[0] = 516 * a.out.shape[1]; },
       built_with_cuda() ? "attention_output_rope: out: strides" : "attention_output_rope: the views are on cuda, but dsv41kv was built without CUDA"},
  };
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    pos = {0, 3, 7};
    CanaryBuffer<uint16_t> out(static_cast<size_t>(T * 8 * kLatentDim), kOutCanary);
    const std::vector<uint16_t> o_before = o;
    OutputRopeArgs a;
    a.o = TensorView::contiguous(o.data(), DType::BF16, {T, H, kLatentDim});
    a.num_real_heads = 8;
    a.positions = view_of(pos);
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {8, 64});
    a.out = out.view({T, 8, kLatentDim});
    bad.mutate(a);
    expect_error([&] { attention_output_rope(a); }, E8, bad.part);
    EXPECT_TRUE(out.untouched()) << "out written before the error";
    EXPECT_EQ(o, o_before) << "o written before the error";
  }
}

}  // namespace
}  // namespace dsv41kv::test
