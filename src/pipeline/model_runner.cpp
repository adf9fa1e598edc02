// ModelRunner (model_runner.hpp): the allocator, one StepMetadata and the layers of a topology.
#include "dsv41kv/model_runner.hpp"

#include <fmt/format.h>

#include <map>

#include "core/validate.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::pipeline {

namespace {

constexpr const char* kOp = "ModelRunner";

}  // namespace

struct ModelRunner::Impl {
  ModelConfig model;
  ServingConfig serving;
  ReadPathConfig read;
  CacheAllocator alloc;
  StepMetadata meta;
  LayerShared shared;
  std::vector<std::unique_ptr<AttentionLayer>> layers;
  std::map<int64_t, int64_t> computed;  // live requests: num_computed
  std::map<int64_t, bool> null_blocks;
  std::vector<TokenId> tokens;
  StepBatch batch;
  // What the ActivationSource fills (host) and, on CUDA, the layers' device copies.
  Buffer q, kv, kv_score, index_q, w_raw;
  Buffer dq, dkv, dkv_score, dindex_q, dw_raw;

  Impl(const ModelConfig& m, const ServingConfig& s, const ReadPathConfig& r)
      : model(m), serving(s), read(r), alloc(allocator_config(s)), meta(s), shared(s, r, m) {}

  // The filled host rows of `in` copied into the device buffers: the same views there.
  LayerInputs upload(const LayerInputs& in) {
    LayerInputs d;
    const auto one = [&](const TensorView& h, const Buffer& hb, Buffer& db) {
      if (!h.present()) return TensorView{};
      const size_t bytes = static_cast<size_t>(h.numel()) * dtype_size(h.dtype);
      db.upload(hb.data(), bytes, 0, serving.exec);
      TensorView v = h;
      v.data = db.data();
      v.device = db.device();
      return v;
    };
    d.q = one(in.q, q, dq);
    d.kv = one(in.kv, kv, dkv);
    d.kv_score = one(in.kv_score, kv_score, dkv_score);
    d.index_q = one(in.index_q, index_q, dindex_q);
    d.w_raw = one(in.w_raw, w_raw, dw_raw);
    return d;
  }
};

ModelRunner::ModelRunner(const ModelConfig& model, const ServingConfig& serving, const ReadPathConfig& read,
                         const std::function<LayerWeights(const LayerInfo&)>& weights, int64_t rope_rows) {
  validate(serving);
  validate(read);
  if (rope_rows < 1) detail::bad_arg(kOp, "rope_rows", fmt::format("{}, expected >= 1", rope_rows));
  impl_ = std::make_unique<Impl>(model, serving, read);
  Impl& m = *impl_;
  const RopeTable plain = rope_table_for_ratio(model, 0, rope_rows, RopeAngle::kBinary64, serving.exec.num_threads);
  RopeTable yarn;
  if (model.any_compressed())
    yarn = rope_table_for_ratio(model, 1, rope_rows, RopeAngle::kBinary64, serving.exec.num_threads);
  for (int L = 0; L < model.num_layers(); ++L) {
    const LayerInfo& li = model.layer(L);
    m.layers.push_back(std::make_unique<AttentionLayer>(serving, read, model, L, weights(li), li.ratio > 0 ? yarn : plain,
                                                        m.shared));
  }
  const auto T = static_cast<size_t>(serving.max_tokens);
  const auto H = static_cast<size_t>(read.num_heads);
  const size_t bytes[5] = {T * H * kLatentDim * sizeof(uint16_t), T * kLatentDim * sizeof(uint16_t),
                           model.any_compressed() ? T * (model.has_ratio(2) ? 1024 : 512) * sizeof(float) : 0,
                           T * kIndexHeads * kIndexHeadDim * sizeof(uint16_t), T * kIndexHeads * sizeof(uint16_t)};
  Buffer* host[5] = {&m.q, &m.kv, &m.kv_score, &m.index_q, &m.w_raw};
  Buffer* dev[5] = {&m.dq, &m.dkv, &m.dkv_score, &m.dindex_q, &m.dw_raw};
  for (int i = 0; i < 5; ++i) {
    *host[i] = Buffer(Device::CPU, bytes[i]);
    if (serving.device != Device::CPU) *dev[i] = Buffer(serving.device, bytes[i]);
  }
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::add_request(int64_t id, bool null_blocks) {
  Impl& m = *impl_;
  if (m.computed.count(id)) detail::bad_arg(kOp, "id", fmt::format("{}, expected a request that is not live", id));
  if (!null_blocks) m.alloc.add(id);
  m.computed[id] = 0;
  m.null_blocks[id] = null_blocks;
}

void ModelRunner::finish_request(int64_t id) {
  Impl& m = *impl_;
  if (!m.computed.count(id)) detail::bad_arg(kOp, "id", fmt::format("{}, expected a live request", id));
  if (!m.null_blocks[id]) m.alloc.release(id);
  m.computed.erase(id);
  m.null_blocks.erase(id);
}

bool ModelRunner::live(int64_t id) const { return impl_->computed.count(id) != 0; }

int64_t ModelRunner::num_computed(int64_t id) const {
  const auto it = impl_->computed.find(id);
  if (it == impl_->computed.end()) detail::bad_arg(kOp, "id", fmt::format("{}, expected a live request", id));
  return it->second;
}

void ModelRunner::step(const EngineStep& step, ActivationSource& source,
                       const std::function<void(const AttentionLayer&)>& after_layer) {
  Impl& m = *impl_;
  // every request known and named once before any page is taken
  std::map<int64_t, int> seen;
  for (size_t j = 0; j < step.requests.size(); ++j) {
    const RequestStep& r = step.requests[j];
    if (!m.computed.count(r.id))
      detail::bad_arg(kOp, fmt::format("step.requests[{}].id", j).c_str(), fmt::format("{}, expected a live request", r.id));
    if (seen[r.id]++)
      detail::bad_arg(kOp, fmt::format("step.requests[{}].id", j).c_str(), fmt::format("{} twice, expected once", r.id));
    if (r.query_len < 0)
      detail::bad_arg(kOp, fmt::format("step.requests[{}].query_len", j).c_str(), fmt::format("{}, expected >= 0", r.query_len));
  }
  StepBatch b;
  b.padding_rows = step.padding_rows;
  std::vector<TokenId> tokens;
  for (const RequestStep& r : step.requests) {
    const int64_t nc = m.computed[r.id];
    StepRequest q;
    if (m.null_blocks[r.id]) {
      q.query_len = r.query_len;
      q.num_computed = nc;
    } else {
      q = m.alloc.prepare(r.id, nc, r.query_len);
    }
    b.requests.push_back(std::move(q));
    for (int64_t i = 0; i < r.query_len; ++i) tokens.push_back({r.id, nc + i});
  }
  m.meta.build(b);
  m.batch = std::move(b);
  m.tokens = std::move(tokens);
  const int64_t N = m.meta.num_rows();
  const int H = m.read.num_heads;
  for (auto& layer : m.layers) {
    const LayerInfo& li = layer->info();
    LayerInputs in;
    in.q = m.q.view(DType::BF16, {N, H, kLatentDim});
    in.kv = m.kv.view(DType::BF16, {N, kLatentDim});
    if (li.is_kv_source) in.kv_score = m.kv_score.view(DType::F32, {N, int64_t{512} * li.ratio});
    if (li.is_index_source) {
      in.index_q = m.index_q.view(DType::BF16, {N, kIndexHeads, kIndexHeadDim});
      in.w_raw = m.w_raw.view(DType::BF16, {N, kIndexHeads});
    }
    source.fill(li, m.tokens, N, in);
    if (m.serving.device != Device::CPU) in = m.upload(in);
    layer->run(m.meta, in);
    if (after_layer) after_layer(*layer);
  }
  for (const RequestStep& r : step.requests) m.computed[r.id] += r.query_len;
}

const ModelConfig& ModelRunner::model() const { return impl_->model; }
const StepMetadata& ModelRunner::metadata() const { return impl_->meta; }
std::span<const TokenId> ModelRunner::tokens() const { return impl_->tokens; }
const StepBatch& ModelRunner::batch() const { return impl_->batch; }
int ModelRunner::num_layers() const { return static_cast<int>(impl_->layers.size()); }
const AttentionLayer& ModelRunner::layer(int index) const {
  if (index < 0 || index >= num_layers())
    detail::bad_arg(kOp, "index", fmt::format("{}, expected 0 .. {}", index, num_layers() - 1));
  return *impl_->layers[static_cast<size_t>(index)];
}
const CacheAllocator& ModelRunner::allocator() const { return impl_->alloc; }
const LayerShared& ModelRunner::shared() const { return impl_->shared; }

}  // namespace dsv41kv::pipeline
