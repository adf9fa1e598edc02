// Host-side pieces shared by the CPU metadata builders (metadata.cpp, read_path.cpp): the SPEC 6.2
// decode rule, block-table reads and the optional-count check.
#pragma once

#include <fmt/format.h>

#include <cstdint>

#include "core/validate.hpp"
#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

// SPEC 6.2: the number of leading requests j < num_reqs with query_len(j) <= 1 + num_spec.
template <class QueryLen>
int64_t decode_prefix(int64_t num_reqs, int64_t num_spec, QueryLen&& query_len) {
  const int64_t threshold = 1 + num_spec;
  int64_t j = 0;
  while (j < num_reqs && query_len(j) <= threshold) ++j;
  return j;
}

// Entry [row][col] of a checked i32 block table (inner stride and row stride honoured).
inline int32_t table_at(const TensorView& t, int64_t row, int64_t col) {
  return t.ptr<const int32_t>()[row * t.stride[0] + col * t.stride[1]];
}

// -1 (unchecked) or a count >= 0.
inline void need_optional_count(const char* op, const char* arg, int64_t v) {
  if (v < -1) bad_arg(op, arg, fmt::format("{}, expected -1 (unchecked) or >= 0", v));
}

}  // namespace dsv41kv::detail
