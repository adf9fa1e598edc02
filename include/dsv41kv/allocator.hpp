// dsv41kv: the cache allocator of the model driver. It owns the page ids of the step's caches
// (SPEC 3.1-3.5) and hands each request the block-table rows of a step:
//   - SWA pages (32 tokens by default, SPEC 3.4): one page id serves the SWA cache of every layer
//     (each layer has its own cache tensor with the same page numbering). Pages are taken as a
//     request's positions reach them and given back once they lie wholly below the window of the
//     step's first query, `swa_window_start(first_query_pos)` (SPEC 3.4, records.hpp): the row then holds the
//     null page 0 there.
//   - compressed pages per layer type (c1a: ratio 1, c2a: ratio 2; S_r states per page): one page
//     id serves every kv-source layer of the type and its indexer-K cache (SPEC 3.5: the same
//     block table and slot numbers). Never released before the request ends (the top-k reads
//     any compressed entry of the prefix).
//   - one ring block per request for its whole life (c2a, SPEC 3.2).
// Page id 0 and ring block 0 are the null page/block: never handed out. Ids are handed out from
// the lowest free one, so that a run is deterministic.
//
// The allocator is host bookkeeping only: it allocates no cache memory (the layers own their
// caches, sized by the same page counts). Running out of pages or ring blocks is
// Error(kCapacity) naming the pool, the request and the need; nothing is taken in that call.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "dsv41kv/pipeline.hpp"

namespace dsv41kv::pipeline {

struct AllocatorConfig {
  int64_t swa_pages = 0;              // physical SWA pages, page 0 the null page (>= 2)
  int64_t swa_page_tokens = 32;       // tokens per SWA page (SPEC 3.4)
  int64_t swa_block_table_width = 0;  // logical SWA pages per request (>= 1)
  CompressedCacheGeometry c1a, c2a;   // as ServingConfig; num_pages 0: the type is not served
  int64_t ring_blocks = 0;            // ring blocks, block 0 the null block (>= 2 with c2a)
};
// E8 naming the field.
void validate(const AllocatorConfig& cfg);
// The pools of a serving configuration: its SWA, c1a / c2a geometry and (c2a served) ring blocks.
AllocatorConfig allocator_config(const ServingConfig& s);

// What one request holds.
struct RequestPages {
  std::vector<int32_t> swa;        // [swa_block_table_width] physical page per logical page, 0 = none
  std::vector<int32_t> c1a, c2a;   // [block_table_width] of the type, 0 = none
  int32_t ring_block = 0;          // 0 without c2a
  int64_t swa_released = 0;        // logical SWA pages below this were given back
};

class CacheAllocator {
 public:
  explicit CacheAllocator(const AllocatorConfig& cfg);

  // A new request (E8 when `id` is live): takes its ring block when c2a is served.
  void add(int64_t id);
  // The rows of request `id` for a step with positions num_computed .. num_computed + query_len - 1
  // (E8 for an unknown id, negative lengths, or positions beyond a block-table row): takes the
  // pages those positions need (SWA pages of every position from the window start of the step's
  // first query on; compressed pages of every closing token's state), then gives back the SWA
  // pages wholly below that window start. A step whose window starts on a page given back
  // earlier (num_computed moved back) is an E8.
  StepRequest prepare(int64_t id, int64_t num_computed, int64_t query_len);
  // Ends request `id` (E8 when not live): every page and its ring block go back.
  void release(int64_t id);

  const AllocatorConfig& config() const { return cfg_; }
  bool live(int64_t id) const { return reqs_.count(id) != 0; }
  const RequestPages& pages(int64_t id) const;  // E8 for an unknown id
  int64_t free_swa_pages() const { return static_cast<int64_t>(free_swa_.size()); }
  int64_t free_compressed_pages(int ratio) const;  // E2 for a ratio outside {1, 2}
  int64_t free_ring_blocks() const { return static_cast<int64_t>(free_ring_.size()); }

 private:
  AllocatorConfig cfg_;
  std::map<int64_t, RequestPages> reqs_;
  // Free ids, highest first, so that back() is the lowest.
  std::vector<int32_t> free_swa_, free_c_[2], free_ring_;
};

}  // namespace dsv41kv::pipeline
