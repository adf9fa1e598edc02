// The whole layer of SPEC 9.8 (AttentionLayer) and the model driver (ModelRunner): every layer of
// the demo topology held against the dense binary64 attention over the key sets of SPEC 9.1
// rebuilt from its caches, on the scored and the shortcut path, with padded heads; bit-identical
// on any thread count; and every bad input an E8 before anything is written.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dsv41kv/attention_layer.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/model_demo.hpp"
#include "dsv41kv/model_runner.hpp"
#include "dsv41kv/read_path_check.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

using pipeline::AttentionLayer;
using pipeline::LayerInputs;
using pipeline::LayerShared;
using pipeline::LayerWeights;
using pipeline::ModelRunner;
using pipeline::ReadPathConfig;
using pipeline::ServingConfig;
using pipeline::StepBatch;
using pipeline::StepMetadata;

struct LayerSetup {
  oracles::ModelDemoConfig demo;
  ServingConfig sc;
  ReadPathConfig rc;
  explicit LayerSetup(double scale, int heads, int padded = 0, bool scored = false) {
    demo.workload = oracles::demo_read_workload(scale);
    demo.num_heads = heads;
    demo.seed = seed_for("AttentionLayer");
    sc = oracles::demo_serving_config(demo);
    rc = oracles::demo_read_config(demo);
    rc.padded_heads = padded;
    rc.capturing_cuda_graph = scored;  // never the shortcut: the scored top-k at short context
  }
};

// Runs the demo workload through a ModelRunner, checking every layer of every step against the
// dense reference; returns the outputs' checksum.
uint64_t run_and_check(const LayerSetup& s, int threads) {
  ServingConfig sc = s.sc;
  sc.exec.num_threads = threads;
  const ModelConfig& m = s.demo.model;
  ModelRunner runner(m, sc, s.rc, [&](const LayerInfo& li) { return LayerWeights::from_seed(li, s.rc.num_heads, 3); },
                     s.rc.max_model_len);
  oracles::SeededActivations act(11);
  uint64_t sum = 0;
  for (const oracles::DemoRequest& r : s.demo.workload.requests) runner.add_request(r.id, r.null_blocks);
  int checked = 0;
  for (const pipeline::EngineStep& st : s.demo.workload.steps) {
    runner.step(st, act, [&](const AttentionLayer& l) {
      const oracles::LayerCheck c = oracles::check_layer_dense(runner, l, {}, sc.exec);
      EXPECT_TRUE(c.out.pass) << "layer " << l.info().index << ": " << c.out.summary << " " << c.out.detail;
      EXPECT_TRUE(c.lse.pass) << "layer " << l.info().index << ": " << c.lse.summary << " " << c.lse.detail;
      sum = sum * 1099511628211ull ^ l.last_stats().checksum;
      ++checked;
    });
  }
  EXPECT_EQ(checked, m.num_layers() * static_cast<int>(s.demo.workload.steps.size()));
  return sum;
}

TEST(AttentionLayer, EveryLayerAgreesWithDenseAttentionOnTheScoredAndShortcutPaths) {
  const LayerSetup shortcut(0.12, 8);
  const uint64_t a = run_and_check(shortcut, 2);
  EXPECT_EQ(run_and_check(shortcut, 1), a);  // bit-identical on one thread
  run_and_check(LayerSetup(0.12, 8, 0, true), 2);
  run_and_check(LayerSetup(0.06, 16, 64, true), 2);  // padded heads: sink -inf, dropped by the inverse RoPE
}

// The dense check fails when it must: one output element moved far outside SPEC 9.7, one lse moved.
TEST(AttentionLayer, TheDenseCheckCatchesAWrongOutput) {
  const LayerSetup s(0.06, 8);
  ModelRunner runner(s.demo.model, s.sc, s.rc, [&](const LayerInfo& li) { return LayerWeights::from_seed(li, 8, 3); },
                     s.rc.max_model_len);
  oracles::SeededActivations act(5);
  for (const oracles::DemoRequest& r : s.demo.workload.requests) runner.add_request(r.id, r.null_blocks);
  int seen = 0;
  runner.step(s.demo.workload.steps[0], act, [&](const AttentionLayer& l) {
    EXPECT_TRUE(oracles::check_layer_dense(runner, l).pass());
    uint16_t* o = l.attention_out().ptr<uint16_t>();
    const uint16_t keep = o[3 * 512 + 7];
    o[3 * 512 + 7] = num::bf16_encode(num::bf16_decode(keep) + 0.5f);
    EXPECT_FALSE(oracles::check_layer_dense(runner, l).out.pass) << "layer " << l.info().index;
    o[3 * 512 + 7] = keep;
    float* lse = l.lse().ptr<float>();
    lse[5] += 0.01f;
    EXPECT_FALSE(oracles::check_layer_dense(runner, l).lse.pass) << "layer " << l.info().index;
    lse[5] -= 0.01f;
    ++seen;
  });
  EXPECT_EQ(seen, s.demo.model.num_layers());
}

// A layer stack built by hand, so that layers can run out of order.
struct Stack {
  LayerSetup s{0.06, 8};
  const ModelConfig& m = s.demo.model;
  LayerShared shared{s.sc, s.rc, m};
  std::vector<std::unique_ptr<AttentionLayer>> layers;
  StepMetadata meta{s.sc};
  std::vector<uint16_t> q, kv, iq, wr;
  std::vector<float> ks;
  Stack() {
    const RopeTable plain = rope_table_for_ratio(m, 0, s.rc.max_model_len), yarn = rope_table_for_ratio(m, 1, s.rc.max_model_len);
    for (int L = 0; L < m.num_layers(); ++L)
      layers.push_back(std::make_unique<AttentionLayer>(s.sc, s.rc, m, L, LayerWeights::from_seed(m.layer(L), 8, 1),
                                                        m.layer(L).ratio ? yarn : plain, shared));
    const auto T = static_cast<size_t>(s.sc.max_tokens);
    q.assign(T * 8 * 512, 0x3F80);
    kv.assign(T * 512, 0x3F80);
    iq.assign(T * 32 * 128, 0x3F80);
    wr.assign(T * 32, 0x3F80);
    ks.assign(T * 1024, 0.5f);
  }
  void build(int64_t len) {
    StepBatch b;
    pipeline::StepRequest r;
    r.query_len = len;
    r.swa_pages = {1, 2};
    r.c1a_pages = {1};
    r.c2a_pages = {1};
    r.ring_block = 1;
    b.requests = {r};
    meta.build(b);
  }
  LayerInputs inputs(int L) {
    const LayerInfo& li = m.layer(L);
    const int64_t N = meta.num_rows();
    LayerInputs in;
    in.q = TensorView::contiguous(q.data(), DType::BF16, {N, 8, 512});
    in.kv = TensorView::contiguous(kv.data(), DType::BF16, {N, 512});
    if (li.is_kv_source) in.kv_score = TensorView::contiguous(ks.data(), DType::F32, {N, 512 * li.ratio});
    if (li.is_index_source) {
      in.index_q = TensorView::contiguous(iq.data(), DType::BF16, {N, 32, 128});
      in.w_raw = TensorView::contiguous(wr.data(), DType::BF16, {N, 32});
    }
    return in;
  }
};

// The bytes a failed run must leave alone: the layer's SWA cache and outputs.
std::vector<uint8_t> snapshot(const AttentionLayer& l) {
  std::vector<uint8_t> b;
  auto add = [&](const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  };
  add(l.swa_cache().base, static_cast<size_t>(l.swa_cache().backing_bytes()));
  add(l.output().data, static_cast<size_t>(l.output().numel()) * 2);
  add(l.lse().data, static_cast<size_t>(l.lse().numel()) * 4);
  return b;
}

TEST(AttentionLayer, BadInputsAreE8BeforeAnyWrite) {
  Stack k;
  k.build(9);
  AttentionLayer& src = *k.layers[1];   // c2a kv + index source
  AttentionLayer& cons = *k.layers[2];  // its consumer
  AttentionLayer& swa = *k.layers[0];
  auto expect = [&](AttentionLayer& l, const LayerInputs& in, const std::vector<std::string>& parts) {
    const std::vector<uint8_t> before = snapshot(l);
    expect_error([&] { l.run(k.meta, in); }, ErrorCode::kInvalidArgument, parts);
    EXPECT_TRUE(snapshot(l) == before) << parts[0];
  };
  // a consumer whose kv source has not run on this step
  expect(cons, k.inputs(2), {"AttentionLayer::run: meta: layer 2 reads the caches of its kv source 1, which has not run"});
  LayerInputs in = k.inputs(0);
  in.q = TensorView::contiguous(k.q.data(), DType::BF16, {k.meta.num_rows(), 16, 256});
  expect(swa, in, {"in.q", "expected bf16 [>= N, H, 512]"});
  in = k.inputs(0);
  in.q.shape[0] = k.meta.num_rows() - 1;
  expect(swa, in, {"in.q", "N = 9"});
  in = k.inputs(0);
  in.kv = TensorView::contiguous(k.kv.data(), DType::F32, {k.meta.num_rows(), 512});
  expect(swa, in, {"in.kv"});
  in = k.inputs(1);
  in.kv_score = {};
  expect(src, in, {"in.kv_score", "absent"});
  in = k.inputs(0);
  in.kv_score = TensorView::contiguous(k.ks.data(), DType::F32, {k.meta.num_rows(), 512});
  expect(swa, in, {"in.kv_score: present, expected absent: the layer is not a kv source"});
  in = k.inputs(1);
  in.w_raw = {};
  expect(src, in, {"in.w_raw", "absent"});
  in = k.inputs(2);
  in.index_q = k.inputs(1).index_q;
  expect(cons, in, {"in.index_q: present, expected absent"});
  // the source runs; its consumer then runs; on the next step the consumer alone is stale
  src.run(k.meta, k.inputs(1));
  cons.run(k.meta, k.inputs(2));
  k.build(3);
  expect(cons, k.inputs(2), {"layer 2 reads the caches of its kv source 1, which has not run"});
  // metadata of another configuration
  ServingConfig other = k.s.sc;
  other.swa.num_pages += 1;
  StepMetadata m2(other);
  pipeline::StepBatch b;
  b.requests.resize(1);
  b.requests[0].query_len = 2;
  m2.build(b);
  {
    const std::vector<uint8_t> before = snapshot(swa);
    expect_error([&] { swa.run(m2, k.inputs(0)); }, ErrorCode::kInvalidArgument, {"meta: built for another configuration"});
    EXPECT_TRUE(snapshot(swa) == before);
  }
}

TEST(AttentionLayer, ConfigurationErrorsNameTheField) {
  LayerSetup s(0.06, 8);
  const ModelConfig& m = s.demo.model;
  auto bad_read = [&](auto edit, const char* what) {
    ReadPathConfig r = s.rc;
    edit(r);
    expect_error([&] { pipeline::validate(r); }, ErrorCode::kInvalidArgument, what);
  };
  bad_read([](ReadPathConfig& r) { r.num_heads = 12; }, "num_heads: 12, expected 8, 16, 32, 64 or 128");
  bad_read([](ReadPathConfig& r) { r.padded_heads = 32; }, "padded_heads: 32");
  bad_read([](ReadPathConfig& r) { r.swa_format = RecordFormat::NVFP4_288; }, "swa_format: nvfp4_288");
  bad_read([](ReadPathConfig& r) { r.index_k_format = IndexKFormat::MXFP4_68; }, "index_k_format: mxfp4_68");
  bad_read([](ReadPathConfig& r) { r.max_model_len = 0; }, "max_model_len: 0");
  bad_read([](ReadPathConfig& r) { r.eps = -1; }, "eps: -1");
  LayerShared shared(s.sc, s.rc, m);
  const RopeTable t = rope_table_for_ratio(m, 0, 64);
  ServingConfig sc = s.sc;
  if (!built_with_cuda()) {  // a CUDA build runs the layer on the device (tests/pipeline/*_gpu.cpp)
    sc.device = Device::CUDA;
    expect_error([&] { AttentionLayer(sc, s.rc, m, 0, LayerWeights::from_seed(m.layer(0), 8, 1), t, shared); },
                 ErrorCode::kInvalidArgument, "built without CUDA");
  }
  sc = s.sc;
  sc.num_speculative_tokens = 6;
  expect_error([&] { AttentionLayer(sc, s.rc, m, 0, LayerWeights::from_seed(m.layer(0), 8, 1), t, shared); },
               ErrorCode::kInvalidArgument, "num_speculative_tokens: 6, expected <= 5");
  LayerWeights w = LayerWeights::from_seed(m.layer(1), 8, 1);
  w.wk.pop_back();
  expect_error([&] { AttentionLayer(s.sc, s.rc, m, 1, w, t, shared); }, ErrorCode::kInvalidArgument,
               "weights.wk: 65535 entries, expected 65536");
  w = LayerWeights::from_seed(m.layer(0), 8, 1);
  w.attn_sink[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { AttentionLayer(s.sc, s.rc, m, 0, w, t, shared); }, ErrorCode::kInvalidArgument,
               "weights.attn_sink: NaN at head 3");
  AttentionLayer first(s.sc, s.rc, m, 0, LayerWeights::from_seed(m.layer(0), 8, 1), t, shared);
  expect_error([&] { AttentionLayer(s.sc, s.rc, m, 0, LayerWeights::from_seed(m.layer(0), 8, 1), t, shared); },
               ErrorCode::kInvalidArgument, "shared: already holds a layer 0");
}

}  // namespace
}  // namespace dsv41kv::test

namespace dsv41kv::test {
namespace {

// An empty request among the prefills (query_len 0: nothing to attend, nothing to gather) changes
// nothing for the others: the same outputs bit for bit as without it.
TEST(AttentionLayer, AnEmptyRequestAmongThePrefillsChangesNothing) {
  const LayerSetup s(0.06, 8, 0, true);
  auto run = [&](bool with_empty) {
    ModelRunner runner(s.demo.model, s.sc, s.rc, [&](const LayerInfo& li) { return LayerWeights::from_seed(li, 8, 3); },
                       s.rc.max_model_len);
    oracles::SeededActivations act(9);
    runner.add_request(0);
    runner.add_request(1);
    runner.add_request(2);
    pipeline::EngineStep st;
    st.requests = {{0, 20}};
    if (with_empty) st.requests.push_back({2, 0});
    st.requests.push_back({1, 13});
    std::vector<uint16_t> out;
    runner.step(st, act, [&](const AttentionLayer& l) {
      const auto* o = l.output().ptr<const uint16_t>();
      out.insert(out.end(), o, o + 33 * 8 * 512);
    });
    return out;
  };
  EXPECT_TRUE(run(true) == run(false));
}

}  // namespace
}  // namespace dsv41kv::test
