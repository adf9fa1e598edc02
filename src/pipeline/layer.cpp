// KvSourceLayer (pipeline.hpp): one kv-source layer's state in Buffers and its step through the
// public API (projection, compress, insert) on the configured device.
#include <fmt/format.h>

#include <cmath>

#include "core/validate.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/projection_cuda.hpp"
#include "pipeline/timeline.hpp"

namespace dsv41kv::pipeline {

struct KvSourceLayer::Impl {
  ServingConfig cfg;
  int ratio = 2;
  int64_t H = 0, cap = 8, table_rows = 0;
  float eps = 0;
  Buffer weight, norm, rope, ring, kv, latent;
  std::vector<Buffer> cache_bufs;
  std::vector<CacheView> caches;
  std::unique_ptr<CublasProjection> cublas;  // CUDA: the projection's handle and workspace
  detail::Timeline timeline;

  explicit Impl(const ServingConfig& c) : cfg(c), timeline(c.device, 3) {}
  int64_t width() const { return int64_t{512} * ratio; }
  void check_metadata(const StepMetadata& meta) const;
};

namespace {
constexpr const char* kCtor = "KvSourceLayer";
constexpr const char* kRun = "KvSourceLayer::run";
}  // namespace

KvSourceLayer::KvSourceLayer(const ServingConfig& cfg, const CompressorWeights& w, const RopeTable& table, float eps) {
  validate(cfg);
  detail::need_ratio(kCtor, w.ratio, ErrorCode::kCompressorRatio, "weights.ratio");
  if (!cfg.serves(w.ratio))
    detail::bad_arg(kCtor, "cfg", fmt::format("c{}a not served (num_pages 0), expected the type of a ratio-{} layer",
                                              w.ratio, w.ratio));
  if (w.hidden_size < 1) detail::bad_arg(kCtor, "weights.hidden_size", fmt::format("{}, expected >= 1", w.hidden_size));
  const size_t wn = static_cast<size_t>(512 * w.ratio) * static_cast<size_t>(w.hidden_size);
  if (w.fused_wkv_wgate.size() != wn)
    detail::bad_arg(kCtor, "weights.fused_wkv_wgate",
                    fmt::format("{} elements, expected 512 * {} * {} = {}", w.fused_wkv_wgate.size(), w.ratio,
                                w.hidden_size, wn));
  if (w.norm_weight.size() != static_cast<size_t>(kLatentDim))
    detail::bad_arg(kCtor, "weights.norm_weight", fmt::format("{} elements, expected {}", w.norm_weight.size(), kLatentDim));
  if (table.rows < 1 || table.data.size() != static_cast<size_t>(table.rows) * kRopeTableWidth)
    detail::bad_arg(kCtor, "table",
                    fmt::format("{} rows of {} floats, expected rows >= 1 of {} floats", table.rows, table.data.size(),
                                kRopeTableWidth));
  if (!(std::isfinite(eps) && eps >= 0.0f)) detail::bad_arg(kCtor, "eps", fmt::format("{}, expected finite and >= 0", eps));

  impl_ = std::make_unique<Impl>(cfg);
  Impl& m = *impl_;
  const Device d = cfg.device;
  const ExecContext& ctx = cfg.exec;
  m.ratio = w.ratio;
  m.H = w.hidden_size;
  m.eps = eps;
  m.cap = cfg.ring_capacity();
  m.table_rows = table.rows;
  m.weight = Buffer(d, wn * sizeof(uint16_t));
  m.weight.upload(w.fused_wkv_wgate, 0, ctx);
  m.norm = Buffer(d, kLatentDim * sizeof(uint16_t));
  m.norm.upload(w.norm_weight, 0, ctx);
  m.rope = Buffer(d, table.data.size() * sizeof(float));
  m.rope.upload(table.data, 0, ctx);
  if (m.ratio == 2) {
    m.ring = Buffer(d, static_cast<size_t>(cfg.ring_blocks * m.cap * kRingRowFloats) * sizeof(float));
    m.ring.fill(0, 0, SIZE_MAX, ctx);
  }
  const auto T = static_cast<size_t>(cfg.max_tokens);
  m.kv = Buffer(d, T * static_cast<size_t>(m.width()) * sizeof(float));
  m.latent = Buffer(d, T * kLatentDim * sizeof(uint16_t));
  for (RecordFormat f : cfg.formats) {
    CacheView v = CacheView::with_default_strides(nullptr, f, cfg.compressed(m.ratio).num_pages,
                                                  cfg.states_per_page(m.ratio), d);
    v.fp8_scale = cfg.fp8_scale;
    Buffer b(d, v.backing_bytes());
    b.fill(0, 0, SIZE_MAX, ctx);
    v.base = b.data();
    m.cache_bufs.push_back(std::move(b));
    m.caches.push_back(v);
  }
  if (d == Device::CUDA) m.cublas = std::make_unique<CublasProjection>();
}

KvSourceLayer::~KvSourceLayer() = default;

void KvSourceLayer::Impl::check_metadata(const StepMetadata& meta) const {
  const ServingConfig& o = meta.config();
  const bool same = o.device == cfg.device && o.serves(ratio) && o.states_per_page(ratio) == cfg.states_per_page(ratio) &&
                    o.compressed(ratio).num_pages == cfg.compressed(ratio).num_pages &&
                    (ratio == 1 || (o.ring_capacity() == cap && o.ring_blocks == cfg.ring_blocks));
  if (!same)
    detail::bad_arg(kRun, "meta",
                    fmt::format("built for {} with c{}a {} states per page, {} pages, ring capacity {}, {} ring blocks; "
                                "expected this layer's {}, {}, {}, {}, {}",
                                device_name(o.device), ratio, o.serves(ratio) ? o.states_per_page(ratio) : 0,
                                o.compressed(ratio).num_pages, o.ring_capacity(), o.ring_blocks,
                                device_name(cfg.device), cfg.states_per_page(ratio), cfg.compressed(ratio).num_pages,
                                cap, cfg.ring_blocks));
  if (meta.max_position() >= table_rows)
    detail::bad_arg(kRun, "meta",
                    fmt::format("position {} has no row in the layer's RoPE table of {} rows", meta.max_position(),
                                table_rows));
}

void KvSourceLayer::run(const StepMetadata& meta, const TensorView& hidden) {
  Impl& m = *impl_;
  m.check_metadata(meta);
  const int64_t N = meta.num_rows();
  detail::need_rows(kRun, hidden, "hidden", DType::BF16, m.H, N, "bf16 [>= N, hidden_size]");
  detail::need_on(kRun, hidden, "hidden", m.cfg.device);
  const ExecContext& ctx = m.cfg.exec;
  const int r = m.ratio;
  const TensorView x = TensorView::strided(hidden.data, DType::BF16, {N, m.H}, {hidden.stride[0], 1}, hidden.device);
  const TensorView kv = m.kv.view(DType::F32, {N, m.width()});
  const TensorView w = m.weight.view(DType::BF16, {m.width(), m.H});
  const TensorView latent = m.latent.view(DType::BF16, {N, kLatentDim});
  const TensorView cslots = meta.compressed_slots(r);

  m.timeline.mark(0, ctx);
  if (N > 0) {
    if (m.cublas) m.cublas->project(x, w, kv, ctx);
    else project_kv_score(x, w, kv, ctx);
  }
  m.timeline.mark(1, ctx);
  CompressArgs c;
  c.ratio = r;
  c.kv_score = kv;
  c.positions = meta.positions();
  c.norm_weight = m.norm.view(DType::BF16, {kLatentDim});
  c.eps = m.eps;
  c.latent_out = latent;
  if (r == 2) {
    c.slot_mapping = meta.ring_slots();
    c.ring = ring_view();
    c.qsl = meta.qsl();
    c.token_to_req = meta.token_to_req();
  } else {
    c.slot_mapping = cslots;
  }
  compress(c, ctx);
  for (const CacheView& cache : m.caches) {
    InsertArgs a;
    a.ratio = r;
    a.latent = latent;
    a.positions = meta.positions();
    a.rope_table = m.rope.view(DType::F32, {m.table_rows, kRopeTableWidth});
    a.slots = cslots;
    a.cache = cache;
    insert(a, ctx);
  }
  m.timeline.mark(2, ctx);
}

LayerTimings KvSourceLayer::last_timings() const {
  return {impl_->timeline.ms(0, 1), impl_->timeline.ms(1, 2)};
}

int KvSourceLayer::ratio() const { return impl_->ratio; }
int64_t KvSourceLayer::hidden_size() const { return impl_->H; }
const ServingConfig& KvSourceLayer::config() const { return impl_->cfg; }
Buffer& KvSourceLayer::ring() { return impl_->ring; }
const Buffer& KvSourceLayer::ring() const { return impl_->ring; }

TensorView KvSourceLayer::ring_view() const {
  if (impl_->ratio != 2) detail::bad_arg("KvSourceLayer::ring_view", "ratio", "1: a ratio-1 layer has no ring");
  return impl_->ring.view(DType::F32, {impl_->cfg.ring_blocks, impl_->cap, kRingRowFloats});
}

size_t KvSourceLayer::num_caches() const { return impl_->caches.size(); }

namespace {
size_t cache_index(const char* op, size_t i, size_t n) {
  if (i >= n) detail::bad_arg(op, "i", fmt::format("{}, expected < num_caches() = {}", i, n));
  return i;
}
}  // namespace

const CacheView& KvSourceLayer::cache(size_t i) const {
  return impl_->caches[cache_index("KvSourceLayer::cache", i, impl_->caches.size())];
}
Buffer& KvSourceLayer::cache_buffer(size_t i) {
  return impl_->cache_bufs[cache_index("KvSourceLayer::cache_buffer", i, impl_->cache_bufs.size())];
}
const Buffer& KvSourceLayer::cache_buffer(size_t i) const {
  return impl_->cache_bufs[cache_index("KvSourceLayer::cache_buffer", i, impl_->cache_bufs.size())];
}
Buffer& KvSourceLayer::kv_score() { return impl_->kv; }
const Buffer& KvSourceLayer::kv_score() const { return impl_->kv; }
Buffer& KvSourceLayer::latent() { return impl_->latent; }
const Buffer& KvSourceLayer::latent() const { return impl_->latent; }

}  // namespace dsv41kv::pipeline
