// The CUDA SWA insert + query RoPE (swa_insert_q_rope on device views) against the CPU backend on
// fresh random inputs: every SWA record format, the plain and a random table, padded and unpadded
// heads, strided and in-place queries; whole canary-filled caches and query buffers byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsv41kv/cache.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/gpu_util.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

class SwaInsertGpu : public GpuTest {};

TEST_F(SwaInsertGpu, MatchesCpuEveryFormatPaddedStridedInPlace) {
  struct Shape {
    int64_t H, H_pad;
    bool in_place;
  };
  for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::PLAIN_BF16,
                         RecordFormat::PLAIN_FP8})
    for (const Shape sh : {Shape{64, 64, false}, Shape{8, 64, false}, Shape{16, 128, false}, Shape{8, 8, true}}) {
      const std::string what = std::string(record_info(f).name) + " H " + std::to_string(sh.H) + "/" +
                               std::to_string(sh.H_pad) + (sh.in_place ? " in place" : "");
      const int64_t T = 77, S = 32, pages = 6, rows = 300;
      const bool bf16 = f == RecordFormat::PLAIN_BF16;
      CacheView c = CacheView::with_default_strides(nullptr, f, pages, S);
      if (!record_info(f).packed) c.row_stride = 520;
      c.page_stride = record_info(f).packed ? c.page_stride + 40 : S * c.row_stride + 24;
      c.fp8_scale = 0.375f;
      const size_t cache_elems = static_cast<size_t>(pages * c.page_stride);
      std::vector<uint8_t> c8(bf16 ? 1 : cache_elems, kByteCanary);
      std::vector<uint16_t> c16(bf16 ? cache_elems : 1, kBf16Canary);
      std::vector<uint16_t> kv = random_bf16(static_cast<size_t>(T * 512), rng());
      const int64_t q_hs = 520, q_ts = sh.H * q_hs + 24;
      const int64_t o_hs = sh.in_place ? q_hs : 512 + 16, o_ts = sh.in_place ? q_ts : sh.H_pad * o_hs + 8;
      std::vector<uint16_t> q = random_bf16(static_cast<size_t>(T * q_ts), rng(), 2.0);
      std::vector<uint16_t> out(static_cast<size_t>(T * o_ts), 0x7F81);
      std::vector<float> table(static_cast<size_t>(rows * 64));
      for (auto& v : table) v = static_cast<float>(rng().uniform(-1.0, 1.0));
      std::vector<int64_t> pos(static_cast<size_t>(T)), slot(static_cast<size_t>(T));
      std::vector<int64_t> perm(static_cast<size_t>(pages * S));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      rng().shuffle(perm);
      for (int64_t t = 0; t < T; ++t) {
        pos[static_cast<size_t>(t)] = t < T - 3 ? rng().integer(0, rows - 1) : 0;  // three padding rows
        slot[static_cast<size_t>(t)] = t < T - 3 && t % 7 != 4 ? perm[static_cast<size_t>(t)] : -1;
      }
      DeviceBuffer<uint8_t> d8(c8);
      DeviceBuffer<uint16_t> d16(c16), dkv(kv), dq(q), dout(out);
      DeviceBuffer<float> dtab(table);
      DeviceBuffer<int64_t> dpos(pos), dslot(slot);
      SwaInsertArgs h;
      h.kv = TensorView::contiguous(kv.data(), DType::BF16, {T, 512});
      h.q = TensorView::strided(q.data(), DType::BF16, {T, sh.H, 512}, {q_ts, q_hs, 1});
      h.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
      h.rope_table = TensorView::contiguous(table.data(), DType::F32, {rows, 64});
      h.slot_swa = TensorView::contiguous(slot.data(), DType::I64, {T});
      h.cache = c;
      h.cache.base = bf16 ? static_cast<void*>(c16.data()) : c8.data();
      h.q_out = sh.in_place ? h.q : TensorView::strided(out.data(), DType::BF16, {T, sh.H_pad, 512}, {o_ts, o_hs, 1});
      SwaInsertArgs d;
      d.kv = dkv.view({T, 512});
      d.q = dq.strided({T, sh.H, 512}, {q_ts, q_hs, 1});
      d.positions = dpos.view1();
      d.rope_table = dtab.view({rows, 64});
      d.slot_swa = dslot.view1();
      d.cache = c;
      d.cache.base = bf16 ? static_cast<void*>(d16.data()) : d8.data();
      d.cache.device = Device::CUDA;
      d.q_out = sh.in_place ? d.q : dout.strided({T, sh.H_pad, 512}, {o_ts, o_hs, 1});
      swa_insert_q_rope(h);
      swa_insert_q_rope(d);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (bf16) {
        EXPECT_TRUE(bits_equal(c16, d16.download(), what + ": cache"));
      } else {
        EXPECT_TRUE(bits_equal(c8, d8.download(), what + ": cache"));
      }
      if (sh.in_place) {
        EXPECT_TRUE(bits_equal(q, dq.download(), what + ": q rotated in place"));
      } else {
        EXPECT_TRUE(bits_equal(out, dout.download(), what + ": q_out"));
        EXPECT_TRUE(bits_equal(q, dq.download(), what + ": q untouched"));
      }
    }
}

}  // namespace
}  // namespace dsv41kv::test
