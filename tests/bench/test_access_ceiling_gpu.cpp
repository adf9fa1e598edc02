// dsv41kv-access-ceiling (bench/cuda) argument handling: bad flags exit 2 with a message, no GPU
// exits 2 naming the reason. Its measurements are timings and run in the bench stage of
// scripts/device-check.sh (as `dsv41kv bench`), not here: this target is the one the sanitizers
// check, and the tool's bulk-copy kernel is a measurement, not library code (docs/cuda.md).
#include <gtest/gtest.h>

#include <string>

#include "dsv41kv/device.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

TEST(AccessCeilingCli, BadFlagsExit2WithAMessage) {
  TempDir tmp;
  struct Case {
    const char* args;
    const char* message;  // expected in stderr
  };
  const Case cases[] = {{"--iters 0", "--iters"},
                        {"--iters x", "--iters"},
                        {"--inputs some", "--inputs"},
                        {"--bogus", "--bogus"}};
  for (const Case& c : cases) {
    const CliRun r = run_program(DSV41KV_ACCESS_CEILING_PATH, c.args, tmp);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
}

TEST(AccessCeilingCli, WithoutGpuExits2WithTheReason) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: the tool runs (scripts/device-check.sh bench)";
  TempDir tmp;
  const CliRun r = run_program(DSV41KV_ACCESS_CEILING_PATH, "--iters 3 --inputs all", tmp);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("no CUDA device"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dsv41kv::test
