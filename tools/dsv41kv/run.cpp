// `dsv41kv run`: the multi-step PCP serving simulation (SPEC 7, 10.6). Replays one seeded
// workload with every requested P, prints the per-step communication volume beside the
// replaced all-gather design and, with --verify, checks SPEC 7.8 at every step against the
// single-rank runs. Exit codes: 0 identical (or no --verify), 1 a difference (the first one is
// printed), 2 bad flags or arguments.
//
// The read path (--read-path, on by default on the CPU): every rank also inserts the step's
// gathered kv rows into its SWA cache and the gathered latents into its index-K cache, and runs
// the indexer and the attention of its own query rows (SPEC 7.6 steps 2-4); --verify then also
// compares every token's top-k row, attention output and lse, on the rank that holds it, with the
// single-rank layer, and the read path's caches byte for byte.
//
// --device cuda: every rank's ring, caches and latents on the GPU (P ranks as threads sharing
// GPU 0); --verify checks the GPU's bytes (copied back) against the CPU single-rank references.
// --launch local (with --device cuda, one P): P worker processes of this binary, one per GPU,
// each with an NcclCommunicator, running only its own rank; each verifies its rank against a CPU
// run of every rank of the same workload computed in the worker (itself checked against the
// single-rank references, SPEC 7.8) and prints its time per step (CUDA events) and the bytes its
// communicator moved beside the replaced all-gather design.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dsv41kv/launcher.hpp"
#include "dsv41kv/nccl_selftest.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/nccl_comm.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/records.hpp"
#if defined(DSV41KV_TEST_SEAMS)
#include "dsv41kv/test_seam.hpp"
#endif

namespace dsv41kv::cli {
namespace {

struct RunOptions {
  std::string pcp = "2";
  int64_t steps = 0;
  int64_t requests = 10;
  std::string prompt_len = "9:160";
  std::string start = "0:9";
  int64_t decode_steps = 3;
  int64_t chunk_budget = 96;
  int64_t max_num_seqs = 4;
  std::string placement = "replicated";
  uint64_t seed = 1;
  std::string format = "all";
  int ratio = 2;
  double null_fraction = 0.125;
  int64_t graph_pad = 0;
  int64_t states_per_page = 0;
  int64_t num_spec = 0;
  bool json = false;
  bool verify = false;
  std::string read_path = "auto";  // auto: on with --device cpu, off with cuda (no kernels yet)
  int heads = 64;
  std::string topk = "auto";
  std::string mutation = "none";  // hidden, test-only
  std::string device = "cpu";
  std::string launch = "none";
  std::string rendezvous = "tcp";
  double timeout_s = 120;
  double max_runtime_s = 1800;
  int kill_rank = -1;         // --launch local: this rank SIGKILLs itself ...
  int64_t kill_at_step = -1;  // ... at the start of this step (-1: not given, step 0)
};

// The step at whose start --kill-rank dies (--kill-at-step, 0 when not given).
int64_t kill_step(const RunOptions& o) { return std::max<int64_t>(o.kill_at_step, 0); }

int64_t parse_int(const std::string& s, const char* flag) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    invalid_argument(fmt::format("{} '{}': not an integer", flag, s));
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

std::pair<int64_t, int64_t> parse_range(const std::string& s, const char* flag) {
  const auto parts = split(s, ':');
  if (parts.size() != 2) invalid_argument(fmt::format("{} '{}' (expected MIN:MAX)", flag, s));
  const int64_t lo = parse_int(parts[0], flag), hi = parse_int(parts[1], flag);
  if (lo > hi) invalid_argument(fmt::format("{} '{}': MIN > MAX", flag, s));
  return {lo, hi};
}

std::vector<int> parse_pcp(const std::string& s) {
  std::vector<int> ps;
  for (const auto& part : split(s, ',')) {
    const int64_t p = parse_int(part, "--pcp");
    if (p < 1 || p > 64) invalid_argument(fmt::format("--pcp {} (expected 1..64)", p));
    ps.push_back(static_cast<int>(p));
  }
  if (ps.empty()) invalid_argument("--pcp: empty (expected P[,P...])");
  return ps;
}

std::vector<RecordFormat> parse_formats(const std::string& s) {
  if (s == "all") return {std::begin(kAllRecordFormats), std::end(kAllRecordFormats)};
  std::vector<RecordFormat> fs;
  for (const auto& part : split(s, ',')) fs.push_back(parse_record_format(part.c_str()));
  return fs;
}

std::string human_bytes(uint64_t b) {
  if (b >= 10ull * 1024 * 1024) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  if (b >= 10ull * 1024) return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024.0);
  return fmt::format("{} B", b);
}

nlohmann::json volume_json(const pcp::CommVolume& v) {
  return {{"keys_sent", v.keys_sent},           {"keys_received", v.keys_received},
          {"positions_sent", v.positions_sent}, {"positions_received", v.positions_received},
          {"rows_sent", v.rows_sent},           {"rows_received", v.rows_received},
          {"latents_sent", v.latents_sent},     {"latents_received", v.latents_received},
          {"swa_kv_sent", v.swa_kv_sent},       {"swa_kv_received", v.swa_kv_received},
          {"sent", v.sent()},                   {"received", v.received()},
          {"replaced_allgather_received", v.replaced_received}};
}

nlohmann::json read_json(const pcp::ReadPathCounts& c) {
  return {{"decode_rows", c.decode_rows},   {"prefill_rows", c.prefill_rows},   {"prefill_chunks", c.prefill_chunks},
          {"swa_keys", c.swa_keys},         {"topk_entries", c.topk_entries},   {"topk_max", c.topk_max},
          {"shortcut_steps", c.shortcut_steps}};
}

int run_worker(const RunOptions& o, const comm::WorkerEnv& env, const pcp::SimConfig& sc, const pcp::Workload& w);
int launch_workers(const RunOptions& o, int P, const std::vector<std::string>& command_line);

// The machine's physical memory: the simulation's limit (SimConfig::max_host_bytes), so that a
// workload too large for it is rejected (exit 2) before anything is allocated.
int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * static_cast<int64_t>(page) : 0;
}

int run_command(const RunOptions& o, const std::vector<std::string>& command_line) {
  pcp::WorkloadConfig wc;
  wc.seed = o.seed;
  wc.num_requests = o.requests;
  std::tie(wc.prompt_min, wc.prompt_max) = parse_range(o.prompt_len, "--prompt-len");
  std::tie(wc.start_min, wc.start_max) = parse_range(o.start, "--start");
  wc.decode_steps = o.decode_steps;
  wc.chunk_budget = o.chunk_budget;
  wc.max_num_seqs = o.max_num_seqs;
  wc.null_block_fraction = o.null_fraction;
  wc.graph_pad_multiple = o.graph_pad;
  wc.max_steps = o.steps;
  pcp::SimConfig sc;
  sc.ratio = o.ratio;
  sc.formats = parse_formats(o.format);
  sc.states_per_page = o.states_per_page;
  sc.placement = pcp::parse_placement(o.placement);
  sc.num_speculative_tokens = o.num_spec;
  sc.max_host_bytes = physical_memory_bytes();
  sc.num_heads = o.heads;
  sc.scored_topk = o.topk == "scored";
#if defined(DSV41KV_TEST_SEAMS)
  sc.fault = seam::parse_fault(o.mutation);
#endif
  const std::vector<int> ps = parse_pcp(o.pcp);
  for (int P : ps) pcp::check_pcp_speculation("run", P, o.num_spec);
  const pcp::Workload w = pcp::generate_workload(wc);
  const bool on_gpu = o.device == "cuda";
  if (on_gpu && o.read_path == "on")
    invalid_argument("--read-path on with --device cuda: the read path's layer runs on the CPU only (expected "
                     "--read-path auto or off)");
  sc.read_path = !on_gpu && o.read_path != "off";
#if defined(DSV41KV_TEST_SEAMS)
  if (!sc.read_path && (sc.fault == seam::PcpFault::kLocalSwaInsert || sc.fault == seam::PcpFault::kPerturbAttention))
    invalid_argument(fmt::format("--mutation {} breaks the read path, which does not run here (expected --device cpu "
                                 "without --read-path off)", o.mutation));
#endif
  if (on_gpu) {
    sc.device = Device::CUDA;
    if (!cuda_device_available()) {
      std::fprintf(stderr, "dsv41kv: run --device cuda: no usable GPU: %s (run without --device, or on a machine "
                           "with a CUDA device)\n", cuda_device_description().c_str());
      return 2;
    }
#if defined(DSV41KV_TEST_SEAMS)
    if (sc.fault == seam::PcpFault::kReverseTieBreak)
      invalid_argument("--mutation reverse-tie-break with --device cuda: the device link's sort is stable by "
                       "gathered index (expected --device cpu)");
#endif
  }
  if (o.launch != "local" && o.kill_rank >= 0)
    invalid_argument(fmt::format("--kill-rank {} without --launch local: only worker processes can be killed "
                                 "(expected --device cuda --launch local)", o.kill_rank));
  if (o.kill_at_step >= 0 && o.kill_rank < 0)
    invalid_argument(fmt::format("--kill-at-step {} without --kill-rank: no rank to kill (expected --kill-rank R)",
                                 o.kill_at_step));
  if (o.launch == "local") {
    if (!on_gpu) invalid_argument("--launch local needs --device cuda (one worker process per GPU)");
    if (ps.size() != 1)
      invalid_argument(fmt::format("--launch local with --pcp {}: one P per launch (expected a single P)", o.pcp));
    if (o.json) invalid_argument("--launch local with --json: the workers print text (expected no --json)");
    if (o.kill_rank >= ps[0])
      invalid_argument(fmt::format("--kill-rank {}: outside the ranks [0, {}) of --pcp {}", o.kill_rank, ps[0], ps[0]));
    if (o.kill_rank >= 0 && kill_step(o) >= static_cast<int64_t>(w.steps.size()))
      invalid_argument(fmt::format("--kill-at-step {}: the workload has {} step(s) (expected 0..{})", o.kill_at_step,
                                   w.steps.size(), static_cast<int64_t>(w.steps.size()) - 1));
    if (auto env = comm::worker_env_from_environment()) {
      if (env->world != ps[0])
        invalid_argument(fmt::format("--pcp {} but the environment says world size {} ({})", ps[0], env->world,
                                     env->source));
      return run_worker(o, *env, sc, w);
    }
    return launch_workers(o, ps[0], command_line);
  }

  int64_t total_tokens = 0;
  for (const auto& st : w.steps)
    for (const auto& r : st) total_tokens += r.req.query_len;
  std::string fmt_names;
  for (RecordFormat f : sc.formats) fmt_names += fmt::format("{}{}", fmt_names.empty() ? "" : ",", record_info(f).name);

  nlohmann::json out;
  out["workload"] = {{"seed", wc.seed},           {"requests", wc.num_requests},
                     {"prompt_len", {wc.prompt_min, wc.prompt_max}},
                     {"start", {wc.start_min, wc.start_max}},
                     {"decode_steps", wc.decode_steps}, {"chunk_budget", wc.chunk_budget},
                     {"max_num_seqs", wc.max_num_seqs}, {"steps", w.steps.size()},
                     {"tokens", total_tokens},       {"ratio", sc.ratio},
                     {"formats", fmt_names},         {"decode_placement", o.placement},
                     {"verify", o.verify}};
  out["workload"]["device"] = o.device;
  out["runs"] = nlohmann::json::array();
  if (!o.json)
    fmt::print("workload: seed {}, {} requests, prompt {}..{}, start {}..{}, {} decode steps, budget {}, "
               "max_num_seqs {}, {} steps, {} tokens; ratio {}, formats {}, decode placement {}\n",
               wc.seed, wc.num_requests, wc.prompt_min, wc.prompt_max, wc.start_min, wc.start_max,
               wc.decode_steps, wc.chunk_budget, wc.max_num_seqs, w.steps.size(), total_tokens,
               sc.ratio, fmt_names, o.placement);
  if (!o.json && on_gpu)
    fmt::print("device: cuda ({}); P ranks as threads sharing GPU 0\n", cuda_device_description());
  out["workload"]["read_path"] = sc.read_path;
  if (!o.json) {
    if (sc.read_path)
      fmt::print("read path: {} heads, compressed cache {}, SWA cache {}, top-k {}; each rank attends its own query "
                 "rows over the caches every rank holds (SPEC 7.6)\n",
                 sc.num_heads, record_info(sc.formats[0]).name,
                 record_info(sc.formats[0] == RecordFormat::NVFP4_288 ? RecordFormat::V4_584 : sc.formats[0]).name,
                 sc.scored_topk ? "always scored" : "scored, or the shortcut when max seq_len / ratio <= 512");
    else
      fmt::print("read path: not run ({})\n", on_gpu ? "the read path's layer runs on the CPU only; --device cuda "
                                                        "runs and checks the write path only"
                                                      : "--read-path off");
  }

  bool any_mismatch = false;
  for (int P : ps) {
    const pcp::RunResult res = pcp::run_simulation(sc, w, P, o.verify);
    nlohmann::json run = {{"P", P}, {"steps", nlohmann::json::array()}};
    if (!o.json) {
      fmt::print("\nP = {}  (bytes per rank per step; every rank moves the same volume: all-gathers)\n", P);
      fmt::print("{:>4} {:>4} {:>6} {:>6} {:>5} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12} {:>7}{}\n",
                 "step", "reqs", "tokens", "padded", "rows", "keys", "positions", "last rows",
                 "latents", "swa kv", "sent", "received", "kv all-gath", "ratio", on_gpu ? "  gpu ms" : "");
    }
    pcp::CommVolume sum;
    for (const auto& s : res.steps) {
      const pcp::CommVolume& v = s.volume[0];
      sum += v;
      const double ratio = v.replaced_received
                               ? static_cast<double>(v.keys_received + v.rows_received) /
                                     static_cast<double>(v.replaced_received)
                               : 0.0;
      nlohmann::json js = {{"step", s.step},       {"reqs", s.num_reqs},     {"tokens", s.num_tokens},
                           {"decodes", s.num_decodes}, {"padded", s.padded}, {"num_rows", s.num_rows},
                           {"tokens_per_rank", s.tokens_per_rank},
                           {"link_vs_allgather_ratio", ratio}, {"ranks", nlohmann::json::array()}};
      if (sc.read_path) js["read_path"] = read_json(s.read);
      for (size_t k = 0; k < s.volume.size(); ++k) {
        nlohmann::json rk = volume_json(s.volume[k]);
        rk["rank"] = k;
        rk["measured_sent"] = s.measured_sent[k];
        rk["measured_received"] = s.measured_received[k];
        js["ranks"].push_back(rk);
      }
      const double gpu_ms = s.device_ms.empty() ? 0.0 : *std::max_element(s.device_ms.begin(), s.device_ms.end());
      if (on_gpu) js["gpu_ms_max_over_ranks"] = gpu_ms;
      run["steps"].push_back(js);
      if (!o.json)
        fmt::print("{:>4} {:>4} {:>6} {:>6} {:>5} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12} {:>7}{}\n",
                   s.step, s.num_reqs, s.num_tokens, s.padded, s.num_rows, human_bytes(v.keys_received),
                   human_bytes(v.positions_received), human_bytes(v.rows_received),
                   human_bytes(v.latents_received), human_bytes(v.swa_kv_received), human_bytes(v.sent()),
                   human_bytes(v.received()),
                   v.replaced_received ? human_bytes(v.replaced_received) : "-",
                   v.replaced_received ? fmt::format("{:.3f}", ratio) : "-",
                   on_gpu ? fmt::format(" {:>7.3f}", gpu_ms) : "");
    }
    const double total_ratio = sum.replaced_received
                                   ? static_cast<double>(sum.keys_received + sum.rows_received) /
                                         static_cast<double>(sum.replaced_received)
                                   : 0.0;
    run["total_per_rank"] = volume_json(sum);
    run["link_vs_allgather_ratio"] = total_ratio;
    pcp::ReadPathCounts rd;  // the read path's counts over the steps
    for (const auto& st : res.steps) rd += st.read;
    if (sc.read_path) run["read_path"] = read_json(rd);
    if (!o.json) {
      fmt::print("total per rank: sent {}, received {} (keys {}, positions {}, last rows {}, latents {}, swa kv {})\n",
                 human_bytes(sum.sent()), human_bytes(sum.received()), human_bytes(sum.keys_received),
                 human_bytes(sum.positions_received), human_bytes(sum.rows_received),
                 human_bytes(sum.latents_received), human_bytes(sum.swa_kv_received));
      if (sc.read_path)
        fmt::print("read path over all ranks: {} query rows ({} through the decode path, {} in {} prefill chunks), "
                   "{} window keys and {} top-k entries attended (longest top-k {}), top-k from the shortcut at {} "
                   "of {} steps\n",
                   rd.decode_rows + rd.prefill_rows, rd.decode_rows, rd.prefill_rows, rd.prefill_chunks, rd.swa_keys,
                   rd.topk_entries, rd.topk_max, rd.shortcut_steps, res.steps.size());
      if (sum.replaced_received)
        fmt::print("ratio-2 linking: keys + last rows {} vs all-gather of every kv_score row {}: ratio {:.4f} "
                   "(per ratio-2 layer)\n",
                   human_bytes(sum.keys_received + sum.rows_received), human_bytes(sum.replaced_received),
                   total_ratio);
    }
    if (o.verify) {
      const auto& st = res.stats;
      run["verify"] = {{"identical", !res.first_mismatch.has_value()},
                       {"steps_checked", res.steps.size()},
                       {"latent_elements", st.latent_elements},
                       {"cache_bytes", st.cache_bytes},
                       {"ring_floats", st.ring_floats},
                       {"link_entries", st.link_entries}};
      const bool attn_identical = st.read_cache_mismatched == 0 && st.topk_mismatched == 0 &&
                                  st.output_mismatched == 0 && st.lse_mismatched == 0;
      run["verify"]["attention"] = {{"checked", sc.read_path}};
      if (sc.read_path)
        run["verify"]["attention"].update({{"identical", attn_identical && !res.first_mismatch},
                                           {"token_rows", st.attention_rows},
                                           {"topk_entries", st.topk_entries},
                                           {"topk_mismatched", st.topk_mismatched},
                                           {"output_elements", st.output_elements},
                                           {"output_mismatched", st.output_mismatched},
                                           {"lse_elements", st.lse_elements},
                                           {"lse_mismatched", st.lse_mismatched},
                                           {"read_cache_bytes", st.read_cache_bytes},
                                           {"read_cache_mismatched", st.read_cache_mismatched}});
      else
        run["verify"]["attention"]["why"] = on_gpu ? "the read path runs on the CPU only" : "--read-path off";
      if (res.first_mismatch) {
        any_mismatch = true;
        const auto& mm = *res.first_mismatch;
        run["verify"]["first_difference"] = {{"step", mm.step}, {"rank", mm.rank}, {"tensor", mm.tensor},
                                             {"index", mm.index}, {"detail", mm.detail}};
        if (!o.json) fmt::print("verify P={}{}: DIFFERENCE at {}\n", P, on_gpu ? " (cuda)" : "", mm.to_string());
      } else if (!o.json) {
        fmt::print("verify P={}{}: identical to P=1 at all {} steps (latents {} elements, compressed caches "
                   "{} bytes, rings {} floats, link {} entries compared)\n",
                   P, on_gpu ? " (cuda, every rank on the GPU vs the CPU single-rank references)" : "",
                   res.steps.size(), st.latent_elements, st.cache_bytes, st.ring_floats, st.link_entries);
      }
      if (!o.json) {
        const std::string name = fmt::format("verify P={}{} attention", P, on_gpu ? " (cuda)" : "");
        if (!sc.read_path)
          fmt::print("{}: not checked ({})\n", name, on_gpu ? "the read path runs on the CPU only" : "--read-path off");
        else if (attn_identical && !res.first_mismatch)
          fmt::print("{}: identical to P=1 at all {} steps ({} token rows of every rank, decode copies included: top-k "
                     "{} entries, outputs {} bf16 elements after the inverse RoPE, lse {} floats; read-path caches {} "
                     "bytes: SWA, compressed {}, index-K)\n",
                     name, res.steps.size(), st.attention_rows, st.topk_entries, st.output_elements, st.lse_elements,
                     st.read_cache_bytes, record_info(sc.formats[0]).name);
        else
          fmt::print("{}: {} of {} output elements, {} of {} lse, {} of {} top-k entries and {} of {} read-path cache "
                     "bytes differ over the {} step(s) checked\n",
                     name, st.output_mismatched, st.output_elements, st.lse_mismatched, st.lse_elements,
                     st.topk_mismatched, st.topk_entries, st.read_cache_mismatched, st.read_cache_bytes,
                     res.steps.size());
      }
    }
    out["runs"].push_back(run);
  }
  if (o.json) fmt::print("{}\n", out.dump(2));
  return any_mismatch ? 1 : 0;
}

// One worker of --launch local: rank env.rank of P over NCCL on GPU env.device, run and verified
// by the library (pcp::run_worker_rank); this prints its steps and verdict.
int run_worker_impl(const RunOptions& o, const comm::WorkerEnv& env, const pcp::SimConfig& sc_in,
                    const pcp::Workload& w) {
  const int P = env.world, r = env.rank;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  NcclCommunicator nccl(r, P, comm::nccl_worker_unique_id(env, timeout), env.device, timeout);
  pcp::SimConfig sc = sc_in;
  sc.device = Device::CUDA;
  sc.cuda_device = env.device;
  std::printf("rank %d/%d: GPU %d, NCCL %s, %zu steps%s; the read path is not run (its layer runs on the CPU "
              "only)\n", r, P, env.device, nccl_version_string().c_str(), w.steps.size(),
              o.verify ? ", verifying against a CPU run of all ranks (itself checked against P = 1)" : "");
  std::printf("rank %d/%d: %4s %6s %6s %5s %9s %12s %12s %12s %12s %12s\n", r, P, "step", "tokens", "padded", "rows",
              "gpu ms", "nccl sent", "nccl recv", "expect sent", "expect recv", "kv all-gath");
  std::fflush(stdout);
  pcp::WorkerOptions wo;
  wo.verify = o.verify;
  // --kill-rank: after the ranks have met, so that the other ranks are inside the step (its
  // all-gathers and the communicator's wait before the link comes back) when this one dies
  wo.at_step_start = [&](int64_t i) {
    if (r == o.kill_rank && i == kill_step(o)) comm::kill_self(env, fmt::format("at the start of step {}", i).c_str());
  };
  wo.on_step = [&](const pcp::WorkerStep& st) {
    const pcp::StepReport& rep = st.report;
    const pcp::CommVolume& v = st.expected;
    std::printf("rank %d/%d: %4lld %6lld %6lld %5lld %9.3f %12s %12s %12s %12s %12s\n", r, P,
                static_cast<long long>(rep.step), static_cast<long long>(rep.num_tokens),
                static_cast<long long>(rep.padded), static_cast<long long>(rep.num_rows), st.device_ms,
                human_bytes(st.sent).c_str(), human_bytes(st.received).c_str(), human_bytes(v.sent()).c_str(),
                human_bytes(v.received()).c_str(), v.replaced_received ? human_bytes(v.replaced_received).c_str() : "-");
    std::fflush(stdout);
  };
  const pcp::WorkerResult res = pcp::run_worker_rank(sc, w, nccl, wo);
  const int64_t n = res.steps_run;
  std::printf("rank %d/%d: total over %lld steps: gpu %.3f ms (%.3f ms/step), NCCL moved sent %s received %s "
              "(SPEC 7.7: %s / %s); replaced kv_score all-gather %s\n",
              r, P, static_cast<long long>(n), res.device_ms, n ? res.device_ms / static_cast<double>(n) : 0.0,
              human_bytes(res.sent).c_str(), human_bytes(res.received).c_str(), human_bytes(res.expected.sent()).c_str(),
              human_bytes(res.expected.received()).c_str(),
              res.expected.replaced_received ? human_bytes(res.expected.replaced_received).c_str() : "- (ratio 1)");
  if (res.first_mismatch) {
    std::printf("rank %d/%d: verify: DIFFERENCE at %s\n", r, P, res.first_mismatch->to_string().c_str());
    std::fflush(stdout);
    return 1;
  }
  const pcp::CheckStats& own = res.rank_vs_cpu;
  const pcp::CheckStats& spec = res.cpu_vs_references;
  if (o.verify)
    std::printf("rank %d/%d: verify: identical at all %lld steps: this rank (GPU, NCCL) == the same rank of the CPU "
                "run (latents %llu elements, caches %llu bytes, ring %llu floats, link %llu entries), and the CPU "
                "run == the single-rank references (SPEC 7.8: latents %llu, caches %llu bytes, rings %llu floats)\n",
                r, P, static_cast<long long>(n), static_cast<unsigned long long>(own.latent_elements),
                static_cast<unsigned long long>(own.cache_bytes), static_cast<unsigned long long>(own.ring_floats),
                static_cast<unsigned long long>(own.link_entries),
                static_cast<unsigned long long>(spec.latent_elements),
                static_cast<unsigned long long>(spec.cache_bytes), static_cast<unsigned long long>(spec.ring_floats));
  std::fflush(stdout);
  return 0;
}

int run_worker(const RunOptions& o, const comm::WorkerEnv& env, const pcp::SimConfig& sc, const pcp::Workload& w) {
  int code = 1;
  try {
    code = run_worker_impl(o, env, sc, w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d/%d: error: %s\n", env.rank, env.world, e.what());
    code = 1;
  }
  // Leave without CUDA/NCCL teardown: a failed rank may have device work stuck on a dead peer
  // (the communicator already aborted or finalized above when it was destroyed).
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

int launch_workers(const RunOptions& o, int P, const std::vector<std::string>& command_line) {
  if (!nccl_available()) {
    std::fprintf(stderr, "dsv41kv: run --launch local: this build has no NCCL (%s): configure with CUDA and NCCL "
                         "(DSV41KV_NCCL=ON), or run the ranks in one process (no --launch)\n",
                 nccl_version_string().c_str());
    return 2;
  }
  std::string why;
  const int gpus = comm::visible_cuda_devices(&why);
  if (gpus < P) {
    std::fprintf(stderr, "dsv41kv: run --launch local --pcp %d needs %d GPUs (one per rank), %d visible%s%s\n", P, P,
                 gpus, why.empty() ? "" : ": ", why.c_str());
    return 2;
  }
  comm::LaunchOptions lo;
  lo.world = P;
  lo.rendezvous = o.rendezvous;
  lo.failure_grace = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)) + std::chrono::seconds(10);
  lo.max_runtime = std::chrono::milliseconds(static_cast<int64_t>(o.max_runtime_s * 1000));
  // The workers get this process's command line as it was given (they recognise themselves by
  // the launcher's environment); only the program path is made absolute.
  lo.argv = command_line;
  lo.argv.at(0) = comm::self_executable();
  std::printf("run: launching %d worker(s), one per GPU, NCCL %s, rendezvous %s, timeout %g s\n", P,
              nccl_version_string().c_str(), o.rendezvous.c_str(), o.timeout_s);
  std::fflush(stdout);
  const comm::LaunchResult res = comm::launch_local(lo);
  std::printf("run: %s\n%s\n", res.exit_code == 0 ? (o.verify ? "PASS (every rank verified)" : "OK") : "FAIL",
              res.summary().c_str());
  return res.exit_code;
}

}  // namespace

void add_run(CLI::App& app, int& exit_code, std::vector<std::string> command_line) {
  auto* cmd = app.add_subcommand(
      "run", "multi-step PCP serving simulation: per-step communication volume; --verify checks SPEC 7.8 "
             "against the single-rank run (exit 1 on a difference)");
  static RunOptions o;
  cmd->add_option("--pcp", o.pcp, "PCP sizes P[,P...] (1..64)")->capture_default_str();
  cmd->add_option("--steps", o.steps, "stop after this many steps (0: until every request finished)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))->capture_default_str();
  cmd->add_option("--requests", o.requests, "number of requests")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--prompt-len", o.prompt_len, "prompt tokens to prefill, MIN:MAX")->capture_default_str();
  cmd->add_option("--start", o.start, "num_computed at admission (continued prefill), MIN:MAX")->capture_default_str();
  cmd->add_option("--decode-steps", o.decode_steps, "decode steps per request")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--chunk-budget", o.chunk_budget, "token budget per step (chunked prefill)")->check(CLI::Range(int64_t{1}, int64_t{1} << 30))->capture_default_str();
  cmd->add_option("--max-num-seqs", o.max_num_seqs, "running requests at once")->check(CLI::Range(1, 65536))->capture_default_str();
  cmd->add_option("--decode-placement", o.placement, "replicated | owner (SPEC 7.9)")
      ->check(CLI::IsMember({"replicated", "owner"}))->capture_default_str();
  cmd->add_option("--seed", o.seed, "workload seed")->check(unsigned64())->capture_default_str();
  cmd->add_option("--format", o.format, "compressed-cache formats: all or a list of v4_584,mxfp8_528,nvfp4_288,bf16,fp8")->capture_default_str();
  cmd->add_option("--ratio", o.ratio, "compress ratio of the kv-source layer (1 or 2)")->check(CLI::IsMember({1, 2}))->capture_default_str();
  cmd->add_option("--null-fraction", o.null_fraction, "share of null-block requests")->check(finite_range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--graph-pad", o.graph_pad, "round padded up to a multiple of this (0: none)")->check(CLI::Range(0, 1 << 16))->capture_default_str();
  cmd->add_option("--states-per-page", o.states_per_page, "compressed states per page (0: 64 / ratio)")->check(CLI::Range(0, 1 << 16))->capture_default_str();
  cmd->add_option("--num-speculative-tokens", o.num_spec, "speculative tokens (rejected with P > 1, E6)")->check(CLI::Range(0, 1 << 10))->capture_default_str();
  cmd->add_flag("--json", o.json, "machine-readable output");
#if defined(DSV41KV_TEST_SEAMS)
  // The test seam (dsv41kv/test_seam.hpp): break the PCP step on purpose to show that --verify
  // catches it (hidden; builds without seams have no such flag).
  cmd->add_option("--mutation", o.mutation, "")
      ->check(CLI::IsMember({"none", "drop-gathered-predecessors", "reverse-tie-break", "skip-save-ring-rows",
                              "local-swa-insert", "perturb-attention"}))
      ->group("");
#endif
  cmd->add_flag("--verify", o.verify, "compare every step with P = 1 (SPEC 7.8; with the read path also every "
                                      "token's top-k, attention output and lse); exit 1 on a difference");
  cmd->add_option("--read-path", o.read_path, "auto | on | off: each rank's SWA and index-K inserts of the gathered rows "
                                              "and the attention of its own query rows (auto: on with --device cpu, "
                                              "off with cuda: the read path's layer runs on the CPU only)")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  cmd->add_option("--heads", o.heads, "query heads of the read path's layer (8, 16, 32, 64 or 128)")
      ->check(CLI::IsMember({8, 16, 32, 64, 128}))->capture_default_str();
  cmd->add_option("--topk", o.topk, "auto | scored: the indexer's shortcut when max seq_len / ratio <= 512 (SPEC "
                                    "8.6), or always the scores (as under CUDA-graph capture)")
      ->check(CLI::IsMember({"auto", "scored"}))->capture_default_str();
  cmd->add_option("--device", o.device, "cpu | cuda: where the ranks' caches, rings and latents live (cuda: exit 2 "
                                        "without a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--launch", o.launch, "none: P ranks as threads of this process; local (with --device cuda): P "
                                        "worker processes, one per GPU, over NCCL")
      ->check(CLI::IsMember({"none", "local"}))->capture_default_str();
  cmd->add_option("--rendezvous", o.rendezvous, "--launch local: how rank 0 shares the NCCL id (tcp | file)")
      ->check(CLI::IsMember({"tcp", "file"}))->capture_default_str();
  cmd->add_option("--timeout", o.timeout_s, "--launch local: seconds a rank waits for the others")
      ->check(finite_range(0.1, 3600.0))->capture_default_str();
  cmd->add_option("--max-runtime", o.max_runtime_s, "--launch local: seconds after which the launcher ends the run")
      ->check(finite_range(1.0, 86400.0))->capture_default_str();
  cmd->add_option("--kill-rank", o.kill_rank, "--launch local: this rank kills itself (SIGKILL) mid-run; every "
                                              "other rank must end with an error naming itself within --timeout")
      ->check(CLI::Range(-1, 63))->capture_default_str();
  cmd->add_option("--kill-at-step", o.kill_at_step, "--kill-rank: ... at the start of this step (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->callback([&exit_code, line = std::move(command_line)] { exit_code = run_command(o, line); });
}

}  // namespace dsv41kv::cli
