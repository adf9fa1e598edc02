// dsv41kv-access-ceiling [--iters N] [--inputs slots|all]: prints the access-pattern ceiling of the 256K ratio-1 fused
// launch (access_ceiling.hpp). Exit codes: 0 done, 1 CUDA error, 2 bad flags or no CUDA device.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>

#include "access_ceiling.hpp"
#include "dsv41kv/device.hpp"

int main(int argc, char** argv) {
  CLI::App app{"The memory-traffic ceiling of the 256K ratio-1 fused launch (docs/performance.md)"};
  int iters = 50;
  app.add_option("--iters", iters, "timed repetitions per measurement (median)")->check(CLI::Range(1, 100000));
  std::string inputs = "slots";
  app.add_option("--inputs", inputs,
                 "slots (default): each token's row and slot; all: also its position, insert slot and RoPE "
                 "table row, as the fused kernel reads them")
      ->check(CLI::IsMember({"slots", "all"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!dsv41kv::cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv-access-ceiling: %s\n", dsv41kv::cuda_device_description().c_str());
    return 2;
  }
  try {
    const auto rep = dsv41kv::bench::run_access_ceiling(iters, inputs == "all");
    fmt::print("device {}  copy {:.0f} GB/s (2 GiB, after the L2 flush, median of {})\n", rep.device, rep.copy_GBps,
               iters < 5 ? 5 : iters);
    fmt::print("256K ratio-1 traffic without arithmetic ({}), us (% of the copy's GB/s for the bytes counted)\n",
               rep.all_inputs ? "rows, slots, positions, insert slots, RoPE rows" : "rows and slots");
    fmt::print("{:<10} {:>8} {:>10} {:>16} {:>16} {:>16} {:>16}\n", "record", "MB", "90% needs", "copy same bytes",
               "registers", "cp.async", "bulk copy");
    for (const auto& r : rep.rows) {
      auto cell = [&](double us) {
        if (us < 0) return fmt::format("{:>16}", "(sm_90 only)");
        return fmt::format("{:>7.1f} ({:5.1f}%)", us, 100.0 * r.bytes / (us * 1e-6) / 1e9 / rep.copy_GBps);
      };
      fmt::print("{:<10} {:>8.0f} {:>10.1f} {} {} {} {}\n", r.record, r.bytes / 1e6,
                 r.bytes / (0.9 * rep.copy_GBps * 1e9) * 1e6, cell(r.copy_same_bytes_us), cell(r.us[0]), cell(r.us[1]),
                 cell(r.us[2]));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41kv-access-ceiling: %s\n", e.what());
    return 1;
  }
  return 0;
}
