// CacheAllocator (allocator.hpp): free lists of page ids and ring blocks, lowest id first.
#include "dsv41kv/allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "core/validate.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::pipeline {
namespace {

constexpr const char* kOp = "CacheAllocator";

// Ids 1 .. n-1, highest first.
std::vector<int32_t> ids_below(int64_t n) {
  std::vector<int32_t> v;
  for (int64_t i = n - 1; i >= 1; --i) v.push_back(static_cast<int32_t>(i));
  return v;
}

int32_t take(std::vector<int32_t>& free) {
  const int32_t id = free.back();
  free.pop_back();
  return id;
}

void give_back(std::vector<int32_t>& free, int32_t id) {
  free.insert(std::lower_bound(free.begin(), free.end(), id, std::greater<>()), id);
}

[[noreturn]] void no_room(const char* pool, int64_t id, int64_t need, int64_t have) {
  fail(ErrorCode::kCapacity,
       fmt::format("{}: request {} needs {} more {} but {} are free", kOp, id, need, pool, have));
}

int64_t ratio_index(int r) {
  if (r != 1 && r != 2)
    fail(ErrorCode::kMetadataRatio, fmt::format("{}: compressed pages of ratio {}, expected 1 or 2", kOp, r));
  return r - 1;
}

}  // namespace

AllocatorConfig allocator_config(const ServingConfig& s) {
  AllocatorConfig a;
  a.swa_pages = s.swa.num_pages;
  a.swa_page_tokens = s.swa.page_tokens;
  a.swa_block_table_width = s.swa.block_table_width;
  a.c1a = s.c1a;
  a.c2a = s.c2a;
  a.ring_blocks = s.serves(2) ? s.ring_blocks : 0;
  return a;
}

void validate(const AllocatorConfig& c) {
  const char* op = "AllocatorConfig";
  auto need = [&](bool ok, const char* field, int64_t v, const char* want) {
    if (!ok) detail::bad_arg(op, field, fmt::format("{}, expected {}", v, want));
  };
  constexpr int64_t kMaxIds = int64_t{1} << 31;
  need(c.swa_pages >= 2 && c.swa_pages <= kMaxIds, "swa_pages", c.swa_pages, "2 .. 2^31 (page 0 is the null page)");
  need(c.swa_page_tokens >= 1, "swa_page_tokens", c.swa_page_tokens, ">= 1");
  need(c.swa_block_table_width >= 1, "swa_block_table_width", c.swa_block_table_width, ">= 1");
  for (int r : {1, 2}) {
    const CompressedCacheGeometry& g = r == 1 ? c.c1a : c.c2a;
    const char* pages = r == 1 ? "c1a.num_pages" : "c2a.num_pages";
    need(g.num_pages == 0 || (g.num_pages >= 2 && g.num_pages <= kMaxIds), pages, g.num_pages,
         "0 (not served) or 2 .. 2^31 (page 0 is the null page)");
    if (g.num_pages == 0) continue;
    need(g.states_per_page >= 0, r == 1 ? "c1a.states_per_page" : "c2a.states_per_page", g.states_per_page,
         ">= 0 (0: 64 / r)");
    need(g.block_table_width >= 1, r == 1 ? "c1a.block_table_width" : "c2a.block_table_width", g.block_table_width,
         ">= 1");
  }
  if (c.c2a.num_pages > 0)
    need(c.ring_blocks >= 2 && c.ring_blocks <= kMaxIds, "ring_blocks", c.ring_blocks,
         "2 .. 2^31 with c2a served (block 0 is the null block)");
}

CacheAllocator::CacheAllocator(const AllocatorConfig& cfg) : cfg_(cfg) {
  validate(cfg_);
  free_swa_ = ids_below(cfg_.swa_pages);
  free_c_[0] = ids_below(cfg_.c1a.num_pages);
  free_c_[1] = ids_below(cfg_.c2a.num_pages);
  if (cfg_.c2a.num_pages > 0) free_ring_ = ids_below(cfg_.ring_blocks);
}

int64_t CacheAllocator::free_compressed_pages(int ratio) const {
  return static_cast<int64_t>(free_c_[ratio_index(ratio)].size());
}

const RequestPages& CacheAllocator::pages(int64_t id) const {
  const auto it = reqs_.find(id);
  if (it == reqs_.end()) detail::bad_arg(kOp, "id", fmt::format("{}, expected a live request", id));
  return it->second;
}

void CacheAllocator::add(int64_t id) {
  if (live(id)) detail::bad_arg(kOp, "id", fmt::format("{} is already live, expected a new request", id));
  const bool ring = cfg_.c2a.num_pages > 0;
  if (ring && free_ring_.empty()) no_room("ring blocks", id, 1, 0);
  RequestPages rp;
  rp.swa.assign(static_cast<size_t>(cfg_.swa_block_table_width), 0);
  if (cfg_.c1a.num_pages > 0) rp.c1a.assign(static_cast<size_t>(cfg_.c1a.block_table_width), 0);
  if (cfg_.c2a.num_pages > 0) rp.c2a.assign(static_cast<size_t>(cfg_.c2a.block_table_width), 0);
  if (ring) rp.ring_block = take(free_ring_);
  reqs_.emplace(id, std::move(rp));
}

StepRequest CacheAllocator::prepare(int64_t id, int64_t num_computed, int64_t query_len) {
  const auto it = reqs_.find(id);
  if (it == reqs_.end()) detail::bad_arg(kOp, "id", fmt::format("{}, expected a live request", id));
  if (num_computed < 0 || num_computed > (int64_t{1} << 40))
    detail::bad_arg(kOp, "num_computed", fmt::format("{} (request {}), expected 0 .. 2^40", num_computed, id));
  if (query_len < 0 || query_len > (int64_t{1} << 40))
    detail::bad_arg(kOp, "query_len", fmt::format("{} (request {}), expected 0 .. 2^40", query_len, id));
  RequestPages& rp = it->second;
  const int64_t P = cfg_.swa_page_tokens;
  const int64_t last = num_computed + query_len - 1;  // newest position of the step
  const int64_t window_start = swa_window_start(num_computed);
  const int64_t keep_from = window_start / P;         // first logical SWA page the step reads

  // What the step needs, checked whole before anything is taken.
  int64_t swa_need = 0, c_need[2] = {0, 0};
  int64_t swa_last = -1, c_last[2] = {-1, -1};  // last logical page each row must hold
  if (query_len > 0) {
    if (keep_from < rp.swa_released)
      detail::bad_arg(kOp, "num_computed",
                      fmt::format("{} (request {}): its window starts at position {}, on SWA page {} that an earlier "
                                  "step gave back (positions below {} are released)",
                                  num_computed, id, window_start, keep_from, rp.swa_released * P));
    swa_last = last / P;
    if (swa_last >= cfg_.swa_block_table_width)
      detail::bad_arg(kOp, "query_len",
                      fmt::format("{} (request {}): position {} is on logical SWA page {}, expected < "
                                  "swa_block_table_width = {}", query_len, id, last, swa_last,
                                  cfg_.swa_block_table_width));
    for (int64_t k = keep_from; k <= swa_last; ++k) swa_need += rp.swa[static_cast<size_t>(k)] == 0;
    for (int r : {1, 2}) {
      const CompressedCacheGeometry& g = r == 1 ? cfg_.c1a : cfg_.c2a;
      if (g.num_pages == 0) continue;
      const int64_t closed = (last + 1) / r;  // states of groups closed by the step's end
      if (closed == 0) continue;
      const int64_t S = g.states_per_page > 0 ? g.states_per_page : 64 / r;
      c_last[r - 1] = (closed - 1) / S;
      if (c_last[r - 1] >= g.block_table_width)
        detail::bad_arg(kOp, "query_len",
                        fmt::format("{} (request {}): state {} of ratio {} is on logical page {}, expected < "
                                    "c{}a.block_table_width = {}", query_len, id, closed - 1, r, c_last[r - 1], r,
                                    g.block_table_width));
      const std::vector<int32_t>& row = r == 1 ? rp.c1a : rp.c2a;
      for (int64_t k = 0; k <= c_last[r - 1]; ++k) c_need[r - 1] += row[static_cast<size_t>(k)] == 0;
    }
  }
  if (swa_need > free_swa_pages()) no_room("SWA pages", id, swa_need, free_swa_pages());
  for (int r : {1, 2})
    if (c_need[r - 1] > static_cast<int64_t>(free_c_[r - 1].size()))
      no_room(r == 1 ? "c1a pages" : "c2a pages", id, c_need[r - 1], static_cast<int64_t>(free_c_[r - 1].size()));

  for (int64_t k = keep_from; k <= swa_last; ++k)
    if (rp.swa[static_cast<size_t>(k)] == 0) rp.swa[static_cast<size_t>(k)] = take(free_swa_);
  for (int r : {1, 2}) {
    std::vector<int32_t>& row = r == 1 ? rp.c1a : rp.c2a;
    for (int64_t k = 0; k <= c_last[r - 1]; ++k)
      if (row[static_cast<size_t>(k)] == 0) row[static_cast<size_t>(k)] = take(free_c_[r - 1]);
  }
  if (query_len > 0) {
    // SPEC 3.4: pages wholly below the step's window start serve no query of this or a later step.
    for (int64_t k = rp.swa_released; k < keep_from; ++k) {
      int32_t& pg = rp.swa[static_cast<size_t>(k)];
      if (pg != 0) give_back(free_swa_, pg);
      pg = 0;
    }
    rp.swa_released = std::max(rp.swa_released, keep_from);
  }

  StepRequest q;
  q.query_len = query_len;
  q.num_computed = num_computed;
  q.ring_block = rp.ring_block;
  q.c1a_pages = rp.c1a;
  q.c2a_pages = rp.c2a;
  q.swa_pages = rp.swa;
  return q;
}

void CacheAllocator::release(int64_t id) {
  const auto it = reqs_.find(id);
  if (it == reqs_.end()) detail::bad_arg(kOp, "id", fmt::format("{}, expected a live request", id));
  RequestPages& rp = it->second;
  for (int32_t pg : rp.swa)
    if (pg != 0) give_back(free_swa_, pg);
  for (int32_t pg : rp.c1a)
    if (pg != 0) give_back(free_c_[0], pg);
  for (int32_t pg : rp.c2a)
    if (pg != 0) give_back(free_c_[1], pg);
  if (rp.ring_block != 0) give_back(free_ring_, rp.ring_block);
  reqs_.erase(it);
}

}  // namespace dsv41kv::pipeline
