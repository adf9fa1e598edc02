// AttentionLayer and LayerShared (attention_layer.hpp): one layer's step of SPEC 9.8 through the
// public ops, on the layer's buffers.
#include "dsv41kv/attention_layer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/host_copy.hpp"
#include "core/validate.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/rng.hpp"
#include "formats/window.hpp"

#if defined(DSV41KV_WITH_CUDA)
#include "core/cuda/fill.hpp"
#endif

namespace dsv41kv::pipeline {

namespace {

constexpr const char* kCtor = "AttentionLayer";
constexpr const char* kRun = "AttentionLayer::run";
constexpr const char* kRunQueries = "AttentionLayer::run_queries";
constexpr const char* kRunWrites = "AttentionLayer::run_writes";
constexpr float kInf = std::numeric_limits<float>::infinity();

// A 3-D view [rows >= min_rows, d1, d2] of dtype dt with inner stride 1.
void need_3d(const char* op, const TensorView& v, const char* arg, DType dt, int64_t d1, int64_t d2,
             int64_t min_rows, const char* what, Device dev) {
  detail::need_present(op, v, arg, what);
  detail::need_dtype(op, v, arg, dt);
  if (v.ndim != 3 || v.shape[1] != d1 || v.shape[2] != d2 || v.shape[0] < min_rows || v.stride[2] != 1 ||
      v.stride[1] < d2 || v.stride[0] < d1 * v.stride[1])
    detail::bad_arg(op, arg,
                    fmt::format("{}-d view of shape [{}, {}, {}] and strides [{}, {}, {}], expected {} (N = {})", v.ndim,
                                v.shape[0], v.ndim > 1 ? v.shape[1] : 0, v.ndim > 2 ? v.shape[2] : 0, v.stride[0],
                                v.ndim > 1 ? v.stride[1] : 0, v.ndim > 2 ? v.stride[2] : 0, what, min_rows));
  detail::need_data(op, v, arg);
  detail::need_on(op, v, arg, dev);
}

void need_absent(const char* op, const TensorView& v, const char* arg, const char* why) {
  if (v.present()) detail::bad_arg(op, arg, fmt::format("present, expected absent: {}", why));
}

// The rows [r0, r0 + n) of a 2-D or 3-D view.
TensorView rows_of(const TensorView& v, int64_t r0, int64_t n) {
  TensorView s = v;
  s.data = static_cast<uint8_t*>(v.data) + r0 * v.stride[0] * static_cast<int64_t>(dtype_size(v.dtype));
  s.shape[0] = n;
  return s;
}

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

// ---------------------------------------------------------------- configuration and weights

void validate(const ReadPathConfig& c) {
  const char* op = "ReadPathConfig";
  if (std::find(std::begin(kAttentionHeadCounts), std::end(kAttentionHeadCounts), c.num_heads) ==
      std::end(kAttentionHeadCounts))
    detail::bad_arg(op, "num_heads", fmt::format("{}, expected 8, 16, 32, 64 or 128", c.num_heads));
  if (c.padded_heads != 0 && !((c.padded_heads == 64 || c.padded_heads == 128) && c.padded_heads > c.num_heads) &&
      c.padded_heads != c.num_heads)
    detail::bad_arg(op, "padded_heads",
                    fmt::format("{}, expected 0 (no padding), num_heads = {}, or 64 / 128 above it", c.padded_heads,
                                c.num_heads));
  if (!(std::isfinite(c.softmax_scale) && c.softmax_scale >= 0.0f))
    detail::bad_arg(op, "softmax_scale", fmt::format("{}, expected finite and > 0 (0: 512^-0.5)", c.softmax_scale));
  if (!(std::isfinite(c.eps) && c.eps >= 0.0f)) detail::bad_arg(op, "eps", fmt::format("{}, expected finite and >= 0", c.eps));
  if (c.max_model_len < 1) detail::bad_arg(op, "max_model_len", fmt::format("{}, expected >= 1", c.max_model_len));
  if (c.swa_format == RecordFormat::NVFP4_288)
    detail::bad_arg(op, "swa_format", "nvfp4_288, expected v4_584, mxfp8_528, plain bf16 or plain fp8 (SPEC 3.4)");
  if (c.index_k_format != IndexKFormat::FP8_132)
    detail::bad_arg(op, "index_k_format",
                    fmt::format("{}, expected fp8_132: the scores read FP8 keys (SPEC 8.3)", index_k_format_name(c.index_k_format)));
}

LayerWeights LayerWeights::from_seed(const LayerInfo& layer, int num_heads, uint64_t seed) {
  Rng rng(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer.index + 1)));
  LayerWeights w;
  w.attn_sink.resize(static_cast<size_t>(num_heads));
  for (float& s : w.attn_sink) s = static_cast<float>(rng.normal());
  if (layer.is_kv_source) {
    auto bf = [&](double x) { return num::bf16_encode(static_cast<float>(x)); };
    w.compressor_norm.resize(kLatentDim);
    for (auto& v : w.compressor_norm) v = bf(1.0 + 0.1 * rng.normal());
    w.wk.resize(static_cast<size_t>(kIndexHeadDim) * kLatentDim);
    const double sd = 1.0 / std::sqrt(static_cast<double>(kLatentDim));
    for (auto& v : w.wk) v = bf(sd * rng.normal());
    w.k_norm.resize(kIndexHeadDim);
    for (auto& v : w.k_norm) v = bf(1.0 + 0.1 * rng.normal());
  }
  return w;
}

LayerWeights LayerWeights::from_safetensors(const st::SafetensorsFile& f, const LayerInfo& layer, int num_heads) {
  const std::string p = fmt::format("layers.{}.attn.", layer.index);
  LayerWeights w;
  f.expect(p + "attn_sink", st::StDType::F32, {num_heads});
  w.attn_sink = f.copy_as<float>(p + "attn_sink");
  if (layer.is_kv_source) {
    f.expect(p + "compressor.norm.weight", st::StDType::BF16, {kLatentDim});
    w.compressor_norm = f.copy_as<uint16_t>(p + "compressor.norm.weight");
    f.expect(p + "indexer.wk.weight", st::StDType::BF16, {kIndexHeadDim, kLatentDim});
    w.wk = f.copy_as<uint16_t>(p + "indexer.wk.weight");
    f.expect(p + "indexer.k_norm.weight", st::StDType::BF16, {kIndexHeadDim});
    w.k_norm = f.copy_as<uint16_t>(p + "indexer.k_norm.weight");
  }
  return w;
}

// ---------------------------------------------------------------- shared buffers

struct LayerShared::Impl {
  int64_t max_tokens = 0;
  std::vector<const AttentionLayer*> layers;
  Device device = Device::CPU;
  Buffer topk, candidates, workspace;
  int64_t workspace_rows = 0;
  Buffer index_ws;   // CUDA: indexer_topk's workspace, sized for the widest served block table and any role
  Buffer decode_ws;  // CUDA: sparse_decode's split-K workspace, sized for the largest schedule of any step
  int topk_writer = -1, candidates_writer = -1;
  uint64_t topk_gen = 0, candidates_gen = 0;
  // one decode schedule per layer type and step (SPEC 6.7)
  DecodeSchedule schedule[3];
  uint64_t schedule_gen[3] = {0, 0, 0};
};

LayerShared::LayerShared(const ServingConfig& cfg, const ReadPathConfig& read, const ModelConfig& model) {
  validate(cfg);
  validate(read);
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.max_tokens = cfg.max_tokens;
  m.device = cfg.device;
  m.layers.assign(static_cast<size_t>(model.num_layers()), nullptr);
  const auto T = static_cast<size_t>(cfg.max_tokens);
  m.topk = Buffer(cfg.device, T * kIndexTopk * sizeof(int32_t));
  m.topk.fill(0xFF, 0, SIZE_MAX, cfg.exec);
  m.candidates = Buffer(cfg.device, T * kCandidateTopkBlocks * sizeof(int32_t));
  m.candidates.fill(0xFF, 0, SIZE_MAX, cfg.exec);
  for (int r = 0; r <= 2; ++r)
    if (r == 0 || model.has_ratio(r))
      m.workspace_rows = std::max(m.workspace_rows, prefill_workspace_rows(r, read.max_model_len, cfg.max_tokens));
  m.workspace = Buffer(cfg.device, static_cast<size_t>(m.workspace_rows) * kLatentDim * sizeof(uint16_t));
  if (cfg.device == Device::CUDA) {
    int64_t bytes = 0;
    for (int r = 1; r <= 2; ++r)
      if (cfg.serves(r))
        for (IndexerRole role : {IndexerRole::kPlain, IndexerRole::kCandidateSource, IndexerRole::kCandidateConsumer})
          bytes = std::max(bytes, indexer_topk_workspace_bytes(cfg.max_tokens, cfg.compressed(r).block_table_width,
                                                               cfg.states_per_page(r), role));
    m.index_ws = Buffer(cfg.device, static_cast<size_t>(bytes));
    // The CUDA schedule splits a small step's key lists over the SMs; its workspace is planned
    // here for every decode step the configuration allows (each s_q, each row count, each served
    // layer type), so no step allocates and a captured step needs nothing new.
    int64_t floats = 0;
    const int max_sq = static_cast<int>(std::min<int64_t>(kMaxDecodeQueriesPerRequest, cfg.num_speculative_tokens + 1));
    for (int r = 0; r <= 2; ++r) {
      if (r > 0 && !(model.has_ratio(r) && cfg.serves(r))) continue;
      for (int sq = 1; sq <= max_sq; ++sq)
        for (int64_t T = sq; T <= cfg.max_tokens; T += sq) {
          DecodeScheduleArgs sa;
          sa.layer = r == 0 ? LayerType::kSwaOnly : r == 1 ? LayerType::kC1A : LayerType::kC2A;
          sa.num_tokens = T;
          sa.num_heads = read.heads_padded();
          sa.s_q = sq;
          sa.block_size = r > 0 ? cfg.states_per_page(r) * r : 64;
          sa.device = Device::CUDA;
          floats = std::max(floats, sparse_decode_workspace_floats(plan_decode_schedule(sa, cfg.exec)));
        }
    }
    m.decode_ws = Buffer(cfg.device, static_cast<size_t>(floats) * sizeof(float));
  }
}

LayerShared::~LayerShared() = default;

const AttentionLayer* LayerShared::layer(int index) const {
  if (index < 0 || index >= static_cast<int>(impl_->layers.size())) return nullptr;
  return impl_->layers[static_cast<size_t>(index)];
}
TensorView LayerShared::topk() const { return impl_->topk.view(DType::I32, {impl_->max_tokens, kIndexTopk}); }
TensorView LayerShared::candidates() const {
  return impl_->candidates.view(DType::I32, {impl_->max_tokens, kCandidateTopkBlocks});
}
int LayerShared::topk_writer() const { return impl_->topk_writer; }
int LayerShared::candidates_writer() const { return impl_->candidates_writer; }

// ---------------------------------------------------------------- the layer

struct AttentionLayer::Impl {
  ServingConfig cfg;
  ReadPathConfig read;
  LayerInfo info;
  LayerShared* shared = nullptr;
  int H = 0, Hp = 0, r = 0;
  float scale = 0;
  int64_t table_rows = 0, cap = 0, S = 0;  // S: the kv source's states per page
  std::vector<float> sink, sink_pad;
  Buffer sink_buf;  // sink_pad on the layer's device
  Buffer rope, swa_buf, cmp_buf, idx_buf, ring, latent, norm, wk, knorm;
  CacheView swa, cmp;
  IndexKCacheView idx;
  Buffer q8, w, q_rot, attn, lse, out;
  Buffer dec_idx, dec_len, pf_idx, pf_len;
  // The prefills with tokens, compacted on the host (the chunk plan reads them there) and copied
  // to the layer's device for the gather and the index rows.
  std::vector<int32_t> h_seq, h_glen, h_gstart, h_t2r;
  std::vector<int32_t> h_swa_bt, h_cmp_bt;  // the block-table rows of the prefills with tokens
  std::vector<int64_t> h_orig;              // their request indices
  Buffer d_seq, d_glen, d_gstart, d_t2r, d_swa_bt, d_cmp_bt;
  LayerStepStats stats;
  uint64_t generation = 0;
  // The step being run: run(), run_queries() (the caller wrote the caches) or run_writes() (no
  // reads), and the seq_len that decides the shortcut (meta's own, or the global step's for a
  // PCP rank).
  enum class Mode : uint8_t { kFull, kQueries, kWrites } mode = Mode::kFull;
  int64_t shortcut_len = 0;
  Buffer no_slots;  // i64 [max_tokens] of -1: the query RoPE of run_queries() inserts nothing

  const AttentionLayer* kv_source() const { return shared->layer(info.kv_src); }
  const Impl& kv_impl() const;
  void check(const StepMetadata& meta, const LayerInputs& in) const;
  void write_caches(const StepMetadata& meta, const LayerInputs& in);
  void index(const StepMetadata& meta, const LayerInputs& in);
  void attend(const StepMetadata& meta);
  void count(const StepMetadata& meta);
  void step(const StepMetadata& meta, const LayerInputs& in);
};

AttentionLayer::AttentionLayer(const ServingConfig& cfg, const ReadPathConfig& read, const ModelConfig& model,
                               int layer, const LayerWeights& weights, const RopeTable& table, LayerShared& shared) {
  validate(cfg);
  validate(read);
  if (!cfg.serves_swa()) detail::bad_arg(kCtor, "cfg.swa", "num_pages 0, expected the SWA cache of every layer");
  if (cfg.num_speculative_tokens + 1 > kMaxDecodeQueriesPerRequest)
    detail::bad_arg(kCtor, "cfg.num_speculative_tokens",
                    fmt::format("{}, expected <= {}: a decode request has at most {} query tokens (SPEC 9.4)",
                                cfg.num_speculative_tokens, kMaxDecodeQueriesPerRequest - 1, kMaxDecodeQueriesPerRequest));
  if (layer < 0 || layer >= model.num_layers())
    detail::bad_arg(kCtor, "layer", fmt::format("{}, expected 0 .. {}", layer, model.num_layers() - 1));
  const LayerInfo& li = model.layer(layer);
  if (li.ratio > 0 && !cfg.serves(li.ratio))
    detail::bad_arg(kCtor, "cfg", fmt::format("c{}a not served (num_pages 0), expected the type of layer {} (ratio {})",
                                              li.ratio, layer, li.ratio));
  if (shared.layer(layer) != nullptr)
    detail::bad_arg(kCtor, "shared", fmt::format("already holds a layer {}, expected one object per layer", layer));
  if (static_cast<int64_t>(shared.impl().layers.size()) != model.num_layers() || shared.impl().max_tokens != cfg.max_tokens)
    detail::bad_arg(kCtor, "shared", "built for another model or max_tokens, expected this layer's");
  const int H = read.num_heads;
  if (weights.attn_sink.size() != static_cast<size_t>(H))
    detail::bad_arg(kCtor, "weights.attn_sink", fmt::format("{} entries, expected H = {}", weights.attn_sink.size(), H));
  for (size_t h = 0; h < weights.attn_sink.size(); ++h)
    if (std::isnan(weights.attn_sink[h]))
      detail::bad_arg(kCtor, "weights.attn_sink", fmt::format("NaN at head {}, expected a number or +-inf", h));
  if (li.is_kv_source) {
    auto need = [&](const std::vector<uint16_t>& v, size_t n, const char* name) {
      if (v.size() != n) detail::bad_arg(kCtor, name, fmt::format("{} entries, expected {}", v.size(), n));
    };
    need(weights.compressor_norm, kLatentDim, "weights.compressor_norm");
    need(weights.wk, static_cast<size_t>(kIndexHeadDim) * kLatentDim, "weights.wk");
    need(weights.k_norm, kIndexHeadDim, "weights.k_norm");
  }
  if (table.rows < 1 || table.data.size() != static_cast<size_t>(table.rows) * kRopeTableWidth)
    detail::bad_arg(kCtor, "table", fmt::format("{} rows of {} floats, expected rows >= 1 of {} floats", table.rows,
                                                table.data.size(), kRopeTableWidth));

  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;
  m.cfg = cfg;
  m.read = read;
  m.info = li;
  m.shared = &shared;
  m.H = H;
  m.Hp = read.heads_padded();
  m.r = li.ratio;
  m.scale = read.softmax_scale > 0 ? read.softmax_scale : kSoftmaxScale;
  m.table_rows = table.rows;
  m.sink = weights.attn_sink;
  m.sink_pad.assign(static_cast<size_t>(m.Hp), -kInf);
  std::copy(m.sink.begin(), m.sink.end(), m.sink_pad.begin());
  const Device d = cfg.device;
  const ExecContext& ctx = cfg.exec;
  const auto T = static_cast<size_t>(cfg.max_tokens);
  m.rope = Buffer(d, table.data.size() * sizeof(float));
  m.rope.upload(table.data, 0, ctx);
  m.swa = CacheView::with_default_strides(nullptr, read.swa_format, cfg.swa.num_pages, cfg.swa.page_tokens, d);
  m.swa.fp8_scale = cfg.fp8_scale;
  m.swa_buf = Buffer(d, static_cast<size_t>(m.swa.backing_bytes()));
  m.swa_buf.fill(0, 0, SIZE_MAX, ctx);
  m.swa.base = m.swa_buf.data();
  if (m.r > 0) m.S = cfg.states_per_page(m.r);
  if (li.is_kv_source) {
    const int64_t pages = cfg.compressed(m.r).num_pages;
    m.cmp = CacheView::with_default_strides(nullptr, read.compressed_format, pages, m.S, d);
    m.cmp.fp8_scale = cfg.fp8_scale;
    m.cmp_buf = Buffer(d, static_cast<size_t>(m.cmp.backing_bytes()));
    m.cmp_buf.fill(0, 0, SIZE_MAX, ctx);
    m.cmp.base = m.cmp_buf.data();
    m.idx = IndexKCacheView::with_default_strides(nullptr, read.index_k_format, pages, m.S, d);
    m.idx_buf = Buffer(d, static_cast<size_t>(m.idx.backing_bytes()));
    m.idx_buf.fill(0, 0, SIZE_MAX, ctx);
    m.idx.base = m.idx_buf.data();
    m.latent = Buffer(d, T * kLatentDim * sizeof(uint16_t));
    m.norm = Buffer(d, kLatentDim * sizeof(uint16_t));
    m.norm.upload(weights.compressor_norm, 0, ctx);
    m.wk = Buffer(d, weights.wk.size() * sizeof(uint16_t));
    m.wk.upload(weights.wk, 0, ctx);
    m.knorm = Buffer(d, kIndexHeadDim * sizeof(uint16_t));
    m.knorm.upload(weights.k_norm, 0, ctx);
    if (m.r == 2) {
      m.cap = cfg.ring_capacity();
      m.ring = Buffer(d, static_cast<size_t>(cfg.ring_blocks * m.cap * kRingRowFloats) * sizeof(float));
      m.ring.fill(0, 0, SIZE_MAX, ctx);
    }
  }
  if (li.is_index_source) {
    m.q8 = Buffer(d, T * kIndexHeads * kIndexHeadDim);
    m.w = Buffer(d, T * kIndexHeads * sizeof(float));
  }
  const size_t rowq = static_cast<size_t>(m.Hp) * kLatentDim * sizeof(uint16_t);
  m.q_rot = Buffer(d, T * rowq);
  m.attn = Buffer(d, T * rowq);
  m.lse = Buffer(d, T * static_cast<size_t>(m.Hp) * sizeof(float));
  m.out = Buffer(d, T * static_cast<size_t>(H) * kLatentDim * sizeof(uint16_t));
  if (m.r > 0) {
    m.dec_idx = Buffer(d, T * kIndexTopk * sizeof(int32_t));
    m.dec_len = Buffer(d, T * sizeof(int32_t));
  }
  m.pf_idx = Buffer(d, T * kPrefillIndexWidth * sizeof(int32_t));
  m.pf_len = Buffer(d, T * sizeof(int32_t));
  const auto Rq = static_cast<size_t>(cfg.max_requests);
  m.h_seq.resize(Rq);
  m.h_glen.resize(Rq);
  m.h_gstart.resize(Rq);
  m.h_t2r.resize(T);
  m.h_orig.resize(Rq);
  m.h_swa_bt.resize(Rq * static_cast<size_t>(cfg.swa.block_table_width));
  if (m.r > 0) m.h_cmp_bt.resize(Rq * static_cast<size_t>(cfg.compressed(m.r).block_table_width));
  m.d_seq = Buffer(d, Rq * sizeof(int32_t));
  m.d_glen = Buffer(d, Rq * sizeof(int32_t));
  m.d_gstart = Buffer(d, Rq * sizeof(int32_t));
  m.d_t2r = Buffer(d, T * sizeof(int32_t));
  m.d_swa_bt = Buffer(d, m.h_swa_bt.size() * sizeof(int32_t));
  m.d_cmp_bt = Buffer(d, m.h_cmp_bt.size() * sizeof(int32_t));
  m.sink_buf = Buffer(d, m.sink_pad.size() * sizeof(float));
  m.sink_buf.upload(m.sink_pad, 0, ctx);
  m.no_slots = Buffer(d, T * sizeof(int64_t));
  m.no_slots.fill(0xFF, 0, SIZE_MAX, ctx);
  shared.impl().layers[static_cast<size_t>(layer)] = this;
}

AttentionLayer::~AttentionLayer() {
  if (impl_ && impl_->shared) impl_->shared->impl().layers[static_cast<size_t>(impl_->info.index)] = nullptr;
}

const AttentionLayer::Impl& AttentionLayer::Impl::kv_impl() const { return *kv_source()->impl_; }

void AttentionLayer::Impl::check(const StepMetadata& meta, const LayerInputs& in) const {
  const char* op = mode == Mode::kQueries ? kRunQueries : mode == Mode::kWrites ? kRunWrites : kRun;
  const ServingConfig& o = meta.config();
  const bool same = o.device == cfg.device && o.max_tokens == cfg.max_tokens && o.max_requests == cfg.max_requests &&
                    o.num_speculative_tokens == cfg.num_speculative_tokens && o.serves_swa() &&
                    o.swa.num_pages == cfg.swa.num_pages && o.swa.page_tokens == cfg.swa.page_tokens &&
                    o.swa.block_table_width == cfg.swa.block_table_width &&
                    (r == 0 || (o.serves(r) && o.states_per_page(r) == S &&
                                o.compressed(r).num_pages == cfg.compressed(r).num_pages &&
                                (r == 1 || (o.ring_capacity() == cfg.ring_capacity() && o.ring_blocks == cfg.ring_blocks))));
  if (!same)
    detail::bad_arg(op, "meta", fmt::format("built for another configuration than layer {}'s (device, max_tokens, "
                                              "max_requests, speculative tokens, SWA or c{}a geometry, ring), expected "
                                              "the layer's", info.index, r));
  if (meta.max_position() >= table_rows)
    detail::bad_arg(op, "meta", fmt::format("position {} has no row in layer {}'s RoPE table of {} rows",
                                              meta.max_position(), info.index, table_rows));
  if (meta.max_seq_len() > read.max_model_len)
    detail::bad_arg(kRun, "meta", fmt::format("a sequence of {} tokens, expected at most read.max_model_len = {} (the "
                                              "prefill workspace's size, SPEC 9.5)", meta.max_seq_len(), read.max_model_len));
  const int64_t N = meta.num_rows();
  const Device dev = cfg.device;
  need_3d(op, in.q, "in.q", DType::BF16, H, kLatentDim, N, "bf16 [>= N, H, 512], inner stride 1", dev);
  detail::need_rows(op, in.kv, "in.kv", DType::BF16, kLatentDim, N, "bf16 [>= N, 512]");
  detail::need_contiguous(op, in.kv, "in.kv");
  detail::need_on(op, in.kv, "in.kv", dev);
  if (info.is_kv_source && mode != Mode::kQueries) {
    detail::need_rows(op, in.kv_score, "in.kv_score", DType::F32, int64_t{512} * r, N, "f32 [>= N, 512 r]");
    detail::need_row_stride16(op, in.kv_score, "in.kv_score");
    detail::need_on(op, in.kv_score, "in.kv_score", dev);
  } else if (!info.is_kv_source) {
    need_absent(op, in.kv_score, "in.kv_score", "the layer is not a kv source");
  }
  if (info.is_index_source) {
    need_3d(op, in.index_q, "in.index_q", DType::BF16, kIndexHeads, kIndexHeadDim, N, "bf16 [>= N, 32, 128]", dev);
    detail::need_contiguous(op, in.index_q, "in.index_q");
    detail::need_rows(op, in.w_raw, "in.w_raw", DType::BF16, kIndexHeads, N, "bf16 [>= N, 32]");
    detail::need_contiguous(op, in.w_raw, "in.w_raw");
    detail::need_on(op, in.w_raw, "in.w_raw", dev);
  } else {
    need_absent(op, in.index_q, "in.index_q", "the layer is not an index source");
    need_absent(op, in.w_raw, "in.w_raw", "the layer is not an index source");
  }
  if (r == 0) return;
  // SPEC 1.3: the caches of the kv source and the top-k of the index source must be this step's.
  const AttentionLayer* src = kv_source();
  if (!info.is_kv_source && (src == nullptr || src->last_generation() != meta.generation()))
    detail::bad_arg(op, "meta",
                    fmt::format("layer {} reads the caches of its kv source {}, which {} on this step; expected the "
                                "source to run first", info.index, info.kv_src,
                                src == nullptr ? "does not exist in the model's layers" : "has not run"));
  const LayerShared::Impl& sh = shared->impl();
  if (!info.is_index_source && (sh.topk_writer != info.idx_src || sh.topk_gen != meta.generation()))
    detail::bad_arg(op, "meta",
                    fmt::format("layer {} reads the top-k of its index source {}, but the shared top-k buffer holds {} "
                                "; expected the source to run first on this step", info.index, info.idx_src,
                                sh.topk_writer < 0 ? std::string("nothing yet")
                                                   : fmt::format("layer {}'s of {} step", sh.topk_writer,
                                                                 sh.topk_gen == meta.generation() ? "this" : "another")));
  if (info.is_candidate_consumer &&
      !indexer_takes_shortcut(shortcut_len, r, read.capturing_cuda_graph)) {
    // the candidate source is layer kv_src for a consumer (SPEC 8.7: it scores that cache)
    if (sh.candidates_gen != meta.generation() || sh.candidates_writer != info.kv_src)
      detail::bad_arg(op, "meta",
                      fmt::format("layer {} is a candidate consumer, but the candidates buffer holds {}; expected the "
                                  "candidate source to run first on this step", info.index,
                                  sh.candidates_writer < 0 ? std::string("nothing yet")
                                                           : fmt::format("layer {}'s of another step", sh.candidates_writer)));
  }
}

void AttentionLayer::run(const StepMetadata& meta, const LayerInputs& in) {
  impl_->mode = Impl::Mode::kFull;
  impl_->shortcut_len = meta.max_seq_len();
  impl_->step(meta, in);
}

void AttentionLayer::run_writes(const StepMetadata& meta, const LayerInputs& in) {
  impl_->mode = Impl::Mode::kWrites;
  impl_->shortcut_len = meta.max_seq_len();
  impl_->step(meta, in);
}

void AttentionLayer::run_queries(const StepMetadata& meta, const LayerInputs& in, int64_t step_max_seq_len) {
  if (step_max_seq_len < meta.max_seq_len())
    detail::bad_arg(kRunQueries, "step_max_seq_len",
                    fmt::format("{}, expected the global step's largest seq_len, >= the batch's {}", step_max_seq_len,
                                meta.max_seq_len()));
  impl_->mode = Impl::Mode::kQueries;
  impl_->shortcut_len = step_max_seq_len;
  impl_->step(meta, in);
}

void AttentionLayer::Impl::step(const StepMetadata& meta, const LayerInputs& in) {
  check(meta, in);
  const auto t0 = std::chrono::steady_clock::now();
  stats = {};
  write_caches(meta, in);
  generation = meta.generation();
  if (mode == Mode::kWrites) {
    stats.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  if (info.is_index_source) index(meta, in);
  attend(meta);
  count(meta);
  if (mode == Mode::kQueries) stats.swa_records = stats.compressed_records = stats.index_keys = 0;
  stats.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// (query RoPE + SWA insert) || compressor -> compressed insert || index-K store; run_queries():
// the query RoPE alone
void AttentionLayer::Impl::write_caches(const StepMetadata& meta, const LayerInputs& in) {
  const ExecContext& ctx = cfg.exec;
  const int64_t N = meta.num_rows();
  const TensorView table = rope.view(DType::F32, {table_rows, kRopeTableWidth});
  SwaInsertArgs sa;
  sa.kv = rows_of(in.kv, 0, N);
  sa.q = rows_of(in.q, 0, N);
  sa.positions = meta.positions();
  sa.rope_table = table;
  sa.slot_swa = mode == Mode::kQueries ? no_slots.view(DType::I64, {N}) : meta.swa_slots();
  sa.cache = swa;
  sa.q_out = q_rot.view(DType::BF16, {N, Hp, kLatentDim});
  swa_insert_q_rope(sa, ctx);
  if (!info.is_kv_source || mode == Mode::kQueries) return;
  const TensorView lat = latent.view(DType::BF16, {N, kLatentDim});
  const TensorView cslots = meta.compressed_slots(r);
  CompressArgs c;
  c.ratio = r;
  c.kv_score = rows_of(in.kv_score, 0, N);
  c.positions = meta.positions();
  c.norm_weight = norm.view(DType::BF16, {kLatentDim});
  c.eps = read.eps;
  c.latent_out = lat;
  if (r == 2) {
    c.slot_mapping = meta.ring_slots();
    c.ring = ring.view(DType::F32, {cfg.ring_blocks, cap, kRingRowFloats});
    c.qsl = meta.qsl();
    c.token_to_req = meta.token_to_req();
  } else {
    c.slot_mapping = cslots;
  }
  compress(c, ctx);
  InsertArgs ia;
  ia.ratio = r;
  ia.latent = lat;
  ia.positions = meta.positions();
  ia.rope_table = table;
  ia.slots = cslots;
  ia.cache = cmp;
  insert(ia, ctx);
  IndexKStoreArgs ka;
  ka.ratio = r;
  ka.latent = lat;
  ka.positions = meta.positions();
  ka.slots = cslots;
  ka.wk = wk.view(DType::BF16, {kIndexHeadDim, kLatentDim});
  ka.k_norm = knorm.view(DType::BF16, {kIndexHeadDim});
  ka.eps = read.eps;
  ka.rope_table = table;
  ka.cache = idx;
  indexer_k_store(ka, ctx);
}

// Q prep -> scores / top-k into the shared buffers (SPEC 8.2-8.7)
void AttentionLayer::Impl::index(const StepMetadata& meta, const LayerInputs& in) {
  const ExecContext& ctx = cfg.exec;
  const int64_t N = meta.num_rows();
  LayerShared::Impl& sh = shared->impl();
  const TensorView table = rope.view(DType::F32, {table_rows, kRopeTableWidth});
  const TensorView topk = shared->topk();
  const TensorView pos = meta.positions(), valid = meta.token_valid();
  stats.shortcut = indexer_takes_shortcut(shortcut_len, r, read.capturing_cuda_graph);
  if (stats.shortcut) {
    IndexerShortcutArgs a;
    a.ratio = r;
    a.positions = pos;
    a.token_valid = valid;
    a.topk = topk;
    indexer_shortcut_topk(a, ctx);
  } else {
    IndexQPrepArgs qa;
    qa.q = TensorView::contiguous(in.index_q.data, DType::BF16, {N, kIndexHeads, kIndexHeadDim}, in.index_q.device);
    qa.w_raw = TensorView::contiguous(in.w_raw.data, DType::BF16, {N, kIndexHeads}, in.w_raw.device);
    qa.positions = pos;
    qa.rope_table = table;
    qa.q8 = q8.view(DType::U8, {N, kIndexHeads, kIndexHeadDim});
    qa.w = w.view(DType::F32, {N, kIndexHeads});
    indexer_prepare_q(qa, ctx);
    IndexerTopkArgs a;
    a.ratio = r;
    a.role = info.is_candidate_source     ? IndexerRole::kCandidateSource
             : info.is_candidate_consumer ? IndexerRole::kCandidateConsumer
                                          : IndexerRole::kPlain;
    a.q8 = qa.q8;
    a.w = qa.w;
    a.positions = pos;
    a.token_to_req = meta.token_to_req();
    a.token_valid = valid;
    a.block_table = meta.block_table(r);
    a.k_cache = kv_impl().idx;
    a.topk = topk;
    if (a.role != IndexerRole::kPlain) a.candidates = shared->candidates();
    if (sh.index_ws.size() > 0) a.workspace = sh.index_ws.view(DType::U8, {static_cast<int64_t>(sh.index_ws.size())});
    indexer_topk(a, ctx);
    if (a.role == IndexerRole::kCandidateSource) {
      sh.candidates_writer = info.index;
      sh.candidates_gen = meta.generation();
    }
  }
  sh.topk_writer = info.index;
  sh.topk_gen = meta.generation();
}

// sparse MLA with sink over the decode rows, then the prefill chunks; the inverse RoPE. On either
// device the same launches on cfg.exec: the decode schedule and the prefill chunk plan are host
// plans from the host's copy of the batch; every index row is built on the layer's device.
void AttentionLayer::Impl::attend(const StepMetadata& meta) {
  const ExecContext& ctx = cfg.exec;
  const Device dev = cfg.device;
  const int64_t N = meta.num_rows(), A = meta.num_tokens();
  const DecodeSplit sp = meta.split();
  const LayerType type = layer_type_of_ratio(r);
  const TensorView topk = shared->topk(), sinkv = sink_buf.view(DType::F32, {Hp});
  const TensorView qv = q_rot.view(DType::BF16, {cfg.max_tokens, Hp, kLatentDim});
  const TensorView ov = attn.view(DType::BF16, {cfg.max_tokens, Hp, kLatentDim});
  const TensorView lv = lse.view(DType::F32, {cfg.max_tokens, Hp});
  const CacheView& kc = r > 0 ? kv_impl().cmp : swa;
  const int64_t Td = sp.num_decode_tokens;
  stats.decode_rows = Td;
  stats.prefill_rows = sp.num_prefill_tokens;
  if (Td > 0) {
    LayerShared::Impl& sh = shared->impl();
    const int ti = static_cast<int>(type);
    if (sh.schedule_gen[ti] != meta.generation() || sh.schedule[ti].num_heads != Hp) {
      DecodeScheduleArgs sa;
      sa.layer = type;
      sa.num_tokens = Td;
      sa.num_heads = Hp;
      sa.s_q = meta.decode_s_q();
      sa.block_size = r > 0 ? S * r : 64;
      sa.device = cfg.device;
      sh.schedule[ti] = plan_decode_schedule(sa, ctx);
      sh.schedule_gen[ti] = meta.generation();
    }
    SparseDecodeArgs a;
    a.schedule = &sh.schedule[ti];
    a.s_q = sh.schedule[ti].s_q;
    a.q = rows_of(qv, 0, Td);
    a.swa_cache = swa;
    a.swa_indices = meta.swa_window();
    a.swa_lens = meta.swa_window_lens();
    if (r > 0) {
      DecodeTopkSlotArgs ta;
      ta.qsl = meta.qsl();
      ta.num_speculative_tokens = cfg.num_speculative_tokens;
      ta.slot_swa = meta.swa_slots();
      ta.topk = rows_of(topk, 0, Td);
      ta.block_table = meta.block_table(r);
      ta.states_per_page = S;
      ta.num_pages = cfg.compressed(r).num_pages;
      ta.indices = dec_idx.view(DType::I32, {cfg.max_tokens, kIndexTopk});
      ta.lengths = dec_len.view(DType::I32, {cfg.max_tokens});
      ta.split = &sp;
      build_decode_topk_slots(ta, ctx);
      a.cmp_cache = kc;
      a.cmp_indices = ta.indices;
      a.cmp_lens = ta.lengths;
    }
    a.sink = sinkv;
    a.softmax_scale = scale;
    a.out = ov;
    a.lse = lv;
    const int64_t ws_floats = sparse_decode_workspace_floats(sh.schedule[ti]);
    if (ws_floats > 0) a.workspace = sh.decode_ws.view(DType::F32, {ws_floats});
    sparse_decode(a, ctx);
  }
  if (sp.num_prefill_tokens > 0) {
    // the prefill requests that have tokens (an empty one has no query and no gather), compacted
    const int64_t D = sp.num_decodes;
    const auto* seq = meta.host_seq_lens().ptr<const int64_t>();
    const auto* gl = meta.host_gather_lens().ptr<const int64_t>();
    const auto* gs = meta.host_gather_starts().ptr<const int64_t>();
    const auto* qsl = meta.host_qsl().ptr<const int32_t>();
    const TensorView swa_bt = meta.host_swa_block_table();
    const TensorView cmp_bt = r > 0 ? meta.host_block_table(r) : TensorView{};
    const int64_t ws_cols = swa_bt.shape[1], cm_cols = r > 0 ? cmp_bt.shape[1] : 0;
    int64_t R = 0;
    for (int64_t i = 0; i < sp.num_prefills; ++i) {
      const int64_t b = D + i;
      if (qsl[b + 1] == qsl[b]) continue;
      h_orig[static_cast<size_t>(R)] = b;
      h_seq[static_cast<size_t>(R)] = static_cast<int32_t>(seq[b]);
      h_glen[static_cast<size_t>(R)] = static_cast<int32_t>(gl[i]);
      h_gstart[static_cast<size_t>(R)] = static_cast<int32_t>(gs[i]);
      std::copy_n(swa_bt.ptr<const int32_t>() + b * swa_bt.stride[0], ws_cols, h_swa_bt.begin() + R * ws_cols);
      if (r > 0) std::copy_n(cmp_bt.ptr<const int32_t>() + b * cmp_bt.stride[0], cm_cols, h_cmp_bt.begin() + R * cm_cols);
      ++R;
    }
    // the prefill token t's request as a compact index (empty requests own no token)
    for (int64_t c = 0, t = Td; c < R; ++c)
      for (; t < qsl[h_orig[static_cast<size_t>(c)] + 1]; ++t) h_t2r[static_cast<size_t>(t - Td)] = static_cast<int32_t>(c);
    const TensorView seqh = TensorView::contiguous(h_seq.data(), DType::I32, {R});
    const TensorView glh = TensorView::contiguous(h_glen.data(), DType::I32, {R});
    PrefillChunkArgs pa;
    pa.ratio = r;
    pa.max_model_len = read.max_model_len;
    pa.max_num_batched_tokens = cfg.max_tokens;
    pa.seq_lens = seqh;
    pa.gather_lens = glh;
    const std::vector<PrefillChunk> chunks = plan_prefill_chunks(pa);
    stats.prefill_chunks = static_cast<int64_t>(chunks.size());
    const auto up = [&](Buffer& d, const std::vector<int32_t>& h, int64_t n) {
      d.upload(h.data(), static_cast<size_t>(n) * sizeof(int32_t), 0, ctx);
    };
    up(d_seq, h_seq, R);
    up(d_glen, h_glen, R);
    up(d_gstart, h_gstart, R);
    up(d_t2r, h_t2r, sp.num_prefill_tokens);
    up(d_swa_bt, h_swa_bt, R * ws_cols);
    if (r > 0) up(d_cmp_bt, h_cmp_bt, R * cm_cols);
    const TensorView seqv = d_seq.view(DType::I32, {R}), glv = d_glen.view(DType::I32, {R});
    const TensorView gsv = d_gstart.view(DType::I32, {R});
    LayerShared::Impl& sh = shared->impl();
    const TensorView valid = meta.token_valid();
    for (const PrefillChunk& c : chunks) {
      WorkspaceGatherArgs ga;
      ga.ratio = r;
      ga.chunk = c;
      ga.seq_lens = seqv;
      ga.gather_lens = glv;
      ga.gather_starts = gsv;
      ga.swa_cache = swa;
      ga.swa_block_table = d_swa_bt.view(DType::I32, {R, ws_cols});
      if (r > 0) {
        ga.cmp_cache = kc;
        ga.cmp_block_table = d_cmp_bt.view(DType::I32, {R, cm_cols});
      }
      ga.workspace = sh.workspace.view(DType::BF16, {sh.workspace_rows, kLatentDim});
      gather_prefill_workspace(ga, ctx);
      const int64_t b0 = qsl[h_orig[static_cast<size_t>(c.req_begin)]];
      const int64_t b1 = qsl[h_orig[static_cast<size_t>(c.req_end - 1)] + 1], Tc = b1 - b0;
      PrefillIndexArgs ia;
      ia.ratio = r;
      ia.chunk = c;
      ia.positions = rows_of(meta.positions(), b0, Tc);
      ia.token_to_req = d_t2r.view(DType::I32, {Tc}, b0 - Td);
      ia.gather_lens = glv;
      ia.gather_starts = gsv;
      if (r > 0) ia.topk = rows_of(topk, b0, Tc);
      ia.indices = pf_idx.view(DType::I32, {Tc, kPrefillIndexWidth});
      ia.lengths = pf_len.view(DType::I32, {Tc});
      build_prefill_indices(ia, ctx);
      // SPEC 6.1 / 9.3: an invalid token (slot_swa -1: a null SWA page) has no key.
      mask_invalid_lengths(rows_of(valid, b0, Tc), ia.lengths, ctx);
      SparsePrefillArgs a;
      a.q = rows_of(qv, b0, Tc);
      a.kv = sh.workspace.view(DType::BF16, {c.num_reqs() * c.m_ch, kLatentDim});
      a.indices = ia.indices;
      a.topk_length = ia.lengths;
      a.sink = sinkv;
      a.softmax_scale = scale;
      a.out = rows_of(ov, b0, Tc);
      a.lse = rows_of(lv, b0, Tc);
      sparse_prefill(a, ctx);
    }
  }
  // padding rows (SPEC 9.3): no key, output 0, lse +inf
  if (N > A) {
    const size_t row = static_cast<size_t>(Hp) * kLatentDim * sizeof(uint16_t);
    attn.fill(0, static_cast<size_t>(A) * row, static_cast<size_t>(N - A) * row, ctx);
    float* l0 = lv.ptr<float>() + A * Hp;
    const auto n = static_cast<size_t>((N - A) * Hp);
    if (dev == Device::CPU) {
      std::fill(l0, l0 + n, kInf);
    } else {
#if defined(DSV41KV_WITH_CUDA)
      detail::fill_words(l0, std::bit_cast<uint32_t>(kInf), n, ctx.stream);
#endif
    }
  }
  OutputRopeArgs oa;
  oa.o = rows_of(ov, 0, N);
  oa.num_real_heads = H;
  oa.positions = meta.positions();
  oa.rope_table = rope.view(DType::F32, {table_rows, kRopeTableWidth});
  oa.out = out.view(DType::BF16, {cfg.max_tokens, H, kLatentDim});
  attention_output_rope(oa, ctx);
}

void AttentionLayer::Impl::count(const StepMetadata& meta) {
  // The counts and the checksum read the step's results: on CUDA that synchronises the layer's
  // call, so it is done only when read.device_stats asks for it (tools; the rows, chunks and
  // shortcut above are host facts either way).
  if (cfg.device != Device::CPU && !read.device_stats) return;
  const ExecContext& ctx = cfg.exec;
  const int64_t A = meta.num_tokens(), N = meta.num_rows();
  const detail::HostCopy h_slot(meta.swa_slots(), ctx), h_pos(meta.positions(), ctx);
  const auto* slot = h_slot.as<int64_t>();
  const auto* pos = h_pos.as<int64_t>();
  for (int64_t t = 0; t < N; ++t)
    if (slot[t] >= 0) {
      ++stats.swa_records;
      stats.swa_keys += detail::window_len(pos[t]);
    }
  if (info.is_kv_source) {
    const detail::HostCopy h_cs(meta.compressed_slots(r), ctx);
    const auto* cs = h_cs.as<int64_t>();
    for (int64_t t = 0; t < N; ++t) stats.compressed_records += cs[t] >= 0;
    stats.index_keys = stats.compressed_records;
  }
  if (r > 0) {
    const detail::HostCopy h_tk(shared->topk(), ctx), h_cand(shared->candidates(), ctx);
    const auto* tk = h_tk.as<int32_t>();
    const auto* cand = h_cand.as<int32_t>();
    const bool cand_used = !stats.shortcut && (info.is_candidate_source || info.is_candidate_consumer) &&
                           !indexer_takes_shortcut(shortcut_len, r, read.capturing_cuda_graph);
    for (int64_t t = 0; t < A; ++t) {
      if (slot[t] < 0) continue;
      const int64_t nc = closed_groups(pos[t] + 1, int64_t{r});
      const int64_t k = std::min<int64_t>(nc, kIndexTopk);
      int64_t n = 0;
      for (int64_t j = 0; j < k; ++j) n += tk[t * kIndexTopk + j] >= 0;
      stats.topk_entries += n;
      stats.topk_max = std::max(stats.topk_max, n);
      if (cand_used) {
        int64_t covered = 0;
        for (int64_t j = 0; j < kCandidateTopkBlocks; ++j) {
          const int32_t b = cand[t * kCandidateTopkBlocks + j];
          if (b < 0) break;
          ++stats.candidate_blocks;
          covered += std::min<int64_t>(kCandidateBlockSize, nc - int64_t{b} * kCandidateBlockSize);
        }
        if (info.is_candidate_consumer) stats.candidate_masked += nc - covered;
      }
    }
  }
  const detail::HostCopy h_out(out.view(DType::BF16, {A, H, kLatentDim}), ctx);
  const auto* o = h_out.as<uint8_t>();
  stats.checksum = fnv1a(o, static_cast<size_t>(A * H * kLatentDim) * sizeof(uint16_t), 1469598103934665603ull);
}

void AttentionLayer::set_exec(const ExecContext& exec) {
  detail::check_exec_context(exec, "AttentionLayer::set_exec");
  impl_->cfg.exec = exec;
}

const LayerInfo& AttentionLayer::info() const { return impl_->info; }
const LayerStepStats& AttentionLayer::last_stats() const { return impl_->stats; }
uint64_t AttentionLayer::last_generation() const { return impl_->generation; }
TensorView AttentionLayer::output() const {
  return impl_->out.view(DType::BF16, {impl_->cfg.max_tokens, impl_->H, kLatentDim});
}
TensorView AttentionLayer::attention_out() const {
  return impl_->attn.view(DType::BF16, {impl_->cfg.max_tokens, impl_->Hp, kLatentDim});
}
TensorView AttentionLayer::lse() const { return impl_->lse.view(DType::F32, {impl_->cfg.max_tokens, impl_->Hp}); }
TensorView AttentionLayer::q_rotated() const {
  return impl_->q_rot.view(DType::BF16, {impl_->cfg.max_tokens, impl_->Hp, kLatentDim});
}
const CacheView& AttentionLayer::swa_cache() const { return impl_->swa; }
const CacheView& AttentionLayer::compressed_cache() const {
  if (!impl_->info.is_kv_source)
    detail::bad_arg("AttentionLayer::compressed_cache", "layer",
                    fmt::format("{} is not a kv source, expected a kv source (its consumers read layer {}'s)",
                                impl_->info.index, impl_->info.kv_src));
  return impl_->cmp;
}
const IndexKCacheView& AttentionLayer::index_k_cache() const {
  if (!impl_->info.is_kv_source)
    detail::bad_arg("AttentionLayer::index_k_cache", "layer",
                    fmt::format("{} is not a kv source, expected a kv source", impl_->info.index));
  return impl_->idx;
}
TensorView AttentionLayer::ring() const {
  if (!impl_->info.is_kv_source || impl_->r != 2)
    detail::bad_arg("AttentionLayer::ring", "layer", fmt::format("{} has no ring, expected a ratio-2 kv source",
                                                                impl_->info.index));
  return impl_->ring.view(DType::F32, {impl_->cfg.ring_blocks, impl_->cap, kRingRowFloats});
}
TensorView AttentionLayer::latent() const {
  if (!impl_->info.is_kv_source)
    detail::bad_arg("AttentionLayer::latent", "layer", fmt::format("{} is not a kv source", impl_->info.index));
  return impl_->latent.view(DType::BF16, {impl_->cfg.max_tokens, kLatentDim});
}
const std::vector<float>& AttentionLayer::sink() const { return impl_->sink; }

}  // namespace dsv41kv::pipeline
