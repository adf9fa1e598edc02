// PCP variant of the compressor (ring policy kOpenRow, SPEC 7.5) and save_ring_rows: the SPEC
// 10.5 worked example (P = 2, cap = 8) against the single-rank tail-policy run, plus the
// prev_row_indices edge cases (out of range -> ring, shorter than num_reqs -> ring).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "formats/compress_math.hpp"
#include "dsv41kv/compressor.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

constexpr int64_t kCap = 8, kBlocks = 10, kBlockStride = 8 * 1024 + 16;
enum Req { kB = 0, kA = 1 };

// kv_score row of (request, position): a deterministic function, as in SPEC 10.6.
std::vector<float> row_of(int req, int64_t pos) {
  Rng rng(static_cast<uint64_t>(req) * 100003 + static_cast<uint64_t>(pos));
  return random_f32(1024, rng);
}

struct Step {
  std::vector<int> reqs;  // per token: request (kA/kB), -1 = padding
  std::vector<int64_t> positions, ring_slots;
  std::vector<int32_t> qsl, t2r;
  std::vector<float> kv;
  CanaryBuffer<uint16_t> latent;
  std::vector<uint16_t> norm_w;

  int64_t N() const { return static_cast<int64_t>(positions.size()); }
  void build(const std::vector<uint16_t>& w) {
    norm_w = w;
    kv.assign(static_cast<size_t>(N() * 1024), 0.0f);
    for (int64_t t = 0; t < N(); ++t)
      if (reqs[static_cast<size_t>(t)] >= 0) {
        const auto r = row_of(reqs[static_cast<size_t>(t)], positions[static_cast<size_t>(t)]);
        std::copy(r.begin(), r.end(), kv.begin() + t * 1024);
      }
    latent = CanaryBuffer<uint16_t>(static_cast<size_t>(N() * 512), kBf16NaN);
  }
  CompressArgs args(std::vector<float>& ring) {
    CompressArgs a;
    a.ratio = 2;
    a.kv_score = TensorView::contiguous(kv.data(), DType::F32, {N(), 1024});
    a.positions = view_of(positions);
    a.slot_mapping = view_of(ring_slots);
    a.norm_weight = view_of(norm_w);
    a.eps = 1e-6f;
    a.latent_out = latent.view({N(), 512});
    a.ring = TensorView::strided(ring.data(), DType::F32, {kBlocks, kCap, 1024},
                                 {kBlockStride, 1024, 1});
    a.qsl = view_of(qsl);
    a.token_to_req = view_of(t2r);
    return a;
  }
  // latent of (req, pos) -> bits
  std::map<std::pair<int, int64_t>, std::vector<uint16_t>> written() const {
    std::map<std::pair<int, int64_t>, std::vector<uint16_t>> m;
    for (int64_t t = 0; t < N(); ++t) {
      const uint16_t* l = latent.data() + t * 512;
      if (l[0] == kBf16NaN && l[1] == kBf16NaN) continue;
      m[{reqs[static_cast<size_t>(t)], positions[static_cast<size_t>(t)]}] =
          std::vector<uint16_t>(l, l + 512);
    }
    return m;
  }
};

float* ring_row(std::vector<float>& ring, int64_t slot) {
  return ring.data() + (slot / kCap) * kBlockStride + (slot % kCap) * 1024;
}

std::vector<float> initial_ring() {
  Rng rng(4242);
  std::vector<float> ring = random_f32(static_cast<size_t>(kBlocks * kBlockStride), rng);
  auto a2 = row_of(kA, 2);  // A's open row of the previous step
  std::copy(a2.begin(), a2.end(), ring_row(ring, 5 * 8 + 2));
  auto b19 = row_of(kB, 19);
  std::copy(b19.begin(), b19.end(), ring_row(ring, 9 * 8 + 3));
  return ring;
}

struct Worked {
  Step single, rank[2];
  std::vector<float> prev_rows;  // [18, 1024]
  std::vector<int64_t> prev_idx[2];
  std::vector<int64_t> write_slots;
};

Worked worked_example() {
  Rng rng(99);
  const auto w = random_bf16(512, rng, 0.3, 1.0);
  Worked x;
  // single rank, unsplit batch: B(20), A(3..15)
  Step& s = x.single;
  s.reqs = {kB};
  s.positions = {20};
  s.ring_slots = {76};
  s.t2r = {0};
  for (int64_t p = 3; p <= 15; ++p) {
    s.reqs.push_back(kA);
    s.positions.push_back(p);
    s.ring_slots.push_back(5 * 8 + p % 8);
    s.t2r.push_back(1);
  }
  s.qsl = {0, 1, 14};
  s.build(w);
  // rank 0: B(20), A.c0(3..6), A.c3(15), padded to 9
  Step& r0 = x.rank[0];
  r0.reqs = {kB, kA, kA, kA, kA, kA, -1, -1, -1};
  r0.positions = {20, 3, 4, 5, 6, 15, 0, 0, 0};
  r0.ring_slots = {76, 43, 44, 45, 46, 47, -1, -1, -1};
  r0.qsl = {0, 1, 5, 6};
  r0.t2r = {0, 1, 1, 1, 1, 2, 0, 0, 0};
  r0.build(w);
  Step& r1 = x.rank[1];
  r1.reqs = {kB, kA, kA, kA, kA, kA, kA, kA, kA};
  r1.positions = {20, 7, 8, 9, 10, 11, 12, 13, 14};
  r1.ring_slots = {76, 47, 40, 41, 42, 43, 44, 45, 46};
  r1.qsl = {0, 1, 5, 9};
  r1.t2r = {0, 1, 1, 1, 1, 2, 2, 2, 2};
  r1.build(w);
  // the link's outputs (SPEC 10.5), written by hand
  const int64_t num_rows = 9;
  const std::vector<int64_t> gather_tokens[2] = {{0, 4, 5, 0, 0, 0, 0, 0, 0},
                                                 {0, 4, 8, 0, 0, 0, 0, 0, 0}};
  x.prev_rows.assign(static_cast<size_t>(2 * num_rows * 1024), 0.0f);
  for (int k = 0; k < 2; ++k)
    for (int64_t j = 0; j < num_rows; ++j)
      std::copy(x.rank[k].kv.begin() + gather_tokens[k][static_cast<size_t>(j)] * 1024,
                x.rank[k].kv.begin() + (gather_tokens[k][static_cast<size_t>(j)] + 1) * 1024,
                x.prev_rows.begin() + (k * num_rows + j) * 1024);
  x.prev_idx[0] = {-1, -1, 11};
  x.prev_idx[1] = {-1, 1, 10};
  x.write_slots.assign(18, -1);
  x.write_slots[9] = 76;
  return x;
}

TEST(Pcp, WorkedExample_10_5) {
  Worked x = worked_example();
  // single-rank tail-policy reference
  std::vector<float> tail_ring = initial_ring();
  compress(x.single.args(tail_ring));
  const auto ref = x.single.written();
  ASSERT_EQ(ref.size(), 7u);  // A's closing positions 3, 5, ..., 15

  std::vector<float> rings[2] = {initial_ring(), initial_ring()};
  const std::vector<float> ring0 = initial_ring();
  std::map<std::pair<int, int64_t>, std::vector<uint16_t>> all;
  for (int k = 0; k < 2; ++k) {
    CompressArgs a = x.rank[k].args(rings[k]);
    a.policy = RingPolicy::kOpenRow;
    a.prev_rows = view_of(x.prev_rows, {18, 1024});
    a.prev_row_indices = view_of(x.prev_idx[k]);
    compress(a);
    EXPECT_TRUE(bits_equal(ring0, rings[k], "ring after the PCP compress (no tail store)"));
    for (auto& [key, v] : x.rank[k].written()) {
      EXPECT_EQ(all.count(key), 0u) << "position " << key.second << " written twice";
      all[key] = v;
    }
    SaveRingRowsArgs s;
    s.prev_rows = view_of(x.prev_rows, {18, 1024});
    s.ring_write_slots = view_of(x.write_slots);
    s.ring = a.ring;
    save_ring_rows(s);
  }
  // every closing position of A exactly once, bit-identical to the single-rank run
  ASSERT_EQ(all.size(), ref.size());
  for (auto& [key, v] : ref) {
    ASSERT_EQ(all.count(key), 1u) << "position " << key.second << " missing";
    EXPECT_TRUE(bits_equal(v, all[key], "latent of position " + std::to_string(key.second)));
  }
  // rings: identical across ranks; only row 76 changed, to B's row at 20
  EXPECT_TRUE(bits_equal(rings[0], rings[1], "rank rings"));
  std::vector<float> exp = ring0;
  const auto b20 = row_of(kB, 20);
  std::copy(b20.begin(), b20.end(), ring_row(exp, 76));
  EXPECT_TRUE(bits_equal(exp, rings[0], "ring after save_ring_rows"));
  // and equal to the tail-policy ring on the open row
  EXPECT_TRUE(bytes_equal(ring_row(tail_ring, 76), ring_row(rings[0], 76), 4096, "open row 76"));
}

// Mutation check: dropping the gathered predecessors changes the latents of 7, 11 and 15.
TEST(Pcp, DroppingPrevRowsBreaksTheInvariant) {
  Worked x = worked_example();
  std::vector<float> tail_ring = initial_ring();
  compress(x.single.args(tail_ring));
  const auto ref = x.single.written();
  int mismatched = 0;
  for (int k = 0; k < 2; ++k) {
    std::vector<float> ring = initial_ring();
    CompressArgs a = x.rank[k].args(ring);
    a.policy = RingPolicy::kOpenRow;
    std::vector<int64_t> none = {-1, -1, -1};
    a.prev_rows = view_of(x.prev_rows, {18, 1024});
    a.prev_row_indices = view_of(none);
    compress(a);
    for (auto& [key, v] : x.rank[k].written())
      if (v != ref.at(key)) ++mismatched;
  }
  EXPECT_EQ(mismatched, 3);
}

// prev_row_indices out of [0, G) and requests j >= R read the ring row (p-1) % cap; the pooling
// order stays (predecessor, current).
TEST(Pcp, IndexEdgeCasesFallBackToRing) {
  Rng rng(5);
  const auto w = random_bf16(512, rng, 0.3, 1.0);
  Step s;
  // four one-token requests at odd positions, ring blocks 1..4
  s.reqs = {0, 1, 2, 3};
  s.positions = {5, 9, 13, 17};
  s.ring_slots = {1 * 8 + 5, 2 * 8 + 1, 3 * 8 + 5, 4 * 8 + 1};
  s.qsl = {0, 1, 2, 3, 4};
  s.t2r = {0, 1, 2, 3};
  s.build(w);
  std::vector<float> prev = random_f32(3 * 1040, rng);  // G = 3, row stride 1040
  std::vector<int64_t> idx = {2, 3, -7};              // R = 3 < num_reqs: request 3 -> ring
  std::vector<float> ring = initial_ring();
  const std::vector<float> ring0 = ring;
  CompressArgs a = s.args(ring);
  a.policy = RingPolicy::kOpenRow;
  a.prev_rows = TensorView::strided(prev.data(), DType::F32, {3, 1024}, {1040, 1});
  a.prev_row_indices = view_of(idx);
  compress(a);
  EXPECT_TRUE(bits_equal(ring0, ring, "ring untouched"));
  std::vector<float> scratch(512);
  std::vector<uint16_t> e(512);
  for (int64_t j = 0; j < 4; ++j) {
    const int64_t slot = s.ring_slots[static_cast<size_t>(j)], p = s.positions[static_cast<size_t>(j)];
    const float* pred = j == 0 ? prev.data() + 2 * 1040
                               : ring0.data() + (slot / 8) * kBlockStride + ((p - 1) % 8) * 1024;
    cmath::compress_row(pred, s.kv.data() + j * 1024, w.data(), 1e-6f, scratch.data(), e.data());
    EXPECT_TRUE(bytes_equal(e.data(), s.latent.data() + j * 512, 1024, "request " + std::to_string(j)));
  }
}

// save_ring_rows: only slots >= 0 are copied, prev_rows with a padded row stride.
TEST(Pcp, SaveRingRows) {
  Rng rng(6);
  std::vector<float> prev = random_f32(5 * 1056, rng);
  std::vector<int64_t> slots = {-1, 3 * 8 + 7, -1, 0, 9 * 8 + 1};
  std::vector<float> ring = initial_ring();
  std::vector<float> exp = ring;
  for (size_t g = 0; g < slots.size(); ++g)
    if (slots[g] >= 0)
      std::copy(prev.begin() + static_cast<int64_t>(g) * 1056,
                prev.begin() + static_cast<int64_t>(g) * 1056 + 1024, ring_row(exp, slots[g]));
  SaveRingRowsArgs s;
  s.prev_rows = TensorView::strided(prev.data(), DType::F32, {5, 1024}, {1056, 1});
  s.ring_write_slots = view_of(slots);
  s.ring = TensorView::strided(ring.data(), DType::F32, {kBlocks, kCap, 1024}, {kBlockStride, 1024, 1});
  save_ring_rows(s);
  EXPECT_TRUE(bits_equal(exp, ring, "ring"));
}

}  // namespace
}  // namespace dsv41kv::test
