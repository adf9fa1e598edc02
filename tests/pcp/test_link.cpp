// The link (SPEC 7.4): the worked example of SPEC 10.5 end to end (local metadata, link, the
// open-row compressor, save_ring_rows, gathered inserts), tie-breaks, key rules, E10, and the
// communication accounting of SPEC 7.7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "dsv41kv/test_seam.hpp"
#include "dsv41kv/comm.hpp"
#include "dsv41kv/compressor.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pcp.hpp"
#include "support/canary.hpp"
#include "support/errors.hpp"

using namespace dsv41kv;
using namespace dsv41kv::pcp;
using dsv41kv::test::code_of;
using dsv41kv::test::kBf16NaN;

namespace {

LinkInput input(const std::vector<int64_t>& slots, const std::vector<int32_t>& qsl,
                const std::vector<int64_t>& pos, int64_t cap = 8, int64_t max_num_seqs = 8) {
  LinkInput in;
  in.ring_slots = slots;
  in.qsl = qsl;
  in.positions = pos;
  in.cap = cap;
  in.max_num_seqs = max_num_seqs;
  return in;
}

// Deterministic kv_score row of (request, position).
void kv_row(float* dst, int req, int64_t pos) {
  uint32_t s = static_cast<uint32_t>(req * 7919 + pos * 104729 + 17);
  for (int c = 0; c < kRingRowFloats; ++c) {
    s = s * 1664525u + 1013904223u;
    dst[c] = static_cast<float>(static_cast<int32_t>(s >> 8) % 4001 - 2000) / (c < 512 ? 1000.0f : 500.0f);
  }
}

}  // namespace

// SPEC 10.5 rank-local tensors (ring slots as §6.3 builds them), the keys and the link outputs.
TEST(PcpLink, WorkedExampleMetadataAndLink) {
  std::vector<GlobalRequest> g = {{1, 20, false}, {13, 3, true}};
  PlanOptions o;
  o.P = 2;
  const StepPlan plan = plan_pcp_step(g, o);
  ASSERT_EQ(plan.padded, 9);
  const std::vector<int32_t> global_ring_block = {9, 5};  // B, A
  std::vector<std::vector<int64_t>> slots(2), expected_slots = {
      {76, 43, 44, 45, 46, 47, -1, -1, -1}, {76, 47, 40, 41, 42, 43, 44, 45, 46}};
  for (int k = 0; k < 2; ++k) {
    const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    std::vector<int32_t> qsl = rb.qsl, t2r(9, -7);
    std::vector<int64_t> pos = rb.positions;
    build_token_to_req({TensorView::contiguous(qsl.data(), DType::I32, {rb.num_reqs() + 1}),
                        TensorView::contiguous(t2r.data(), DType::I32, {9})});
    std::vector<int32_t> bt;
    for (int32_t gr : rb.local_to_global_req) bt.push_back(global_ring_block[static_cast<size_t>(gr)]);
    slots[static_cast<size_t>(k)].assign(9, 0);
    RingSlotArgs a;
    a.token_to_req = TensorView::contiguous(t2r.data(), DType::I32, {9});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {9});
    a.ring_block_table = TensorView::contiguous(bt.data(), DType::I32, {rb.num_reqs(), 1});
    a.num_actual_tokens = rb.num_tokens;
    a.cap = 8;
    a.ring_slots = TensorView::contiguous(slots[static_cast<size_t>(k)].data(), DType::I64, {9});
    build_ring_slots(a);
    EXPECT_EQ(slots[static_cast<size_t>(k)], expected_slots[static_cast<size_t>(k)]) << "rank " << k;
  }
  auto key = [](int64_t b, int64_t p) { return (b << 32) | p; };
  const LinkLocal l0 = link_local_keys(input(slots[0], plan.ranks[0].qsl, plan.ranks[0].positions));
  const LinkLocal l1 = link_local_keys(input(slots[1], plan.ranks[1].qsl, plan.ranks[1].positions));
  ASSERT_EQ(l0.num_rows, 9);
  EXPECT_EQ(l0.local_keys, (std::vector<int64_t>{key(9, 20), key(5, 6), key(5, 15), -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(l1.local_keys, (std::vector<int64_t>{key(9, 20), key(5, 10), key(5, 14), -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(l0.gather_tokens, (std::vector<int64_t>{0, 4, 5, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(l1.gather_tokens, (std::vector<int64_t>{0, 4, 8, 0, 0, 0, 0, 0, 0}));

  // Both ranks through a real all-gather.
  std::vector<LinkResult> res(2);
  ThreadGroup group(2);
  group.run([&](Communicator& c) {
    const int k = c.rank();
    res[static_cast<size_t>(k)] = link_pcp_chunks(
        input(slots[static_cast<size_t>(k)], plan.ranks[static_cast<size_t>(k)].qsl, plan.ranks[static_cast<size_t>(k)].positions), c);
  });
  for (int k = 0; k < 2; ++k) {
    const LinkResult& r = res[static_cast<size_t>(k)];
    // Sorted non-negative keys: (5,6)g1 (5,10)g10 (5,14)g11 (5,15)g2 (9,20)g0 (9,20)g9.
    const std::vector<int64_t> tail(r.order.end() - 6, r.order.end());
    EXPECT_EQ(tail, (std::vector<int64_t>{1, 10, 11, 2, 0, 9}));
    std::vector<int64_t> w(18, -1);
    w[9] = 76;
    EXPECT_EQ(r.ring_write_slots, w);
    EXPECT_EQ(r.ring_write_slots[9], 9 * 8 + 4);
  }
  EXPECT_EQ(res[0].prev_row_indices, (std::vector<int64_t>{-1, -1, 11}));
  EXPECT_EQ(res[1].prev_row_indices, (std::vector<int64_t>{-1, 1, 10}));
}

// SPEC 10.5 data path: pair programs produce 5 (rank 0) and 9, 13 (rank 1); request programs 3,
// 15 (rank 0) and 7, 11 (rank 1); all equal the single-rank run; both rings end with row 76 =
// B's kv_score row and nothing else changed; both caches byte-identical to the single-rank one.
TEST(PcpLink, WorkedExampleDataPath) {
  const int64_t cap = 8, blocks = 10, S = 8, pages = 4;
  std::vector<GlobalRequest> g = {{1, 20, false}, {13, 3, true}};
  PlanOptions o;
  o.P = 2;
  const StepPlan plan = plan_pcp_step(g, o);
  const int64_t padded = plan.padded, GP = 2 * padded;
  const std::vector<int32_t> ring_block = {9, 5};
  const std::vector<std::vector<int32_t>> ctable = {{0, 3}, {1, 2}};  // B: state 10 -> page 3
  std::vector<uint16_t> w(512);
  for (int d = 0; d < 512; ++d) w[static_cast<size_t>(d)] = num::bf16_encode(0.75f + 0.001f * static_cast<float>(d));
  std::vector<float> rope(32 * 64);
  for (int r = 0; r < 32; ++r)
    for (int i = 0; i < 32; ++i) {
      rope[static_cast<size_t>(r * 64 + i)] = std::cos(0.1f * static_cast<float>(r * (i + 1)));
      rope[static_cast<size_t>(r * 64 + 32 + i)] = std::sin(0.1f * static_cast<float>(r * (i + 1)));
    }
  auto fresh_ring = [&] {
    std::vector<float> ring(static_cast<size_t>(blocks * cap * kRingRowFloats), 3.0f);
    kv_row(ring.data() + (5 * cap + 2) * kRingRowFloats, 1, 2);  // A's open row, position 2
    return ring;
  };
  auto cache_view = [&](std::vector<uint8_t>& b) {
    CacheView v = CacheView::with_default_strides(nullptr, RecordFormat::V4_584, pages, S);
    b.assign(v.backing_bytes(), 165);
    v.base = b.data();
    return v;
  };
  auto cslot = [&](int req, int64_t p) -> int64_t {
    if ((p + 1) % 2) return -1;
    const int64_t s = p / 2, page = ctable[static_cast<size_t>(req)][static_cast<size_t>(s / S)];
    return page > 0 ? page * S + s % S : -1;
  };

  // Single-rank run: decode B then A, unsplit, policy tail.
  std::vector<float> ring_ref = fresh_ring();
  std::vector<uint8_t> cache_ref_b;
  CacheView cache_ref = cache_view(cache_ref_b);
  std::vector<int64_t> pos_ref = {20};
  for (int64_t p = 3; p <= 15; ++p) pos_ref.push_back(p);
  std::vector<float> kv_ref(14 * kRingRowFloats);
  std::vector<int32_t> t2r_ref(14, 1), qsl_ref = {0, 1, 14};
  t2r_ref[0] = 0;
  std::vector<int64_t> rs_ref(14), cs_ref(14);
  for (int t = 0; t < 14; ++t) {
    const int req = t == 0 ? 0 : 1;
    kv_row(kv_ref.data() + t * kRingRowFloats, req, pos_ref[static_cast<size_t>(t)]);
    rs_ref[static_cast<size_t>(t)] = ring_block[static_cast<size_t>(req)] * cap + pos_ref[static_cast<size_t>(t)] % cap;
    cs_ref[static_cast<size_t>(t)] = cslot(req, pos_ref[static_cast<size_t>(t)]);
  }
  std::vector<uint16_t> lat_ref(14 * 512, kBf16NaN);
  {
    CompressArgs c;
    c.kv_score = TensorView::contiguous(kv_ref.data(), DType::F32, {14, 1024});
    c.positions = TensorView::contiguous(pos_ref.data(), DType::I64, {14});
    c.slot_mapping = TensorView::contiguous(rs_ref.data(), DType::I64, {14});
    c.norm_weight = TensorView::contiguous(w.data(), DType::BF16, {512});
    c.eps = 1e-6f;
    c.latent_out = TensorView::contiguous(lat_ref.data(), DType::BF16, {14, 512});
    c.ring = TensorView::contiguous(ring_ref.data(), DType::F32, {blocks, cap, 1024});
    c.qsl = TensorView::contiguous(qsl_ref.data(), DType::I32, {3});
    c.token_to_req = TensorView::contiguous(t2r_ref.data(), DType::I32, {14});
    compress(c);
    InsertArgs ins;
    ins.latent = c.latent_out;
    ins.positions = c.positions;
    ins.rope_table = TensorView::contiguous(rope.data(), DType::F32, {32, 64});
    ins.slots = TensorView::contiguous(cs_ref.data(), DType::I64, {14});
    ins.cache = cache_ref;
    insert(ins);
  }

  // Gathered compressed slots (identical on both ranks).
  std::vector<int64_t> gcs(static_cast<size_t>(GP), -1);
  for (int64_t r = 0; r < GP; ++r)
    if (plan.gathered_kv_write[static_cast<size_t>(r)])
      gcs[static_cast<size_t>(r)] = cslot(plan.gathered_req[static_cast<size_t>(r)], plan.gathered_positions[static_cast<size_t>(r)]);

  struct Rank {
    std::vector<float> ring, kv;
    std::vector<uint8_t> cache_b;
    CacheView cache;
    std::vector<uint16_t> lat, glat;
    std::vector<int64_t> pos, gpos, rs;
    std::vector<int32_t> qsl, t2r;
    LayerStepResult res;
  };
  std::vector<Rank> R(2);
  for (int k = 0; k < 2; ++k) {
    Rank& x = R[static_cast<size_t>(k)];
    const RankBatch& rb = plan.ranks[static_cast<size_t>(k)];
    x.ring = fresh_ring();
    x.cache = cache_view(x.cache_b);
    x.pos = rb.positions;
    x.gpos = plan.gathered_positions;
    x.qsl = rb.qsl;
    x.t2r.assign(static_cast<size_t>(padded), 0);
    x.rs.assign(static_cast<size_t>(padded), -1);
    x.kv.assign(static_cast<size_t>(padded * kRingRowFloats), 0.0f);
    for (int64_t j = 0; j < rb.num_reqs(); ++j)
      for (int32_t t = rb.qsl[static_cast<size_t>(j)]; t < rb.qsl[static_cast<size_t>(j + 1)]; ++t) {
        const int req = rb.local_to_global_req[static_cast<size_t>(j)];
        x.t2r[static_cast<size_t>(t)] = static_cast<int32_t>(j);
        x.rs[static_cast<size_t>(t)] = ring_block[static_cast<size_t>(req)] * cap + x.pos[static_cast<size_t>(t)] % cap;
        kv_row(x.kv.data() + t * kRingRowFloats, req, x.pos[static_cast<size_t>(t)]);
      }
    x.lat.assign(static_cast<size_t>(padded * 512), kBf16NaN);
    x.glat.assign(static_cast<size_t>(GP * 512), kBf16NaN);
  }
  ThreadGroup group(2);
  group.run([&](Communicator& c) {
    Rank& x = R[static_cast<size_t>(c.rank())];
    LayerStepArgs a;
    a.ratio = 2;
    a.cap = cap;
    a.max_num_seqs = 8;
    a.eps = 1e-6f;
    a.kv_score = TensorView::contiguous(x.kv.data(), DType::F32, {padded, 1024});
    a.positions = TensorView::contiguous(x.pos.data(), DType::I64, {padded});
    a.qsl = TensorView::contiguous(x.qsl.data(), DType::I32, {static_cast<int64_t>(x.qsl.size())});
    a.token_to_req = TensorView::contiguous(x.t2r.data(), DType::I32, {padded});
    a.ring_slots = TensorView::contiguous(x.rs.data(), DType::I64, {padded});
    a.ring = TensorView::contiguous(x.ring.data(), DType::F32, {blocks, cap, 1024});
    a.norm_weight = TensorView::contiguous(w.data(), DType::BF16, {512});
    a.gathered_positions = TensorView::contiguous(x.gpos.data(), DType::I64, {GP});
    a.gathered_cslots = TensorView::contiguous(gcs.data(), DType::I64, {GP});
    a.rope_table = TensorView::contiguous(rope.data(), DType::F32, {32, 64});
    a.caches = {x.cache};
    a.latent = TensorView::contiguous(x.lat.data(), DType::BF16, {padded, 512});
    a.gathered_latent = TensorView::contiguous(x.glat.data(), DType::BF16, {GP, 512});
    x.res = pcp_layer_step(a, c);
  });

  // Which local rows got a latent, and that they equal the single-rank latent.
  const std::vector<std::vector<int64_t>> closing = {{3, 5, 15}, {7, 9, 11, 13}};
  for (int k = 0; k < 2; ++k) {
    const Rank& x = R[static_cast<size_t>(k)];
    for (int64_t t = 0; t < padded; ++t) {
      const int64_t p = x.pos[static_cast<size_t>(t)];
      const bool is_a = t > 0 && t < plan.ranks[static_cast<size_t>(k)].num_tokens;
      const bool want = is_a && std::find(closing[static_cast<size_t>(k)].begin(), closing[static_cast<size_t>(k)].end(), p) !=
                                    closing[static_cast<size_t>(k)].end();
      const bool written = x.lat[static_cast<size_t>(t * 512)] != kBf16NaN || x.lat[static_cast<size_t>(t * 512 + 1)] != kBf16NaN;
      EXPECT_EQ(written, want) << "rank " << k << " local row " << t << " position " << p;
      if (want) {
        EXPECT_EQ(std::memcmp(x.lat.data() + t * 512, lat_ref.data() + (p - 2) * 512, 1024), 0)
            << "rank " << k << " position " << p;
      }
    }
  }
  // Rings: identical, and equal to the initial ring except row 76 = B's kv_score row.
  std::vector<float> want_ring = fresh_ring();
  kv_row(want_ring.data() + 76 * kRingRowFloats, 0, 20);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(std::memcmp(R[static_cast<size_t>(k)].ring.data(), want_ring.data(), want_ring.size() * 4), 0) << "rank " << k;
    EXPECT_EQ(R[static_cast<size_t>(k)].cache_b, cache_ref_b) << "rank " << k;
  }
  // The newest open row of B equals the tail-policy ring's row.
  EXPECT_EQ(std::memcmp(ring_ref.data() + 76 * kRingRowFloats, want_ring.data() + 76 * kRingRowFloats, 4096), 0);
  // Communication of this layer, counted as SPEC 7.7 states.
  const CommVolume ev = expected_comm_volume(2, 9, 9, 2);
  EXPECT_EQ(R[0].res.volume.keys_received, 2u * 9 * 8);
  EXPECT_EQ(R[0].res.volume.rows_received, 2u * 9 * 4096);
  EXPECT_EQ(R[0].res.volume.latents_received, 2u * 9 * 1024);
  EXPECT_EQ(R[0].res.volume.replaced_received, 2u * 9 * 4096);
  EXPECT_EQ(R[0].res.volume.keys_received, ev.keys_received);
  EXPECT_EQ(group.comm(1).counters().bytes_received,
            ev.keys_received + ev.rows_received + ev.latents_received);
  EXPECT_EQ(group.comm(1).counters().bytes_sent, ev.keys_sent + ev.rows_sent + ev.latents_sent);
}

TEST(PcpLink, ReplicatedDecodeTiesWriteFromTheLargestAndLookupTheSmallest) {
  // Three ranks, each holding the same decode (block 3, position 10) as its only request.
  const std::vector<int64_t> slots = {3 * 8 + 2}, pos = {10};
  const std::vector<int32_t> qsl = {0, 1};
  const LinkInput in = input(slots, qsl, pos, 8, 1);
  const LinkLocal l = link_local_keys(in);
  ASSERT_EQ(l.num_rows, 1);
  const std::vector<int64_t> all(3, l.local_keys[0]);
  const LinkResult r = link_resolve(in, l, all, 3);
  EXPECT_EQ(r.ring_write_slots, (std::vector<int64_t>{-1, -1, 26}));
  const LinkResult rev = seam::link_resolve_reversed_ties(in, l, all, 3);
  EXPECT_EQ(rev.ring_write_slots, (std::vector<int64_t>{26, -1, -1}));
  // A chunk starting at position 11 of the same block finds the smallest copy (gathered 0)...
  const std::vector<int64_t> slots2 = {3 * 8 + 3}, pos2 = {11};
  const LinkInput in2 = input(slots2, qsl, pos2, 8, 1);
  const LinkResult r2 = link_resolve(in2, link_local_keys(in2), all, 3);
  EXPECT_EQ(r2.prev_row_indices, (std::vector<int64_t>{0}));
  // ...and the reversed tie-break the largest.
  const LinkResult r3 = seam::link_resolve_reversed_ties(in2, link_local_keys(in2), all, 3);
  EXPECT_EQ(r3.prev_row_indices, (std::vector<int64_t>{2}));
}

TEST(PcpLink, KeysOfNullBlocksAndEmptyRequestsNeverMatchOrWrite) {
  EXPECT_EQ(link_key(-1, 4, 8), -1);
  EXPECT_EQ(link_key(16, -1, 8), -1);
  EXPECT_EQ(link_key(17, 6, 8), (int64_t{2} << 32) | 6);
  // Request 0: null block at even position 4; request 1 empty; request 2 odd start 5 in block 2
  // whose predecessor (2, 4) is absent -> ring.
  const std::vector<int64_t> slots = {-1, 21, 22, -1}, pos = {4, 5, 6, 0};
  const std::vector<int32_t> qsl = {0, 1, 1, 3};
  const LinkInput in = input(slots, qsl, pos, 8, 4);
  const LinkLocal l = link_local_keys(in);
  EXPECT_EQ(l.num_rows, 4);
  EXPECT_EQ(l.local_keys, (std::vector<int64_t>{-1, -1, (int64_t{2} << 32) | 6, -1}));
  const LinkResult r = link_resolve(in, l, l.local_keys, 1);
  EXPECT_EQ(r.ring_write_slots, (std::vector<int64_t>{-1, -1, 22, -1}));
  EXPECT_EQ(r.prev_row_indices, (std::vector<int64_t>{-1, -1, -1}));
  // -1 keys sort first.
  EXPECT_EQ(r.sorted_keys.back(), (int64_t{2} << 32) | 6);
  EXPECT_EQ(r.sorted_keys.front(), -1);
}

TEST(PcpLink, OverflowIsE10AndBadInputsE8) {
  // N = 4, max_num_seqs = 1 -> num_rows = 2; request 2 is non-empty.
  const std::vector<int64_t> slots = {8, 9, 10, -1}, pos = {0, 1, 2, 0};
  EXPECT_EQ(code_of([&] { link_local_keys(input(slots, {0, 1, 2, 3}, pos, 8, 1)); }), ErrorCode::kPcpOverflow);
  // Empty requests beyond num_rows are fine.
  EXPECT_EQ(link_local_keys(input(slots, {0, 1, 3, 3, 3}, pos, 8, 1)).R, 2);
  EXPECT_EQ(code_of([&] { link_local_keys(input(slots, {0, 3, 2}, pos)); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { link_local_keys(input(slots, {0, 5}, pos)); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { link_local_keys(input(slots, {1, 2}, pos)); }), ErrorCode::kInvalidArgument);
  const std::vector<int32_t> qsl_ok = {0, 4};
  const LinkInput ok = input(slots, qsl_ok, pos);
  EXPECT_EQ(code_of([&] { link_resolve(ok, link_local_keys(ok), std::vector<int64_t>(3, -1), 2); }),
            ErrorCode::kInvalidArgument);
}

TEST(PcpAccounting, Spec77Formulas) {
  const CommVolume v = expected_comm_volume(4, 100, 16, 2);
  EXPECT_EQ(v.keys_received, 4u * 16 * 8);
  EXPECT_EQ(v.positions_received, 4u * 100 * 8);
  EXPECT_EQ(v.rows_received, 4u * 16 * 4096);
  EXPECT_EQ(v.latents_received, 4u * 100 * 1024);
  EXPECT_EQ(v.replaced_received, 4u * 100 * 4096);
  EXPECT_EQ(v.keys_sent, 16u * 8);
  EXPECT_EQ(v.rows_sent, 16u * 4096);
  EXPECT_EQ(v.sent(), 16u * 8 + 100u * 8 + 16u * 4096 + 100u * 1024);
  const CommVolume r1 = expected_comm_volume(4, 100, 16, 1);
  EXPECT_EQ(r1.keys_received + r1.rows_received + r1.replaced_received, 0u);
  EXPECT_EQ(r1.latents_received, 4u * 100 * 1024);
  EXPECT_EQ(code_of([] { expected_comm_volume(2, 1, 1, 3); }), ErrorCode::kInvalidArgument);
}
