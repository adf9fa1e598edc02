// `dsv41kv run --device cuda` and `--launch local` on one GPU: the CLI's PCP simulation on the
// device, verified against the CPU, and the failure handling of the local launcher.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "dsv41kv/nccl_comm.hpp"
#include "support/cli.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class RunCliGpu : public GpuTest {};

TEST_F(RunCliGpu, CliRunDeviceCudaVerifies) {
  TempDir tmp;
  const CliRun r = run_cli("run --pcp 1,2,4 --device cuda --verify --steps 8", tmp);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int P : {1, 2, 4})
    EXPECT_NE(r.out.find("verify P=" + std::to_string(P) + " (cuda"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu ms"), std::string::npos) << r.out;
  const CliRun m = run_cli("run --pcp 2 --device cuda --verify --mutation drop-gathered-predecessors", tmp);
  EXPECT_EQ(m.code, 1) << m.out << m.err;
  EXPECT_NE(m.out.find("DIFFERENCE"), std::string::npos) << m.out;
}

TEST_F(RunCliGpu, CliLaunchLocalOneGpu) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  TempDir tmp;
  const CliRun r = run_cli("run --pcp 1 --device cuda --launch local --verify --steps 8 --timeout 60", tmp);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0/1: verify: identical"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus >= 2) {
    const CliRun r2 = run_cli("run --pcp 2 --device cuda --launch local --verify --steps 8 --timeout 60", tmp);
    EXPECT_EQ(r2.code, 0) << r2.out << r2.err;
    EXPECT_NE(r2.out.find("rank 1/2: verify: identical"), std::string::npos) << r2.out;
  }
}

// Issue 5's failure handling on the real step: rank 1 dies (SIGKILL) at the start of step 2,
// after the ranks' barrier, so rank 0 is inside the step's all-gathers; its wait through the
// communicator must end it with its own kComm error within --timeout (not the launcher's SIGTERM
// after the grace period).
TEST_F(RunCliGpu, CliLaunchLocalKilledRankEndsThePeerWithinTheTimeout) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible";
  TempDir tmp;
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r = run_cli("run --pcp 2 --device cuda --launch local --steps 6 --timeout 10 --kill-rank 1 "
                           "--kill-at-step 2", tmp);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.code, 1) << all;
  EXPECT_NE(all.find("rank 1/2: --kill-rank: killing myself (SIGKILL) at the start of step 2"), std::string::npos)
      << all;
  EXPECT_NE(all.find("first failure: rank 1"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 0/2: error: rank 0 of 2"), std::string::npos) << all;
  EXPECT_EQ(all.find("from the launcher"), std::string::npos) << "rank 0 must end on its own:\n" << all;
  EXPECT_LT(seconds, 60.0) << all;
}

}  // namespace
}  // namespace dsv41kv::test
