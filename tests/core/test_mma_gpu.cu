// The tensor-core primitives of core/cuda/mma.cuh on the device: one warp builds its fragments
// with ldmatrix from swizzled shared tiles at the addresses of a_frag_addr, bt_frag_addr,
// bt_frag2k_addr and b_trans_frag_addr and multiplies with mma_bf16_16816; the products equal the
// host's bit for bit (small integer values: every partial sum is exact in fp32). Both operand
// forms of the attention: S = Q K^T (K stored [n][k]) and O = P V (V stored [k][n], .trans).
// Plus host checks of the swizzle (a bijection of the chunks of each row).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/cuda/memory.cuh"
#include "core/cuda/mma.cuh"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

using namespace dsv41kv::detail::cuda;

constexpr int kM = 16, kK = 64, kN = 64;  // A [16 x 64], B [64 x 64]
constexpr int kChunksRow = kK * 2 / 16;   // 8 chunks of a 64-element bf16 row
static_assert(kK == kN, "one row width for every tile of the test");

// Copies a row-major [rows x 64] bf16 matrix into a swizzled shared tile.
__device__ void to_tile(const uint16_t* g, uint8_t* s, int rows) {
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunksRow; c += 32) {
    const int r = c / kChunksRow, ch = c % kChunksRow;
    *reinterpret_cast<uint4*>(s + (tile_addr(0, r, ch, kChunksRow))) =
        *reinterpret_cast<const uint4*>(g + r * kK + 8 * ch);
  }
}

// form 0: C = A B from B^T [n][k] with bt_frag_addr (pairs of n-tiles);
// form 1: the same with bt_frag2k_addr (one n-tile, two k-steps a load);
// form 2: C = A B from B [k][n] with b_trans_frag_addr (.trans).
__global__ void mma_kernel(const uint16_t* a, const uint16_t* bt, const uint16_t* b, int form, float* c) {
  __shared__ __align__(128) uint8_t sa[kM * kK * 2], sb[kK * kN * 2];
  to_tile(a, sa, kM);
  to_tile(form == 2 ? b : bt, sb, form == 2 ? kK : kN);
  __syncwarp();
  const int lane = static_cast<int>(threadIdx.x);
  const uint32_t A = smem_address(sa), B = smem_address(sb);
  float acc[kN / 8][4] = {};
  for (int kk = 0; form != 1 && kk < kK / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, a_frag_addr(A, 0, 2 * kk, lane, kChunksRow));
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t bf[4];
      if (form == 0) ldmatrix_x4(bf, bt_frag_addr(B, 16 * np, 2 * kk, lane, kChunksRow));
      else ldmatrix_x4_trans(bf, b_trans_frag_addr(B, 16 * kk, 2 * np, lane, kChunksRow));
      mma_bf16_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_bf16_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
  if (form == 1) {
    for (int kk = 0; kk < kK / 16; kk += 2) {
      uint32_t a0[4], a1[4];
      ldmatrix_x4(a0, a_frag_addr(A, 0, 2 * kk, lane, kChunksRow));
      ldmatrix_x4(a1, a_frag_addr(A, 0, 2 * kk + 2, lane, kChunksRow));
      for (int nt = 0; nt < kN / 8; ++nt) {
        uint32_t bf[4];
        ldmatrix_x4(bf, bt_frag2k_addr(B, 8 * nt, 2 * kk, lane, kChunksRow));
        mma_bf16_16816(acc[nt], a0, bf[0], bf[1]);
        mma_bf16_16816(acc[nt], a1, bf[2], bf[3]);
      }
    }
  }
  const int g = lane / 4, t = lane % 4;
  for (int nt = 0; nt < kN / 8; ++nt) {
    c[g * kN + 8 * nt + 2 * t] = acc[nt][0];
    c[g * kN + 8 * nt + 2 * t + 1] = acc[nt][1];
    c[(g + 8) * kN + 8 * nt + 2 * t] = acc[nt][2];
    c[(g + 8) * kN + 8 * nt + 2 * t + 1] = acc[nt][3];
  }
}

class MmaGpu : public GpuTest {};

TEST_F(MmaGpu, FragmentsAndAddressesGiveTheHostProduct) {
  std::vector<uint16_t> a(kM * kK), b(kK * kN), bt(kN * kK);
  std::vector<float> fa(a.size()), fb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    fa[i] = static_cast<float>(rng().integer(-3, 3));
    a[i] = num::bf16_encode(fa[i]);
  }
  for (int k = 0; k < kK; ++k)
    for (int n = 0; n < kN; ++n) {
      const float v = static_cast<float>(rng().integer(-3, 3));
      fb[static_cast<size_t>(k * kN + n)] = v;
      b[static_cast<size_t>(k * kN + n)] = bt[static_cast<size_t>(n * kK + k)] = num::bf16_encode(v);
    }
  std::vector<float> want(kM * kN, 0.0f);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n)
      for (int k = 0; k < kK; ++k)
        want[static_cast<size_t>(m * kN + n)] += fa[static_cast<size_t>(m * kK + k)] * fb[static_cast<size_t>(k * kN + n)];
  DeviceBuffer<uint16_t> da(a), db(b), dbt(bt);
  for (int form = 0; form < 3; ++form) {
    DeviceBuffer<float> dc(std::vector<float>(kM * kN, -999.0f));
    mma_kernel<<<1, 32>>>(da.data(), dbt.data(), db.data(), form, dc.data());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dc.download() == want) << "form " << form;
  }
}

TEST(MmaHost, SwizzleIsABijectionOfEachRowsChunks) {
  for (const int chunks : {8, 64})
    for (int r = 0; r < 64; ++r) {
      std::vector<int> seen(static_cast<size_t>(chunks), 0);
      for (int c = 0; c < chunks; ++c) ++seen[static_cast<size_t>(swizzle_chunk(r, c))];
      for (int c = 0; c < chunks; ++c) EXPECT_EQ(seen[static_cast<size_t>(c)], 1) << "row " << r << " chunk " << c;
      // the 8 rows of one ldmatrix matrix (same logical chunk) land in 8 different bank groups
      if (r % 8 == 0)
        for (int c = 0; c < chunks; ++c) {
          std::vector<int> group(8, 0);
          for (int i = 0; i < 8; ++i) ++group[static_cast<size_t>(swizzle_chunk(r + i, c) % 8)];
          for (int x = 0; x < 8; ++x) EXPECT_EQ(group[static_cast<size_t>(x)], 1);
        }
    }
}

}  // namespace
}  // namespace dsv41kv::test
