// The fast device forms of the compressor's pooling and RMSNorm (formats/cuda/compress_math.cuh,
// the device reciprocal of cmath::rms_inverse) against the exact forms of compress_math.hpp:
//   * pool2_fast vs cmath::pool2: 2^26 random quadruples and all combinations of special values;
//   * pool_weights_fast vs the two IEEE divisions on every ex of its range;
//   * __frcp_rn vs __fdiv_rn(1, x) on every float.
// Plus a host-side version of the first (it also runs without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "formats/cuda/compress_math.cuh"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

using namespace dsv41kv::detail::cuda;

__device__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__global__ void pool2_kernel(unsigned long long* mismatches, uint32_t seed) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t h = hash32(i ^ seed);
  float q[4];
  for (int k = 0; k < 4; ++k) {
    h = hash32(h + 0x9E3779B9u);
    // random sign/exponent in a useful range, random mantissa
    const uint32_t e = 100 + (h % 50);
    q[k] = num::u2f(((h & 1u) << 31) | (e << 23) | ((h >> 5) & 0x7FFFFFu));
  }
  if ((i & 7u) == 0) q[3] = q[1];  // equal scores
  const float a = pool2_fast(q[0], q[1], q[2], q[3]);
  const float b = cmath::pool2(q[0], q[1], q[2], q[3]);
  if (num::f2u(a) != num::f2u(b)) atomicAdd(mismatches, 1ull);
}

__global__ void pool2_special_kernel(unsigned long long* mismatches) {
  const float sp[11] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 1.f, -1.f, 1e30f, -1e30f, 200.f, -200.f};
  const int i = static_cast<int>(threadIdx.x + blockIdx.x * blockDim.x);
  if (i >= 11 * 11 * 11 * 11) return;
  const float a = sp[i % 11], b = sp[(i / 11) % 11], c = sp[(i / 121) % 11], d = sp[i / 1331];
  const float x = pool2_fast(a, b, c, d), y = cmath::pool2(a, b, c, d);
  if (num::f2u(x) != num::f2u(y)) atomicAdd(mismatches, 1ull);
}

// pool_weights_fast vs the two IEEE divisions for every ex with pool_fast_range(ex) (every float
// pattern is tried): every GPU run re-proves the shared reciprocal seed on the hardware it runs on.
__global__ void pool_weights_sweep_kernel(unsigned long long* bad) {
  unsigned long long b = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    const float x = num::u2f(static_cast<uint32_t>(u));
    if (pool_fast_range(x)) {
      float w1, wx;
      pool_weights_fast(x, w1, wx);
      const float den = num::add_rn(1.0f, x);
      b += num::f2u(w1) != num::f2u(num::div_rn(1.0f, den)) || num::f2u(wx) != num::f2u(num::div_rn(x, den));
    }
  }
  if (b) atomicAdd(bad, b);
}

// __frcp_rn(x) (cmath::rms_inverse's reciprocal on the device) against __fdiv_rn(1, x) for every
// float bit pattern (NaN inputs: both NaN).
__global__ void reciprocal_kernel(unsigned long long* mismatches, uint32_t* first) {
  const uint32_t base = (blockIdx.x * blockDim.x + threadIdx.x) * 1024u;
  for (uint32_t j = 0; j < 1024u; ++j) {
    const float x = num::u2f(base + j);
    const float a = __frcp_rn(x), b = __fdiv_rn(1.0f, x);
    const bool same = num::f2u(a) == num::f2u(b) || (a != a && b != b);
    if (!same) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first, base + j);
    }
  }
}

class CompressMathGpu : public GpuTest {};

TEST_F(CompressMathGpu, ReciprocalEqualsDivision) {
  SweepResult r;
  ASSERT_NO_FATAL_FAILURE(run_sweep(
      [](unsigned long long* cnt, uint32_t* first) { reciprocal_kernel<<<(1u << 22) / 256, 256>>>(cnt, first); }, r));
  EXPECT_EQ(r.mismatches, 0ull) << "first mismatching bit pattern 0x" << std::hex << r.first;
}

TEST_F(CompressMathGpu, Pool2FastEqualsPool2) {
  unsigned long long* cnt;
  GPU_CHECK(cudaMalloc(&cnt, sizeof *cnt));
  GPU_CHECK(cudaMemset(cnt, 0, sizeof *cnt));
  pool2_kernel<<<(1u << 26) / 256, 256>>>(cnt, static_cast<uint32_t>(seed()));
  pool2_special_kernel<<<(14641 + 255) / 256, 256>>>(cnt);
  GPU_CHECK(cudaGetLastError());
  unsigned long long n = 0;
  GPU_CHECK(cudaMemcpy(&n, cnt, sizeof n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(n, 0ull);
  cudaFree(cnt);
}

TEST(CompressMathHost, Pool2FastEqualsPool2) {
  Rng rng(run_seed());
  int64_t bad = 0;
  for (int i = 0; i < 2000000; ++i) {
    float q[4];
    for (auto& v : q) v = static_cast<float>(rng.normal() * (i % 3 == 0 ? 40.0 : 2.0));
    if (i % 5 == 0) q[3] = q[1];
    if (num::f2u(pool2_fast(q[0], q[1], q[2], q[3])) != num::f2u(cmath::pool2(q[0], q[1], q[2], q[3]))) ++bad;
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(CompressMathGpu, PoolWeightsEqualTheIeeeDivisionsOnTheirRange) {
  unsigned long long* bad;
  GPU_CHECK(cudaMalloc(&bad, sizeof *bad));
  GPU_CHECK(cudaMemset(bad, 0, sizeof *bad));
  pool_weights_sweep_kernel<<<132 * 16, 256>>>(bad);
  GPU_CHECK(cudaGetLastError());
  unsigned long long n = 0;
  GPU_CHECK(cudaMemcpy(&n, bad, sizeof n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(n, 0ull) << "pool_weights_fast differs from the IEEE divisions inside pool_fast_range";
  cudaFree(bad);
}

}  // namespace
}  // namespace dsv41kv::test
