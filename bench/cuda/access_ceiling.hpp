// What the 256K ratio-1 fused launch's memory traffic costs by itself (docs/performance.md,
// "The access-pattern ceiling"): kernels that move exactly the fused kernel's bytes in its
// pattern (its grid of 8 tokens per warp, a metadata round per warp, each token's 2048-byte fp32
// row read, its record written at its slot in the page layout of records.hpp) and do no
// arithmetic, timed the way `dsv41kv bench` times (the baseline's do_bench, an L2 flush before
// each repetition) against the same 2 GiB copy. Three ways to read a row:
//   registers  4 x 16-byte loads per lane, one token ahead (no shared memory);
//   cp.async   16 bytes per lane into a padded 3-slot shared ring, two tokens ahead, then the
//              writer layout's 16-byte shared reads (the fused kernel's mechanism);
//   bulk copy  one cp.async.bulk of the whole row per token (sm_90), unpadded ring, two ahead.
// The fused kernel's figure in `dsv41kv bench` over this tool's is what its arithmetic and
// pipeline cost; this tool's over the copy's is what the access pattern costs. By default the
// kernels read one int64 per token (its slot) besides its row; with all_inputs (`--inputs all`)
// they also read what else the fused kernel reads: the token's position and insert slot (the
// record goes to the insert slot) and its RoPE table row (256 bytes; 5 MB of distinct rows at
// 256K, ~1.3% more DRAM bytes than the counted ones), the cp.async kernel by the fused kernel's
// two 4-byte evict-last copies per lane into a shared ring, the registers kernel by plain loads
// one token ahead, the bulk-copy kernel by plain loads when the token is processed.
#pragma once

#include <string>
#include <vector>

namespace dsv41kv::bench {

enum class RowMechanism { kRegisters, kCpAsync, kBulkCopy };
const char* mechanism_name(RowMechanism m);

struct CeilingRow {
  std::string record;         // v4_584, mxfp8_528, nvfp4_288
  double bytes = 0;           // bytes the fused launch must move: T x (2048 + record bytes)
  double copy_same_bytes_us = 0;  // a device-to-device copy of bytes / 2 (read + written = bytes)
  std::vector<double> us;     // per RowMechanism (registers, cp.async, bulk copy); -1: not run
};
struct CeilingReport {
  std::string device;
  bool all_inputs = false;  // the kernels read positions, insert slots and RoPE rows too
  double copy_GBps = 0;  // the 2 GiB copy (read + written), as dsv41kv bench
  std::vector<CeilingRow> rows;
};

// Runs every measurement on the current CUDA device (`iters` timed repetitions each, median);
// the cp.async and bulk-copy kernels only on compute capability >= 9.0. Throws on CUDA errors.
CeilingReport run_access_ceiling(int iters, bool all_inputs = false);

}  // namespace dsv41kv::bench
