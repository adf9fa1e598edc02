// dsv41kv-attn-bench: times sparse_decode and sparse_prefill on the device (CUDA builds only).
//   decode: T = batch * s_q query rows of H heads, each with 128 SWA keys and 512 compressed keys
//     (all valid, random slots of caches of --slots states: gathers from DRAM), record formats
//     --swa / --cmp (v4_584, mxfp8_528, nvfp4_288 (cmp only), bf16, fp8), the CUDA schedule;
//   prefill: T query rows over a bf16 workspace of --slots rows, --topk keys each (all valid);
//     TFLOPS counted as FlashMLA counts: 2 * H * T * topk * (512 + 512) / time.
// Median of --iters timed launches (cudaEvent around each), after warm-up launches.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/cuda/timing.hpp"
#include "dsv41kv/attention.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "dsv41kv/rng.hpp"

namespace dsv41kv::bench {
namespace {

struct Opt {
  std::string mode = "decode";
  int64_t batch = 128, s_q = 2, H = 64, slots = 1 << 16, topk = kPrefillIndexWidth, iters = 50;
  RecordFormat swa = RecordFormat::V4_584, cmp = RecordFormat::V4_584;
};

RecordFormat format_of(const std::string& s) {
  for (RecordFormat f : kAllRecordFormats)
    if (s == record_info(f).name) return f;
  fail(ErrorCode::kInvalidArgument, "attn-bench: unknown record format " + s);
}

// A cache of `pages` pages of S states with plausible records: finite e4m3 / e2m1 codes (no NaN
// byte) and scales near 1, bf16 values in [-2, 2].
std::vector<uint8_t> random_cache(const CacheView& v, Rng& rng) {
  const int64_t es = static_cast<int64_t>(dtype_size(record_info(v.format).element));
  std::vector<uint8_t> b(static_cast<size_t>(v.num_pages * v.page_stride * es));
  for (auto& x : b) x = static_cast<uint8_t>(rng.integer(0, 255) & 0x77);  // e4m3 below NaN, small e2m1
  if (v.format == RecordFormat::PLAIN_BF16 || v.format == RecordFormat::V4_584) {
    // bf16 values (the whole row for bf16, the RoPE dims of 584) and UE8M0 scales near 2^0
    for (int64_t p = 0; p < v.num_pages; ++p)
      for (int64_t r = 0; r < v.states_per_page; ++r) {
        uint8_t* pg = b.data() + p * v.page_stride * es;
        if (v.format == RecordFormat::PLAIN_BF16) {
          auto* row = reinterpret_cast<uint16_t*>(pg + r * v.row_stride * es);
          for (int d = 0; d < kLatentDim; ++d) row[d] = num::bf16_encode(static_cast<float>(rng.uniform(-2, 2)));
        } else {
          auto* rope = reinterpret_cast<uint16_t*>(pg + V4Layout::value_offset(v.states_per_page, r) + kNopeDim);
          for (int d = 0; d < kRopeDim; ++d) rope[d] = num::bf16_encode(static_cast<float>(rng.uniform(-2, 2)));
          for (int k = 0; k < 7; ++k) pg[V4Layout::scale_offset(v.states_per_page, r) + k] = static_cast<uint8_t>(rng.integer(124, 128));
        }
      }
  } else if (v.format == RecordFormat::MXFP8_528) {
    for (int64_t p = 0; p < v.num_pages; ++p)
      for (int64_t r = 0; r < v.states_per_page; ++r)
        for (int k = 0; k < 16; ++k)
          b[static_cast<size_t>(p * v.page_stride + Mxfp8Layout::scale_offset(v.states_per_page, r) + k)] =
              static_cast<uint8_t>(rng.integer(124, 128));
  } else if (v.format == RecordFormat::NVFP4_288) {
    for (int64_t p = 0; p < v.num_pages; ++p)
      for (int64_t r = 0; r < v.states_per_page; ++r)
        for (int k = 0; k < 32; ++k)
          b[static_cast<size_t>(p * v.page_stride + Nvfp4Layout::scale_offset(v.states_per_page, r) + k)] = 0x38;  // 1.0
  }
  return b;
}

template <class F>
double median_us(F&& launch, int64_t iters) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 5; ++i) launch();
  std::vector<double> t;
  for (int64_t i = 0; i < iters; ++i) {
    ck(cudaEventRecord(a), "record");
    launch();
    ck(cudaEventRecord(b), "record");
    ck(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(1e3 * ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

int run(const Opt& o) {
  Rng rng(1234);
  const int64_t T = o.mode == "decode" ? o.batch * o.s_q : o.batch;
  std::vector<uint16_t> q(static_cast<size_t>(T * o.H * kLatentDim));
  for (auto& x : q) x = num::bf16_encode(static_cast<float>(rng.uniform(-1, 1)));
  std::vector<float> sink(static_cast<size_t>(o.H), 0.0f);
  Dev<uint16_t> dq(q.size()), dout(q.size());
  Dev<float> dsink(sink.size()), dlse(static_cast<size_t>(T * o.H));
  dq.upload(q);
  dsink.upload(sink);
  const auto view = [](void* p, DType dt, std::initializer_list<int64_t> s) {
    return TensorView::contiguous(p, dt, s, Device::CUDA);
  };
  if (o.mode == "decode") {
    const int64_t S = 64, pages = (o.slots + S - 1) / S;
    CacheView swa = CacheView::with_default_strides(nullptr, o.swa, pages, S);
    CacheView cmp = CacheView::with_default_strides(nullptr, o.cmp, pages, S / 2);  // c2a: 64 / 2 states a page
    const std::vector<uint8_t> hs = random_cache(swa, rng), hc = random_cache(cmp, rng);
    Dev<uint8_t> ds(hs.size()), dc(hc.size());
    ds.upload(hs);
    dc.upload(hc);
    swa.base = ds.p;
    cmp.base = dc.p;
    swa.device = cmp.device = Device::CUDA;
    std::vector<int32_t> si(static_cast<size_t>(T * kSwaWindow)), ci(static_cast<size_t>(T * kIndexTopk));
    for (auto& x : si) x = static_cast<int32_t>(rng.integer(0, swa.num_pages * swa.states_per_page - 1));
    for (auto& x : ci) x = static_cast<int32_t>(rng.integer(0, cmp.num_pages * cmp.states_per_page - 1));
    std::vector<int32_t> sl(static_cast<size_t>(T), kSwaWindow), cl(static_cast<size_t>(T), kIndexTopk);
    Dev<int32_t> dsi(si.size()), dci(ci.size()), dsl(sl.size()), dcl(cl.size());
    dsi.upload(si);
    dci.upload(ci);
    dsl.upload(sl);
    dcl.upload(cl);
    DecodeScheduleArgs sa;
    sa.layer = LayerType::kC2A;
    sa.num_tokens = T;
    sa.num_heads = static_cast<int>(o.H);
    sa.s_q = static_cast<int>(o.s_q);
    sa.block_size = 64;
    sa.device = Device::CUDA;
    const DecodeSchedule sched = plan_decode_schedule(sa);
    Dev<float> dws(static_cast<size_t>(std::max<int64_t>(sparse_decode_workspace_floats(sched), 1)));
    SparseDecodeArgs a;
    a.schedule = &sched;
    a.s_q = static_cast<int>(o.s_q);
    a.q = view(dq.p, DType::BF16, {T, o.H, kLatentDim});
    a.swa_cache = swa;
    a.swa_indices = view(dsi.p, DType::I32, {T, kSwaWindow});
    a.swa_lens = view(dsl.p, DType::I32, {T});
    a.cmp_cache = cmp;
    a.cmp_indices = view(dci.p, DType::I32, {T, kIndexTopk});
    a.cmp_lens = view(dcl.p, DType::I32, {T});
    a.sink = view(dsink.p, DType::F32, {o.H});
    a.softmax_scale = kSoftmaxScale;
    a.out = view(dout.p, DType::BF16, {T, o.H, kLatentDim});
    a.lse = view(dlse.p, DType::F32, {T, o.H});
    if (sched.splits > 1) a.workspace = view(dws.p, DType::F32, {static_cast<int64_t>(dws.n)});
    const double us = median_us([&] { sparse_decode(a); }, o.iters);
    const double flops = 2.0 * static_cast<double>(o.H * T) * (kSwaWindow + kIndexTopk) * 1024.0;
    fmt::print("decode batch {} s_q {} H {} swa {} cmp {}: splits {} head_tile {}: {:.1f} us, {:.0f} TFLOPS\n", o.batch,
               o.s_q, o.H, record_info(o.swa).name, record_info(o.cmp).name, sched.splits, sched.head_tile, us,
               flops / us * 1e-6);
  } else {
    std::vector<uint16_t> kv(static_cast<size_t>(o.slots * kLatentDim));
    for (auto& x : kv) x = num::bf16_encode(static_cast<float>(rng.uniform(-2, 2)));
    std::vector<int32_t> idx(static_cast<size_t>(T * o.topk)), len(static_cast<size_t>(T), static_cast<int32_t>(o.topk));
    for (auto& x : idx) x = static_cast<int32_t>(rng.integer(0, o.slots - 1));
    Dev<uint16_t> dkv(kv.size());
    Dev<int32_t> didx(idx.size()), dlen(len.size());
    dkv.upload(kv);
    didx.upload(idx);
    dlen.upload(len);
    SparsePrefillArgs a;
    a.q = view(dq.p, DType::BF16, {T, o.H, kLatentDim});
    a.kv = view(dkv.p, DType::BF16, {o.slots, kLatentDim});
    a.indices = view(didx.p, DType::I32, {T, o.topk});
    a.topk_length = view(dlen.p, DType::I32, {T});
    a.sink = view(dsink.p, DType::F32, {o.H});
    a.softmax_scale = kSoftmaxScale;
    a.out = view(dout.p, DType::BF16, {T, o.H, kLatentDim});
    a.lse = view(dlse.p, DType::F32, {T, o.H});
    const double us = median_us([&] { sparse_prefill(a); }, o.iters);
    const double flops = 2.0 * static_cast<double>(o.H * T) * static_cast<double>(o.topk) * 1024.0;
    fmt::print("prefill T {} H {} topk {}: {:.1f} us, {:.0f} TFLOPS\n", T, o.H, o.topk, us, flops / us * 1e-6);
  }
  return 0;
}

}  // namespace
}  // namespace dsv41kv::bench

int main(int argc, char** argv) {
  dsv41kv::bench::Opt o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") o.mode = v;
    else if (k == "--batch") o.batch = std::atoll(v.c_str());
    else if (k == "--s_q") o.s_q = std::atoll(v.c_str());
    else if (k == "--heads") o.H = std::atoll(v.c_str());
    else if (k == "--slots") o.slots = std::atoll(v.c_str());
    else if (k == "--topk") o.topk = std::atoll(v.c_str());
    else if (k == "--iters") o.iters = std::atoll(v.c_str());
    else if (k == "--swa") o.swa = dsv41kv::bench::format_of(v);
    else if (k == "--cmp") o.cmp = dsv41kv::bench::format_of(v);
    else {
      fmt::print(stderr, "unknown flag {}\n", k);
      return 2;
    }
  }
  try {
    return dsv41kv::bench::run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
