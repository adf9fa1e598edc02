// ServingConfig and StepBatch (pipeline.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/validate.hpp"
#include "dsv41kv/metadata.hpp"
#include "dsv41kv/pipeline.hpp"

namespace dsv41kv::pipeline {

const CompressedCacheGeometry& ServingConfig::compressed(int ratio) const {
  detail::need_ratio("ServingConfig", ratio, ErrorCode::kMetadataRatio, "compressed-cache ratio");
  return ratio == 1 ? c1a : c2a;
}

int64_t ServingConfig::states_per_page(int ratio) const {
  const int64_t s = compressed(ratio).states_per_page;
  return s > 0 ? s : 64 / ratio;
}

int64_t ServingConfig::ring_capacity() const { return dsv41kv::ring_capacity(num_speculative_tokens); }

void validate(const ServingConfig& c) {
  const char* op = "ServingConfig";
  if (c.device != Device::CPU && c.device != Device::CUDA)
    detail::bad_arg(op, "device", fmt::format("{}, expected cpu or cuda", static_cast<int>(c.device)));
  detail::check_exec_context(c.exec, op);
  // qsl entries are int32 (SPEC 0.4.6)
  if (c.max_tokens < 1 || c.max_tokens > std::numeric_limits<int32_t>::max())
    detail::bad_arg(op, "max_tokens", fmt::format("{}, expected 1..2^31-1", c.max_tokens));
  if (c.max_requests < 1 || c.max_requests > std::numeric_limits<int32_t>::max())
    detail::bad_arg(op, "max_requests", fmt::format("{}, expected 1..2^31-1", c.max_requests));
  if (c.num_speculative_tokens < 0)
    detail::bad_arg(op, "num_speculative_tokens", fmt::format("{}, expected >= 0", c.num_speculative_tokens));
  for (int r : {1, 2}) {
    const CompressedCacheGeometry& g = c.compressed(r);
    const std::string name = fmt::format("c{}a", r);
    if (g.num_pages < 0 || g.num_pages > std::numeric_limits<int32_t>::max())
      detail::bad_arg(op, (name + ".num_pages").c_str(), fmt::format("{}, expected 0..2^31-1 (0: not served)", g.num_pages));
    if (g.states_per_page < 0)
      detail::bad_arg(op, (name + ".states_per_page").c_str(),
                      fmt::format("{}, expected >= 0 (0: {} per SPEC 3.6)", g.states_per_page, 64 / r));
    if (g.num_pages > 0 && g.block_table_width < 1)
      detail::bad_arg(op, (name + ".block_table_width").c_str(),
                      fmt::format("{}, expected >= 1 for a served type", g.block_table_width));
  }
  if (c.swa.num_pages < 0 || c.swa.num_pages > std::numeric_limits<int32_t>::max())
    detail::bad_arg(op, "swa.num_pages", fmt::format("{}, expected 0..2^31-1 (0: no SWA cache)", c.swa.num_pages));
  if (c.serves_swa()) {
    if (c.swa.page_tokens < 1)
      detail::bad_arg(op, "swa.page_tokens", fmt::format("{}, expected >= 1 (32 per SPEC 3.4)", c.swa.page_tokens));
    if (c.swa.block_table_width < 1)
      detail::bad_arg(op, "swa.block_table_width",
                      fmt::format("{}, expected >= 1 with an SWA cache", c.swa.block_table_width));
  }
  if (c.serves(2) && (c.ring_blocks < 1 || c.ring_blocks > std::numeric_limits<int32_t>::max()))
    detail::bad_arg(op, "ring_blocks", fmt::format("{}, expected 1..2^31-1 with c2a served", c.ring_blocks));
  if (!c.serves(1) && !c.serves(2)) detail::bad_arg(op, "c1a, c2a", "neither served, expected num_pages > 0 in one");
  if (c.formats.empty()) detail::bad_arg(op, "formats", "empty, expected at least one record format");
  for (size_t i = 0; i < c.formats.size(); ++i)
    if (std::find(c.formats.begin(), c.formats.begin() + static_cast<std::ptrdiff_t>(i), c.formats[i]) !=
        c.formats.begin() + static_cast<std::ptrdiff_t>(i))
      detail::bad_arg(op, "formats", fmt::format("{} twice, expected each format once", record_info(c.formats[i]).name));
  if (!(std::isfinite(c.fp8_scale) && c.fp8_scale > 0.0f))
    detail::bad_arg(op, "fp8_scale", fmt::format("{}, expected a finite value > 0", c.fp8_scale));
}

int64_t StepBatch::num_tokens() const {
  int64_t n = 0;
  for (const StepRequest& r : requests) n += r.query_len;
  return n;
}

}  // namespace dsv41kv::pipeline
