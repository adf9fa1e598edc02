// The 64-head decode kernel's key gather on its own (attention/cuda/sparse_mla_wgmma.cuh:
// direct::produce, what sparse_mla_ws_kernel's producer warpgroup runs for each block): one
// 64-key block gathered into a swizzled bf16 tile, read back and compared bit for bit with the
// element readers of records.hpp. Pages of random bytes (every e4m3 code including the NaN codes,
// every scale byte: the exact fallback runs), for every pair of record formats: warps whose keys
// all come from one cache, warps mixing both caches (the per-lane path), masked keys (zero rows,
// valid flag 0), and caches whose base the vector loads cannot take (the register fallback).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention/cuda/sparse_mla_wgmma.cuh"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

using namespace dsv41kv::detail::cuda;
namespace mla = dsv41kv::detail::cuda::mla;

constexpr int kProducerThreads = 32 * mla::kWsProducerWarps;
constexpr int kKeysPerWarp = mla::kBlock / mla::kWsProducerWarps;
constexpr int kSmem = mla::kBlock * mla::kRowBytes + 1024 + 4 * mla::kBlock;

// Block 0 of keys (e, src) gathered by the producer warps into tile 0, then written out row by
// row in dim order (out: [kBlock x kDim] bf16 bits) with the tile's valid flags.
__global__ void __launch_bounds__(kProducerThreads) gather_kernel(mla::CacheSource src, const int32_t* e,
                                                                  const int32_t* s, uint16_t* out, int32_t* valid) {
  extern __shared__ __align__(1024) uint8_t raw[];
  const uint32_t sraw = smem_address(raw), sk = (sraw + 1023u) & ~1023u;
  int32_t* svalid = reinterpret_cast<int32_t*>(raw + (sk - sraw) + mla::kBlock * mla::kRowBytes);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  mla::KeyRef pend;
  if (lane < kKeysPerWarp) {
    pend.e = e[kKeysPerWarp * warp + lane];
    pend.src = s[kKeysPerWarp * warp + lane];
  }
  mla::direct::produce<kKeysPerWarp>(src, 0, sk, svalid, warp, lane, pend);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < mla::kBlock * mla::kDim; i += kProducerThreads) {
    const int r = i / mla::kDim, d = i % mla::kDim;
    uint16_t x;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(x) : "r"(mla::staged::slot(sk, r, d / 8) + 2 * (d % 8)));
    out[i] = x;
  }
  if (threadIdx.x < mla::kBlock) valid[threadIdx.x] = svalid[threadIdx.x];
}

// One cache of random bytes (`offset`: the base shifted inside its allocation).
struct Cache {
  RecordFormat f;
  int64_t S, pages, page_stride, row_stride;
  std::vector<uint8_t> bytes;
  DeviceBuffer<uint8_t> dev;
  float sigma = 0.0625f;
  Cache(RecordFormat fmt, int64_t s, int64_t np, size_t offset, Rng& rng) : f(fmt), S(s), pages(np) {
    const CacheView v = CacheView::with_default_strides(nullptr, f, pages, S);
    const auto es = static_cast<int64_t>(dtype_size(record_info(f).element));
    page_stride = v.page_stride * es;
    row_stride = v.row_stride * es;
    bytes.resize(static_cast<size_t>(pages * page_stride));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng.integer(0, 255));
    dev.upload_new(bytes, offset);
  }
  mla::CacheList list() const {
    mla::CacheList l;
    l.base = dev.data();
    l.S = S;
    l.page_stride = page_stride;
    l.row_stride = row_stride;
    l.capacity = pages * S;
    l.fp8_scale = sigma;
    l.format = static_cast<int>(f);
    l.aligned = record_chunks_aligned(l.format, l.base, page_stride, row_stride);
    return l;
  }
  // The exact bf16 bits of dim d of slot `slot` (records.hpp's element readers).
  uint16_t dim(int64_t slot, int d) const {
    const uint8_t* pg = bytes.data() + (slot / S) * page_stride;
    const int64_t r = slot % S;
    switch (f) {
      case RecordFormat::V4_584: return rec::read_v4_584(pg, S, r, d);
      case RecordFormat::MXFP8_528: return rec::read_mxfp8_528(pg, S, r, d);
      case RecordFormat::NVFP4_288: return rec::read_nvfp4_288(pg, S, r, d);
      case RecordFormat::PLAIN_FP8: return rec::read_plain_fp8(pg + r * row_stride, d, sigma);
      default: {
        const uint8_t* row = pg + r * row_stride + 2 * d;
        return static_cast<uint16_t>(row[0] | (row[1] << 8));
      }
    }
  }
};

class AttentionGatherGpu : public GpuTest {};

TEST_F(AttentionGatherGpu, ProducerGatherEqualsTheExactReaders) {
  GPU_CHECK(cudaFuncSetAttribute(gather_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  for (RecordFormat fc : kAllRecordFormats)
    for (RecordFormat fs : kAllRecordFormats)
      for (const size_t offset : {size_t{0}, size_t{4}}) {  // 4: no vector loads (the register fallback)
        const Cache cmp(fc, 32, 6, offset, rng()), swa(fs, 64, 3, 0, rng());
        mla::CacheSource src;
        src.cmp = cmp.list();
        src.swa = swa.list();
        src.with_cmp = true;
        // warp 0: compressed keys only, warp 1: SWA keys only, warps 2 and 3 mixed; some masked
        // (entry -1, an entry past the cache, or no source)
        std::vector<int32_t> e(mla::kBlock), s(mla::kBlock);
        for (int k = 0; k < mla::kBlock; ++k) {
          const int w = k / kKeysPerWarp;
          s[static_cast<size_t>(k)] = w == 0 ? 0 : w == 1 ? 1 : static_cast<int32_t>(rng().integer(0, 1));
          const int64_t cap = s[static_cast<size_t>(k)] == 0 ? cmp.pages * cmp.S : swa.pages * swa.S;
          e[static_cast<size_t>(k)] = static_cast<int32_t>(rng().integer(0, cap - 1));
          if (w == 3 && k % 5 == 0) e[static_cast<size_t>(k)] = -1;
          if (w == 3 && k % 7 == 0) e[static_cast<size_t>(k)] = static_cast<int32_t>(cap);
          if (w == 2 && k % 9 == 0) s[static_cast<size_t>(k)] = -1;
        }
        DeviceBuffer<int32_t> de(e), ds(s), dvalid(std::vector<int32_t>(mla::kBlock, 7));
        DeviceBuffer<uint16_t> dout(std::vector<uint16_t>(static_cast<size_t>(mla::kBlock * mla::kDim), 0x5555));
        gather_kernel<<<1, kProducerThreads, kSmem>>>(src, de.data(), ds.data(), dout.data(), dvalid.data());
        GPU_CHECK(cudaGetLastError());
        const std::vector<uint16_t> out = dout.download();
        const std::vector<int32_t> valid = dvalid.download();
        const std::string what = std::string(record_info(fc).name) + " + " + record_info(fs).name +
                                 (offset ? ", unaligned compressed cache" : "");
        int bad_rows = 0;
        for (int k = 0; k < mla::kBlock; ++k) {
          const int32_t ek = e[static_cast<size_t>(k)], sk = s[static_cast<size_t>(k)];
          const bool ok = sk >= 0 && ek >= 0 && ek < (sk == 0 ? cmp.pages * cmp.S : swa.pages * swa.S);
          bool same = valid[static_cast<size_t>(k)] == (ok ? 1 : 0);
          for (int d = 0; d < mla::kDim && same; ++d) {
            const uint16_t want = ok ? (sk == 0 ? cmp : swa).dim(ek, d) : uint16_t{0};
            same = out[static_cast<size_t>(k * mla::kDim + d)] == want;
          }
          bad_rows += same ? 0 : 1;
        }
        EXPECT_EQ(bad_rows, 0) << what << ": rows differing from the exact readers";
      }
}

}  // namespace
}  // namespace dsv41kv::test
