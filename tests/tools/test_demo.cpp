// The main job: `dsv41kv demo` runs its built-in workload end to end and writes, per step and
// layer, what the workload's positions say it must (counted here from pcp::demo_workload alone,
// not from the metadata rules the pipeline applies), reads every record back with no bad record
// while a wrong expectation makes that check fail, and rejects bad flags with exit 2.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dsv41kv/pcp_sim.hpp"
#include "support/workload_facts.hpp"
#include "support/cli.hpp"
#include "support/paths.hpp"

using dsv41kv::test::run_cli;
using dsv41kv::test::TempDir;

namespace {

// A config.json with a small hidden size keeps a run fast (and exercises --config).
std::string small_config(const TempDir& tmp) {
  auto cfg = nlohmann::json::parse(dsv41kv::test::slurp(dsv41kv::test::source_dir() +
                                                        "/docs/examples/deepseek_v41_flash_config.json"));
  cfg["hidden_size"] = 256;
  const std::string path = tmp / "small.json";
  std::ofstream(path) << cfg.dump();
  return path;
}

}  // namespace

TEST(Demo, JsonRunWritesWhatTheWorkloadSays) {
  TempDir tmp;
  const auto r = run_cli("demo --write-path --json --threads 2 --seed 7", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto js = nlohmann::json::parse(r.out);
  const dsv41kv::pcp::Workload w = dsv41kv::pcp::demo_workload(7);
  ASSERT_EQ(js["steps"].size(), w.steps.size());
  ASSERT_EQ(js["layers"].size(), 2u);
  constexpr int64_t kFormats = 5;
  int64_t tokens = 0;
  std::map<int, dsv41kv::test::WorkloadFacts> total;
  for (size_t i = 0; i < w.steps.size(); ++i) {
    const auto& s = js["steps"][i];
    int64_t step_tokens = 0, decodes = 0;
    for (const auto& q : w.steps[i]) {
      step_tokens += q.req.query_len;
      decodes += q.req.is_prefilling ? 0 : 1;
    }
    tokens += step_tokens;
    EXPECT_EQ(s["tokens"].get<int64_t>(), step_tokens) << "step " << i;
    EXPECT_EQ(s["requests"].get<size_t>(), w.steps[i].size()) << "step " << i;
    EXPECT_EQ(s["decodes"].get<int64_t>(), decodes) << "step " << i;
    EXPECT_EQ(s["padded_rows"], 1);
    ASSERT_EQ(s["layers"].size(), 2u);
    for (const auto& l : s["layers"]) {
      const int ratio = l["ratio"].get<int>();
      const dsv41kv::test::WorkloadFacts f = dsv41kv::test::workload_facts(w, i, ratio);
      EXPECT_EQ(l["latents"].get<int64_t>(), f.latents) << "step " << i << " ratio " << ratio;
      EXPECT_EQ(l["ring_rows_written"].get<int64_t>(), f.ring_rows) << "step " << i << " ratio " << ratio;
      EXPECT_EQ(l["records_per_format"].get<int64_t>(), f.records) << "step " << i << " ratio " << ratio;
      total[ratio].latents += f.latents;
      total[ratio].ring_rows += f.ring_rows;
      total[ratio].records += f.records;
    }
  }
  EXPECT_EQ(tokens, js["tokens"].get<int64_t>());
  for (const auto& L : js["layers"]) {
    const dsv41kv::test::WorkloadFacts& f = total[L["ratio"].get<int>()];
    EXPECT_GT(f.latents, 0);
    EXPECT_EQ(L["latents"].get<int64_t>(), f.latents);
    EXPECT_EQ(L["ring_rows_written"].get<int64_t>(), f.ring_rows);
    EXPECT_EQ(L["records"].get<int64_t>(), f.records * kFormats);
    EXPECT_EQ(L["readback_bad_records"].get<int64_t>(), 0);
  }
  EXPECT_GT(total[2].ring_rows, 0);
}

// The read-back check can fail: held against the negated latents (the test seam), every record
// of every step is bad, the run exits 1 and names the first bad record.
TEST(Demo, AWrongExpectationFailsTheReadBackCheck) {
  TempDir tmp;
  const auto r = run_cli("demo --write-path --json --ratio 2 --format v4_584 --mutation wrong-expectation --config '" +
                             small_config(tmp) + "'", tmp);
  EXPECT_EQ(r.code, 1) << r.err;
  const auto js = nlohmann::json::parse(r.out);
  ASSERT_EQ(js["layers"].size(), 1u);
  const auto& L = js["layers"][0];
  EXPECT_GT(L["records"].get<int64_t>(), 0);
  EXPECT_EQ(L["readback_bad_records"], L["records"]);
  EXPECT_NE(r.err.find("v4_584: token "), std::string::npos) << r.err;
}

TEST(Demo, SameSeedSameOutputDifferentSeedDifferentWorkload) {
  TempDir tmp;
  auto strip_times = [](nlohmann::json js) {
    for (auto& s : js["steps"]) s.erase("ms");
    for (auto& l : js["layers"]) {
      l.erase("projection_tokens_per_s");
      l.erase("compress_insert_tokens_per_s");
    }
    return js;
  };
  const std::string path = small_config(tmp);
  const std::string flags = "demo --write-path --json --ratio 2 --format v4_584 --config '" + path + "'";
  const auto a = run_cli(flags + " --seed 3", tmp);
  const auto b = run_cli(flags + " --seed 3", tmp);
  const auto c = run_cli(flags + " --seed 4", tmp);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(strip_times(nlohmann::json::parse(a.out)), strip_times(nlohmann::json::parse(b.out)));
  EXPECT_NE(strip_times(nlohmann::json::parse(a.out)), strip_times(nlohmann::json::parse(c.out)));
}

TEST(Demo, BadFlagsExitTwoWithTheArgumentNamed) {
  TempDir tmp;
  auto r = run_cli("demo --write-path --ratio 3", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--ratio"), std::string::npos) << r.err;
  r = run_cli("demo --write-path --format fp16", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("fp16"), std::string::npos) << r.err;
  r = run_cli("demo --write-path --config '" + (tmp / "missing.json") + "'", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  r = run_cli("demo --write-path --seed notanumber", tmp);
  EXPECT_EQ(r.code, 2);
  // not wrapped (-1) or saturated (2^64) into a seed
  for (const std::string seed : {"-1", "18446744073709551616"}) {
    r = run_cli("demo --write-path --seed " + seed, tmp);
    EXPECT_EQ(r.code, 2) << seed;
    EXPECT_NE(r.err.find("--seed: '" + seed + "' is not an integer"), std::string::npos) << r.err;
  }
}
