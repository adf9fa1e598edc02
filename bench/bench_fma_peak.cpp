// BM_Fp32FmaPeak: this machine's fp32 FMA peak (fma_peak.hpp), per thread with Google Benchmark's
// ->Threads so that the figure for n threads is measured in the same run as the ops at n threads
// (which also divide their rates by the same loop's figure, measured around their own timing).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "fma_peak.hpp"

namespace {

using namespace dsv41kv::bench;

void BM_Fp32FmaPeak(benchmark::State& st) {
  const FmaUnit u = widest_fma_unit();
  float sink = 0;
  for (auto _ : st) {
    sink += u.run(sink * 1e-30f + 1.0f);
    benchmark::DoNotOptimize(sink);
  }
  st.counters["GFLOP/s"] = benchmark::Counter(u.flops() * 1e-9 * static_cast<double>(st.iterations()),
                                              benchmark::Counter::kIsRate);
  st.SetLabel(u.name);
}

// The thread counts from 1 to the hardware's (powers of two, and the hardware's own).
std::vector<int> thread_counts() {
  const int hc = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<int> t;
  for (int n = 1; n <= hc; n *= 2) t.push_back(n);
  if ((hc & (hc - 1)) != 0) t.push_back(hc);
  return t;
}

// One run per thread count (Google Benchmark sums the per-thread rates).
void thread_counts(benchmark::internal::Benchmark* b) {
  for (int t : thread_counts()) b->Threads(t);
}

BENCHMARK(BM_Fp32FmaPeak)->Apply(thread_counts)->UseRealTime();

}  // namespace
