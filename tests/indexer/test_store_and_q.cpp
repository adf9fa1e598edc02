// indexer_k_store (SPEC 8.1) and indexer_prepare_q (SPEC 8.2) against literal evaluations of the
// SPEC text written here, independently of the library's row code: the dot product in the
// documented order, the RMSNorm of SPEC 4.6 with 32 partials of 4 elements, the RoPE contraction
// of SPEC 1.4, and the binary64 encoders of tests/formats/reference.hpp. The K store writes into
// canary-filled caches with a non-default page stride, and the whole backing is compared: only the
// states of closing tokens with a slot change.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dsv41kv/indexer.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/rng.hpp"
#include "formats/reference.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

constexpr int D = kIndexHeadDim;

float f32(double x) { return static_cast<float>(x); }
float bf(uint16_t b) { return ref::from_bits(static_cast<uint32_t>(b) << 16); }
float bf_round(float x) { return bf(ref::bf16(x)); }

// SPEC 1.4's forward rotation of dims 64..127 of a 128-d vector at table row `trow`:
// y0 = fma(x0, c, -(x1 s)), y1 = fma(x1, c, x0 s), the products rounded to fp32.
void rope_literal(float* v, const float* trow) {
  for (int i = 0; i < 32; ++i) {
    const float x0 = v[64 + 2 * i], x1 = v[65 + 2 * i], c = trow[i], s = trow[32 + i];
    const float x1s = ref::mul(x1, s), x0s = ref::mul(x0, s);
    v[64 + 2 * i] = std::fma(x0, c, -x1s);
    v[65 + 2 * i] = std::fma(x1, c, x0s);
  }
}

// SPEC 8.1 literally, with the order docs/design.md documents for wk . latent: 16 partial sums over
// j % 16 (j ascending; an fp32 product, then an fp32 add), then acc[l] += acc[l + h] for h = 8, 4,
// 2, 1. Returns the key before quantization.
std::vector<float> key_literal(const uint16_t* latent, const std::vector<uint16_t>& wk, const std::vector<uint16_t>& kn,
                               float eps, const float* trow) {
  std::vector<float> k(D);
  for (int o = 0; o < D; ++o) {
    float acc[16] = {};
    for (int j = 0; j < 512; ++j) acc[j % 16] = f32(double{acc[j % 16]} + double{ref::mul(bf(latent[j]), bf(wk[static_cast<size_t>(o * 512 + j)]))});
    for (int h = 8; h >= 1; h >>= 1)
      for (int l = 0; l < h; ++l) acc[l] = f32(double{acc[l]} + double{acc[l + h]});
    k[static_cast<size_t>(o)] = bf_round(acc[0]);
  }
  float part[32] = {};
  for (int d = 0; d < D; ++d) part[d % 32] = std::fma(k[static_cast<size_t>(d)], k[static_cast<size_t>(d)], part[d % 32]);
  for (int h = 16; h >= 1; h >>= 1)
    for (int l = 0; l < h; ++l) part[l] = f32(double{part[l]} + double{part[l + h]});
  const float var = ref::mul(part[0], 1.0f / 128.0f);
  const float rs = f32(1.0 / double{f32(std::sqrt(double{f32(double{var} + double{eps})}))});
  for (int d = 0; d < D; ++d)
    k[static_cast<size_t>(d)] = bf_round(ref::mul(ref::mul(k[static_cast<size_t>(d)], rs), bf(kn[static_cast<size_t>(d)])));
  rope_literal(k.data(), trow);
  for (int d = 64; d < D; ++d) k[static_cast<size_t>(d)] = bf_round(k[static_cast<size_t>(d)]);
  return k;
}

// The record of `k` at state r of `page` (SPEC 3.5), from the reference encoders.
void record_literal(IndexKFormat f, uint8_t* page, int64_t S, int64_t r, const std::vector<float>& k) {
  if (f == IndexKFormat::FP8_132) {
    const uint8_t byte = ref::ue8m0_tile(k.data(), D, page + r * D);
    const float scale = byte == 255 ? INFINITY : static_cast<float>(std::ldexp(1.0, byte - 127));
    std::memcpy(page + S * D + r * 4, &scale, 4);
  } else {
    for (int b = 0; b < 4; ++b) page[S * 64 + r * 4 + b] = ref::mxfp4_block(k.data() + 32 * b, page + r * 64 + 16 * b);
  }
}

struct StoreCase {
  int ratio;
  IndexKFormat format;
};

TEST(IndexerKStore, RecordsEqualALiteralEvaluationAndNothingElseChanges) {
  for (const StoreCase c : {StoreCase{1, IndexKFormat::FP8_132}, StoreCase{2, IndexKFormat::FP8_132},
                            StoreCase{1, IndexKFormat::MXFP4_68}, StoreCase{2, IndexKFormat::MXFP4_68}}) {
    for (uint64_t seed : {5u, 6u}) {
      SCOPED_TRACE(std::string("ratio ") + std::to_string(c.ratio) + " " + index_k_format_name(c.format) + " seed " +
                   std::to_string(seed));
      Rng rng(seed * 100 + static_cast<uint64_t>(c.ratio) * 10 + static_cast<uint64_t>(c.format));
      const int64_t N = 23, S = 8, pages = 4, table_rows = 64;
      const int64_t stride = index_k_record_bytes(c.format) * S + 36;
      const auto latent = random_bf16(static_cast<size_t>((N + 2) * 512), rng, 1.0);
      const auto wk = random_bf16(static_cast<size_t>(D * 512), rng, 0.05);
      const auto kn = random_bf16(static_cast<size_t>(D), rng, 0.1, 1.0);
      const auto table = random_rope_table(table_rows, rng);
      std::vector<int64_t> pos(static_cast<size_t>(N + 3)), slots(static_cast<size_t>(N));
      for (int64_t t = 0; t < N; ++t) {
        pos[static_cast<size_t>(t)] = 20 + t;
        slots[static_cast<size_t>(t)] = (t * 5 + 3) % (pages * S);  // distinct, every token (non-closing skipped)
      }
      slots[4] = -1;
      slots[9] = -1;
      CanaryBuffer<uint8_t> cache(static_cast<size_t>(pages * stride), kByteCanary);
      IndexKStoreArgs a;
      a.ratio = c.ratio;
      a.latent = TensorView::contiguous(const_cast<uint16_t*>(latent.data()), DType::BF16, {N + 2, 512});
      a.positions = TensorView::contiguous(pos.data(), DType::I64, {N + 3});
      a.slots = TensorView::contiguous(slots.data(), DType::I64, {N});
      a.wk = TensorView::contiguous(const_cast<uint16_t*>(wk.data()), DType::BF16, {D, 512});
      a.k_norm = TensorView::contiguous(const_cast<uint16_t*>(kn.data()), DType::BF16, {D});
      a.eps = 1e-6f;
      a.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {table_rows, 64});
      a.cache = IndexKCacheView{cache.data(), c.format, pages, S, stride};
      indexer_k_store(a, ExecContext{nullptr, 3});

      std::vector<uint8_t> want(cache.size(), kByteCanary);
      int64_t written = 0;
      for (int64_t t = 0; t < N; ++t) {
        const int64_t p = pos[static_cast<size_t>(t)], sl = slots[static_cast<size_t>(t)];
        if (sl < 0 || (p + 1) % c.ratio != 0) continue;
        const auto k = key_literal(latent.data() + t * 512, wk, kn, a.eps, table.data() + (p / c.ratio) * c.ratio * 64);
        record_literal(c.format, want.data() + (sl / S) * stride, S, sl % S, k);
        ++written;
      }
      EXPECT_EQ(written, c.ratio == 1 ? N - 2 : 10);
      EXPECT_TRUE(bits_equal(want, cache.vec(), "index-K backing"));

      // the same bytes with one thread
      CanaryBuffer<uint8_t> serial(cache.size(), kByteCanary);
      a.cache.base = serial.data();
      indexer_k_store(a, ExecContext{nullptr, 1});
      EXPECT_TRUE(bits_equal(cache.vec(), serial.vec(), "1 thread vs 3"));
    }
  }
}

// SPEC 8.2 literally: RoPE on dims 64..127 at row p, fp32 then bf16; per head the UE8M0 exponent
// of the reference tile, q8 its codes, w = (float(w_raw) * 2^e) * 2^-6. Rows past T keep the canary.
TEST(IndexerPrepareQ, EqualsALiteralEvaluation) {
  for (uint64_t seed : {1u, 2u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Rng rng(seed);
    const int64_t T = 11, table_rows = 200;
    std::vector<uint16_t> q = random_bf16(static_cast<size_t>(T * 32 * D), rng, 1.0);
    // heads of other magnitudes: tiny (the 1e-4 floor), large, all zero, and one with a NaN (poisoned)
    for (int d = 0; d < D; ++d) {
      q[static_cast<size_t>((1 * 32 + 3) * D + d)] = num::bf16_encode(static_cast<float>(rng.normal() * 1e-7));
      q[static_cast<size_t>((2 * 32 + 4) * D + d)] = num::bf16_encode(static_cast<float>(rng.normal() * 3e4));
      q[static_cast<size_t>((3 * 32 + 5) * D + d)] = 0;
    }
    q[static_cast<size_t>((4 * 32 + 6) * D + 70)] = 0x7FC0;
    const auto w_raw = random_bf16(static_cast<size_t>(T * 32), rng, 2.0);
    const auto table = random_rope_table(table_rows, rng);
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (auto& p : pos) p = rng.integer(0, table_rows - 1);
    CanaryBuffer<uint8_t> q8(static_cast<size_t>((T + 1) * 32 * D), kByteCanary);
    CanaryBuffer<float> w(static_cast<size_t>((T + 1) * 32), -5.0f);
    IndexQPrepArgs a;
    a.q = TensorView::contiguous(q.data(), DType::BF16, {T, 32, D});
    a.w_raw = TensorView::contiguous(const_cast<uint16_t*>(w_raw.data()), DType::BF16, {T, 32});
    a.positions = TensorView::contiguous(pos.data(), DType::I64, {T});
    a.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {table_rows, 64});
    a.q8 = q8.view({T + 1, 32, D});
    a.w = w.view({T + 1, 32});
    indexer_prepare_q(a, ExecContext{nullptr, 4});

    std::vector<uint8_t> want_q8(q8.size(), kByteCanary);
    std::vector<float> want_w(w.size(), -5.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < 32; ++h) {
        std::vector<float> v(D);
        for (int d = 0; d < D; ++d) v[static_cast<size_t>(d)] = bf(q[static_cast<size_t>((t * 32 + h) * D + d)]);
        rope_literal(v.data(), table.data() + pos[static_cast<size_t>(t)] * 64);
        for (int d = 64; d < D; ++d) v[static_cast<size_t>(d)] = bf_round(v[static_cast<size_t>(d)]);
        const uint8_t byte = ref::ue8m0_tile(v.data(), D, want_q8.data() + (t * 32 + h) * D);
        const double two_e = byte == 255 ? INFINITY : std::ldexp(1.0, byte - 127);
        want_w[static_cast<size_t>(t * 32 + h)] =
            ref::mul(f32(double{bf(w_raw[static_cast<size_t>(t * 32 + h)])} * two_e), 1.0f / 64.0f);
      }
    EXPECT_TRUE(bits_equal(want_q8, q8.vec(), "q8"));
    EXPECT_TRUE(bits_equal(want_w, w.vec(), "w"));
    EXPECT_TRUE(std::isinf(w[static_cast<size_t>(4 * 32 + 6)])) << "the poisoned head's weight is 2^128-scaled";

    CanaryBuffer<uint8_t> q8b(q8.size(), kByteCanary);
    CanaryBuffer<float> wb(w.size(), -5.0f);
    a.q8 = q8b.view({T + 1, 32, D});
    a.w = wb.view({T + 1, 32});
    indexer_prepare_q(a, ExecContext{nullptr, 1});
    EXPECT_TRUE(bits_equal(q8.vec(), q8b.vec(), "q8, 1 thread vs 4"));
    EXPECT_TRUE(bits_equal(w.vec(), wb.vec(), "w, 1 thread vs 4"));
  }
}

}  // namespace
}  // namespace dsv41kv::test
