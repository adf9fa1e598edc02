// `dsv41kv run --device cuda` / `--launch local` and `demo --device cuda` where they cannot run:
// without a GPU (or NCCL) they exit 2 with a message naming the reason; bad combinations of
// flags exit 2. (With a GPU, tests/oracles/test_pcp_sim_gpu.cpp and tests/tools/test_run_gpu.cpp run them.)
#include <gtest/gtest.h>

#include <string>

#include "dsv41kv/device.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

TEST(RunDevice, CudaWithoutGpuExits2WithTheReason) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: test_gpu (RunCliGpu) covers --device cuda";
  TempDir tmp;
  for (const std::string args : {"run --device cuda --verify --steps 2", "run --pcp 2 --device cuda --launch local",
                                 "demo --write-path --device cuda"}) {
    const CliRun r = run_cli(args, tmp);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find(built_with_cuda() ? "no CUDA device" : "built without CUDA"), std::string::npos)
        << args << ": " << r.err;
  }
}

TEST(RunDevice, BadCombinationsExit2) {
  TempDir tmp;
  const CliRun a = run_cli("run --pcp 2 --launch local", tmp);  // needs --device cuda
  EXPECT_EQ(a.code, 2);
  EXPECT_NE(a.err.find("--launch local needs --device cuda"), std::string::npos) << a.err;
  const CliRun b = run_cli("run --device gpu", tmp);
  EXPECT_EQ(b.code, 2);
  const CliRun c = run_cli("run --launch remote", tmp);
  EXPECT_EQ(c.code, 2);
  const CliRun k = run_cli("run --pcp 2 --steps 3 --kill-rank 1", tmp);  // only workers can be killed
  EXPECT_EQ(k.code, 2);
  EXPECT_NE(k.err.find("--kill-rank 1 without --launch local"), std::string::npos) << k.err;
  const CliRun ks = run_cli("run --pcp 2 --steps 3 --kill-at-step 1", tmp);  // a step but no rank
  EXPECT_EQ(ks.code, 2);
  EXPECT_NE(ks.err.find("--kill-at-step 1 without --kill-rank"), std::string::npos) << ks.err;
  // the read path runs on the CPU only: asking for it, or for its faults, on cuda is refused
  const CliRun rp = run_cli("run --pcp 2 --steps 1 --device cuda --read-path on", tmp);
  EXPECT_EQ(rp.code, 2);
  EXPECT_NE(rp.err.find("runs on the CPU only"), std::string::npos) << rp.err;
  const CliRun rm = run_cli("run --pcp 2 --steps 1 --device cuda --mutation perturb-attention", tmp);
  EXPECT_EQ(rm.code, 2);
  EXPECT_NE(rm.err.find("breaks the read path"), std::string::npos) << rm.err;
  if (cuda_device_available()) {
    const CliRun d = run_cli("run --pcp 2,4 --device cuda --launch local", tmp);  // one P per launch
    EXPECT_EQ(d.code, 2);
    EXPECT_NE(d.err.find("one P per launch"), std::string::npos) << d.err;
    // checked before any worker starts, whatever the number of GPUs
    const CliRun e = run_cli("run --pcp 2 --device cuda --launch local --kill-rank 2", tmp);
    EXPECT_EQ(e.code, 2);
    EXPECT_NE(e.err.find("--kill-rank 2: outside the ranks [0, 2)"), std::string::npos) << e.err;
    const CliRun f = run_cli("run --pcp 2 --steps 3 --device cuda --launch local --kill-rank 1 --kill-at-step 3", tmp);
    EXPECT_EQ(f.code, 2);
    EXPECT_NE(f.err.find("--kill-at-step 3: the workload has 3 step(s)"), std::string::npos) << f.err;
  }
}

TEST(RunDevice, CpuDefaultIsUnchanged) {
  TempDir tmp;
  const CliRun r = run_cli("run --pcp 2 --steps 3 --verify --heads 8", tmp);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("verify P=2: identical to P=1 at all 3 steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("gpu ms"), std::string::npos);
  EXPECT_EQ(r.out.find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace dsv41kv::test
