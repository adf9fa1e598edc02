// The read order of a decode launch under programmatic dependent launch (ExecContext::
// programmatic_launch) with pdl_early_metadata: the promise covers only the step metadata
// (positions, slot mappings, qsl, token_to_req, insert slots) and norm_weight, so everything else
// (here prev_row_indices of a PCP launch) must be read after the grid dependency resolved. The
// kernel before the compress launch lets its dependents start at once and writes the indices
// only ~20 us later: a launch that read them early sees the stale values and its latents differ
// from the CPU's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/cuda/cuda_util.hpp"
#include "dsv41kv/compressor.hpp"
#include "support/gpu_batch.hpp"

namespace dsv41kv::test {
namespace {

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Lets the next kernel of the stream (launched with PDL) start, waits delay_ns, then copies n
// indices from src to dst.
__global__ void late_index_writer(const int64_t* src, int64_t* dst, int n, unsigned long long delay_ns) {
  detail::pdl_allow_dependents();
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < delay_ns) {
  }
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) dst[i] = src[i];
}

class PdlOrderGpu : public GpuTest {};

TEST_F(PdlOrderGpu, EarlyMetadataDecodeReadsPrevRowIndicesAfterTheDependency) {
  GpuBatchSpec s;  // ratio-2 PCP decode: 200 requests x 1 token (the four-warp kernel)
  s.ratio = 2;
  s.num_reqs = 200;
  s.min_len = 1;
  s.max_len = 1;
  s.pcp = true;
  GpuBatch b = GpuBatch::make(s, rng());
  b.prev_idx.assign(static_cast<size_t>(s.num_reqs), 0);
  for (auto& g : b.prev_idx) g = rng().integer(0, s.G - 1);  // every request has a gathered row
  const GpuBatch init = b;  // inputs and canary outputs, before the CPU runs
  // CPU with the indices, and with stale ones (all -1: predecessors from the ring) to show that
  // a launch reading the stale indices fails this test
  GpuBatch stale = init;
  std::fill(stale.prev_idx.begin(), stale.prev_idx.end(), int64_t{-1});
  compress_insert(compress_insert_args(b, nullptr, true));
  compress_insert(compress_insert_args(stale, nullptr, true));
  ASSERT_NE(b.latent, stale.latent) << "the batch must have requests whose latent uses prev_rows";

  const DeviceBuffer<int64_t> staged(init.prev_idx);
  const std::vector<int64_t> stale_idx(init.prev_idx.size(), -1);
  cudaStream_t st;
  GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (bool early : {false, true}) {
    GpuBatchDev d(init);
    d.prev_idx.upload(stale_idx);
    ExecContext ctx;
    ctx.stream = st;
    ctx.programmatic_launch = true;
    ctx.pdl_early_metadata = early;
    late_index_writer<<<1, 128, 0, st>>>(staged.data(), d.prev_idx.data(), static_cast<int>(stale_idx.size()),
                                         20000);
    GPU_CHECK(cudaGetLastError());
    compress_insert(compress_insert_args(b, &d, true), ctx);
    GPU_CHECK(cudaStreamSynchronize(st));
    EXPECT_TRUE(outputs_equal(b, d, std::string("pcp decode after a late index writer, pdl") +
                                        (early ? " + early metadata" : "")));
  }
  GPU_CHECK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace dsv41kv::test
