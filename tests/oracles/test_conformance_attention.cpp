// The read-path conformance runners of the attention ops (shared/conformance/README.md, ops
// sparse_decode and sparse_prefill): every case of the shipped files passes (skipped with a
// message when the files are absent), doctored references fail exactly the check they break,
// --dump writes c{i}.out and c{i}.lse, and the agreement rule (check_attention_out / _lse) admits
// and rejects what the README says.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv41kv/conformance.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/safetensors.hpp"
#include "support/cli.hpp"
#include "support/doctor.hpp"
#include "support/paths.hpp"

namespace dsv41kv::test {
namespace {

const char* kDecode = "sparse_decode_shared.safetensors.gz";
const char* kPrefill = "sparse_prefill_shared.safetensors.gz";
std::string shipped(const char* name) { return conformance_dir() + "/" + name; }

#define SKIP_WITHOUT(name)                                                   \
  if (!std::filesystem::exists(shipped(name))) {                             \
    GTEST_SKIP() << "no conformance file " << shipped(name) << " (skipped)"; \
  }

// Every case of the file passes both checks; returns the result.
conformance::FileResult expect_all_pass(const std::string& path, const char* op, size_t cases) {
  const conformance::FileResult r = conformance::run_file(path);
  EXPECT_EQ(r.op, op);
  EXPECT_EQ(r.read_cases.size(), cases);
  EXPECT_EQ(r.checks(), static_cast<int64_t>(2 * cases));
  EXPECT_EQ(r.failed(), 0);
  for (const auto& c : r.read_cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.checks.size(), 2u);
    if (c.checks.size() != 2) continue;
    EXPECT_EQ(c.checks[0].what, "out");
    EXPECT_EQ(c.checks[1].what, "lse");
    for (const auto& k : c.checks) EXPECT_TRUE(k.pass) << k.what << ": " << k.summary << "; " << k.detail;
  }
  return r;
}

TEST(ConformanceAttention, ShippedDecodeFilePasses) {
  SKIP_WITHOUT(kDecode);
  const auto r = expect_all_pass(shipped(kDecode), "sparse_decode", 3);
  for (const std::string& line : conformance::report(r)) EXPECT_NE(line.find(" PASS "), std::string::npos) << line;
}

TEST(ConformanceAttention, ShippedPrefillFilePasses) {
  SKIP_WITHOUT(kPrefill);
  expect_all_pass(shipped(kPrefill), "sparse_prefill", 2);
}

// The same cases on one thread and on several give the same outputs (the dumps are identical).
TEST(ConformanceAttention, DumpWritesOutAndLse) {
  SKIP_WITHOUT(kDecode);
  TempDir tmp;
  std::vector<std::vector<uint8_t>> outs;
  for (int threads : {1, 3}) {
    conformance::Options opt;
    opt.dump_dir = tmp / ("t" + std::to_string(threads));
    opt.num_threads = threads;
    const auto r = conformance::run_file(shipped(kDecode), opt);
    ASSERT_EQ(r.failed(), 0);
    ASSERT_EQ(r.dump_path, (std::filesystem::path(opt.dump_dir) / "sparse_decode_shared.safetensors").string());
    const auto f = st::SafetensorsFile::load(r.dump_path);
    const auto meta = nlohmann::json::parse(f.metadata("dsv41"));
    std::vector<uint8_t> all;
    for (size_t ci = 0; ci < meta.at("cases").size(); ++ci) {
      const auto& c = meta.at("cases")[ci];
      const int64_t T = c.at("num_tokens"), H = c.at("num_heads");
      const std::string p = "c" + std::to_string(ci) + ".";
      EXPECT_NO_THROW(f.expect(p + "out", st::StDType::BF16, {T, H, 512}));
      EXPECT_NO_THROW(f.expect(p + "lse", st::StDType::F32, {T, H}));
      EXPECT_TRUE(f.has(p + "out_ref")) << "the inputs and references stay in the dump";
      all.insert(all.end(), f.bytes(p + "out").begin(), f.bytes(p + "out").end());
      all.insert(all.end(), f.bytes(p + "lse").begin(), f.bytes(p + "lse").end());
    }
    outs.push_back(std::move(all));
    // the dump is itself a conformance file that passes
    EXPECT_EQ(conformance::run_file(r.dump_path).failed(), 0);
  }
  EXPECT_EQ(outs[0], outs[1]) << "the thread count changed an output";
}

// A reference moved beyond the rule fails exactly that case's check; the other checks still pass.
TEST(ConformanceAttention, DoctoredReferencesFail) {
  SKIP_WITHOUT(kDecode);
  SKIP_WITHOUT(kPrefill);
  TempDir tmp;
  auto failed_checks = [](const conformance::FileResult& r) {
    std::vector<std::string> f;
    for (const auto& c : r.read_cases)
      for (const auto& k : c.checks)
        if (!k.pass) f.push_back(fmt::format("c{}.{}", c.index, k.what));
    return f;
  };
  {  // one output element of decode case 1 moved by 2% of itself plus 0.01
    const std::string p = tmp / "out.safetensors";
    write_doctored(shipped(kDecode), p, "c1.out_ref", [](std::vector<uint8_t>& b) {
      float v;
      std::memcpy(&v, b.data() + 4 * 1000, 4);
      v = v * 1.02f + 0.01f;
      std::memcpy(b.data() + 4 * 1000, &v, 4);
    });
    const auto r = conformance::run_file(p);
    EXPECT_EQ(failed_checks(r), std::vector<std::string>{"c1.out"});
    EXPECT_EQ(r.failed(), 1);
  }
  {  // a finite lse of prefill case 0 made +inf (an empty row where the project has keys)
    const std::string p = tmp / "lse.safetensors";
    write_doctored(shipped(kPrefill), p, "c0.lse_ref", [](std::vector<uint8_t>& b) {
      for (size_t i = 0; i < b.size(); i += 4) {
        float v;
        std::memcpy(&v, b.data() + i, 4);
        if (std::isfinite(v)) {
          v = std::numeric_limits<float>::infinity();
          std::memcpy(b.data() + i, &v, 4);
          break;
        }
      }
    });
    const auto r = conformance::run_file(p);
    EXPECT_EQ(failed_checks(r), std::vector<std::string>{"c0.lse"});
  }
  {  // one record byte of the SWA cache of decode case 2 changed: the project's output moves
    const auto f = st::SafetensorsFile::load(shipped(kDecode));
    const auto idx = f.copy_as<int32_t>("c2.swa_indices");
    const auto meta = nlohmann::json::parse(f.metadata("dsv41")).at("cases")[2];
    const int64_t S = meta.at("swa_states_per_page"), stride = meta.at("swa_page_stride");
    const int32_t slot = idx[0];  // row 0 entry 0: a valid slot of a short row
    ASSERT_GE(slot, 0);
    const std::string p = tmp / "cache.safetensors";
    write_doctored(shipped(kDecode), p, "c2.swa_cache", [&](std::vector<uint8_t>& b) {
      // the UE8M0 scale of NoPE tile 0 of that record: every value of the tile 2^4 times larger
      b[static_cast<size_t>((slot / S) * stride + S * 576 + (slot % S) * 8)] += 4;
    });
    const auto r = conformance::run_file(p);
    const auto fc = failed_checks(r);
    ASSERT_FALSE(fc.empty());
    for (const auto& k : fc) EXPECT_EQ(k.substr(0, 3), "c2.") << k;
  }
  {  // a missing tensor is a malformed file (kFormat), not a failed case
    const std::string p = tmp / "short.safetensors";
    const auto f = st::SafetensorsFile::load(shipped(kPrefill));
    st::SafetensorsWriter w;
    for (const auto& t : f.names())
      if (t != "c1.topk_length") w.add_from(f, t);
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    w.write(p);
    try {
      conformance::run_file(p);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFormat);
      EXPECT_NE(std::string(e.what()).find("has no tensor 'c1.topk_length'"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------- the agreement rule

std::vector<uint16_t> bf16_row(const std::vector<double>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = num::bf16_encode(static_cast<float>(v[i]));
  return o;
}

TEST(AttentionAgreement, ElementBoundAndCosine) {
  // reference 0.5 everywhere (exact in bf16): the element bound is 4e-3 + 5e-3 = 9e-3
  std::vector<double> ref(512, 0.5);
  std::vector<double> got = ref;
  got[7] = 0.5 + 0.0078125;  // two bf16 steps (7.8e-3): within the bound
  EXPECT_TRUE(conformance::check_attention_out(bf16_row(got).data(), ref.data(), 1).pass);
  got[7] = 0.5 + 0.01171875;  // three steps: beyond
  const auto c = conformance::check_attention_out(bf16_row(got).data(), ref.data(), 1);
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.detail.find("row 0 dim 7"), std::string::npos) << c.detail;
  // every element within the bound (2^-8 <= 4e-3 + 1.25e-3), but errors orthogonal to the row of
  // +-0.125, 2^-8 each: cosine 1 - 4.9e-4
  std::vector<double> r2(512), g2(512);
  for (int d = 0; d < 512; ++d) {
    r2[static_cast<size_t>(d)] = d % 2 ? 0.125 : -0.125;
    g2[static_cast<size_t>(d)] = r2[static_cast<size_t>(d)] + (d % 4 < 2 ? 0.00390625 : -0.00390625);
  }
  const auto c2 = conformance::check_attention_out(bf16_row(g2).data(), r2.data(), 1);
  EXPECT_FALSE(c2.pass) << c2.summary;
  EXPECT_NE(c2.detail.find("cosine"), std::string::npos) << c2.detail;
  EXPECT_NE(c2.summary.find("(0 beyond)"), std::string::npos) << c2.summary;
}

TEST(AttentionAgreement, RotatedDimsUseThePairMagnitude) {
  // a rotated pair (448, 449) = (0.125, 1.5): an error of 1.5e-2 on the small element is beyond
  // 4e-3 + 1e-2 * 0.125, but within 4e-3 + 1e-2 * 1.5 (the pair's larger magnitude) once the dims
  // from 448 are declared rotated; a NoPE element with the same error still fails
  std::vector<double> ref(512, 0.125);
  ref[449] = 1.5;
  ref[1] = 1.5;
  std::vector<double> got = ref;
  got[448] = 0.125 + 0.015625;
  EXPECT_FALSE(conformance::check_attention_out(bf16_row(got).data(), ref.data(), 1).pass);
  EXPECT_TRUE(conformance::check_attention_out(bf16_row(got).data(), ref.data(), 1, kNopeDim).pass);
  got[0] = 0.125 + 0.015625;
  EXPECT_FALSE(conformance::check_attention_out(bf16_row(got).data(), ref.data(), 1, kNopeDim).pass);
}

TEST(AttentionAgreement, ZeroRowsAndLse) {
  std::vector<double> zero(512, 0.0);
  std::vector<double> tiny(512, 0.0);
  tiny[100] = 1e-3;  // within the element bound, but a reference-zero row must be exactly 0
  EXPECT_TRUE(conformance::check_attention_out(bf16_row(zero).data(), zero.data(), 1).pass);
  const std::vector<uint16_t> negzero(512, 0x8000);
  EXPECT_TRUE(conformance::check_attention_out(negzero.data(), zero.data(), 1).pass);
  EXPECT_FALSE(conformance::check_attention_out(bf16_row(tiny).data(), zero.data(), 1).pass);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> lref = {inf, 10.0, -3.0};
  const float finf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(conformance::check_attention_lse(std::vector<float>{finf, 10.001f, -3.0f}.data(), lref.data(), 3).pass);
  EXPECT_FALSE(conformance::check_attention_lse(std::vector<float>{9.0f, 10.0f, -3.0f}.data(), lref.data(), 3).pass);
  EXPECT_FALSE(conformance::check_attention_lse(std::vector<float>{finf, finf, -3.0f}.data(), lref.data(), 3).pass);
  // 1e-3 + 1e-4 * 10 = 2e-3 at 10
  EXPECT_TRUE(conformance::check_attention_lse(std::vector<float>{finf, 10.0019f, -3.0f}.data(), lref.data(), 3).pass);
  EXPECT_FALSE(conformance::check_attention_lse(std::vector<float>{finf, 10.0021f, -3.0f}.data(), lref.data(), 3).pass);
}

}  // namespace
}  // namespace dsv41kv::test
