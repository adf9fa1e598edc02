// The seeded random workloads of the PCP tests (the property test of SPEC 10.6 and the read
// path's): odd and even starts, chunked prefills (jittered budget), decodes, null-block requests,
// graph padding. DSV41KV_PCP_SWEEP=N sets the number of workloads per case.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "dsv41kv/pcp_sim.hpp"

namespace dsv41kv::pcp::test_workloads {

// Workloads per case: DSV41KV_PCP_SWEEP, else `fallback`.
inline int sweep(int fallback = 16) {
  if (const char* e = std::getenv("DSV41KV_PCP_SWEEP")) return std::max(1, std::atoi(e));
  return fallback;
}

// A small random workload; page size small so that block tables matter.
inline WorkloadConfig random_config(uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  auto next = [&](int64_t lo, int64_t hi) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return lo + static_cast<int64_t>(s % static_cast<uint64_t>(hi - lo + 1));
  };
  WorkloadConfig c;
  c.seed = seed;
  c.num_requests = next(3, 7);
  c.prompt_min = next(1, 6);
  c.prompt_max = next(c.prompt_min + 1, 48);
  c.start_min = 0;
  c.start_max = next(1, 11);
  c.decode_steps = next(0, 4);
  c.chunk_budget = next(6, 40);
  c.jitter_budget = true;
  c.max_num_seqs = next(2, 4);
  c.null_block_fraction = 0.3;
  const int64_t pads[] = {0, 0, 4, 16};
  c.graph_pad_multiple = pads[next(0, 3)];
  return c;
}

inline uint64_t property_seed(int P, DecodePlacement pl, int ratio, int i) {
  return static_cast<uint64_t>(1000 * P + 100 * ratio + i + (pl == DecodePlacement::kOwner ? 50 : 0));
}

}  // namespace dsv41kv::pcp::test_workloads
