// RoPE tables (SPEC 1.4): YaRN correction range, frequencies, table values, and the plain table
// against the conformance files' cos_sin tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dsv41kv/config.hpp"
#include "dsv41kv/rope.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/paths.hpp"

using namespace dsv41kv;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST(Rope, YarnCorrectionRange) {
  const ModelConfig c = deepseek_v41_flash();
  const RopeParams p = rope_params_compressed(c);
  EXPECT_TRUE(p.yarn);
  EXPECT_EQ(p.theta, 160000.0);
  const YarnRange r = yarn_correction_range(p);
  EXPECT_EQ(r.low, 15.0);
  EXPECT_EQ(r.high, 25.0);
  EXPECT_NEAR(yarn_correction_dim(32, 160000, 65536), 15.45, 0.01);
  EXPECT_NEAR(yarn_correction_dim(1, 160000, 65536), 24.71, 0.01);
}

TEST(Rope, YarnFrequencies) {
  const ModelConfig c = deepseek_v41_flash();
  const auto f = rope_frequencies(rope_params_compressed(c));
  for (int j = 0; j < 32; ++j) {
    const double e = std::pow(160000.0, -2.0 * j / 64.0);
    if (j <= 15) {
      EXPECT_EQ(f[static_cast<size_t>(j)], e) << j;
    }
    if (j >= 25) {
      EXPECT_EQ(f[static_cast<size_t>(j)], e / 16.0) << j;
    }
    if (j > 15 && j < 25) {
      const double ramp = (j - 15.0) / 10.0;
      EXPECT_DOUBLE_EQ(f[static_cast<size_t>(j)], e / 16.0 * ramp + e * (1 - ramp)) << j;
      EXPECT_LT(f[static_cast<size_t>(j)], e);
      EXPECT_GT(f[static_cast<size_t>(j)], e / 16.0);
    }
  }
  const auto g = rope_frequencies(rope_params_plain(c));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(g[static_cast<size_t>(j)], std::pow(10000.0, -2.0 * j / 64.0));
  // low == high uses high + 0.001 (no division by zero)
  RopeParams q = rope_params_compressed(c);
  q.beta_fast = 1.0;
  q.beta_slow = 0.999999;
  const auto h = rope_frequencies(q);
  for (double x : h) EXPECT_TRUE(std::isfinite(x));
}

TEST(Rope, TableValuesAgainstDirectDouble) {
  const ModelConfig c = deepseek_v41_flash();
  for (int ratio : {0, 2}) {
    const RopeParams p = rope_params_for_ratio(c, ratio);
    const auto f = rope_frequencies(p);
    const RopeTable t = build_rope_table(p, 5000, RopeAngle::kBinary64, 3);
    ASSERT_EQ(t.rows, 5000);
    ASSERT_EQ(t.data.size(), 5000u * 64);
    for (int64_t pos : {0L, 1L, 2L, 777L, 4095L, 4096L, 4999L}) {
      for (int j = 0; j < 32; ++j) {
        const double a = static_cast<double>(pos) * f[static_cast<size_t>(j)];
        EXPECT_EQ(bits(t.row(pos)[j]), bits(static_cast<float>(std::cos(a)))) << pos << " " << j;
        EXPECT_EQ(bits(t.row(pos)[32 + j]), bits(static_cast<float>(std::sin(a)))) << pos << " " << j;
      }
    }
    EXPECT_EQ(t.row(0)[0], 1.0f);
    EXPECT_EQ(t.row(0)[32], 0.0f);
  }
}

TEST(Rope, ThreadCountDoesNotChangeBytes) {
  const RopeParams p = rope_params_compressed(deepseek_v41_flash());
  const RopeTable a = build_rope_table(p, 70000, RopeAngle::kBinary64, 1);
  const RopeTable b = build_rope_table(p, 70000, RopeAngle::kBinary64, 7);
  EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4));
}

TEST(Rope, Fp32AngleVariant) {
  const RopeParams p = rope_params_plain(deepseek_v41_flash());
  const auto f = rope_frequencies(p);
  const RopeTable t = build_rope_table(p, 100000, RopeAngle::kFp32);
  const RopeTable d = build_rope_table(p, 100000, RopeAngle::kBinary64);
  int64_t differ = 0;
  for (int64_t pos : {3L, 999L, 65537L, 99999L}) {
    for (int j = 0; j < 32; ++j) {
      const float a = static_cast<float>(pos) * static_cast<float>(f[static_cast<size_t>(j)]);
      EXPECT_EQ(bits(t.row(pos)[j]), bits(static_cast<float>(std::cos(static_cast<double>(a)))));
      EXPECT_EQ(bits(t.row(pos)[32 + j]), bits(static_cast<float>(std::sin(static_cast<double>(a)))));
    }
  }
  for (size_t i = 0; i < t.data.size(); ++i) differ += bits(t.data[i]) != bits(d.data[i]);
  EXPECT_GT(differ, 0) << "the fp32 angle differs from the binary64 angle at large positions";
  EXPECT_EQ(parse_rope_angle("fp32_angle"), RopeAngle::kFp32);
  EXPECT_EQ(parse_rope_angle("binary64"), RopeAngle::kBinary64);
  EXPECT_THROW((void)parse_rope_angle("fp16"), Error);
}

TEST(Rope, TableForLayerAndRows) {
  const ModelConfig c = deepseek_v41_flash();
  const RopeTable plain = rope_table_for_layer(c, 0, 64);
  const RopeTable yarn = rope_table_for_layer(c, 20, 64);
  const RopeTable yarn2 = rope_table_for_ratio(c, 2, 64);
  EXPECT_EQ(plain.rows, 64);
  EXPECT_EQ(std::memcmp(yarn.data.data(), yarn2.data.data(), yarn.data.size() * 4), 0);
  EXPECT_NE(std::memcmp(plain.data.data(), yarn.data.data(), plain.data.size() * 4), 0);
  const TensorView v = yarn.view();
  EXPECT_EQ(v.dtype, DType::F32);
  EXPECT_EQ(v.size(0), 64);
  EXPECT_EQ(v.size(1), 64);
  EXPECT_THROW((void)build_rope_table(rope_params_plain(c), 0), Error);
  EXPECT_THROW((void)rope_table_for_layer(c, 43, 4), Error);
  RopeParams bad;
  bad.theta = 0.5;
  EXPECT_THROW((void)build_rope_table(bad, 4), Error);
}

TEST(Rope, FullSizeYarnTable) {
  // max_position_embeddings rows (1M x 64 fp32 = 256 MiB), multi-threaded.
  const ModelConfig c = deepseek_v41_flash();
  const RopeTable t = rope_table_for_ratio(c, 1);
  ASSERT_EQ(t.rows, 1048576);
  const auto f = rope_frequencies(rope_params_compressed(c));
  const int64_t pos = 1048575;
  for (int j = 0; j < 32; ++j) {
    const double a = static_cast<double>(pos) * f[static_cast<size_t>(j)];
    EXPECT_EQ(bits(t.row(pos)[j]), bits(static_cast<float>(std::cos(a))));
  }
}

// The conformance files were produced with the plain theta = 10000 table of 1024 rows built as
// in SPEC 1.4 (binary64 angle, one rounding).
TEST(Rope, PlainTableMatchesConformanceCosSin) {
  for (const char* name : {"compress_r1_shared.safetensors", "compress_r2_shared.safetensors"}) {
    const auto file = st::SafetensorsFile::load(test::conformance_dir() + "/" + name);
    file.expect("cos_sin", st::StDType::F32, {1024, 64});
    const auto ref = file.copy_as<float>("cos_sin");
    const RopeParams p = rope_params_plain(deepseek_v41_flash());
    int64_t mism64 = 0, mism32 = 0;
    const RopeTable t64 = build_rope_table(p, 1024, RopeAngle::kBinary64);
    const RopeTable t32 = build_rope_table(p, 1024, RopeAngle::kFp32);
    for (size_t i = 0; i < ref.size(); ++i) {
      mism64 += bits(ref[i]) != bits(t64.data[i]);
      mism32 += bits(ref[i]) != bits(t32.data[i]);
    }
    RecordProperty(std::string(name) + "_binary64_mismatches", static_cast<int>(mism64));
    RecordProperty(std::string(name) + "_fp32_angle_mismatches", static_cast<int>(mism32));
    std::printf("%s: binary64 table mismatches %lld, fp32_angle mismatches %lld of %zu\n", name,
                static_cast<long long>(mism64), static_cast<long long>(mism32), ref.size());
    EXPECT_EQ(mism64, 0) << "binary64 table differs from " << name << " (fp32_angle differs in " << mism32 << ")";
  }
}
