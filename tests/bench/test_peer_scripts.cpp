// The FlashMLA side-by-side scripts of bench/peers on made-up inputs (their real inputs come from
// the device): join_read.py pairs the lines of both implementations and computes the speedup,
// refuses a file of the wrong implementation; merge_read.py merges per-op files and leaves out an
// unreadable one; flashmla_sparse.py --dry-run plans the workloads of bench/read_path_model.hpp
// and rejects bad arguments. Skipped without python3.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>

#include "bench/read_path_model.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

using nlohmann::json;

bool have_python3() { return std::system("command -v python3 > /dev/null 2>&1") == 0; }

std::string script(const std::string& name) { return std::string(DSV41KV_SOURCE_DIR) + "/bench/peers/" + name; }

CliRun python(const std::string& args, const TempDir& tmp) { return run_program("python3", args, tmp); }

json line(const std::string& op, int heads, int cmp_keys, int64_t batch, int64_t tokens, const std::string& record,
          double us, int64_t wrong = 0, const std::string& role = "", int64_t n_c = 0) {
  return {{"op", op},       {"heads", heads}, {"s_q", 2},         {"batch", batch}, {"tokens", tokens},
          {"swa_keys", op == "decode" ? 128 : 0}, {"cmp_keys", cmp_keys}, {"record", record},
          {"swa_record", record}, {"role", role}, {"n_c", n_c}, {"ms", us / 1e3}, {"us", us},
          {"flops", 1e9},   {"bytes", 1e8},   {"TFLOPS", 1e9 / (us * 1e-6) / 1e12},
          {"GBps", 1e8 / (us * 1e-6) / 1e9}, {"copy_fraction", 0.1}, {"wrong", wrong}, {"checked", 10},
          {"iters", 50}};
}

void write(const std::string& path, const json& j) { std::ofstream(path) << j.dump(); }

json doc(const std::string& impl, const json& rows) {
  int64_t wrong = 0;
  for (const json& r : rows) wrong += r.at("wrong").get<int64_t>();
  return {{"impl", impl}, {"device", "test"}, {"copy_GBps", 4200.0}, {"rows", rows}, {"total_wrong", wrong}};
}

TEST(PeerScripts, JoinPairsTheLinesAndComputesTheSpeedup) {
  if (!have_python3()) GTEST_SKIP() << "no python3";
  TempDir tmp;
  const std::string ours = tmp / "ours.json", fm = tmp / "fm.json", out = tmp / "joined.json";
  write(ours, doc("dsv41kv", json::array({line("decode", 64, 512, 256, 512, "v4_584", 150.0),
                                          line("decode", 64, 512, 256, 512, "nvfp4_288", 120.0),
                                          line("prefill", 64, 640, 1, 32768, "bf16", 9000.0),
                                          line("indexer", 0, 0, 128, 256, "fp8_132", 500.0, 0, "plain", 65536)})));
  write(fm, doc("flashmla", json::array({line("decode", 64, 512, 256, 512, "v4_584", 174.3),
                                         line("decode", 128, 1024, 256, 512, "v4_584", 400.0, 3),
                                         line("prefill", 64, 640, 1, 32768, "bf16", 10000.0)})));
  const CliRun r = python("'" + script("join_read.py") + "' '" + ours + "' '" + fm + "' --json '" + out + "'", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("1.16x"), std::string::npos) << r.out;
  const json j = json::parse(slurp(out));
  ASSERT_EQ(j.size(), 5u);  // 4 of ours + FlashMLA's 128 + 1024 line
  std::set<std::string> labels;
  for (const json& l : j) labels.insert(l.at("line").get<std::string>());
  EXPECT_EQ(labels.size(), 5u);
  EXPECT_DOUBLE_EQ(j[0].at("speedup").get<double>(), 174.3 / 150.0);
  EXPECT_TRUE(j[1].at("flashmla_us").is_null());  // no FlashMLA kernel reads the 288 record
  EXPECT_TRUE(j[1].at("speedup").is_null());
  EXPECT_DOUBLE_EQ(j[2].at("speedup").get<double>(), 10000.0 / 9000.0);
  EXPECT_TRUE(j[4].at("ours_us").is_null());
  EXPECT_EQ(j[4].at("flashmla_wrong"), 3);

  // a file of the wrong implementation, an unreadable file: exit 2 naming it
  const CliRun swapped = python("'" + script("join_read.py") + "' '" + fm + "' '" + ours + "'", tmp);
  EXPECT_EQ(swapped.code, 2);
  EXPECT_NE(swapped.err.find("not a dsv41kv read-bench JSON"), std::string::npos) << swapped.err;
  const CliRun missing = python("'" + script("join_read.py") + "' '" + ours + "' '" + tmp / "none.json" + "'", tmp);
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("none.json"), std::string::npos) << missing.err;
}

TEST(PeerScripts, MergeKeepsEveryReadableFile) {
  if (!have_python3()) GTEST_SKIP() << "no python3";
  TempDir tmp;
  const std::string a = tmp / "a.json", b = tmp / "b.json", out = tmp / "m.json";
  write(a, doc("dsv41kv", json::array({line("decode", 64, 512, 2, 4, "v4_584", 15.0, 2)})));
  write(b, doc("dsv41kv", json::array({line("prefill", 64, 640, 1, 32768, "bf16", 9000.0),
                                       line("prefill", 64, 640, 1, 131072, "bf16", 36000.0, 1)})));
  std::ofstream(tmp / "empty.json") << "";
  const CliRun r = python("'" + script("merge_read.py") + "' '" + out + "' '" + a + "' '" + tmp / "empty.json" + "' '" +
                              b + "' --table", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("empty.json: left out"), std::string::npos) << r.err;
  const json m = json::parse(slurp(out));
  EXPECT_EQ(m.at("impl"), "dsv41kv");
  EXPECT_EQ(m.at("rows").size(), 3u);
  EXPECT_EQ(m.at("total_wrong"), 3);
  EXPECT_NE(r.out.find("640x128K"), std::string::npos) << r.out;
  // files of two implementations are not merged
  const std::string f = tmp / "f.json";
  write(f, doc("flashmla", json::array()));
  EXPECT_NE(python("'" + script("merge_read.py") + "' '" + out + "' '" + a + "' '" + f + "'", tmp).code, 0);
}

TEST(PeerScripts, FlashMlaHarnessPlansTheBenchWorkloads) {
  if (!have_python3()) GTEST_SKIP() << "no python3";
  TempDir tmp;
  const CliRun r = python("'" + script("flashmla_sparse.py") + "' --dry-run", tmp);
  ASSERT_EQ(r.code, 0) << r.err;
  const json lines = json::parse(r.out).at("lines");
  // decode: 64 heads 128+512, 128 heads 128+512 and 128+1024, each at every bench batch; prefill at
  // both token counts
  std::set<std::tuple<int, int, int64_t>> decode;
  std::set<int64_t> prefill;
  for (const json& l : lines) {
    if (l.at("op") == "decode") {
      decode.insert({l.at("heads").get<int>(), l.at("cmp_keys").get<int>(), l.at("batch").get<int64_t>()});
      EXPECT_EQ(l.at("tokens").get<int64_t>(), 2 * l.at("batch").get<int64_t>());
    } else {
      EXPECT_EQ(l.at("op"), "prefill");
      EXPECT_EQ(l.at("heads"), bench::kPrefillHeads);
      EXPECT_EQ(l.at("cmp_keys"), bench::kPrefillKeys);
      prefill.insert(l.at("tokens").get<int64_t>());
    }
  }
  for (const bench::DecodeShape sh : bench::kDecodeShapes)
    for (const int64_t b : bench::kDecodeBatches) EXPECT_TRUE(decode.count({sh.heads, sh.cmp_keys, b})) << sh.heads << " " << b;
  for (const int64_t b : bench::kDecodeBatches) EXPECT_TRUE(decode.count({128, 1024, b})) << b;
  EXPECT_EQ(decode.size(), 15u);
  EXPECT_EQ(prefill, (std::set<int64_t>(std::begin(bench::kPrefillTokens), std::end(bench::kPrefillTokens))));

  const CliRun one = python("'" + script("flashmla_sparse.py") + "' --dry-run --op decode --heads 128 --cmp-keys 1024 --batch 64", tmp);
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(json::parse(one.out).at("lines").size(), 1u);
  for (const char* bad : {"--batch 3", "--op indexer", "--iters 0", "--tokens 1000"}) {
    const CliRun b = python("'" + script("flashmla_sparse.py") + "' --dry-run " + bad, tmp);
    EXPECT_EQ(b.code, 2) << bad;
    EXPECT_NE(b.err.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos) << bad << "\n" << b.err;
  }
}

}  // namespace
}  // namespace dsv41kv::test
