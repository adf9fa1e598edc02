// Host-side validation of the attention ops (SPEC 0.4 item 3, 9.4-9.6) with the validation kit
// (core/validate.hpp): E8 with a message "<op>: <argument>: <what was found>, expected <what is
// required>". View checks hold for device views too; the value checks read host index data.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <string>

#include "attention/backend.hpp"
#include "core/validate.hpp"

namespace dsv41kv::detail {
namespace {

// A [rows, H, 512] view of dtype dt with inner stride 1 and rows and heads that do not overlap.
// H < 0: any head count >= 1 (returned through the shape).
void need_heads_view(const char* op, const TensorView& v, const char* arg, DType dt, int64_t min_rows, int64_t H,
                     const char* what) {
  need_present(op, v, arg, what);
  need_dtype(op, v, arg, dt);
  need_ndim(op, v, arg, 3);
  if (v.shape[2] != kLatentDim)
    bad_arg(op, arg, fmt::format("shape[2] = {}, expected 512 (head_dim; {})", v.shape[2], v.describe()));
  if (H >= 0 && v.shape[1] != H)
    bad_arg(op, arg, fmt::format("{} heads (shape[1]), expected {} ({})", v.shape[1], H, v.describe()));
  if (v.shape[1] < 1) bad_arg(op, arg, fmt::format("{} heads (shape[1]), expected >= 1 ({})", v.shape[1], v.describe()));
  if (v.shape[0] < min_rows)
    bad_arg(op, arg, fmt::format("{} rows, expected at least {} ({})", v.shape[0], min_rows, v.describe()));
  if (v.stride[2] != 1) bad_arg(op, arg, fmt::format("inner stride {}, expected 1 ({})", v.stride[2], v.describe()));
  if (v.shape[1] > 1 && v.stride[1] < kLatentDim)
    bad_arg(op, arg,
            fmt::format("head stride {}, expected >= 512 (heads must not overlap; {})", v.stride[1], v.describe()));
  const int64_t head_span = (v.shape[1] - 1) * v.stride[1] + kLatentDim;
  if (v.shape[0] > 1 && v.stride[0] < head_span)
    bad_arg(op, arg,
            fmt::format("row stride {}, expected >= {} (rows must not overlap; {})", v.stride[0], head_span,
                        v.describe()));
  need_data(op, v, arg);
}

// An f32 [rows >= min_rows, H] view, heads contiguous, rows not overlapping.
void need_lse_view(const char* op, const TensorView& v, const char* arg, int64_t min_rows, int64_t H) {
  need_rows(op, v, arg, DType::F32, H, min_rows, "f32 [rows >= T, H] lse");
  if (v.shape[0] > 1 && v.stride[0] < H)
    bad_arg(op, arg, fmt::format("row stride {}, expected >= {} (rows must not overlap; {})", v.stride[0], H,
                                 v.describe()));
}

// An i32 [rows >= min_rows, width] index view (width > 0 given, or any >= 1 when width < 0), rows
// not overlapping; returns the width.
int64_t need_index_rows(const char* op, const TensorView& v, const char* arg, int64_t min_rows, int64_t width,
                        const char* what) {
  need_matrix(op, v, arg, DType::I32, what);
  if (width >= 0 && v.shape[1] != width)
    bad_arg(op, arg, fmt::format("shape[1] = {}, expected {} ({}; {})", v.shape[1], width, what, v.describe()));
  if (v.shape[1] < 1) bad_arg(op, arg, fmt::format("shape[1] = {}, expected >= 1 ({}; {})", v.shape[1], what, v.describe()));
  if (v.shape[0] < min_rows)
    bad_arg(op, arg, fmt::format("{} rows, expected at least {} ({}; {})", v.shape[0], min_rows, what, v.describe()));
  return v.shape[1];
}

// The heads plan of q, out and lse; the head count of q must be one of kAttentionHeadCounts, and
// sink f32 [H].
HeadsPlan plan_heads(const char* op, const TensorView& q, const TensorView& out, const TensorView& lse,
                     const TensorView& sink, float scale) {
  HeadsPlan h;
  need_heads_view(op, q, "q", DType::BF16, 0, -1, "bf16 [T, H, 512] queries");
  if (!attention_head_count_ok(q.shape[1]))
    bad_arg(op, "q",
            fmt::format("{} heads, expected one of {} ({})", q.shape[1], attention_head_counts(), q.describe()));
  h.T = q.shape[0];
  h.H = static_cast<int>(q.shape[1]);
  h.q_tok = q.stride[0];
  h.q_head = q.stride[1];
  need_heads_view(op, out, "out", DType::BF16, h.T, h.H, "bf16 [rows >= T, H, 512] output");
  h.out_tok = out.stride[0];
  h.out_head = out.stride[1];
  need_lse_view(op, lse, "lse", h.T, h.H);
  h.lse_tok = lse.stride[0];
  const int64_t n = need_vector(op, sink, "sink", DType::F32, "f32 [H] attention sink", h.H);
  if (n != h.H) bad_arg(op, "sink", fmt::format("{} entries, expected H = {} ({})", n, h.H, sink.describe()));
  if (!(std::isfinite(scale) && scale > 0.0f))
    bad_arg(op, "softmax_scale", fmt::format("{}, expected a finite value > 0", scale));
  return h;
}

// Every present view on `dev`, like the view named `ref`.
void need_devices(const char* op, Device dev, const char* ref,
                  std::initializer_list<std::pair<const TensorView*, const char*>> views) {
  for (const auto& [v, arg] : views) need_device(op, *v, arg, dev, ref);
}

void need_cache_device(const char* op, const CacheView& c, const char* arg, Device dev, const char* ref) {
  if (c.device != dev)
    bad_arg(op, arg,
            fmt::format("on {}, expected {} like {} (all views of one call on one device)", device_name(c.device),
                        device_name(dev), ref));
}

// A valid SWA cache: any format but the compressed-only 288 record (SPEC 3.3, 3.4).
void need_swa_cache(const char* op, const CacheView& c) {
  const std::string arg = fmt::format("{}: swa_cache", op);
  validate_cache(c, arg.c_str());
  if (c.format == RecordFormat::NVFP4_288)
    bad_arg(op, "swa_cache",
            "format nvfp4_288 is a compressed-cache record only (SPEC 3.3), expected v4_584, mxfp8_528, bf16 or fp8");
}

void check_sink(const char* op, const TensorView& sink, int H) {
  const auto* s = sink.ptr<const float>();
  for (int h = 0; h < H; ++h)
    if (std::isnan(s[h])) bad_arg(op, "sink", fmt::format("sink[{}] is NaN, expected a number (+-inf allowed)", h));
}

// Lengths in 0 .. width for rows [0, T); entries of a row before its length below `capacity`
// (negative entries are masked) when capacity >= 0.
void check_rows(const char* op, const char* idx_arg, const char* len_arg, const TensorView& idx, int64_t row_stride,
                const TensorView& lens, int64_t T, int64_t width, int64_t capacity, const std::string& cap_text) {
  const auto* ix = idx.ptr<const int32_t>();
  const auto* ln = lens.ptr<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (ln[t] < 0 || ln[t] > width)
      bad_arg(op, len_arg,
              fmt::format("{}[{}] = {}, expected 0 .. {} (the width of {})", len_arg, t, ln[t], width, idx_arg));
    if (capacity < 0) continue;
    for (int64_t j = 0; j < ln[t]; ++j) {
      const int32_t s = ix[t * row_stride + j];
      if (s >= capacity)
        bad_arg(op, idx_arg,
                fmt::format("{}[{}][{}] = {}, expected < {} = {} (a slot of the cache, or < 0 to mask)", idx_arg, t, j,
                            s, cap_text, capacity));
    }
  }
}

int64_t need_ratio012(const char* op, int ratio) {
  if (ratio < 0 || ratio > 2) bad_arg(op, "ratio", fmt::format("{}, expected 0, 1 or 2 (the layer's compress ratio)", ratio));
  return ratio;
}

// The chunk's request range inside R requests and its constants.
void need_chunk(const char* op, const PrefillChunk& c, int64_t R, int ratio) {
  if (c.req_begin < 0 || c.req_end < c.req_begin || c.req_end > R)
    bad_arg(op, "chunk",
            fmt::format("requests [{}, {}), expected 0 <= req_begin <= req_end <= {} (the requests of seq_lens)",
                        c.req_begin, c.req_end, R));
  if (c.n_ch < 0 || c.m_ch < c.n_ch || (ratio == 0 && c.n_ch != 0))
    bad_arg(op, "chunk",
            fmt::format("N_ch = {}, M_ch = {}, expected 0 <= N_ch <= M_ch (N_ch = 0 for ratio 0)", c.n_ch, c.m_ch));
  // workspace rows are addressed by i32 index rows
  if (c.num_reqs() > 0 && c.m_ch > std::numeric_limits<int32_t>::max() / c.num_reqs())
    bad_arg(op, "chunk",
            fmt::format("{} requests of M_ch = {} workspace rows, expected fewer than 2^31 rows (i32 indices)",
                        c.num_reqs(), c.m_ch));
}

const int32_t* i32(const TensorView& v) { return v.ptr<const int32_t>(); }

}  // namespace

// ---------------------------------------------------------------- sparse_decode

DecodePlan plan_sparse_decode(const SparseDecodeArgs& a) {
  const char* op = "sparse_decode";
  DecodePlan p;
  p.heads = plan_heads(op, a.q, a.out, a.lse, a.sink, a.softmax_scale);
  const int64_t T = p.heads.T;
  p.device = a.q.device;
  if (a.s_q < 1 || a.s_q > kMaxDecodeQueriesPerRequest)
    bad_arg(op, "s_q", fmt::format("{}, expected 1 .. {} query tokens per request", a.s_q, kMaxDecodeQueriesPerRequest));
  if (T % a.s_q != 0)
    bad_arg(op, "s_q", fmt::format("{} does not divide T = {} (expected [requests * s_q] query rows)", a.s_q, T));
  if (a.schedule == nullptr)
    bad_arg(op, "schedule", "absent, expected the DecodeSchedule of this step and layer type (plan_decode_schedule)");
  const DecodeSchedule& s = *a.schedule;
  if (s.num_tokens != T || s.num_heads != p.heads.H || s.s_q != a.s_q)
    bad_arg(op, "schedule",
            fmt::format("planned for T = {}, H = {}, s_q = {}, expected T = {}, H = {}, s_q = {} (q and s_q)",
                        s.num_tokens, s.num_heads, s.s_q, T, p.heads.H, a.s_q));
  p.with_cmp = s.layer != LayerType::kSwaOnly;
  const int64_t width = kSwaWindow + (p.with_cmp ? kIndexTopk : 0);
  const int64_t blocks = (width + kDecodeKeyBlock - 1) / kDecodeKeyBlock;
  if (static_cast<int>(s.layer) > 2 || s.key_width != width || s.key_blocks != blocks || s.splits < 1 ||
      s.splits > s.key_blocks)
    bad_arg(op, "schedule",
            fmt::format("layer {}, key width {}, {} key blocks, {} splits, expected a {} schedule of key width {}, "
                        "{} key blocks and 1 .. {} splits",
                        static_cast<int>(s.layer), s.key_width, s.key_blocks, s.splits,
                        static_cast<int>(s.layer) > 2 ? "valid" : layer_type_name(s.layer), width, blocks, blocks));
  p.splits = s.splits;
  p.key_blocks = s.key_blocks;
  if (p.device == Device::CUDA) {
    if (s.device != Device::CUDA)
      bad_arg(op, "schedule",
              fmt::format("planned for {}, expected a schedule planned for cuda (DecodeScheduleArgs::device) for "
                          "device views",
                          device_name(s.device)));
    if (!cuda_head_tile_ok(p.heads.H, s.head_tile))
      bad_arg(op, "schedule",
              fmt::format("head_tile = {}, expected 16, 32 or 64 dividing H = {} (16 for H = 8)", s.head_tile,
                          p.heads.H));
    const int64_t need = sparse_decode_workspace_floats(s);
    if (need > 0) {
      const int64_t n = need_vector(op, a.workspace, "workspace", DType::F32,
                                    "f32 split-K workspace of sparse_decode_workspace_floats(schedule) elements");
      if (n < need)
        bad_arg(op, "workspace",
                fmt::format("{} elements, expected >= {} (sparse_decode_workspace_floats: T {} x splits {} x H {} x "
                            "513)",
                            n, need, T, s.splits, p.heads.H));
      need_device(op, a.workspace, "workspace", p.device, "q");
    }
  }

  need_swa_cache(op, a.swa_cache);
  p.swa_capacity = a.swa_cache.num_pages * a.swa_cache.states_per_page;
  need_index_rows(op, a.swa_indices, "swa_indices", T, kSwaWindow, "i32 [rows >= T, 128] SWA slots");
  p.swa_row_stride = a.swa_indices.stride[0];
  need_vector(op, a.swa_lens, "swa_lens", DType::I32, "i32 [>= T] SWA lengths", T);
  if (p.with_cmp) {
    const std::string arg = fmt::format("{}: cmp_cache", op);
    validate_cache(a.cmp_cache, arg.c_str());
    if (a.cmp_cache.states_per_page != s.cmp_states_per_page)
      bad_arg(op, "cmp_cache",
              fmt::format("states_per_page = {}, expected {} (the {} schedule's block size / ratio)",
                          a.cmp_cache.states_per_page, s.cmp_states_per_page, layer_type_name(s.layer)));
    p.cmp_capacity = a.cmp_cache.num_pages * a.cmp_cache.states_per_page;
    need_index_rows(op, a.cmp_indices, "cmp_indices", T, kIndexTopk, "i32 [rows >= T, 512] compressed slots");
    p.cmp_row_stride = a.cmp_indices.stride[0];
    need_vector(op, a.cmp_lens, "cmp_lens", DType::I32, "i32 [>= T] compressed lengths", T);
  } else if (a.cmp_indices.present() || a.cmp_lens.present()) {
    bad_arg(op, a.cmp_indices.present() ? "cmp_indices" : "cmp_lens",
            "present, expected absent for a swaonly schedule (no compressed cache)");
  }

  need_devices(op, p.device, "q",
               {{&a.out, "out"}, {&a.lse, "lse"}, {&a.sink, "sink"}, {&a.swa_indices, "swa_indices"},
                {&a.swa_lens, "swa_lens"}, {&a.cmp_indices, "cmp_indices"}, {&a.cmp_lens, "cmp_lens"}});
  need_cache_device(op, a.swa_cache, "swa_cache", p.device, "q");
  if (p.with_cmp) need_cache_device(op, a.cmp_cache, "cmp_cache", p.device, "q");
  return p;
}

void check_sparse_decode_values(const SparseDecodeArgs& a, const DecodePlan& p) {
  const char* op = "sparse_decode";
  check_sink(op, a.sink, p.heads.H);
  check_rows(op, "swa_indices", "swa_lens", a.swa_indices, p.swa_row_stride, a.swa_lens, p.heads.T, kSwaWindow,
             p.swa_capacity,
             fmt::format("swa_cache num_pages * states_per_page = {} * {}", a.swa_cache.num_pages,
                         a.swa_cache.states_per_page));
  if (p.with_cmp)
    check_rows(op, "cmp_indices", "cmp_lens", a.cmp_indices, p.cmp_row_stride, a.cmp_lens, p.heads.T, kIndexTopk,
               p.cmp_capacity,
               fmt::format("cmp_cache num_pages * states_per_page = {} * {}", a.cmp_cache.num_pages,
                           a.cmp_cache.states_per_page));
}

// ---------------------------------------------------------------- sparse_prefill

PrefillPlan plan_sparse_prefill(const SparsePrefillArgs& a) {
  const char* op = "sparse_prefill";
  PrefillPlan p;
  p.heads = plan_heads(op, a.q, a.out, a.lse, a.sink, a.softmax_scale);
  p.device = a.q.device;
  need_rows(op, a.kv, "kv", DType::BF16, kLatentDim, 0, "bf16 [s_kv, 512] workspace");
  if (a.kv.shape[0] > 1 && a.kv.stride[0] < kLatentDim)
    bad_arg(op, "kv", fmt::format("row stride {}, expected >= 512 ({})", a.kv.stride[0], a.kv.describe()));
  p.s_kv = a.kv.shape[0];
  p.kv_row_stride = a.kv.stride[0];
  p.topk = need_index_rows(op, a.indices, "indices", p.heads.T, -1, "i32 [rows >= T, topk] workspace rows");
  p.idx_row_stride = a.indices.stride[0];
  need_vector(op, a.topk_length, "topk_length", DType::I32, "i32 [>= T] index lengths", p.heads.T);
  need_devices(op, p.device, "q",
               {{&a.out, "out"}, {&a.lse, "lse"}, {&a.sink, "sink"}, {&a.kv, "kv"}, {&a.indices, "indices"},
                {&a.topk_length, "topk_length"}});
  return p;
}

void check_sparse_prefill_values(const SparsePrefillArgs& a, const PrefillPlan& p) {
  const char* op = "sparse_prefill";
  check_sink(op, a.sink, p.heads.H);
  // entries < 0 or >= s_kv are masked, not errors (SPEC 9.5 step 3)
  check_rows(op, "indices", "topk_length", a.indices, p.idx_row_stride, a.topk_length, p.heads.T, p.topk, -1, "");
}

// ---------------------------------------------------------------- gather_prefill_workspace

GatherPlan plan_prefill_gather(const WorkspaceGatherArgs& a) {
  const char* op = "gather_prefill_workspace";
  GatherPlan p;
  need_ratio012(op, a.ratio);
  p.R = need_vector(op, a.seq_lens, "seq_lens", DType::I32, "i32 [R] sequence lengths");
  p.device = a.seq_lens.device;
  for (const auto* v : {&a.gather_lens, &a.gather_starts}) {
    const char* arg = v == &a.gather_lens ? "gather_lens" : "gather_starts";
    const int64_t n = need_vector(op, *v, arg, DType::I32, "i32 [R], one per request", p.R);
    if (n != p.R) bad_arg(op, arg, fmt::format("{} entries, expected R = {} (seq_lens)", n, p.R));
  }
  need_chunk(op, a.chunk, p.R, a.ratio);
  need_swa_cache(op, a.swa_cache);
  need_block_table(op, a.swa_block_table, "swa_block_table", "i32 [R, pages] SWA block table");
  if (a.swa_block_table.shape[0] < p.R)
    bad_arg(op, "swa_block_table", fmt::format("{} rows, expected at least R = {}", a.swa_block_table.shape[0], p.R));
  p.swa_bt_stride = a.swa_block_table.stride[0];
  p.swa_bt_cols = a.swa_block_table.shape[1];
  if (a.ratio > 0) {
    const std::string arg = fmt::format("{}: cmp_cache", op);
    validate_cache(a.cmp_cache, arg.c_str());
    need_block_table(op, a.cmp_block_table, "cmp_block_table", "i32 [R, pages] compressed block table");
    if (a.cmp_block_table.shape[0] < p.R)
      bad_arg(op, "cmp_block_table", fmt::format("{} rows, expected at least R = {}", a.cmp_block_table.shape[0], p.R));
    p.cmp_bt_stride = a.cmp_block_table.stride[0];
    p.cmp_bt_cols = a.cmp_block_table.shape[1];
  } else if (a.cmp_block_table.present()) {
    bad_arg(op, "cmp_block_table", "present, expected absent for ratio 0 (no compressed cache)");
  }
  const int64_t rows = a.chunk.num_reqs() * a.chunk.m_ch;
  need_rows(op, a.workspace, "workspace", DType::BF16, kLatentDim, rows, "bf16 [rows >= chunk requests * M_ch, 512]");
  if (a.workspace.shape[0] > 1 && a.workspace.stride[0] < kLatentDim)
    bad_arg(op, "workspace",
            fmt::format("row stride {}, expected >= 512 ({})", a.workspace.stride[0], a.workspace.describe()));
  p.ws_row_stride = a.workspace.stride[0];
  need_devices(op, p.device, "seq_lens",
               {{&a.gather_lens, "gather_lens"}, {&a.gather_starts, "gather_starts"},
                {&a.swa_block_table, "swa_block_table"}, {&a.cmp_block_table, "cmp_block_table"},
                {&a.workspace, "workspace"}});
  need_cache_device(op, a.swa_cache, "swa_cache", p.device, "seq_lens");
  if (a.ratio > 0) need_cache_device(op, a.cmp_cache, "cmp_cache", p.device, "seq_lens");
  return p;
}

namespace {
// The states [first, first + count) of request b's cache through its block table row: every
// column inside the table and every page id in [0, num_pages).
void check_table_reads(const char* op, const char* arg, const TensorView& bt, int64_t stride, int64_t cols,
                       const CacheView& c, int64_t b, int64_t first, int64_t count, const char* what) {
  if (count <= 0) return;
  const int64_t S = c.states_per_page;
  for (int64_t col = first / S; col <= (first + count - 1) / S; ++col) {
    if (col >= cols)
      bad_arg(op, arg,
              fmt::format("request {} needs column {} for its {}s {} .. {}, expected < {} (the table's width)", b, col,
                          what, first, first + count - 1, cols));
    const int32_t page = i32(bt)[b * stride + col];
    if (page < 0 || page >= c.num_pages)
      bad_arg(op, arg,
              fmt::format("{}[{}][{}] = {} for the {}s of request {}, expected a page id in [0, {}) (the cache's "
                          "pages)",
                          arg, b, col, page, what, b, c.num_pages));
  }
}
}  // namespace

void check_prefill_gather_values(const WorkspaceGatherArgs& a, const GatherPlan& p) {
  const char* op = "gather_prefill_workspace";
  const PrefillChunk& c = a.chunk;
  for (int64_t b = c.req_begin; b < c.req_end; ++b) {
    const int64_t seq = i32(a.seq_lens)[b], G = i32(a.gather_lens)[b], g0 = i32(a.gather_starts)[b];
    if (seq < 1) bad_arg(op, "seq_lens", fmt::format("seq_lens[{}] = {}, expected >= 1", b, seq));
    const int64_t N = a.ratio > 0 ? closed_groups(seq, a.ratio) : 0;
    if (N > c.n_ch)
      bad_arg(op, "chunk",
              fmt::format("N_ch = {}, expected >= N_b = seq_lens[{}] / {} = {} of every chunk request", c.n_ch, b,
                          a.ratio, N));
    if (G < 0 || G > c.m_ch - c.n_ch)
      bad_arg(op, "gather_lens",
              fmt::format("gather_lens[{}] = {}, expected 0 .. M_ch - N_ch = {}", b, G, c.m_ch - c.n_ch));
    if (g0 < 0 || g0 + G > seq)
      bad_arg(op, "gather_starts",
              fmt::format("gather_starts[{}] = {} with gather_lens {}, expected 0 <= gather_start and gather_start + "
                          "gather_len <= seq_lens[{}] = {}",
                          b, g0, G, b, seq));
    check_table_reads(op, "swa_block_table", a.swa_block_table, p.swa_bt_stride, p.swa_bt_cols, a.swa_cache, b, g0, G,
                      "position");
    if (a.ratio > 0)
      check_table_reads(op, "cmp_block_table", a.cmp_block_table, p.cmp_bt_stride, p.cmp_bt_cols, a.cmp_cache, b, 0, N,
                        "compressed entry");
  }
}

// ---------------------------------------------------------------- build_prefill_indices

IndexPlan plan_prefill_indices(const PrefillIndexArgs& a) {
  const char* op = "build_prefill_indices";
  IndexPlan p;
  need_ratio012(op, a.ratio);
  p.T = need_vector(op, a.positions, "positions", DType::I64, "i64 [T] query positions");
  p.device = a.positions.device;
  need_vector(op, a.token_to_req, "token_to_req", DType::I32, "i32 [>= T] request of each token", p.T);
  p.R = need_vector(op, a.gather_lens, "gather_lens", DType::I32, "i32 [R] gather lengths");
  const int64_t ns = need_vector(op, a.gather_starts, "gather_starts", DType::I32, "i32 [R] gather starts", p.R);
  if (ns != p.R) bad_arg(op, "gather_starts", fmt::format("{} entries, expected R = {} (gather_lens)", ns, p.R));
  need_chunk(op, a.chunk, p.R, a.ratio);
  if (a.ratio > 0) {
    need_index_rows(op, a.topk, "topk", p.T, kIndexTopk, "i32 [rows >= T, 512] top-k compressed entries");
    p.topk_row_stride = a.topk.stride[0];
  } else if (a.topk.present()) {
    bad_arg(op, "topk", "present, expected absent for ratio 0 (no compressed cache)");
  }
  need_index_rows(op, a.indices, "indices", p.T, kPrefillIndexWidth, "i32 [rows >= T, 640] combined index rows");
  p.idx_row_stride = a.indices.stride[0];
  need_vector(op, a.lengths, "lengths", DType::I32, "i32 [>= T] index lengths", p.T);
  need_devices(op, p.device, "positions",
               {{&a.token_to_req, "token_to_req"}, {&a.gather_lens, "gather_lens"},
                {&a.gather_starts, "gather_starts"}, {&a.topk, "topk"}, {&a.indices, "indices"},
                {&a.lengths, "lengths"}});
  return p;
}

void check_prefill_index_values(const PrefillIndexArgs& a, const IndexPlan& p) {
  const char* op = "build_prefill_indices";
  const PrefillChunk& c = a.chunk;
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.T; ++t) {
    const int64_t b = i32(a.token_to_req)[t];
    if (b < c.req_begin || b >= c.req_end)
      bad_arg(op, "token_to_req",
              fmt::format("token_to_req[{}] = {}, expected a request of the chunk [{}, {})", t, b, c.req_begin,
                          c.req_end));
    const int64_t G = i32(a.gather_lens)[b], g0 = i32(a.gather_starts)[b];
    if (G < 0 || G > c.m_ch - c.n_ch)
      bad_arg(op, "gather_lens",
              fmt::format("gather_lens[{}] = {}, expected 0 .. M_ch - N_ch = {}", b, G, c.m_ch - c.n_ch));
    if (pos[t] < g0 || pos[t] >= g0 + G)
      bad_arg(op, "positions",
              fmt::format("positions[{}] = {} of request {}, expected inside its gathered tokens [{}, {}) "
                          "(gather_starts, gather_lens)",
                          t, pos[t], b, g0, g0 + G));
  }
}

// ---------------------------------------------------------------- attention_output_rope

OutputRopePlan plan_output_rope(const OutputRopeArgs& a) {
  const char* op = "attention_output_rope";
  OutputRopePlan p;
  need_heads_view(op, a.o, "o", DType::BF16, 0, -1, "bf16 [T, H, 512] attention output");
  p.T = a.o.shape[0];
  p.H = static_cast<int>(a.o.shape[1]);
  p.device = a.o.device;
  p.o_tok = a.o.stride[0];
  p.o_head = a.o.stride[1];
  if (a.num_real_heads < 1 || a.num_real_heads > p.H)
    bad_arg(op, "num_real_heads", fmt::format("{}, expected 1 .. H = {} (the heads of o)", a.num_real_heads, p.H));
  p.H_real = a.num_real_heads;
  need_heads_view(op, a.out, "out", DType::BF16, p.T, p.H_real, "bf16 [rows >= T, num_real_heads, 512]");
  p.out_tok = a.out.stride[0];
  p.out_head = a.out.stride[1];
  if (a.out.data == a.o.data && (p.out_tok != p.o_tok || (p.H_real > 1 && p.out_head != p.o_head)))
    bad_arg(op, "out",
            fmt::format("shares its data with o but has strides [{}, {}] instead of o's [{}, {}], expected the same "
                        "layout (in place) or separate memory",
                        p.out_tok, p.out_head, p.o_tok, p.o_head));
  need_vector(op, a.positions, "positions", DType::I64, "i64 [>= T] positions", p.T);
  need_rows(op, a.rope_table, "rope_table", DType::F32, kRopeDim, 1, "f32 [table_rows >= 1, 64]");
  need_contiguous(op, a.rope_table, "rope_table");
  p.table_rows = a.rope_table.shape[0];
  need_devices(op, p.device, "o", {{&a.out, "out"}, {&a.positions, "positions"}, {&a.rope_table, "rope_table"}});
  return p;
}

void check_output_rope_values(const OutputRopeArgs& a, const OutputRopePlan& p) {
  const auto* pos = a.positions.ptr<const int64_t>();
  for (int64_t t = 0; t < p.T; ++t)
    if (pos[t] < 0 || pos[t] >= p.table_rows)
      bad_arg("attention_output_rope", "positions",
              fmt::format("positions[{}] = {}, expected a row of the RoPE table [0, {})", t, pos[t], p.table_rows));
}

}  // namespace dsv41kv::detail
