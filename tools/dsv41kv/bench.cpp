// `dsv41kv bench --device cuda [--json] [--iters N] [--baseline FILE] ...`: the flags of the write-path
// GPU benchmark, their errors (exit 2) and the call of the bench itself
// (bench/cuda/write_path_bench.hpp, CUDA builds only); with --read the read-path bench instead
// (bench/cuda/read_path_bench.hpp: --op, --batch, --heads, --nc, --tokens, --samples, --record).
//
// Exit codes: 0 done, 1 wrong elements found, 2 bad flags, an unreadable baseline, no CUDA.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/baseline.hpp"
#include "bench/cuda/read_path_bench.hpp"
#include "bench/cuda/write_path_bench.hpp"
#include "bench/traffic_model.hpp"
#include "commands.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/tuning.hpp"

namespace dsv41kv::cli {

void add_bench(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "time the CUDA write path on the baseline workloads");
  static std::string device = "cuda";
  static bench::WritePathBenchOptions o;
  static std::string baseline;
  static bool read = false;
  static bench::ReadPathBenchOptions ro;
  cmd->add_option("--device", device, "cuda (the CPU path is benchmarked by bench/)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_flag("--json", o.json, "print JSON instead of a table");
  cmd->add_flag("--read", read,
                "time the read path (sparse decode, indexer top-k, sparse prefill) instead of the write path");
  cmd->add_option("--op", ro.op, "--read: one op only")->check(CLI::IsMember({"decode", "indexer", "prefill"}));
  cmd->add_option("--batch", ro.batch, "--read: one batch only (decode: 2, 64, 128, 148, 256; indexer: any)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--heads", ro.heads, "--read decode: one head count only")->check(CLI::IsMember({64, 128}));
  cmd->add_option("--nc", ro.n_c, "--read indexer: one n_c only")->check(CLI::IsMember({4096, 65536, 131072, 1048576}));
  cmd->add_option("--tokens", ro.tokens, "--read prefill: one query-token count only")
      ->check(CLI::IsMember({32768, 131072}));
  cmd->add_option("--samples", ro.samples, "--read: requests (prefill: tokens) checked against the CPU per line")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--iters", o.iters, "timed repetitions per measurement (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--baseline", baseline,
                  "vLLM baseline JSON (default: ../shared/baselines/vllm_triton_h200.json beside the source "
                  "tree, else beside the current directory; none found: no vLLM columns)");
  std::vector<std::string> workload_names;
  for (const bench::Workload& w : bench::kWorkloads) workload_names.emplace_back(w.name);
  cmd->add_option("--workload", o.only, "run one workload only")->check(CLI::IsMember(workload_names));
  cmd->add_option("--ratio", o.only_ratio, "run one compress ratio only (1 or 2; default both)")
      ->check(CLI::IsMember({1, 2}));
  std::vector<std::string> record_names;
  for (RecordFormat f : bench::kWritePathFormats) record_names.emplace_back(record_info(f).name);
  cmd->add_option("--record", o.only_record, "run one record format only (default all)")
      ->check(CLI::IsMember(record_names));
  cmd->add_option("--program-warps", o.tuning.program_warps,
                  "compress kernel geometry: 0 = by size (default), 1 = one warp per token, 4 = four")
      ->check(CLI::IsMember({0, 1, 4}));
  cmd->add_option("--stream-chunk", o.tuning.stream_chunk,
                  "programs per chunk of the streaming compress kernel: 0 = by grid size (default), 8 or 16 "
                  "(16: kv rows read with the L2 evict-first policy)")
      ->check(CLI::IsMember({0, 8, 16}));
  cmd->add_option("--stream-rows", o.tuning.stream_rows,
                  "ratio-1 NVFP4 chunk-16 kernel's rows: 0 = the library's choice (default), 1 = cp.async, "
                  "2 = TMA at any grid size")
      ->check(CLI::IsMember({0, 1, 2}));
  cmd->add_option("--stream-head", o.stream_head,
                  "shape of the ratio-1 streaming grid, first tokens: W,C[;W,C] = parts of W x (resident warps) "
                  "warps of at most C tokens each (with --stream-head or --stream-tail the library's own shape is "
                  "replaced: an absent one means no parts)");
  cmd->add_option("--stream-tail", o.stream_tail,
                  "shape of the ratio-1 streaming grid, last tokens: W,C[;W,C[;W,C]] (the last part takes the "
                  "last tokens), or 0 for none");
  cmd->add_option("--timing", o.timing,
                  "do_bench (default: the baseline's method, triton.testing.do_bench: repetitions back to "
                  "back, an L2 flush before each prefill repetition) or sync (each repetition alone)")
      ->check(CLI::IsMember({"do_bench", "sync"}))
      ->capture_default_str();
  cmd->add_option("--decode-buffers", o.decode_buffers,
                  "decode graph: per-layer (each of the 16 nodes its own buffers, default) or shared "
                  "(every node the same buffers, as the baseline's do_bench replays one kernel)")
      ->check(CLI::IsMember({"per-layer", "shared"}))
      ->capture_default_str();
  cmd->add_flag("--pdl,!--no-pdl", o.pdl,
                "launch the compress kernels with programmatic dependent launch "
                "(ExecContext::programmatic_launch, the default) or without (--no-pdl)");
  cmd->add_flag("--pdl-early-metadata", o.pdl_early_metadata,
                "ExecContext::pdl_early_metadata (the bench uploads all metadata before timing; not with --no-pdl)");
  cmd->callback([&exit_code] {
    if (device != "cuda") {
      std::fprintf(stderr, "dsv41kv bench: --device %s: only cuda is benchmarked here (CPU benchmarks: build/dsv41kv_bench_cpu)\n",
                   device.c_str());
      exit_code = 2;
      return;
    }
    if (read) {
      ro.json = o.json;
      ro.iters = o.iters;
      ro.record = o.only_record;
#if defined(DSV41KV_WITH_CUDA)
      exit_code = bench::run_read_path_bench(ro);
#else
      std::fprintf(stderr, "dsv41kv bench: --device cuda: %s\n", cuda_device_description().c_str());
      exit_code = 2;
#endif
      return;
    }
    if (!ro.op.empty() || ro.batch != 0 || ro.heads != 0 || ro.n_c != 0 || ro.tokens != 0) {
      std::fprintf(stderr, "dsv41kv bench: --op, --batch, --heads, --nc and --tokens go with --read\n");
      exit_code = 2;
      return;
    }
    if (o.pdl_early_metadata && !o.pdl) {
      std::fprintf(stderr, "dsv41kv bench: --pdl-early-metadata needs programmatic launches: not with --no-pdl\n");
      exit_code = 2;
      return;
    }
#if defined(DSV41KV_WITH_CUDA)
    if (!o.stream_head.empty() || !o.stream_tail.empty()) {
      StreamTaper& tp = o.tuning.taper;
      tp.set = true;
      // "W,C[;W,C...]" (at most `max` parts) into waves/chunks; "0" or "": none. The values are
      // checked by validate_compress_tuning.
      auto parse = [](const std::string& text, int max, double* waves, int* chunks, int& n) {
        n = 0;
        if (text.empty() || text == "0") return true;
        for (size_t at = 0; at <= text.size(); ++n) {
          const size_t end = std::min(text.find(';', at), text.size());
          char extra = 0;
          if (n >= max || std::sscanf(text.substr(at, end - at).c_str(), "%lf,%d%c", &waves[n], &chunks[n], &extra) != 2)
            return false;
          at = end + 1;
        }
        return true;
      };
      const bool head_ok = parse(o.stream_head, kStreamHeadMax, tp.head_waves, tp.head_chunk, tp.nhead);
      const bool tail_ok = parse(o.stream_tail, kStreamTailMax, tp.tail_waves, tp.tail_chunk, tp.ntail);
      if (!head_ok || !tail_ok) {
        std::fprintf(stderr, "dsv41kv bench: %s %s: expected 0 or up to %d parts WAVES,CHUNK separated by ';'\n",
                     head_ok ? "--stream-tail" : "--stream-head", (head_ok ? o.stream_tail : o.stream_head).c_str(),
                     head_ok ? kStreamTailMax : kStreamHeadMax);
        exit_code = 2;
        return;
      }
    }
    try {
      validate_compress_tuning(o.tuning);
    } catch (const Error& e) {
      std::fprintf(stderr, "dsv41kv bench: --stream-head '%s' --stream-tail '%s': %s\n", o.stream_head.c_str(),
                   o.stream_tail.c_str(), e.what());
      exit_code = 2;
      return;
    }
#endif
    try {
      o.baseline = bench::lookup_baseline(baseline);
    } catch (const Error& e) {
      std::fprintf(stderr, "dsv41kv bench: %s%s\n", baseline.empty() ? "baseline " : "--baseline ", e.what());
      exit_code = 2;
      return;
    }
#if defined(DSV41KV_WITH_CUDA)
    exit_code = bench::run_write_path_bench(o);
#else
    std::fprintf(stderr, "dsv41kv bench: --device cuda: %s\n", cuda_device_description().c_str());
    exit_code = 2;
#endif
  });
}

}  // namespace dsv41kv::cli
