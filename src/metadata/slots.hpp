// The slot rule of SPEC 3.1, 3.2 and 6.3-6.5, shared by the CPU builders (metadata.cpp) and the CUDA
// builders (metadata_cuda.cu): the slot of offset `off` in physical page (or ring block) `page` of
// a cache of `per_page` states per page (ring rows per block); -1 when the id names the null page
// (DECISION 7: any id <= 0; the caller's table is never modified).
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

DSV41KV_HD int64_t slot_in_page(int64_t page, int64_t per_page, int64_t off) {
  return page > 0 ? page * per_page + off : -1;
}

// The i32 entry of an index row (SPEC 6.6) for offset `off` of physical page `page`: the slot, or
// -1 for the null page, and also -1 where the CPU builders report an error (a page id >= num_pages
// when num_pages >= 0, a slot beyond int32), so that a device builder, which cannot report, emits
// -1 there; for valid inputs both backends get the slot itself.
DSV41KV_HD int32_t row_entry(int64_t page, int64_t per_page, int64_t off, int64_t num_pages) {
  if (num_pages >= 0 && page >= num_pages) return -1;
  const int64_t s = slot_in_page(page, per_page, off);
  return s > 0x7FFFFFFF ? -1 : static_cast<int32_t>(s);
}

}  // namespace dsv41kv::detail
