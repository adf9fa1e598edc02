// The one-rank mode of the simulation (what each `run --launch local` worker runs over NCCL),
// exercised on the CPU: P Simulations, each running only its rank over one ThreadGroup
// communicator, must equal the same rank of an all-rank run byte for byte (compare_rank), the
// comparison must catch a broken step, and the device-buffer ThreadGroup still gathers host
// buffers (its device path is in tests/oracles/test_pcp_sim_gpu.cpp).
// GCC 12 reports a false -Wmaybe-uninitialized inside SimConfig's default formats list here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsv41kv/test_seam.hpp"
#include "dsv41kv/comm.hpp"
#include "dsv41kv/device.hpp"
#include "dsv41kv/pcp_sim.hpp"

namespace dsv41kv::pcp {
namespace {

WorkloadConfig small_workload(uint64_t seed) {
  WorkloadConfig wc;
  wc.seed = seed;
  wc.num_requests = 6;
  wc.prompt_min = 5;
  wc.prompt_max = 70;
  wc.decode_steps = 2;
  wc.chunk_budget = 48;
  wc.max_num_seqs = 3;
  return wc;
}

// Runs every rank of `P` in its own one-rank Simulation over a ThreadGroup communicator and
// compares each, step by step, with an all-rank reference run inside the same thread (as a
// worker does). Returns the first difference of any rank.
std::optional<Mismatch> one_rank_runs(const SimConfig& mine_cfg, const SimConfig& ref_cfg, const Workload& w, int P,
                                      CheckStats* stats, int64_t* steps_compared) {
  ThreadGroup g(P);
  std::mutex mu;
  std::optional<Mismatch> first;
  std::atomic<int64_t> compared{0};
  g.run([&](Communicator& c) {
    Simulation mine(mine_cfg, w, P, false, &c);
    EXPECT_EQ(mine.local_rank(), c.rank());
    Simulation ref(ref_cfg, w, P, true);
    CheckStats st;
    for (int64_t i = 0; i < mine.num_steps(); ++i) {
      const StepReport rep = mine.run_step(i);
      // The communicator's counters are the SPEC 7.7 volume of this rank.
      EXPECT_EQ(rep.measured_sent[static_cast<size_t>(c.rank())], rep.volume[static_cast<size_t>(c.rank())].sent());
      EXPECT_EQ(rep.measured_received[static_cast<size_t>(c.rank())],
                rep.volume[static_cast<size_t>(c.rank())].received());
      ref.run_step(i);
      auto spec = ref.check_step();
      auto mm = mine.compare_rank(ref, &st);
      if (c.rank() == 0) compared += 1;
      std::lock_guard<std::mutex> lk(mu);
      if (spec && !first) first = spec;
      if (mm && !first) first = mm;
      if (stats) *stats += st;
      st = {};
    }
  });
  if (steps_compared) *steps_compared = compared;
  return first;
}

TEST(ExternalRank, EachRankAloneEqualsTheSameRankOfTheAllRankRun) {
  for (int ratio : {2, 1})
    for (int P : {1, 2, 3, 4}) {
      SimConfig cfg;
      cfg.ratio = ratio;
      const Workload w = generate_workload(small_workload(11 + static_cast<uint64_t>(P)));
      CheckStats st;
      int64_t steps = 0;
      auto mm = one_rank_runs(cfg, cfg, w, P, &st, &steps);
      EXPECT_FALSE(mm.has_value()) << "ratio " << ratio << " P " << P << ": " << mm->to_string();
      EXPECT_EQ(steps, static_cast<int64_t>(w.steps.size()));
      EXPECT_GT(st.cache_bytes, 0u);
      EXPECT_GT(st.latent_elements, 0u);
      if (ratio == 2) {
        EXPECT_GT(st.ring_floats, 0u);
        EXPECT_GT(st.link_entries, 0u);
      }
    }
}

TEST(ExternalRank, CompareRankCatchesABrokenStep) {
  // The ranks drop their gathered predecessors; the reference does not: some rank must differ.
  SimConfig broken;
  broken.fault = seam::PcpFault::kDropGatheredPredecessors;
  SimConfig good;
  WorkloadConfig wc = small_workload(5);
  wc.start_min = 1;
  wc.start_max = 9;
  const Workload w = generate_workload(wc);
  auto mm = one_rank_runs(broken, good, w, 2, nullptr, nullptr);
  ASSERT_TRUE(mm.has_value());
  EXPECT_GE(mm->rank, 0);
}

TEST(ExternalRank, RejectsInconsistentArguments) {
  const Workload w = generate_workload(small_workload(3));
  ThreadGroup g(2);
  EXPECT_THROW(Simulation(SimConfig{}, w, 3, false, &g.comm(0)), Error);  // size 2 vs P 3
  EXPECT_THROW(Simulation(SimConfig{}, w, 2, true, &g.comm(0)), Error);   // references need every rank
  Simulation a(SimConfig{}, w, 2, false), b(SimConfig{}, w, 2, false);
  EXPECT_THROW(a.compare_rank(b), Error);  // no step has run
  a.run_step(0);
  EXPECT_THROW(a.compare_rank(b), Error);  // different steps
  b.run_step(0);
  EXPECT_FALSE(a.compare_rank(b).has_value());
}

TEST(DeviceThreadGroup, GathersHostBuffersAndOnlyAcceptsCudaWhenBuilt) {
  if (!built_with_cuda()) {
    EXPECT_THROW(ThreadGroup(2, Device::CUDA), Error);
    return;
  }
  ThreadGroup g(3, Device::CUDA);
  EXPECT_TRUE(g.comm(1).supports(Device::CUDA));
  EXPECT_TRUE(g.comm(1).supports(Device::CPU));
  std::vector<std::vector<int>> got(3);
  g.run([&](Communicator& c) {
    std::vector<int> send = {c.rank() * 10, c.rank() * 10 + 1};
    got[static_cast<size_t>(c.rank())].assign(6, -1);
    c.all_gather(send.data(), sizeof(int) * 2, got[static_cast<size_t>(c.rank())].data());
  });
  for (const auto& v : got) EXPECT_EQ(v, (std::vector<int>{0, 1, 10, 11, 20, 21}));
  // The host-only group still refuses device buffers.
  ThreadGroup h(1);
  EXPECT_FALSE(h.comm(0).supports(Device::CUDA));
}

}  // namespace
}  // namespace dsv41kv::pcp
