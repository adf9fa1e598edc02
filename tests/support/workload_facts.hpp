// What one step of a workload must write into a kv-source layer, counted from the workload's
// requests and positions alone (no slot mapping, no metadata builder): every request but a
// null-block one has a ring block and real pages, so each of its closing tokens gets a latent and
// a record, and (ratio 2) each of its chunks leaves its last min(len, cap) rows in the ring.
// Shared by the pipeline's tests and the demo's CLI test.
#pragma once

#include <algorithm>
#include <cstdint>

#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::test {

struct WorkloadFacts {
  int64_t latents = 0;    // closing tokens of requests with a ring block and pages
  int64_t ring_rows = 0;  // ratio 2: ring rows stored by the step's chunks
  int64_t records = 0;    // records per cache format (= latents)
};

inline WorkloadFacts workload_facts(const pcp::Workload& w, size_t step, int ratio, int64_t cap = 8) {
  WorkloadFacts f;
  for (const pcp::ScheduledRequest& s : w.steps.at(step)) {
    if (w.requests.at(static_cast<size_t>(s.id)).null_block) continue;
    for (int64_t p = s.req.num_computed; p < s.req.num_computed + s.req.query_len; ++p)
      f.latents += closes_group(p, ratio) ? 1 : 0;
    if (ratio == 2) f.ring_rows += std::min(s.req.query_len, cap);
  }
  f.records = f.latents;
  return f;
}

}  // namespace dsv41kv::test
