// `dsv41kv demo --device cuda`: the library's serving step on the GPU (cuBLAS projection, CUDA
// metadata builders, compress, insert, read-back gather): exit 0, every record read back by the
// library's rule against the latents the GPU wrote, the same steps and write counts as the CPU
// run (which test_demo holds against the workload; metadata is exact and only the projection's
// accumulation order differs, which moves values but not which rows are written), a GPU time per
// step, and a read-back check that fails on the device too when the expectation is wrong; the read
// path's demo on the device against the CPU run and its --verify.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/gpu_util.hpp"
#include "support/cli.hpp"

namespace dsv41kv::test {
namespace {

class DemoGpu : public GpuTest {};

TEST_F(DemoGpu, DeviceCudaRunsAndReadsBackItsRecords) {
  TempDir tmp;
  const CliRun g = run_cli("demo --write-path --device cuda --json --seed 11", tmp);
  ASSERT_EQ(g.code, 0) << g.out << g.err;
  const CliRun c = run_cli("demo --write-path --json --seed 11", tmp);
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  const auto jg = nlohmann::json::parse(g.out), jc = nlohmann::json::parse(c.out);
  EXPECT_EQ(jg["device"], "cuda");
  ASSERT_EQ(jg["steps"].size(), jc["steps"].size());
  for (size_t i = 0; i < jg["steps"].size(); ++i) {
    EXPECT_GT(jg["steps"][i]["gpu_ms"].get<double>(), 0.0);
    EXPECT_EQ(jg["steps"][i]["layers"], jc["steps"][i]["layers"]) << "step " << i;
  }
  for (const auto& l : jg["layers"]) EXPECT_EQ(l["readback_bad_records"], 0) << l.dump();
  EXPECT_EQ(jg["layers"].size(), jc["layers"].size());
  const CliRun t = run_cli("demo --write-path --device cuda", tmp);
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("gpu ms"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("0 bad records"), std::string::npos) << t.out;
  const CliRun m = run_cli("demo --write-path --device cuda --ratio 1 --format nvfp4_288 --mutation wrong-expectation", tmp);
  EXPECT_EQ(m.code, 1) << m.out << m.err;
  EXPECT_NE(m.err.find("nvfp4_288: token "), std::string::npos) << m.err;
}

// The read path's demo on the GPU: the same steps and per-layer counts as the CPU run (records
// written, index keys, top-k entries, shortcut, window keys: exact facts of the metadata and the
// top-k sets), and --verify passes with its GPU-vs-CPU line.
TEST_F(DemoGpu, ReadPathOnTheDeviceMatchesTheCpuAndVerifies) {
  TempDir tmp;
  const std::string args = " --json --seed 5 --heads 8 --workload-scale 0.1";
  const CliRun g = run_cli("demo --device cuda" + args, tmp);
  ASSERT_EQ(g.code, 0) << g.out << g.err;
  const CliRun c = run_cli("demo" + args, tmp);
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  const auto jg = nlohmann::json::parse(g.out), jc = nlohmann::json::parse(c.out);
  EXPECT_EQ(jg["device"], "cuda");
  ASSERT_EQ(jg["steps"].size(), jc["steps"].size());
  for (size_t i = 0; i < jg["steps"].size(); ++i) {
    const auto& lg = jg["steps"][i]["layers"];
    const auto& lc = jc["steps"][i]["layers"];
    ASSERT_EQ(lg.size(), lc.size());
    for (size_t L = 0; L < lg.size(); ++L)
      for (const char* k : {"swa_records", "compressed_records", "index_keys", "shortcut", "topk_entries", "topk_max",
                            "candidate_blocks", "swa_keys", "prefill_chunks"})
        EXPECT_EQ(lg[L][k], lc[L][k]) << "step " << i << ", layer " << L << ": " << k;
  }
  const CliRun v = run_cli("demo --device cuda --verify --seed 5 --heads 8 --workload-scale 0.06 --dense-stride 7", tmp);
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("workload on the GPU vs the CPU"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("FAIL"), std::string::npos) << v.out;
}

}  // namespace
}  // namespace dsv41kv::test
