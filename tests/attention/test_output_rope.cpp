// attention_output_rope (SPEC 9.6): bit-exact against a literal evaluation of the inverse rotation
// of SPEC 1.4 (y0 = fma(x0, c, x1 s), y1 = fma(x1, c, -(x0 s)) with rounded fp32 products, then
// bf16 RNE) at each token's own table row; NoPE dims copied; padded heads dropped (out has the
// real heads only); rows beyond T untouched; in place; thread count invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention/fixture.hpp"
#include "support/compare.hpp"

namespace dsv41kv::test {
namespace {

class OutputRope : public AttentionTest {};

// The literal evaluation, with std::fma and the products stored to fp32 variables.
uint16_t literal_pair(float x0, float x1, float c, float s, bool first) {
  volatile float x1s = x1 * s;
  volatile float x0s = x0 * s;
  const float y = first ? std::fma(x0, c, static_cast<float>(x1s)) : std::fma(x1, c, -static_cast<float>(x0s));
  return num::bf16_encode(y);
}

TEST_F(OutputRope, MatchesTheLiteralInverseRotationAndDropsPaddedHeads) {
  SCOPED_TRACE(seed_text());
  const int64_t T = 9, H = 128, Hr = 64, rows = 40;
  std::vector<uint16_t> o(static_cast<size_t>(T * H * kLatentDim));
  for (auto& v : o) v = random_bf16_value(rng(), 4.0);
  const std::vector<float> table = random_rope_table(rows, rng());
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (auto& p : pos) p = rng().integer(0, rows - 1);
  pos[0] = 0;
  pos[1] = rows - 1;
  std::vector<uint16_t> want(static_cast<size_t>((T + 2) * Hr * kLatentDim), kOutCanary);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hr; ++h) {
      const uint16_t* x = o.data() + (t * H + h) * kLatentDim;
      uint16_t* y = want.data() + (t * Hr + h) * kLatentDim;
      const float* tr = table.data() + pos[static_cast<size_t>(t)] * 64;
      std::memcpy(y, x, 2 * kNopeDim);
      for (int i = 0; i < 32; ++i) {
        const float x0 = num::bf16_decode(x[448 + 2 * i]), x1 = num::bf16_decode(x[449 + 2 * i]);
        y[448 + 2 * i] = literal_pair(x0, x1, tr[i], tr[32 + i], true);
        y[449 + 2 * i] = literal_pair(x0, x1, tr[i], tr[32 + i], false);
      }
    }
  OutputRopeArgs a;
  a.o = TensorView::contiguous(o.data(), DType::BF16, {T, H, kLatentDim});
  a.num_real_heads = static_cast<int>(Hr);
  a.positions = view_of(pos);
  a.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {rows, 64});
  for (int threads : {1, 2, 4}) {
    CanaryBuffer<uint16_t> out(want.size(), kOutCanary);
    a.out = TensorView::contiguous(out.data(), DType::BF16, {T, Hr, kLatentDim});
    attention_output_rope(a, ExecContext{nullptr, threads});
    EXPECT_TRUE(bits_equal(want, out.vec(), "out")) << threads << " threads";
  }
  // in place over all heads: the real heads' rows of `want` for heads < Hr, and the same rule for
  // the others
  std::vector<uint16_t> inplace = o;
  a.o = TensorView::contiguous(inplace.data(), DType::BF16, {T, H, kLatentDim});
  a.out = a.o;
  a.num_real_heads = static_cast<int>(H);
  attention_output_rope(a);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hr; ++h)
      ASSERT_EQ(std::memcmp(inplace.data() + (t * H + h) * kLatentDim, want.data() + (t * Hr + h) * kLatentDim,
                            2 * kLatentDim),
                0)
          << "in place, token " << t << " head " << h;
}

// The inverse undoes the forward rotation up to the roundings of the two (SPEC 1.4): applied to a
// rotated row it gives back the row within a few bf16 steps; NoPE dims never change.
TEST_F(OutputRope, UndoesTheForwardRotation) {
  SCOPED_TRACE(seed_text());
  const std::vector<float> table = random_rope_table(4, rng());
  std::vector<uint16_t> x(kLatentDim), rotated(kLatentDim), back(kLatentDim);
  for (auto& v : x) v = num::bf16_encode(static_cast<float>(rng().normal()));
  rotated = x;
  for (int i = 0; i < 32; ++i) {
    float y0, y1;
    num::rope_forward(num::bf16_decode(x[448 + 2 * i]), num::bf16_decode(x[449 + 2 * i]), table[64 * 2 + i],
                      table[64 * 2 + 32 + i], y0, y1);
    rotated[448 + 2 * i] = num::bf16_encode(y0);
    rotated[449 + 2 * i] = num::bf16_encode(y1);
  }
  std::vector<int64_t> pos = {2};
  OutputRopeArgs a;
  a.o = TensorView::contiguous(rotated.data(), DType::BF16, {1, 1, kLatentDim});
  a.num_real_heads = 1;
  a.positions = view_of(pos);
  a.rope_table = TensorView::contiguous(const_cast<float*>(table.data()), DType::F32, {4, 64});
  a.out = TensorView::contiguous(back.data(), DType::BF16, {1, 1, kLatentDim});
  attention_output_rope(a);
  for (int d = 0; d < kNopeDim; ++d) ASSERT_EQ(back[static_cast<size_t>(d)], x[static_cast<size_t>(d)]);
  for (int d = kNopeDim; d < kLatentDim; ++d)
    EXPECT_NEAR(num::bf16_decode(back[static_cast<size_t>(d)]), num::bf16_decode(x[static_cast<size_t>(d)]),
                0.03 * (1 + std::fabs(num::bf16_decode(x[static_cast<size_t>(d)]))))
        << "dim " << d;
}

}  // namespace
}  // namespace dsv41kv::test
