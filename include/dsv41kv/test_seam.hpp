// dsv41kv: the test seam. Hooks that break the library on purpose so that its oracles and tests
// can show that their checks fail when they must (SPEC 10.6's mutation check). Only builds
// configured with DSV41KV_TEST_SEAMS=ON (the repository's default build, which the tests and the
// CLI's hidden `run --mutation` use) have them; a release build (DSV41KV_TEST_SEAMS=OFF, the
// installed package) exposes none of this.
#pragma once

#if !defined(DSV41KV_TEST_SEAMS)
#error "dsv41kv/test_seam.hpp: this build of dsv41kv has no test seams (configure with -DDSV41KV_TEST_SEAMS=ON)"
#endif

#include <span>
#include <string>

#include "dsv41kv/pcp.hpp"

namespace dsv41kv::seam {

// "none", "drop-gathered-predecessors", "reverse-tie-break", "skip-save-ring-rows",
// "local-swa-insert", "perturb-attention".
const char* fault_name(PcpFault f);
// The inverse of fault_name (E8 for any other name).
PcpFault parse_fault(const std::string& name);

// pcp::link_resolve with ties of equal keys broken by descending gathered index: the opposite of
// DECISION 13, so that tests can show that the decision is observable.
pcp::LinkResult link_resolve_reversed_ties(const pcp::LinkInput& in, const pcp::LinkLocal& local,
                                           std::span<const int64_t> all_keys, int P);

}  // namespace dsv41kv::seam
