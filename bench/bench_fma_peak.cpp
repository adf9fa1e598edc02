// This machine's fp32 FMA peak, the yardstick of the CPU read-path benchmarks (attention decode,
// indexer scoring): independent chains of fused multiply-adds in the widest vector unit the CPU
// has (AVX-512, else AVX2 + FMA, else scalar fma), per thread, with Google Benchmark's ->Threads
// so that the figure for n threads is measured in the same run as the op at n threads.
// GFLOP/s counts 2 flops per lane per FMA. The chains (kChains accumulators) outnumber the FMA
// latency times the issue width, so the loop is bound by FMA throughput, not latency.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

constexpr int kChains = 16;
constexpr int64_t kIters = 1 << 16;  // FMAs per chain per call

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_avx512(float seed) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < kIters; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}

__attribute__((target("avx2,fma"))) float fma_avx2(float seed) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < kIters; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}
#endif

float fma_scalar(float seed) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = seed + static_cast<float>(i);
  for (int64_t k = 0; k < kIters; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = std::fma(acc[i], 0.999999f, 1e-7f);
  float t = 0;
  for (float v : acc) t += v;
  return t;
}

struct Unit {
  const char* name;
  int lanes;
  float (*run)(float);
};

Unit widest_unit() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return {"avx512", 16, fma_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2", 8, fma_avx2};
#endif
  return {"scalar", 1, fma_scalar};
}

void BM_Fp32FmaPeak(benchmark::State& st) {
  const Unit u = widest_unit();
  float sink = 0;
  for (auto _ : st) {
    sink += u.run(sink * 1e-30f + 1.0f);
    benchmark::DoNotOptimize(sink);
  }
  const double flops = 2.0 * u.lanes * kChains * static_cast<double>(kIters);
  st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(st.iterations()),
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
