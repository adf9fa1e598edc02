// The CUDA cache ops (insert, gather, save_ring_rows) against the CPU backend on fresh random
// inputs: whole canary-filled backings byte for byte, every record format, unaligned pages.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsv41kv/cache.hpp"
#include "support/gpu_batch.hpp"

namespace dsv41kv::test {
namespace {

class CacheGpu : public GpuTest {};

TEST_F(CacheGpu, InsertMatchesCpuEveryFormat) {
  for (int ratio : {1, 2})
    for (RecordFormat f : kAllRecordFormats)
      for (GpuBatchSpec s : gpu_batch_shapes(ratio)) {
        s.format = f;
        s.nonfinite_fraction = 0.002;  // poisoned tiles
        GpuBatch b = GpuBatch::make(s, rng());
        // random latent rows (NaN rows included): the insert reads every closing row
        for (auto& v : b.latent) v = num::bf16_encode(static_cast<float>(rng().normal() * 3.0));
        for (int64_t k = 0; k < 5; ++k)
          b.latent[static_cast<size_t>(rng().integer(0, static_cast<int64_t>(b.latent.size()) - 1))] = 0x7F80;
        GpuBatchDev d(b);
        insert(insert_args(b, nullptr));
        insert(insert_args(b, &d));
        EXPECT_TRUE(outputs_equal(b, d, "insert " + gpu_batch_name(s)));
      }
}

TEST_F(CacheGpu, GatherMatchesCpuEveryFormat) {
  for (RecordFormat f : kAllRecordFormats) {
    const int64_t S = 16, pages = 9;
    CacheView host = CacheView::with_default_strides(nullptr, f, pages, S);
    host.page_stride += 7;
    host.fp8_scale = 0.75f;
    const bool bf16 = f == RecordFormat::PLAIN_BF16;
    const size_t n = static_cast<size_t>(pages * host.page_stride);
    std::vector<uint8_t> c8;
    std::vector<uint16_t> c16;
    if (bf16) {
      c16.resize(n);
      for (auto& v : c16) v = num::bf16_encode(static_cast<float>(rng().normal()));
    } else {
      c8.resize(n);
      for (auto& v : c8) v = static_cast<uint8_t>(rng().next());
    }
    const int64_t M = 777;
    std::vector<int64_t> slots(static_cast<size_t>(M));
    for (auto& v : slots) v = rng().uniform() < 0.1 ? -1 : rng().integer(0, pages * S - 1);
    const int64_t out_stride = 520;
    std::vector<uint16_t> out(static_cast<size_t>(M * out_stride), kBf16Sentinel);
    DeviceBuffer<uint8_t> d8(bf16 ? std::vector<uint8_t>(1) : c8);
    DeviceBuffer<uint16_t> d16(bf16 ? c16 : std::vector<uint16_t>(1));
    DeviceBuffer<int64_t> ds(slots);
    DeviceBuffer<uint16_t> dout(out);
    GatherArgs ha, da;
    ha.cache = host;
    ha.cache.base = bf16 ? static_cast<void*>(c16.data()) : c8.data();
    ha.slots = TensorView::contiguous(slots.data(), DType::I64, {M});
    ha.out = TensorView::strided(out.data(), DType::BF16, {M, 512}, {out_stride, 1});
    da = ha;
    da.cache.base = bf16 ? static_cast<void*>(d16.data()) : d8.data();
    da.cache.device = Device::CUDA;
    da.slots = ds.view1();
    da.out = dout.strided({M, 512}, {out_stride, 1});
    gather(ha);
    gather(da);
    EXPECT_TRUE(bits_equal(out, dout.download(), std::string("gather ") + record_info(f).name));
  }
}

TEST_F(CacheGpu, SaveRingRowsMatchesCpu) {
  for (int64_t extra : {16, 1}) {
    const int64_t G = 40, blocks = 30, cap = 8, bs = cap * 1024 + extra;
    std::vector<float> prev = random_f32(static_cast<size_t>(G * 1024), rng());
    std::vector<float> ring = random_f32(static_cast<size_t>(blocks * bs), rng());
    std::vector<int64_t> blk(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) blk[static_cast<size_t>(i)] = i;
    rng().shuffle(blk);
    std::vector<int64_t> slots(static_cast<size_t>(G), -1);
    for (int64_t g = 0; g < G; ++g)
      if (g < blocks && rng().uniform() < 0.7)
        slots[static_cast<size_t>(g)] = blk[static_cast<size_t>(g)] * cap + rng().integer(0, cap - 1);
    DeviceBuffer<float> dprev(prev), dring(ring);
    DeviceBuffer<int64_t> dslots(slots);
    SaveRingRowsArgs h, dv;
    h.prev_rows = TensorView::contiguous(prev.data(), DType::F32, {G, 1024});
    h.ring_write_slots = TensorView::contiguous(slots.data(), DType::I64, {G});
    h.ring = TensorView::strided(ring.data(), DType::F32, {blocks, cap, 1024}, {bs, 1024, 1});
    dv.prev_rows = dprev.view({G, 1024});
    dv.ring_write_slots = dslots.view1();
    dv.ring = dring.strided({blocks, cap, 1024}, {bs, 1024, 1});
    save_ring_rows(h);
    save_ring_rows(dv);
    EXPECT_TRUE(bits_equal(ring, dring.download(), "save_ring_rows ring backing"));
  }
}

}  // namespace
}  // namespace dsv41kv::test
