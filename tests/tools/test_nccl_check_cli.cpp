// `dsv41kv nccl-check` end to end through the launcher: real worker processes of the CLI.
// --host-only runs anywhere (launcher + rendezvous, kill handling); the GPU runs skip with a
// message when this build has no NCCL or fewer GPUs than ranks are visible.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <set>
#include <string>

#include "dsv41kv/nccl_selftest.hpp"
#include "dsv41kv/nccl_comm.hpp"
#include "support/paths.hpp"

using namespace dsv41kv;
using Clock = std::chrono::steady_clock;

namespace {

struct CliResult {
  int code = -1;
  std::string out;
  double seconds = 0;
};

CliResult run_cli(const std::string& args) {
  const std::string cmd = test::cli_path() + " " + args + " 2>&1";
  const auto t0 = Clock::now();
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::set<std::string> hashes(const std::string& out) {
  std::set<std::string> h;
  std::regex re("fnv1a ([0-9a-f]{16})");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    h.insert((*it)[1]);
  return h;
}

int gpus() { return comm::visible_cuda_devices(nullptr); }

}  // namespace

TEST(NcclCheckCli, HostOnlyRanksRendezvousOverTcpAndFile) {
  for (const char* how : {"tcp", "file"}) {
    const CliResult r = run_cli(fmt::format("nccl-check --ranks 4 --host-only --timeout 20 --rendezvous {}", how));
    EXPECT_EQ(r.code, 0) << r.out;
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(has(r.out, fmt::format("rank {}/4: OK", k))) << r.out;
    EXPECT_EQ(hashes(r.out).size(), 1u) << "every rank must hold the same unique id:\n" << r.out;
    EXPECT_TRUE(has(r.out, "all 4 ranks succeeded")) << r.out;
  }
}

TEST(NcclCheckCli, KilledRank0EndsEveryOtherRankWithinTheTimeout) {
  const CliResult r = run_cli("nccl-check --ranks 3 --host-only --timeout 1 --kill-rank 0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "first failure: rank 0")) << r.out;
  EXPECT_TRUE(has(r.out, "SIGKILL")) << r.out;
  for (int k : {1, 2}) {
    EXPECT_TRUE(has(r.out, fmt::format("rank {}/3: error: rank {}: rendezvous tcp://127.0.0.1:", k, k))) << r.out;
    EXPECT_TRUE(has(r.out, fmt::format("rank {} (pid", k))) << r.out;
  }
  EXPECT_TRUE(has(r.out, "timed out after 1000 ms waiting for rank 0")) << r.out;
  EXPECT_FALSE(has(r.out, "from the launcher")) << "the peers must end on their own:\n" << r.out;
  EXPECT_LT(r.seconds, 1.0 + 3.0) << r.out;
}

TEST(NcclCheckCli, KilledRankIsNamedByRank0) {
  const CliResult r = run_cli("nccl-check --ranks 3 --host-only --timeout 1 --kill-rank 2 --rendezvous tcp");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "first failure: rank 2")) << r.out;
  EXPECT_TRUE(has(r.out, "rank(s) 2 did not fetch the unique id")) << r.out;
  EXPECT_LT(r.seconds, 1.0 + 3.0) << r.out;
}

TEST(NcclCheckCli, BadFlagsAreExit2) {
  EXPECT_EQ(run_cli("nccl-check --ranks 2 --kill-rank 2 --host-only").code, 2);
  EXPECT_EQ(run_cli("nccl-check --ranks 0").code, 2);
  EXPECT_EQ(run_cli("nccl-check --ranks 2 --launch none --host-only").code, 2);
  EXPECT_EQ(run_cli("nccl-check --ranks 2 --rendezvous udp").code, 2);
  // NaN passed CLI::Range (every comparison with it is false); checked before any rank starts
  for (const char* flag : {"--timeout", "--max-runtime"}) {
    const auto r = run_cli(std::string("nccl-check --ranks 2 --host-only ") + flag + " nan");
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_NE(r.out.find(std::string(flag) + ": 'nan' is not a number"), std::string::npos) << r.out;
  }
}

TEST(NcclCheckCli, WithoutNcclOrEnoughGpusItIsAClearExit2) {
  const int n = gpus();
  if (nccl_available() && n >= 2) GTEST_SKIP() << "this machine has NCCL and " << n << " GPUs";
  const CliResult r = run_cli("nccl-check --ranks 2 --timeout 5");
  EXPECT_EQ(r.code, 2) << r.out;
  if (!nccl_available()) EXPECT_TRUE(has(r.out, "no NCCL")) << r.out;
  else EXPECT_TRUE(has(r.out, "needs 2 GPUs")) << r.out;
}

TEST(NcclCheckCli, GpuOneRank) {
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  if (gpus() < 1) GTEST_SKIP() << "needs 1 GPU, none visible";
  const CliResult r = run_cli("nccl-check --ranks 1 --timeout 60 --bytes 1048577 --iters 5");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "graph all_gather (replay 2): identical")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0/1: OK")) << r.out;
}

TEST(NcclCheckCli, GpuEveryVisibleRankVerifies) {
  const int n = std::min(gpus(), 8);
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, " << n << " visible";
  const CliResult r = run_cli(fmt::format("nccl-check --ranks {} --timeout 60 --bytes 1048577 --iters 5", n));
  EXPECT_EQ(r.code, 0) << r.out;
  for (int k = 0; k < n; ++k) EXPECT_TRUE(has(r.out, fmt::format("rank {}/{}: OK", k, n))) << r.out;
}

TEST(NcclCheckCli, GpuKilledRankEndsEveryOtherRankWithinTheTimeout) {
  const int n = std::min(gpus(), 8);
  if (!nccl_available()) GTEST_SKIP() << "built without NCCL";
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, " << n << " visible";
  const CliResult r = run_cli(fmt::format(
      "nccl-check --ranks {} --timeout 10 --bytes 65536 --iters 50 --kill-rank 1 --kill-after 10", n));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "first failure: rank 1")) << r.out;
  for (int k = 0; k < n; ++k) {
    if (k == 1) continue;
    EXPECT_TRUE(has(r.out, fmt::format("rank {}/{}: error: rank {} of {}", k, n, k, n))) << r.out;
  }
  EXPECT_FALSE(has(r.out, "from the launcher")) << "the peers must end on their own:\n" << r.out;
  EXPECT_LT(r.seconds, 60.0) << r.out;
}
