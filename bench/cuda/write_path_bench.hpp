// `dsv41kv bench --device cuda`: the CUDA write path on the workloads of ../shared/baselines
// (vLLM's Triton kernels on an H200; bench/traffic_model.hpp lists them): for each workload,
// ratio and record, the fused launch (compress_insert, no latent_out) and the separate kernels
// (compress with latent_out, then insert).
//
// Timing: CUDA events after warm-up, median over `iters` repetitions, by default the way the
// baseline was measured (triton.testing.do_bench: repetitions enqueued back to back, each between
// its own events, prefill repetitions each after an L2 flush outside the events; timing.hpp).
// Decode: a CUDA graph of 16 launches (one per layer, each layer with its own buffers unless
// `decode_buffers` is "shared"), replayed; time per layer = replay time / layers. The bytes that
// must move are bench/traffic_model.hpp's; GB/s = bytes / time, and the ratio to a 2 GiB
// device-to-device copy measured in the same run (bytes read + written). With a baseline, vLLM's
// time for the same work (its two launches: fused_ms + insert_ms) and the speedup over it.
// "wrong" counts the cache bytes where the fused launch and the separate kernels disagree
// (they must not: both are bit-identical to the CPU reference).
//
// This header is host code (the CLI declares its flags on the options in every build); the
// bench itself, write_path_bench.cpp, is built in CUDA builds only.
#pragma once

#include <string>

#include "bench/baseline.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/tuning.hpp"

namespace dsv41kv::bench {

struct WritePathBenchOptions {
  bool json = false;
  int iters = 50;
  BaselineLookup baseline;          // --baseline FILE or the default paths (no baseline: no vLLM columns)
  std::string only;                 // one workload ("" = all)
  int only_ratio = 0;               // one ratio (0 = both)
  std::string only_record;          // one record format ("" = all)
  CompressTuning tuning;            // --program-warps, --stream-chunk, --stream-rows, the taper
  std::string stream_head;          // "W,C[;W,C]" (CompressTuning::taper), as given
  std::string stream_tail;          // "W,C[;W,C[;W,C]]", "0": no tail, as given
  std::string timing = "do_bench";  // do_bench | sync (Timing)
  std::string decode_buffers = "per-layer";
  bool pdl = ExecContext{}.programmatic_launch;  // the library's default launch
  bool pdl_early_metadata = ExecContext{}.pdl_early_metadata;
};

// Runs the bench on the current CUDA device and prints its report (a table, or JSON with
// `json`) on stdout. Returns the exit status: 0 done, 1 wrong bytes found, 2 no CUDA device.
// Throws Error on CUDA failures.
int run_write_path_bench(const WritePathBenchOptions& o);

}  // namespace dsv41kv::bench
