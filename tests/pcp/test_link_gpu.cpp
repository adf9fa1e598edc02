// The device PCP link (pcp_cuda.hpp) against the host link on fresh random batches.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pcp.hpp"
#include "dsv41kv/pcp_cuda.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class LinkGpu : public GpuTest {};

// The device link equals the host link (pcp.hpp) bit for bit, keys to prev_row_indices.
TEST_F(LinkGpu, PcpLinkMatchesHost) {
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

}  // namespace
}  // namespace dsv41kv::test
