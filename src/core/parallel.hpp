// Deterministic CPU parallelism for the CPU backends: a static split of [0, n) into at most
// `threads` contiguous ranges, the first run by the caller, the others by the workers of a
// process-wide pool (started on first use, as many as the largest split asked for minus one).
// Results never depend on the split because every output element is computed by exactly one
// range with an order that does not depend on the range bounds.
//
// The workers persist and spin a little (about 0.2 ms) before they sleep: a thread per call, or a
// sleeping worker, costs a wake-up on every call, which on a virtual machine's idle vCPU can take
// longer than a decode step's work (measured: a new thread started 0.06 ms after its creation in
// the median, 2 ms in one case of ten).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
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

// Runs part(i) for i in [0, parts): i = 0 on the calling thread, the others on pool workers;
// returns when every part has returned and rethrows the exception of the lowest part that threw.
// A part may itself call run_parts (the waiting caller runs queued parts meanwhile).
void run_parts(int parts, const std::function<void(int)>& part);

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
  run_parts(static_cast<int>(parts), [&](int part) { f(n * part / parts, n * (part + 1) / parts); });
}

}  // namespace dsv41kv::detail
