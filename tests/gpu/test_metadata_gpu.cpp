// CUDA metadata builders and the device PCP link vs the CPU (SPEC 0.4 item 2: bit-identical
// metadata and link outputs), on fresh random batches; plus the shipped conformance files run
// through the CUDA path with the README's agreement rules.
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
#include "gpu/gpu_util.hpp"
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

// The device link equals the host link (pcp.hpp) bit for bit, keys to prev_row_indices.
TEST_F(MetadataGpu, PcpLinkMatchesHost) {
  int compared = 0;  // (draw, rank) pairs that reached the device comparison (E10 draws are skipped)
  for (int P : {1, 2, 3, 4, 8})
    for (int iter = 0; iter < 4; ++iter) {
      const int64_t cap = 8, max_num_seqs = rng().integer(1, 12);
      // P local batches with shared ring blocks (requests appear on several ranks)
      const int64_t num_blocks = rng().integer(1, 10);
      std::vector<std::vector<int64_t>> slots(P), positions(P);
      std::vector<std::vector<int32_t>> qsls(P);
      int64_t N = 0;
      std::vector<int64_t> nreq(P);
      for (int k = 0; k < P; ++k) nreq[k] = rng().integer(1, 2 * max_num_seqs);
      // common padded N: the largest rank's token count
      std::vector<std::vector<int64_t>> lens(P);
      for (int k = 0; k < P; ++k) {
        int64_t n = 0;
        for (int64_t j = 0; j < nreq[k]; ++j) {
          lens[k].push_back(rng().integer(0, 9));
          n += lens[k].back();
        }
        N = std::max(N, n);
      }
      N = std::max<int64_t>(N, 1) + rng().integer(0, 3);
      for (int k = 0; k < P; ++k) {
        qsls[k].push_back(0);
        slots[k].assign(static_cast<size_t>(N), -1);
        positions[k].assign(static_cast<size_t>(N), 0);
        int64_t t = 0;
        for (int64_t j = 0; j < nreq[k]; ++j) {
          const int64_t blk = rng().integer(0, num_blocks);  // 0: null block
          const int64_t start = rng().integer(0, 40);
          for (int64_t i = 0; i < lens[k][static_cast<size_t>(j)]; ++i, ++t) {
            positions[k][static_cast<size_t>(t)] = start + i;
            slots[k][static_cast<size_t>(t)] = blk == 0 ? -1 : blk * cap + (start + i) % cap;
          }
          qsls[k].push_back(static_cast<int32_t>(t));
        }
      }
      const int64_t rows = pcp::link_num_rows(N, max_num_seqs);
      // host link per rank (E10 possible: then skip this draw)
      std::vector<pcp::LinkLocal> locals;
      bool overflow = false;
      for (int k = 0; k < P && !overflow; ++k) {
        pcp::LinkInput in{slots[k], qsls[k], positions[k], cap, max_num_seqs};
        try {
          locals.push_back(pcp::link_local_keys(in));
        } catch (const Error& e) {
          overflow = e.code() == ErrorCode::kPcpOverflow;
          if (!overflow) throw;
        }
      }
      if (overflow) continue;
      std::vector<int64_t> all;
      for (auto& l : locals) all.insert(all.end(), l.local_keys.begin(), l.local_keys.end());
      pcp::LinkDeviceWorkspace ws(static_cast<int64_t>(P) * rows + 5);
      DeviceBuffer<int64_t> dall(all);
      for (int k = 0; k < P; ++k) {
        pcp::LinkInput in{slots[k], qsls[k], positions[k], cap, max_num_seqs};
        const pcp::LinkResult host = pcp::link_resolve(in, locals[static_cast<size_t>(k)], all, P);
        DeviceBuffer<int64_t> dslots(slots[k]), dpos(positions[k]);
        DeviceBuffer<int32_t> dqsl(qsls[k]);
        pcp::LinkDeviceInput din;
        din.ring_slots = dslots.view1();
        din.qsl = dqsl.view1();
        din.positions = dpos.view1();
        din.cap = cap;
        din.max_num_seqs = max_num_seqs;
        ASSERT_EQ(pcp::link_device_num_rows(din), rows);
        ASSERT_EQ(pcp::link_device_R(din), host.R);
        DeviceBuffer<int64_t> keys(std::vector<int64_t>(static_cast<size_t>(rows), 55));
        DeviceBuffer<int64_t> gt(std::vector<int64_t>(static_cast<size_t>(rows), 55));
        if (rows > 0) {
          pcp::link_local_keys_cuda(din, keys.view1(), gt.view1());
          EXPECT_EQ(keys.download(), locals[static_cast<size_t>(k)].local_keys) << "P " << P << " rank " << k;
          EXPECT_EQ(gt.download(), locals[static_cast<size_t>(k)].gather_tokens) << "P " << P << " rank " << k;
        }
        const size_t G = all.size();
        DeviceBuffer<int64_t> sorted(std::vector<int64_t>(G, 7)), order(std::vector<int64_t>(G, 7)),
            rws(std::vector<int64_t>(G, 7)),
            prev(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(host.R, 1)), 7));
        pcp::LinkDeviceOutputs out;
        out.sorted_keys = sorted.view1();
        out.order = order.view1();
        out.ring_write_slots = rws.view1();
        out.prev_row_indices = prev.view({host.R});
        if (G == 0) continue;
        ++compared;
        pcp::link_resolve_cuda(din, dall.view1(), P, ws, out);
        EXPECT_EQ(sorted.download(), host.sorted_keys) << "P " << P;
        EXPECT_EQ(order.download(), host.order) << "P " << P;
        EXPECT_EQ(rws.download(), host.ring_write_slots) << "P " << P;
        std::vector<int64_t> p = prev.download();
        p.resize(static_cast<size_t>(host.R));
        EXPECT_EQ(p, host.prev_row_indices) << "P " << P;
      }
    }
  // most draws fit max_num_seqs; a run where every one overflowed would have compared nothing
  EXPECT_GE(compared, 10) << "too few link draws reached the device comparison";
}

// The shipped conformance files through the CUDA path (SPEC 10.3 agreement rules; the runner
// copies the inputs to the GPU and runs compress + insert there).
class ConformanceGpu : public GpuTest {};

TEST_F(ConformanceGpu, FilesThroughCuda) {
  namespace fs = std::filesystem;
  int ran = 0;
  for (const char* f : {"compress_r1_shared.safetensors", "compress_r2_shared.safetensors"}) {
    const std::string path = conformance_dir() + "/" + f;
    if (!fs::exists(path)) continue;
    conformance::Options o;
    o.device = Device::CUDA;
    const conformance::FileResult r = conformance::run_file(path, o);
    EXPECT_EQ(r.failed(), 0) << path;
    if (r.failed() != 0)
      for (const auto& line : conformance::report(r)) std::printf("%s\n", line.c_str());
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no conformance files under " << conformance_dir();
}

}  // namespace
}  // namespace dsv41kv::test
