// CUDA metadata builders vs the CPU (SPEC 0.4 item 2: bit-identical metadata), on fresh random
// batches. The device PCP link is checked in tests/pcp/test_link_gpu.cpp and the shipped
// conformance files in tests/oracles/test_conformance_gpu.cpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pcp.hpp"
#include "dsv41kv/pcp_cuda.hpp"
#include "support/gpu_util.hpp"
#include "support/paths.hpp"

namespace dsv41kv::test {
namespace {

class MetadataGpu : public GpuTest {};

struct MetaBatch {
  int64_t N = 0, num_actual = 0, num_reqs = 0, cols = 0;
  std::vector<int32_t> qsl, t2r, table;
  std::vector<int64_t> pos, tslots;
};

MetaBatch make_meta(Rng& rng, int64_t num_reqs, int64_t max_len, int64_t pad) {
  MetaBatch m;
  m.num_reqs = num_reqs;
  m.qsl.push_back(0);
  std::vector<int64_t> starts;
  for (int64_t j = 0; j < num_reqs; ++j) {
    const int64_t len = rng.integer(0, max_len);
    const int64_t start = rng.integer(0, 3000);
    starts.push_back(start);
    for (int64_t i = 0; i < len; ++i) {
      m.pos.push_back(start + i);
      m.t2r.push_back(static_cast<int32_t>(j));
    }
    m.qsl.push_back(static_cast<int32_t>(m.pos.size()));
  }
  m.num_actual = static_cast<int64_t>(m.pos.size());
  m.N = m.num_actual + pad;
  m.pos.resize(static_cast<size_t>(m.N), 0);
  m.t2r.resize(static_cast<size_t>(m.N), 0);
  m.cols = (3000 + max_len) / 16 + 2;
  m.table.resize(static_cast<size_t>(num_reqs * m.cols));
  for (auto& v : m.table) v = static_cast<int32_t>(rng.integer(-1, 500));  // null/negative pages too
  m.tslots.resize(static_cast<size_t>(m.N));
  for (auto& v : m.tslots) v = rng.uniform() < 0.1 ? -1 : rng.integer(0, 100000);
  return m;
}

TEST_F(MetadataGpu, BuildersMatchCpu) {
  for (int iter = 0; iter < 6; ++iter) {
    MetaBatch m = make_meta(rng(), rng().integer(1, 40), rng().integer(1, 300), rng().integer(0, 9));
    const int64_t N = m.N;
    DeviceBuffer<int32_t> dqsl(m.qsl), dt2r(m.t2r), dtable(m.table);
    DeviceBuffer<int64_t> dpos(m.pos), dts(m.tslots);
    auto host = [&](auto& v) { return TensorView::contiguous(v.data(), DType::I64, {N}); };
    (void)host;
    const TensorView h_qsl = TensorView::contiguous(m.qsl.data(), DType::I32, {m.num_reqs + 1});
    const TensorView h_t2r = TensorView::contiguous(m.t2r.data(), DType::I32, {N});
    const TensorView h_pos = TensorView::contiguous(m.pos.data(), DType::I64, {N});
    const TensorView h_tab = TensorView::contiguous(m.table.data(), DType::I32, {m.num_reqs, m.cols});
    const TensorView h_ts = TensorView::contiguous(m.tslots.data(), DType::I64, {N});

    {  // token_to_req, with num_actual given and read on the device (-1)
      for (int64_t na : {m.num_actual, int64_t{-1}}) {
        std::vector<int32_t> h(static_cast<size_t>(N), 77);
        DeviceBuffer<int32_t> d(std::vector<int32_t>(static_cast<size_t>(N), 77));
        TokenToReqArgs a;
        a.qsl = h_qsl;
        a.token_to_req = TensorView::contiguous(h.data(), DType::I32, {N});
        a.num_actual_tokens = na;
        build_token_to_req(a);
        a.qsl = dqsl.view1();
        a.token_to_req = d.view1();
        build_token_to_req(a);
        EXPECT_TRUE(bits_equal(h, d.download(), "token_to_req"));
        EXPECT_TRUE(bits_equal(m.t2r, h, "token_to_req vs construction"));
      }
    }
    for (int64_t cap : {8, 16}) {  // ring slots (ring block table = column 0 of the table)
      std::vector<int64_t> h(static_cast<size_t>(N), 99);
      DeviceBuffer<int64_t> d(h);
      RingSlotArgs a;
      a.token_to_req = h_t2r;
      a.positions = h_pos;
      a.ring_block_table = h_tab;
      a.num_actual_tokens = m.num_actual;
      a.cap = cap;
      a.ring_slots = TensorView::contiguous(h.data(), DType::I64, {N});
      build_ring_slots(a);
      a.token_to_req = dt2r.view1();
      a.positions = dpos.view1();
      a.ring_block_table = dtable.view({m.num_reqs, m.cols});
      a.ring_slots = d.view1();
      build_ring_slots(a);
      EXPECT_TRUE(bits_equal(h, d.download(), "ring_slots cap " + std::to_string(cap)));
    }
    {  // token slots, page 16 (the table has enough columns)
      std::vector<int64_t> h(static_cast<size_t>(N), 99);
      DeviceBuffer<int64_t> d(h);
      TokenSlotArgs a;
      a.token_to_req = h_t2r;
      a.positions = h_pos;
      a.block_table = h_tab;
      a.num_actual_tokens = m.num_actual;
      a.page = 16;
      a.slots = TensorView::contiguous(h.data(), DType::I64, {N});
      build_token_slots(a);
      a.token_to_req = dt2r.view1();
      a.positions = dpos.view1();
      a.block_table = dtable.view({m.num_reqs, m.cols});
      a.slots = d.view1();
      build_token_slots(a);
      EXPECT_TRUE(bits_equal(h, d.download(), "token_slots"));
    }
    for (int ratio : {1, 2})
      for (bool with_ts : {false, true}) {
        std::vector<int64_t> h(static_cast<size_t>(N), 99);
        DeviceBuffer<int64_t> d(h);
        CompressedSlotArgs a;
        a.ratio = ratio;
        a.token_to_req = h_t2r;
        a.positions = h_pos;
        a.block_table = h_tab;
        if (with_ts) a.token_slots = h_ts;
        a.num_actual_tokens = m.num_actual;
        a.states_per_page = 16 / ratio;
        a.slots = TensorView::contiguous(h.data(), DType::I64, {N});
        build_compressed_slots(a);
        a.token_to_req = dt2r.view1();
        a.positions = dpos.view1();
        a.block_table = dtable.view({m.num_reqs, m.cols});
        if (with_ts) a.token_slots = dts.view1();
        a.slots = d.view1();
        build_compressed_slots(a);
        EXPECT_TRUE(bits_equal(h, d.download(),
                               "compressed_slots r" + std::to_string(ratio) + (with_ts ? " +tslots" : "")));
      }
  }
}

// SPEC 10.1.6 example through the CUDA ring builder.
TEST_F(MetadataGpu, RingSlotExample) {
  std::vector<int32_t> t2r = {0, 0, 0, 1, 1, 2, 2, 0, 0, 0};
  std::vector<int64_t> pos = {13, 14, 15, 7, 8, 0, 1, 0, 0, 0};
  std::vector<int32_t> bt = {5, 2, 0};
  DeviceBuffer<int32_t> dt2r(t2r), dbt(bt);
  DeviceBuffer<int64_t> dpos(pos), dout(std::vector<int64_t>(10, 123));
  RingSlotArgs a;
  a.token_to_req = dt2r.view1();
  a.positions = dpos.view1();
  a.ring_block_table = dbt.view({3, 1});
  a.num_actual_tokens = 7;
  a.cap = 8;
  a.ring_slots = dout.view1();
  build_ring_slots(a);
  EXPECT_EQ(dout.download(), (std::vector<int64_t>{45, 46, 47, 23, 16, -1, -1, -1, -1, -1}));
}

}  // namespace
}  // namespace dsv41kv::test
