// `dsv41kv bench --device cuda --read`: the CUDA read path through its public API on the workloads
// of bench/read_path_model.hpp, the lines FlashMLA's Hopper kernels are compared with
// (bench/peers/flashmla_sparse.py prints the same fields for FlashMLA on the same workloads):
//   decode   sparse_decode with its planned schedule (c2a, block 64), 64 heads 128 + 512 keys and
//            128 heads 128 + 512, s_q 2, batches 2 .. 256, every record pair (584, 528, 288 with a
//            528 SWA cache);
//   indexer  indexer_topk (scores + top-512, `scores` its workspace) at n_c 4K .. 1M, batch 128
//            (fewer at 1M when the device's free memory demands; the line says the batch), s_q 2,
//            plain and candidate-consumer layers;
//   prefill  sparse_prefill over a bf16 workspace of 65536 rows, 64 heads, 640 keys per query,
//            32K and 128K query tokens.
// Timing: CUDA events around each launch after three warm-up launches, each timed launch preceded
// by an L2 flush (a 256 MiB memset outside the events), median over `iters` (timing.hpp's Timer,
// do_bench); the device-to-device copy of the write-path bench measured in the same run.
// "wrong": elements of the sampled rows outside the SPEC 9.7 bound of the CPU backend's result
// (attention: out within 4e-3 + 1e-2 |cpu|, lse within 1e-3 + 1e-4 |cpu|, non-finite equal) or
// top-k rows outside the SPEC 8.8 set rule (indexer), plus every canary element past the rows
// written that changed. Host code: the CLI declares the flags on the options in every build; the
// bench itself, read_path_bench.cpp, is built in CUDA builds only.
#pragma once

#include <cstdint>
#include <string>

namespace dsv41kv::bench {

struct ReadPathBenchOptions {
  bool json = false;
  int iters = 50;
  std::string op;          // decode | indexer | prefill ("" = all)
  int64_t batch = 0;       // decode / indexer: one batch only (0 = the workloads' batches)
  std::string record;      // decode: one compressed record (v4_584, mxfp8_528, nvfp4_288; "" = all)
  int heads = 0;           // decode: one head count (64, 128; 0 = both)
  int64_t n_c = 0;         // indexer: one n_c only (0 = all)
  int64_t tokens = 0;      // prefill: one query-token count only (0 = both)
  int samples = 4;         // requests (prefill: tokens) checked against the CPU backend per line
};

// Runs the bench on the current CUDA device and prints its report (a table, or JSON with `json`)
// on stdout. Returns 0 done, 1 wrong elements found, 2 no CUDA device or no line matching the
// filters. Throws Error on CUDA failures.
int run_read_path_bench(const ReadPathBenchOptions& o);

}  // namespace dsv41kv::bench
