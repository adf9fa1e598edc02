// `dsv41kv bench` argument handling where no GPU is needed: bad flags exit 2 with a message on
// stderr; without a GPU `--device cuda` exits 2 naming the reason. (The timings themselves run
// on the device machine: scripts/device-check.sh.)
#include <gtest/gtest.h>

#include <string>

#include "dsv41kv/device.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

TEST(BenchCli, BadFlagsExit2WithAMessage) {
  TempDir tmp;
  const CliRun a = run_cli("bench --pdl-early-metadata", tmp);
  EXPECT_EQ(a.code, 2) << a.out << a.err;
  EXPECT_NE(a.err.find("--pdl-early-metadata needs --pdl"), std::string::npos) << a.err;
  const CliRun b = run_cli("bench --decode-buffers everywhere", tmp);
  EXPECT_EQ(b.code, 2) << b.out << b.err;
  EXPECT_NE(b.err.find("--decode-buffers"), std::string::npos) << b.err;
  const CliRun c = run_cli("bench --device cpu", tmp);
  EXPECT_EQ(c.code, 2) << c.out << c.err;
  EXPECT_NE(c.err.find("only cuda is benchmarked here"), std::string::npos) << c.err;
  const CliRun d = run_cli("bench --program-warps 3", tmp);
  EXPECT_EQ(d.code, 2) << d.out << d.err;
  const CliRun e = run_cli("bench --workload decode1", tmp);
  EXPECT_EQ(e.code, 2) << e.out << e.err;
  const CliRun g = run_cli("bench --stream-chunk 12", tmp);
  EXPECT_EQ(g.code, 2) << g.out << g.err;
  EXPECT_NE(g.err.find("--stream-chunk"), std::string::npos) << g.err;
  const CliRun h = run_cli("bench --timing wallclock", tmp);
  EXPECT_EQ(h.code, 2) << h.out << h.err;
  EXPECT_NE(h.err.find("--timing"), std::string::npos) << h.err;
}

TEST(BenchCli, CudaWithoutGpuExits2WithTheReason) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: the bench runs (scripts/device-check.sh)";
  TempDir tmp;
  const CliRun r = run_cli("bench --device cuda --workload decode256 --pdl --pdl-early-metadata", tmp);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(built_with_cuda() ? "no CUDA device" : "built without CUDA"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsv41kv::test
