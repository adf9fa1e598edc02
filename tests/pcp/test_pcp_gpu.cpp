// PCP on the GPU (SPEC 7.4, 7.5, 7.8): one global step split over P ranks (plan_pcp_step), the
// link on the device (compared with the host link), the open-row compressor and save_ring_rows
// on the device (compared with the CPU on the same inputs), and the SPEC 7.8 invariants checked
// on the device results:
//   1. every latent of a closing token equals the single-rank non-PCP (tail policy) latent;
//   2. the P rings are byte-identical to each other and to a single-rank open-row run;
//   3. the newest open row of every request equals the tail-policy ring's row.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "dsv41kv/compressor.hpp"
#include "dsv41kv/pcp.hpp"
#include "dsv41kv/pcp_cuda.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

constexpr int64_t kCap = 8;

// kv_score row of (global request g, position p): a deterministic function, so that a token's
// row is the same on every rank and in the single-rank reference.
void kv_row(int64_t g, int64_t p, uint64_t seed, float* out) {
  Rng r(seed ^ (static_cast<uint64_t>(g) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(p) << 20));
  for (int c = 0; c < 1024; ++c) out[c] = static_cast<float>(r.normal() * (c >= 512 ? 2.0 : 1.0));
}

struct RankRun {
  std::vector<float> ring;
  std::vector<uint16_t> latent;  // [padded, 512]
  std::vector<int64_t> positions;
  std::vector<int32_t> local_req_to_global, t2r;
};

class PcpGpu : public GpuTest {};

TEST_F(PcpGpu, OpenRowPcpStepIsBitIdenticalToSingleRank) {
  size_t latents_checked = 0;  // over all draws (a draw may close no group)
  for (int P : {2, 3, 4, 8})
    for (int iter = 0; iter < 3; ++iter) {
      // ---- a global step: decodes first, then continued and fresh prefills
      std::vector<pcp::GlobalRequest> reqs;
      const int nd = static_cast<int>(rng().integer(0, 3)), np = static_cast<int>(rng().integer(1, 4));
      for (int i = 0; i < nd; ++i) reqs.push_back({1, rng().integer(1, 60), false});
      for (int i = 0; i < np; ++i) {
        const bool fresh = rng().uniform() < 0.3;
        reqs.push_back({rng().integer(1, 70), fresh ? 0 : rng().integer(1, 40), true});
      }
      const int64_t G_reqs = static_cast<int64_t>(reqs.size());
      std::vector<int64_t> block(static_cast<size_t>(G_reqs));
      for (int64_t g = 0; g < G_reqs; ++g) block[static_cast<size_t>(g)] = rng().uniform() < 0.15 ? 0 : g + 1;
      const int64_t ring_blocks = G_reqs + 1;
      const std::vector<float> ring0 = random_f32(static_cast<size_t>(ring_blocks * kCap * 1024), rng());
      const std::vector<uint16_t> norm_w = random_bf16(512, rng(), 0.5, 1.0);
      const uint64_t kv_seed = rng().next();
      const float eps = 1e-6f;
      pcp::PlanOptions opt;
      opt.P = P;
      const pcp::StepPlan plan = pcp::plan_pcp_step(reqs, opt);
      const int64_t padded = plan.padded;
      const int64_t max_num_seqs = G_reqs + 1;

      auto ring_view = [&](void* data, Device dv) {
        return TensorView::contiguous(data, DType::F32, {ring_blocks, kCap, 1024}, dv);
      };

      // ---- single-rank references on the GPU: non-PCP (tail) and open-row
      std::map<std::pair<int64_t, int64_t>, std::vector<uint16_t>> ref_latent;  // (g, p) -> row
      std::vector<float> ring_tail;
      std::vector<float> ring_open;
      {
        std::vector<int32_t> qsl{0}, t2r;
        std::vector<int64_t> pos, slots;
        std::vector<float> kv;
        for (int64_t g = 0; g < G_reqs; ++g) {
          const auto& r = reqs[static_cast<size_t>(g)];
          for (int64_t i = 0; i < r.query_len; ++i) {
            const int64_t p = r.num_computed + i;
            pos.push_back(p);
            t2r.push_back(static_cast<int32_t>(g));
            const int64_t b = block[static_cast<size_t>(g)];
            slots.push_back(b == 0 ? -1 : b * kCap + p % kCap);
            kv.resize(kv.size() + 1024);
            kv_row(g, p, kv_seed, kv.data() + kv.size() - 1024);
          }
          qsl.push_back(static_cast<int32_t>(pos.size()));
        }
        const int64_t N = static_cast<int64_t>(pos.size());
        DeviceBuffer<float> dkv(kv), dring(ring0), dring_open(ring0);
        DeviceBuffer<int64_t> dpos(pos), dslots(slots);
        DeviceBuffer<int32_t> dqsl(qsl), dt2r(t2r);
        DeviceBuffer<uint16_t> dnw(norm_w), dlat(std::vector<uint16_t>(static_cast<size_t>(N * 512), kBf16NaN));
        CompressArgs a;
        a.ratio = 2;
        a.kv_score = dkv.view({N, 1024});
        a.positions = dpos.view1();
        a.slot_mapping = dslots.view1();
        a.norm_weight = dnw.view1();
        a.eps = eps;
        a.latent_out = dlat.view({N, 512});
        a.ring = ring_view(dring.data(), Device::CUDA);
        a.qsl = dqsl.view1();
        a.token_to_req = dt2r.view1();
        compress(a);
        const std::vector<uint16_t> lat = dlat.download();
        for (int64_t t = 0; t < N; ++t)
          if (lat[static_cast<size_t>(t * 512)] != kBf16NaN || lat[static_cast<size_t>(t * 512 + 1)] != kBf16NaN)
            ref_latent[{t2r[static_cast<size_t>(t)], pos[static_cast<size_t>(t)]}] =
                std::vector<uint16_t>(lat.begin() + t * 512, lat.begin() + (t + 1) * 512);
        ring_tail = dring.download();
        // open-row single rank: link with P = 1, compress kOpenRow, save_ring_rows
        pcp::LinkInput in{slots, qsl, pos, kCap, std::max<int64_t>(max_num_seqs, 1)};
        const pcp::LinkLocal loc = pcp::link_local_keys(in);
        const pcp::LinkResult lr = pcp::link_resolve(in, loc, loc.local_keys, 1);
        std::vector<float> prev(static_cast<size_t>(lr.num_rows * 1024));
        for (int64_t j = 0; j < lr.num_rows; ++j)
          std::copy(kv.begin() + lr.gather_tokens[static_cast<size_t>(j)] * 1024,
                    kv.begin() + (lr.gather_tokens[static_cast<size_t>(j)] + 1) * 1024,
                    prev.begin() + j * 1024);
        DeviceBuffer<float> dprev(prev.empty() ? std::vector<float>(1024) : prev);
        DeviceBuffer<int64_t> dpi(lr.prev_row_indices.empty() ? std::vector<int64_t>{-1} : lr.prev_row_indices);
        DeviceBuffer<int64_t> drws(lr.ring_write_slots.empty() ? std::vector<int64_t>{-1} : lr.ring_write_slots);
        a.ring = ring_view(dring_open.data(), Device::CUDA);
        a.policy = RingPolicy::kOpenRow;
        a.prev_rows = dprev.view({lr.num_rows, 1024});
        a.prev_row_indices = dpi.view({lr.R});
        compress(a);
        SaveRingRowsArgs sr;
        sr.prev_rows = dprev.view({lr.num_rows, 1024});
        sr.ring_write_slots = drws.view({lr.num_rows});
        sr.ring = ring_view(dring_open.data(), Device::CUDA);
        save_ring_rows(sr);
        ring_open = dring_open.download();
      }

      // ---- the P ranks
      std::vector<std::vector<int64_t>> local_slots(static_cast<size_t>(P));
      std::vector<pcp::LinkLocal> locals;
      std::vector<int64_t> all_keys;
      for (int k = 0; k < P; ++k) {
        const pcp::RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
        auto& sl = local_slots[static_cast<size_t>(k)];
        sl.assign(static_cast<size_t>(padded), -1);
        for (int64_t j = 0; j < rb.num_reqs(); ++j) {
          const int32_t g = rb.local_to_global_req[static_cast<size_t>(j)];
          for (int64_t t = rb.qsl[static_cast<size_t>(j)]; t < rb.qsl[static_cast<size_t>(j + 1)]; ++t) {
            const int64_t b = g < 0 ? 0 : block[static_cast<size_t>(g)];
            const int64_t p = rb.positions[static_cast<size_t>(t)];
            sl[static_cast<size_t>(t)] = b == 0 ? -1 : b * kCap + p % kCap;
          }
        }
        pcp::LinkInput in{sl, rb.qsl, rb.positions, kCap, max_num_seqs};
        locals.push_back(pcp::link_local_keys(in));
        all_keys.insert(all_keys.end(), locals.back().local_keys.begin(), locals.back().local_keys.end());
      }
      const int64_t num_rows = locals[0].num_rows;
      // gathered last rows (rank-major)
      std::vector<float> prev(static_cast<size_t>(P * num_rows * 1024));
      for (int k = 0; k < P; ++k) {
        const pcp::RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
        for (int64_t j = 0; j < num_rows; ++j) {
          const int64_t t = locals[static_cast<size_t>(k)].gather_tokens[static_cast<size_t>(j)];
          int32_t g = 0;
          for (int64_t r = 0; r < rb.num_reqs(); ++r)
            if (t >= rb.qsl[static_cast<size_t>(r)] && t < rb.qsl[static_cast<size_t>(r + 1)])
              g = rb.local_to_global_req[static_cast<size_t>(r)];
          kv_row(std::max(g, 0), rb.positions[static_cast<size_t>(t)], kv_seed,
                 prev.data() + (k * num_rows + j) * 1024);
        }
      }
      std::vector<std::vector<float>> rings;
      std::set<decltype(ref_latent)::key_type> latents_seen;
      pcp::LinkDeviceWorkspace ws(std::max<int64_t>(P * num_rows, 1));
      DeviceBuffer<int64_t> dall(all_keys.empty() ? std::vector<int64_t>{-1} : all_keys);
      DeviceBuffer<float> dprev(prev.empty() ? std::vector<float>(1024) : prev);
      DeviceBuffer<uint16_t> dnw(norm_w);
      for (int k = 0; k < P; ++k) {
        const pcp::RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
        const auto& sl = local_slots[static_cast<size_t>(k)];
        pcp::LinkInput in{sl, rb.qsl, rb.positions, kCap, max_num_seqs};
        const pcp::LinkResult lr = pcp::link_resolve(in, locals[static_cast<size_t>(k)], all_keys, P);
        DeviceBuffer<int64_t> dsl(sl), dpos(rb.positions);
        DeviceBuffer<int32_t> dqsl(rb.qsl);
        const int64_t G = P * num_rows;
        // device link == host link  [device-link begin]
        DeviceBuffer<int64_t> sorted(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(G, 1)))),
            order(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(G, 1)))),
            rws(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(G, 1)))),
            pri(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(lr.R, 1)), 9));
        pcp::LinkDeviceInput din;
        din.ring_slots = dsl.view1();
        din.qsl = dqsl.view1();
        din.positions = dpos.view1();
        din.cap = kCap;
        din.max_num_seqs = max_num_seqs;
        pcp::LinkDeviceOutputs out;
        out.sorted_keys = sorted.view({G});
        out.order = order.view({G});
        out.ring_write_slots = rws.view({G});
        out.prev_row_indices = pri.view({lr.R});
        pcp::link_resolve_cuda(din, dall.view({G}), P, ws, out);
        std::vector<int64_t> d_rws = rws.download(), d_pri = pri.download();
        d_rws.resize(static_cast<size_t>(G));
        d_pri.resize(static_cast<size_t>(lr.R));
        ASSERT_EQ(d_rws, lr.ring_write_slots) << "P " << P << " rank " << k;
        ASSERT_EQ(d_pri, lr.prev_row_indices) << "P " << P << " rank " << k;
        // [device-link end]

        // local kv rows, token_to_req
        std::vector<float> kv(static_cast<size_t>(padded * 1024), 0.0f);
        std::vector<int32_t> t2r(static_cast<size_t>(padded), 0);
        for (int64_t j = 0; j < rb.num_reqs(); ++j)
          for (int64_t t = rb.qsl[static_cast<size_t>(j)]; t < rb.qsl[static_cast<size_t>(j + 1)]; ++t) {
            t2r[static_cast<size_t>(t)] = static_cast<int32_t>(j);
            kv_row(std::max(rb.local_to_global_req[static_cast<size_t>(j)], 0), rb.positions[static_cast<size_t>(t)],
                   kv_seed, kv.data() + t * 1024);
          }
        DeviceBuffer<float> dkv(kv), dring(ring0);
        DeviceBuffer<int32_t> dt2r(t2r);
        std::vector<uint16_t> lat(static_cast<size_t>(padded * 512), kBf16NaN);
        DeviceBuffer<uint16_t> dlat(lat);
        CompressArgs a;
        a.ratio = 2;
        a.kv_score = dkv.view({padded, 1024});
        a.positions = dpos.view1();
        a.slot_mapping = dsl.view1();
        a.norm_weight = dnw.view1();
        a.eps = eps;
        a.latent_out = dlat.view({padded, 512});
        a.ring = ring_view(dring.data(), Device::CUDA);
        a.qsl = dqsl.view1();
        a.token_to_req = dt2r.view1();
        a.policy = RingPolicy::kOpenRow;
        a.prev_rows = dprev.view({G, 1024});
        a.prev_row_indices = pri.view({lr.R});
        compress(a);
        SaveRingRowsArgs sr;
        sr.prev_rows = dprev.view({G, 1024});
        sr.ring_write_slots = rws.view({G});
        sr.ring = ring_view(dring.data(), Device::CUDA);
        save_ring_rows(sr);
        // the same on the CPU
        std::vector<float> hring = ring0;
        std::vector<int64_t> hpri = lr.prev_row_indices, hrws = lr.ring_write_slots;
        std::vector<int64_t> hsl = sl, hpos = rb.positions;
        std::vector<int32_t> hqsl = rb.qsl;
        CompressArgs h = a;
        h.kv_score = TensorView::contiguous(kv.data(), DType::F32, {padded, 1024});
        h.positions = TensorView::contiguous(hpos.data(), DType::I64, {padded});
        h.slot_mapping = TensorView::contiguous(hsl.data(), DType::I64, {padded});
        std::vector<uint16_t> hnw = norm_w;
        h.norm_weight = TensorView::contiguous(hnw.data(), DType::BF16, {512});
        h.latent_out = TensorView::contiguous(lat.data(), DType::BF16, {padded, 512});
        h.ring = ring_view(hring.data(), Device::CPU);
        h.qsl = TensorView::contiguous(hqsl.data(), DType::I32, {static_cast<int64_t>(hqsl.size())});
        h.token_to_req = TensorView::contiguous(t2r.data(), DType::I32, {padded});
        h.prev_rows = TensorView::contiguous(prev.data(), DType::F32, {G, 1024});
        h.prev_row_indices = TensorView::contiguous(hpri.data(), DType::I64, {lr.R});
        compress(h);
        SaveRingRowsArgs hs;
        hs.prev_rows = h.prev_rows;
        hs.ring_write_slots = TensorView::contiguous(hrws.data(), DType::I64, {G});
        hs.ring = h.ring;
        save_ring_rows(hs);
        const std::vector<uint16_t> dl = dlat.download();
        const std::vector<float> dr = dring.download();
        ASSERT_TRUE(bits_equal(lat, dl, "PCP latent cpu vs cuda"));
        ASSERT_TRUE(bits_equal(hring, dr, "PCP ring cpu vs cuda"));
        rings.push_back(dr);
        // invariant 1: every latent written equals the single-rank one (and, below, every
        // single-rank latent is written by some rank)
        for (int64_t t = 0; t < rb.num_tokens; ++t) {
          if (dl[static_cast<size_t>(t * 512)] == kBf16NaN && dl[static_cast<size_t>(t * 512 + 1)] == kBf16NaN) continue;
          const int32_t g = rb.local_to_global_req[static_cast<size_t>(t2r[static_cast<size_t>(t)])];
          const auto it = ref_latent.find({g, rb.positions[static_cast<size_t>(t)]});
          ASSERT_NE(it, ref_latent.end()) << "rank " << k << " token " << t << " has a latent the single-rank run has not";
          latents_seen.insert(it->first);
          ASSERT_TRUE(std::equal(it->second.begin(), it->second.end(), dl.begin() + t * 512))
              << "P " << P << " rank " << k << " latent of request " << g << " position "
              << rb.positions[static_cast<size_t>(t)];
        }
      }
      ASSERT_EQ(latents_seen.size(), ref_latent.size()) << "P " << P << ": single-rank latents no rank wrote";
      latents_checked += ref_latent.size();
      // invariant 2: rings identical across ranks and to the open-row single-rank ring
      for (int k = 0; k < P; ++k) {
        ASSERT_TRUE(bits_equal(rings[0], rings[static_cast<size_t>(k)], "ring rank 0 vs rank " + std::to_string(k)));
      }
      ASSERT_TRUE(bits_equal(ring_open, rings[0], "PCP ring vs single-rank open-row ring"));
      // invariant 3: each request's newest row, when open (even), equals the tail ring's row
      for (int64_t g = 0; g < G_reqs; ++g) {
        const auto& r = reqs[static_cast<size_t>(g)];
        const int64_t b = block[static_cast<size_t>(g)];
        const int64_t last = r.num_computed + r.query_len - 1;
        if (b == 0 || last % 2 != 0) continue;
        const size_t off = static_cast<size_t>((b * kCap + last % kCap) * 1024);
        ASSERT_TRUE(std::equal(ring_tail.begin() + off, ring_tail.begin() + off + 1024, rings[0].begin() + off))
            << "newest open row of request " << g;
      }
    }
  EXPECT_GT(latents_checked, 0u) << "no draw produced a latent: invariant 1 compared nothing";
}

}  // namespace
}  // namespace dsv41kv::test
