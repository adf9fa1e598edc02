// SPEC 10.6: the PCP property test over seeded random workloads, and the mutation checks that
// show the property test can fail. DSV41KV_PCP_SWEEP=N raises the number of workloads per
// (P, placement, ratio) from the default (16).
#include <gtest/gtest.h>

#include <ostream>

#include <cstdlib>

#include "dsv41kv/test_seam.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "oracles/pcp_workloads.hpp"

using namespace dsv41kv;
using namespace dsv41kv::pcp;
using namespace dsv41kv::pcp::test_workloads;

namespace {

struct Coverage {
  int64_t steps = 0, prev_from_gathered = 0, prev_from_ring = 0, ring_writes = 0;
  int64_t null_block_tokens = 0, masked_replica_rows = 0, padded_rows = 0, odd_starts = 0;
  int64_t continued = 0, decodes = 0;
};

void run_case(int P, DecodePlacement pl, int ratio, uint64_t seed, Coverage& cov) {
  const WorkloadConfig wc = random_config(seed);
  const Workload w = generate_workload(wc);
  for (const auto& r : w.requests) cov.odd_starts += r.start % 2;
  SimConfig sc;
  sc.ratio = ratio;
  sc.placement = pl;
  sc.states_per_page = ratio == 2 ? 4 : 8;
  const RunResult res = run_simulation(sc, w, P, /*verify=*/true);
  ASSERT_FALSE(res.first_mismatch.has_value())
      << "P " << P << " placement " << placement_name(pl) << " ratio " << ratio << " seed " << seed
      << ": " << res.first_mismatch->to_string();
  ASSERT_EQ(res.steps.size(), w.steps.size());
  EXPECT_GT(res.stats.cache_bytes, 0u);
  if (ratio == 2) {
    EXPECT_GT(res.stats.ring_floats, 0u);
  }
  for (size_t i = 0; i < res.steps.size(); ++i) {
    const StepReport& s = res.steps[i];
    ++cov.steps;
    cov.prev_from_gathered += s.prev_from_gathered;
    cov.prev_from_ring += s.prev_from_ring;
    cov.ring_writes += s.ring_writes;
    cov.null_block_tokens += s.null_block_tokens;
    cov.masked_replica_rows += s.masked_replica_rows;
    cov.decodes += s.num_decodes;
    for (int64_t n : s.tokens_per_rank) cov.padded_rows += s.padded - n;
    for (const auto& r : w.steps[i]) cov.continued += (r.req.is_prefilling && r.req.num_computed > 0) ? 1 : 0;
    // The communicator moved exactly what SPEC 7.7 says.
    const int64_t rows = ratio == 2 ? std::min(s.padded, 2 * wc.max_num_seqs) : 0;
    const CommVolume ev = expected_comm_volume(P, s.padded, rows, ratio);
    for (int k = 0; k < P; ++k) {
      ASSERT_EQ(s.measured_received[static_cast<size_t>(k)], ev.received()) << "step " << i << " rank " << k;
      ASSERT_EQ(s.measured_sent[static_cast<size_t>(k)], ev.sent()) << "step " << i << " rank " << k;
      ASSERT_EQ(s.volume[static_cast<size_t>(k)].received(), ev.received());
      ASSERT_EQ(s.volume[static_cast<size_t>(k)].replaced_received, ev.replaced_received);
    }
  }
}

}  // namespace

// gtest prints parameters of unknown types as raw bytes; name the placement instead (found by
// argument-dependent lookup, so it lives in the enum's namespace).
namespace dsv41kv::pcp {
void PrintTo(DecodePlacement p, std::ostream* os) { *os << placement_name(p); }
}  // namespace dsv41kv::pcp

class PcpProperty : public ::testing::TestWithParam<std::tuple<int, DecodePlacement, int>> {};

TEST_P(PcpProperty, Spec78HoldsAtEveryStep) {
  const auto [P, pl, ratio] = GetParam();
  Coverage cov;
  const int n = sweep();
  for (int i = 0; i < n; ++i) {
    run_case(P, pl, ratio, property_seed(P, pl, ratio, i), cov);
    if (HasFatalFailure()) return;
  }
  // The workloads exercised what SPEC 10.6 lists.
  EXPECT_GT(cov.steps, 3 * n);
  EXPECT_GT(cov.odd_starts, 0);
  EXPECT_GT(cov.continued, 0);
  EXPECT_GT(cov.decodes, 0);
  EXPECT_GT(cov.null_block_tokens, 0);
  EXPECT_GT(cov.padded_rows, 0);
  if (ratio == 2) {
    EXPECT_GT(cov.prev_from_gathered, 0) << "no chunk found its predecessor on another chunk";
    EXPECT_GT(cov.prev_from_ring, 0) << "no chunk read its predecessor from the ring";
    EXPECT_GT(cov.ring_writes, 0);
  }
  if (pl == DecodePlacement::kReplicated) {
    EXPECT_GT(cov.masked_replica_rows, 0);
  } else {
    EXPECT_EQ(cov.masked_replica_rows, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Workloads, PcpProperty,
    ::testing::Combine(::testing::Values(2, 3, 4, 8),
                       ::testing::Values(DecodePlacement::kReplicated, DecodePlacement::kOwner),
                       ::testing::Values(2, 1)),
    [](const auto& info) {
      return "P" + std::to_string(std::get<0>(info.param)) + "_" +
             placement_name(std::get<1>(info.param)) + "_r" + std::to_string(std::get<2>(info.param));
    });

// P = 1 through the PCP path (two DualChunkSwap chunks on rank 0) is also identical.
TEST(PcpProperty, SingleRankPcpPathMatches) {
  for (uint64_t seed = 7; seed < 10; ++seed) {
    SimConfig sc;
    sc.states_per_page = 4;
    const RunResult res = run_simulation(sc, generate_workload(random_config(seed)), 1, true);
    ASSERT_FALSE(res.first_mismatch.has_value()) << res.first_mismatch->to_string();
  }
}

// The mutation checks of SPEC 10.6: each must make the property test fail.
struct MutationCase {
  seam::PcpFault m;
  const char* first_tensor_prefix;
};
// gtest prints parameters of unknown types as raw bytes; name the mutation instead.
void PrintTo(const MutationCase& c, std::ostream* os) { *os << seam::fault_name(c.m); }

class PcpMutation : public ::testing::TestWithParam<std::tuple<MutationCase, int>> {};

TEST_P(PcpMutation, PropertyTestFails) {
  const auto [mc, P] = GetParam();
  // The same workloads as PcpProperty.Spec78HoldsAtEveryStep/P<P>_replicated_r2.
  int failed = 0;
  CheckStats total;
  const int n = sweep();
  for (int i = 0; i < n; ++i) {
    SimConfig sc;
    sc.states_per_page = 4;
    sc.fault = mc.m;
    sc.placement = DecodePlacement::kReplicated;
    const uint64_t seed = property_seed(P, DecodePlacement::kReplicated, 2, i);
    const RunResult res = run_simulation(sc, generate_workload(random_config(seed)), P, true, /*keep_going=*/true);
    total += res.stats;
    if (!res.first_mismatch) continue;
    ++failed;
    EXPECT_EQ(res.first_mismatch->tensor.rfind(mc.first_tensor_prefix, 0), 0u)
        << seam::fault_name(mc.m) << ": " << res.first_mismatch->to_string();
  }
  // The property test (the sweep) fails: at least one workload reports a difference.
  EXPECT_GT(failed, 0) << seam::fault_name(mc.m) << " went unnoticed on all " << n << " workloads";
  const double pct = total.latent_elements ? 100.0 * static_cast<double>(total.latent_mismatched) /
                                                 static_cast<double>(total.latent_elements)
                                           : 0.0;
  std::printf("[ mutation ] %s P=%d: %d of %d workloads fail; latents %.1f%% mismatched, cache bytes %llu, ring floats %llu, link entries %llu\n",
              seam::fault_name(mc.m), P, failed, n, pct, static_cast<unsigned long long>(total.cache_mismatched),
              static_cast<unsigned long long>(total.ring_mismatched),
              static_cast<unsigned long long>(total.link_mismatched));
  if (mc.m == seam::PcpFault::kDropGatheredPredecessors) {
    EXPECT_GT(total.latent_mismatched, 0u);
  } else if (mc.m == seam::PcpFault::kSkipSaveRingRows) {
    EXPECT_GT(total.ring_mismatched, 0u);
  } else {
    EXPECT_GT(total.link_mismatched, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mutations, PcpMutation,
    ::testing::Combine(::testing::Values(MutationCase{seam::PcpFault::kDropGatheredPredecessors, "latent"},
                                         MutationCase{seam::PcpFault::kReverseTieBreak, "link.ring_write_slots"},
                                         MutationCase{seam::PcpFault::kSkipSaveRingRows, "ring"}),
                       ::testing::Values(2, 4)),
    [](const auto& info) {
      std::string n = seam::fault_name(std::get<0>(info.param).m);
      for (char& c : n)
        if (c == '-') c = '_';
      return n + "_P" + std::to_string(std::get<1>(info.param));
    });

TEST(PcpSimulation, SpeculativeDecodingWithPcpIsE6) {
  SimConfig sc;
  sc.num_speculative_tokens = 2;
  const Workload w = generate_workload(random_config(1));
  try {
    Simulation sim(sc, w, 2, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPcpWithSpec);
    EXPECT_NE(std::string(e.what()).find("speculative"), std::string::npos);
  }
}

// Oversized configurations are rejected in the constructor, before anything is allocated, with the
// sizes that drive the estimate; sizes inside the limit run; out-of-range sizes are E8.
TEST(PcpSimulation, HostMemoryLimitIsCheckedBeforeAllocating) {
  const Workload w = generate_workload(random_config(3));
  SimConfig sc;
  sc.max_host_bytes = 64 * 1024;  // far below the caches of any workload
  try {
    Simulation sim(sc, w, 2, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("max_host_bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("2 rank(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("references"), std::string::npos) << m;
  }
  // a ring too large for the limit: 2^10 speculative tokens -> capacity 2048 per request
  SimConfig spec;
  spec.num_speculative_tokens = 1 << 10;
  spec.max_host_bytes = int64_t{1} << 30;
  WorkloadConfig many = random_config(4);
  many.num_requests = 1000;
  try {
    Simulation sim(spec, generate_workload(many), 1, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity 2048"), std::string::npos) << e.what();
  }
  sc.max_host_bytes = int64_t{1} << 30;  // enough
  EXPECT_NO_THROW(Simulation(sc, w, 2, true));
  sc.max_host_bytes = -1;
  EXPECT_THROW(Simulation(sc, w, 1, false), Error);
  sc.max_host_bytes = 0;
  sc.states_per_page = (1 << 16) + 1;
  EXPECT_THROW(Simulation(sc, w, 1, false), Error);
  WorkloadConfig pad = random_config(5);
  pad.graph_pad_multiple = (1 << 16) + 1;
  EXPECT_THROW(generate_workload(pad), Error);
}

TEST(PcpSimulation, WorkloadIsDeterministicAndIndependentOfP) {
  const WorkloadConfig c = random_config(42);
  const Workload a = generate_workload(c), b = generate_workload(c);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    ASSERT_EQ(a.steps[i].size(), b.steps[i].size());
    for (size_t j = 0; j < a.steps[i].size(); ++j) {
      EXPECT_EQ(a.steps[i][j].id, b.steps[i][j].id);
      EXPECT_EQ(a.steps[i][j].req.query_len, b.steps[i][j].req.query_len);
      EXPECT_EQ(a.steps[i][j].req.num_computed, b.steps[i][j].req.num_computed);
    }
  }
  // Every prompt and decode token is scheduled exactly once, decodes first in each step.
  std::vector<int64_t> next(a.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) next[i] = a.requests[i].start;
  for (const auto& st : a.steps) {
    bool seen_prefill = false;
    for (const auto& r : st) {
      EXPECT_EQ(r.req.num_computed, next[static_cast<size_t>(r.id)]);
      next[static_cast<size_t>(r.id)] += r.req.query_len;
      EXPECT_FALSE(!r.req.is_prefilling && seen_prefill);
      seen_prefill |= r.req.is_prefilling;
    }
  }
  for (size_t i = 0; i < a.requests.size(); ++i)
    EXPECT_EQ(next[i], a.requests[i].start + a.requests[i].prompt_len + a.requests[i].decode_steps);
  WorkloadConfig bad = c;
  bad.prompt_max = 0;
  EXPECT_THROW(generate_workload(bad), Error);
}
