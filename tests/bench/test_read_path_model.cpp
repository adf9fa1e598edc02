// The read-path bench's counts and workload builders (bench/read_path_model.hpp): FlashMLA's
// FLOP count reproduces the baseline's (42.9 GFLOP at batch 256), the byte counts worked out by
// hand, and the builders' workloads hold what their comments promise (recounted here from the
// arrays they return).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "bench/read_path_model.hpp"
#include "dsv41kv/indexer.hpp"

namespace dsv41kv::test {
namespace {

using namespace bench;

TEST(ReadPathModel, FlopsAndBytesAsFlashMlaCountsThem) {
  // ../shared/baselines/README.md: 42.9 GFLOP at batch 256 (64 heads, s_q 2, 128 + 512 keys)
  EXPECT_EQ(attention_flops(64, 256 * 2, 640), 2.0 * 64 * 512 * 640 * 1024);
  EXPECT_NEAR(attention_flops(64, 512, 640) / 1e9, 42.9, 0.05);
  // 174.3 us at batch 256 is 246 TFLOPS in the baseline table
  EXPECT_NEAR(attention_flops(64, 512, 640) / 174.3e-6 / 1e12, 246.0, 0.5);
  // bytes: 10 unique SWA records of 584 + 20 of 288, q and o of 4 tokens x 8 heads x 512 bf16
  EXPECT_EQ(decode_bytes(10, 584, 20, 288, 8, 4), 10 * 584 + 20 * 288 + 2 * (4 * 8 * 512 * 2));
  // prefill: FlashMLA's count, valid indices x 512 x 2 + s_q x h_q x 1024 x 2
  EXPECT_EQ(prefill_bytes(640 * 3, 64, 3), int64_t{640} * 3 * 1024 + int64_t{3} * 64 * 1024 * 2);
  EXPECT_EQ(indexer_flops(10), 2.0 * 32 * 128 * 10);
  EXPECT_EQ(indexer_bytes(10), 1320);
}

TEST(ReadPathModel, DecodeWorkload) {
  for (const int64_t batch : {int64_t{2}, int64_t{64}})
    for (const int keys : {512, 300}) {
      const DecodeWorkload w = make_decode_workload(batch, keys, 7);
      ASSERT_EQ(w.tokens, batch * 2);
      EXPECT_EQ(w.swa_pages, batch * 4);
      EXPECT_EQ(w.cmp_pages, batch * 64);
      ASSERT_EQ(w.swa_idx.size(), static_cast<size_t>(w.tokens * 128));
      ASSERT_EQ(w.cmp_idx.size(), static_cast<size_t>(w.tokens * 512));
      int64_t unique_swa = 0, unique_cmp = 0;
      std::set<int32_t> all_swa_pages, all_cmp_pages;
      for (int64_t b = 0; b < batch; ++b) {
        std::set<int32_t> swa, cmp, swa_pages, cmp_pages;
        for (int64_t j = 0; j < 2; ++j) {
          const int64_t t = b * 2 + j;
          EXPECT_EQ(w.swa_len[static_cast<size_t>(t)], 128);
          EXPECT_EQ(w.cmp_len[static_cast<size_t>(t)], keys);
          for (int k = 0; k < 128; ++k) {
            const int32_t s = w.swa_idx[static_cast<size_t>(t * 128 + k)];
            ASSERT_GE(s, 0);
            ASSERT_LT(s, w.swa_pages * 64);
            swa.insert(s);
            swa_pages.insert(s / 64);
          }
          std::set<int32_t> row;
          for (int k = 0; k < 512; ++k) {
            const int32_t s = w.cmp_idx[static_cast<size_t>(t * 512 + k)];
            if (k >= keys) {
              EXPECT_EQ(s, -1);
              continue;
            }
            ASSERT_GE(s, 0);
            ASSERT_LT(s, w.cmp_pages * 32);
            row.insert(s);
            cmp.insert(s);
            cmp_pages.insert(s / 32);
          }
          EXPECT_EQ(row.size(), static_cast<size_t>(keys)) << "distinct keys per token";
        }
        // the window of the two tokens: 129 slots of the request's 4 pages
        EXPECT_EQ(swa.size(), 129u);
        EXPECT_LE(swa_pages.size(), 4u);
        EXPECT_LE(cmp_pages.size(), 64u);
        for (int32_t p : swa_pages) EXPECT_TRUE(all_swa_pages.insert(p).second) << "a page of two requests";
        for (int32_t p : cmp_pages) EXPECT_TRUE(all_cmp_pages.insert(p).second) << "a page of two requests";
        unique_swa += static_cast<int64_t>(swa.size());
        unique_cmp += static_cast<int64_t>(cmp.size());
      }
      EXPECT_EQ(w.unique_swa, unique_swa);
      EXPECT_EQ(w.unique_cmp, unique_cmp);
      EXPECT_EQ(w.unique_swa, batch * 129);
      // the same seed, the same workload; another, another
      EXPECT_EQ(make_decode_workload(batch, keys, 7).cmp_idx, w.cmp_idx);
      EXPECT_NE(make_decode_workload(batch, keys, 8).cmp_idx, w.cmp_idx);
    }
}

TEST(ReadPathModel, IndexerWorkload) {
  const IndexerWorkload p = make_indexer_workload(3, 4096, false, 1);
  EXPECT_EQ(p.tokens, 6);
  EXPECT_EQ(p.pages_per_req, 64);
  ASSERT_EQ(p.positions.size(), 6u);
  EXPECT_EQ(p.positions[0], 2 * 4096 - 2);  // sees 4095 entries
  EXPECT_EQ(p.positions[1], 2 * 4096 - 1);  // sees 4096
  EXPECT_EQ(p.token_to_req[5], 2);
  EXPECT_EQ(p.block_table[64], 64);
  EXPECT_EQ(p.entries_scored, 3 * (4095 + 4096));
  EXPECT_EQ(p.unique_entries, 3 * 4096);
  EXPECT_TRUE(p.candidates.empty());

  for (const int64_t n_c : {int64_t{4096}, int64_t{65536}, int64_t{1000}}) {
    const IndexerWorkload c = make_indexer_workload(2, n_c, true, 5);
    ASSERT_EQ(c.candidates.size(), static_cast<size_t>(4 * kCandidateTopkBlocks));
    int64_t scored = 0, unique = 0;
    for (int64_t b = 0; b < 2; ++b) {
      std::set<int64_t> entries;
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t t = b * 2 + j, n = (c.positions[static_cast<size_t>(t)] + 1) / 2;
        EXPECT_EQ(n, n_c - 1 + j);
        const int64_t nb = (n + 7) / 8, want = std::min<int64_t>(2048, nb);
        const int32_t* row = c.candidates.data() + t * kCandidateTopkBlocks;
        for (int64_t k = 0; k < kCandidateTopkBlocks; ++k) {
          if (k >= want) {
            EXPECT_EQ(row[k], -1);
            continue;
          }
          ASSERT_GE(row[k], 0);
          ASSERT_LT(row[k], nb);
          if (k > 0) EXPECT_GT(row[k], row[k - 1]) << "strictly ascending";
          for (int64_t i = row[k] * 8; i < std::min<int64_t>(n, row[k] * 8 + 8); ++i) {
            ++scored;
            entries.insert(i);
          }
        }
      }
      unique += static_cast<int64_t>(entries.size());
    }
    EXPECT_EQ(c.entries_scored, scored) << n_c;
    EXPECT_EQ(c.unique_entries, unique) << n_c;
  }
}

TEST(ReadPathModel, PrefillWorkload) {
  for (const int64_t s_kv : {int64_t{65536}, int64_t{1000}, int64_t{640}}) {
    const PrefillWorkload w = make_prefill_workload(50, s_kv, 3);
    ASSERT_EQ(w.indices.size(), 50u * 640);
    EXPECT_EQ(w.valid_indices(), 50 * 640);
    for (int64_t t = 0; t < 50; ++t) {
      std::set<int32_t> row(w.indices.begin() + t * 640, w.indices.begin() + (t + 1) * 640);
      EXPECT_EQ(row.size(), 640u) << "distinct rows, s_kv " << s_kv;
      EXPECT_GE(*row.begin(), 0);
      EXPECT_LT(*row.rbegin(), s_kv);
    }
  }
}

TEST(ReadPathModel, SampledRequests) {
  EXPECT_EQ(sample_requests(256, 4), (std::vector<int64_t>{0, 85, 170, 255}));
  EXPECT_EQ(sample_requests(2, 4), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sample_requests(1, 4), (std::vector<int64_t>{0}));
  EXPECT_EQ(sample_requests(10, 1), (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace dsv41kv::test
