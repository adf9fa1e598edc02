// The vLLM baseline the write-path bench compares with: vllm_triton_h200.json of
// ../shared/baselines (its README says what the fields mean), read from a file and never
// embedded, so that the figures have one home. Host code, every build.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dsv41kv::bench {

struct BaselineRow {
  int ratio = 0;
  std::string workload;
  std::optional<int64_t> tokens;
  double fused_ms = 0;                         // vLLM's compress launch (fused_save_compress_norm)
  std::optional<int64_t> fused_bytes;          // the bytes it must move
  std::map<std::string, double> insert_ms;     // per record name: vLLM's insert launch
  std::map<std::string, int64_t> insert_bytes;  // per record name: the bytes it must move
};

struct Baseline {
  std::string path;  // the file it was read from
  double copy_GBps = 0;
  std::vector<BaselineRow> rows;
  const BaselineRow* find(int ratio, const std::string& workload) const;  // nullptr: none
};

// Reads a baseline file; throws Error (kIo: cannot open, kFormat: not a baseline) naming `path`.
Baseline load_baseline(const std::string& path);

// Where the baseline is looked for without --baseline, in order: ../shared/baselines of the
// source tree (fixed at build time), then ../shared/baselines of the current directory.
std::vector<std::string> default_baseline_paths();

struct BaselineLookup {
  std::optional<Baseline> baseline;  // none: no file at any default path
  std::vector<std::string> tried;    // the paths looked at
};

// `path` given: that file (load_baseline's errors). Empty: the first of default_baseline_paths()
// that exists, or none; a default file that exists but does not parse throws like load_baseline.
BaselineLookup lookup_baseline(const std::string& path);

}  // namespace dsv41kv::bench
