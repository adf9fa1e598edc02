// The cuBLAS projection (projection_cuda.hpp) vs the CPU projection (projection.hpp): bf16
// operands, fp32 accumulation and output. The accumulation orders differ, so the comparison is
// within fp32 rounding of a length-H sum: |gpu - cpu| <= 2^-20 * sum_k |x_k w_k| per element.
// Also: no per-call allocation (graph capture of project() succeeds) and shape checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dsv41kv/projection.hpp"
#include "dsv41kv/projection_cuda.hpp"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

class ProjectionGpu : public GpuTest {};

TEST_F(ProjectionGpu, MatchesCpuWithinAccumulationRounding) {
  for (int ratio : {1, 2}) {
    const int64_t T = rng().integer(1, 64), H = 5120, O = 512 * ratio;
    std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * H), rng());
    std::vector<uint16_t> w = random_bf16(static_cast<size_t>(O * H), rng(), 1.0 / std::sqrt(5120.0));
    std::vector<float> ref(static_cast<size_t>(T * O), NAN);
    project_kv_score(TensorView::contiguous(x.data(), DType::BF16, {T, H}),
                     TensorView::contiguous(w.data(), DType::BF16, {O, H}),
                     TensorView::contiguous(ref.data(), DType::F32, {T, O}));
    DeviceBuffer<uint16_t> dx(x), dw(w);
    DeviceBuffer<float> dout(std::vector<float>(static_cast<size_t>(T * O), NAN));
    CublasProjection proj;
    cudaStream_t st;
    GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ExecContext ctx;
    ctx.stream = st;
    proj.project(dx.view({T, H}), dw.view({O, H}), dout.view({T, O}), ctx);
    GPU_CHECK(cudaStreamSynchronize(st));
    const std::vector<float> got = dout.download();
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < O; ++o) {
        double mag = 0;
        for (int64_t k = 0; k < H; ++k)
          mag += std::fabs(static_cast<double>(num::bf16_decode(x[static_cast<size_t>(t * H + k)])) *
                           num::bf16_decode(w[static_cast<size_t>(o * H + k)]));
        const double d = std::fabs(static_cast<double>(got[static_cast<size_t>(t * O + o)]) -
                                   ref[static_cast<size_t>(t * O + o)]);
        if (!(d <= mag * std::ldexp(1.0, -20))) ++bad;
      }
    EXPECT_EQ(bad, 0) << "ratio " << ratio << " T " << T;

    // capturable: no allocation or synchronisation inside project()
    cudaGraph_t g;
    cudaGraphExec_t ge;
    GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    proj.project(dx.view({T, H}), dw.view({O, H}), dout.view({T, O}), ctx);
    GPU_CHECK(cudaStreamEndCapture(st, &g));
    GPU_CHECK(cudaGraphInstantiate(&ge, g, 0));
    GPU_CHECK(cudaMemsetAsync(dout.data(), 0xFF, dout.size() * sizeof(float), st));  // on st: ordered before the replay
    GPU_CHECK(cudaGraphLaunch(ge, st));
    GPU_CHECK(cudaStreamSynchronize(st));
    EXPECT_TRUE(bits_equal(got, dout.download(), "graph replay of the projection"));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(st);

    EXPECT_THROW(proj.project(dx.view({T, H}), dw.view({O, H}), dout.view({T, O - 1})), Error);
  }
}

}  // namespace
}  // namespace dsv41kv::test
