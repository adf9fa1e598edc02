// AttentionLayer's two halves (attention_layer.hpp): run_writes (the cache writes of a step) then
// run_queries (its reads: query RoPE, top-k, attention, inverse RoPE) give exactly run()'s bits,
// outputs, lse, top-k rows and every cache byte, for a kv source of each ratio; run_writes leaves
// the outputs untouched and run_queries every cache; run_queries decides the shortcut by the seq_len
// it is given; bad arguments are E8 naming run_queries before anything is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/buffer.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/read_path_check.hpp"
#include "dsv41kv/rope.hpp"
#include "support/errors.hpp"

namespace dsv41kv::test {
namespace {

using pipeline::AttentionLayer;
using pipeline::LayerInputs;
using pipeline::LayerShared;
using pipeline::StepBatch;
using pipeline::StepMetadata;
using pipeline::StepRequest;

constexpr int kHeads = 8;
constexpr int64_t kRows = 48;

ModelConfig one_layer(int ratio) {
  ModelConfig m = deepseek_v41_flash();
  m.num_hidden_layers = 1;
  m.num_nextn_predict_layers = 0;
  m.compress_ratios = {ratio};
  m.kv_source_layer_ids = {0};
  m.index_source_layer_ids = {0};
  m.candidate_source_layer_id = -1;
  m.layers.clear();
  finalize_topology(m, "test");
  return m;
}

pipeline::ServingConfig serving(int ratio) {
  pipeline::ServingConfig c;
  c.exec.num_threads = 1;
  c.max_tokens = kRows;
  c.max_requests = 3;
  c.ring_blocks = 4;
  pipeline::CompressedCacheGeometry& g = ratio == 1 ? c.c1a : c.c2a;
  g.num_pages = 8;
  g.block_table_width = 3;
  c.swa.num_pages = 12;
  c.swa.block_table_width = 4;
  c.formats = {RecordFormat::V4_584};
  return c;
}

// One layer with its own shared buffers, metadata and activations.
struct LayerRun {
  ModelConfig model;
  pipeline::ServingConfig cfg;
  pipeline::ReadPathConfig read;
  RopeTable table = build_rope_table(RopeParams{}, 256);
  std::unique_ptr<LayerShared> shared;
  std::unique_ptr<AttentionLayer> layer;
  StepMetadata meta;
  oracles::SeededActivations act{5};
  Buffer q, kv, kv_score, index_q, w_raw;
  LayerInputs in;

  explicit LayerRun(int ratio) : model(one_layer(ratio)), cfg(serving(ratio)), meta(cfg) {
    read.num_heads = kHeads;
    read.eps = 1e-6f;
    read.max_model_len = 200;
    shared = std::make_unique<LayerShared>(cfg, read, model);
    layer = std::make_unique<AttentionLayer>(cfg, read, model, 0,
                                             pipeline::LayerWeights::from_seed(model.layer(0), kHeads, 9), table, *shared);
    q = Buffer(Device::CPU, kRows * kHeads * kLatentDim * 2);
    kv = Buffer(Device::CPU, kRows * kLatentDim * 2);
    kv_score = Buffer(Device::CPU, kRows * 512 * ratio * 4);
    index_q = Buffer(Device::CPU, kRows * kIndexHeads * kIndexHeadDim * 2);
    w_raw = Buffer(Device::CPU, kRows * kIndexHeads * 2);
    in.q = q.view(DType::BF16, {kRows, kHeads, kLatentDim});
    in.kv = kv.view(DType::BF16, {kRows, kLatentDim});
    in.kv_score = kv_score.view(DType::F32, {kRows, 512 * ratio});
    in.index_q = index_q.view(DType::BF16, {kRows, kIndexHeads, kIndexHeadDim});
    in.w_raw = w_raw.view(DType::BF16, {kRows, kIndexHeads});
  }
  // Builds the step and fills its activations (the same function of request and position in
  // every LayerRun).
  void prepare(const StepBatch& b) {
    meta.build(b);
    std::vector<pipeline::TokenId> tokens;
    for (size_t j = 0; j < b.requests.size(); ++j)
      for (int64_t i = 0; i < b.requests[j].query_len; ++i)
        tokens.push_back({static_cast<int64_t>(j), b.requests[j].num_computed + i});
    act.fill(model.layer(0), tokens, meta.num_rows(), in);
  }
  std::vector<uint8_t> caches() const {
    std::vector<uint8_t> out;
    auto add = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    add(layer->swa_cache().base, layer->swa_cache().backing_bytes());
    add(layer->compressed_cache().base, layer->compressed_cache().backing_bytes());
    add(layer->index_k_cache().base, static_cast<size_t>(layer->index_k_cache().backing_bytes()));
    return out;
  }
  // The step's rows [0, N) of the output, the lse and the top-k (later rows are not the step's).
  std::vector<uint8_t> outputs() const {
    std::vector<uint8_t> out;
    for (const TensorView& v : {layer->output(), layer->lse(), shared->topk()}) {
      const auto n = static_cast<size_t>(meta.num_rows() * v.stride[0]) * dtype_size(v.dtype);
      out.insert(out.end(), v.ptr<const uint8_t>(), v.ptr<const uint8_t>() + n);
    }
    return out;
  }
};

// Two steps: two prefills from 0, then a decode of each (one at an odd position) and a third
// request's prefill, with padding rows; page rows distinct per request.
std::vector<StepBatch> steps(int ratio) {
  auto req = [&](int64_t q, int64_t c, int32_t ring, std::vector<int32_t> cp, std::vector<int32_t> sp) {
    StepRequest r;
    r.query_len = q;
    r.num_computed = c;
    r.ring_block = ring;
    (ratio == 1 ? r.c1a_pages : r.c2a_pages) = std::move(cp);
    r.swa_pages = std::move(sp);
    return r;
  };
  StepBatch a, b;
  a.requests = {req(20, 0, 1, {3, 5}, {2, 7}), req(9, 0, 2, {1}, {4})};
  b.requests = {req(1, 20, 1, {3, 5}, {2, 7}), req(1, 9, 2, {1}, {4}), req(13, 0, 3, {2}, {9, 11})};
  b.padding_rows = 2;
  return {a, b};
}

TEST(LayerHalves, WritesThenQueriesAreRunBitForBit) {
  for (const int ratio : {2, 1}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    LayerRun whole(ratio), halves(ratio);
    for (const StepBatch& b : steps(ratio)) {
      whole.prepare(b);
      halves.prepare(b);
      whole.layer->run(whole.meta, whole.in);
      const std::vector<uint8_t> outputs_before = halves.outputs();
      halves.layer->run_writes(halves.meta, halves.in);
      EXPECT_EQ(halves.outputs(), outputs_before) << "run_writes wrote an output";
      const std::vector<uint8_t> caches_written = halves.caches();
      LayerInputs no_score = halves.in;
      no_score.kv_score = {};  // run_queries does not read it
      halves.layer->run_queries(halves.meta, no_score, halves.meta.max_seq_len());
      EXPECT_EQ(halves.caches(), caches_written) << "run_queries wrote a cache";
      EXPECT_EQ(halves.caches(), whole.caches());
      EXPECT_EQ(halves.outputs(), whole.outputs());
      EXPECT_EQ(halves.layer->last_stats().checksum, whole.layer->last_stats().checksum);
      EXPECT_EQ(halves.layer->last_stats().swa_records, 0);
      EXPECT_GT(whole.layer->last_stats().swa_records, 0);
      EXPECT_EQ(halves.layer->last_stats().topk_entries, whole.layer->last_stats().topk_entries);
      EXPECT_GT(halves.layer->last_stats().topk_entries, 0);
    }
  }
}

// The shortcut (SPEC 8.6) follows the seq_len run_queries is given: a global step beyond 512
// entries per row scores, and over these short rows selects the same entries.
TEST(LayerHalves, RunQueriesDecidesTheShortcutByTheStepsSeqLen) {
  LayerRun a(2), b(2);
  const StepBatch s = steps(2)[0];
  for (LayerRun* l : {&a, &b}) {
    l->prepare(s);
    l->layer->run_writes(l->meta, l->in);
  }
  a.layer->run_queries(a.meta, a.in, a.meta.max_seq_len());
  b.layer->run_queries(b.meta, b.in, 2 * 513);
  EXPECT_TRUE(a.layer->last_stats().shortcut);
  EXPECT_FALSE(b.layer->last_stats().shortcut);
  EXPECT_EQ(a.outputs(), b.outputs());
}

TEST(LayerHalves, BadArgumentsAreE8BeforeAnyWrite) {
  LayerRun l(2);
  l.prepare(steps(2)[0]);
  l.layer->run_writes(l.meta, l.in);
  const std::vector<uint8_t> caches = l.caches(), outputs = l.outputs();
  expect_error([&] { l.layer->run_queries(l.meta, l.in, l.meta.max_seq_len() - 1); }, ErrorCode::kInvalidArgument,
               {"AttentionLayer::run_queries", "step_max_seq_len", "19", ">= the batch's 20"});
  LayerInputs no_kv = l.in;
  no_kv.kv = {};
  expect_error([&] { l.layer->run_queries(l.meta, no_kv, l.meta.max_seq_len()); }, ErrorCode::kInvalidArgument,
               {"AttentionLayer::run_queries", "in.kv"});
  LayerInputs no_q = l.in;
  no_q.q = {};
  expect_error([&] { l.layer->run_writes(l.meta, no_q); }, ErrorCode::kInvalidArgument,
               {"AttentionLayer::run_writes", "in.q"});
  LayerInputs no_score = l.in;
  no_score.kv_score = {};
  expect_error([&] { l.layer->run_writes(l.meta, no_score); }, ErrorCode::kInvalidArgument,
               {"AttentionLayer::run_writes", "in.kv_score"});
  expect_error([&] { l.layer->run(l.meta, no_score); }, ErrorCode::kInvalidArgument, {"AttentionLayer::run", "in.kv_score"});
  EXPECT_EQ(l.caches(), caches);
  EXPECT_EQ(l.outputs(), outputs);
}

}  // namespace
}  // namespace dsv41kv::test
