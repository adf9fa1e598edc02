// `dsv41kv bench --device cuda --read` end to end on its smallest lines: each op runs, its check
// against the CPU backend finds nothing wrong, and the JSON carries the fields
// bench/peers/join_read.py reads, with the FLOP and byte counts of bench/read_path_model.hpp.
// The timings themselves are the device-check bench-read stage's; under the sanitizer stage
// (DSV41KV_GPU_TEST_SMALL) this skips: the bench's launches are the library's kernels, which
// their own suites check there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/read_path_model.hpp"
#include "dsv41kv/device.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

TEST(ReadBenchCliGpu, SmallestLinesRunCleanWithTheJoinFields) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("DSV41KV_GPU_TEST_SMALL") != nullptr) GTEST_SKIP() << "sanitizer stage (DSV41KV_GPU_TEST_SMALL)";
  TempDir tmp;
  const std::string common = "bench --device cuda --read --json --iters 3 --samples 2 ";
  for (const char* line : {"--op decode --batch 2 --heads 64 --record v4_584",
                           "--op decode --batch 2 --heads 128 --record nvfp4_288",
                           "--op indexer --nc 4096 --batch 3"}) {
    const CliRun r = run_cli(common + line, tmp);
    ASSERT_EQ(r.code, 0) << line << "\n" << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("impl"), "dsv41kv");
    EXPECT_GT(j.at("copy_GBps").get<double>(), 100.0);
    EXPECT_EQ(j.at("total_wrong"), 0) << line;
    const auto& rows = j.at("rows");
    ASSERT_EQ(rows.size(), std::string(line).find("indexer") != std::string::npos ? 2u : 1u) << line;
    for (const auto& row : rows) {
      for (const char* f : {"op", "heads", "s_q", "batch", "tokens", "swa_keys", "cmp_keys", "record", "swa_record",
                            "role", "n_c", "ms", "us", "flops", "bytes", "TFLOPS", "GBps", "copy_fraction", "wrong",
                            "checked", "iters"})
        EXPECT_TRUE(row.contains(f)) << line << ": no field " << f;
      EXPECT_GT(row.at("ms").get<double>(), 0.0) << line;
      EXPECT_GT(row.at("checked").get<int64_t>(), 0) << line;
      EXPECT_EQ(row.at("wrong"), 0) << line;
      if (row.at("op") == "decode") {
        const int h = row.at("heads");
        EXPECT_EQ(row.at("flops").get<double>(), bench::attention_flops(h, 4, 640)) << line;
        const bench::DecodeWorkload w = bench::make_decode_workload(2, 512, 0);
        EXPECT_EQ(row.at("tokens"), w.tokens);
      } else {
        EXPECT_EQ(row.at("batch"), 3);
        EXPECT_EQ(row.at("n_c"), 4096);
        // plain: every token scores its visible entries, each request's union is n_c entries
        if (row.at("role") == "plain") {
          EXPECT_EQ(row.at("flops").get<double>(), bench::indexer_flops(3 * (4095 + 4096)));
          EXPECT_EQ(row.at("bytes").get<double>(), static_cast<double>(bench::indexer_bytes(3 * 4096)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsv41kv::test
