// The indexer's scores and top-k on CUDA (SPEC 8.3-8.5, 8.7), in two kernels on ctx.stream:
//
//  1. score_chunk_kernel: block (x = chunk, y = group of up to G consecutive tokens). A chunk is
//     kTopkChunk entries (plain, source) or candidate positions (consumer: position p is entry
//     8 * candidates[t][p / 8] + p % 8). Each run of the group's valid tokens of one request reads
//     the chunk's keys once (16 keys per warp tile, the next tile's bytes loaded while the current
//     one is multiplied) and multiplies them by every token's query on tensor cores (e4m3 widened
//     to f16, mma m16n8k16, fp32 accumulators: core/cuda/mma_fp8.cuh says why not the e4m3 mma);
//     ReLU, x w[t, h], the sum over the 32 heads and x sk[i] stay in registers. The chunk's scores
//     live in shared memory only: the block writes each token's top 512 of them as (score, entry)
//     pairs (ascending entries, then (-inf, -1)) and, for a source, the chunk's 512 block maxima,
//     to the caller's workspace; the optional `scores` output is written from shared memory.
//  2. select_kernel (PDL): one block per token selects the top 512 of its chunks' candidates (the
//     union holds the row's top 512: each chunk kept its own) with SPEC 8.5's ranking and, for a
//     source, the top 2048 of its block scores (the newest +inf): the rows of SPEC 8.5 / 8.7.
//
// The scores are fp32 sums in another order than the CPU's binary64 evaluation: within SPEC 8.8
// (docs/cuda.md has the error bound), so the rows agree with the CPU's as sets up to entries whose
// score lies within the tolerance of the boundary. Device values are trusted as validated for
// host views; what a kernel cannot use (a page outside the cache or the block table) scores -inf.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <limits>

#include "core/cuda/cuda_util.hpp"
#include "core/cuda/mma_fp8.cuh"
#include "core/validate.hpp"
#include "core/cuda/device_info.hpp"
#include "indexer/cuda/backend_cuda.hpp"
#include "indexer/cuda/score_warpgroup.cuh"
#include "indexer/cuda/select_group.cuh"
#include "indexer/cuda/topk_params.cuh"

namespace dsv41kv::detail::cuda {
namespace {

constexpr int kThreads = 256;  // both kernels (the selection's block scan is typed on it)
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 16;                    // the m of one mma: the keys of a warp tile
constexpr int kChunk = static_cast<int>(kTopkChunk);
constexpr int kChunkBlocks = kChunk / kCandidateBlockSize;  // 512 block scores per chunk
constexpr int kQWords = 4 * 4 * 32;              // uint4 per token: 4 head tiles x 4 x 32 lanes
static_assert(kChunk % kTileKeys == 0 && kChunk % kCandidateBlockSize == 0);
static_assert(kChunkBlocks == kIndexTopk, "the workspace's three arrays share one row shape");
static_assert(kIndexHeads == 32 && kIndexHeadDim == 128, "the fragment mapping below");

constexpr float kNegInf = kTopkNegInf;
using BlockScan = cub::BlockScan<int, kThreads>;

// The whole block as one selection group (barrier 0), with its shared state.
struct BlockSelect {
  ThreadGroup<kThreads> grp;
  SelectShared* sh;
};
__device__ __forceinline__ BlockSelect block_select() {
  __shared__ int scratch[kWarps];
  __shared__ SelectShared sh;
  return {{static_cast<int>(threadIdx.x), 0, scratch}, &sh};
}

// ---------------------------------------------------------------- scoring

// Lane (g, c) of a warp (g = lane / 4, c = lane % 4) holds, of every key row and query head it
// touches, the 32 dims E_c = [16c, 16c + 16) u [64 + 16c, 80 + 16c) as 16 f16x2 registers
// (register j = elements 2j, 2j + 1). Dot products do not depend on the order of the dims, so
// k-step s (16 dims) takes registers 2s (k cols 2c, 2c+1 of the mma) and 2s + 1 (cols 8 + 2c, 9 +
// 2c) of A and B alike: the 4 lanes c and 8 steps cover each of the 128 dims once.

// 16 code bytes at p (16-byte aligned when vec16, else any alignment) as 4 words.
__device__ __forceinline__ uint4 load_codes16(const uint8_t* p, bool vec16) {
  if (vec16) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t w[4];
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(p[4 * k]) | (static_cast<uint32_t>(p[4 * k + 1]) << 8) |
           (static_cast<uint32_t>(p[4 * k + 2]) << 16) | (static_cast<uint32_t>(p[4 * k + 3]) << 24);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One key row of a lane: its 32 code bytes (E_c), scale and whether it is scored (its entry is
// recomputed where needed: fewer registers across the prefetch).
struct KeyRow {
  uint4 lo, hi;
  float sk;
  bool ok;
};

// The entry at chunk position q: q itself, or a consumer's 8 * union[q / 8] + q % 8.
__device__ __forceinline__ int64_t entry_at(const int32_t* cand_row, int64_t q) {
  if (cand_row == nullptr) return q;
  const int64_t b = cand_row[q / kCandidateBlockSize];
  return b < 0 ? -1 : b * kCandidateBlockSize + q % kCandidateBlockSize;
}

// Row r (chunk-relative position) of the chunk starting at position base for request req: the
// entry it holds, and its bytes when that entry is below `limit` (the run's largest n_c) and on a
// page of the cache.
__device__ __forceinline__ KeyRow load_row(const TopkParams& p, int64_t req, const int32_t* cand_row, int64_t base,
                                           int len, int r, int64_t limit, int c) {
  KeyRow k;
  k.lo = k.hi = make_uint4(0, 0, 0, 0);
  k.sk = 0.0f;
  k.ok = false;
  if (r >= len) return k;
  const int64_t entry = entry_at(cand_row, base + r);
  if (entry < 0 || entry >= limit) return k;
  int64_t pj, s;
  if (entry < (int64_t{1} << 32) && p.S < (int64_t{1} << 32)) {  // 32-bit division where it fits
    const uint32_t e = static_cast<uint32_t>(entry), S = static_cast<uint32_t>(p.S);
    pj = e / S;
    s = e - static_cast<uint32_t>(pj) * S;
  } else {
    pj = entry / p.S;
    s = entry % p.S;
  }
  if (pj >= p.bt_cols) return k;
  const int64_t page = p.bt[req * p.bt_stride + pj];
  if (page < 0 || page >= p.num_pages) return k;
  const uint8_t* pg = p.cache + page * p.page_stride;
  const uint8_t* codes = rec::index_k_fp8_codes(pg, p.S, s);
  k.lo = load_codes16(codes + 16 * c, p.vec16);
  k.hi = load_codes16(codes + kIndexHeadDim / 2 + 16 * c, p.vec16);
  k.sk = rec::read_index_k_fp8_scale(pg, p.S, s);
  k.ok = true;
  return k;
}

__device__ __forceinline__ void widen(const KeyRow& k, uint32_t (&a)[16]) {
  const uint32_t w[8] = {k.lo.x, k.lo.y, k.lo.z, k.lo.w, k.hi.x, k.hi.y, k.hi.z, k.hi.w};
#pragma unroll
  for (int m = 0; m < 8; ++m) e4m3x4_to_f16x4(w[m], a[2 * m], a[2 * m + 1]);
}

// max(0, x) that keeps a NaN (the CPU's D < 0 ? 0 : D).
__device__ __forceinline__ float relu_keep_nan(float x) { return x < 0.0f ? 0.0f : x; }

// The dynamic shared memory of a group of G tokens: the queries in fragment order
// (qf[((g * 4 + n) * 4 + u) * 32 + lane]: head tile n, uint4 u of the lane's 16 registers), the
// scores [G][kChunk] and the weights [G][32]; a consumer's also the union of its run's candidate
// rows [G * 2048] and the tokens of each union block [G * 2048] (consumer_union), the rows
// themselves [G][2048] and their owner prefix sums [G][2048] in the scores' place until the union
// is built.
__host__ __device__ constexpr size_t score_smem_bytes(int G, bool consumer) {
  return static_cast<size_t>(G) * (kQWords * 16 + kChunk * 4 + kIndexHeads * 4) +
         (consumer ? static_cast<size_t>(G) * kCandidateTopkBlocks * 8 : 0);
}
static_assert(2 * kCandidateTopkBlocks == kChunk, "a consumer's rows and owner sums fill the scores' place");

// The sorted union U of the candidate rows of a consumer's run (n tokens, rows in crow[n][2048]),
// in ubl[0..|U|), with umask[u] the bit set of the run's tokens whose row holds ubl[u]; returns
// |U|. Rows are strictly ascending prefixes (SPEC 8.7). An entry is its value's owner when no
// earlier row holds the value; the rank of a value in U is the number of owners of smaller values,
// sum over rows g' of opre[g'][lower_bound(row g', value)] (opre: exclusive prefix sums of the
// owner flags), so every thread places its entries independently.
__device__ int consumer_union(const int32_t* crow, int32_t* opre, int32_t* ubl, uint32_t* umask, int n) {
  __shared__ int s_len[kTopkMaxGroup], s_tot[kTopkMaxGroup];
  __shared__ typename BlockScan::TempStorage scan;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int W = kCandidateTopkBlocks;
  auto lower_bound = [&](int g, int len, int32_t v) {
    int lo = 0, hi = len;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (crow[g * W + mid] < v) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  if (tid < n) {
    int lo = 0, hi = W;  // the non-negative prefix
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (crow[tid * W + mid] >= 0) lo = mid + 1;
      else hi = mid;
    }
    s_len[tid] = lo;
  }
  for (int i = tid; i < n * W; i += kThreads) umask[i] = 0;
  __syncthreads();
  for (int i = tid; i < n * W; i += kThreads) {
    const int g = i / W, j = i % W;
    int owner = 0;
    if (j < s_len[g]) {
      owner = 1;
      const int32_t v = crow[i];
      for (int h = 0; h < g && owner; ++h) {
        const int pos = lower_bound(h, s_len[h], v);
        owner = !(pos < s_len[h] && crow[h * W + pos] == v);
      }
    }
    opre[i] = owner;
  }
  __syncthreads();
  constexpr int kPer = W / kThreads;
  static_assert(W % kThreads == 0);
  for (int g = 0; g < n; ++g) {  // exclusive scan of each row's owner flags
    int v[kPer], sum = 0;
    for (int k = 0; k < kPer; ++k) {
      v[k] = opre[g * W + tid * kPer + k];
      sum += v[k];
    }
    int before, total;
    BlockScan(scan).ExclusiveSum(sum, before, total);
    for (int k = 0; k < kPer; ++k) {
      opre[g * W + tid * kPer + k] = before;
      before += v[k];
    }
    if (tid == 0) s_tot[g] = total;
    __syncthreads();
  }
  for (int i = tid; i < n * W; i += kThreads) {
    const int g = i / W, j = i % W;
    if (j >= s_len[g]) continue;
    const int32_t v = crow[i];
    int rank = 0;
    for (int h = 0; h < n; ++h) {
      const int pos = h == g ? j : lower_bound(h, s_len[h], v);
      rank += pos < s_len[h] ? opre[h * W + pos] : s_tot[h];
    }
    const int next = j + 1 < s_len[g] ? opre[i + 1] : s_tot[g];
    if (next - opre[i] == 1) ubl[rank] = v;  // the owner
    atomicOr(&umask[rank], 1u << g);
  }
  __syncthreads();
  int u = 0;
  for (int g = 0; g < n; ++g) u += s_tot[g];
  return u;
}

// kMinBlocks: the resident blocks per SM the registers are capped for (2: 128 registers with
// about 150 bytes of spills, 16 warps per SM; 1: ~200 registers, 8 warps per SM), a tuning choice
// (IndexerTopkArgs::score_blocks_per_sm) for the device to decide.
template <int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) score_chunk_kernel(const TopkParams p) {
  extern __shared__ uint4 smem[];
  const int G = p.group;
  const bool consumer = p.role == IndexerRole::kCandidateConsumer;
  uint4* qf = smem;
  float* sc = reinterpret_cast<float*>(qf + G * kQWords);
  float* wsm = sc + G * kChunk;
  int32_t* crow = reinterpret_cast<int32_t*>(sc);  // consumer only, until the union is built
  int32_t* opre = crow + G * kCandidateTopkBlocks;
  int32_t* ubl = reinterpret_cast<int32_t*>(wsm + G * kIndexHeads);
  uint32_t* umask = reinterpret_cast<uint32_t*>(ubl + G * kCandidateTopkBlocks);
  __shared__ int s_run_start[kTopkMaxGroup + 1];
  __shared__ int s_nruns;
  __shared__ int64_t s_nc[kTopkMaxGroup];  // n_c of each token of the group
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int gq = lane / 4, cq = lane % 4;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * G;
  if (t0 >= p.T) return;
  const int gn = static_cast<int>(p.T - t0 < G ? p.T - t0 : G);
  const int64_t chunk = blockIdx.x;
  const int64_t base = chunk * kChunk;

  for (int i = tid; i < gn * kChunk; i += kThreads) sc[i] = kNegInf;
  if (tid == 0) {  // runs: maximal ranges of consecutive valid tokens of one request
    int n = 0;
    for (int g = 0; g < gn; ++g) {
      const bool ok = token_valid(p, t0 + g);
      const bool cont = g > 0 && ok && token_valid(p, t0 + g - 1) && p.t2r[t0 + g] == p.t2r[t0 + g - 1];
      if (ok && !cont) s_run_start[n++] = g;
      s_nc[g] = token_nc(p, t0 + g);
    }
    s_nruns = n;
  }
  __syncthreads();

  // the chunk's top 512 of tokens [ga, gb) (and a source's block maxima) into the workspace;
  // chunks_of(g): the chunks of that token's workspace row; entry_of(q): the entry at position q
  auto leave_candidates = [&](int ga, int gb, auto chunks_of, auto entry_of) {
    for (int g = ga; g < gb; ++g) {
      const int64_t t = t0 + g;
      if (!token_valid(p, t) || chunk >= chunks_of(g)) continue;  // the same for every thread
      const int64_t row = t * p.chunks * kIndexTopk + chunk * kIndexTopk;
      const float* s = sc + g * kChunk;
      if (p.role == IndexerRole::kCandidateSource)
        for (int b = tid; b < kChunkBlocks; b += kThreads) {
          float m = kNegInf;
          for (int e = 0; e < kCandidateBlockSize; ++e)
            if (s[b * kCandidateBlockSize + e] > m) m = s[b * kCandidateBlockSize + e];  // a NaN never wins
          p.ws_block[row + b] = m;
        }
      const BlockSelect bs = block_select();
      select_top(
          bs.grp, *bs.sh, kChunk, kIndexTopk, true, [&](int64_t i) { return ScoredEntry{s[i], static_cast<int32_t>(i)}; },
          [&](int j, ScoredEntry e) {
            p.ws_score[row + j] = e.key;
            p.ws_index[row + j] = static_cast<int32_t>(entry_of(base + e.entry));
          },
          [&](int j) {
            p.ws_score[row + j] = kNegInf;
            p.ws_index[row + j] = -1;
          });
    }
  };

  const int nruns = s_nruns;
  for (int r = 0; r < nruns; ++r) {
    const int g0 = s_run_start[r];
    int g1 = g0 + 1;
    while (g1 < gn && token_valid(p, t0 + g1) && p.t2r[t0 + g1] == p.t2r[t0 + g0]) ++g1;
    const int64_t req = p.t2r[t0 + g0];
    int64_t limit = 0;  // the run's largest n_c
    for (int g = g0; g < g1; ++g) limit = s_nc[g] > limit ? s_nc[g] : limit;
    __syncthreads();  // the previous run's queries and union are no longer read
    int64_t positions = limit;
    if (consumer) {
      for (int i = tid; i < (g1 - g0) * kCandidateTopkBlocks; i += kThreads)
        crow[i] = p.cand[(t0 + g0 + i / kCandidateTopkBlocks) * p.cand_stride + i % kCandidateTopkBlocks];
      __syncthreads();
      positions = int64_t{consumer_union(crow, opre, ubl, umask, g1 - g0)} * kCandidateBlockSize;
      for (int i = tid; i < gn * kChunk; i += kThreads) sc[i] = kNegInf;  // the rows' place back
      const int64_t run_chunks = (positions + kChunk - 1) / kChunk;
      if (chunk == 0)
        for (int g = g0 + tid; g < g1; g += kThreads) p.ws_nchunks[t0 + g] = static_cast<int32_t>(run_chunks);
    }
    if (base >= positions) continue;
    const int len = static_cast<int>(positions - base < kChunk ? positions - base : kChunk);
    const int32_t* cand_row = consumer ? ubl : nullptr;

    for (int i = tid; i < (g1 - g0) * kQWords; i += kThreads) {
      const int g = g0 + i / kQWords, rest = i % kQWords;
      const int l = rest % 32, u = (rest / 32) % 4, n = rest / 128;
      const int h = n * 8 + l / 4, c = l % 4;
      const int d0 = (u < 2 ? 0 : kIndexHeadDim / 2) + 16 * c + 8 * (u & 1);
      const uint8_t* src = p.q8 + ((t0 + g) * kIndexHeads + h) * kIndexHeadDim + d0;
      uint32_t w0 = 0, w1 = 0;
      for (int b = 0; b < 4; ++b) {
        w0 |= static_cast<uint32_t>(src[b]) << (8 * b);
        w1 |= static_cast<uint32_t>(src[4 + b]) << (8 * b);
      }
      uint4 v;
      e4m3x4_to_f16x4(w0, v.x, v.y);
      e4m3x4_to_f16x4(w1, v.z, v.w);
      qf[g * kQWords + rest] = v;
    }
    for (int i = tid; i < (g1 - g0) * kIndexHeads; i += kThreads)
      wsm[g0 * kIndexHeads + i] = p.w[(t0 + g0) * kIndexHeads + i];
    __syncthreads();

    const int tiles = (len + kTileKeys - 1) / kTileKeys;
    int tile = warp;
    KeyRow k0 = load_row(p, req, cand_row, base, len, tile * kTileKeys + gq, limit, cq);
    KeyRow k1 = load_row(p, req, cand_row, base, len, tile * kTileKeys + gq + 8, limit, cq);
    for (; tile < tiles; tile += kWarps) {
      // the next tile's bytes in flight while this one is multiplied
      const int next = tile + kWarps;
      KeyRow n0, n1;
      if (next < tiles) {
        n0 = load_row(p, req, cand_row, base, len, next * kTileKeys + gq, limit, cq);
        n1 = load_row(p, req, cand_row, base, len, next * kTileKeys + gq + 8, limit, cq);
      }
      uint32_t a0[16], a1[16];
      widen(k0, a0);
      widen(k1, a1);
      const int r0 = tile * kTileKeys + gq;
      // a consumer's tokens of each row's union block
      const uint32_t m0 = consumer && r0 < len ? umask[(base + r0) / kCandidateBlockSize] : ~0u;
      const uint32_t m1 = consumer && r0 + 8 < len ? umask[(base + r0 + 8) / kCandidateBlockSize] : ~0u;
      for (int g = g0; g < g1; ++g) {
        float lo = 0.0f, hi = 0.0f;
#pragma unroll 2
        for (int n = 0; n < 4; ++n) {
          const uint4* qb = qf + (g * 4 + n) * 4 * 32 + lane;
          const uint4 b0 = qb[0], b1 = qb[32], b2 = qb[64], b3 = qb[96];
          const uint32_t b[16] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w,
                                  b2.x, b2.y, b2.z, b2.w, b3.x, b3.y, b3.z, b3.w};
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int s = 0; s < 8; ++s) mma_f16_16816(d, a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], b[2 * s], b[2 * s + 1]);
          const float2 wv = *reinterpret_cast<const float2*>(wsm + g * kIndexHeads + n * 8 + 2 * cq);
          lo = fmaf(wv.x, relu_keep_nan(d[0]), lo);
          lo = fmaf(wv.y, relu_keep_nan(d[1]), lo);
          hi = fmaf(wv.x, relu_keep_nan(d[2]), hi);
          hi = fmaf(wv.y, relu_keep_nan(d[3]), hi);
        }
        lo += __shfl_xor_sync(0xffffffffu, lo, 1);
        lo += __shfl_xor_sync(0xffffffffu, lo, 2);
        hi += __shfl_xor_sync(0xffffffffu, hi, 1);
        hi += __shfl_xor_sync(0xffffffffu, hi, 2);
        if (cq == 0) {
          const int64_t nc = s_nc[g];
          const uint32_t bit = 1u << (g - g0);
          if (k0.ok && (m0 & bit) && entry_at(cand_row, base + r0) < nc) sc[g * kChunk + r0] = lo * k0.sk;
          if (k1.ok && (m1 & bit) && entry_at(cand_row, base + r0 + 8) < nc) sc[g * kChunk + r0 + 8] = hi * k1.sk;
        }
      }
      if (next < tiles) {
        k0 = n0;
        k1 = n1;
      }
    }
    if (!consumer) continue;
    // a consumer's outputs before the next run replaces the union: its scores scattered into the
    // (filled) scores output, its candidates
    __syncthreads();
    const auto entry_of = [&](int64_t q) { return entry_at(ubl, q); };
    if (p.scores != nullptr)
      for (int i = tid; i < (g1 - g0) * kChunk; i += kThreads) {
        const int g = g0 + i / kChunk, rr = i % kChunk;
        const float v = sc[g * kChunk + rr];
        if (rr >= len || v == kNegInf) continue;  // not the token's (or not visible): -inf already
        const int64_t e = entry_of(base + rr);
        if (e < p.scores_cols) p.scores[(t0 + g) * p.scores_stride + e] = v;
      }
    const int64_t run_chunks = (positions + kChunk - 1) / kChunk;
    leave_candidates(g0, g1, [&](int) { return run_chunks; }, entry_of);
  }
  if (consumer) return;
  __syncthreads();

  // the optional scores output: the block's columns of every token (-inf where nothing was scored)
  if (p.scores != nullptr)
    for (int i = tid; i < gn * kChunk; i += kThreads) {
      const int g = i / kChunk, rr = i % kChunk;
      const int64_t col = base + rr;
      if (col < p.scores_cols) p.scores[(t0 + g) * p.scores_stride + col] = sc[i];
    }
  leave_candidates(0, gn, [&](int g) { return token_chunks(p, t0 + g); }, [](int64_t q) { return q; });
}

// The scores output of a consumer before its blocks scatter into it: -inf everywhere.
__global__ void __launch_bounds__(kThreads) fill_scores_kernel(const TopkParams p) {
  for (int64_t t = blockIdx.y; t < p.T; t += gridDim.y)
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < p.scores_cols;
         i += static_cast<int64_t>(gridDim.x) * kThreads)
      p.scores[t * p.scores_stride + i] = kNegInf;
}

// One block per token: the top 512 of its chunks' candidates; a source also its 2048 blocks.
__global__ void __launch_bounds__(kThreads) select_kernel(const TopkParams p) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int64_t chunks = token_chunks(p, t);
  const int64_t row = t * p.chunks * kIndexTopk;
  int32_t* out = p.topk + t * p.topk_stride;
  // positions ascend with the entries in every chunk and across chunks (pads are -inf, never
  // eligible), so ranking ties by position ranks them by entry
  const BlockSelect bs = block_select();
  select_top(
      bs.grp, *bs.sh, chunks * kIndexTopk, kIndexTopk, true,
      [&](int64_t i) { return ScoredEntry{p.ws_score[row + i], p.ws_index[row + i]}; },
      [&](int j, ScoredEntry e) { out[j] = e.entry; }, [&](int j) { out[j] = -1; });
  if (p.role != IndexerRole::kCandidateSource) return;
  int32_t* cout = p.cand + t * p.cand_stride;
  const int64_t nc = token_nc(p, t);
  int64_t nb = (nc + kCandidateBlockSize - 1) / kCandidateBlockSize;
  if (nb > p.chunks * kChunkBlocks) nb = p.chunks * kChunkBlocks;  // a device n_c beyond the block table
  select_top(
      bs.grp, *bs.sh, nb, kCandidateTopkBlocks, false,
      [&](int64_t b) {
        return ScoredEntry{b == nb - 1 ? std::numeric_limits<float>::infinity() : p.ws_block[row + b],
                           static_cast<int32_t>(b)};
      },
      [&](int j, ScoredEntry e) { cout[j] = e.entry; }, [&](int j) { cout[j] = -1; });
}

}  // namespace

void indexer_topk(const IndexerTopkArgs& a, const IndexerTopkPlan& p, const ExecContext& ctx) {
  if (p.T == 0) return;
  TopkParams k;
  k.role = a.role;
  k.ratio = a.ratio;
  k.group = p.group_tokens;
  k.q8 = a.q8.ptr<const uint8_t>();
  k.w = a.w.ptr<const float>();
  k.pos = a.positions.ptr<const int64_t>();
  k.t2r = a.token_to_req.ptr<const int32_t>();
  k.valid = a.token_valid.present() ? a.token_valid.ptr<const int32_t>() : nullptr;
  k.bt = a.block_table.ptr<const int32_t>();
  k.bt_stride = p.bt_stride;
  k.bt_cols = p.bt_cols;
  k.cache = static_cast<const uint8_t*>(a.k_cache.base);
  k.S = a.k_cache.states_per_page;
  k.page_stride = a.k_cache.page_stride;
  k.num_pages = a.k_cache.num_pages;
  k.vec16 = is_aligned(a.k_cache.base, 16) && a.k_cache.page_stride % 16 == 0;
  k.topk = a.topk.ptr<int32_t>();
  k.topk_stride = p.topk_stride;
  if (a.role != IndexerRole::kPlain) {
    k.cand = a.candidates.ptr<int32_t>();
    k.cand_stride = p.cand_stride;
  }
  if (a.scores.present()) {
    k.scores = a.scores.ptr<float>();
    k.scores_stride = p.scores_stride;
    k.scores_cols = p.scores_cols;
  }
  k.chunks = p.ws_chunks;
  k.T = p.T;
  const int64_t row = p.T * p.ws_chunks * kIndexTopk;  // elements of each workspace array
  k.ws_score = static_cast<float*>(a.workspace.data);
  k.ws_index = reinterpret_cast<int32_t*>(k.ws_score + row);
  if (a.role == IndexerRole::kCandidateSource) k.ws_block = reinterpret_cast<float*>(k.ws_index + row);
  if (a.role == IndexerRole::kCandidateConsumer) k.ws_nchunks = k.ws_index + row;

  cudaStream_t s = as_stream(ctx.stream);
  const bool consumer = a.role == IndexerRole::kCandidateConsumer;
  bool warpgroup = p.score_kernel == 2;
  if (warpgroup && !device_is_sm90_or_newer()) {
    if (p.score_kernel_forced)
      bad_arg("indexer_topk", "score_kernel", "2 (warpgroup) on a device below sm_90, expected 0 or 1");
    warpgroup = false;
  }
  if ((consumer || warpgroup) && k.scores != nullptr && p.scores_cols > 0) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((p.scores_cols + kThreads - 1) / kThreads, 64)),
                    static_cast<unsigned>(std::min<int64_t>(p.T, 65535)));
    fill_scores_kernel<<<grid, kThreads, 0, s>>>(k);
    DSV41KV_CUDA_CHECK_LAUNCH("fill_scores_kernel");
  }
  if (warpgroup) {
    // one wave of blocks over the step: nch blocks per group share each request's entries
    const int64_t groups = (p.T + k.group - 1) / k.group;
    const int64_t nch = std::clamp<int64_t>((sm_count() + groups - 1) / groups, 1, p.ws_chunks);
    k.slots = nch;
    auto* kernel = consumer ? wgscore::score_warpgroup_kernel<true> : wgscore::score_warpgroup_kernel<false>;
    const size_t smem = consumer ? wgscore::kSmemBytes<true> : wgscore::kSmemBytes<false>;
    DSV41KV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<dim3(static_cast<unsigned>(nch), static_cast<unsigned>(groups)), wgscore::kThreads, smem, s>>>(k, nch);
    DSV41KV_CUDA_CHECK_LAUNCH("score_warpgroup_kernel");
    launch_kernel(select_kernel, dim3(static_cast<unsigned>(p.T)), dim3(kThreads), s, ctx.programmatic_launch, k);
    return;
  }
  int64_t gx = p.ws_chunks;
  if (!consumer && k.scores != nullptr) gx = std::max(gx, (p.scores_cols + kChunk - 1) / kChunk);
  const size_t smem = score_smem_bytes(k.group, consumer);
  auto* kernel = p.score_blocks_per_sm == 1 ? score_chunk_kernel<1> : score_chunk_kernel<2>;
  DSV41KV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>((p.T + k.group - 1) / k.group));
  kernel<<<grid, kThreads, smem, s>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("score_chunk_kernel");
  launch_kernel(select_kernel, dim3(static_cast<unsigned>(p.T)), dim3(kThreads), s, ctx.programmatic_launch, k);
}

}  // namespace dsv41kv::detail::cuda
