// `dsv41kv demo`: the main job. By default the whole attention path of a V4.1 topology on the CPU
// (oracles/model_demo: the write path, the indexer, sparse MLA with sink, the inverse RoPE) over
// a built-in multi-step workload, printing per step and layer what was written and read;
// `--verify` adds prefill vs token-by-token decode and the dense binary64 checks; `--device cuda`
// runs the layers on the GPU (and --verify then also holds every step against the CPU).
// `--write-path`: the write path alone (one ratio-2 and one ratio-1 kv-source compressor layer
// with seeded weights, run by pipeline.hpp's serving step on the CPU or the GPU: hidden (bf16)
// -> projection -> kv_score (fp32) -> metadata -> compress -> insert into every requested record
// format), printing per step what was written (read back from the layers' buffers), cache bytes
// per token per format and the throughput on this machine; every step reads its records back
// (gather) and holds them against the latents it just wrote.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/buffer.hpp"
#include "dsv41kv/config.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/model_demo.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/pipeline.hpp"
#include "dsv41kv/projection.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rng.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct DemoOptions {
  bool json = false;
  bool write_path = false;
  bool verify = false;
  int heads = 64;
  std::string swa_format = "v4_584";
  int64_t dense_stride = 16;
  double workload_scale = 1.0;
  std::string weights;
  uint64_t seed = 7;
  std::string ratio = "both";   // 1, 2 or both
  std::string format = "all";   // one record format or all
  std::string config_path;      // HF config.json (default: the published V4.1-Flash values)
  int threads = 0;
  std::string device = "cpu";   // cpu | cuda
  std::string mutation = "none";  // hidden, test-only
};

// The hidden row of (request, position) is a pure function of the seed (splitmix64), so a
// token's kv_score is the same whichever step or batch computes it.
void fill_hidden_row(uint16_t* row, int64_t H, uint64_t seed, int64_t req, int64_t pos) {
  uint64_t s = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(req) * 0x100000001B3ull + static_cast<uint64_t>(pos)));
  for (int64_t k = 0; k < H; ++k) {
    s = splitmix64(s);
    // roughly N(0,1): sum of two uniforms, centred and scaled
    const double u = (static_cast<double>(s >> 40) + static_cast<double>((s >> 16) & 0xFFFFFF)) /
                     static_cast<double>(1 << 24);
    row[k] = num::bf16_encode(static_cast<float>((u - 1.0) * 2.45));
  }
}

// One kv-source layer of the demo and its running totals.
struct Layer {
  std::unique_ptr<pipeline::KvSourceLayer> layer;
  std::unique_ptr<pipeline::WriteAudit> audit;
  int ratio = 2;
  int64_t S = 32;             // states per kernel page: 64 tokens / ratio (SPEC 3.6)
  int64_t pages_per_req = 0;  // request id i owns pages 1 + i * pages_per_req ... (page 0: the null page)
  int64_t latents = 0, ring_rows = 0, records = 0, check_failures = 0;
  double seconds_projection = 0, seconds_compress_insert = 0;
};

// --device cuda without a usable GPU: the message, and exit status 2 for the caller.
bool no_gpu(const DemoOptions& o) {
  if (o.device != "cuda" || cuda_device_available()) return false;
  std::fprintf(stderr, "dsv41kv: demo --device cuda: no usable GPU: %s (run without --device, or on a machine with "
                       "a CUDA device)\n", cuda_device_description().c_str());
  return true;
}

int run_write_demo(const DemoOptions& o) {
  const bool on_gpu = o.device == "cuda";
  if (no_gpu(o)) return 2;
  const ModelConfig cfg = o.config_path.empty() ? deepseek_v41_flash() : load_model_config(o.config_path);
  std::vector<RecordFormat> formats;
  if (o.format == "all") formats.assign(std::begin(kAllRecordFormats), std::end(kAllRecordFormats));
  else formats.push_back(parse_record_format(o.format.c_str()));
  std::vector<int> ratios;
  if (o.ratio == "both") ratios = {2, 1};
  else if (o.ratio == "2") ratios = {2};
  else if (o.ratio == "1") ratios = {1};
  else invalid_argument(fmt::format("--ratio: got '{}', expected 1, 2 or both", o.ratio));
  for (int r : ratios)
    if (!cfg.has_ratio(r))
      invalid_argument(fmt::format("--config {}: no layer has compress ratio {}", o.config_path, r));

  const pcp::Workload w = pcp::demo_workload(o.seed);
  const int64_t num_req = static_cast<int64_t>(w.requests.size());
  constexpr int64_t kPadRows = 1;
  const int64_t H = cfg.hidden_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  int64_t max_step_tokens = 0;
  for (const auto& step : w.steps) {
    int64_t n = 0;
    for (const auto& s : step) n += s.req.query_len;
    max_step_tokens = std::max(max_step_tokens, n);
  }

  pipeline::ServingConfig sc;
  sc.device = on_gpu ? Device::CUDA : Device::CPU;
  sc.exec.num_threads = o.threads;
  sc.max_tokens = max_step_tokens + kPadRows;
  sc.max_requests = w.config.max_num_seqs;
  sc.ring_blocks = num_req + 1;
  sc.formats = formats;
  sc.fp8_scale = 0.5f;
  std::vector<Layer> layers;
  for (int r : ratios) {
    Layer L;
    L.ratio = r;
    L.S = 64 / r;
    const int64_t states = (w.max_position + 1) / r + 1;
    L.pages_per_req = (states + L.S - 1) / L.S;
    (r == 1 ? sc.c1a : sc.c2a) = {L.S, 1 + num_req * L.pages_per_req, L.pages_per_req};
    layers.push_back(std::move(L));
  }
  for (Layer& L : layers) {
    L.layer = std::make_unique<pipeline::KvSourceLayer>(
        sc, CompressorWeights::from_seed(L.ratio, static_cast<int>(H), o.seed * 31 + static_cast<uint64_t>(L.ratio)),
        rope_table_for_ratio(cfg, L.ratio, w.max_position + 1), eps);
    L.audit = std::make_unique<pipeline::WriteAudit>(*L.layer);
#if defined(DSV41KV_TEST_SEAMS)
    L.audit->seam_negate_expected = o.mutation == "wrong-expectation";
#endif
  }
  pipeline::StepMetadata meta(sc);
  Buffer hidden(sc.device, static_cast<size_t>(sc.max_tokens * H) * sizeof(uint16_t));
  std::vector<uint16_t> hidden_host(static_cast<size_t>(sc.max_tokens * H));

  nlohmann::json js;
  js["seed"] = o.seed;
  if (on_gpu) js["device"] = o.device;
  js["hidden_size"] = H;
  js["rms_norm_eps"] = cfg.rms_norm_eps;
  js["steps"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("dsv41kv demo: {} requests over {} steps (request 1 has the null block; one padded "
               "row per step), hidden {}, eps {:g}, formats:", num_req, w.steps.size(), H, cfg.rms_norm_eps);
    for (RecordFormat f : formats) fmt::print(" {}", record_info(f).name);
    fmt::print("\n{:>4} {:>4} {:>6} {:>7}", "step", "reqs", "tokens", "decodes");
    for (const Layer& L : layers)
      fmt::print("  | r{} latents ring_rows records{}", L.ratio, formats.size() > 1 ? "/format" : "");
    fmt::print("  | ms{}\n", on_gpu ? "  gpu ms" : "");
  }

  int64_t total_tokens = 0;
  for (size_t si = 0; si < w.steps.size(); ++si) {
    // The step as the engine hands it over: requests with their ring blocks and block-table rows
    // (the null-block request has neither), the hidden rows of its tokens, one padded row.
    pipeline::StepBatch batch;
    batch.padding_rows = kPadRows;
    int64_t decodes = 0, t = 0;
    for (const pcp::ScheduledRequest& s : w.steps[si]) {
      const auto& rq = w.requests[static_cast<size_t>(s.id)];
      pipeline::StepRequest q;
      q.query_len = s.req.query_len;
      q.num_computed = s.req.num_computed;
      q.ring_block = rq.ring_block;
      for (const Layer& L : layers) {
        std::vector<int32_t>& pages = L.ratio == 1 ? q.c1a_pages : q.c2a_pages;
        for (int64_t p = 0; p < L.pages_per_req && !rq.null_block; ++p)
          pages.push_back(static_cast<int32_t>(1 + s.id * L.pages_per_req + p));
      }
      batch.requests.push_back(std::move(q));
      if (!s.req.is_prefilling) ++decodes;
      for (int64_t i = 0; i < s.req.query_len; ++i, ++t)
        fill_hidden_row(&hidden_host[static_cast<size_t>(t * H)], H, o.seed, s.id, s.req.num_computed + i);
    }
    const int64_t A = t, N = A + kPadRows;
    for (; t < N; ++t) fill_hidden_row(&hidden_host[static_cast<size_t>(t * H)], H, o.seed, -1, t);
    total_tokens += A;
    hidden.upload(hidden_host.data(), static_cast<size_t>(N * H) * sizeof(uint16_t), 0, sc.exec);

    const auto t_step = Clock::now();
    for (Layer& L : layers) L.audit->before_step();
    meta.build(batch);
    for (Layer& L : layers) L.layer->run(meta, hidden.view(DType::BF16, {N, H}));
    double step_gpu_ms = meta.last_ms();
    nlohmann::json jstep;
    jstep["step"] = si;
    jstep["requests"] = batch.requests.size();
    jstep["tokens"] = A;
    jstep["padded_rows"] = kPadRows;
    jstep["decodes"] = decodes;
    std::vector<pipeline::StepWrites> writes;
    for (Layer& L : layers) {
      const pipeline::LayerTimings tm = L.layer->last_timings();
      L.seconds_projection += tm.projection_ms / 1000.0;
      L.seconds_compress_insert += tm.compress_insert_ms / 1000.0;
      step_gpu_ms += tm.projection_ms + tm.compress_insert_ms;
      const pipeline::StepWrites& c = writes.emplace_back(L.audit->after_step(meta));
      for (const pipeline::FormatReadback& f : c.formats)
        if (!f.first_bad.empty()) std::fprintf(stderr, "dsv41kv: demo: step %zu, ratio %d: %s\n", si, L.ratio, f.first_bad.c_str());
      L.latents += c.latents;
      L.ring_rows += c.ring_rows;
      L.records += c.records * static_cast<int64_t>(c.formats.size());
      L.check_failures += c.bad_records();
      jstep["layers"].push_back({{"ratio", L.ratio}, {"latents", c.latents}, {"ring_rows_written", c.ring_rows},
                                 {"records_per_format", c.records}});
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_step).count();
    jstep["ms"] = ms;
    if (on_gpu) jstep["gpu_ms"] = step_gpu_ms;
    js["steps"].push_back(jstep);
    if (!o.json) {
      fmt::print("{:>4} {:>4} {:>3}+{:<2} {:>7}", si, batch.requests.size(), A, kPadRows, decodes);
      for (size_t li = 0; li < layers.size(); ++li)
        fmt::print("  | r{} {:>7} {:>9} {:>7}{}", layers[li].ratio, writes[li].latents, writes[li].ring_rows,
                   writes[li].records, formats.size() > 1 ? "        " : "");
      fmt::print("  | {:.1f}{}\n", ms, on_gpu ? fmt::format("  {:>6.3f}", step_gpu_ms) : "");
    }
  }

  // Cache bytes per token per format (the record alone, and with page padding at the default
  // page stride).
  nlohmann::json jsum = nlohmann::json::array();
  if (!o.json) fmt::print("\ncache bytes per token (record / with page padding at the default page stride):\n");
  for (const Layer& L : layers) {
    if (!o.json) fmt::print("  ratio {} ({} states per page):", L.ratio, L.S);
    for (size_t i = 0; i < L.layer->num_caches(); ++i) {
      const CacheView& v = L.layer->cache(i);
      const RecordInfo& ri = record_info(v.format);
      const double rec = static_cast<double>(ri.record_bytes) / L.ratio;
      const double paged = static_cast<double>(v.page_stride * static_cast<int64_t>(dtype_size(ri.element))) /
                           static_cast<double>(L.S * L.ratio);
      if (!o.json) fmt::print("  {} {:g}/{:.1f}", ri.name, rec, paged);
      jsum.push_back({{"ratio", L.ratio}, {"format", ri.name}, {"bytes_per_token", rec},
                      {"bytes_per_token_paged", paged}});
    }
    if (!o.json) fmt::print("\n");
  }
  nlohmann::json jlayers = nlohmann::json::array();
  int64_t failures = 0;
  for (const Layer& L : layers) {
    failures += L.check_failures;
    const double tps_proj = static_cast<double>(total_tokens) / L.seconds_projection;
    const double tps_ci = static_cast<double>(total_tokens) / L.seconds_compress_insert;
    if (!o.json)
      fmt::print("ratio {}: {} latents, {} ring rows, {} records written; projection {:.0f} tokens/s, "
                 "compress+insert ({} formats) {:.0f} tokens/s; read-back check: {} bad records\n",
                 L.ratio, L.latents, L.ring_rows, L.records, tps_proj, L.layer->num_caches(), tps_ci,
                 L.check_failures);
    jlayers.push_back({{"ratio", L.ratio}, {"latents", L.latents}, {"ring_rows_written", L.ring_rows},
                       {"records", L.records}, {"projection_tokens_per_s", tps_proj},
                       {"compress_insert_tokens_per_s", tps_ci}, {"readback_bad_records", L.check_failures}});
  }
  js["bytes_per_token"] = jsum;
  js["layers"] = jlayers;
  js["tokens"] = total_tokens;
  if (o.json) fmt::print("{}\n", js.dump(2));
  return failures == 0 ? 0 : 1;
}

const char* role_name(const LayerInfo& li) {
  if (li.ratio == 0) return "swa only";
  if (li.is_candidate_source) return "kv+index+cand src";
  if (li.is_candidate_consumer) return "index src, cand use";
  if (li.is_kv_source) return "kv+index source";
  if (li.is_index_source) return "index source";
  return "consumer";
}

int run_model_demo_cli(const DemoOptions& o) {
  if (no_gpu(o)) return 2;
  oracles::ModelDemoConfig c;
  c.device = o.device == "cuda" ? Device::CUDA : Device::CPU;
  if (!o.config_path.empty()) c.model = load_model_config(o.config_path);
  c.seed = o.seed;
  c.weights_path = o.weights;
  c.workload = oracles::demo_read_workload(o.workload_scale);
  c.threads = o.threads;
  c.num_heads = o.heads;
  c.swa_format = parse_record_format(o.swa_format.c_str());
  c.compressed_format = o.format == "all" ? RecordFormat::V4_584 : parse_record_format(o.format.c_str());
  pipeline::validate(oracles::demo_read_config(c));
  const ModelConfig& m = c.model;
  nlohmann::json js;
  js["seed"] = o.seed;
  if (c.device != Device::CPU) js["device"] = o.device;
  js["layers"] = m.num_layers();
  js["heads"] = c.num_heads;
  js["swa_format"] = record_info(c.swa_format).name;
  js["compressed_format"] = record_info(c.compressed_format).name;
  js["steps"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("dsv41kv demo: the whole attention path of a V4.1 topology on the {}, {} layers:\n{}\n{} heads, "
               "SWA {}, compressed {}, index keys fp8_132, {} weights, seeded activations (seed {})\n",
               c.device == Device::CPU ? "CPU" : cuda_device_description(),
               m.num_layers(), describe_topology(m), c.num_heads, record_info(c.swa_format).name,
               record_info(c.compressed_format).name, o.weights.empty() ? "seeded" : o.weights, o.seed);
    fmt::print("{} requests over {} steps (request 3 has null blocks), num_speculative_tokens {}\n",
               c.workload.requests.size(), c.workload.steps.size(), c.workload.num_speculative_tokens);
  }
  const oracles::ModelDemoReport rep = oracles::run_model_demo(c, [&](const oracles::DemoStepReport& s) {
    nlohmann::json jl = nlohmann::json::array();
    if (!o.json)
      fmt::print("\nstep {}: {} requests, {} tokens ({} decode + {} prefill) + {} padding rows, longest sequence {}\n"
                 "  {:>5} {:<7} {:<19} {:>5} {:>5} {:>5} {:>9} {:>11} {:>10} {:>16} {:>8}\n",
                 s.step, s.requests, s.tokens, s.decode_tokens, s.prefill_tokens, s.padding_rows, s.max_seq_len,
                 "layer", "type", "role", "swa", "cmp", "idx-k", "top-k", "cand blocks", "keys/token", "output checksum",
                 "ms");
    for (size_t L = 0; L < s.layers.size(); ++L) {
      const pipeline::LayerStepStats& x = s.layers[L];
      const LayerInfo& li = m.layer(static_cast<int>(L));
      const int64_t valid = x.swa_records;
      const std::string topk =
          li.ratio == 0 ? "-"
                        : fmt::format("{}{:.0f}/{}", x.shortcut ? "s " : "",
                                      valid ? static_cast<double>(x.topk_entries) / static_cast<double>(valid) : 0.0,
                                      x.topk_max);
      std::string cand = "-";
      if ((li.is_candidate_source || li.is_candidate_consumer) && x.candidate_blocks > 0)
        cand = li.is_candidate_consumer ? fmt::format("{} m{}", x.candidate_blocks, x.candidate_masked)
                                        : fmt::format("{}", x.candidate_blocks);
      const double keys = valid ? static_cast<double>(x.swa_keys + x.topk_entries) / static_cast<double>(valid) : 0.0;
      if (!o.json)
        fmt::print("  {:>5} {:<7} {:<19} {:>5} {:>5} {:>5} {:>9} {:>11} {:>10.1f} {:>16x} {:>8.2f}\n", L,
                   layer_type_name(li.type), role_name(li), x.swa_records,
                   li.is_kv_source ? fmt::format("{}", x.compressed_records) : "-",
                   li.is_kv_source ? fmt::format("{}", x.index_keys) : "-", topk, cand, keys, x.checksum, x.ms);
      jl.push_back({{"layer", L}, {"type", layer_type_name(li.type)}, {"swa_records", x.swa_records},
                    {"compressed_records", x.compressed_records}, {"index_keys", x.index_keys},
                    {"shortcut", x.shortcut}, {"topk_entries", x.topk_entries}, {"topk_max", x.topk_max},
                    {"candidate_blocks", x.candidate_blocks}, {"candidate_masked", x.candidate_masked},
                    {"swa_keys", x.swa_keys}, {"prefill_chunks", x.prefill_chunks},
                    {"checksum", fmt::format("{:016x}", x.checksum)}, {"ms", x.ms}});
    }
    js["steps"].push_back({{"step", s.step}, {"requests", s.requests}, {"tokens", s.tokens},
                           {"decode_tokens", s.decode_tokens}, {"prefill_tokens", s.prefill_tokens},
                           {"padding_rows", s.padding_rows}, {"layers", jl}, {"ms", s.ms}});
  });
  // cache bytes per token (SPEC 3.7): the compressed and index-K records of every kv source
  const RecordInfo& sw = record_info(c.swa_format);
  const RecordInfo& cm = record_info(c.compressed_format);
  double per_token = 0;
  int64_t kv_sources = 0;
  for (const LayerInfo& li : m.layers)
    if (li.is_kv_source) {
      ++kv_sources;
      per_token += static_cast<double>(cm.record_bytes + index_k_record_bytes(IndexKFormat::FP8_132)) / li.ratio;
    }
  const double swa_kib = static_cast<double>(sw.record_bytes) * kSwaWindow * m.num_layers() / 1024.0;
  if (!o.json)
    fmt::print("\ncache bytes per token: {:.0f} B of compressed records and index keys over the {} kv sources (SPEC "
               "3.7); SWA: {} B records, at most {} live tokens per layer ({:.0f} KiB per request over {} layers)\n"
               "time per layer type ({} tokens):",
               per_token, kv_sources, sw.record_bytes, kSwaWindow, swa_kib, m.num_layers(), rep.tokens);
  nlohmann::json jt = nlohmann::json::object();
  for (int t = 0; t < 3; ++t) {
    if (rep.layers_per_type[t] == 0) continue;
    const double us = 1000.0 * rep.ms_per_type[t] / static_cast<double>(std::max<int64_t>(rep.tokens, 1)) /
                      rep.layers_per_type[t];
    if (!o.json)
      fmt::print("  {} {:.1f} us/token/layer ({} layers)", layer_type_name(static_cast<LayerType>(t)), us,
                 rep.layers_per_type[t]);
    jt[layer_type_name(static_cast<LayerType>(t))] = {
        {"layers", rep.layers_per_type[t]}, {"ms", rep.ms_per_type[t]}, {"us_per_token_per_layer", us}};
  }
  if (!o.json) fmt::print("\noutput checksum of the workload: {:016x}\n", rep.checksum);
  js["tokens"] = rep.tokens;
  js["checksum"] = fmt::format("{:016x}", rep.checksum);
  js["bytes_per_token"] = per_token;
  js["time_per_type"] = jt;
  int64_t failed = 0;
  if (o.verify) {
    if (!o.json) fmt::print("\nverify:\n");
    nlohmann::json jv = nlohmann::json::array();
    const oracles::VerifyReport v = oracles::verify_model_demo(c, o.dense_stride, [&](const oracles::VerifyLine& l) {
      if (!o.json) {
        fmt::print("  {:<62} {}  {}\n", l.what, l.pass ? "PASS" : "FAIL", l.detail);
        std::fflush(stdout);
      }
      jv.push_back({{"what", l.what}, {"pass", l.pass}, {"detail", l.detail}});
    });
    failed = v.failed();
    if (!o.json) fmt::print("{} passed, {} failed\n", static_cast<int64_t>(v.lines.size()) - failed, failed);
    js["verify"] = jv;
  }
  if (o.json) fmt::print("{}\n", js.dump(2));
  return failed == 0 ? 0 : 1;
}

int run_demo(const DemoOptions& o) {
  if (o.write_path) return run_write_demo(o);
  if (o.ratio != "both") invalid_argument("--ratio: an option of the write-path demo, expected --write-path with it");
  if (o.mutation != "none") invalid_argument("--mutation: an option of the write-path demo, expected --write-path");
  return run_model_demo_cli(o);
}

}  // namespace

void add_demo(CLI::App& app, int& exit_code) {
  static DemoOptions o;
  auto* cmd = app.add_subcommand("demo", "built-in multi-step workload through a whole V4.1 attention topology "
                                         "(write and read path; --write-path: the write path alone)");
  cmd->add_flag("--json", o.json, "machine-readable output");
  cmd->add_flag("--write-path", o.write_path, "the write path alone: a ratio-2 and a ratio-1 compressor layer, every "
                                              "record format, on the CPU or the GPU");
  cmd->add_flag("--verify", o.verify, "also attend every sequence as one prefill and token by token through decode "
                                      "(SPEC 9.7), and check against dense binary64 attention for every record format");
  cmd->add_option("--heads", o.heads, "query heads (8, 16, 32, 64, 128)")->check(CLI::IsMember({8, 16, 32, 64, 128}));
  cmd->add_option("--swa-format", o.swa_format, "SWA cache record: v4_584, mxfp8_528, bf16, fp8");
  cmd->add_option("--dense-stride", o.dense_stride, "--verify: check every n-th token against binary64")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--weights", o.weights, "safetensors file of every layer's small weights (layers.<L>.attn.attn_sink, "
                                          ".compressor.norm.weight, .indexer.wk.weight, .indexer.k_norm.weight; "
                                          "default: seeded)");
  cmd->add_option("--workload-scale", o.workload_scale, "shorten every prompt of the built-in workload by this factor")
      ->check(finite_range(0.001, 1.0));
  cmd->add_option("--seed", o.seed, "seed of the workload, hidden states and weights")->check(unsigned64());
  cmd->add_option("--ratio", o.ratio, "1, 2 or both")->check(CLI::IsMember({"1", "2", "both"}));
  cmd->add_option("--format", o.format, "compressed records: v4_584, mxfp8_528, nvfp4_288, bf16, fp8 (all: "
                                        "--write-path only; the read path then uses v4_584)");
  cmd->add_option("--config", o.config_path, "Hugging Face config.json (default: DeepSeek-V4.1-Flash)");
  cmd->add_option("--threads", o.threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--device", o.device, "cpu | cuda: where the layers run (cuda: CUDA kernels; the read path's --verify "
                                        "adds the GPU vs the CPU; --write-path: cuBLAS projection, per-step GPU time; "
                                        "exit 2 without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
#if defined(DSV41KV_TEST_SEAMS)
  // The test seam: hold the records against a wrong expectation (the negated latents) to show
  // that the read-back check fails when it must (hidden; builds without seams have no such flag).
  cmd->add_option("--mutation", o.mutation, "")->check(CLI::IsMember({"none", "wrong-expectation"}))->group("");
#endif
  cmd->callback([&exit_code] { exit_code = run_demo(o); });
}

}  // namespace dsv41kv::cli
