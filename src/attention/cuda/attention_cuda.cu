// The attention ops on CUDA: sparse MLA with sink (SPEC 9.2-9.4, 9.5 step 3) on tensor cores
// (sparse_mla.cuh: one mainloop for decode over the paged caches and prefill over the bf16
// workspace, the split-K merge), and the correctness-first one-warp-per-row forms of the output
// inverse RoPE (9.6), the workspace gather (9.5 step 1) and the combined index rows (step 2),
// bit for bit the CPU's. Indices a kernel cannot use (a slot beyond the cache) are masked; the
// host checks them for host views.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>

#include "attention/cuda/backend_cuda.hpp"
#include "core/cuda/cuda_util.hpp"
#include "core/cuda/memory.cuh"
#include "core/validate.hpp"
#include "formats/cuda/fast_numerics.cuh"
#include "attention/cuda/sparse_mla_merge.cuh"
#include "formats/cuda/record_readers.cuh"

namespace dsv41kv::detail::cuda {
namespace {

constexpr int kWarps = 4;

// SPEC 9.6: one warp per (token, real head); the NoPE lanes copy their bits, the RoPE lanes rotate
// back with num::rope_inverse (formats/rope_bf16.hpp's inverse on the host) and round to bf16. Each
// lane reads its dims before writing them (in place allowed). A row whose position has no table row
// is not written.
struct OutRope {
  const uint16_t* o = nullptr;
  int64_t o_tok = 0, o_head = 0;
  uint16_t* out = nullptr;
  int64_t out_tok = 0, out_head = 0;
  const int64_t* pos = nullptr;
  const float* table = nullptr;
  int64_t table_rows = 0, T = 0;
  int H_real = 0;
};

__global__ void __launch_bounds__(32 * kWarps) output_rope_kernel(const OutRope p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= p.T * p.H_real) return;
  const int64_t t = w / p.H_real;
  const int h = static_cast<int>(w % p.H_real);
  const int64_t pos = p.pos[t];
  if (pos < 0 || pos >= p.table_rows) return;
  const int d0 = 16 * lane;
  float x[16];
  uint16_t o[16];
  load_bf16<16>(p.o + t * p.o_tok + h * p.o_head + d0, x, o);
  if (d0 >= kNopeDim) {
    float c[8], s[8];
    rope_load<16>(d0, p.table + pos * kRopeDim, c, s);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float y0, y1;
      num::rope_inverse(x[2 * i], x[2 * i + 1], c[i], s[i], y0, y1);
      o[2 * i] = num::bf16_encode(y0);
      o[2 * i + 1] = num::bf16_encode(y1);
    }
  }
  uint32_t wv[8];
  pack_bf16<16>(o, wv);
  store_words<8>(reinterpret_cast<uint8_t*>(p.out + t * p.out_tok + h * p.out_head + d0), wv);
}

// SPEC 9.5 step 1: one warp per workspace row of the chunk: row bi * M_ch + k holds compressed
// entry k < N_b of request b, row bi * M_ch + N_ch + k the SWA token at gather_start_b + k, k < G_b;
// every other row is left untouched. A page id outside the cache is not read (the host refuses
// it for host views).
struct Gather {
  int ratio = 0;
  int64_t req_begin = 0, nr = 0, n_ch = 0, m_ch = 0;
  const int32_t *seq = nullptr, *gl = nullptr, *gs = nullptr;
  const int32_t* swa_bt = nullptr;
  int64_t swa_bt_stride = 0;
  const int32_t* cmp_bt = nullptr;
  int64_t cmp_bt_stride = 0;
  mla::CacheList swa, cmp;  // the caches (idx, len unused)
  int64_t swa_pages = 0, cmp_pages = 0;
  uint16_t* ws = nullptr;
  int64_t ws_stride = 0;
};

template <int FS, int FC>
__global__ void __launch_bounds__(32 * kWarps) gather_kernel(const Gather p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= p.nr * p.m_ch) return;
  const int64_t bi = w / p.m_ch, k = w % p.m_ch, b = p.req_begin + bi;
  const int64_t N = p.ratio > 0 ? closed_groups(int64_t{p.seq[b]}, int64_t{p.ratio}) : 0;
  const bool cmp = k < p.n_ch;
  const int64_t e = cmp ? k : k - p.n_ch;  // the compressed entry, or the k-th gathered SWA token
  if (cmp ? e >= N : e >= p.gl[b]) return;
  const mla::CacheList& c = cmp ? p.cmp : p.swa;
  const int64_t x = cmp ? e : p.gs[b] + e;
  const int32_t page = cmp ? p.cmp_bt[b * p.cmp_bt_stride + x / c.S] : p.swa_bt[b * p.swa_bt_stride + x / c.S];
  if (page < 0 || page >= (cmp ? p.cmp_pages : p.swa_pages)) return;
  uint16_t o[16];
  if (cmp)
    read_record_dims<FC, 16>(c.base + page * c.page_stride, c.S, x % c.S, c.row_stride, c.fp8_scale, 16 * lane, o);
  else
    read_record_dims<FS, 16>(c.base + page * c.page_stride, c.S, x % c.S, c.row_stride, c.fp8_scale, 16 * lane, o);
  uint32_t wv[8];
  pack_bf16<16>(o, wv);
  store_words<8>(reinterpret_cast<uint8_t*>(p.ws + (bi * p.m_ch + k) * p.ws_stride + 16 * lane), wv);
}

// SPEC 9.5 step 2: one warp per query token, its 640 entries lane-strided.
struct Index {
  int ratio = 0;
  int64_t req_begin = 0, n_ch = 0, m_ch = 0, T = 0;
  const int64_t* pos = nullptr;
  const int32_t *t2r = nullptr, *gs = nullptr;
  const int32_t* topk = nullptr;
  int64_t topk_stride = 0;
  int32_t* idx = nullptr;
  int64_t idx_stride = 0;
  int32_t* len = nullptr;
};

__global__ void __launch_bounds__(32 * kWarps) index_kernel(const Index p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= p.T) return;
  const int64_t bi = p.t2r[t] - p.req_begin, g0 = p.gs[p.t2r[t]], pt = p.pos[t], base = p.m_ch * bi;
  const int64_t nc = p.ratio > 0 ? closed_groups(pt + 1, int64_t{p.ratio}) : 0;
  const int64_t topk_len = nc < kIndexTopk ? nc : kIndexTopk;
  const int64_t ws0 = swa_window_start(pt), swa_start = ws0 > g0 ? ws0 : g0, swa_len = pt - swa_start + 1;
  int32_t* row = p.idx + t * p.idx_stride;
  for (int64_t j = lane; j < kPrefillIndexWidth; j += 32) {
    int32_t v = -1;
    if (j < topk_len) {
      const int32_t i = p.topk[t * p.topk_stride + j];
      if (i >= 0 && i < p.n_ch) v = static_cast<int32_t>(base + i);
    } else if (j < topk_len + swa_len) {
      v = static_cast<int32_t>(base + p.n_ch + (swa_start - g0) + (j - topk_len));
    }
    row[j] = v;
  }
  if (lane == 0) p.len[t] = static_cast<int32_t>(topk_len + swa_len);
}

// q, out: 16-byte rows (the warp's vector loads and stores).
void need_vector_rows(const char* op, const TensorView& v, const char* arg) {
  if (v.stride[0] % 8 != 0 || (v.ndim > 2 && v.stride[1] % 8 != 0))
    bad_arg(op, arg, "strides [" + std::to_string(v.stride[0]) + (v.ndim > 2 ? ", " + std::to_string(v.stride[1]) : "") +
                         ", 1], expected multiples of 8 elements on cuda (16-byte rows)");
  require_aligned16(v.data, op, arg);
}

mla::Heads heads_of(const char* op, const TensorView& q, const TensorView& out, const TensorView& lse,
                    const TensorView& sink, float scale, const HeadsPlan& h) {
  need_vector_rows(op, q, "q");
  need_vector_rows(op, out, "out");
  mla::Heads p;
  p.q = q.ptr<const uint16_t>();
  p.q_tok = h.q_tok;
  p.q_head = h.q_head;
  p.out = out.ptr<uint16_t>();
  p.out_tok = h.out_tok;
  p.out_head = h.out_head;
  p.lse = lse.ptr<float>();
  p.lse_tok = h.lse_tok;
  p.sink = sink.ptr<const float>();
  p.scale = scale;
  p.T = h.T;
  p.H = h.H;
  return p;
}

mla::CacheList list_of(const CacheView& c, const TensorView& idx, const TensorView& len, int width) {
  const RecordInfo& ri = record_info(c.format);
  const int64_t es = static_cast<int64_t>(dtype_size(ri.element));
  mla::CacheList l;
  l.base = static_cast<const uint8_t*>(c.base);
  l.S = c.states_per_page;
  l.page_stride = c.page_stride * es;
  l.row_stride = c.row_stride * es;
  l.capacity = c.num_pages * c.states_per_page;
  l.fp8_scale = c.fp8_scale;
  l.format = static_cast<int>(c.format);
  l.aligned = record_chunks_aligned(l.format, c.base, l.page_stride, l.row_stride);
  l.idx = idx.ptr<const int32_t>();
  l.idx_stride = idx.ndim > 0 ? idx.stride[0] : 0;
  l.len = len.ptr<const int32_t>();
  l.width = width;
  return l;
}

unsigned grid_of(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

// Launches the mainloop for head tile HT over `src` (T * head_groups * splits CTAs; its
// instantiation in instantiations/), then the merge when split. The dynamic shared memory is opted
// into on every call (a host-side attribute of the current device, not a stream operation:
// allowed while capturing a graph).
template <int HT, class Src>
void launch_mla(mla::Heads h, const Src& src, const ExecContext& ctx) {
  h.head_groups = (h.H + HT - 1) / HT;
  const int64_t ctas = h.T * h.head_groups * h.splits;
  if (ctas > std::numeric_limits<int32_t>::max())
    bad_arg("sparse_mla", "q", std::to_string(ctas) + " CTAs, expected at most 2^31 - 1");
  const cudaStream_t st = as_stream(ctx.stream);
  mla::launch_sparse_mla<HT, Src>(h, src, st, ctx.programmatic_launch);
  if (h.splits > 1)
    launch_kernel(&mla::merge_kernel, dim3(grid_of(h.T * h.H)), dim3(32 * kWarps), st, ctx.programmatic_launch, h);
}

template <class Src>
void launch_mla_tile(int head_tile, const mla::Heads& h, const Src& src, const ExecContext& ctx) {
  if (head_tile == 16) launch_mla<16>(h, src, ctx);
  else if (head_tile == 32) launch_mla<32>(h, src, ctx);
  else launch_mla<64>(h, src, ctx);
}

// The head tile of a prefill call (no schedule): 16 rows for 8 or 16 heads, 32 for 32, else 64.
int prefill_head_tile(int H) { return H <= 16 ? 16 : H == 32 ? 32 : 64; }

}  // namespace

void sparse_decode(const SparseDecodeArgs& a, const DecodePlan& p, const ExecContext& ctx) {
  const char* op = "sparse_decode";
  mla::Heads h = heads_of(op, a.q, a.out, a.lse, a.sink, a.softmax_scale, p.heads);
  const DecodeSchedule& s = *a.schedule;
  h.splits = static_cast<int>(p.splits);
  if (h.splits > 1) {
    require_aligned16(a.workspace.data, op, "workspace");
    h.ws_o = a.workspace.ptr<float>();
    h.ws_lse = h.ws_o + h.T * h.splits * h.H * int64_t{kLatentDim};
  }
  mla::CacheSource src;
  src.swa = list_of(a.swa_cache, a.swa_indices, a.swa_lens, kSwaWindow);
  src.with_cmp = p.with_cmp;
  if (p.with_cmp) src.cmp = list_of(a.cmp_cache, a.cmp_indices, a.cmp_lens, kIndexTopk);
  launch_mla_tile(s.head_tile, h, src, ctx);
}

void sparse_prefill(const SparsePrefillArgs& a, const PrefillPlan& p, const ExecContext& ctx) {
  const char* op = "sparse_prefill";
  const mla::Heads h = heads_of(op, a.q, a.out, a.lse, a.sink, a.softmax_scale, p.heads);
  if (p.kv_row_stride % 8 != 0)
    bad_arg(op, "kv", "row stride " + std::to_string(p.kv_row_stride) + ", expected a multiple of 8 elements on cuda");
  require_aligned16(a.kv.data, op, "kv");
  mla::WorkspaceSource ws;
  ws.kv = a.kv.ptr<const uint16_t>();
  ws.s_kv = p.s_kv;
  ws.kv_stride = p.kv_row_stride;
  ws.idx = a.indices.ptr<const int32_t>();
  ws.idx_stride = p.idx_row_stride;
  ws.len = a.topk_length.ptr<const int32_t>();
  ws.topk = p.topk;
  launch_mla_tile(prefill_head_tile(h.H), h, ws, ctx);
}

void attention_output_rope(const OutputRopeArgs& a, const OutputRopePlan& p, const ExecContext& ctx) {
  const char* op = "attention_output_rope";
  need_vector_rows(op, a.o, "o");
  need_vector_rows(op, a.out, "out");
  require_aligned16(a.rope_table.data, op, "rope_table");
  OutRope k;
  k.o = a.o.ptr<const uint16_t>();
  k.o_tok = p.o_tok;
  k.o_head = p.o_head;
  k.out = a.out.ptr<uint16_t>();
  k.out_tok = p.out_tok;
  k.out_head = p.out_head;
  k.pos = a.positions.ptr<const int64_t>();
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = p.table_rows;
  k.T = p.T;
  k.H_real = p.H_real;
  output_rope_kernel<<<grid_of(p.T * p.H_real), 32 * kWarps, 0, as_stream(ctx.stream)>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("output_rope_kernel");
}

void gather_prefill_workspace(const WorkspaceGatherArgs& a, const GatherPlan& p, const ExecContext& ctx) {
  const char* op = "gather_prefill_workspace";
  if (p.ws_row_stride % 8 != 0)
    bad_arg(op, "workspace", "row stride " + std::to_string(p.ws_row_stride) + ", expected a multiple of 8 on cuda");
  require_aligned16(a.workspace.data, op, "workspace");
  Gather g;
  g.ratio = a.ratio;
  g.req_begin = a.chunk.req_begin;
  g.nr = a.chunk.num_reqs();
  g.n_ch = a.chunk.n_ch;
  g.m_ch = a.chunk.m_ch;
  g.seq = a.seq_lens.ptr<const int32_t>();
  g.gl = a.gather_lens.ptr<const int32_t>();
  g.gs = a.gather_starts.ptr<const int32_t>();
  g.swa_bt = a.swa_block_table.ptr<const int32_t>();
  g.swa_bt_stride = p.swa_bt_stride;
  g.swa = list_of(a.swa_cache, TensorView{}, TensorView{}, 0);
  g.swa_pages = a.swa_cache.num_pages;
  RecordFormat fc = a.swa_cache.format;
  if (a.ratio > 0) {
    g.cmp_bt = a.cmp_block_table.ptr<const int32_t>();
    g.cmp_bt_stride = p.cmp_bt_stride;
    g.cmp = list_of(a.cmp_cache, TensorView{}, TensorView{}, 0);
    g.cmp_pages = a.cmp_cache.num_pages;
    fc = a.cmp_cache.format;
  }
  g.ws = a.workspace.ptr<uint16_t>();
  g.ws_stride = p.ws_row_stride;
  with_record_format(a.swa_cache.format, [&](auto FS) {
    with_record_format(fc, [&](auto FC) {
      gather_kernel<FS(), FC()><<<grid_of(g.nr * g.m_ch), 32 * kWarps, 0, as_stream(ctx.stream)>>>(g);
    });
  });
  DSV41KV_CUDA_CHECK_LAUNCH("gather_kernel");
}

void build_prefill_indices(const PrefillIndexArgs& a, const IndexPlan& p, const ExecContext& ctx) {
  Index k;
  k.ratio = a.ratio;
  k.req_begin = a.chunk.req_begin;
  k.n_ch = a.chunk.n_ch;
  k.m_ch = a.chunk.m_ch;
  k.T = p.T;
  k.pos = a.positions.ptr<const int64_t>();
  k.t2r = a.token_to_req.ptr<const int32_t>();
  k.gs = a.gather_starts.ptr<const int32_t>();
  if (a.ratio > 0) {
    k.topk = a.topk.ptr<const int32_t>();
    k.topk_stride = p.topk_row_stride;
  }
  k.idx = a.indices.ptr<int32_t>();
  k.idx_stride = p.idx_row_stride;
  k.len = a.lengths.ptr<int32_t>();
  index_kernel<<<grid_of(p.T), 32 * kWarps, 0, as_stream(ctx.stream)>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("index_kernel");
}

}  // namespace dsv41kv::detail::cuda
