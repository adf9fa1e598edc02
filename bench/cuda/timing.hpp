// CUDA measurement helpers of the benchmarks (`dsv41kv bench`'s write_path_bench.cpp and
// dsv41kv-access-ceiling): device buffers, the timing methods and the device-to-device copy the
// figures are compared with, in one place so that every tool times and compares the same way.
// CUDA builds only.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv::bench {

// Throws kCuda "bench: <what>: <CUDA error>" unless e is cudaSuccess.
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail(ErrorCode::kCuda, fmt::format("bench: {}: {}", what, cudaGetErrorString(e)));
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) { ck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  // Blocking uploads and fills: the host calls run on the legacy stream, which does not order
  // the bench's non-blocking stream, and a pageable cudaMemcpy or a cudaMemset may return before
  // the bytes land; without the synchronisation the canary fill of a reset could overwrite the
  // output of the launch that follows it and count as `wrong`.
  void upload(const std::vector<T>& h) {
    ck(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
    ck(cudaDeviceSynchronize(), "sync after upload");
  }
  void fill(uint8_t byte) {
    ck(cudaMemset(p, byte, n * sizeof(T)), "memset");
    ck(cudaDeviceSynchronize(), "sync after memset");
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    ck(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// How the repetitions are timed (--timing):
//  kDoBench (default): the baseline's method, triton.testing.do_bench: the repetitions are
//    enqueued back to back without a host synchronisation, each between its own pair of events,
//    and eager (prefill) repetitions are each preceded by an L2 flush (a 256 MiB memset) outside
//    their events. The GPU is never idle waiting for the host, so an event pair times the work
//    and not the host's launch latency; the flush evicts the previous repetition's lines, and
//    the flush's own dirty lines are written back during the timed work, as they were in the
//    baseline's measurements.
//  kSync: each repetition alone: record, launch, record, synchronise; no flush (the method of
//    the earliest measurements: the host's launch latency is inside the events and the previous
//    repetition's lines are still in L2; at 256K the two methods agreed closely:
//    docs/changelog.md, conventions and v14).
enum class Timing { kDoBench, kSync };
inline constexpr size_t kL2FlushBytes = size_t{256} << 20;

// Times work enqueued on one stream the chosen way: median ms over `iters` repetitions after
// three warm-up runs.
class Timer {
 public:
  Timer(cudaStream_t st, int iters, Timing timing)
      : st_(st), iters_(iters), sync_(timing == Timing::kSync),
        flush_(sync_ ? Dev<uint8_t>() : Dev<uint8_t>(kL2FlushBytes)) {}

  // `fn` enqueues the work; with flush_l2 each do_bench repetition is preceded by the L2 flush;
  // at least `min_iters` repetitions.
  template <class F>
  double eager(F&& fn, bool flush_l2, int min_iters = 1) {
    auto clear_l2 = [&] {
      if (flush_l2 && !sync_) ck(cudaMemsetAsync(flush_.p, 0, flush_.n, st_), "L2 flush");
    };
    for (int i = 0; i < 3; ++i) {
      clear_l2();
      fn();
    }
    ck(cudaStreamSynchronize(st_), "sync");
    const size_t n = static_cast<size_t>(std::max(iters_, min_iters));
    std::vector<cudaEvent_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      ck(cudaEventCreate(&a[i]), "event");
      ck(cudaEventCreate(&b[i]), "event");
    }
    for (size_t i = 0; i < n; ++i) {
      clear_l2();
      ck(cudaEventRecord(a[i], st_), "record");
      fn();
      ck(cudaEventRecord(b[i], st_), "record");
      if (sync_) ck(cudaEventSynchronize(b[i]), "sync");
    }
    ck(cudaStreamSynchronize(st_), "sync");
    std::vector<double> ms;
    for (size_t i = 0; i < n; ++i) {
      float t = 0;
      ck(cudaEventElapsedTime(&t, a[i], b[i]), "elapsed");
      ms.push_back(t);
      cudaEventDestroy(a[i]);
      cudaEventDestroy(b[i]);
    }
    return median(ms);
  }

  // Captures `fn(layer)` for every layer into one graph; median replay time / layers (no flush:
  // triton's do_bench_cudagraph replays without one either).
  template <class F>
  double graph(int layers, F&& fn) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    ck(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal), "capture");
    for (int l = 0; l < layers; ++l) fn(l);
    ck(cudaStreamEndCapture(st_, &g), "end capture");
    ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
    const double ms = eager([&] { ck(cudaGraphLaunch(ge, st_), "graph launch"); }, false);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms / layers;
  }

 private:
  cudaStream_t st_;
  int iters_;
  bool sync_;
  Dev<uint8_t> flush_;  // the L2 flush buffer (do_bench timing only)
};

inline double copy_bandwidth(cudaStream_t st, Timer& timer) {
  const size_t bytes = size_t{2} << 30;
  Dev<uint8_t> src(bytes), dst(bytes);
  src.fill(1);
  const double ms = timer.eager([&] {
    ck(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, st), "memcpy");
  }, true, 5);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace dsv41kv::bench
