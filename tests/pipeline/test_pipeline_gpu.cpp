// The serving step on the GPU against the CPU: the demo's workload through the pipeline on CUDA
// buffers, checked step by step with the same expectations as on the CPU (pipeline_run.hpp:
// kv_score, ring, latents, every cache byte and the read-back, bit for bit against CPU
// computations of the same rows; its inputs make the cuBLAS projection exact), and at the end
// every ring and cache byte and the audit's counts equal to those of the same run on the CPU.
#include <gtest/gtest.h>

#include <vector>

#include "pipeline/pipeline_run.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class PipelineGpu : public GpuTest {};

TEST_F(PipelineGpu, DemoWorkloadMatchesTheCpu) {
  const std::vector<RecordFormat> all(std::begin(kAllRecordFormats), std::end(kAllRecordFormats));
  const uint64_t s = seed() % 1000;
  PipelineRun gpu(Device::CUDA, {2, 1}, all, s);
  gpu.run_all();
  PipelineRun cpu(Device::CPU, {2, 1}, all, s);
  cpu.run_all();
  for (size_t l = 0; l < gpu.layers().size(); ++l) {
    pipeline::KvSourceLayer& gl = *gpu.layers()[l].layer;
    pipeline::KvSourceLayer& cl = *cpu.layers()[l].layer;
    std::vector<uint8_t> a, b;
    gl.ring().download(a, gl.ring().size());
    cl.ring().download(b, cl.ring().size());
    EXPECT_TRUE(bits_equal(b, a, "ring"));
    for (size_t i = 0; i < gl.num_caches(); ++i) {
      gl.cache_buffer(i).download(a, gl.cache_buffer(i).size());
      cl.cache_buffer(i).download(b, cl.cache_buffer(i).size());
      EXPECT_TRUE(bits_equal(b, a, record_info(gl.cache(i).format).name));
    }
    const auto& g = gpu.layers()[l].writes;
    const auto& c = cpu.layers()[l].writes;
    ASSERT_EQ(g.size(), c.size());
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].latents, c[i].latents) << "step " << i;
      EXPECT_EQ(g[i].ring_rows, c[i].ring_rows) << "step " << i;
      EXPECT_EQ(g[i].records, c[i].records) << "step " << i;
    }
  }
  // timings come from CUDA events around the step's work
  EXPECT_GT(gpu.layers()[0].layer->last_timings().projection_ms, 0.0);
  EXPECT_GT(gpu.metadata().last_ms(), 0.0);
}

}  // namespace
}  // namespace dsv41kv::test
