// `dsv41kv run --device cuda` end to end (SPEC 7.8 on the GPU): the multi-step PCP simulation
// with every rank's ring, compressed caches and latents on the device (pcp_layer_step_cuda over
// ThreadGroup(P, Device::CUDA)), checked against the CPU single-rank references and, byte for
// byte, against the same ranks of a CPU run; the one-rank mode of the `--launch local` workers
// (here over the in-process device communicator); a broken step is caught; the CLI, and with
// NCCL the one-GPU `--launch local` run.
// GCC 12 reports a false -Wmaybe-uninitialized inside SimConfig's default formats list here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <gtest/gtest.h>

#include <chrono>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "dsv41kv/test_seam.hpp"
#include "dsv41kv/comm.hpp"
#include "dsv41kv/nccl_comm.hpp"
#include "dsv41kv/pcp_sim.hpp"
#include "support/gpu_util.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

pcp::Workload workload(uint64_t seed, int64_t max_steps = 0) {
  pcp::WorkloadConfig wc;
  wc.seed = seed;
  wc.num_requests = 7;
  wc.prompt_min = 5;
  wc.prompt_max = 90;
  wc.decode_steps = 2;
  wc.chunk_budget = 64;
  wc.max_num_seqs = 3;
  wc.max_steps = max_steps;
  return pcp::generate_workload(wc);
}

pcp::SimConfig on_cuda(int ratio) {
  pcp::SimConfig c;
  c.ratio = ratio;
  c.device = Device::CUDA;
  return c;
}

class PcpRunGpu : public GpuTest {};

TEST_F(PcpRunGpu, DeviceRanksMatchTheCpuSingleRankReferences) {
  for (int ratio : {2, 1})
    for (int P : {1, 2, 4}) {
      const pcp::Workload w = workload(seed() + static_cast<uint64_t>(P * 10 + ratio));
      const pcp::RunResult res = pcp::run_simulation(on_cuda(ratio), w, P, /*verify=*/true, /*keep_going=*/true);
      EXPECT_FALSE(res.first_mismatch.has_value())
          << "ratio " << ratio << " P " << P << ": " << res.first_mismatch->to_string();
      EXPECT_EQ(res.steps.size(), w.steps.size());
      EXPECT_GT(res.stats.cache_bytes, 0u);
      EXPECT_GT(res.stats.latent_elements, 0u);
      if (ratio == 2) {
        EXPECT_GT(res.stats.ring_floats, 0u);
      }
      for (const auto& s : res.steps)
        for (size_t k = 0; k < s.volume.size(); ++k) {
          EXPECT_EQ(s.measured_sent[k], s.volume[k].sent()) << "step " << s.step << " rank " << k;
          EXPECT_EQ(s.measured_received[k], s.volume[k].received()) << "step " << s.step << " rank " << k;
          EXPECT_GT(s.device_ms[k], 0.0);
        }
    }
}

TEST_F(PcpRunGpu, DeviceRanksEqualCpuRanksByteForByte) {
  for (int ratio : {2, 1})
    for (int P : {1, 2, 4}) {
      const pcp::Workload w = workload(seed() ^ static_cast<uint64_t>(0x100 * P + ratio));
      pcp::SimConfig cpu_cfg;
      cpu_cfg.ratio = ratio;
      pcp::Simulation gpu(on_cuda(ratio), w, P, false), cpu(cpu_cfg, w, P, false);
      pcp::CheckStats st;
      for (int64_t i = 0; i < gpu.num_steps(); ++i) {
        gpu.run_step(i);
        cpu.run_step(i);
        auto mm = gpu.compare_rank(cpu, &st);
        ASSERT_FALSE(mm.has_value()) << "ratio " << ratio << " P " << P << ": " << mm->to_string();
      }
      EXPECT_GT(st.cache_bytes, 0u);
    }
}

// What each `run --launch local` worker does, minus NCCL: every rank alone in its own
// Simulation over a device communicator, compared with the same rank of a CPU all-rank run that
// is itself checked against the single-rank references.
TEST_F(PcpRunGpu, OneRankModeOverADeviceCommunicator) {
  for (int P : {1, 2, 4}) {
    const pcp::Workload w = workload(seed() + 1000 + static_cast<uint64_t>(P));
    ThreadGroup g(P, Device::CUDA);
    std::mutex mu;
    std::optional<pcp::Mismatch> first;
    g.run([&](Communicator& c) {
      pcp::Simulation mine(on_cuda(2), w, P, false, &c);
      pcp::Simulation ref(pcp::SimConfig{}, w, P, true);
      for (int64_t i = 0; i < mine.num_steps(); ++i) {
        mine.run_step(i);
        ref.run_step(i);
        auto a = ref.check_step();
        auto b = mine.compare_rank(ref);
        std::lock_guard<std::mutex> lk(mu);
        if (a && !first) first = a;
        if (b && !first) first = b;
      }
    });
    EXPECT_FALSE(first.has_value()) << "P " << P << ": " << first->to_string();
  }
}

TEST_F(PcpRunGpu, VerifyCatchesABrokenDeviceStep) {
  pcp::WorkloadConfig wc;
  wc.seed = seed();
  wc.num_requests = 6;
  wc.start_min = 1;
  wc.start_max = 9;
  wc.max_num_seqs = 3;
  wc.chunk_budget = 48;
  const pcp::Workload w = pcp::generate_workload(wc);
  for (seam::PcpFault mut : {seam::PcpFault::kDropGatheredPredecessors, seam::PcpFault::kSkipSaveRingRows}) {
    pcp::SimConfig c = on_cuda(2);
    c.fault = mut;
    const pcp::RunResult res = pcp::run_simulation(c, w, 2, true);
    EXPECT_TRUE(res.first_mismatch.has_value()) << seam::fault_name(mut);
  }
  pcp::SimConfig c = on_cuda(2);
  c.fault = seam::PcpFault::kReverseTieBreak;  // not available on the device: E8, not a silent pass
  EXPECT_THROW(pcp::run_simulation(c, w, 2, true), Error);
}

}  // namespace
}  // namespace dsv41kv::test
