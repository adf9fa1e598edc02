// The whole read path on the GPU (AttentionLayer on CUDA, SPEC 9.8) against the CPU backend and
// the dense binary64 check, on the demo topology:
//   - every layer of every step of the demo workload: the metadata bit for bit, the caches (SWA,
//     compressed, index-K, ring) bit for bit, the top-k as sets, the outputs and lse within SPEC
//     9.7 of the CPU's, the dense check of SPEC 9.2 on the GPU's own key sets, nothing written
//     past the step's rows;
//   - decode requests of 6 query tokens (MTP; vLLM #43457) through the indexer and the decode
//     attention, uniform and mixed;
//   - one decode step captured in a CUDA graph with a padding row at index == batch size (vLLM
//     #51181): replays are bit-identical to eager execution, nothing past the batch is written,
//     and the inputs hold exactly the batch's rows (compute-sanitizer memcheck sees any read
//     past them);
//   - a sparse prefill at 160K context (vLLM #52339: FlashMLA's prefill crashed at 161K) with the
//     dense check on sampled rows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/model_demo.hpp"
#include "pipeline/read_stack_gpu.hpp"

namespace dsv41kv::test {
namespace {

using pipeline::AttentionLayer;
using pipeline::EngineStep;

constexpr uint8_t kCanaryByte = 0xA5;

class ReadPathGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// The serving and read configurations of a workload (pools sized by its requests).
struct StackConfig {
  oracles::ModelDemoConfig demo;
  pipeline::ServingConfig sc;
  pipeline::ReadPathConfig rc;
  StackConfig(const oracles::DemoWorkload& w, int heads, int padded, bool scored, const ModelConfig& m) {
    demo.model = m;
    demo.workload = w;
    demo.num_heads = heads;
    demo.threads = 0;
    sc = oracles::demo_serving_config(demo);
    rc = oracles::demo_read_config(demo);
    rc.padded_heads = padded;
    rc.capturing_cuda_graph = scored;  // the scored top-k even at short context (SPEC 8.6)
  }
};

oracles::DemoWorkload workload(std::vector<EngineStep> steps, int64_t num_spec) {
  oracles::DemoWorkload w;
  w.steps = std::move(steps);
  w.num_speculative_tokens = num_spec;
  std::map<int64_t, int64_t> len;
  for (const EngineStep& s : w.steps)
    for (const pipeline::RequestStep& r : s.requests) len[r.id] += r.query_len;
  for (const auto& [id, n] : len) w.requests.push_back({id, n, false});
  return w;
}

// Every byte of the GPU layer's outputs set to the canary before its step.
void poison_outputs(const AttentionLayer& l, cudaStream_t s) {
  for (const TensorView& v : {l.output(), l.attention_out(), l.lse()})
    ASSERT_EQ(cudaMemsetAsync(v.data, kCanaryByte, static_cast<size_t>(v.numel()) * dtype_size(v.dtype), s), cudaSuccess);
}

// Rows [N, max_tokens) of every output still the canary.
void expect_untouched_past(const AttentionLayer& l, int64_t N, cudaStream_t s) {
  for (const TensorView& v : {l.output(), l.attention_out(), l.lse()}) {
    const std::vector<uint8_t> b = bytes_of(v, s);
    const size_t row = b.size() / static_cast<size_t>(v.shape[0]);
    const auto first = std::find_if(b.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(N) * row), b.end(),
                                    [](uint8_t x) { return x != kCanaryByte; });
    EXPECT_TRUE(first == b.end()) << "layer " << l.info().index << ": a row past N = " << N << " was written (byte "
                                  << (first - b.begin()) << " of " << b.size() << ")";
  }
}

std::vector<uint8_t> host_bytes(const TensorView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return {p, p + static_cast<size_t>(v.numel()) * dtype_size(v.dtype)};
}

// The metadata both sides built for the step, bit for bit (the window rows of the decode tokens,
// every length, the validity, the slots).
void expect_same_metadata(StackSide& g, StackSide& c, cudaStream_t s) {
  const pipeline::StepMetadata& gm = *g.meta;
  const pipeline::StepMetadata& cm = *c.meta;
  const int64_t T = cm.split().num_decode_tokens;
  EXPECT_EQ(gm.split().num_decode_tokens, T);
  EXPECT_EQ(gm.decode_s_q(), cm.decode_s_q());
  const auto window_rows = [&](const pipeline::StepMetadata& m) {
    TensorView v = m.swa_window();
    v.shape[0] = T;
    return v;
  };
  EXPECT_TRUE(bits_equal(host_bytes(window_rows(cm)), bytes_of(window_rows(gm), s), "swa_window rows"));
  EXPECT_TRUE(bits_equal(host_bytes(cm.swa_window_lens()), bytes_of(gm.swa_window_lens(), s), "swa_window_lens"));
  EXPECT_TRUE(bits_equal(host_bytes(cm.token_valid()), bytes_of(gm.token_valid(), s), "token_valid"));
  EXPECT_TRUE(bits_equal(host_bytes(cm.swa_slots()), bytes_of(gm.swa_slots(), s), "swa_slots"));
  if (cm.split().num_prefills > 0) {
    EXPECT_TRUE(bits_equal(host_bytes(cm.gather_lens()), bytes_of(gm.gather_lens(), s), "gather_lens"));
    EXPECT_TRUE(bits_equal(host_bytes(cm.gather_starts()), bytes_of(gm.gather_starts(), s), "gather_starts"));
  }
}

// Layer L right after both sides ran it: the top-k as sets (index sources), outputs and lse within
// SPEC 9.7 of the CPU's, the dense check of the GPU's own key sets (every third row), nothing past
// N written.
void expect_layer_agrees(ReadStack& st, int L, cudaStream_t s, const std::string& where) {
  StackSide& g = st.gpu();
  StackSide& c = *st.cpu();
  const AttentionLayer& gl = *g.layers[static_cast<size_t>(L)];
  const AttentionLayer& cl = *c.layers[static_cast<size_t>(L)];
  const LayerInfo& li = gl.info();
  const int64_t N = st.rows(), A = static_cast<int64_t>(st.tokens().size());
  SCOPED_TRACE(where + ", layer " + std::to_string(L));
  if (li.is_index_source) {
    const std::vector<uint8_t> gt = bytes_of(g.shared->topk(), s);
    const auto* gk = reinterpret_cast<const int32_t*>(gt.data());
    const auto* ck = c.shared->topk().ptr<const int32_t>();
    const auto* pos = c.meta->positions().ptr<const int64_t>();
    const auto* valid = c.meta->token_valid().ptr<const int32_t>();
    int64_t bad = 0;
    for (int64_t t = 0; t < A; ++t) {
      if (!valid[t]) continue;
      const int64_t k = std::min<int64_t>(closed_groups(pos[t] + 1, int64_t{li.ratio}), kIndexTopk);
      std::vector<int32_t> a(gk + t * kIndexTopk, gk + t * kIndexTopk + k), b(ck + t * kIndexTopk, ck + t * kIndexTopk + k);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      bad += a != b;
    }
    EXPECT_EQ(bad, 0) << "tokens whose top-k set differs from the CPU's";
  }
  const int H = static_cast<int>(gl.output().shape[1]), Hp = static_cast<int>(gl.lse().shape[1]);
  TensorView go = gl.output(), gs = gl.lse();
  go.shape[0] = N;
  gs.shape[0] = N;
  const std::vector<uint8_t> ob = bytes_of(go, s), lb = bytes_of(gs, s);
  const conformance::ReadCheck out = oracles::compare_layer_rows(reinterpret_cast<const uint16_t*>(ob.data()),
                                                                 cl.output().ptr<const uint16_t>(), N, H);
  EXPECT_TRUE(out.pass) << out.summary << " " << out.detail;
  std::vector<double> ref(static_cast<size_t>(N * Hp));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = cl.lse().ptr<const float>()[i];
  const conformance::ReadCheck lse =
      conformance::check_attention_lse(reinterpret_cast<const float*>(lb.data()), ref.data(), N * Hp);
  EXPECT_TRUE(lse.pass) << lse.summary << " " << lse.detail;
  std::vector<int64_t> rows;  // every third real row and the last (the binary64 reference is scalar)
  for (int64_t t = 0; t < A; t += 3) rows.push_back(t);
  if (A > 0 && rows.back() != A - 1) rows.push_back(A - 1);
  const oracles::LayerCheck dense =
      rows.empty() ? oracles::LayerCheck{} : oracles::check_layer_dense(*g.meta, *g.shared, gl, rows, ExecContext{s});
  EXPECT_TRUE(rows.empty() || dense.pass()) << "dense: " << dense.out.summary << " " << dense.out.detail << " / " << dense.lse.summary;
  expect_untouched_past(gl, N, s);
}

// Every cache of every layer (and the rings) bit for bit on both sides.
void expect_same_caches(ReadStack& st, cudaStream_t s, const std::string& where) {
  StackSide& g = st.gpu();
  StackSide& c = *st.cpu();
  for (size_t L = 0; L < g.layers.size(); ++L) {
    SCOPED_TRACE(where + ", layer " + std::to_string(L));
    const AttentionLayer& gl = *g.layers[L];
    const AttentionLayer& cl = *c.layers[L];
    const auto cache = [&](const void* gb, const void* cb, size_t n, const char* what) {
      EXPECT_TRUE(bits_equal(bytes_of(cb, n, Device::CPU, s), bytes_of(gb, n, Device::CUDA, s), what));
    };
    cache(gl.swa_cache().base, cl.swa_cache().base, gl.swa_cache().backing_bytes(), "SWA cache");
    if (!gl.info().is_kv_source) continue;
    cache(gl.compressed_cache().base, cl.compressed_cache().base, gl.compressed_cache().backing_bytes(),
          "compressed cache");
    cache(gl.index_k_cache().base, cl.index_k_cache().base, gl.index_k_cache().backing_bytes(), "index-K cache");
    if (gl.info().ratio == 2) {
      EXPECT_TRUE(bits_equal(host_bytes(cl.ring()), bytes_of(gl.ring(), s), "ring"));
    }
  }
}

// Runs the workload on both sides in lockstep with every check above.
void run_lockstep(ReadStack& st, const oracles::DemoWorkload& w, cudaStream_t s) {
  for (const oracles::DemoRequest& r : w.requests) st.add(r.id, r.null_blocks);
  const std::vector<EngineStep>& steps = w.steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string where = "step " + std::to_string(i);
    st.prepare(steps[i]);
    expect_same_metadata(st.gpu(), *st.cpu(), s);
    for (int L = 0; L < st.model().num_layers(); ++L) {
      poison_outputs(*st.gpu().layers[static_cast<size_t>(L)], s);
      st.run_cpu(L);
      st.run_gpu(L);
      expect_layer_agrees(st, L, s, where);
    }
    expect_same_caches(st, s, where);
  }
}

TEST_F(ReadPathGpu, LayersMatchTheCpuAndTheDenseCheck) {
  struct Variant {
    int heads, padded;
    bool scored;
  };
  for (const Variant v : {Variant{8, 0, false}, Variant{16, 64, true}}) {
    SCOPED_TRACE("heads " + std::to_string(v.heads) + ", padded " + std::to_string(v.padded) +
                 (v.scored ? ", scored" : ", shortcut"));
    const oracles::DemoWorkload w = oracles::demo_read_workload(0.12);
    StackConfig s(w, v.heads, v.padded, v.scored, oracles::v41_demo_topology());
    ReadStack st(s.demo.model, s.sc, s.rc, stream_, true, s.rc.max_model_len + 1, seed());
    run_lockstep(st, w, stream_);
  }
}

// MTP: decode requests of up to 6 query tokens (num_speculative_tokens 5), uniform (s_q 6) and
// mixed (s_q 1), with padding rows, through the indexer and the decode attention.
TEST_F(ReadPathGpu, SixQueryTokensPerDecodeRequest) {
  const std::vector<EngineStep> steps = {
      EngineStep{{{0, 70}, {1, 45}, {2, 130}, {3, 9}}, 0},
      EngineStep{{{0, 6}, {1, 6}, {2, 6}, {3, 6}}, 2},
      EngineStep{{{0, 3}, {1, 6}, {2, 1}, {3, 5}}, 1},
      EngineStep{{{0, 6}, {1, 6}, {2, 6}, {3, 6}, }, 0},
  };
  for (bool scored : {false, true}) {
    SCOPED_TRACE(scored ? "scored" : "shortcut");
    StackConfig s(workload(steps, 5), 16, 0, scored, oracles::v41_demo_topology());
    ReadStack st(s.demo.model, s.sc, s.rc, stream_, true, s.rc.max_model_len + 1, seed());
    run_lockstep(st, s.demo.workload, stream_);
  }
}

// Every byte a step's layers leave behind: outputs (whole buffers), caches, rings, the shared
// top-k and candidates.
std::vector<std::vector<uint8_t>> step_state(StackSide& g, cudaStream_t s) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& lp : g.layers) {
    const AttentionLayer& l = *lp;
    for (const TensorView& v : {l.output(), l.attention_out(), l.lse()}) out.push_back(bytes_of(v, s));
    out.push_back(bytes_of(l.swa_cache().base, l.swa_cache().backing_bytes(), Device::CUDA, s));
    if (l.info().is_kv_source) {
      out.push_back(bytes_of(l.compressed_cache().base, l.compressed_cache().backing_bytes(), Device::CUDA, s));
      out.push_back(bytes_of(l.index_k_cache().base, l.index_k_cache().backing_bytes(), Device::CUDA, s));
      if (l.info().ratio == 2) out.push_back(bytes_of(l.ring(), s));
    }
  }
  out.push_back(bytes_of(g.shared->topk(), s));
  out.push_back(bytes_of(g.shared->candidates(), s));
  return out;
}

// SPEC 9.8: one decode step of every layer captured in a CUDA graph replays bit for bit what the
// eager step computed. The step has a padding row at index A == the batch's token count (vLLM
// #51181's q_idx == batch_size), the inputs hold exactly its N rows, and rows past N of every
// output keep their canary.
TEST_F(ReadPathGpu, DecodeStepGraphReplayIsBitIdentical) {
  const std::vector<EngineStep> steps = {
      EngineStep{{{0, 300}, {1, 200}, {2, 5}}, 0},
      EngineStep{{{0, 2}, {1, 2}, {2, 2}}, 1},
  };
  StackConfig s(workload(steps, 1), 16, 0, true, oracles::v41_demo_topology());
  ReadStack st(s.demo.model, s.sc, s.rc, stream_, false, s.rc.max_model_len + 1, seed());
  for (const auto& r : steps[0].requests) st.add(r.id);
  st.prepare(steps[0]);
  for (int L = 0; L < st.model().num_layers(); ++L) st.run_gpu(L);
  st.prepare(steps[1]);
  StackSide& g = st.gpu();
  const int64_t N = st.rows(), A = static_cast<int64_t>(st.tokens().size());
  ASSERT_EQ(A, 6);
  ASSERT_EQ(N, 7);
  ASSERT_EQ(g.meta->split().num_decode_tokens, A);
  ASSERT_EQ(g.meta->split().num_prefills, 0);
  const auto poison = [&] {
    for (const auto& l : g.layers) poison_outputs(*l, stream_);
  };
  const auto run_all = [&] {
    for (int L = 0; L < st.model().num_layers(); ++L) st.run_gpu(L);
  };
  poison();
  run_all();
  const std::vector<std::vector<uint8_t>> eager = step_state(g, stream_);
  for (const auto& l : g.layers) expect_untouched_past(*l, N, stream_);

  poison();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run_all();
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_GT(nodes, static_cast<size_t>(st.model().num_layers()));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<std::vector<uint8_t>> got = step_state(g, stream_);
    ASSERT_EQ(got.size(), eager.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bits_equal(eager[i], got[i], "state " + std::to_string(i)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A sparse prefill at 160K context (vLLM #52339): a request whose first 163840 tokens were written
// (run_writes, in chunks) attends a chunk of 64 more through the workspace gather of SPEC 9.5 on a
// c2a and a c1a layer (n_c 81920 and 163840: the scored top-k), checked on sampled rows against
// the dense binary64 reference over the key sets the GPU used.
TEST_F(ReadPathGpu, PrefillAt160KContext) {
  ModelConfig m = deepseek_v41_flash();
  m.num_hidden_layers = 3;
  m.num_nextn_predict_layers = 0;
  m.compress_ratios = {0, 2, 1};
  m.kv_source_layer_ids = {1, 2};
  m.index_source_layer_ids = {1, 2};
  m.candidate_source_layer_id = -1;
  m.layers.clear();
  finalize_topology(m, "the 160K test topology");
  constexpr int64_t kPrefix = 163840, kChunk = 8192, kQuery = 64;
  std::vector<EngineStep> steps;
  for (int64_t p = 0; p < kPrefix; p += kChunk) steps.push_back(EngineStep{{{0, kChunk}}, 0});
  steps.push_back(EngineStep{{{0, kQuery}}, 0});
  StackConfig s(workload(steps, 1), 8, 0, false, m);
  ReadStack st(m, s.sc, s.rc, stream_, false, kPrefix + kQuery + 1, seed());
  st.use_fixed_pool(seed());
  st.add(0);
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    st.prepare(steps[i]);
    for (int L = 0; L < m.num_layers(); ++L) st.run_gpu(L, /*writes_only=*/true);
  }
  st.prepare(steps.back());
  StackSide& g = st.gpu();
  ASSERT_EQ(g.meta->max_seq_len(), kPrefix + kQuery);
  ASSERT_EQ(g.meta->split().num_prefill_tokens, kQuery);
  const std::vector<int64_t> rows = {0, 9, 18, 27, 36, 45, 54, 63};
  for (int L = 0; L < m.num_layers(); ++L) {
    SCOPED_TRACE("layer " + std::to_string(L));
    poison_outputs(*g.layers[static_cast<size_t>(L)], stream_);
    st.run_gpu(L);
    EXPECT_FALSE(g.layers[static_cast<size_t>(L)]->last_stats().shortcut);
    const oracles::LayerCheck c = oracles::check_layer_dense(*g.meta, *g.shared, *g.layers[static_cast<size_t>(L)], rows,
                                                             ExecContext{stream_});
    EXPECT_TRUE(c.pass()) << c.out.summary << " " << c.out.detail << " / " << c.lse.summary << " " << c.lse.detail;
    expect_untouched_past(*g.layers[static_cast<size_t>(L)], st.rows(), stream_);
  }
}

}  // namespace
}  // namespace dsv41kv::test
