// SPEC 10.1.1 reproduction (fused save + compress + insert, CPU): ring, latents and the whole
// 584 cache backing against expectations written independently of the kernels' program
// decomposition; compress_insert equivalence; thread-count invariance; SPEC 4.3 exceptions.
#include <gtest/gtest.h>

#include <string>

#include "support/batch.hpp"
#include "support/compare.hpp"

namespace dsv41kv::test {
namespace {

struct LengthCase {
  const char* name;
  std::vector<int> lengths;
};

const std::vector<LengthCase> kCases = {
    {"prefill", {1, 5, 13}}, {"decode", {1, 1, 1}},         {"empty", {1, 2, 0}},
    {"wrap", {7, 8, 8}},     {"packed_boundary", {2, 3, 3}},
};

BatchSpec spec_10_1_1(int ratio, const std::vector<int>& lengths) {
  BatchSpec s;
  s.ratio = ratio;
  s.lengths = lengths;
  s.starts = {7, 8, 13};
  return s;
}

// Expected 584 backing: canary + rec::write_v4_584 of every closing real token with a cache slot.
std::vector<uint8_t> expected_cache(Batch& b, const std::vector<std::vector<uint16_t>>& lat) {
  std::vector<uint8_t> exp(b.cache_u8.size(), kByteCanary);
  for (int64_t t = 0; t < b.A; ++t) {
    const int64_t slot = b.cache_slots[static_cast<size_t>(t)];
    if (slot < 0 || !b.emits(t)) continue;
    const int64_t p = b.positions[static_cast<size_t>(t)];
    write_expected(exp.data(), b.spec.format, b.S, b.page_stride, 512, 0.5f, slot,
                   lat[static_cast<size_t>(t)].data(), b.table.data(), (p / b.ratio) * b.ratio);
  }
  return exp;
}

void check_step(Batch& b, const std::string& what) {
  // Ring: bit-exact (ratio 1: untouched).
  EXPECT_TRUE(bits_equal(b.expected_ring(), b.ring.vec(), what + " ring backing"));
  // Latents.
  std::vector<std::vector<uint16_t>> lat(static_cast<size_t>(b.N));
  for (int64_t t = 0; t < b.rows; ++t) {
    const uint16_t* got = b.latent.data() + t * 512;
    if (t < b.N && b.emits(t)) {
      lat[static_cast<size_t>(t)] = b.expected_latent(t);
      ASSERT_TRUE(bytes_equal(lat[static_cast<size_t>(t)].data(), got, 1024,
                              what + " latent row " + std::to_string(t) + " vs cmath::compress_row"));
      const auto ref = b.reference_latent(t);
      ASSERT_TRUE(bf16_close(got, ref.data(), 512, 0.004, 1e-6,
                             what + " latent row " + std::to_string(t) + " vs double reference"));
    } else {
      std::vector<uint16_t> nan(512, kBf16NaN);
      ASSERT_TRUE(bytes_equal(nan.data(), got, 1024,
                              what + " untouched latent row " + std::to_string(t)));
    }
  }
  // Cache: whole backing.
  const auto exp = expected_cache(b, lat);
  EXPECT_TRUE(bytes_equal(exp.data(), b.cache_u8.data(), exp.size(), what + " cache backing"));
  // RoPE bf16 values vs an unfused double reference, NoPE scale byte 7 = 0.
  for (int64_t t = 0; t < b.A; ++t) {
    const int64_t slot = b.cache_slots[static_cast<size_t>(t)];
    if (slot < 0 || !b.emits(t)) continue;
    const int64_t p = b.positions[static_cast<size_t>(t)], row = (p / b.ratio) * b.ratio;
    const uint8_t* page = b.cache_u8.data() + (slot / b.S) * b.page_stride;
    const uint8_t* val = page + (slot % b.S) * 576;
    EXPECT_EQ(page[b.S * 576 + (slot % b.S) * 8 + 7], 0);
    std::vector<double> ref(64);
    std::vector<uint16_t> got(64);
    for (int i = 0; i < 32; ++i) {
      const double x0 = num::bf16_decode(lat[static_cast<size_t>(t)][448 + 2 * i]);
      const double x1 = num::bf16_decode(lat[static_cast<size_t>(t)][449 + 2 * i]);
      const double c = b.table[static_cast<size_t>(row * 64 + i)];
      const double s = b.table[static_cast<size_t>(row * 64 + 32 + i)];
      ref[2 * i] = x0 * c - x1 * s;
      ref[2 * i + 1] = x1 * c + x0 * s;
    }
    for (int i = 0; i < 64; ++i)
      got[i] = static_cast<uint16_t>(val[448 + 2 * i] | (val[449 + 2 * i] << 8));
    ASSERT_TRUE(bf16_close(got.data(), ref.data(), 64, 0.008, 1e-6, what + " RoPE values"));
  }
}

class Reproduction : public ::testing::TestWithParam<int> {};

TEST_P(Reproduction, CompressThenInsert) {
  const int ratio = GetParam();
  for (const auto& c : kCases) {
    Rng rng(1000 + ratio * 17 + c.lengths[2]);
    for (int iter = 0; iter < 3; ++iter) {
      SCOPED_TRACE(std::string(c.name) + " iteration " + std::to_string(iter));
      Batch b = Batch::make(spec_10_1_1(ratio, c.lengths), rng);
      compress(b.compress_args());
      insert(b.insert_args());
      check_step(b, c.name);
    }
  }
}

TEST_P(Reproduction, CompressInsertEqualsSeparateOps) {
  const int ratio = GetParam();
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    Rng rng(2000 + ratio);
    Batch b = Batch::make(spec_10_1_1(ratio, c.lengths), rng);
    Batch with = b, without = b;
    compress(b.compress_args());
    insert(b.insert_args());
    compress_insert(with.compress_insert_args(true));
    compress_insert(without.compress_insert_args(false));
    EXPECT_TRUE(bits_equal(b.ring.vec(), with.ring.vec(), "ring (latent_out given)"));
    EXPECT_TRUE(bits_equal(b.latent.vec(), with.latent.vec(), "latents"));
    EXPECT_TRUE(bits_equal(b.cache_u8.vec(), with.cache_u8.vec(), "cache (latent_out given)"));
    EXPECT_TRUE(bits_equal(b.ring.vec(), without.ring.vec(), "ring (no latent_out)"));
    EXPECT_TRUE(without.latent.untouched());
    EXPECT_TRUE(bits_equal(b.cache_u8.vec(), without.cache_u8.vec(), "cache (no latent_out)"));
  }
}

INSTANTIATE_TEST_SUITE_P(Ratio, Reproduction, ::testing::Values(1, 2),
                         [](const auto& info) { return "r" + std::to_string(info.param); });

// SPEC 4.5 example: a chunk at positions 13..25 reads ring row 4 before its tail store writes
// position 20 into row 4.
TEST(Compress, ReadBeforeWriteOfOwnRingRow) {
  Rng rng(7);
  BatchSpec s = spec_10_1_1(2, {13});
  s.starts = {13};
  Batch b = Batch::make(s, rng);
  compress(b.compress_args());
  const int64_t blk = b.req_block[0];
  std::vector<float> scratch(512);
  std::vector<uint16_t> exp(512);
  cmath::compress_row(b.ring_in_row(blk, 4), b.kv_row(0), b.norm_w.data(), s.eps, scratch.data(),
                      exp.data());
  EXPECT_TRUE(bytes_equal(exp.data(), b.latent.data(), 1024, "latent of position 13"));
  // position 20 is token 7; ring row 4 now holds it
  EXPECT_TRUE(bytes_equal(b.kv_row(7), b.ring.data() + blk * 8208 + 4 * 1024, 4096, "ring row 4"));
  insert(b.insert_args());
  check_step(b, "13..25");
}

// SPEC 4.3 exception: a chunk whose first token has slot < 0 gets no request program (no
// latent for the first token, no tail store), but its pair programs still run.
TEST(Compress, FirstTokenWithoutSlotSkipsRequestProgramOnly) {
  Rng rng(8);
  BatchSpec s = spec_10_1_1(2, {6, 5});
  s.starts = {3, 10};
  Batch b = Batch::make(s, rng);
  b.ring_slots[0] = -1;  // request 0: first token (position 3, closing) invalid
  b.ring_slots[7] = -1;  // request 1: position 11 (pair program) invalid
  compress(b.compress_args());
  // request 0: no latent at t=0 (pos 3), latents at pos 5, 7 (t = 2, 4); ring untouched for it
  std::vector<uint16_t> nan(512, kBf16NaN);
  EXPECT_TRUE(bytes_equal(nan.data(), b.latent.data(), 1024, "t=0"));
  for (int64_t t : {2, 4}) {
    const auto e = b.expected_latent(t);
    EXPECT_TRUE(bytes_equal(e.data(), b.latent.data() + t * 512, 1024, "t=" + std::to_string(t)));
  }
  EXPECT_TRUE(bytes_equal(nan.data(), b.latent.data() + 7 * 512, 1024, "t=7 (slot -1)"));
  std::vector<float> exp = b.ring_in;
  for (int64_t t = 6; t < 11; ++t) {
    const int64_t slot = b.ring_slots[static_cast<size_t>(t)];
    if (slot < 0) continue;
    std::copy(b.kv_row(t), b.kv_row(t) + 1024, exp.begin() + (slot / 8) * 8208 + (slot % 8) * 1024);
  }
  EXPECT_TRUE(bits_equal(exp, b.ring.vec(), "ring"));
}

// Padding rows (t >= qsl[num_reqs]) with slot -1 and kv rows beyond N are never read or written;
// N == 0 writes nothing.
TEST(Compress, EmptyBatchWritesNothing) {
  Rng rng(9);
  Batch b = Batch::make(spec_10_1_1(2, {0, 0, 0}), rng);
  b.ring_slots.clear();
  b.cache_slots.clear();
  b.t2r.clear();
  b.positions.assign(1, 0);
  b.N = 0;
  CompressArgs a = b.compress_args();
  a.slot_mapping = TensorView::contiguous(b.ring_slots.data(), DType::I64, {0});
  a.token_to_req = TensorView::contiguous(b.t2r.data(), DType::I32, {0});
  compress(a);
  EXPECT_TRUE(bits_equal(b.ring_in, b.ring.vec(), "ring"));
  EXPECT_TRUE(b.latent.untouched());
}

// Results do not depend on the thread count (each row is computed by one thread in a fixed
// order).
TEST(Compress, ThreadCountInvariance) {
  for (int ratio : {1, 2}) {
    Rng rng(77 + ratio);
    BatchSpec s;
    s.ratio = ratio;
    for (int j = 0; j < 24; ++j) {
      s.lengths.push_back(static_cast<int>(rng.integer(0, 40)));
      s.starts.push_back(rng.integer(0, 200));
    }
    s.ring_blocks = 24;
    s.ring_block_stride = 8 * 1024 + 16;
    s.table_rows = 256;
    s.num_pages = 24;
    s.states_per_page = 256;
    s.pad_rows = 5;
    Batch base = Batch::make(s, rng);
    for (int64_t t = 0; t < base.A; ++t)  // unique cache slots: page = request
      base.cache_slots[static_cast<size_t>(t)] =
          base.t2r[static_cast<size_t>(t)] * base.S + base.positions[static_cast<size_t>(t)] / ratio;
    Batch ref = base;
    compress_insert(ref.compress_insert_args(true), ExecContext{nullptr, 1});
    for (int threads : {2, 3, 7, 0}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " threads " + std::to_string(threads));
      Batch b = base;
      compress_insert(b.compress_insert_args(true), ExecContext{nullptr, threads});
      EXPECT_TRUE(bits_equal(ref.ring.vec(), b.ring.vec(), "ring"));
      EXPECT_TRUE(bits_equal(ref.latent.vec(), b.latent.vec(), "latent"));
      EXPECT_TRUE(bits_equal(ref.cache_u8.vec(), b.cache_u8.vec(), "cache"));
      Batch c = base;
      compress(c.compress_args(), ExecContext{nullptr, threads});
      insert(c.insert_args(), ExecContext{nullptr, threads});
      EXPECT_TRUE(bits_equal(ref.cache_u8.vec(), c.cache_u8.vec(), "cache (separate ops)"));
    }
    check_step(ref, "threads=1 batch");
  }
}

}  // namespace
}  // namespace dsv41kv::test
