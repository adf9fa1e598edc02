// CPU benchmark of indexer_topk (Google Benchmark) as a decode step runs it: T requests of one
// token each at n_c = 64K visible entries of an FP8 index-K cache (132-byte records, 64 states per
// page, ratio 1), the scores and the top-512 selection, on `threads` threads. GFLOP/s counts the
// 2 * 32 * 128 flops of D per (token, entry) scored (the multiply-adds the fp32 FMA peak bounds;
// the scores run them in binary64, D exact, so the binary64 peak, half the fp32 one, is the
// ceiling); pct_of_peak divides it by the fp32 FMA peak of the same thread count measured in the
// same run around this benchmark's timing (fma_peak.hpp). The selection is included.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "fma_peak.hpp"

namespace {

using namespace dsv41kv;

constexpr int64_t kEntries = 65536;
constexpr int64_t kStatesPerPage = 64;

void BM_IndexerScores(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t pages_per_req = kEntries / kStatesPerPage;
  uint64_t seed = 12345;
  auto rnd = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return seed >> 33;
  };
  auto finite_e4m3 = [&] {
    auto c = static_cast<uint8_t>(rnd());
    return (c & 0x7F) == 0x7F ? uint8_t{0} : c;
  };
  IndexKCacheView cache = IndexKCacheView::with_default_strides(nullptr, IndexKFormat::FP8_132, T * pages_per_req,
                                                                 kStatesPerPage);
  std::vector<uint8_t> backing(static_cast<size_t>(cache.backing_bytes()));
  for (int64_t p = 0; p < cache.num_pages; ++p) {
    uint8_t* page = backing.data() + p * cache.page_stride;
    for (int64_t b = 0; b < kStatesPerPage * kIndexHeadDim; ++b) page[b] = finite_e4m3();
    for (int64_t r = 0; r < kStatesPerPage; ++r) {  // scales 2^e, e in [-8, 8]
      const uint32_t bits = static_cast<uint32_t>(127 + rnd() % 17 - 8) << 23;
      for (int k = 0; k < 4; ++k) page[kStatesPerPage * kIndexHeadDim + r * 4 + k] = static_cast<uint8_t>(bits >> (8 * k));
    }
  }
  cache.base = backing.data();
  std::vector<int32_t> bt(static_cast<size_t>(T * pages_per_req));  // request b: pages b * 1024 ..
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = static_cast<int32_t>(i);
  std::vector<uint8_t> q8(static_cast<size_t>(T * kIndexHeads * kIndexHeadDim));
  for (auto& v : q8) v = finite_e4m3();
  std::vector<float> w(static_cast<size_t>(T * kIndexHeads));
  for (auto& v : w) v = static_cast<float>(static_cast<int64_t>(rnd() % 2001) - 1000) * 1e-5f;
  std::vector<int64_t> pos(static_cast<size_t>(T), kEntries - 1);
  std::vector<int32_t> req(static_cast<size_t>(T)), topk(static_cast<size_t>(T * kIndexTopk));
  for (int64_t t = 0; t < T; ++t) req[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  IndexerTopkArgs a;
  a.ratio = 1;
  a.q8 = TensorView::contiguous(q8.data(), DType::U8, {T, kIndexHeads, kIndexHeadDim});
  a.w = TensorView::contiguous(w.data(), DType::F32, {T, kIndexHeads});
  a.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
  a.token_to_req = TensorView::contiguous(req.data(), DType::I32, {T});
  a.block_table = TensorView::contiguous(bt.data(), DType::I32, {T, pages_per_req});
  a.k_cache = cache;
  a.topk = TensorView::contiguous(topk.data(), DType::I32, {T, kIndexTopk});
  const ExecContext ctx{nullptr, threads};
  const bench::PeakAround peak(threads);
  for (auto _ : state) {
    indexer_topk(a, ctx);
    benchmark::DoNotOptimize(topk.data());
  }
  peak.set_counters(state, 2.0 * kIndexHeads * kIndexHeadDim * static_cast<double>(T * kEntries), static_cast<double>(T));
}
BENCHMARK(BM_IndexerScores)->Apply(bench::tokens_and_threads);

}  // namespace
