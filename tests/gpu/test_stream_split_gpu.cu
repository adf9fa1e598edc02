// The ratio-1 streaming kernel's work split (compressor/cuda_kernels.hpp), checked on the host
// (these tests need no GPU): for every grid the launcher can pick, the warps' shares
// (stream_share with the host's N / W and N % W) cover the tokens [0, N) exactly once, in
// order, and no share exceeds one chunk (the kernel's chunk loop runs once per warp).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "compressor/cuda_kernels.hpp"

namespace dsv41kv::test {
namespace {

using detail::cuda::stream_blocks_r1;
using detail::cuda::stream_share;

// Checks the split of N tokens over the grid stream_blocks_r1(N, C, fit) picks (fatal failures:
// call it under ASSERT_NO_FATAL_FAILURE).
void check_split(int64_t N, int64_t C, int64_t fit) {
  const int64_t blocks = stream_blocks_r1(N, C, fit);
  ASSERT_GE(blocks, 1) << "N " << N;
  const int64_t W = 4 * blocks;
  ASSERT_GE(W * C, N) << "grid of " << blocks << " blocks leaves tokens without a chunk, N " << N;
  const int64_t q = N / W, r = N % W;
  int64_t next = 0;
  for (int64_t w = 0; w < W; ++w) {
    int64_t lo = -1, hi = -1;
    stream_share(w, q, r, lo, hi);
    ASSERT_EQ(lo, next) << "warp " << w << " of " << W << ", N " << N << ", C " << C << ", fit " << fit;
    ASSERT_GE(hi, lo);
    ASSERT_LE(hi - lo, C) << "warp " << w << " share " << hi - lo << " > chunk " << C << ", N " << N;
    next = hi;
  }
  ASSERT_EQ(next, N) << "shares end at " << next << ", N " << N << ", C " << C << ", fit " << fit;
}

TEST(StreamSplitHost, SharesCoverEveryTokenOnceWithinOneChunk) {
  // fit: resident blocks of an H200 (132 SMs x 7), a small GPU, one block
  for (int64_t fit : {924, 132 * 3, 30, 1})
    for (int64_t C : {8, 16}) {
      for (int64_t N = 1; N <= 3000; ++N) ASSERT_NO_FATAL_FAILURE(check_split(N, C, fit));
      for (int64_t N : {int64_t{32768}, int64_t{32769}, int64_t{262144}, int64_t{262143}, int64_t{1} << 22,
                        (int64_t{1} << 22) + 7})
        ASSERT_NO_FATAL_FAILURE(check_split(N, C, fit));
    }
  std::mt19937_64 rng(20261129);
  for (int k = 0; k < 300; ++k) {
    const int64_t N = 1 + static_cast<int64_t>(rng() % (int64_t{1} << 20));
    const int64_t fit = 1 + static_cast<int64_t>(rng() % 4096);
    ASSERT_NO_FATAL_FAILURE(check_split(N, (rng() & 1) ? 8 : 16, fit));
  }
}

TEST(StreamSplitHost, LargeGridsKeepOneChunkPerWarp) {
  // 256K tokens in chunks of 8 on an H200: 8192 blocks, every warp exactly one full chunk
  EXPECT_EQ(stream_blocks_r1(262144, 8, 924), 8192);
  // 32K tokens in chunks of 16: 512 blocks of one chunk per warp would leave 412 of 924
  // resident slots empty: widened to all 924, shares of 8-9 tokens
  EXPECT_EQ(stream_blocks_r1(32768, 16, 924), 924);
  // tiny N: not below 8 tokens per warp
  EXPECT_EQ(stream_blocks_r1(64, 16, 924), 2);
}

}  // namespace
}  // namespace dsv41kv::test
