// kv_score projection (SPEC 4.1): fixed accumulation order (checked against an independent
// scalar loop of the documented order and against binary64), batch invariance, thread
// invariance, validation, deterministic synthetic weights, safetensors loading.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "dsv41kv/projection.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

// The documented order, written as plainly as possible.
float documented_dot(const uint16_t* x, const uint16_t* w, int64_t H) {
  float acc[16] = {};
  for (int64_t k = 0; k < H; ++k) {
    const float prod = num::bf16_decode(x[k]) * num::bf16_decode(w[k]);
    acc[k % 16] = acc[k % 16] + prod;
  }
  for (int h = 8; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] = acc[l] + acc[l + h];
  return acc[0];
}

TEST(Projection, FixedOrderBatchAndThreadInvariant) {
  for (int ratio : {1, 2}) {
    const int H = 328;  // not a multiple of 16: exercises the tail
    const CompressorWeights cw = CompressorWeights::from_seed(ratio, H, 11);
    const int64_t O = 512 * ratio, T = 9;
    Rng rng(3);
    auto hidden = random_bf16(static_cast<size_t>(T * H), rng);
    const int64_t ostride = O + 16;
    std::vector<float> out(static_cast<size_t>(T * ostride), -1.0f);
    project_kv_score(TensorView::contiguous(hidden.data(), DType::BF16, {T, H}), cw.weight_view(),
                     TensorView::strided(out.data(), DType::F32, {T, O}, {ostride, 1}),
                     ExecContext{nullptr, 3});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < O; ++o) {
        const float e = documented_dot(hidden.data() + t * H, cw.fused_wkv_wgate.data() + o * H, H);
        ASSERT_EQ(num::f2u(e), num::f2u(out[static_cast<size_t>(t * ostride + o)])) << t << "," << o;
        double ref = 0;
        for (int k = 0; k < H; ++k)
          ref += static_cast<double>(num::bf16_decode(hidden[static_cast<size_t>(t * H + k)])) *
                 num::bf16_decode(cw.fused_wkv_wgate[static_cast<size_t>(o * H + k)]);
        ASSERT_NEAR(out[static_cast<size_t>(t * ostride + o)], ref, 1e-4 + 1e-4 * std::fabs(ref));
      }
      // padding columns untouched
      for (int64_t o = O; o < ostride; ++o) ASSERT_EQ(out[static_cast<size_t>(t * ostride + o)], -1.0f);
    }
    // batch invariance: row t alone gives the same bits; thread count does not matter
    for (int64_t t : {int64_t{0}, int64_t{5}, T - 1}) {
      std::vector<float> one(static_cast<size_t>(O));
      project_kv_score(TensorView::contiguous(hidden.data() + t * H, DType::BF16, {1, H}),
                       cw.weight_view(), TensorView::contiguous(one.data(), DType::F32, {1, O}),
                       ExecContext{nullptr, 1});
      EXPECT_TRUE(bytes_equal(out.data() + t * ostride, one.data(), static_cast<size_t>(O) * 4,
                              "row " + std::to_string(t)));
    }
  }
}

TEST(Projection, Validation) {
  const CompressorWeights cw = CompressorWeights::from_seed(2, 64, 1);
  std::vector<uint16_t> hidden(4 * 64);
  std::vector<float> out(4 * 1024, 7.0f);
  auto h = TensorView::contiguous(hidden.data(), DType::BF16, {4, 64});
  auto o = TensorView::contiguous(out.data(), DType::F32, {4, 1024});
  auto expect = [&](auto fn, ErrorCode code, const std::string& frag) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << frag;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
    }
    for (float v : out) ASSERT_EQ(v, 7.0f);
  };
  auto w = cw.weight_view();
  auto w3 = w;
  w3.shape[0] = 768;
  expect([&] { project_kv_score(h, w3, o); }, ErrorCode::kCompressorRatio, "768 rows");
  auto h2 = h;
  h2.shape[1] = 32;
  expect([&] { project_kv_score(h2, w, o); }, ErrorCode::kInvalidArgument, "hidden: 32 columns");
  expect([&] { project_kv_score(h, w, o, ExecContext{nullptr, -1}); }, ErrorCode::kInvalidArgument,
         "project_kv_score: ctx.num_threads = -1");
  auto o2 = o;
  o2.shape[1] = 512;
  expect([&] { project_kv_score(h, w, o2); }, ErrorCode::kInvalidArgument, "kv_score: 512 columns");
  auto o3 = o;
  o3.dtype = DType::BF16;
  expect([&] { project_kv_score(h, w, o3); }, ErrorCode::kInvalidArgument, "kv_score: dtype bf16");
  auto h3 = h;
  h3.device = Device::CUDA;
  expect([&] { project_kv_score(h3, w, o); }, ErrorCode::kInvalidArgument, "expected cpu");
}

TEST(Projection, WeightsFromSeedAreDeterministic) {
  const auto a = CompressorWeights::from_seed(2, 2048, 42), b = CompressorWeights::from_seed(2, 2048, 42);
  const auto c = CompressorWeights::from_seed(2, 2048, 43);
  EXPECT_EQ(a.fused_wkv_wgate, b.fused_wkv_wgate);
  EXPECT_EQ(a.norm_weight, b.norm_weight);
  EXPECT_NE(a.fused_wkv_wgate, c.fused_wkv_wgate);
  EXPECT_EQ(a.fused_wkv_wgate.size(), size_t{1024} * 2048);
  double ss = 0;
  for (uint16_t v : a.fused_wkv_wgate) ss += std::pow(num::bf16_decode(v), 2);
  EXPECT_NEAR(std::sqrt(ss / static_cast<double>(a.fused_wkv_wgate.size())), 1.0 / std::sqrt(2048.0), 1e-4);
  EXPECT_THROW(CompressorWeights::from_seed(3, 64, 1), Error);
}

TEST(Projection, WeightsFromSafetensors) {
  const auto cw = CompressorWeights::from_seed(2, 96, 5);
  const std::string dir = ::testing::TempDir();
  std::vector<uint16_t> wkv(cw.fused_wkv_wgate.begin(), cw.fused_wkv_wgate.begin() + 512 * 96);
  std::vector<uint16_t> wgate(cw.fused_wkv_wgate.begin() + 512 * 96, cw.fused_wkv_wgate.end());
  auto bytes = [](const std::vector<uint16_t>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2);
  };
  {  // split wkv / wgate with .weight suffixes
    st::SafetensorsWriter w;
    w.add("layers.2.attn.compressor.wkv.weight", st::StDType::BF16, {512, 96}, bytes(wkv));
    w.add("layers.2.attn.compressor.wgate.weight", st::StDType::BF16, {512, 96}, bytes(wgate));
    w.add("layers.2.attn.compressor.norm.weight", st::StDType::BF16, {512}, bytes(cw.norm_weight));
    w.write(dir + "/cw_split.safetensors");
    const auto got = CompressorWeights::from_safetensors(dir + "/cw_split.safetensors", "layers.2.attn.compressor");
    EXPECT_EQ(got.ratio, 2);
    EXPECT_EQ(got.hidden_size, 96);
    EXPECT_EQ(got.fused_wkv_wgate, cw.fused_wkv_wgate);
    EXPECT_EQ(got.norm_weight, cw.norm_weight);
  }
  {  // fused, ratio 1 (first 512 rows), no prefix
    st::SafetensorsWriter w;
    w.add("fused_wkv_wgate", st::StDType::BF16, {512, 96}, bytes(wkv));
    w.add("norm.weight", st::StDType::BF16, {512}, bytes(cw.norm_weight));
    w.write(dir + "/cw_fused.safetensors");
    const auto got = CompressorWeights::from_safetensors(dir + "/cw_fused.safetensors", "");
    EXPECT_EQ(got.ratio, 1);
    EXPECT_EQ(got.fused_wkv_wgate, wkv);
  }
  {  // missing norm -> kFormat naming the tensor
    st::SafetensorsWriter w;
    w.add("x.wkv", st::StDType::BF16, {512, 96}, bytes(wkv));
    w.write(dir + "/cw_bad.safetensors");
    try {
      CompressorWeights::from_safetensors(dir + "/cw_bad.safetensors", "x");
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat);
      EXPECT_NE(std::string(e.what()).find("x.norm.weight"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test
