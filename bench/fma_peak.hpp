// This machine's fp32 FMA peak, the yardstick of the CPU read-path benchmarks (attention decode,
// indexer scoring): independent chains of fused multiply-adds in the widest vector unit the CPU
// has (AVX-512, else AVX2 + FMA, else scalar fma). The chains (kChains accumulators) outnumber
// the FMA latency times the issue width, so the loop is bound by FMA throughput, not latency.
// GFLOP/s counts 2 flops per lane per FMA. BM_Fp32FmaPeak reports it per thread count; the op
// benchmarks divide their rate by the same loop's figure at their thread count, measured in the
// same run right before and after their own timing (PeakAround).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dsv41kv::bench {

inline constexpr int kFmaChains = 16;
inline constexpr int64_t kFmaIters = 1 << 16;  // FMAs per chain per call

#if defined(__x86_64__)
__attribute__((target("avx512f"))) inline float fma_avx512(float seed) {
  __m512 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < kFmaIters; ++k)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}

__attribute__((target("avx2,fma"))) inline float fma_avx2(float seed) {
  __m256 acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < kFmaIters; ++k)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}
#endif

inline float fma_scalar(float seed) {
  float acc[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) acc[i] = seed + static_cast<float>(i);
  for (int64_t k = 0; k < kFmaIters; ++k)
    for (int i = 0; i < kFmaChains; ++i) acc[i] = std::fma(acc[i], 0.999999f, 1e-7f);
  float t = 0;
  for (float v : acc) t += v;
  return t;
}

struct FmaUnit {
  const char* name;
  int lanes;
  float (*run)(float);
  // flops of one run() call
  double flops() const { return 2.0 * lanes * kFmaChains * static_cast<double>(kFmaIters); }
};

inline FmaUnit widest_fma_unit() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return {"avx512", 16, fma_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2", 8, fma_avx2};
#endif
  return {"scalar", 1, fma_scalar};
}

// GFLOP/s of `threads` threads running the FMA loop at once for about 20 ms, the best of
// `attempts` (a peak: other work on the machine can only lower it).
inline double fp32_fma_peak_gflops(int threads, int attempts = 3) {
  const FmaUnit u = widest_fma_unit();
  double best = 0.0;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    std::vector<int64_t> calls(static_cast<size_t>(threads), 0);
    std::vector<float> sink(static_cast<size_t>(threads), 0.0f);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
      pool.emplace_back([&, i] {
        float s = 1.0f;
        int64_t c = 0;
        for (; std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20); ++c) s += u.run(s * 1e-30f + 1.0f);
        calls[static_cast<size_t>(i)] = c;
        sink[static_cast<size_t>(i)] = s;
      });
    for (auto& th : pool) th.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t total = 0;
    for (int64_t c : calls) total += c;
    best = std::max(best, u.flops() * static_cast<double>(total) / sec * 1e-9);
  }
  return best;
}

// The yardstick of one op benchmark run: the fp32 FMA peak of its thread count measured just before
// its timed loop (construct it there) and just after (rate_counters), the larger of the two. This
// machine's clock moves by several percent over seconds (one core: 200 to 238 GFLOP/s), so the
// peak is taken next to the op rather than once per process.
class PeakAround {
 public:
  explicit PeakAround(int threads) : threads_(threads), before_(fp32_fma_peak_gflops(threads)) {}

  // The counters of the run that did `flops` and `tokens` per iteration: GFLOP/s, tokens/s, and
  // pct_of_peak, its GFLOP/s over the peak (peak_GFLOP/s). Call after the timed loop.
  void set_counters(benchmark::State& st, double flops, double tokens) const {
    const double it = static_cast<double>(st.iterations());
    const double peak = std::max(before_, fp32_fma_peak_gflops(threads_));
    st.counters["GFLOP/s"] = benchmark::Counter(flops * it * 1e-9, benchmark::Counter::kIsRate);
    st.counters["tokens/s"] = benchmark::Counter(tokens * it, benchmark::Counter::kIsRate);
    st.counters["pct_of_peak"] = benchmark::Counter(flops * it * 1e-9 / peak * 100.0, benchmark::Counter::kIsRate);
    st.counters["peak_GFLOP/s"] = peak;
  }

 private:
  int threads_;
  double before_;
};

// The runs of a read-path op benchmark (arguments tokens, threads): 1 and 8 decode tokens, each
// on 1 and 2 threads (this machine's cores), timed by the wall clock.
inline void tokens_and_threads(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "threads"});
  for (int64_t tokens : {1, 8})
    for (int64_t threads : {1, 2}) b->Args({tokens, threads});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace dsv41kv::bench
