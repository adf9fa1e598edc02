// CPU benchmarks of the compressor path (Google Benchmark): compress (ratio 2, policy tail) and
// insert (584 record) for a decode batch (256 requests x 1 token) and a prefill batch
// (8 requests x 1024 tokens). Bytes/s counts kv_score bytes read plus latent/record bytes written.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dsv41kv/compressor.hpp"

namespace {

using namespace dsv41kv;

struct Bench {
  int64_t N = 0, reqs = 0, cap = 8, S = 32, pages = 0;
  std::vector<float> kv, ring, table;
  std::vector<int64_t> pos, ring_slots, cache_slots;
  std::vector<int32_t> qsl, t2r;
  std::vector<uint16_t> norm, latent;
  std::vector<uint8_t> cache;

  Bench(int64_t reqs_, int64_t len) : reqs(reqs_) {
    N = reqs * len;
    uint64_t s = 12345;
    auto rnd = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
    };
    kv.resize(static_cast<size_t>(N * 1024));
    for (auto& v : kv) v = rnd();
    ring.resize(static_cast<size_t>((reqs + 1) * cap * 1024));
    for (auto& v : ring) v = rnd();
    const int64_t start = len == 1 ? 4001 : 0;  // decodes at an odd position: ring reads
    table.resize(static_cast<size_t>((start + len + 1) * 64));
    for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(static_cast<float>(i));
    qsl.push_back(0);
    const int64_t pages_per_req = (start + len) / 2 / S + 1;
    pages = reqs * pages_per_req;
    for (int64_t j = 0; j < reqs; ++j) {
      for (int64_t i = 0; i < len; ++i) {
        const int64_t p = start + i;
        pos.push_back(p);
        t2r.push_back(static_cast<int32_t>(j));
        ring_slots.push_back((j + 1) * cap + p % cap);
        cache_slots.push_back(j * pages_per_req * S + p / 2);
      }
      qsl.push_back(static_cast<int32_t>(pos.size()));
    }
    norm.assign(512, 0x3F80);
    latent.assign(static_cast<size_t>(N * 512), 0);
    cache.assign(static_cast<size_t>(pages * V4Layout::default_page_stride(S)), 0);
  }
  CompressArgs compress_args() {
    CompressArgs a;
    a.ratio = 2;
    a.kv_score = TensorView::contiguous(kv.data(), DType::F32, {N, 1024});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {N});
    a.slot_mapping = TensorView::contiguous(ring_slots.data(), DType::I64, {N});
    a.norm_weight = TensorView::contiguous(norm.data(), DType::BF16, {512});
    a.eps = 1e-6f;
    a.latent_out = TensorView::contiguous(latent.data(), DType::BF16, {N, 512});
    a.ring = TensorView::contiguous(ring.data(), DType::F32, {reqs + 1, cap, 1024});
    a.qsl = TensorView::contiguous(qsl.data(), DType::I32, {reqs + 1});
    a.token_to_req = TensorView::contiguous(t2r.data(), DType::I32, {N});
    return a;
  }
  InsertArgs insert_args() {
    InsertArgs a;
    a.ratio = 2;
    a.latent = TensorView::contiguous(latent.data(), DType::BF16, {N, 512});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {N});
    a.rope_table = TensorView::contiguous(table.data(), DType::F32, {static_cast<int64_t>(table.size() / 64), 64});
    a.slots = TensorView::contiguous(cache_slots.data(), DType::I64, {N});
    a.cache = CacheView::with_default_strides(cache.data(), RecordFormat::V4_584, pages, S);
    return a;
  }
};

void BM_Compress(benchmark::State& st, int64_t reqs, int64_t len) {
  Bench b(reqs, len);
  const ExecContext ctx{nullptr, static_cast<int>(st.range(0))};
  const CompressArgs a = b.compress_args();
  for (auto _ : st) {
    compress(a, ctx);
    benchmark::DoNotOptimize(b.latent.data());
  }
  // kv_score rows read + latents written (one per closing token: about half of them).
  st.SetBytesProcessed(st.iterations() * b.N * (1024 * 4 + 512));
  st.SetItemsProcessed(st.iterations() * b.N);
}

void BM_Insert(benchmark::State& st, int64_t reqs, int64_t len) {
  Bench b(reqs, len);
  compress(b.compress_args());
  const ExecContext ctx{nullptr, static_cast<int>(st.range(0))};
  const InsertArgs a = b.insert_args();
  for (auto _ : st) {
    insert(a, ctx);
    benchmark::DoNotOptimize(b.cache.data());
  }
  // latent rows read + 584-byte records written for the closing half of the tokens.
  st.SetBytesProcessed(st.iterations() * (b.N * 1024 + b.N / 2 * 584));
  st.SetItemsProcessed(st.iterations() * b.N);
}

BENCHMARK_CAPTURE(BM_Compress, decode_256x1, 256, 1)->Arg(1)->Arg(0)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compress, prefill_8x1024, 8, 1024)->Arg(1)->Arg(0)->UseRealTime();
BENCHMARK_CAPTURE(BM_Insert, decode_256x1, 256, 1)->Arg(1)->Arg(0)->UseRealTime();
BENCHMARK_CAPTURE(BM_Insert, prefill_8x1024, 8, 1024)->Arg(1)->Arg(0)->UseRealTime();

}  // namespace
