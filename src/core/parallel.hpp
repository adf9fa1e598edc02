// Deterministic CPU parallelism for the compressor path: a static split of [0, n) into at most
// `threads` contiguous ranges, each run on its own std::thread (the caller runs the first).
// Results never depend on the split because every output element is computed by exactly one
// range with an order that does not depend on the range bounds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

// Threads a call may use: ctx.num_threads, or hardware concurrency when it is 0.
inline int cpu_threads(const ExecContext& ctx) {
  if (ctx.num_threads > 0) return ctx.num_threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

// Runs f(begin, end) over [0, n) in ranges of at least `grain` items.
template <class F>
void parallel_for(int64_t n, const ExecContext& ctx, int64_t grain, F&& f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_parts = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(cpu_threads(ctx), max_parts);
  if (parts <= 1) {
    f(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(parts));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts - 1));
  auto run = [&](int64_t part) {
    const int64_t b = n * part / parts, e = n * (part + 1) / parts;
    try {
      f(b, e);
    } catch (...) {
      errors[static_cast<size_t>(part)] = std::current_exception();
    }
  };
  for (int64_t part = 1; part < parts; ++part) pool.emplace_back(run, part);
  run(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dsv41kv::detail
