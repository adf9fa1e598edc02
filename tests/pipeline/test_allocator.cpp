// The cache allocator (allocator.hpp): a worked example of page growth and SWA release, a random
// workload of requests joining, prefilling in chunks, decoding (with drafts) and leaving, checked
// after every step against the invariants of SPEC 3.1-3.5 (every position a step reads has its
// page, no page held twice, null page never handed out, every id back after the last release),
// capacity errors that take nothing, and the E8 cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dsv41kv/allocator.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {
namespace {

#define EXPECT_ERROR(expr, code, fragment) expect_error([&] { (void)(expr); }, code, fragment)

using pipeline::AllocatorConfig;
using pipeline::CacheAllocator;
using pipeline::StepRequest;

AllocatorConfig small_config() {
  AllocatorConfig c;
  c.swa_pages = 64;
  c.swa_page_tokens = 32;
  c.swa_block_table_width = 40;  // 1280 positions
  c.c1a = {0, 32, 20};           // S_1 = 64 (default), 20 logical pages
  c.c2a = {0, 32, 20};           // S_2 = 32 (default)
  c.ring_blocks = 9;
  return c;
}

TEST(CacheAllocator, PagesGrowWithThePositionsAndSwaPagesLeaveBelowTheWindow) {
  CacheAllocator a(small_config());
  a.add(7);
  EXPECT_EQ(a.pages(7).ring_block, 1);  // lowest free block first
  EXPECT_EQ(a.free_ring_blocks(), 7);
  // prefill of positions 0..99: SWA pages 0..3, c1a states 0..99 -> logical pages 0, 1,
  // c2a states 0..49 -> logical pages 0, 1
  StepRequest q = a.prepare(7, 0, 100);
  EXPECT_EQ(q.num_computed, 0);
  EXPECT_EQ(q.query_len, 100);
  EXPECT_EQ(q.ring_block, 1);
  ASSERT_EQ(q.swa_pages.size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(q.swa_pages.begin(), q.swa_pages.begin() + 5), (std::vector<int32_t>{1, 2, 3, 4, 0}));
  EXPECT_EQ(std::vector<int32_t>(q.c1a_pages.begin(), q.c1a_pages.begin() + 3), (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(std::vector<int32_t>(q.c2a_pages.begin(), q.c2a_pages.begin() + 3), (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(a.free_swa_pages(), 63 - 4);
  // decodes: at position 159 the window starts at 32, so page 0's id 1 goes back and serves
  // logical page 5 (positions 160..191) from position 160 on
  for (int64_t p = 100; p < 191; ++p) q = a.prepare(7, p, 1);
  EXPECT_EQ(std::vector<int32_t>(q.swa_pages.begin(), q.swa_pages.begin() + 7),
            (std::vector<int32_t>{0, 2, 3, 4, 5, 1, 0}));  // window start 190 - 127 = 63: page 1 still read
  q = a.prepare(7, 191, 1);  // window start 64: page 1 (positions 32..63) goes
  EXPECT_EQ(std::vector<int32_t>(q.swa_pages.begin(), q.swa_pages.begin() + 7),
            (std::vector<int32_t>{0, 0, 3, 4, 5, 1, 0}));
  EXPECT_EQ(a.pages(7).swa_released, 2);
  // the lowest free ids first: a new request gets pages 2 and 6
  a.add(8);
  q = a.prepare(8, 0, 40);
  EXPECT_EQ(std::vector<int32_t>(q.swa_pages.begin(), q.swa_pages.begin() + 2), (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(q.ring_block, 2);
  // compressed pages are never released before the request ends
  EXPECT_EQ(a.pages(7).c1a[0], 1);
  a.release(7);
  a.release(8);
  EXPECT_EQ(a.free_swa_pages(), 63);
  EXPECT_EQ(a.free_compressed_pages(1), 31);
  EXPECT_EQ(a.free_compressed_pages(2), 31);
  EXPECT_EQ(a.free_ring_blocks(), 8);
}

TEST(CacheAllocator, RandomWorkloadKeepsEveryInvariant) {
  const uint64_t seed = run_seed() ^ 0xA11C;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  AllocatorConfig cfg = small_config();
  cfg.swa_pages = 200;
  cfg.c1a.num_pages = 120;
  cfg.c2a.num_pages = 70;
  cfg.ring_blocks = 12;
  CacheAllocator a(cfg);
  std::map<int64_t, int64_t> next_pos;  // live requests and their num_computed
  int64_t next_id = 100;
  for (int step = 0; step < 400; ++step) {
    // requests join and leave
    if (next_pos.size() < 8 && rng.integer(0, 2) == 0 && a.free_ring_blocks() > 0) {
      a.add(next_id);
      next_pos[next_id++] = 0;
    }
    if (!next_pos.empty() && rng.integer(0, 9) == 0) {
      auto it = next_pos.begin();
      std::advance(it, rng.integer(0, static_cast<int64_t>(next_pos.size()) - 1));
      a.release(it->first);
      next_pos.erase(it);
    }
    for (auto& [id, nc] : next_pos) {
      const int64_t room = cfg.swa_block_table_width * cfg.swa_page_tokens - nc;
      int64_t len = nc < 300 ? rng.integer(0, 160) : rng.integer(1, 3);  // prefill chunks, then decodes with drafts
      len = std::min(len, room);
      StepRequest q;
      try {
        q = a.prepare(id, nc, len);
      } catch (const Error& e) {
        ASSERT_EQ(static_cast<int>(e.code()), static_cast<int>(ErrorCode::kCapacity)) << e.what();
        continue;  // this step does not schedule the request
      }
      if (len == 0) continue;  // not in this step: its rows are not read (and nothing is released)
      const int64_t last = nc + len - 1;
      const int64_t ws = std::max<int64_t>(nc - 127, 0);
      for (int64_t p = ws; p <= last; ++p) ASSERT_GT(q.swa_pages[static_cast<size_t>(p / 32)], 0) << "position " << p;
      for (int64_t k = 0; k < ws / 32; ++k) ASSERT_EQ(q.swa_pages[static_cast<size_t>(k)], 0) << "page " << k;
      for (int r : {1, 2}) {
        const auto& row = r == 1 ? q.c1a_pages : q.c2a_pages;
        for (int64_t s = 0; s < (last + 1) / r; ++s) ASSERT_GT(row[static_cast<size_t>(s / (64 / r))], 0);
      }
      // drafts: accept some of the step's tokens (at least one), as an engine rolls back
      nc += len <= 3 && len > 0 ? rng.integer(1, len) : len;
    }
    // no id held twice, none is the null id, held + free = all
    std::set<int32_t> swa, c[2], ring;
    for (const auto& [id, nc] : next_pos) {
      const auto& rp = a.pages(id);
      for (int32_t pg : rp.swa) {
        if (pg) {
          ASSERT_TRUE(swa.insert(pg).second) << "SWA page " << pg << " held twice";
        }
      }
      for (int32_t pg : rp.c1a) {
        if (pg) {
          ASSERT_TRUE(c[0].insert(pg).second) << "c1a page " << pg << " held twice";
        }
      }
      for (int32_t pg : rp.c2a) {
        if (pg) {
          ASSERT_TRUE(c[1].insert(pg).second) << "c2a page " << pg << " held twice";
        }
      }
      ASSERT_GT(rp.ring_block, 0);
      ASSERT_TRUE(ring.insert(rp.ring_block).second);
    }
    ASSERT_EQ(static_cast<int64_t>(swa.size()) + a.free_swa_pages(), cfg.swa_pages - 1);
    ASSERT_EQ(static_cast<int64_t>(c[0].size()) + a.free_compressed_pages(1), cfg.c1a.num_pages - 1);
    ASSERT_EQ(static_cast<int64_t>(c[1].size()) + a.free_compressed_pages(2), cfg.c2a.num_pages - 1);
    ASSERT_EQ(static_cast<int64_t>(ring.size()) + a.free_ring_blocks(), cfg.ring_blocks - 1);
  }
  for (const auto& [id, nc] : next_pos) a.release(id);
  EXPECT_EQ(a.free_swa_pages(), cfg.swa_pages - 1);
  EXPECT_EQ(a.free_ring_blocks(), cfg.ring_blocks - 1);
}

TEST(CacheAllocator, RunningOutTakesNothing) {
  AllocatorConfig cfg = small_config();
  cfg.swa_pages = 4;  // 3 usable pages
  CacheAllocator a(cfg);
  a.add(1);
  (void)a.prepare(1, 0, 64);  // pages 1, 2
  a.add(2);
  const auto before = a.pages(2);
  expect_error([&] { (void)a.prepare(2, 0, 64); }, ErrorCode::kCapacity,
               {"request 2 needs 2 more SWA pages but 1 are free"});
  EXPECT_EQ(a.pages(2).swa, before.swa);
  EXPECT_EQ(a.pages(2).c1a, before.c1a);
  EXPECT_EQ(a.free_swa_pages(), 1);
  EXPECT_EQ(a.free_compressed_pages(1), 30);  // c1a pages were not taken either
  // ring blocks
  AllocatorConfig rc = small_config();
  rc.ring_blocks = 2;
  CacheAllocator b(rc);
  b.add(1);
  EXPECT_ERROR(b.add(2), ErrorCode::kCapacity, "needs 1 more ring blocks but 0 are free");
  EXPECT_FALSE(b.live(2));
}

TEST(CacheAllocator, BadCallsAreE8) {
  CacheAllocator a(small_config());
  EXPECT_ERROR(a.prepare(3, 0, 1), ErrorCode::kInvalidArgument, "id: 3, expected a live request");
  EXPECT_ERROR(a.release(3), ErrorCode::kInvalidArgument, "expected a live request");
  EXPECT_ERROR(a.pages(3), ErrorCode::kInvalidArgument, "expected a live request");
  a.add(3);
  EXPECT_ERROR(a.add(3), ErrorCode::kInvalidArgument, "3 is already live");
  EXPECT_ERROR(a.prepare(3, -1, 1), ErrorCode::kInvalidArgument, "num_computed: -1 (request 3)");
  EXPECT_ERROR(a.prepare(3, 0, -2), ErrorCode::kInvalidArgument, "query_len: -2 (request 3)");
  EXPECT_ERROR(a.prepare(3, 1270, 20), ErrorCode::kInvalidArgument, "logical SWA page 40, expected < swa_block_table_width = 40");
  EXPECT_ERROR(a.free_compressed_pages(4), ErrorCode::kMetadataRatio, "ratio 4");
  // c1a: 20 pages of 64 states = 1280 positions; c2a: 20 pages of 32 states = 1280 positions
  AllocatorConfig narrow = small_config();
  narrow.c1a.block_table_width = 2;
  CacheAllocator b(narrow);
  b.add(1);
  EXPECT_ERROR(b.prepare(1, 0, 129), ErrorCode::kInvalidArgument,
               "state 128 of ratio 1 is on logical page 2, expected < c1a.block_table_width = 2");
  // a window start on a page given back before
  (void)a.prepare(3, 0, 300);  // window start 0
  (void)a.prepare(3, 300, 1);  // window start 173: pages 0..4 go
  EXPECT_ERROR(a.prepare(3, 200, 1), ErrorCode::kInvalidArgument, "on SWA page 2 that an earlier step gave back");
  // configurations
  AllocatorConfig c = small_config();
  c.swa_pages = 1;
  EXPECT_ERROR(CacheAllocator{c}, ErrorCode::kInvalidArgument, "swa_pages: 1, expected 2 .. 2^31");
  c = small_config();
  c.ring_blocks = 1;
  EXPECT_ERROR(CacheAllocator{c}, ErrorCode::kInvalidArgument, "ring_blocks: 1");
  c = small_config();
  c.c1a.num_pages = 1;
  EXPECT_ERROR(CacheAllocator{c}, ErrorCode::kInvalidArgument, "c1a.num_pages: 1");
  c.c1a.num_pages = 0;  // not served: no row, no check of its other fields
  c.c1a.block_table_width = 0;
  CacheAllocator d(c);
  d.add(1);
  EXPECT_TRUE(d.prepare(1, 0, 5).c1a_pages.empty());
}

}  // namespace
}  // namespace dsv41kv::test
