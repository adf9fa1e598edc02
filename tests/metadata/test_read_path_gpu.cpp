// The read path's decode-step metadata on the device (SPEC 6.1, 6.6): the SWA window rows, the
// decode top-k slots, the validity mask and the masked lengths built by the CUDA builders are bit
// for bit the CPU builders', on fresh random batches (decodes of 1 .. 1 + num_speculative_tokens
// query tokens, up to 6 per request, then prefills), in canary-filled outputs whose whole backing
// is compared (rows past the batch, the gap of a row stride wider than the row).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dsv41kv/metadata.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class ReadPathMetadataGpu : public GpuTest {};

constexpr int32_t kCanary = 0x5A5A5A5A;

struct ReadBatch {
  int64_t num_spec = 0, R = 0, N = 0, max_tokens = 0, cols = 0, num_pages = 0;
  std::vector<int32_t> qsl, table;
  std::vector<int64_t> pos, slot;
};

// Decodes first (query_len 1 .. 1 + num_spec), then prefills (any length, 0 included); a few
// invalid tokens (slot -1) and null pages (ids <= 0) in the table; `max_tokens` past N.
ReadBatch make_batch(Rng& rng, int64_t num_spec, int64_t decodes, int64_t prefills, int64_t page) {
  ReadBatch b;
  b.num_spec = num_spec;
  b.R = decodes + prefills;
  b.num_pages = 700;
  b.qsl.push_back(0);
  const int64_t max_start = 5000;
  for (int64_t j = 0; j < b.R; ++j) {
    const int64_t len = j < decodes ? rng.integer(1, 1 + num_spec) : rng.integer(0, 40);
    const int64_t start = rng.integer(0, max_start);
    for (int64_t i = 0; i < len; ++i) b.pos.push_back(start + i);
    b.qsl.push_back(static_cast<int32_t>(b.pos.size()));
  }
  b.N = static_cast<int64_t>(b.pos.size()) + rng.integer(0, 5);
  b.pos.resize(static_cast<size_t>(b.N), 0);
  b.max_tokens = b.N + rng.integer(0, 7);
  b.cols = (max_start + 64) / page + 2;
  b.table.resize(static_cast<size_t>(b.R * b.cols));
  for (auto& v : b.table) v = static_cast<int32_t>(rng.integer(-1, b.num_pages - 1));
  b.slot.resize(static_cast<size_t>(b.N));
  for (auto& v : b.slot) v = rng.uniform() < 0.08 ? -1 : rng.integer(0, 100000);
  return b;
}

TEST_F(ReadPathMetadataGpu, DecodeRowsMatchCpu) {
  for (int iter = 0; iter < 12; ++iter) {
    const int64_t num_spec = rng().integer(0, 5);  // up to 6 query tokens per decode request
    const int64_t page = iter % 2 == 0 ? 32 : 16;
    const int64_t S = iter % 3 == 0 ? 64 : 32;
    ReadBatch b = make_batch(rng(), num_spec, rng().integer(0, 24), rng().integer(0, 4), std::min(page, S));
    const TensorView h_qsl = TensorView::contiguous(b.qsl.data(), DType::I32, {b.R + 1});
    const DecodeSplit sp = split_decode_prefill(h_qsl, num_spec);
    const int64_t T = sp.num_decode_tokens, M = b.max_tokens;
    SCOPED_TRACE("iter " + std::to_string(iter) + ": " + std::to_string(b.R) + " requests, " + std::to_string(T) +
                 " decode tokens, num_spec " + std::to_string(num_spec));
    DeviceBuffer<int32_t> dqsl(b.qsl), dtab(b.table);
    DeviceBuffer<int64_t> dpos(b.pos), dslot(b.slot);
    const TensorView h_tab = TensorView::contiguous(b.table.data(), DType::I32, {b.R, b.cols});
    const TensorView h_pos = TensorView::contiguous(b.pos.data(), DType::I64, {b.N});
    const TensorView h_slot = TensorView::contiguous(b.slot.data(), DType::I64, {b.N});

    {  // window rows, a row stride wider than the row
      const int64_t rs = kSwaWindow + 8;
      std::vector<int32_t> hi(static_cast<size_t>(M * rs), kCanary), hl(static_cast<size_t>(M + 3), kCanary);
      DeviceBuffer<int32_t> di(hi), dl(hl);
      SwaWindowArgs a;
      a.qsl = h_qsl;
      a.num_speculative_tokens = num_spec;
      a.positions = h_pos;
      a.slot_swa = h_slot;
      a.block_table = h_tab;
      a.page = page;
      a.num_pages = b.num_pages;
      a.indices = TensorView::strided(hi.data(), DType::I32, {M, kSwaWindow}, {rs, 1});
      a.lengths = TensorView::contiguous(hl.data(), DType::I32, {M});
      const DecodeSplit hs = build_swa_window(a);
      a.qsl = dqsl.view1();
      a.positions = dpos.view1();
      a.slot_swa = dslot.view1();
      a.block_table = dtab.view({b.R, b.cols});
      a.indices = di.strided({M, kSwaWindow}, {rs, 1});
      a.lengths = dl.view({M});
      EXPECT_THROW(build_swa_window(a), Error) << "device views without the host's split";
      a.split = &sp;
      const DecodeSplit ds = build_swa_window(a);
      EXPECT_EQ(hs.num_decode_tokens, ds.num_decode_tokens);
      EXPECT_TRUE(bits_equal(hi, di.download(), "window rows"));
      EXPECT_TRUE(bits_equal(hl, dl.download(), "window lengths"));
    }
    {  // top-k slots of K = 512 entries (and a narrower K) of compressed-entry indices
      for (int64_t K : {int64_t{kIndexTopk}, int64_t{77}}) {
        std::vector<int32_t> topk(static_cast<size_t>(std::max<int64_t>(T, 1) * K));
        const int64_t max_i = (5000 + 64) / 1 - 1;
        for (auto& v : topk) v = rng().uniform() < 0.1 ? -1 : static_cast<int32_t>(rng().integer(0, max_i));
        const int64_t cols = max_i / S + 1;
        std::vector<int32_t> tab(static_cast<size_t>(b.R * cols));
        for (auto& v : tab) v = static_cast<int32_t>(rng().integer(-1, b.num_pages - 1));
        DeviceBuffer<int32_t> dtk(topk), dct(tab);
        std::vector<int32_t> hi(static_cast<size_t>(M * K), kCanary), hl(static_cast<size_t>(M + 3), kCanary);
        DeviceBuffer<int32_t> di(hi), dl(hl);
        DecodeTopkSlotArgs a;
        a.qsl = h_qsl;
        a.num_speculative_tokens = num_spec;
        a.slot_swa = h_slot;
        a.topk = TensorView::contiguous(topk.data(), DType::I32, {std::max<int64_t>(T, 1), K});
        a.block_table = TensorView::contiguous(tab.data(), DType::I32, {b.R, cols});
        a.states_per_page = S;
        a.num_pages = b.num_pages;
        a.indices = TensorView::contiguous(hi.data(), DType::I32, {M, K});
        a.lengths = TensorView::contiguous(hl.data(), DType::I32, {M});
        build_decode_topk_slots(a);
        a.qsl = dqsl.view1();
        a.slot_swa = dslot.view1();
        a.topk = dtk.view({std::max<int64_t>(T, 1), K});
        a.block_table = dct.view({b.R, cols});
        a.indices = di.view({M, K});
        a.lengths = dl.view({M});
        a.split = &sp;
        build_decode_topk_slots(a);
        EXPECT_TRUE(bits_equal(hi, di.download(), "top-k slots K " + std::to_string(K)));
        EXPECT_TRUE(bits_equal(hl, dl.download(), "top-k lengths K " + std::to_string(K)));
      }
    }
    {  // validity and the masked lengths
      std::vector<int32_t> hv(static_cast<size_t>(b.N + 2), kCanary);
      DeviceBuffer<int32_t> dv(hv);
      build_token_valid(h_slot, TensorView::contiguous(hv.data(), DType::I32, {b.N}));
      build_token_valid(dslot.view1(), dv.view({b.N}));
      EXPECT_TRUE(bits_equal(hv, dv.download(), "token_valid"));
      std::vector<int32_t> hl(static_cast<size_t>(b.N + 2));
      for (auto& v : hl) v = static_cast<int32_t>(rng().integer(0, 640));
      DeviceBuffer<int32_t> dl(hl), dvv(hv);
      const int64_t Tm = rng().integer(0, b.N);
      mask_invalid_lengths(TensorView::contiguous(hv.data(), DType::I32, {b.N}),
                           TensorView::contiguous(hl.data(), DType::I32, {Tm}));
      mask_invalid_lengths(dvv.view({b.N}), dl.view({Tm}));
      EXPECT_TRUE(bits_equal(hl, dl.download(), "masked lengths"));
    }
  }
}

// A device split that contradicts qsl's shape is refused before anything is written.
TEST_F(ReadPathMetadataGpu, DeviceSplitChecked) {
  ReadBatch b = make_batch(rng(), 1, 4, 1, 32);
  const TensorView h_qsl = TensorView::contiguous(b.qsl.data(), DType::I32, {b.R + 1});
  DecodeSplit sp = split_decode_prefill(h_qsl, 1);
  DeviceBuffer<int32_t> dqsl(b.qsl), dtab(b.table);
  DeviceBuffer<int64_t> dpos(b.pos), dslot(b.slot);
  std::vector<int32_t> hi(static_cast<size_t>(b.max_tokens * kSwaWindow), kCanary), hl(static_cast<size_t>(b.max_tokens), kCanary);
  DeviceBuffer<int32_t> di(hi), dl(hl);
  SwaWindowArgs a;
  a.qsl = dqsl.view1();
  a.num_speculative_tokens = 1;
  a.positions = dpos.view1();
  a.slot_swa = dslot.view1();
  a.block_table = dtab.view({b.R, b.cols});
  a.indices = di.view({b.max_tokens, kSwaWindow});
  a.lengths = dl.view({b.max_tokens});
  DecodeSplit bad = sp;
  bad.num_reqs += 1;
  a.split = &bad;
  EXPECT_THROW(build_swa_window(a), Error);
  bad = sp;
  bad.num_decode_tokens = bad.num_decodes * 2 + 1;
  EXPECT_THROW(build_swa_window(a), Error);
  EXPECT_TRUE(bits_equal(hi, di.download(), "window rows untouched"));
  EXPECT_TRUE(bits_equal(hl, dl.download(), "lengths untouched"));
}

}  // namespace
}  // namespace dsv41kv::test
