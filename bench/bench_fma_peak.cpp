// BM_Fp32FmaPeak: this machine's fp32 FMA peak (fma_peak.hpp), per thread with Google Benchmark's
// ->Threads so that the figure for n threads is measured in the same run as the ops at n threads
// (which also divide their rates by the same loop's figure, measured in their process).
#include <benchmark/benchmark.h>

#include <thread>

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

// One run per thread count from 1 to the hardware's (Google Benchmark sums the per-thread rates).
void thread_counts(benchmark::internal::Benchmark* b) {
  const int hc = static_cast<int>(std::thread::hardware_concurrency());
  for (int t = 1; t <= (hc > 0 ? hc : 1); t *= 2) b->Threads(t);
  if (hc > 1 && (hc & (hc - 1)) != 0) b->Threads(hc);
}

BENCHMARK(BM_Fp32FmaPeak)->Apply(thread_counts)->UseRealTime();

}  // namespace
