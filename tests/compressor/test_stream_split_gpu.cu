// The ratio-1 streaming kernel's work split (compressor/cuda/params.hpp), checked on the host
// (these tests need no GPU): for every grid the launcher can pick, the warps' shares
// (stream_share with the host's N / W and N % W) cover the tokens [0, N) exactly once, in
// order, and no share exceeds one chunk (the kernel's chunk loop runs once per warp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "compressor/cuda/params.hpp"

namespace dsv41kv::test {
namespace {

using detail::cuda::stream_blocks_r1;
using detail::cuda::stream_range;
using detail::cuda::stream_split_r1;
using detail::cuda::StreamSplitR1;
using detail::cuda::stream_shape_r1;
using detail::cuda::StreamShape;

// Checks the split of N tokens over the grid stream_split_r1(N, C, fit, shape) picks (fatal
// failures: call it under ASSERT_NO_FATAL_FAILURE): every warp's range (stream_range) starts
// where the previous one ended, the last ends at N, no share exceeds one chunk, and every token
// of a head or tail part goes to a warp of at most that part's chunk.
void check_split(int64_t N, int64_t C, int64_t fit, const StreamShape& shape = {}) {
  const StreamSplitR1 s = stream_split_r1(N, C, fit, shape);
  const int64_t blocks = s.blocks;
  ASSERT_GE(blocks, 1) << "N " << N;
  const int64_t W = 4 * blocks;
  ASSERT_GE(W * C, N) << "grid of " << blocks << " blocks leaves tokens without a chunk, N " << N;
  ASSERT_EQ(s.seg[0].w0, 0);
  bool shaped = shape.nhead > 0 || shape.ntail > 0;
  for (int k = 0; k < shape.nhead; ++k) shaped = shaped && shape.head[k].chunk < C;
  for (int k = 0; k < shape.ntail; ++k) shaped = shaped && shape.tail[k].chunk < C;
  if (!shaped) {
    ASSERT_EQ(blocks, stream_blocks_r1(N, C, fit));
    for (int k = 1; k < detail::cuda::kStreamSegs; ++k) ASSERT_EQ(s.seg[k].w0, INT64_MAX);
  }
  // the token ranges of the parts, in token order: heads, body, tails (clipped as the split does)
  std::vector<std::pair<int64_t, int64_t>> limit;  // (first token past the part, its chunk)
  if (shaped) {
    int64_t left = N, at = 0;
    for (int k = 0; k < shape.nhead; ++k) {
      const int64_t t = std::min(left, shape.head[k].warps * shape.head[k].chunk);
      at += t;
      left -= t;
      limit.push_back({at, shape.head[k].chunk});
    }
    std::vector<int64_t> tail_tokens(shape.ntail);
    for (int k = shape.ntail - 1; k >= 0; --k) {
      tail_tokens[k] = std::min(left, shape.tail[k].warps * shape.tail[k].chunk);
      left -= tail_tokens[k];
    }
    at += left;
    limit.push_back({at, C});
    for (int k = 0; k < shape.ntail; ++k) {
      at += tail_tokens[k];
      limit.push_back({at, shape.tail[k].chunk});
    }
    ASSERT_EQ(at, N);
  }
  int64_t next = 0;
  for (int64_t w = 0; w < W; ++w) {
    int64_t lo = -1, hi = -1;
    stream_range(w, s.seg, lo, hi);
    ASSERT_EQ(lo, next) << "warp " << w << " of " << W << ", N " << N << ", C " << C << ", fit " << fit;
    ASSERT_GE(hi, lo);
    ASSERT_LE(hi - lo, C) << "warp " << w << " share " << hi - lo << " > chunk " << C << ", N " << N;
    for (const auto& [end, chunk] : limit)
      if (lo < end) {
        ASSERT_LE(hi, end) << "warp " << w << " crosses a part boundary, N " << N;
        ASSERT_LE(hi - lo, chunk) << "warp " << w << " share " << hi - lo << " > its part's chunk, N " << N;
        break;
      }
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

TEST(StreamSplitHost, ShapedGridsCoverEveryTokenOnce) {
  std::mt19937_64 rng(20261130);
  for (int64_t C : {8, 16})
    for (int trial = 0; trial < 600; ++trial) {
      StreamShape shape;
      shape.nhead = static_cast<int>(rng() % 3);
      shape.ntail = static_cast<int>(rng() % 4);
      for (int k = 0; k < shape.nhead; ++k)
        shape.head[k] = {1 + static_cast<int64_t>(rng() % 4000), 1 + static_cast<int64_t>(rng() % (C - 1))};
      for (int k = 0; k < shape.ntail; ++k)
        shape.tail[k] = {1 + static_cast<int64_t>(rng() % 4000), 1 + static_cast<int64_t>(rng() % (C - 1))};
      const int64_t N = trial % 4 == 0 ? 262144 : 1 + static_cast<int64_t>(rng() % 40000);
      ASSERT_NO_FATAL_FAILURE(check_split(N, C, 924, shape));
    }
  StreamShape three;
  three.nhead = 2;
  three.head[0] = {5, 2};
  three.head[1] = {3, 6};
  three.ntail = 3;
  three.tail[0] = {7, 4};
  three.tail[1] = {5, 2};
  three.tail[2] = {3, 1};
  for (int64_t N = 1; N <= 300; ++N) ASSERT_NO_FATAL_FAILURE(check_split(N, 8, 924, three));
  // 256K, chunk 8, one wave of 3696 warps with 2 tokens at the end: 7392 tail tokens
  StreamShape one;
  one.ntail = 1;
  one.tail[0] = {3696, 2};
  const StreamSplitR1 s = stream_split_r1(262144, 8, 924, one);
  EXPECT_EQ(s.seg[1].t0, 262144 - 7392);
  EXPECT_EQ(s.seg[1].w0, (262144 - 7392) / 8);
  EXPECT_EQ(s.blocks, ((262144 - 7392) / 8 + 3696) / 4);
  // parts asking for more tokens than there are: the head first, then the last tail part
  StreamShape big;
  big.nhead = 1;
  big.head[0] = {50, 4};
  big.ntail = 2;
  big.tail[0] = {100, 4};
  big.tail[1] = {100, 2};
  const StreamSplitR1 b = stream_split_r1(500, 8, 924, big);
  EXPECT_EQ(b.seg[1].t0, 200);  // the body is empty: segment 1 is tail part 0
  EXPECT_EQ(b.seg[2].t0, 300);
}

// The launcher's shape (stream_shape_r1): the tapered tail on grids of at least two waves of one
// chunk per warp (in waves of the resident warps: chunk 8, half a wave of 4, one of 2, a quarter
// of 1; chunk 16, half a wave of 8, half of 4, a quarter of 2), none below; a tuning's taper
// replaces it, its parts with a chunk >= C left out.
TEST(StreamSplitHost, LauncherShapes) {
  for (int64_t C : {8, 16}) {
    const StreamShape s = stream_shape_r1(262144, C, 924);
    ASSERT_EQ(s.nhead, 0);
    ASSERT_EQ(s.ntail, 3);
    const int64_t warps8[3] = {1848, 3696, 924}, chunks8[3] = {4, 2, 1};
    const int64_t warps16[3] = {1848, 1848, 924}, chunks16[3] = {8, 4, 2};
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(s.tail[k].warps, C == 8 ? warps8[k] : warps16[k]) << "C " << C << ", part " << k;
      EXPECT_EQ(s.tail[k].chunk, C == 8 ? chunks8[k] : chunks16[k]) << "C " << C << ", part " << k;
    }
  }
  // two waves of one chunk per warp: 2 * 924 blocks of 4 warps of 8 tokens
  EXPECT_EQ(stream_shape_r1((2 * 924 - 1) * 32 + 1, 8, 924).ntail, 3);
  EXPECT_EQ(stream_shape_r1((2 * 924 - 1) * 32, 8, 924).ntail, 0);
  EXPECT_EQ(stream_shape_r1(32768, 16, 924).ntail, 0);
  StreamTaper tp;
  tp.set = true;
  tp.ntail = 1;
  tp.tail_waves[0] = 0.5;
  tp.tail_chunk[0] = 8;
  EXPECT_EQ(stream_shape_r1(262144, 8, 924, tp).ntail, 0);  // chunk 8 is no taper of chunk 8
  const StreamShape o = stream_shape_r1(1000, 16, 924, tp);  // any grid size
  ASSERT_EQ(o.ntail, 1);
  EXPECT_EQ(o.tail[0].warps, 1848);
  EXPECT_EQ(o.tail[0].chunk, 8);
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
