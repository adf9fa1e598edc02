// The tensor-core primitives of core/cuda/mma.cuh on the device: one warp builds its fragments
// with ldmatrix from swizzled shared tiles at the addresses of a_frag_addr, bt_frag_addr,
// bt_frag2k_addr and b_trans_frag_addr and multiplies with mma_bf16_16816; the products equal the
// host's bit for bit (small integer values: every partial sum is exact in fp32). Both operand
// forms of the attention: S = Q K^T (K stored [n][k]) and O = P V (V stored [k][n], .trans).
// Plus host checks of the swizzle (a bijection of the chunks of each row). The warpgroup forms of
// core/cuda/wgmma.cuh likewise: S = Q K^T with m64n64k16 from two K-major 128-byte-swizzled tiles
// and O = P V with m64n256k16, P in registers (A fragments) and V MN-major from the same kind of
// tile, at the descriptors the 64-head sparse MLA kernel uses.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/cuda/memory.cuh"
#include "core/cuda/mma.cuh"
#include "core/cuda/wgmma.cuh"
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

// Copies a row-major [64 x W] bf16 matrix into a 128-byte-swizzled tile of 64 rows (W / 64
// sub-tiles), 128 threads.
__device__ void to_sw128(const uint16_t* g, uint8_t* s, int width) {
  const int chunks = width / 8;
  for (int c = static_cast<int>(threadIdx.x); c < 64 * chunks; c += 128) {
    const int r = c / chunks, ch = c % chunks;
    *reinterpret_cast<uint4*>(s + sw128_offset(64, r, ch)) = *reinterpret_cast<const uint4*>(g + r * width + 8 * ch);
  }
}

constexpr int kWgK = 128;  // S: [64 x 128] x [128 x 64]
constexpr int kWgN = 256;  // PV: [64 x 64] x [64 x 256]

// form 0: C [64 x 64] = A [64 x 128] B (B^T stored [64 keys][128], both K-major tiles);
// form 1: C [64 x 256] = P [64 x 64] V [64 x 256], P from registers, V an MN-major tile.
__global__ void __launch_bounds__(128) wgmma_kernel(const uint16_t* a, const uint16_t* b, int form, float* c) {
  extern __shared__ __align__(1024) uint8_t wsm[];
  const uint32_t raw = smem_address(wsm);
  uint8_t* sm = wsm + (((raw + 1023u) & ~1023u) - raw);
  uint8_t* sa = sm;
  uint8_t* sb = sm + 64 * kWgK * 2;
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
#if defined(DSV41KV_WGMMA)
  if (form == 0) {
    to_sw128(a, sa, kWgK);
    to_sw128(b, sb, kWgK);
    fence_proxy_async_shared();
    __syncthreads();
    float d[32];
    wgmma_fence();
    for (int kk = 0; kk < kWgK / 16; ++kk) {
      const uint32_t off = static_cast<uint32_t>((kk / 4) * (64 * 128) + (kk % 4) * 32);
      wgmma_m64n64k16_ss<0>(d, sw128_desc(smem_address(sa) + off, 16, 1024), sw128_desc(smem_address(sb) + off, 16, 1024),
                            kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    for (int j = 0; j < 8; ++j)
      for (int x = 0; x < 4; ++x) c[(16 * w + g + 8 * (x / 2)) * 64 + 8 * j + 2 * t + (x % 2)] = d[4 * j + x];
  } else {
    to_sw128(b, sb, kWgN);
    fence_proxy_async_shared();
    __syncthreads();
    float d[128];
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
    uint32_t af[4][4];
    const auto at = [&](int r, int k) { return static_cast<uint32_t>(a[r * 64 + k]); };
    for (int kk = 0; kk < 4; ++kk) {
      const int r0 = 16 * w + g, k0 = 16 * kk + 2 * t;
      af[kk][0] = at(r0, k0) | at(r0, k0 + 1) << 16;
      af[kk][1] = at(r0 + 8, k0) | at(r0 + 8, k0 + 1) << 16;
      af[kk][2] = at(r0, k0 + 8) | at(r0, k0 + 9) << 16;
      af[kk][3] = at(r0 + 8, k0 + 8) | at(r0 + 8, k0 + 9) << 16;
    }
    wgmma_fence_operands(d);
    wgmma_fence();
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_rs<1>(d, af[kk], sw128_desc(smem_address(sb) + static_cast<uint32_t>(kk * 2048), 64 * 128, 1024), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    for (int j = 0; j < 32; ++j)
      for (int x = 0; x < 4; ++x) c[(16 * w + g + 8 * (x / 2)) * kWgN + 8 * j + 2 * t + (x % 2)] = d[4 * j + x];
  }
#else
  (void)a, (void)b, (void)form, (void)c, (void)sa, (void)sb, (void)w, (void)g, (void)t, (void)tid, (void)lane;
  __trap();
#endif
}

TEST_F(MmaGpu, WarpgroupFormsGiveTheHostProduct) {
  const auto mat = [&](int rows, int cols, std::vector<uint16_t>& bits) {
    std::vector<float> f(static_cast<size_t>(rows * cols));
    bits.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = static_cast<float>(rng().integer(-3, 3));
      bits[i] = num::bf16_encode(f[i]);
    }
    return f;
  };
  const int smem = 64 * kWgK * 2 + 64 * kWgN * 2 + 1024;
  ASSERT_EQ(cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  {  // S = A B with B^T stored [n][k]
    std::vector<uint16_t> a, bt;
    const std::vector<float> fa = mat(64, kWgK, a), fbt = mat(64, kWgK, bt);
    std::vector<float> want(64 * 64, 0.0f);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < 64; ++n)
        for (int k = 0; k < kWgK; ++k)
          want[static_cast<size_t>(m * 64 + n)] += fa[static_cast<size_t>(m * kWgK + k)] * fbt[static_cast<size_t>(n * kWgK + k)];
    DeviceBuffer<uint16_t> da(a), db(bt);
    DeviceBuffer<float> dc(std::vector<float>(64 * 64, -999.0f));
    wgmma_kernel<<<1, 128, smem>>>(da.data(), db.data(), 0, dc.data());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dc.download() == want) << "S = Q K^T (m64n64k16, K-major tiles)";
  }
  {  // O = P V with V stored [k][n]
    std::vector<uint16_t> pm, v;
    const std::vector<float> fp = mat(64, 64, pm), fv = mat(64, kWgN, v);
    std::vector<float> want(64 * kWgN, 0.0f);
    for (int m = 0; m < 64; ++m)
      for (int n = 0; n < kWgN; ++n)
        for (int k = 0; k < 64; ++k)
          want[static_cast<size_t>(m * kWgN + n)] += fp[static_cast<size_t>(m * 64 + k)] * fv[static_cast<size_t>(k * kWgN + n)];
    DeviceBuffer<uint16_t> da(pm), db(v);
    DeviceBuffer<float> dc(std::vector<float>(64 * kWgN, -999.0f));
    wgmma_kernel<<<1, 128, smem>>>(da.data(), db.data(), 1, dc.data());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dc.download() == want) << "O = P V (m64n256k16, A in registers, V MN-major)";
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
