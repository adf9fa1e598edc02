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

}  // namespace dsv41kv::detail
