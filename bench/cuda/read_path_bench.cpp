// `dsv41kv bench --device cuda --read` (read_path_bench.hpp): inputs, launches, checks, report.
#include "bench/cuda/read_path_bench.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cuda/timing.hpp"
#include "bench/read_path_model.hpp"
#include "dsv41kv/attention.hpp"
#include "dsv41kv/cache.hpp"
#include "dsv41kv/common.hpp"
#include "dsv41kv/conformance.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/indexer.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/reference.hpp"
#include "dsv41kv/rope.hpp"

namespace dsv41kv::bench {
namespace {

constexpr uint64_t kSeed = 20261202;
constexpr int64_t kPoolPages = 64;        // distinct pages a cache is tiled from
constexpr int64_t kQPoolTokens = 4096;    // distinct query rows prefill's q is tiled from
constexpr uint8_t kCanary = 0xA5;         // byte of every output buffer before the launch
constexpr size_t kStagingBytes = size_t{64} << 20;

struct Row {
  std::string op, record, swa_record, role;
  int heads = 0, swa_keys = 0, cmp_keys = 0;
  int64_t batch = 0, tokens = 0, n_c = 0;
  double ms = 0, flops = 0, bytes = 0;
  int64_t wrong = 0, checked = 0;
  int iters = 0;  // timed launches behind ms
};

// Times `fn` (after its correctness launch) with the bench's method, in a bounded time: a line
// whose first launch, timed alone after an L2 flush, took `first_ms` gets the full `iters` when
// (iters + 3) launches fit in kLineBudgetMs, else as many as fit (at least 3); a first launch over
// kSingleLaunchMs is the line's only measurement (the correctness-first kernels at 1M entries run
// for seconds: 53 launches would not fit a device call).
constexpr double kLineBudgetMs = 4000, kSingleLaunchMs = 250;
template <class F>
double time_line(cudaStream_t st, Timer& timer, int iters, F&& fn, int& used) {
  Dev<uint8_t> flush(kL2FlushBytes);
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  ck(cudaMemsetAsync(flush.p, 0, flush.n, st), "L2 flush");
  ck(cudaEventRecord(a, st), "record");
  fn();
  ck(cudaEventRecord(b, st), "record");
  ck(cudaEventSynchronize(b), "sync");
  float first = 0;
  ck(cudaEventElapsedTime(&first, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (first > kSingleLaunchMs) {
    used = 1;
    return first;
  }
  const int fit = static_cast<int>(kLineBudgetMs / std::max(1e-3, static_cast<double>(first))) - 3;
  if (fit >= iters) {
    used = iters;
    return timer.eager(fn, true);
  }
  used = std::max(3, fit);
  Timer fewer(st, used, Timing::kDoBench);
  return fewer.eager(fn, true);
}

cudaStream_t st_of(const ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// A uniform float in [lo, hi) from a counter (the big inputs: no statistics test).
float uniform_at(uint64_t seed, uint64_t i, float lo, float hi) {
  const uint64_t x = mix64(seed ^ mix64(i));
  return lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

// Page p of a paged cache is pool page mix64(seed ^ p) % pool_pages, so that any page can be
// rebuilt on the host (the CPU reference of the sampled rows) without a host copy of the cache.
const uint8_t* pool_page(const std::vector<uint8_t>& pool, int64_t page_bytes, uint64_t seed, int64_t p) {
  const int64_t k = static_cast<int64_t>(mix64(seed ^ static_cast<uint64_t>(p)) % static_cast<uint64_t>(kPoolPages));
  return pool.data() + k * page_bytes;
}
void fill_pages_host(uint8_t* dst, int64_t first, int64_t count, int64_t page_bytes, const std::vector<uint8_t>& pool,
                     uint64_t seed) {
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * page_bytes, pool_page(pool, page_bytes, seed, first + i), static_cast<size_t>(page_bytes));
}
// The whole device cache, staged through a bounded host buffer.
void upload_pages(uint8_t* dev, int64_t num_pages, int64_t page_bytes, const std::vector<uint8_t>& pool, uint64_t seed) {
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes) / page_bytes);
  std::vector<uint8_t> staging(static_cast<size_t>(std::min(per, num_pages) * page_bytes));
  for (int64_t p = 0; p < num_pages; p += per) {
    const int64_t n = std::min(per, num_pages - p);
    fill_pages_host(staging.data(), p, n, page_bytes, pool, seed);
    ck(cudaMemcpy(dev + p * page_bytes, staging.data(), static_cast<size_t>(n * page_bytes), cudaMemcpyHostToDevice),
       "cache upload");
  }
  ck(cudaDeviceSynchronize(), "sync after the cache upload");
}

// kPoolPages pages of an attention cache of format f (S states a page), every record written by
// the library's CPU insert from random bf16 latents in [-2, 2): the records are the format's own.
std::vector<uint8_t> record_pool(RecordFormat f, int64_t S, uint64_t seed) {
  CacheView c = CacheView::with_default_strides(nullptr, f, kPoolPages, S);
  std::vector<uint8_t> pool(c.backing_bytes(), 0);
  c.base = pool.data();
  const int64_t N = kPoolPages * S, rows = 4096;
  std::vector<uint16_t> latent(static_cast<size_t>(N * kLatentDim));
  for (size_t i = 0; i < latent.size(); ++i) latent[i] = num::bf16_encode(uniform_at(seed, i, -2.0f, 2.0f));
  std::vector<int64_t> pos(static_cast<size_t>(N)), slots(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    pos[static_cast<size_t>(i)] = i % rows;
    slots[static_cast<size_t>(i)] = i;
  }
  const std::vector<float> table = build_rope_table(RopeParams{}, rows).data;
  InsertArgs a;
  a.ratio = 1;
  a.latent = TensorView::contiguous(latent.data(), DType::BF16, {N, kLatentDim});
  a.positions = TensorView::contiguous(pos.data(), DType::I64, {N});
  a.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {rows, 64});
  a.slots = TensorView::contiguous(slots.data(), DType::I64, {N});
  a.cache = c;
  insert(a);
  return pool;
}

// kPoolPages pages of an FP8 index-K cache (S states a page) by the library's record writer, keys
// normal-ish with scales spread over 2^-4 .. 2^4.
std::vector<uint8_t> index_k_pool(int64_t S, uint64_t seed) {
  const IndexKCacheView c = IndexKCacheView::with_default_strides(nullptr, IndexKFormat::FP8_132, kPoolPages, S);
  std::vector<uint8_t> pool(static_cast<size_t>(c.backing_bytes()), 0);
  float k[kIndexHeadDim];
  for (int64_t p = 0; p < kPoolPages; ++p)
    for (int64_t r = 0; r < S; ++r) {
      const uint64_t st = static_cast<uint64_t>(p * S + r);
      const float scale = std::ldexp(1.0f, static_cast<int>(mix64(seed ^ st) % 9) - 4);
      for (int d = 0; d < kIndexHeadDim; ++d)
        k[d] = scale * uniform_at(seed + 1, st * kIndexHeadDim + static_cast<uint64_t>(d), -1.0f, 1.0f);
      rec::write_index_k_fp8(pool.data() + p * c.page_stride, S, r, k);
    }
  return pool;
}

// Finite e4m3 codes (no NaN code).
uint8_t finite_e4m3(uint64_t seed, uint64_t i) {
  const auto c = static_cast<uint8_t>(mix64(seed ^ mix64(i)));
  return (c & 0x7F) == 0x7F ? uint8_t{0} : c;
}

// The SPEC 9.7 comparison of the sampled rows: `rows` rows of H x 512 bf16 (out) and H lse values
// of the device against the CPU backend's; returns the elements outside the bound, adds the
// elements compared to `checked`.
int64_t attention_wrong(const uint16_t* out, const float* lse, const uint16_t* cpu_out, const float* cpu_lse,
                        int64_t rows, int H, int64_t& checked) {
  int64_t wrong = 0;
  auto bad = [](double g, double c, double atol, double rtol) {
    if (!std::isfinite(g) || !std::isfinite(c)) return !(g == c || (std::isnan(g) && std::isnan(c)));
    return std::fabs(g - c) > atol + rtol * std::fabs(c);
  };
  const int64_t n = rows * H * kLatentDim;
  for (int64_t i = 0; i < n; ++i)
    wrong += bad(num::bf16_decode(out[i]), num::bf16_decode(cpu_out[i]), conformance::kAttnAtol, conformance::kAttnRtol);
  for (int64_t i = 0; i < rows * H; ++i) wrong += bad(lse[i], cpu_lse[i], conformance::kLseAtol, conformance::kLseRtol);
  checked += n + rows * H;
  return wrong;
}

// Elements of a downloaded output past its first `written` elements that are not the canary.
template <class T>
int64_t canary_wrong(const std::vector<T>& v, size_t written) {
  T c;
  std::memset(&c, kCanary, sizeof(T));
  int64_t w = 0;
  for (size_t i = written; i < v.size(); ++i) w += std::memcmp(&v[i], &c, sizeof(T)) != 0;
  return w;
}

template <class T>
std::vector<T> rows_of(const std::vector<T>& v, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<T> r;
  r.reserve(rows.size() * static_cast<size_t>(width));
  for (int64_t t : rows) r.insert(r.end(), v.begin() + t * width, v.begin() + (t + 1) * width);
  return r;
}

// Rows `rows` of `width` elements of a device buffer, and its elements from `from` on.
template <class T>
std::vector<T> download_rows(const Dev<T>& d, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<T> h(rows.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < rows.size(); ++i)
    ck(cudaMemcpy(h.data() + i * static_cast<size_t>(width), d.p + rows[i] * width, static_cast<size_t>(width) * sizeof(T),
                  cudaMemcpyDeviceToHost), "download rows");
  return h;
}
template <class T>
std::vector<T> download_tail(const Dev<T>& d, size_t from) {
  std::vector<T> h(d.n - from);
  ck(cudaMemcpy(h.data(), d.p + from, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "download tail");
  return h;
}

// The sampled requests' rows (s_q each).
std::vector<int64_t> sampled_rows(int64_t batch, int samples) {
  std::vector<int64_t> rows;
  for (int64_t b : sample_requests(batch, samples))
    for (int64_t j = 0; j < kReadSq; ++j) rows.push_back(b * kReadSq + j);
  return rows;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = num::bf16_encode(uniform_at(seed, i, lo, hi));
  return v;
}
std::vector<float> random_sink(int H, uint64_t seed) {
  std::vector<float> s(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) s[static_cast<size_t>(h)] = uniform_at(seed, static_cast<uint64_t>(h), -2.0f, 2.0f);
  return s;
}

template <class T>
Dev<T> to_dev(const std::vector<T>& h) {
  Dev<T> d(h.size());
  d.upload(h);
  return d;
}

// ---------------------------------------------------------------- decode

void run_decode(const ReadPathBenchOptions& o, const ExecContext& ctx, Timer& timer, std::vector<Row>& rows) {
  for (const DecodeShape sh : kDecodeShapes) {
    if (o.heads != 0 && o.heads != sh.heads) continue;
    for (const RecordPair rp : kReadRecordPairs) {
      const RecordInfo& ci = record_info(rp.cmp);
      const RecordInfo& si = record_info(rp.swa);
      if (!o.record.empty() && o.record != ci.name) continue;
      const std::vector<uint8_t> swa_pool = record_pool(rp.swa, kSwaStatesPerPage, kSeed + 1);
      const std::vector<uint8_t> cmp_pool = record_pool(rp.cmp, kCmpStatesPerPage, kSeed + 2);
      for (const int64_t batch : kDecodeBatches) {
        if (o.batch != 0 && o.batch != batch) continue;
        const int H = sh.heads;
        const DecodeWorkload w = make_decode_workload(batch, sh.cmp_keys, kSeed + static_cast<uint64_t>(batch));
        const int64_t T = w.tokens;
        CacheView swa = CacheView::with_default_strides(nullptr, rp.swa, w.swa_pages, kSwaStatesPerPage, Device::CUDA);
        CacheView cmp = CacheView::with_default_strides(nullptr, rp.cmp, w.cmp_pages, kCmpStatesPerPage, Device::CUDA);
        const int64_t swa_pb = static_cast<int64_t>(swa.backing_bytes()) / w.swa_pages;
        const int64_t cmp_pb = static_cast<int64_t>(cmp.backing_bytes()) / w.cmp_pages;
        Dev<uint8_t> d_swa(swa.backing_bytes()), d_cmp(cmp.backing_bytes());
        upload_pages(d_swa.p, w.swa_pages, swa_pb, swa_pool, kSeed + 3);
        upload_pages(d_cmp.p, w.cmp_pages, cmp_pb, cmp_pool, kSeed + 4);
        swa.base = d_swa.p;
        cmp.base = d_cmp.p;
        const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(T * H * kLatentDim), kSeed + 5, -1.0f, 1.0f);
        const std::vector<float> sink = random_sink(H, kSeed + 6);
        Dev<uint16_t> d_q = to_dev(q), d_out(static_cast<size_t>((T + 1) * H * kLatentDim));
        Dev<float> d_sink = to_dev(sink), d_lse(static_cast<size_t>((T + 1) * H));
        Dev<int32_t> d_si = to_dev(w.swa_idx), d_sl = to_dev(w.swa_len), d_ci = to_dev(w.cmp_idx), d_cl = to_dev(w.cmp_len);
        d_out.fill(kCanary);
        d_lse.fill(kCanary);
        DecodeScheduleArgs sa;
        sa.layer = LayerType::kC2A;
        sa.num_tokens = T;
        sa.num_heads = H;
        sa.s_q = kReadSq;
        sa.block_size = kCmpStatesPerPage * 2;
        sa.device = Device::CUDA;
        const DecodeSchedule sched = plan_decode_schedule(sa, ctx);
        Dev<float> d_ws(static_cast<size_t>(std::max<int64_t>(1, sparse_decode_workspace_floats(sched))));
        SparseDecodeArgs a;
        a.schedule = &sched;
        a.s_q = kReadSq;
        a.q = TensorView::contiguous(d_q.p, DType::BF16, {T, H, kLatentDim}, Device::CUDA);
        a.swa_cache = swa;
        a.swa_indices = TensorView::contiguous(d_si.p, DType::I32, {T, kSwaWindow}, Device::CUDA);
        a.swa_lens = TensorView::contiguous(d_sl.p, DType::I32, {T}, Device::CUDA);
        a.cmp_cache = cmp;
        a.cmp_indices = TensorView::contiguous(d_ci.p, DType::I32, {T, kIndexTopk}, Device::CUDA);
        a.cmp_lens = TensorView::contiguous(d_cl.p, DType::I32, {T}, Device::CUDA);
        a.sink = TensorView::contiguous(d_sink.p, DType::F32, {H}, Device::CUDA);
        a.softmax_scale = kSoftmaxScale;
        a.out = TensorView::contiguous(d_out.p, DType::BF16, {T + 1, H, kLatentDim}, Device::CUDA);
        a.lse = TensorView::contiguous(d_lse.p, DType::F32, {T + 1, H}, Device::CUDA);
        if (sparse_decode_workspace_floats(sched) > 0)
          a.workspace = TensorView::contiguous(d_ws.p, DType::F32, {sparse_decode_workspace_floats(sched)}, Device::CUDA);
        sparse_decode(a, ctx);
        ck(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)), "sync");
        const std::vector<uint16_t> out = d_out.download();
        const std::vector<float> lse = d_lse.download();

        // the CPU backend on the sampled requests' rows, over host copies of the same caches
        Row r;
        const std::vector<int64_t> sr = sampled_rows(batch, o.samples);
        const int64_t Ts = static_cast<int64_t>(sr.size());
        {
          std::vector<uint8_t> h_swa(swa.backing_bytes()), h_cmp(cmp.backing_bytes());
          fill_pages_host(h_swa.data(), 0, w.swa_pages, swa_pb, swa_pool, kSeed + 3);
          fill_pages_host(h_cmp.data(), 0, w.cmp_pages, cmp_pb, cmp_pool, kSeed + 4);
          std::vector<uint16_t> hq = rows_of(q, sr, H * kLatentDim), h_out(static_cast<size_t>(Ts * H * kLatentDim));
          std::vector<int32_t> hsi = rows_of(w.swa_idx, sr, kSwaWindow), hsl = rows_of(w.swa_len, sr, 1);
          std::vector<int32_t> hci = rows_of(w.cmp_idx, sr, kIndexTopk), hcl = rows_of(w.cmp_len, sr, 1);
          std::vector<float> h_lse(static_cast<size_t>(Ts * H)), h_sink = sink;
          const ExecContext cpu;
          sa.num_tokens = Ts;
          sa.device = Device::CPU;
          const DecodeSchedule hs = plan_decode_schedule(sa, cpu);
          SparseDecodeArgs h = a;
          h.schedule = &hs;
          h.workspace = {};
          h.q = TensorView::contiguous(hq.data(), DType::BF16, {Ts, H, kLatentDim});
          h.swa_cache.base = h_swa.data();
          h.swa_cache.device = Device::CPU;
          h.cmp_cache.base = h_cmp.data();
          h.cmp_cache.device = Device::CPU;
          h.swa_indices = TensorView::contiguous(hsi.data(), DType::I32, {Ts, kSwaWindow});
          h.swa_lens = TensorView::contiguous(hsl.data(), DType::I32, {Ts});
          h.cmp_indices = TensorView::contiguous(hci.data(), DType::I32, {Ts, kIndexTopk});
          h.cmp_lens = TensorView::contiguous(hcl.data(), DType::I32, {Ts});
          h.sink = TensorView::contiguous(h_sink.data(), DType::F32, {H});
          h.out = TensorView::contiguous(h_out.data(), DType::BF16, {Ts, H, kLatentDim});
          h.lse = TensorView::contiguous(h_lse.data(), DType::F32, {Ts, H});
          sparse_decode(h, cpu);
          const std::vector<uint16_t> g_out = rows_of(out, sr, H * kLatentDim);
          const std::vector<float> g_lse = rows_of(lse, sr, H);
          r.wrong = attention_wrong(g_out.data(), g_lse.data(), h_out.data(), h_lse.data(), Ts, H, r.checked);
          r.wrong += canary_wrong(out, static_cast<size_t>(T * H * kLatentDim)) +
                     canary_wrong(lse, static_cast<size_t>(T * H));
        }
        r.ms = time_line(st_of(ctx), timer, o.iters, [&] { sparse_decode(a, ctx); }, r.iters);
        r.op = "decode";
        r.record = ci.name;
        r.swa_record = si.name;
        r.heads = H;
        r.swa_keys = kSwaWindow;
        r.cmp_keys = sh.cmp_keys;
        r.batch = batch;
        r.tokens = T;
        r.flops = attention_flops(H, T, kSwaWindow + sh.cmp_keys);
        r.bytes = static_cast<double>(
            decode_bytes(w.unique_swa, si.record_bytes, w.unique_cmp, ci.record_bytes, H, T));
        rows.push_back(r);
      }
    }
  }
}

// ---------------------------------------------------------------- indexer

IndexerRole a_role(bool consumer) { return consumer ? IndexerRole::kCandidateConsumer : IndexerRole::kPlain; }

void run_indexer(const ReadPathBenchOptions& o, const ExecContext& ctx, Timer& timer, std::vector<Row>& rows) {
  const std::vector<uint8_t> pool = index_k_pool(kIndexStatesPerPage, kSeed + 7);
  for (const int64_t n_c : kIndexerNc) {
    if (o.n_c != 0 && o.n_c != n_c) continue;
    const int64_t ppr = (n_c + kIndexStatesPerPage - 1) / kIndexStatesPerPage;
    const IndexKCacheView one = IndexKCacheView::with_default_strides(nullptr, IndexKFormat::FP8_132, 1, kIndexStatesPerPage);
    const int64_t page_bytes = one.page_stride;
    // the batch: 128 (or --batch), fewer when the cache and the workspace of 128 requests do not
    // fit in 80% of the free device memory
    int64_t batch = o.batch != 0 ? o.batch : kIndexerBatch;
    size_t free_b = 0, total_b = 0;
    ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const double ws_per_token = static_cast<double>(
        indexer_topk_workspace_bytes(1, ppr, kIndexStatesPerPage, IndexerRole::kCandidateSource));
    const double per_req = static_cast<double>(ppr * page_bytes) + kReadSq * ws_per_token +
                           kReadSq * (kIndexHeads * (kIndexHeadDim + 4.0) + (kIndexTopk + kCandidateTopkBlocks) * 4.0);
    batch = std::max<int64_t>(1, std::min<int64_t>(batch, static_cast<int64_t>(0.8 * static_cast<double>(free_b) / per_req)));
    const int64_t pages = batch * ppr;
    Dev<uint8_t> d_cache(static_cast<size_t>(pages * page_bytes));
    upload_pages(d_cache.p, pages, page_bytes, pool, kSeed + 8);
    IndexKCacheView kc = IndexKCacheView::with_default_strides(d_cache.p, IndexKFormat::FP8_132, pages,
                                                               kIndexStatesPerPage, Device::CUDA);
    for (const bool consumer : {false, true}) {
      const IndexerWorkload w = make_indexer_workload(batch, n_c, consumer, kSeed + static_cast<uint64_t>(n_c));
      const int64_t T = w.tokens;
      std::vector<uint8_t> q8(static_cast<size_t>(T * kIndexHeads * kIndexHeadDim));
      for (size_t i = 0; i < q8.size(); ++i) q8[i] = finite_e4m3(kSeed + 9, i);
      std::vector<float> wt(static_cast<size_t>(T * kIndexHeads));
      for (size_t i = 0; i < wt.size(); ++i) wt[i] = uniform_at(kSeed + 10, i, -0.01f, 0.01f);
      Dev<uint8_t> d_q8 = to_dev(q8);
      Dev<float> d_w = to_dev(wt);
      const int64_t ws_bytes = indexer_topk_workspace_bytes(T, ppr, kIndexStatesPerPage, a_role(consumer));
      Dev<uint8_t> d_ws(static_cast<size_t>(ws_bytes));
      Dev<int64_t> d_pos = to_dev(w.positions);
      Dev<int32_t> d_t2r = to_dev(w.token_to_req), d_bt = to_dev(w.block_table);
      Dev<int32_t> d_cand = consumer ? to_dev(w.candidates) : Dev<int32_t>(1);
      Dev<int32_t> d_topk(static_cast<size_t>((T + 1) * kIndexTopk));
      d_topk.fill(kCanary);
      IndexerTopkArgs a;
      a.ratio = 2;
      a.role = a_role(consumer);
      a.q8 = TensorView::contiguous(d_q8.p, DType::U8, {T, kIndexHeads, kIndexHeadDim}, Device::CUDA);
      a.w = TensorView::contiguous(d_w.p, DType::F32, {T, kIndexHeads}, Device::CUDA);
      a.positions = TensorView::contiguous(d_pos.p, DType::I64, {T}, Device::CUDA);
      a.token_to_req = TensorView::contiguous(d_t2r.p, DType::I32, {T}, Device::CUDA);
      a.block_table = TensorView::contiguous(d_bt.p, DType::I32, {batch, ppr}, Device::CUDA);
      a.k_cache = kc;
      a.topk = TensorView::contiguous(d_topk.p, DType::I32, {T + 1, kIndexTopk}, Device::CUDA);
      if (consumer) a.candidates = TensorView::contiguous(d_cand.p, DType::I32, {T, kCandidateTopkBlocks}, Device::CUDA);
      a.workspace = TensorView::contiguous(d_ws.p, DType::U8, {ws_bytes}, Device::CUDA);
      indexer_topk(a, ctx);
      ck(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)), "sync");
      const std::vector<int32_t> topk = d_topk.download();

      // the CPU backend on the sampled requests, over a compact host cache of their pages
      Row r;
      const std::vector<int64_t> reqs = sample_requests(batch, o.samples);
      const std::vector<int64_t> sr = sampled_rows(batch, o.samples);
      const int64_t Ts = static_cast<int64_t>(sr.size()), Rs = static_cast<int64_t>(reqs.size());
      {
        std::vector<uint8_t> h_cache(static_cast<size_t>(Rs * ppr * page_bytes));
        for (int64_t i = 0; i < Rs; ++i)
          fill_pages_host(h_cache.data() + i * ppr * page_bytes, reqs[static_cast<size_t>(i)] * ppr, ppr, page_bytes,
                          pool, kSeed + 8);
        std::vector<int32_t> h_bt(static_cast<size_t>(Rs * ppr)), h_t2r;
        for (size_t i = 0; i < h_bt.size(); ++i) h_bt[i] = static_cast<int32_t>(i);
        for (int64_t i = 0; i < Rs; ++i)
          for (int64_t j = 0; j < kReadSq; ++j) h_t2r.push_back(static_cast<int32_t>(i));
        std::vector<uint8_t> hq8 = rows_of(q8, sr, kIndexHeads * kIndexHeadDim);
        std::vector<float> hw = rows_of(wt, sr, kIndexHeads), h_scores(static_cast<size_t>(Ts * n_c));
        std::vector<int64_t> hpos = rows_of(w.positions, sr, 1);
        std::vector<int32_t> hcand = consumer ? rows_of(w.candidates, sr, kCandidateTopkBlocks) : std::vector<int32_t>();
        std::vector<int32_t> h_topk(static_cast<size_t>(Ts * kIndexTopk));
        IndexerTopkArgs h = a;
        h.q8 = TensorView::contiguous(hq8.data(), DType::U8, {Ts, kIndexHeads, kIndexHeadDim});
        h.w = TensorView::contiguous(hw.data(), DType::F32, {Ts, kIndexHeads});
        h.positions = TensorView::contiguous(hpos.data(), DType::I64, {Ts});
        h.token_to_req = TensorView::contiguous(h_t2r.data(), DType::I32, {Ts});
        h.block_table = TensorView::contiguous(h_bt.data(), DType::I32, {Rs, ppr});
        h.k_cache = IndexKCacheView::with_default_strides(h_cache.data(), IndexKFormat::FP8_132, Rs * ppr,
                                                          kIndexStatesPerPage);
        h.topk = TensorView::contiguous(h_topk.data(), DType::I32, {Ts, kIndexTopk});
        h.candidates = consumer ? TensorView::contiguous(hcand.data(), DType::I32, {Ts, kCandidateTopkBlocks}) : TensorView{};
        h.scores = TensorView::contiguous(h_scores.data(), DType::F32, {Ts, n_c});
        indexer_topk(h);
        for (int64_t s = 0; s < Ts; ++s) {
          const int64_t t = sr[static_cast<size_t>(s)], req = s / kReadSq;
          const int64_t nc = (w.positions[static_cast<size_t>(t)] + 1) / 2;
          const uint8_t* qrow = hq8.data() + s * kIndexHeads * kIndexHeadDim;
          const float* wrow = hw.data() + s * kIndexHeads;
          auto score = [&](int64_t i) {
            return i >= 0 && i < n_c ? double{h_scores[static_cast<size_t>(s * n_c + i)]} : -double(INFINITY);
          };
          auto tol = [&](int64_t i) {
            if (i < 0 || i >= nc) return 0.0;
            const uint8_t* page = h_cache.data() + (req * ppr + i / kIndexStatesPerPage) * page_bytes;
            const int64_t off = i % kIndexStatesPerPage;
            return reference::kIndexerScoreRtol *
                   reference::indexer_score_magnitude(qrow, wrow, rec::index_k_fp8_codes(page, kIndexStatesPerPage, off),
                                                      rec::read_index_k_fp8_scale(page, kIndexStatesPerPage, off));
          };
          int64_t differing = 0;
          const std::string why = conformance::topk_row_agreement(topk.data() + t * kIndexTopk,
                                                                  h_topk.data() + s * kIndexTopk, kIndexTopk, score, tol,
                                                                  differing);
          r.wrong += why.empty() ? 0 : std::max<int64_t>(1, differing);
          if (!why.empty()) fmt::print(stderr, "dsv41kv bench: indexer n_c {} {} token {}: {}\n", n_c,
                                       consumer ? "consumer" : "plain", t, why);
        }
        r.checked = Ts * kIndexTopk;
        r.wrong += canary_wrong(topk, static_cast<size_t>(T * kIndexTopk));
      }
      r.ms = time_line(st_of(ctx), timer, o.iters, [&] { indexer_topk(a, ctx); }, r.iters);
      r.op = "indexer";
      r.role = indexer_role_name(a.role);
      r.record = index_k_format_name(IndexKFormat::FP8_132);
      r.batch = batch;
      r.tokens = T;
      r.n_c = n_c;
      r.flops = indexer_flops(w.entries_scored);
      r.bytes = static_cast<double>(indexer_bytes(w.unique_entries));
      rows.push_back(r);
    }
  }
}

// ---------------------------------------------------------------- prefill

void run_prefill(const ReadPathBenchOptions& o, const ExecContext& ctx, Timer& timer, std::vector<Row>& rows) {
  const int H = kPrefillHeads;
  const int64_t S = kPrefillKv, row = int64_t{H} * kLatentDim;
  const std::vector<uint16_t> kv = random_bf16(static_cast<size_t>(S * kLatentDim), kSeed + 11, -2.0f, 2.0f);
  const std::vector<uint16_t> qpool = random_bf16(static_cast<size_t>(kQPoolTokens * row), kSeed + 12, -1.0f, 1.0f);
  const std::vector<float> sink = random_sink(H, kSeed + 13);
  Dev<uint16_t> d_kv = to_dev(kv), d_qpool = to_dev(qpool);
  Dev<float> d_sink = to_dev(sink);
  for (const int64_t T : kPrefillTokens) {
    if (o.tokens != 0 && o.tokens != T) continue;
    const PrefillWorkload w = make_prefill_workload(T, S, kSeed + static_cast<uint64_t>(T));
    // q row t is pool row t % 4096, tiled on the device
    Dev<uint16_t> d_q(static_cast<size_t>(T * row));
    for (int64_t t = 0; t < T; t += kQPoolTokens)
      ck(cudaMemcpy(d_q.p + t * row, d_qpool.p, static_cast<size_t>(std::min(kQPoolTokens, T - t) * row) * 2,
                    cudaMemcpyDeviceToDevice), "q tile");
    ck(cudaDeviceSynchronize(), "sync after the q tiles");
    const std::vector<int32_t> len(static_cast<size_t>(T), kPrefillKeys);
    Dev<int32_t> d_idx = to_dev(w.indices), d_len = to_dev(len);
    Dev<uint16_t> d_out(static_cast<size_t>((T + 1) * row));
    Dev<float> d_lse(static_cast<size_t>((T + 1) * H));
    d_out.fill(kCanary);
    d_lse.fill(kCanary);
    SparsePrefillArgs a;
    a.q = TensorView::contiguous(d_q.p, DType::BF16, {T, H, kLatentDim}, Device::CUDA);
    a.kv = TensorView::contiguous(d_kv.p, DType::BF16, {S, kLatentDim}, Device::CUDA);
    a.indices = TensorView::contiguous(d_idx.p, DType::I32, {T, kPrefillKeys}, Device::CUDA);
    a.topk_length = TensorView::contiguous(d_len.p, DType::I32, {T}, Device::CUDA);
    a.sink = TensorView::contiguous(d_sink.p, DType::F32, {H}, Device::CUDA);
    a.softmax_scale = kSoftmaxScale;
    a.out = TensorView::contiguous(d_out.p, DType::BF16, {T + 1, H, kLatentDim}, Device::CUDA);
    a.lse = TensorView::contiguous(d_lse.p, DType::F32, {T + 1, H}, Device::CUDA);
    sparse_prefill(a, ctx);
    ck(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)), "sync");
    Row r;
    {
      // the sampled rows and everything past row T (8 GiB of output at 128K tokens: not all of it)
      const std::vector<int64_t> sr = sample_requests(T, o.samples);
      const std::vector<uint16_t> g_out = download_rows(d_out, sr, row);
      const std::vector<float> g_lse = download_rows(d_lse, sr, H);
      const std::vector<uint16_t> out_tail = download_tail(d_out, static_cast<size_t>(T * row));
      const std::vector<float> lse_tail = download_tail(d_lse, static_cast<size_t>(T * H));
      const int64_t Ts = static_cast<int64_t>(sr.size());
      std::vector<uint16_t> hq, h_out(static_cast<size_t>(Ts * row));
      for (int64_t t : sr) hq.insert(hq.end(), qpool.begin() + (t % kQPoolTokens) * row, qpool.begin() + (t % kQPoolTokens + 1) * row);
      std::vector<int32_t> hidx = rows_of(w.indices, sr, kPrefillKeys), hlen(static_cast<size_t>(Ts), kPrefillKeys);
      std::vector<float> h_lse(static_cast<size_t>(Ts * H)), h_sink = sink;
      std::vector<uint16_t> h_kv = kv;
      SparsePrefillArgs h;
      h.q = TensorView::contiguous(hq.data(), DType::BF16, {Ts, H, kLatentDim});
      h.kv = TensorView::contiguous(h_kv.data(), DType::BF16, {S, kLatentDim});
      h.indices = TensorView::contiguous(hidx.data(), DType::I32, {Ts, kPrefillKeys});
      h.topk_length = TensorView::contiguous(hlen.data(), DType::I32, {Ts});
      h.sink = TensorView::contiguous(h_sink.data(), DType::F32, {H});
      h.softmax_scale = kSoftmaxScale;
      h.out = TensorView::contiguous(h_out.data(), DType::BF16, {Ts, H, kLatentDim});
      h.lse = TensorView::contiguous(h_lse.data(), DType::F32, {Ts, H});
      sparse_prefill(h);
      r.wrong = attention_wrong(g_out.data(), g_lse.data(), h_out.data(), h_lse.data(), Ts, H, r.checked);
      r.wrong += canary_wrong(out_tail, 0) + canary_wrong(lse_tail, 0);
    }
    r.ms = time_line(st_of(ctx), timer, o.iters, [&] { sparse_prefill(a, ctx); }, r.iters);
    r.op = "prefill";
    r.record = "bf16";
    r.heads = H;
    r.cmp_keys = kPrefillKeys;
    r.batch = 1;
    r.tokens = T;
    r.n_c = S;
    r.flops = attention_flops(H, T, kPrefillKeys);
    r.bytes = static_cast<double>(prefill_bytes(w.valid_indices(), H, T));
    rows.push_back(r);
  }
}

}  // namespace

int run_read_path_bench(const ReadPathBenchOptions& o) {
  if (!cuda_device_available()) {
    std::fprintf(stderr, "dsv41kv bench: %s\n", cuda_device_description().c_str());
    return 2;
  }
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  ExecContext ctx;
  ctx.stream = st;
  Timer timer(st, o.iters, Timing::kDoBench);
  const double copy_GBps = copy_bandwidth(st, timer);
  std::vector<Row> rows;
  if (o.op.empty() || o.op == "decode") run_decode(o, ctx, timer, rows);
  if (o.op.empty() || o.op == "indexer") run_indexer(o, ctx, timer, rows);
  if (o.op.empty() || o.op == "prefill") run_prefill(o, ctx, timer, rows);
  cudaStreamDestroy(st);
  if (rows.empty()) {
    std::fprintf(stderr, "dsv41kv bench: --read: no line matches the filters (decode batches 2, 64, 128, 148, 256)\n");
    return 2;
  }

  int64_t total_wrong = 0;
  for (const Row& r : rows) total_wrong += r.wrong;
  auto tflops = [](const Row& r) { return r.flops / (r.ms * 1e-3) / 1e12; };
  auto gbps = [](const Row& r) { return r.bytes / (r.ms * 1e-3) / 1e9; };
  if (o.json) {
    nlohmann::json j;
    j["impl"] = "dsv41kv";
    j["device"] = cuda_device_description();
    j["copy_GBps"] = copy_GBps;
    j["iters"] = o.iters;
    j["timing"] = "cuda events, 3 warm-up launches, L2 flush (256 MiB memset) before each timed launch, median";
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"op", r.op}, {"heads", r.heads}, {"s_q", kReadSq}, {"batch", r.batch},
                           {"tokens", r.tokens}, {"swa_keys", r.swa_keys}, {"cmp_keys", r.cmp_keys},
                           {"record", r.record}, {"swa_record", r.swa_record}, {"role", r.role}, {"n_c", r.n_c},
                           {"ms", r.ms}, {"us", r.ms * 1e3}, {"flops", r.flops}, {"bytes", r.bytes},
                           {"TFLOPS", tflops(r)}, {"GBps", gbps(r)}, {"copy_fraction", gbps(r) / copy_GBps},
                           {"wrong", r.wrong}, {"checked", r.checked}, {"iters", r.iters}});
    j["total_wrong"] = total_wrong;
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    fmt::print("device: {}\ncopy (D2D 2 GiB, read+write): {:.0f} GB/s\n", cuda_device_description(), copy_GBps);
    fmt::print("{:<8} {:>4} {:>8} {:<10} {:<10} {:<19} {:>6} {:>8} {:>10} {:>8} {:>8} {:>6} {:>6} {:>10}\n", "op",
               "h", "keys", "record", "swa", "role", "batch", "tokens", "time_us", "TFLOPS", "GB/s", "copy%",
               "wrong", "checked");
    for (const Row& r : rows) {
      const std::string keys = r.op == "decode" ? fmt::format("{}+{}", r.swa_keys, r.cmp_keys)
                               : r.op == "indexer" ? fmt::format("{}K", r.n_c / 1024)
                                                   : std::to_string(r.cmp_keys);
      fmt::print("{:<8} {:>4} {:>8} {:<10} {:<10} {:<19} {:>6} {:>8} {:>10.2f} {:>8.1f} {:>8.0f} {:>5.1f}% {:>6} {:>10}\n",
                 r.op, r.heads, keys, r.record, r.swa_record.empty() ? "-" : r.swa_record,
                 r.role.empty() ? "-" : r.role, r.batch, r.tokens, r.ms * 1e3, tflops(r), gbps(r),
                 100.0 * gbps(r) / copy_GBps, r.wrong, r.checked);
    }
    fmt::print("timing: CUDA events, L2 flushed before each timed launch, median of {} (fewer where a launch is "
               "long: the line's iters in --json); FLOPs and bytes as FlashMLA's "
               "harness counts them (bench/read_path_model.hpp)\n", o.iters);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace dsv41kv::bench
