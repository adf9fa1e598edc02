// `dsv41kv demo`: the main job. A built-in multi-step serving workload (several requests,
// chunked prefills starting at odd and even positions, decodes, a padded row, a null-block
// request) through one ratio-2 and one ratio-1 kv-source compressor layer with seeded
// weights, run by the library's serving step (pipeline.hpp) on the CPU or the GPU: hidden (bf16)
// -> projection -> kv_score (fp32) -> metadata -> compress -> insert into every requested record
// format. Prints, per step, what was written (read back from the layers' buffers), then cache
// bytes per token per format and the throughput on this machine. Every step also reads its
// records back (gather) and holds them against the latents it just wrote.
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

int run_demo(const DemoOptions& o) {
  const bool on_gpu = o.device == "cuda";
  if (on_gpu && !cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv: demo --device cuda: no usable GPU: %s (run without --device, or on a machine with "
                         "a CUDA device)\n", cuda_device_description().c_str());
    return 2;
  }
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

}  // namespace

void add_demo(CLI::App& app, int& exit_code) {
  static DemoOptions o;
  auto* cmd = app.add_subcommand("demo", "built-in multi-step workload through a ratio-2 and a ratio-1 compressor layer");
  cmd->add_flag("--json", o.json, "machine-readable output");
  cmd->add_option("--seed", o.seed, "seed of the workload, hidden states and weights")->check(unsigned64());
  cmd->add_option("--ratio", o.ratio, "1, 2 or both")->check(CLI::IsMember({"1", "2", "both"}));
  cmd->add_option("--format", o.format, "v4_584, mxfp8_528, nvfp4_288, bf16, fp8 or all");
  cmd->add_option("--config", o.config_path, "Hugging Face config.json (default: DeepSeek-V4.1-Flash)");
  cmd->add_option("--threads", o.threads, "CPU threads (0: all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--device", o.device, "cpu | cuda: where the pipeline runs (cuda: cuBLAS projection, CUDA kernels, "
                                        "per-step GPU time; exit 2 without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
#if defined(DSV41KV_TEST_SEAMS)
  // The test seam: hold the records against a wrong expectation (the negated latents) to show
  // that the read-back check fails when it must (hidden; builds without seams have no such flag).
  cmd->add_option("--mutation", o.mutation, "")->check(CLI::IsMember({"none", "wrong-expectation"}))->group("");
#endif
  cmd->callback([&exit_code] { exit_code = run_demo(o); });
}

}  // namespace dsv41kv::cli
