// The main job's read-path workload and its verification (model_demo.hpp).
#include "dsv41kv/model_demo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "core/host_copy.hpp"

namespace dsv41kv::oracles {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

}  // namespace

ModelConfig v41_demo_topology() {
  ModelConfig c = deepseek_v41_flash();
  c.num_hidden_layers = 8;
  c.num_nextn_predict_layers = 0;
  c.compress_ratios = {0, 2, 2, 1, 1, 1, 1, 0};
  c.kv_source_layer_ids = {1, 3};
  c.index_source_layer_ids = {1, 3, 5};
  c.candidate_source_layer_id = 3;
  c.layers.clear();
  finalize_topology(c, "the demo topology");
  return c;
}

int64_t DemoWorkload::max_step_rows() const {
  int64_t m = 0;
  for (const pipeline::EngineStep& s : steps) {
    int64_t n = s.padding_rows;
    for (const pipeline::RequestStep& r : s.requests) n += r.query_len;
    m = std::max(m, n);
  }
  return m;
}

DemoWorkload demo_read_workload(double scale) {
  auto sz = [&](int64_t n, int64_t lo) { return std::max<int64_t>(lo, std::llround(static_cast<double>(n) * scale)); };
  const int64_t c0 = sz(400, 2) / 2 * 2;   // the long prompt's chunks: even starts 0, c0, 2 c0
  const int64_t c2 = sz(300, 1);
  const int64_t b0 = sz(151, 3) | 1;       // the second prompt's first chunk: its second starts odd
  const int64_t b1 = sz(150, 1);
  const int64_t p2 = sz(64, 1), p3 = sz(20, 2);
  DemoWorkload w;
  w.num_speculative_tokens = 1;  // decodes of 1 or 2 query tokens
  using pipeline::EngineStep;
  w.steps.push_back(EngineStep{{{0, c0}, {1, b0}, {3, p3}}, 0});
  w.steps.push_back(EngineStep{{{0, c0}, {1, b1}, {2, p2}}, 0});
  w.steps.push_back(EngineStep{{{1, 1}, {2, 1}, {3, 1}, {0, c2}}, 1});      // decodes s_q 1, then a prefill chunk
  w.steps.push_back(EngineStep{{{0, 2}, {1, 2}, {2, 2}, {3, 2}}, 0});       // decodes s_q 2
  w.steps.push_back(EngineStep{{{0, 1}, {1, 1}, {2, 1}, {3, 1}}, 1});       // decodes s_q 1, a padded row
  w.steps.push_back(EngineStep{{{0, 2}, {1, 1}, {3, 1}}, 0});               // mixed decodes: s_q 1
  std::map<int64_t, int64_t> len;
  for (const EngineStep& s : w.steps)
    for (const pipeline::RequestStep& r : s.requests) len[r.id] += r.query_len;
  for (const auto& [id, n] : len) w.requests.push_back({id, n, id == 3});
  return w;
}

pipeline::ServingConfig demo_serving_config(const ModelDemoConfig& c) {
  pipeline::ServingConfig s;
  s.device = c.device;
  s.exec.stream = c.device == Device::CPU ? nullptr : c.stream;
  s.exec.num_threads = c.threads;
  s.max_tokens = std::max<int64_t>(c.workload.max_step_rows(), 1);
  s.max_requests = std::max<int64_t>(static_cast<int64_t>(c.workload.requests.size()), 1);
  s.num_speculative_tokens = c.workload.num_speculative_tokens;
  int64_t max_len = 1, swa = 1, c1 = 1, c2 = 1;
  for (const DemoRequest& r : c.workload.requests) {
    max_len = std::max(max_len, r.length);
    swa += ceil_div(r.length, 32) + 1;
    c1 += ceil_div(r.length, 64) + 1;
    c2 += ceil_div(r.length, 64) + 1;
  }
  s.swa = {32, swa, ceil_div(max_len, 32) + 1};
  if (c.model.has_ratio(1)) s.c1a = {64, c1, ceil_div(max_len, 64) + 1};
  if (c.model.has_ratio(2)) s.c2a = {32, c2, ceil_div(max_len, 64) + 1};
  s.ring_blocks = s.max_requests + 1;
  s.formats = {c.compressed_format};
  s.fp8_scale = 0.5f;
  return s;
}

pipeline::ReadPathConfig demo_read_config(const ModelDemoConfig& c) {
  pipeline::ReadPathConfig r;
  r.swa_format = c.swa_format;
  r.compressed_format = c.compressed_format;
  r.num_heads = c.num_heads;
  r.eps = static_cast<float>(c.model.rms_norm_eps);
  int64_t max_len = 1;
  for (const DemoRequest& q : c.workload.requests) max_len = std::max(max_len, q.length);
  r.max_model_len = max_len;
  r.device_stats = c.device != Device::CPU;
  return r;
}

ModelDemoReport run_model_demo(const ModelDemoConfig& c, const std::function<void(const DemoStepReport&)>& on_step,
                               const std::function<void(const pipeline::ModelRunner&, const pipeline::AttentionLayer&)>&
                                   after_layer) {
  const pipeline::ServingConfig sc = demo_serving_config(c);
  const pipeline::ReadPathConfig rc = demo_read_config(c);
  const st::SafetensorsFile weights =
      c.weights_path.empty() ? st::SafetensorsFile{} : st::SafetensorsFile::load(c.weights_path);
  pipeline::ModelRunner runner(
      c.model, sc, rc,
      [&](const LayerInfo& li) {
        return c.weights_path.empty() ? pipeline::LayerWeights::from_seed(li, c.num_heads, c.seed)
                                      : pipeline::LayerWeights::from_safetensors(weights, li, c.num_heads);
      },
      rc.max_model_len);
  SeededActivations act(c.seed);
  std::map<int64_t, size_t> last_step;
  for (size_t i = 0; i < c.workload.steps.size(); ++i)
    for (const pipeline::RequestStep& r : c.workload.steps[i].requests) last_step[r.id] = i;
  ModelDemoReport rep;
  rep.checksum = 1469598103934665603ull;
  for (int L = 0; L < c.model.num_layers(); ++L) ++rep.layers_per_type[c.model.layer(L).ratio];
  for (size_t i = 0; i < c.workload.steps.size(); ++i) {
    const pipeline::EngineStep& st = c.workload.steps[i];
    for (const pipeline::RequestStep& r : st.requests)
      if (!runner.live(r.id)) {
        const auto it = std::find_if(c.workload.requests.begin(), c.workload.requests.end(),
                                     [&](const DemoRequest& d) { return d.id == r.id; });
        runner.add_request(r.id, it != c.workload.requests.end() && it->null_blocks);
      }
    const auto t0 = std::chrono::steady_clock::now();
    runner.step(st, act, [&](const pipeline::AttentionLayer& l) {
      if (after_layer) after_layer(runner, l);
    });
    DemoStepReport s;
    s.step = i;
    s.requests = static_cast<int64_t>(st.requests.size());
    s.tokens = runner.metadata().num_tokens();
    s.padding_rows = st.padding_rows;
    s.decode_tokens = runner.metadata().split().num_decode_tokens;
    s.prefill_tokens = runner.metadata().split().num_prefill_tokens;
    s.max_seq_len = runner.metadata().max_seq_len();
    for (int L = 0; L < runner.num_layers(); ++L) {
      const pipeline::LayerStepStats& ls = runner.layer(L).last_stats();
      s.layers.push_back(ls);
      rep.ms_per_type[runner.layer(L).info().ratio] += ls.ms;
      rep.checksum = mix(rep.checksum, ls.checksum);
    }
    s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    rep.tokens += s.tokens;
    for (const pipeline::RequestStep& r : st.requests)
      if (last_step[r.id] == i) runner.finish_request(r.id);
    if (on_step) on_step(s);
    rep.steps.push_back(std::move(s));
  }
  return rep;
}

int64_t VerifyReport::failed() const {
  int64_t n = 0;
  for (const VerifyLine& l : lines) n += !l.pass;
  return n;
}

namespace {

// Running totals of the dense checks of one run.
struct DenseTotals {
  int64_t rows = 0, failed_layers = 0;
  std::string first_bad;
  void add(const LayerCheck& c, int layer) {
    rows += c.rows;
    if (!c.pass()) {
      ++failed_layers;
      if (first_bad.empty())
        first_bad = fmt::format("layer {}: {} {}", layer, c.out.pass ? c.lse.detail : c.out.detail,
                                c.out.pass ? c.lse.summary : c.out.summary);
    }
  }
  VerifyLine line(const std::string& what) const {
    return {what, failed_layers == 0 && rows > 0,
            failed_layers == 0 ? fmt::format("{} token rows x heads within SPEC 9.7 of binary64", rows) : first_bad};
  }
};

std::vector<int64_t> sampled_rows(int64_t n, int64_t stride) {
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < n; t += stride) rows.push_back(t);
  if (n > 0 && rows.back() != n - 1) rows.push_back(n - 1);
  return rows;
}

// (3) of verify_model_demo on CUDA: the workload on the device and on the CPU in lockstep, every
// layer's outputs and lse (9.7) and every cache bit for bit after every step.
VerifyLine verify_device_vs_cpu(const ModelDemoConfig& c, const ExecContext& ctx) {
  ModelDemoConfig h = c;
  h.device = Device::CPU;
  h.stream = nullptr;
  const auto runner = [&](const ModelDemoConfig& d) {
    const pipeline::ServingConfig sc = demo_serving_config(d);
    return std::make_unique<pipeline::ModelRunner>(
        d.model, sc, demo_read_config(d),
        [&](const LayerInfo& li) { return pipeline::LayerWeights::from_seed(li, d.num_heads, d.seed); },
        demo_read_config(d).max_model_len);
  };
  if (!c.weights_path.empty())
    return {"workload on the GPU vs the CPU", true, "skipped: seeded weights only (--weights given)"};
  const std::unique_ptr<pipeline::ModelRunner> gpu = runner(c), cpu = runner(h);
  SeededActivations act_g(c.seed), act_c(c.seed);
  std::map<int64_t, size_t> last_step;
  for (size_t i = 0; i < c.workload.steps.size(); ++i)
    for (const pipeline::RequestStep& r : c.workload.steps[i].requests) last_step[r.id] = i;
  int64_t compared = 0;
  const auto bytes = [&](const void* p, size_t n, Device d) {
    const detail::HostCopy hc(TensorView::contiguous(const_cast<void*>(p), DType::U8, {static_cast<int64_t>(n)}, d), ctx);
    return std::vector<uint8_t>(hc.as<uint8_t>(), hc.as<uint8_t>() + n);
  };
  for (size_t i = 0; i < c.workload.steps.size(); ++i) {
    const pipeline::EngineStep& st = c.workload.steps[i];
    for (const pipeline::RequestStep& r : st.requests)
      if (!gpu->live(r.id)) {
        const auto it = std::find_if(c.workload.requests.begin(), c.workload.requests.end(),
                                     [&](const DemoRequest& d) { return d.id == r.id; });
        const bool null_blocks = it != c.workload.requests.end() && it->null_blocks;
        gpu->add_request(r.id, null_blocks);
        cpu->add_request(r.id, null_blocks);
      }
    gpu->step(st, act_g);
    cpu->step(st, act_c);
    const int64_t N = gpu->metadata().num_rows();
    for (int L = 0; L < gpu->num_layers(); ++L) {
      const pipeline::AttentionLayer& g = gpu->layer(L);
      const pipeline::AttentionLayer& k = cpu->layer(L);
      const auto fail = [&](const std::string& what) {
        return VerifyLine{"workload on the GPU vs the CPU", false, fmt::format("step {}, layer {}: {}", i, L, what)};
      };
      const int H = static_cast<int>(g.output().shape[1]), Hp = static_cast<int>(g.lse().shape[1]);
      const size_t ob = static_cast<size_t>(N) * static_cast<size_t>(H) * kLatentDim * 2;
      const size_t lb = static_cast<size_t>(N) * static_cast<size_t>(Hp) * 4;
      const std::vector<uint8_t> go = bytes(g.output().data, ob, Device::CUDA), ko = bytes(k.output().data, ob, Device::CPU);
      const conformance::ReadCheck o = compare_layer_rows(reinterpret_cast<const uint16_t*>(go.data()),
                                                          reinterpret_cast<const uint16_t*>(ko.data()), N, H);
      if (!o.pass) return fail("outputs: " + o.summary + " " + o.detail);
      const std::vector<uint8_t> gl = bytes(g.lse().data, lb, Device::CUDA), kl = bytes(k.lse().data, lb, Device::CPU);
      std::vector<double> ref(static_cast<size_t>(N * Hp));
      for (size_t e = 0; e < ref.size(); ++e) ref[e] = reinterpret_cast<const float*>(kl.data())[e];
      const conformance::ReadCheck l = conformance::check_attention_lse(reinterpret_cast<const float*>(gl.data()),
                                                                        ref.data(), N * Hp);
      if (!l.pass) return fail("lse: " + l.summary + " " + l.detail);
      const auto same = [&](const void* gp, const void* kp, size_t n) {
        return bytes(gp, n, Device::CUDA) == bytes(kp, n, Device::CPU);
      };
      if (!same(g.swa_cache().base, k.swa_cache().base, g.swa_cache().backing_bytes())) return fail("SWA cache bytes");
      if (g.info().is_kv_source) {
        if (!same(g.compressed_cache().base, k.compressed_cache().base, g.compressed_cache().backing_bytes()))
          return fail("compressed cache bytes");
        if (!same(g.index_k_cache().base, k.index_k_cache().base, g.index_k_cache().backing_bytes()))
          return fail("index-K cache bytes");
        if (g.info().ratio == 2) {
          const TensorView gr = g.ring(), kr = k.ring();
          if (!same(gr.data, kr.data, static_cast<size_t>(gr.numel()) * 4)) return fail("ring bytes");
        }
      }
      ++compared;
    }
    for (const pipeline::RequestStep& r : st.requests)
      if (last_step[r.id] == i) {
        gpu->finish_request(r.id);
        cpu->finish_request(r.id);
      }
  }
  return {"workload on the GPU vs the CPU", compared > 0,
          fmt::format("{} steps x layers: outputs and lse within SPEC 9.7, caches and rings bit for bit", compared)};
}

}  // namespace

VerifyReport verify_model_demo(const ModelDemoConfig& c, int64_t dense_stride,
                               const std::function<void(const VerifyLine&)>& on_line) {
  VerifyReport rep;
  auto emit = [&](VerifyLine l) {
    if (on_line) on_line(l);
    rep.lines.push_back(std::move(l));
  };
  const int H = c.num_heads;
  const size_t row_elems = static_cast<size_t>(H) * kLatentDim;
  const int NL = c.model.num_layers();
  const ExecContext ctx{c.device == Device::CPU ? nullptr : c.stream, c.threads};
  // the first n output rows of a layer on the host (read back from a device)
  const auto output_rows = [&](const pipeline::AttentionLayer& l, int64_t n) {
    TensorView v = l.output();
    v.shape[0] = n;
    const detail::HostCopy h(v, ctx);
    return std::vector<uint16_t>(h.as<uint16_t>(), h.as<uint16_t>() + static_cast<size_t>(n) * row_elems);
  };
  for (const DemoRequest& req : c.workload.requests) {
    // (1) the sequence as one prefill ...
    ModelDemoConfig one = c;
    one.workload.requests = {req};
    one.workload.steps = {pipeline::EngineStep{{{req.id, req.length}}, 0}};
    std::vector<std::vector<uint16_t>> prefill_out(static_cast<size_t>(NL));
    DenseTotals dense_p, dense_d;
    const std::vector<int64_t> rows = sampled_rows(req.length, dense_stride);
    run_model_demo(one, {}, [&](const pipeline::ModelRunner& r, const pipeline::AttentionLayer& l) {
      prefill_out[static_cast<size_t>(l.info().index)] = output_rows(l, req.length);
      dense_p.add(check_layer_dense(r, l, rows, ctx), l.info().index);
    });
    // ... and token by token through decode
    ModelDemoConfig dec = c;
    dec.workload.requests = {req};
    dec.workload.steps.clear();
    for (int64_t p = 0; p < req.length; ++p) dec.workload.steps.push_back(pipeline::EngineStep{{{req.id, 1}}, 0});
    std::vector<int64_t> bad(static_cast<size_t>(NL), 0);
    std::vector<std::string> first(static_cast<size_t>(NL));
    int64_t pos = 0;
    const int64_t step_rows[] = {0};
    run_model_demo(dec, [&](const DemoStepReport&) { ++pos; },
                   [&](const pipeline::ModelRunner& r, const pipeline::AttentionLayer& l) {
                     const size_t L = static_cast<size_t>(l.info().index);
                     const conformance::ReadCheck k = compare_layer_rows(
                         output_rows(l, 1).data(), prefill_out[L].data() + static_cast<size_t>(pos) * row_elems, 1, H);
                     if (!k.pass && bad[L]++ == 0) first[L] = fmt::format("position {}: {}", pos, k.detail);
                     if (pos % dense_stride == 0 || pos == req.length - 1)
                       dense_d.add(check_layer_dense(r, l, step_rows, ctx), l.info().index);
                   });
    int64_t bad_layers = 0;
    std::string detail;
    for (int L = 0; L < NL; ++L)
      if (bad[static_cast<size_t>(L)]) {
        if (bad_layers++ == 0) detail = fmt::format("layer {}: {} tokens differ; {}", L, bad[static_cast<size_t>(L)],
                                                   first[static_cast<size_t>(L)]);
      }
    emit({fmt::format("request {} ({} tokens{}): prefill vs decode", req.id, req.length,
                      req.null_blocks ? ", null blocks" : ""),
          bad_layers == 0,
          bad_layers == 0 ? fmt::format("{} layers x {} tokens within SPEC 9.7", NL, req.length) : detail});
    emit(dense_p.line(fmt::format("request {}: prefill run vs dense binary64", req.id)));
    emit(dense_d.line(fmt::format("request {}: decode run vs dense binary64", req.id)));
  }
  // (2) the workload in every record format pair
  const std::pair<RecordFormat, RecordFormat> pairs[] = {
      {RecordFormat::V4_584, RecordFormat::V4_584}, {RecordFormat::MXFP8_528, RecordFormat::MXFP8_528},
      {RecordFormat::MXFP8_528, RecordFormat::NVFP4_288}, {RecordFormat::PLAIN_BF16, RecordFormat::PLAIN_BF16},
      {RecordFormat::PLAIN_FP8, RecordFormat::PLAIN_FP8}};
  for (const auto& [sw, cm] : pairs) {
    ModelDemoConfig f = c;
    f.swa_format = sw;
    f.compressed_format = cm;
    DenseTotals d;
    run_model_demo(f, {}, [&](const pipeline::ModelRunner& r, const pipeline::AttentionLayer& l) {
      d.add(check_layer_dense(r, l, sampled_rows(r.metadata().num_tokens(), dense_stride), ctx), l.info().index);
    });
    emit(d.line(fmt::format("workload, SWA {} + compressed {}: vs dense binary64", record_info(sw).name,
                            record_info(cm).name)));
  }
  if (c.device != Device::CPU) emit(verify_device_vs_cpu(c, ctx));
  return rep;
}

}  // namespace dsv41kv::oracles
