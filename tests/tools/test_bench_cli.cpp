// `dsv41kv bench` argument handling where no GPU is needed: bad flags and an unreadable
// --baseline exit 2 with a message on stderr; without a GPU `--device cuda` exits 2 naming the
// reason. (The timings themselves run
// on the device machine: scripts/device-check.sh.)
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "dsv41kv/device.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

TEST(BenchCli, BadFlagsExit2WithAMessage) {
  TempDir tmp;
  struct Case {
    const char* args;
    const char* message;  // expected in stderr (nullptr: only the exit status is checked)
  };
  const Case cases[] = {
      {"bench --no-pdl --pdl-early-metadata", "--pdl-early-metadata needs programmatic launches"},
      {"bench --decode-buffers everywhere", "--decode-buffers"},
      {"bench --device cpu", "only cuda is benchmarked here"},
      {"bench --program-warps 3", nullptr},
      {"bench --workload decode1", nullptr},
      {"bench --stream-chunk 12", "--stream-chunk"},
      {"bench --ratio 3", "--ratio"},
      {"bench --stream-rows 3", "--stream-rows"},
      {"bench --record plain_bf16", "--record"},
      // the grid-shape flags are parsed in CUDA builds only (a CPU build stops at --device cuda)
      {"bench --stream-tail '1,2;x'", built_with_cuda() ? "--stream-tail" : nullptr},
      {"bench --stream-head '1,2;1,2;1,2'", built_with_cuda() ? "--stream-head" : nullptr},
      {"bench --stream-tail 1,16", built_with_cuda() ? "chunk 16" : nullptr},
      {"bench --stream-head 0,2", built_with_cuda() ? "0.000000 waves" : nullptr},
      {"bench --timing wallclock", "--timing"},
      // the read-path bench's flags
      {"bench --read --device cpu", "only cuda is benchmarked here"},
      {"bench --read --op attention", "--op"},
      {"bench --read --heads 32", "--heads"},
      {"bench --read --nc 5000", "--nc"},
      {"bench --read --tokens 1000", "--tokens"},
      {"bench --read --samples 0", "--samples"},
      {"bench --op decode", "go with --read"},
      {"bench --nc 4096", "go with --read"},
  };
  for (const Case& c : cases) {
    const CliRun r = run_cli(c.args, tmp);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out << r.err;
    if (c.message != nullptr) {
      EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
    }
  }
}

// An explicit --baseline is read before anything runs, in every build: a file that cannot be
// read or parsed exits 2 naming it.
TEST(BenchCli, UnreadableBaselineExits2NamingTheFile) {
  TempDir tmp;
  const std::string missing = tmp / "missing.json", broken = tmp / "broken.json";
  {
    std::ofstream(broken) << "{\"copy_GBps\": ";
  }
  for (const std::string& path : {missing, broken}) {
    const CliRun r = run_cli("bench --device cuda --baseline '" + path + "'", tmp);
    EXPECT_EQ(r.code, 2) << path << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("--baseline " + path), std::string::npos) << r.err;
  }
}

TEST(BenchCli, CudaWithoutGpuExits2WithTheReason) {
  if (cuda_device_available()) GTEST_SKIP() << "a GPU is visible: the bench runs (scripts/device-check.sh)";
  TempDir tmp;
  for (const char* args : {"bench --device cuda --workload decode256 --pdl-early-metadata",
                           "bench --device cuda --workload decode256 --no-pdl",
                           "bench --device cuda --read --op decode --batch 2"}) {
    const CliRun r = run_cli(args, tmp);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(built_with_cuda() ? "no CUDA device" : "built without CUDA"), std::string::npos)
        << args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace dsv41kv::test
