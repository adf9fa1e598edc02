// CPU backend of the attention ops (SPEC 9), the normative reference for the kernels to come.
// Arguments were validated by the public API (attention.cpp, plan.cpp) before any of this runs.
// Every op is split over threads by ctx.num_threads; each output element is produced by one
// thread in an order that does not depend on the split, so results never depend on the thread
// count (nor, for the attention itself, on the decode schedule's splits: kernel.hpp).
#include <algorithm>
#include <cstring>
#include <vector>

#include "attention/backend.hpp"
#include "attention/kernel.hpp"
#include "core/parallel.hpp"
#include "formats/insert.hpp"
#include "formats/rope_bf16.hpp"

namespace dsv41kv::detail::cpu {
namespace {

attn::Io heads_io(const TensorView& q, const TensorView& sink, float scale, const TensorView& out,
                  const TensorView& lse, const HeadsPlan& h) {
  attn::Io io;
  io.T = h.T;
  io.H = h.H;
  io.q = q.ptr<const uint16_t>();
  io.q_tok = h.q_tok;
  io.q_head = h.q_head;
  io.sink = sink.ptr<const float>();
  io.scale = scale;
  io.out = out.ptr<uint16_t>();
  io.out_tok = h.out_tok;
  io.out_head = h.out_head;
  io.lse = lse.ptr<float>();
  io.lse_tok = h.lse_tok;
  return io;
}

void widen(const uint16_t* bf, float* dst) {
  for (int d = 0; d < kLatentDim; ++d) dst[d] = num::bf16_decode(bf[d]);
}

// Decode keys (SPEC 9.4): the valid compressed entries of the row (j < cmp_len, slot >= 0), then
// the valid SWA entries (j < swa_len, slot >= 0), each the record readers' bf16 values (SPEC 5.3)
// as fp32 (read_state_f32). The compressed keys come first so that the key list is the one of the
// prefill rows of SPEC 9.5 step 2 (top-k entries, then the window): the same keys give the same
// bits either way.
struct DecodeSource {
  struct Key {
    int32_t slot;
    bool cmp;
  };
  const CacheView* swa = nullptr;
  const CacheView* cmp = nullptr;
  const int32_t* swa_idx = nullptr;
  int64_t swa_rs = 0;
  const int32_t* swa_len = nullptr;
  const int32_t* cmp_idx = nullptr;
  int64_t cmp_rs = 0;
  const int32_t* cmp_len = nullptr;

  template <class F>
  void each(int64_t t, F&& f) const {
    if (cmp != nullptr)
      for (int32_t j = 0; j < cmp_len[t]; ++j)
        if (cmp_idx[t * cmp_rs + j] >= 0) f(Key{cmp_idx[t * cmp_rs + j], true});
    for (int32_t j = 0; j < swa_len[t]; ++j)
      if (swa_idx[t * swa_rs + j] >= 0) f(Key{swa_idx[t * swa_rs + j], false});
  }
  void load(Key k, float* dst) const { read_state_f32(k.cmp ? *cmp : *swa, k.slot, dst); }
};

// Prefill keys (SPEC 9.5 step 3): workspace rows indices[t][j] for j < topk_length[t] with
// 0 <= index < s_kv, in row order.
struct PrefillSource {
  using Key = int32_t;
  const uint16_t* kv = nullptr;
  int64_t kv_rs = 0, s_kv = 0;
  const int32_t* idx = nullptr;
  int64_t idx_rs = 0;
  const int32_t* len = nullptr;

  template <class F>
  void each(int64_t t, F&& f) const {
    for (int32_t j = 0; j < len[t]; ++j) {
      const int32_t i = idx[t * idx_rs + j];
      if (i >= 0 && i < s_kv) f(i);
    }
  }
  void load(Key k, float* dst) const { widen(kv + k * kv_rs, dst); }
};

}  // namespace

void sparse_decode(const SparseDecodeArgs& a, const DecodePlan& p, const ExecContext& ctx, CpuForm form) {
  DecodeSource src;
  src.swa = &a.swa_cache;
  src.swa_idx = a.swa_indices.ptr<const int32_t>();
  src.swa_rs = p.swa_row_stride;
  src.swa_len = a.swa_lens.ptr<const int32_t>();
  if (p.with_cmp) {
    src.cmp = &a.cmp_cache;
    src.cmp_idx = a.cmp_indices.ptr<const int32_t>();
    src.cmp_rs = p.cmp_row_stride;
    src.cmp_len = a.cmp_lens.ptr<const int32_t>();
  }
  attn::run(heads_io(a.q, a.sink, a.softmax_scale, a.out, a.lse, p.heads), src, p.splits, ctx, form);
}

void sparse_prefill(const SparsePrefillArgs& a, const PrefillPlan& p, const ExecContext& ctx, CpuForm form) {
  PrefillSource src;
  src.kv = a.kv.ptr<const uint16_t>();
  src.kv_rs = p.kv_row_stride;
  src.s_kv = p.s_kv;
  src.idx = a.indices.ptr<const int32_t>();
  src.idx_rs = p.idx_row_stride;
  src.len = a.topk_length.ptr<const int32_t>();
  const int64_t key_blocks = (p.topk + attn::kBlock - 1) / attn::kBlock;
  attn::run(heads_io(a.q, a.sink, a.softmax_scale, a.out, a.lse, p.heads), src,
            plan_splits(p.heads.T, key_blocks, cpu_threads(ctx)), ctx, form);
}

// SPEC 9.5 step 1: the rows of every chunk request (its N_b compressed entries, then its G_b SWA
// tokens) as one flat list split over threads.
void gather_prefill_workspace(const WorkspaceGatherArgs& a, const GatherPlan& p, const ExecContext& ctx) {
  const PrefillChunk& c = a.chunk;
  const auto* seq = a.seq_lens.ptr<const int32_t>();
  const auto* gl = a.gather_lens.ptr<const int32_t>();
  const auto* gs = a.gather_starts.ptr<const int32_t>();
  const int64_t nr = c.num_reqs();
  std::vector<int64_t> first(static_cast<size_t>(nr + 1), 0);  // first flat row of each request
  for (int64_t bi = 0; bi < nr; ++bi) {
    const int64_t b = c.req_begin + bi;
    const int64_t N = a.ratio > 0 ? closed_groups(int64_t{seq[b]}, a.ratio) : 0;
    first[static_cast<size_t>(bi + 1)] = first[static_cast<size_t>(bi)] + N + gl[b];
  }
  auto* ws = a.workspace.ptr<uint16_t>();
  const auto* swa_bt = a.swa_block_table.ptr<const int32_t>();
  const auto* cmp_bt = a.ratio > 0 ? a.cmp_block_table.ptr<const int32_t>() : nullptr;
  parallel_for(first.back(), ctx, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const auto bi = static_cast<int64_t>(std::upper_bound(first.begin(), first.end(), r) - first.begin()) - 1;
      const int64_t b = c.req_begin + bi, k = r - first[static_cast<size_t>(bi)];
      const int64_t N = a.ratio > 0 ? closed_groups(int64_t{seq[b]}, a.ratio) : 0;
      const CacheView& cache = k < N ? a.cmp_cache : a.swa_cache;
      const int32_t* bt = k < N ? cmp_bt + b * p.cmp_bt_stride : swa_bt + b * p.swa_bt_stride;
      const int64_t x = k < N ? k : gs[b] + (k - N);  // compressed entry, or SWA position
      const int64_t row = bi * c.m_ch + (k < N ? k : c.n_ch + (k - N));
      const int64_t S = cache.states_per_page;
      read_state(cache, bt[x / S] * S + x % S, ws + row * p.ws_row_stride);
    }
  });
}

// SPEC 9.5 step 2.
void build_prefill_indices(const PrefillIndexArgs& a, const IndexPlan& p, const ExecContext& ctx) {
  const PrefillChunk& c = a.chunk;
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* t2r = a.token_to_req.ptr<const int32_t>();
  const auto* gs = a.gather_starts.ptr<const int32_t>();
  const auto* topk = a.ratio > 0 ? a.topk.ptr<const int32_t>() : nullptr;
  auto* idx = a.indices.ptr<int32_t>();
  auto* len = a.lengths.ptr<int32_t>();
  parallel_for(p.T, ctx, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int32_t* row = idx + t * p.idx_row_stride;
      std::fill(row, row + kPrefillIndexWidth, -1);
      const int64_t bi = t2r[t] - c.req_begin, g0 = gs[t2r[t]], pt = pos[t];
      const int64_t base = c.m_ch * bi;
      const int64_t topk_len = a.ratio > 0 ? std::min<int64_t>(closed_groups(pt + 1, a.ratio), kIndexTopk) : 0;
      for (int64_t j = 0; j < topk_len; ++j) {
        const int32_t i = topk[t * p.topk_row_stride + j];
        if (i >= 0 && i < c.n_ch) row[j] = static_cast<int32_t>(base + i);
      }
      const int64_t swa_start = std::max(swa_window_start(pt), g0);
      const int64_t swa_len = pt - swa_start + 1;
      for (int64_t k = 0; k < swa_len; ++k)
        row[topk_len + k] = static_cast<int32_t>(base + c.n_ch + (swa_start - g0) + k);
      len[t] = static_cast<int32_t>(topk_len + swa_len);
    }
  });
}

// SPEC 9.6: the real heads of every token, rotated back at the token's own table row.
void attention_output_rope(const OutputRopeArgs& a, const OutputRopePlan& p, const ExecContext& ctx) {
  const auto* o = a.o.ptr<const uint16_t>();
  auto* out = a.out.ptr<uint16_t>();
  const auto* pos = a.positions.ptr<const int64_t>();
  const auto* table = a.rope_table.ptr<const float>();
  parallel_for(p.T, ctx, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int h = 0; h < p.H_real; ++h)
        rope_bf16(o + t * p.o_tok + h * p.o_head, out + t * p.out_tok + h * p.out_head, kLatentDim,
                  table + pos[t] * kRopeDim, RopeDirection::kInverse);
  });
}

}  // namespace dsv41kv::detail::cpu
