// CPU benchmark of sparse_decode (Google Benchmark): the V4.1-Flash shape, 64 heads, 128 window +
// 512 compressed keys from 584-record caches (a c2a layer), T decode tokens on `threads` threads
// with the planned schedule. GFLOP/s counts 2 flops for each of the 2 * 64 * 640 * 512
// multiply-adds of the scores and the PV product per token (the work the fp32 FMA peak bounds;
// the softmax, the key reads and the merges come on top); pct_of_peak divides it by the fp32 FMA
// peak of the same thread count measured in the same run around this benchmark's timing
// (fma_peak.hpp).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "dsv41kv/attention.hpp"
#include "fma_peak.hpp"

namespace {

using namespace dsv41kv;

void BM_SparseDecodeC2A(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int H = 64;
  const int64_t S = 32, pages = 64;
  uint64_t seed = 12345;
  auto rnd = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return seed >> 33;
  };
  CacheView swa = CacheView::with_default_strides(nullptr, RecordFormat::V4_584, pages, S);
  std::vector<uint8_t> backing(swa.backing_bytes());
  // e4m3 values without the NaN codes, bf16 RoPE values of magnitude 2^-3 .. 1, UE8M0 scales 2^-7
  for (int64_t p = 0; p < pages; ++p)
    for (int64_t b = 0; b < S * 584; ++b) {
      auto v = static_cast<uint8_t>(rnd());
      if (b >= S * 576) v = 120;
      else if (b % 576 >= 448 && b % 2 == 1) v = static_cast<uint8_t>(0x3E + (v & 1));
      else if ((v & 0x7F) == 0x7F) v = 0;
      backing[static_cast<size_t>(p * swa.page_stride + b)] = v;
    }
  swa.base = backing.data();
  const CacheView cmp = swa;
  std::vector<int32_t> swa_idx(static_cast<size_t>(T * 128)), cmp_idx(static_cast<size_t>(T * 512));
  for (auto& v : swa_idx) v = static_cast<int32_t>(rnd() % (pages * S));
  for (auto& v : cmp_idx) v = static_cast<int32_t>(rnd() % (pages * S));
  std::vector<int32_t> swa_len(static_cast<size_t>(T), 128), cmp_len(static_cast<size_t>(T), 512);
  std::vector<uint16_t> q(static_cast<size_t>(T * H * 512));
  for (auto& v : q) v = static_cast<uint16_t>(0x3C00 + rnd() % 0x300);  // |q| in [2^-7, 1)
  std::vector<float> sink(H, 0.0f), lse(static_cast<size_t>(T * H));
  std::vector<uint16_t> out(static_cast<size_t>(T * H * 512));
  const ExecContext ctx{nullptr, threads};
  DecodeScheduleArgs sa;
  sa.layer = LayerType::kC2A;
  sa.num_tokens = T;
  sa.num_heads = H;
  const DecodeSchedule sched = plan_decode_schedule(sa, ctx);
  SparseDecodeArgs a;
  a.schedule = &sched;
  a.q = TensorView::contiguous(q.data(), DType::BF16, {T, H, 512});
  a.swa_cache = swa;
  a.swa_indices = TensorView::contiguous(swa_idx.data(), DType::I32, {T, 128});
  a.swa_lens = TensorView::contiguous(swa_len.data(), DType::I32, {T});
  a.cmp_cache = cmp;
  a.cmp_indices = TensorView::contiguous(cmp_idx.data(), DType::I32, {T, 512});
  a.cmp_lens = TensorView::contiguous(cmp_len.data(), DType::I32, {T});
  a.sink = TensorView::contiguous(sink.data(), DType::F32, {H});
  a.softmax_scale = 0.044194173f;
  a.out = TensorView::contiguous(out.data(), DType::BF16, {T, H, 512});
  a.lse = TensorView::contiguous(lse.data(), DType::F32, {T, H});
  const bench::PeakAround peak(threads);
  for (auto _ : state) {
    sparse_decode(a, ctx);
    benchmark::DoNotOptimize(out.data());
  }
  peak.set_counters(state, 2.0 * 2.0 * static_cast<double>(T) * H * 640 * 512, static_cast<double>(T));
  state.counters["splits"] = static_cast<double>(sched.splits);
}
BENCHMARK(BM_SparseDecodeC2A)->Apply(bench::tokens_and_threads);

}  // namespace
