// The PCP simulation's read path (pcp_read.hpp).
#include "oracles/pcp_read.hpp"

#include <algorithm>
#include <cstring>

#include "dsv41kv/attention.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/rng.hpp"

namespace dsv41kv::pcp::read_path {

namespace {

pipeline::ServingConfig serving_for(const Setup& s, int64_t max_tokens, int64_t max_requests) {
  pipeline::ServingConfig c = s.serving;
  c.max_tokens = std::max<int64_t>(max_tokens, 1);
  c.max_requests = std::max<int64_t>(max_requests, 1);
  return c;
}

std::span<const uint8_t> bytes_of(const void* base, int64_t n) {
  return {static_cast<const uint8_t*>(base), static_cast<size_t>(n)};
}

// The SWA cache's record: the compressed format's when it is an SWA format (SPEC 3.4), else 584.
RecordFormat swa_format_for(RecordFormat f) { return f == RecordFormat::NVFP4_288 ? RecordFormat::V4_584 : f; }

}  // namespace

double layer_bytes(int ratio, RecordFormat format, int num_heads, int64_t swa_pages, int64_t num_pages, int64_t S,
                   int64_t max_model_len, int64_t max_tokens) {
  const double caches =
      static_cast<double>(CacheView::with_default_strides(nullptr, swa_format_for(format), swa_pages, kSwaPageTokens)
                              .backing_bytes()) +
      static_cast<double>(CacheView::with_default_strides(nullptr, format, num_pages, S).backing_bytes()) +
      static_cast<double>(IndexKCacheView::with_default_strides(nullptr, IndexKFormat::FP8_132, num_pages, S).backing_bytes());
  const double row = 4.0 * num_heads * kLatentDim * 2.0 + 2.0 * kLatentDim * 2.0 +
                     kIndexHeads * (3.0 * kIndexHeadDim + 8.0) + 4.0 * (2.0 * kIndexTopk + kCandidateTopkBlocks +
                                                                         kPrefillIndexWidth + 16.0);
  const double ws = static_cast<double>(prefill_workspace_rows(ratio, max_model_len, std::max<int64_t>(max_tokens, 1))) *
                    kLatentDim * 2.0;
  return caches + row * static_cast<double>(std::max<int64_t>(max_tokens, 1)) + ws;
}

Setup make_setup(const SimConfig& cfg, const Workload& w, int64_t S, int64_t num_pages,
                 const std::vector<std::vector<int32_t>>& cpages, int64_t ring_blocks, const RopeTable& table,
                 const std::vector<uint16_t>& norm, float fp8_scale) {
  Setup s;
  ModelConfig& mc = s.model;
  mc = deepseek_v41_flash();
  mc.num_hidden_layers = 1;
  mc.num_nextn_predict_layers = 0;
  mc.compress_ratios = {cfg.ratio};
  mc.kv_source_layer_ids = {kLayer};
  mc.index_source_layer_ids = {kLayer};
  mc.candidate_source_layer_id = -1;
  mc.layers.clear();
  finalize_topology(mc, "the simulation's layer");

  // SWA pages: shuffled distinct pages >= 1 for every position of a request; none (the null
  // page) for a null-block request.
  Rng rng(w.config.seed ^ 0x5157415061676573ull);
  int64_t total = 0, width = 1;
  for (const auto& r : w.requests) {
    const int64_t n = swa_pages_of(r);
    width = std::max(width, n);
    if (!r.null_block) total += n;
  }
  std::vector<int32_t> pages(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) pages[static_cast<size_t>(i)] = static_cast<int32_t>(i + 1);
  for (int64_t i = total - 1; i > 0; --i) std::swap(pages[static_cast<size_t>(i)], pages[static_cast<size_t>(rng.integer(0, i))]);
  size_t next = 0;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const auto& r = w.requests[i];
    pipeline::StepRequest q;
    q.ring_block = r.ring_block;
    (cfg.ratio == 1 ? q.c1a_pages : q.c2a_pages) = cpages[i];
    if (!r.null_block)
      for (int64_t k = 0; k < swa_pages_of(r); ++k)
        q.swa_pages.push_back(pages[next++]);
    s.requests.push_back(std::move(q));
  }

  pipeline::ServingConfig& c = s.serving;
  c.device = Device::CPU;
  c.exec.num_threads = 1;
  c.num_speculative_tokens = cfg.num_speculative_tokens;
  c.ring_blocks = ring_blocks;
  pipeline::CompressedCacheGeometry& g = cfg.ratio == 1 ? c.c1a : c.c2a;
  g.states_per_page = S;
  g.num_pages = num_pages;
  for (const auto& row : cpages) g.block_table_width = std::max<int64_t>(g.block_table_width, static_cast<int64_t>(row.size()));
  c.swa.page_tokens = kSwaPageTokens;
  c.swa.num_pages = total + 1;
  c.swa.block_table_width = width;
  c.formats = {cfg.formats.at(0)};
  c.fp8_scale = fp8_scale;

  s.read.swa_format = swa_format_for(cfg.formats[0]);
  s.read.compressed_format = cfg.formats[0];
  s.read.num_heads = cfg.num_heads;
  s.read.eps = cfg.eps;
  s.read.max_model_len = w.max_position + 1;
  s.read.capturing_cuda_graph = cfg.scored_topk;
  pipeline::validate(s.read);
  s.weights = pipeline::LayerWeights::from_seed(mc.layer(kLayer), cfg.num_heads, w.config.seed);
  s.weights.compressor_norm = norm;
  s.table = table;
  s.seed = w.config.seed;
  return s;
}

Layer::Layer(const Setup& s, int64_t max_tokens, int64_t max_requests)
    : setup_(s),
      max_tokens_(std::max<int64_t>(max_tokens, 1)),
      meta_(serving_for(s, max_tokens, max_requests)),
      activations_(s.seed) {
  const pipeline::ServingConfig c = serving_for(s, max_tokens, max_requests);
  shared_ = std::make_unique<pipeline::LayerShared>(c, s.read, s.model);
  layer_ = std::make_unique<pipeline::AttentionLayer>(c, s.read, s.model, kLayer, s.weights, s.table, *shared_);
  const auto T = static_cast<size_t>(max_tokens_);
  const int64_t H = s.read.num_heads;
  q_ = Buffer(Device::CPU, T * static_cast<size_t>(H) * kLatentDim * sizeof(uint16_t));
  kv_ = Buffer(Device::CPU, T * kLatentDim * sizeof(uint16_t));
  index_q_ = Buffer(Device::CPU, T * kIndexHeads * kIndexHeadDim * sizeof(uint16_t));
  w_raw_ = Buffer(Device::CPU, T * kIndexHeads * sizeof(uint16_t));
  in_.q = q_.view(DType::BF16, {max_tokens_, H, kLatentDim});
  in_.kv = kv_.view(DType::BF16, {max_tokens_, kLatentDim});
  in_.index_q = index_q_.view(DType::BF16, {max_tokens_, kIndexHeads, kIndexHeadDim});
  in_.w_raw = w_raw_.view(DType::BF16, {max_tokens_, kIndexHeads});
}

Layer::~Layer() = default;

void Layer::prepare(std::span<const BatchRequest> reqs, int64_t padding_rows) {
  pipeline::StepBatch b;
  tokens_.clear();
  for (const BatchRequest& q : reqs) {
    pipeline::StepRequest r;
    if (q.id >= 0) r = setup_.requests.at(static_cast<size_t>(q.id));
    r.query_len = q.query_len;
    r.num_computed = q.num_computed;
    b.requests.push_back(std::move(r));
    for (int64_t i = 0; i < q.query_len; ++i) tokens_.push_back({q.id, q.num_computed + i});
  }
  b.padding_rows = padding_rows;
  meta_.build(b);
  activations_.fill(setup_.model.layer(kLayer), tokens_, meta_.num_rows(), in_);
}

void Layer::write_gathered(const TensorView& kv, const TensorView& latent, const TensorView& positions,
                           const TensorView& swa_slots, const TensorView& cslots, const ExecContext& ctx) {
  InsertArgs s;
  s.ratio = 1;
  s.latent = kv;
  s.positions = positions;
  s.rope_table = setup_.table.view();
  s.slots = swa_slots;
  s.cache = layer_->swa_cache();
  insert(s, ctx);
  const pipeline::LayerWeights& w = setup_.weights;
  IndexKStoreArgs k;
  k.ratio = layer_->info().ratio;
  k.latent = latent;
  k.positions = positions;
  k.slots = cslots;
  k.wk = TensorView::contiguous(const_cast<uint16_t*>(w.wk.data()), DType::BF16, {kIndexHeadDim, kLatentDim});
  k.k_norm = TensorView::contiguous(const_cast<uint16_t*>(w.k_norm.data()), DType::BF16, {kIndexHeadDim});
  k.eps = setup_.read.eps;
  k.rope_table = setup_.table.view();
  k.cache = layer_->index_k_cache();
  indexer_k_store(k, ctx);
}

std::span<const uint8_t> Layer::swa_bytes() const {
  const CacheView& c = layer_->swa_cache();
  return bytes_of(c.base, static_cast<int64_t>(c.backing_bytes()));
}
std::span<const uint8_t> Layer::compressed_bytes() const {
  const CacheView& c = layer_->compressed_cache();
  return bytes_of(c.base, static_cast<int64_t>(c.backing_bytes()));
}
std::span<const uint8_t> Layer::index_k_bytes() const {
  const IndexKCacheView& c = layer_->index_k_cache();
  return bytes_of(c.base, c.backing_bytes());
}

void Layer::copy_caches_from(const Layer& o) {
  for (const auto& [to, from] : {std::pair{swa_bytes(), o.swa_bytes()}, std::pair{compressed_bytes(), o.compressed_bytes()},
                                 std::pair{index_k_bytes(), o.index_k_bytes()}})
    std::memcpy(const_cast<uint8_t*>(to.data()), from.data(), std::min(to.size(), from.size()));
}

}  // namespace dsv41kv::pcp::read_path
