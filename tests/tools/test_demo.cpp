// The main job: `dsv41kv demo` runs its built-in workload end to end, writes what it says it
// writes, reads every record back correctly, and rejects bad flags with exit 2.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/cli.hpp"
#include "support/paths.hpp"

using dsv41kv::test::run_cli;
using dsv41kv::test::TempDir;

TEST(Demo, JsonRunWritesLatentsRingRowsAndRecordsThatReadBack) {
  TempDir tmp;
  const auto r = run_cli("demo --json --threads 2", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto js = nlohmann::json::parse(r.out);
  ASSERT_EQ(js["layers"].size(), 2u);
  for (const auto& L : js["layers"]) {
    EXPECT_GT(L["latents"].get<int64_t>(), 0);
    EXPECT_GT(L["records"].get<int64_t>(), 0);
    EXPECT_EQ(L["readback_bad_records"].get<int64_t>(), 0);
    if (L["ratio"] == 2) {
      EXPECT_GT(L["ring_rows_written"].get<int64_t>(), 0);
    }
  }
  // Every step has one padded row; ratio 2 emits at most one latent per two tokens.
  int64_t tokens = 0;
  for (const auto& s : js["steps"]) {
    EXPECT_EQ(s["padded_rows"], 1);
    tokens += s["tokens"].get<int64_t>();
    const auto& l2 = s["layers"][0];
    EXPECT_EQ(l2["ratio"], 2);
    EXPECT_LE(l2["latents"].get<int64_t>(), (s["tokens"].get<int64_t>() + 1) / 2 + s["requests"].get<int64_t>());
  }
  EXPECT_EQ(tokens, js["tokens"].get<int64_t>());
  // Bytes per token of the records (SPEC 3.7): 292 for 584-byte records at ratio 2.
  bool saw = false;
  for (const auto& b : js["bytes_per_token"])
    if (b["ratio"] == 2 && b["format"] == "v4_584") {
      EXPECT_EQ(b["bytes_per_token"].get<double>(), 292.0);
      saw = true;
    }
  EXPECT_TRUE(saw);
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
  // A config.json with a small hidden size keeps this fast (and exercises --config).
  auto cfg = nlohmann::json::parse(dsv41kv::test::slurp(dsv41kv::test::source_dir() +
                                                        "/docs/examples/deepseek_v41_flash_config.json"));
  cfg["hidden_size"] = 256;
  const std::string path = tmp / "small.json";
  {
    std::ofstream(path) << cfg.dump();
  }
  const std::string flags = "demo --json --ratio 2 --format v4_584 --config '" + path + "'";
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
  auto r = run_cli("demo --ratio 3", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--ratio"), std::string::npos) << r.err;
  r = run_cli("demo --format fp16", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("fp16"), std::string::npos) << r.err;
  r = run_cli("demo --config '" + (tmp / "missing.json") + "'", tmp);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  r = run_cli("demo --seed notanumber", tmp);
  EXPECT_EQ(r.code, 2);
  // not wrapped (-1) or saturated (2^64) into a seed
  for (const std::string seed : {"-1", "18446744073709551616"}) {
    r = run_cli("demo --seed " + seed, tmp);
    EXPECT_EQ(r.code, 2) << seed;
    EXPECT_NE(r.err.find("--seed: '" + seed + "' is not an integer"), std::string::npos) << r.err;
  }
}
