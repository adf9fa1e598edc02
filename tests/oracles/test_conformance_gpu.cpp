// The conformance files through the CUDA path (README agreement rules).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "dsv41kv/conformance.hpp"
#include "support/gpu_util.hpp"
#include "support/paths.hpp"

namespace dsv41kv::test {
namespace {

class ConformanceGpu : public GpuTest {};

TEST_F(ConformanceGpu, FilesThroughCuda) {
  namespace fs = std::filesystem;
  int ran = 0;
  for (const char* f : {"compress_r1_shared.safetensors", "compress_r2_shared.safetensors"}) {
    const std::string path = conformance_dir() + "/" + f;
    if (!fs::exists(path)) continue;
    conformance::Options o;
    o.device = Device::CUDA;
    const conformance::FileResult r = conformance::run_file(path, o);
    EXPECT_EQ(r.failed(), 0) << path;
    if (r.failed() != 0)
      for (const auto& line : conformance::report(r)) std::printf("%s\n", line.c_str());
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no conformance files under " << conformance_dir();
}

}  // namespace
}  // namespace dsv41kv::test
