// The write-path bench's traffic model (bench/traffic_model.hpp) against the byte counts of the
// vLLM baseline (../shared/baselines/vllm_triton_h200.json, found as `dsv41kv bench` finds it),
// and its fused count, which the baseline does not have, against figures worked out by hand.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <string>

#include "bench/baseline.hpp"
#include "bench/traffic_model.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::test {
namespace {

TEST(TrafficModel, ReproducesTheBaselineByteCounts) {
  const bench::BaselineLookup l = bench::lookup_baseline("");
  if (!l.baseline) GTEST_SKIP() << "no baseline at " << fmt::format("{}", fmt::join(l.tried, " or "));
  const bench::Baseline& b = *l.baseline;
  // every workload and ratio of the bench has its row
  for (const bench::Workload& w : bench::kWorkloads)
    for (int ratio : {1, 2})
      EXPECT_NE(b.find(ratio, w.name), nullptr) << b.path << ": " << w.name << " ratio " << ratio;
  for (const bench::BaselineRow& r : b.rows) {
    const std::string where = fmt::format("{}: {} ratio {}", b.path, r.workload, r.ratio);
    const bench::Workload* w = bench::find_workload(r.workload);
    ASSERT_NE(w, nullptr) << where << ": not a bench workload";
    ASSERT_TRUE(r.ratio == 1 || r.ratio == 2) << where;
    const bench::TrafficShape s = bench::traffic_shape(*w, r.ratio);
    ASSERT_TRUE(r.tokens.has_value()) << where << ": no tokens";
    EXPECT_EQ(*r.tokens, s.tokens) << where;
    ASSERT_TRUE(r.fused_bytes.has_value()) << where << ": no fused_bytes";
    EXPECT_EQ(*r.fused_bytes, bench::compress_bytes(s)) << where << ": fused_bytes (vLLM's compress launch)";
    for (RecordFormat f : bench::kWritePathFormats) {
      const RecordInfo& ri = record_info(f);
      const auto it = r.insert_bytes.find(ri.name);
      ASSERT_NE(it, r.insert_bytes.end()) << where << ": no insert_" << ri.name << "_bytes";
      EXPECT_EQ(it->second, bench::insert_bytes(s, ri.record_bytes)) << where << ": insert_" << ri.name << "_bytes";
    }
  }
}

TEST(TrafficModel, FusedCountsReadsRingTailAndRecordsButNoLatent) {
  const bench::Workload& decode = *bench::find_workload("decode256");
  const bench::Workload& prefill = *bench::find_workload("prefill256k");
  // 256K ratio 1: 262144 tokens x (2048 kv_score + 584 record)
  EXPECT_EQ(bench::fused_bytes(bench::traffic_shape(prefill, 1), 584), int64_t{262144} * (2048 + 584));
  // 256K ratio 2: 262144 x 4096 kv_score + 16 requests x 8 ring rows x 4096 + 131072 x 288 record
  EXPECT_EQ(bench::fused_bytes(bench::traffic_shape(prefill, 2), 288),
            int64_t{262144} * 4096 + 16 * 8 * 4096 + int64_t{131072} * 288);
  // decode ratio 2: 256 x 4096 kv_score + 256 requests x 1 ring row x 4096 + 128 x 528 record
  EXPECT_EQ(bench::fused_bytes(bench::traffic_shape(decode, 2), 528), 256 * 4096 + 256 * 4096 + 128 * 528);
  EXPECT_EQ(bench::find_workload("decode1"), nullptr);
}

}  // namespace
}  // namespace dsv41kv::test
