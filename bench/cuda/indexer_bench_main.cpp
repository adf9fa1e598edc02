// dsv41kv-indexer-bench [--nc N] [--batch B] [--sq S] [--group G] [--iters N]: times the CUDA
// indexer_topk (scores + top-512) of a decode step against the device-to-device copy measured in
// the same run: a plain layer (the index-K bytes, 132 per entry, read once per request: GB/s and
// % of the copy) and a candidate consumer at the same n_c (its candidates: 2048 random blocks per
// token, the newest among them, the request's tokens sharing most of them), and the ratio of the
// two. Random finite keys and queries; the timing of timing.hpp (do_bench, an L2 flush before each
// repetition). Exit codes: 0 done, 1 CUDA or library error, 2 bad flags or no CUDA device.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "bench/cuda/timing.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/indexer.hpp"

namespace {

using namespace dsv41kv;

struct Rand {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

uint8_t finite_e4m3(uint64_t r) {
  auto c = static_cast<uint8_t>(r);
  return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c ^ 1) : c;
}

int run(int64_t nc, int64_t batch, int64_t sq, int group, int blocks, int kernel, int iters) {
  constexpr int64_t S = 64;
  const int64_t T = batch * sq, pages_per_req = (nc + S - 1) / S, pages = batch * pages_per_req;
  IndexKCacheView cache = IndexKCacheView::with_default_strides(nullptr, IndexKFormat::FP8_132, pages, S, Device::CUDA);
  Rand rng;
  std::vector<uint8_t> hk(static_cast<size_t>(pages * cache.page_stride), 0);
  for (int64_t p = 0; p < pages; ++p) {
    uint8_t* pg = hk.data() + p * cache.page_stride;
    for (int64_t i = 0; i < S * kIndexHeadDim; i += 8) {
      const uint64_t r = rng.next();
      for (int b = 0; b < 8; ++b) pg[i + b] = finite_e4m3(r >> (8 * b));
    }
    for (int64_t s = 0; s < S; ++s) {
      const float sc = std::ldexp(1.0f, static_cast<int>(rng.next() % 17) - 8);
      std::memcpy(pg + IndexerKFp8Layout::scale_offset(S, s), &sc, 4);
    }
  }
  std::vector<uint8_t> hq(static_cast<size_t>(T * kIndexHeads * kIndexHeadDim));
  for (auto& c : hq) c = finite_e4m3(rng.next());
  std::vector<float> hw(static_cast<size_t>(T * kIndexHeads));
  for (auto& x : hw) x = static_cast<float>(static_cast<int64_t>(rng.next() % 2001) - 1000) * 1e-5f;
  std::vector<int64_t> hpos(static_cast<size_t>(T));
  std::vector<int32_t> hreq(static_cast<size_t>(T)), hbt(static_cast<size_t>(pages));
  for (int64_t t = 0; t < T; ++t) {
    hreq[static_cast<size_t>(t)] = static_cast<int32_t>(t / sq);
    hpos[static_cast<size_t>(t)] = nc - sq + t % sq;  // the request's last token sees n_c entries
  }
  for (int64_t p = 0; p < pages; ++p) hbt[static_cast<size_t>(p)] = static_cast<int32_t>(p);
  // the consumer's rows: 2048 sorted blocks below ceil(n_c(t) / 8), the newest included; the
  // request's tokens share all but a few
  const int64_t nb = (nc + 7) / 8;
  std::vector<int32_t> hcand(static_cast<size_t>(T * kCandidateTopkBlocks), -1);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> base;
    std::vector<char> used(static_cast<size_t>(nb), 0);
    while (static_cast<int64_t>(base.size()) < std::min<int64_t>(kCandidateTopkBlocks, nb - sq)) {
      const auto x = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(nb - sq));
      if (!used[static_cast<size_t>(x)]) {
        used[static_cast<size_t>(x)] = 1;
        base.push_back(x);
      }
    }
    for (int64_t k = 0; k < sq; ++k) {
      const int64_t t = b * sq + k, nbt = ((hpos[static_cast<size_t>(t)] + 1) + 7) / 8;
      std::vector<int32_t> row(base.begin(), base.end());
      std::sort(row.begin(), row.end());
      if (static_cast<int64_t>(row.size()) >= kCandidateTopkBlocks) row.resize(kCandidateTopkBlocks - 1);
      row.push_back(static_cast<int32_t>(nbt - 1));
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      std::copy(row.begin(), row.end(), hcand.begin() + t * kCandidateTopkBlocks);
    }
  }
  bench::Dev<uint8_t> dk(hk.size()), dq(hq.size());
  bench::Dev<float> dw(hw.size());
  bench::Dev<int64_t> dpos(hpos.size());
  bench::Dev<int32_t> dreq(hreq.size()), dbt(hbt.size()), dcand(hcand.size()), dtopk(static_cast<size_t>(T * kIndexTopk));
  dk.upload(hk);
  dq.upload(hq);
  dw.upload(hw);
  dpos.upload(hpos);
  dreq.upload(hreq);
  dbt.upload(hbt);
  dcand.upload(hcand);
  cache.base = dk.p;
  cudaStream_t st;
  bench::ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  bench::Timer timer(st, iters, bench::Timing::kDoBench);
  const double copy = bench::copy_bandwidth(st, timer);
  ExecContext ctx;
  ctx.stream = st;
  auto time_role = [&](IndexerRole role) {
    bench::Dev<uint8_t> ws(static_cast<size_t>(indexer_topk_workspace_bytes(T, pages_per_req, S, role)));
    IndexerTopkArgs a;
    a.ratio = 1;
    a.role = role;
    a.q8 = TensorView::contiguous(dq.p, DType::U8, {T, kIndexHeads, kIndexHeadDim}, Device::CUDA);
    a.w = TensorView::contiguous(dw.p, DType::F32, {T, kIndexHeads}, Device::CUDA);
    a.positions = TensorView::contiguous(dpos.p, DType::I64, {T}, Device::CUDA);
    a.token_to_req = TensorView::contiguous(dreq.p, DType::I32, {T}, Device::CUDA);
    a.block_table = TensorView::contiguous(dbt.p, DType::I32, {batch, pages_per_req}, Device::CUDA);
    a.k_cache = cache;
    a.topk = TensorView::contiguous(dtopk.p, DType::I32, {T, kIndexTopk}, Device::CUDA);
    if (role != IndexerRole::kPlain)
      a.candidates = TensorView::contiguous(dcand.p, DType::I32, {T, kCandidateTopkBlocks}, Device::CUDA);
    a.workspace = TensorView::contiguous(ws.p, DType::U8, {static_cast<int64_t>(ws.n)}, Device::CUDA);
    a.group_tokens = group;
    a.score_blocks_per_sm = blocks;
    a.score_kernel = kernel;
    return timer.eager([&] { indexer_topk(a, ctx); }, true);
  };
  const double plain = time_role(IndexerRole::kPlain);
  const double cons = time_role(IndexerRole::kCandidateConsumer);
  const double bytes = static_cast<double>(batch) * static_cast<double>(nc) * IndexerKFp8Layout::kRecordBytes;
  const double gbs = bytes / (plain * 1e-3) / 1e9;
  std::printf("indexer_topk n_c %lld batch %lld s_q %lld group %d blocks/SM %d kernel %d: copy %.0f GB/s\n",
              static_cast<long long>(nc), static_cast<long long>(batch), static_cast<long long>(sq), group, blocks, kernel,
              copy);
  std::printf("  plain     %.4f ms  index-K %.0f GB/s = %.1f%% of the copy\n", plain, gbs, 100.0 * gbs / copy);
  std::printf("  consumer  %.4f ms  %.2fx faster than plain\n", cons, plain / cons);
  bench::ck(cudaStreamDestroy(st), "stream");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The CUDA indexer's scores + top-512 of a decode step against the copy bandwidth"};
  int64_t nc = 131072, batch = 128, sq = 2;
  int group = 0, blocks = 0, kernel = 0, iters = 20;
  app.add_option("--nc", nc, "visible entries of each request's last token")->check(CLI::Range(int64_t{2048}, int64_t{1} << 30));
  app.add_option("--batch", batch, "requests")->check(CLI::Range(1, 4096));
  app.add_option("--sq", sq, "decode tokens per request")->check(CLI::Range(1, 8));
  app.add_option("--group", group, "IndexerTopkArgs::group_tokens (0: the library's choice)")->check(CLI::Range(0, 8));
  app.add_option("--blocks", blocks, "IndexerTopkArgs::score_blocks_per_sm (0: the library's choice)")->check(CLI::Range(0, 2));
  app.add_option("--kernel", kernel, "IndexerTopkArgs::score_kernel (0: the library's choice, 1 chunk, 2 warpgroup)")
      ->check(CLI::Range(0, 2));
  app.add_option("--iters", iters, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!dsv41kv::cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv-indexer-bench: %s\n", dsv41kv::cuda_device_description().c_str());
    return 2;
  }
  try {
    return run(nc, batch, sq, group, blocks, kernel, iters);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv41kv-indexer-bench: %s\n", e.what());
    return 1;
  }
}
