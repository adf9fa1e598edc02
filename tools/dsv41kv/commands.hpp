// Subcommands of the dsv41kv tool. Each add_* registers one subcommand on the app; the
// callback returns the process exit code through `exit_code`.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace dsv41kv::cli {

// Check for an unsigned 64-bit option (seeds): decimal digits only, at most 2^64 - 1. CLI11
// converts with strtoull, which takes "-1" as 2^64 - 1 and saturates 2^64 and above, silently.
inline CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        const char* b = s.data();
        const char* e = b + s.size();
        const auto [p, ec] = std::from_chars(b, e, v);
        if (s.empty() || ec != std::errc() || p != e) return "'" + s + "' is not an integer in 0..2^64-1";
        return std::string();
      },
      "UINT64");
}

// Check for a floating-point option in [lo, hi]: CLI::Range lets NaN through (every comparison
// with NaN is false), so `--timeout nan` reached the code as a NaN.
inline CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v < lo || v > hi)
          return fmt::format("'{}' is not a number in [{}, {}]", s, lo, hi);
        return std::string();
      },
      fmt::format("[{} - {}]", lo, hi));
}

void add_info(CLI::App& app, int& exit_code);
void add_demo(CLI::App& app, int& exit_code);
void add_conform(CLI::App& app, int& exit_code);
// `command_line`: main's argc/argv, which `run --launch local` hands to its workers unchanged.
void add_run(CLI::App& app, int& exit_code, std::vector<std::string> command_line);
void add_nccl_check(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);

}  // namespace dsv41kv::cli
