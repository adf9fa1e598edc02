// The AVX-512 form of the attention engine's loops (src/attention/avx512.cpp, taken at run time
// where the CPU has AVX-512) gives the bits of the portable form: decode and prefill calls on
// random inputs through both, every output and lse bit compared (canary rows included); the
// softmax's vector exp equals static_cast<float>(std::exp(x)) on a sweep of its whole range and on
// the arguments nearest to fp32 rounding midpoints (where it must defer to std::exp). Skipped, with
// a message, on a CPU without AVX-512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/avx512.hpp"
#include "attention/backend.hpp"
#include "attention/decode_case.hpp"

namespace dsv41kv::test {
namespace {

class AttentionForms : public AttentionTest {
 protected:
  void SetUp() override {
    if (!detail::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the portable form runs here";
    AttentionTest::SetUp();
  }

  // The case's decode in both forms on `threads` threads with its planned schedule.
  void expect_decode_forms_agree(DecodeCase& c, int threads, const std::string& what) {
    const DecodeSpec& s = c.spec;
    Outputs portable(s.T, s.H), avx512(s.T, s.H);
    for (auto [o, form] : {std::pair{&portable, detail::CpuForm::kPortable}, {&avx512, detail::CpuForm::kAvx512}}) {
      const SparseDecodeArgs a = c.args(*o);
      const detail::DecodePlan p = detail::plan_sparse_decode(a);
      detail::check_sparse_decode_values(a, p);
      detail::cpu::sparse_decode(a, p, ExecContext{nullptr, threads}, form);
    }
    EXPECT_TRUE(portable.same_bits(avx512)) << what;
    EXPECT_TRUE(avx512.rows_beyond_untouched()) << what;
  }
};

// Heads 16 .. 128 (one to eight chunks of 16 lanes: groups of four chunks and their remainders),
// every length pattern of the key lists (partial blocks, key counts of every residue mod 6), both
// cache kinds, split-K and threads.
TEST_F(AttentionForms, DecodeGivesTheSameBits) {
  for (int H : {16, 32, 64, 128})
    for (int ratio : {0, 1, 2}) {
      const std::string what = "H = " + std::to_string(H) + ", ratio " + std::to_string(ratio);
      SCOPED_TRACE(what + ", " + seed_text());
      DecodeSpec s;
      s.H = H;
      s.T = H >= 64 ? 5 : 10;
      s.ratio = ratio;
      if (ratio == 1) s.cmp_format = RecordFormat::MXFP8_528;
      DecodeCase c = DecodeCase::make(s, rng());
      c.plan(0, 1);
      expect_decode_forms_agree(c, 1, what + ", planned schedule, 1 thread");
      const int64_t splits = std::min<int64_t>(3, c.schedule.key_blocks);  // split-K: the workspace path
      c.plan(splits, 2);
      expect_decode_forms_agree(c, 2, what + ", " + std::to_string(splits) + " splits on 2 threads");
    }
}

// Scores spread over hundreds (queries scaled up): probabilities that underflow to 0, arguments in
// the subnormal range of exp; every record format (the SWA cache's, then NVFP4 compressed keys).
TEST_F(AttentionForms, DecodeWithWideScoresAndEveryRecordFormat) {
  for (RecordFormat f : {RecordFormat::V4_584, RecordFormat::MXFP8_528, RecordFormat::PLAIN_BF16,
                         RecordFormat::PLAIN_FP8, RecordFormat::NVFP4_288}) {
    const bool cmp = f == RecordFormat::NVFP4_288;
    const std::string what = std::string(cmp ? "compressed " : "SWA ") + record_info(f).name;
    SCOPED_TRACE(what + ", " + seed_text());
    DecodeSpec s;
    s.H = 64;
    s.T = 5;
    s.ratio = cmp ? 1 : 0;
    if (cmp) s.cmp_format = f;
    else s.swa_format = f;
    DecodeCase c = DecodeCase::make(s, rng());
    for (size_t i = 0; i < c.q.size(); ++i)
      c.q[i] = num::bf16_encode(num::bf16_decode(c.q[i]) * static_cast<float>(1 << (i / kLatentDim % 5 * 2)));
    expect_decode_forms_agree(c, 1, what);
  }
}

TEST_F(AttentionForms, PrefillGivesTheSameBits) {
  SCOPED_TRACE(seed_text());
  const int H = 64;
  const int64_t T = 5, s_kv = 400, topk = 300;
  RandomPrefill p(T, H, s_kv, topk, rng());
  for (int threads : {1, 2}) {
    Outputs portable(T, H), avx512(T, H);
    for (auto [o, form] : {std::pair{&portable, detail::CpuForm::kPortable}, {&avx512, detail::CpuForm::kAvx512}}) {
      const SparsePrefillArgs a = p.args(*o);
      const detail::PrefillPlan plan = detail::plan_sparse_prefill(a);
      detail::check_sparse_prefill_values(a, plan);
      detail::cpu::sparse_prefill(a, plan, ExecContext{nullptr, threads}, form);
    }
    EXPECT_TRUE(portable.same_bits(avx512)) << threads << " threads";
    EXPECT_TRUE(avx512.rows_beyond_untouched());
  }
}

// The vector exp of the softmax: static_cast<float>(std::exp(x)) bit for bit.
TEST_F(AttentionForms, SoftmaxExpEqualsStdExp) {
  SCOPED_TRACE(seed_text());
  std::vector<double> x;
  // every 509th fp32 number in [-110, 0] (the scores and maxima are fp32; their binary64
  // differences are mostly fp32 numbers too), random binary64 arguments, the special values
  for (uint32_t u = num::f2u(-110.0f); u > 0x80000000u + 509; u -= 509) x.push_back(num::u2f(u));
  for (int i = 0; i < 1000000; ++i) x.push_back(rng().uniform(-110.0, 0.0));
  for (double v : {0.0, -0.0, -87.0, -104.0, -1e-300, 1e-300, 1.0, -kInf * 1.0, kInf * 1.0,
                   static_cast<double>(std::numeric_limits<float>::quiet_NaN())})
    x.push_back(v);
  // arguments whose exp lies within a few binary64 units of a midpoint between two fp32 numbers:
  // the vector form must notice and take std::exp there
  for (int i = 0; i < 20000; ++i) {
    const float f = static_cast<float>(std::exp(rng().uniform(-87.0, 0.0)));
    const double mid = (static_cast<double>(f) + static_cast<double>(std::nextafter(f, 1.0f))) / 2.0;
    const double a = std::log(mid);
    x.push_back(a);
    x.push_back(std::nextafter(a, 0.0));
    x.push_back(std::nextafter(a, -1.0));
  }
  std::vector<float> got(x.size());
  detail::attn::avx512::exp_f32(x.data(), static_cast<int>(x.size()), got.data());
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(std::exp(x[i]));
    if (num::f2u(got[i]) != num::f2u(want) && ++bad <= 5)
      ADD_FAILURE() << "x = " << x[i] << ": " << got[i] << " (0x" << std::hex << num::f2u(got[i]) << "), std::exp gives "
                    << want << " (0x" << num::f2u(want) << ")" << std::dec;
  }
  EXPECT_EQ(bad, 0) << "of " << x.size() << " arguments";
}

}  // namespace
}  // namespace dsv41kv::test
