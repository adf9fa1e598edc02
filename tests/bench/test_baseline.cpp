// Reading the vLLM baseline (bench/baseline.hpp): a file that cannot be read or is not a
// baseline is an error naming it; the figures and byte counts of a good one are kept as written.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "bench/baseline.hpp"
#include "dsv41kv/common.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Baseline, UnreadableOrMalformedFileIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string missing = tmp / "missing.json", broken = tmp / "broken.json", no_rows = tmp / "no_rows.json";
  write(broken, "{\"copy_GBps\": 4000, \"rows\": [");
  write(no_rows, "{\"copy_GBps\": 4000}");
  struct Case {
    std::string path;
    ErrorCode code;
  };
  const Case cases[] = {{missing, ErrorCode::kIo}, {broken, ErrorCode::kFormat}, {no_rows, ErrorCode::kFormat}};
  for (const Case& c : cases) {
    try {
      bench::lookup_baseline(c.path);
      ADD_FAILURE() << c.path << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << c.path << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.path), std::string::npos) << e.what();
    }
  }
}

TEST(Baseline, KeepsTheFiguresOfEachRow) {
  TempDir tmp;
  const std::string path = tmp / "b.json";
  write(path, R"({"copy_GBps": 4000.5, "rows": [
    {"ratio": 2, "workload": "decode256", "tokens": 256, "fused_ms": 0.25, "fused_bytes": 2228224,
     "insert_mxfp8_528_ms": 0.125, "insert_mxfp8_528_bytes": 198656},
    {"ratio": 1, "workload": "prefill32k", "fused_ms": 0.5}]})");
  const bench::BaselineLookup l = bench::lookup_baseline(path);
  ASSERT_TRUE(l.baseline.has_value());
  const bench::Baseline& b = *l.baseline;
  EXPECT_EQ(b.path, path);
  EXPECT_EQ(l.tried, std::vector<std::string>{path});
  EXPECT_EQ(b.copy_GBps, 4000.5);
  ASSERT_EQ(b.rows.size(), 2u);
  const bench::BaselineRow* r = b.find(2, "decode256");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->tokens, 256);
  EXPECT_EQ(r->fused_ms, 0.25);
  EXPECT_EQ(r->fused_bytes, 2228224);
  EXPECT_EQ(r->insert_ms.at("mxfp8_528"), 0.125);
  EXPECT_EQ(r->insert_bytes.at("mxfp8_528"), 198656);
  EXPECT_EQ(r->insert_ms.count("v4_584"), 0u);
  const bench::BaselineRow* p = b.find(1, "prefill32k");
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->tokens.has_value());
  EXPECT_FALSE(p->fused_bytes.has_value());
  EXPECT_EQ(b.find(1, "decode256"), nullptr);
}

}  // namespace
}  // namespace dsv41kv::test
