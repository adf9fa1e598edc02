// The indexer's scores and per-block top 512 for a plain or candidate-source layer on sm_90a, by a
// warp-specialized block (SPEC 8.3-8.5; topk_cuda.cu's chunk kernel is the general form, kept
// for consumers, unaligned caches and groups of more than two tokens). Block (x = c < nch, y =
// group of G <= 2 consecutive tokens): each run of the group's valid tokens of one request (n_c
// up to `limit`) covers the entries [c L, min((c + 1) L, limit)), L = roundup(ceil(limit / nch),
// 2048), so that one wave of blocks shares every request's keys evenly whatever the step's n_c.
//
//   warpgroup 0 (producers, one warp per fourth stage): copies each 64-key stage's codes and
//     scales, one bulk copy per page run (cp.async.bulk, no tensor map: a stage is one or a few
//     contiguous runs of pages the block table names), into a ring of kStages slots with
//     full/empty mbarriers; the stage's valid-row mask (rows on a page of the cache) goes with it.
//   warpgroups 1, 2 (scorers, alternate stages): widen the stage's e4m3 codes to f16 in
//     registers (exact) as the A operand of wgmma m64n64k16 (f16 x f16 -> fp32: the 1e-5 bound
//     of SPEC 8.8 rules out the e4m3 MMA, core/cuda/mma_fp8.cuh says why) against B = the run's
//     2 x 32 query heads in shared memory, then ReLU, x w[t, h], the sum over the heads and
//     x sk[i] in registers; the scores of 2048 keys per token go to a double-buffered hand-off.
//   warpgroup 3 (selector): takes each 2048-key hand-off (and writes the optional scores and a
//     source's block maxima from it), appends the scores above its threshold to a token's
//     candidate buffer in position order, and whenever the buffer could overflow keeps its top
//     512 (select_group.cuh) and raises the threshold to the 512th key: a later entry with that
//     key ranks below all of them (larger position). At the run's end the buffer's top 512 is
//     the block's workspace row c; select_kernel merges the nch rows of each token.
//
// Fragment mapping (one definition, used by the B layout and the A loads alike): lane (g, t) of
// warp w of a scorer warpgroup (g = lane / 4, t = lane % 4) reads bytes [32 t, 32 t + 32) of key
// rows 16 w + g and 16 w + g + 8; k-step s (0..7) takes byte word s of them, so k column k of
// step s is dim 32 ((k % 8) / 2) + 4 s + 2 (k / 8) + k % 2 (kdim below) in A and B alike: dot
// products do not depend on the order of the dims.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/mma_fp8.cuh"
#include "core/cuda/tma.cuh"
#include "core/cuda/wgmma.cuh"
#include "dsv41kv/records.hpp"
#include "indexer/cuda/select_group.cuh"
#include "indexer/cuda/topk_params.cuh"

namespace dsv41kv::detail::cuda::wgscore {

inline constexpr int kThreads = 512;                     // four warpgroups
inline constexpr int kStageKeys = 64;                    // the m of one wgmma
inline constexpr int kSubKeys = 2048;                    // scores per token per hand-off
inline constexpr int kStagesPerSub = kSubKeys / kStageKeys;
inline constexpr int kCap = 4096;                        // a token's candidate buffer
inline constexpr int kTokens = 2;                        // the n of 64 = 2 tokens x 32 heads
inline constexpr int kWindow = 256;                      // block-table entries each producer holds
inline constexpr int kRowBytes = kIndexHeadDim;          // e4m3 codes of one key
static_assert(kIndexHeads == 32 && kIndexHeadDim == 128, "the fragment mapping");
static_assert(kSubKeys % kCandidateBlockSize == 0 && kCap >= kSubKeys + kIndexTopk);

// Named barriers (0 is __syncthreads): the scorers' query reload, the selector's own group. The
// hand-off goes through mbarriers (hfull: 256 scorer arrivals, hempty: 128 selector arrivals),
// each thread releasing its own accesses.
inline constexpr int kBarScorers = 5, kBarSelector = 6;

// Ring slots: 12 x 8.4 KB in flight per SM; a consumer's 8 leave room for its union.
template <bool kCons>
inline constexpr int kStagesOf = kCons ? 8 : 12;
inline constexpr int kUnionMax = kTopkConsumerGroup * kCandidateTopkBlocks;  // a block's union blocks

template <bool kCons>
struct Smem {
  static constexpr int kStages = kStagesOf<kCons>;
  uint8_t q[2][64 * 128];                      // B: 2 sub-tiles (dims 0..63, 64..127 in kdim order)
                                               // of 64 rows (token * 32 + head) x 64 f16, 128-B swizzled
  uint8_t codes[kStages][kStageKeys * kRowBytes];
  float scale[kStages][kStageKeys];
  uint64_t mask[kStages];                      // rows of the slot read from a page of the cache
  uint64_t full[kStages], empty[kStages];      // mbarriers
  uint64_t hfull[2], hempty[2];                // the hand-off's mbarriers
  float sbuf[2][kTokens][kSubKeys];            // the hand-off
  float cand_key[kTokens][kCap];
  int32_t cand_entry[kTokens][kCap];
  int32_t window[4][kWindow];                  // per producer warp: block_table[req][wbase ..]
  // a consumer's runs: the sorted union of each run's candidate rows (runs one after another) and
  // the run's tokens holding each union block (bit tk)
  int32_t ublk[kCons ? kUnionMax : 1];
  uint8_t umask[kCons ? kUnionMax : 1];
  int ulen[kTokens];
  SelectShared sel;
  int scratch[16];
};
template <bool kCons>
inline constexpr size_t kSmemBytes = sizeof(Smem<kCons>) + 1024;  // + the alignment of q
static_assert(kSmemBytes<false> <= 227 * 1024 && kSmemBytes<true> <= 227 * 1024,
              "the opt-in shared memory of one sm_90 block");
static_assert(kStagesOf<false> % 4 == 0 && kStagesOf<true> % 4 == 0, "each producer warp owns kStages / 4 slots");
static_assert(2 * kTokens * kSubKeys >= 2 * kUnionMax, "the union's merge runs in the hand-off buffers");

// The dim of k column k (0..15) of k-step s (0..7).
__host__ __device__ constexpr int kdim(int s, int k) { return 32 * ((k % 8) / 2) + 4 * s + 2 * (k / 8) + k % 2; }

// A run of the block: n consecutive valid tokens g0.. of one request and the positions [lo, hi)
// it covers: entries (plain, source) or union positions (a consumer: position q is entry
// 8 ublk[ubase + q / 8] + q % 8).
struct Run {
  int g0 = 0, n = 0, ubase = 0;
  int64_t req = 0, lo = 0, hi = 0;
  int64_t nc[kTokens] = {};
};

// The runs of group y's tokens (every thread computes the same).
__device__ __forceinline__ int block_runs(const TopkParams& p, int64_t t0, int gn, Run (&runs)[kTokens]) {
  int nr = 0;
  for (int g = 0; g < gn; ++g) {
    const int64_t t = t0 + g;
    if (!token_valid(p, t)) continue;
    const int64_t req = p.t2r[t], nc = token_nc(p, t);
    if (nr > 0 && runs[nr - 1].g0 + runs[nr - 1].n == g && runs[nr - 1].req == req) {
      runs[nr - 1].nc[runs[nr - 1].n++] = nc;
      continue;
    }
    runs[nr].g0 = g;
    runs[nr].n = 1;
    runs[nr].req = req;
    runs[nr].nc[0] = nc;
    ++nr;
  }
  return nr;
}

// Run r's positions [0, limit) split into nch ranges of L = roundup(ceil(limit / nch), 2048): block
// column c's.
__device__ __forceinline__ void run_range(Run& run, int64_t limit, int64_t nch, int64_t c) {
  const int64_t per = (limit + nch - 1) / nch;
  const int64_t L = (per + kSubKeys - 1) / kSubKeys * kSubKeys;
  const int64_t lo = c * L < limit ? c * L : limit;
  run.lo = lo;
  run.hi = lo + L < limit ? lo + L : limit;
}

// The first index of a strictly ascending row of n values with row[i] >= v.
__device__ __forceinline__ int lower_bound(const int32_t* row, int n, int32_t v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (row[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void named_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

#if defined(DSV41KV_WGMMA)
// ---------------------------------------------------------------- producers (warpgroup 0)

// Producer warp pw (0..3) fills the stages gi = pw, pw + 4, ... of the block (slots gi % kStages):
// one warp alone cannot issue a stage every ~500 clocks (the H200's bandwidth per SM at one block
// per SM), four interleaved ones can. Lane j handles page run j of a stage (closed form from the
// stage's first state: no division per run), so a stage costs one pass whatever S.
template <bool kCons>
__device__ __forceinline__ void produce(const TopkParams& p, Smem<kCons>& sm, const Run* runs, int nr, int pw) {
  constexpr int kStages = Smem<kCons>::kStages;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint32_t S = static_cast<uint32_t>(p.S);  // S, entries < 2^31 (the plan's bounds)
  int32_t* window = sm.window[pw];
  uint32_t gi = 0;  // stage counter of the block (ring slot and phase)
  for (int r = 0; r < nr; ++r) {
    const int64_t lo = runs[r].lo, hi = runs[r].hi, req = runs[r].req;
    const int ubase = runs[r].ubase;
    const int32_t* bt_row = p.bt + req * p.bt_stride;
    int64_t wbase = -int64_t{kWindow} - 1;
    const uint32_t nst = static_cast<uint32_t>((hi - lo + kStageKeys - 1) / kStageKeys);
    for (uint32_t li = (static_cast<uint32_t>(pw) + 4u - gi % 4u) % 4u; li < nst; li += 4) {
      const uint32_t gs = gi + li;
      const int slot = static_cast<int>(gs % kStages);
      const int64_t k0 = lo + int64_t{li} * kStageKeys;
      const int n = static_cast<int>(hi - k0 < kStageKeys ? hi - k0 : kStageKeys);
      bool active;
      int off, len;
      uint32_t s;
      int64_t page;
      if constexpr (kCons) {
        // lane j < 8: union block (k0 / 8) + j, 8 states of one page (S % 8 == 0), at stage row 8 j;
        // ranges and positions are multiples of 8
        active = lane < n / kCandidateBlockSize;
        off = kCandidateBlockSize * lane;
        len = active ? kCandidateBlockSize : 0;
        const uint32_t e = active ? static_cast<uint32_t>(sm.ublk[ubase + k0 / kCandidateBlockSize + lane]) * 8u : 0u;
        const uint32_t pj = e / S;
        s = e - pj * S;
        page = active && pj < p.bt_cols ? bt_row[pj] : -1;
      } else {
        const uint32_t e0 = static_cast<uint32_t>(k0), pj0 = e0 / S, s0 = e0 - pj0 * S;
        const int first = static_cast<int>(S - s0 < static_cast<uint32_t>(n) ? S - s0 : static_cast<uint32_t>(n));
        // page run `lane`: states [s, s + len) of page pj0 + lane at stage row off
        const int64_t off64 = lane == 0 ? 0 : first + int64_t{lane - 1} * S;
        active = off64 < n;
        off = active ? static_cast<int>(off64) : 0;
        len = !active ? 0 : lane == 0 ? first : (n - off < static_cast<int>(S) ? n - off : static_cast<int>(S));
        s = lane == 0 ? s0 : 0u;
        const int64_t pj = int64_t{pj0} + lane;
        const int runs_n = __popc(__ballot_sync(0xffffffffu, active));
        if (int64_t{pj0} < wbase || int64_t{pj0} + runs_n - 1 >= wbase + kWindow) {  // the stage's pages
          __syncwarp();
          wbase = pj0;
          for (int l = lane; l < kWindow; l += 32) window[l] = wbase + l < p.bt_cols ? bt_row[wbase + l] : -1;
          __syncwarp();
        }
        page = active ? window[pj - wbase] : -1;
      }
      const bool ok = active && page >= 0 && page < p.num_pages;
      const uint32_t scale_bytes = static_cast<uint32_t>((len + 3) / 4 * 16);  // s, off: multiples of 4
      const uint32_t bytes = __reduce_add_sync(0xffffffffu, ok ? static_cast<uint32_t>(len * kRowBytes) + scale_bytes : 0u);
      const uint64_t bits = !ok ? 0 : (len == 64 ? ~uint64_t{0} : ((uint64_t{1} << len) - 1)) << off;
      const uint32_t mlo = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(bits));
      const uint32_t mhi = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(bits >> 32));
      mbarrier_wait_parity(smem_addr(&sm.empty[slot]), ((gs / kStages) & 1) ^ 1);
      if (lane == 0) {
        sm.mask[slot] = (uint64_t{mhi} << 32) | mlo;
        mbarrier_arrive_expect_tx_bytes(smem_addr(&sm.full[slot]), bytes);
      }
      __syncwarp();
      if (ok) {
        const uint8_t* pg = p.cache + page * p.page_stride;
        const uint32_t full = smem_addr(&sm.full[slot]);
        bulk_copy_g2s(smem_addr(&sm.codes[slot][off * kRowBytes]), rec::index_k_fp8_codes(pg, S, s),
                      static_cast<uint32_t>(len * kRowBytes), full);
        bulk_copy_g2s(smem_addr(&sm.scale[slot][off]), pg + IndexerKFp8Layout::scale_offset(S, s), scale_bytes, full);
      }
    }
    gi += nst;
  }
}

// ---------------------------------------------------------------- scorers (warpgroups 1, 2)

// The run's queries as B (kdim order, 128-B swizzled; rows of an absent second token zero), by
// the 256 scorer threads (rank 0..255).
template <bool kCons>
__device__ __forceinline__ void load_queries(const TopkParams& p, Smem<kCons>& sm, int64_t t_first, int ntok, int rank) {
  for (int i = rank; i < 64 * 16; i += 256) {  // 16-byte chunk cc (8 k columns) of row n
    const int n = i / 16, cc = i % 16, tk = n / 32, h = n % 32, s = (cc % 8) / 2, k8 = 8 * (cc % 2);
    uint32_t v[4] = {0, 0, 0, 0};
    if (tk < ntok) {
      const uint8_t* q = p.q8 + ((t_first + tk) * kIndexHeads + h) * kIndexHeadDim;
      for (int m = 0; m < 4; ++m) {  // k columns k8 + 2m, + 1: dims kdim(s', k8 + 2m) and the next
        const int d = kdim((cc / 8) * 4 + s, k8 + 2 * m);
        v[m] = e4m3x2_to_f16x2(static_cast<uint32_t>(q[d]) | (static_cast<uint32_t>(q[d + 1]) << 8));
      }
    }
    *reinterpret_cast<uint4*>(&sm.q[0][0] + sw128_offset(64, n, cc)) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// max(0, x) that keeps a NaN (the CPU's D < 0 ? 0 : D; a -0 may come out as +0, the same score):
// one instruction.
__device__ __forceinline__ float relu_keep_nan(float x) {
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
}

template <bool kCons>
__device__ __forceinline__ void score(const TopkParams& p, Smem<kCons>& sm, const Run* runs, int nr, int64_t t0, int cw) {
  constexpr int kStages = Smem<kCons>::kStages;
  const int rank = static_cast<int>(threadIdx.x) - 128;  // 0..255 over both scorers
  const int wtid = rank % 128, warp = wtid / 32, lane = wtid % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  const int swap = g & 1;  // odd rows read their second 16 bytes first: conflict-free quarter warps
  // step s's B descriptor: the start address field (bits 0..13, 16-byte units) plus the step's
  // offset; q lies below 256 KiB, so the field never carries
  const uint64_t desc0 = sw128_desc(smem_addr(&sm.q[0][0]), 16, 1024);
  uint32_t gi = 0;
  int gm = 0;
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;  // defined before the first product (which ignores it)
  for (int r = 0; r < nr; ++r) {
    const Run& run = runs[r];
    const int64_t t_first = t0 + run.g0;
    named_sync(kBarScorers, 256);  // the previous run's products are complete
    load_queries(p, sm, t_first, run.n, rank);
    fence_proxy_async_shared();
    named_sync(kBarScorers, 256);
    float w[kTokens][4][2];  // w[t][8 jj + 2 t + e] of this lane's accumulator columns
    const int64_t nc0 = run.nc[0], nc1 = run.n > 1 ? run.nc[1] : 0;  // registers, not a local array
    for (int tk = 0; tk < kTokens; ++tk) {
      for (int jj = 0; jj < 4; ++jj)
        for (int e = 0; e < 2; ++e)
          w[tk][jj][e] = tk < run.n ? p.w[(t_first + tk) * kIndexHeads + 8 * jj + 2 * t + e] : 0.0f;
    }
    const int nst = static_cast<int>((run.hi - run.lo + kStageKeys - 1) / kStageKeys);
    const int subs = (nst + kStagesPerSub - 1) / kStagesPerSub;
    for (int m = 0; m < subs; ++m, ++gm) {
      // hempty[b]'s k-th phase: the selector has read hand-off 2 k + b
      if (gm >= 2) mbarrier_wait_parity(smem_addr(&sm.hempty[gm % 2]), static_cast<uint32_t>(gm / 2 - 1) & 1);
      const int end = (m + 1) * kStagesPerSub < nst ? (m + 1) * kStagesPerSub : nst;
      for (int li = m * kStagesPerSub + cw; li < end; li += 2) {
        const uint32_t gs = gi + static_cast<uint32_t>(li);
        const int slot = static_cast<int>(gs % kStages);
        mbarrier_wait_parity(smem_addr(&sm.full[slot]), (gs / kStages) & 1);
        const uint8_t* c0 = &sm.codes[slot][r0 * kRowBytes + 32 * t];
        const uint8_t* c1 = &sm.codes[slot][r1 * kRowBytes + 32 * t];
        const uint4 x0 = *reinterpret_cast<const uint4*>(c0 + 16 * swap), y0 = *reinterpret_cast<const uint4*>(c0 + 16 * (1 - swap));
        const uint4 x1 = *reinterpret_cast<const uint4*>(c1 + 16 * swap), y1 = *reinterpret_cast<const uint4*>(c1 + 16 * (1 - swap));
        const uint4 lo0 = swap ? y0 : x0, hi0 = swap ? x0 : y0, lo1 = swap ? y1 : x1, hi1 = swap ? x1 : y1;
        const float sk0 = sm.scale[slot][r0], sk1 = sm.scale[slot][r1];
        const uint64_t mask = sm.mask[slot];
        mbarrier_arrive(smem_addr(&sm.empty[slot]));  // the slot is in registers
        const uint32_t wr0[8] = {lo0.x, lo0.y, lo0.z, lo0.w, hi0.x, hi0.y, hi0.z, hi0.w};
        const uint32_t wr1[8] = {lo1.x, lo1.y, lo1.z, lo1.w, hi1.x, hi1.y, hi1.z, hi1.w};
        uint32_t a[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          a[s][0] = e4m3x2_to_f16x2(wr0[s]);
          a[s][2] = e4m3x2_to_f16x2(wr0[s] >> 16);
          a[s][1] = e4m3x2_to_f16x2(wr1[s]);
          a[s][3] = e4m3x2_to_f16x2(wr1[s] >> 16);
        }
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 8; ++s)
          wgmma_m64n64k16_rs_f16(acc, a[s], desc0 + static_cast<uint64_t>(((s / 4) * 8192 + (s % 4) * 32) >> 4), s > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
        // v[2 tk + row]: this lane's part of token tk's sum over heads for row r0 / r1
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int tk = 0; tk < kTokens; ++tk)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = 4 * tk + jj;
              v[2 * tk] = fmaf(w[tk][jj][e], relu_keep_nan(acc[4 * j + e]), v[2 * tk]);
              v[2 * tk + 1] = fmaf(w[tk][jj][e], relu_keep_nan(acc[4 * j + 2 + e]), v[2 * tk + 1]);
            }
        // reduce-scatter over the quad: lane t ends with the whole sum of v[t]
        const int b0 = t & 1, b1 = t >> 1;
        const float k0 = (b0 ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, b0 ? v[0] : v[1], 1);
        const float k1 = (b0 ? v[3] : v[2]) + __shfl_xor_sync(0xffffffffu, b0 ? v[2] : v[3], 1);
        const float sum = (b1 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, b1 ? k0 : k1, 2);
        const int tk = b1, row = b0 ? r1 : r0;
        const int64_t pos = run.lo + int64_t{li} * kStageKeys + row;
        bool ok = (mask >> row) & 1;
        int64_t entry = pos;
        if constexpr (kCons) {  // the union position's entry, scored for the tokens whose row holds its block
          const int u = run.ubase + static_cast<int>(pos / kCandidateBlockSize);
          entry = int64_t{sm.ublk[u]} * kCandidateBlockSize + pos % kCandidateBlockSize;
          ok = ok && ((sm.umask[u] >> tk) & 1);
        }
        ok = ok && entry < (tk ? nc1 : nc0);
        sm.sbuf[gm % 2][tk][(li % kStagesPerSub) * kStageKeys + row] = ok ? sum * (b0 ? sk1 : sk0) : kTopkNegInf;
      }
      mbarrier_arrive(smem_addr(&sm.hfull[gm % 2]));
    }
    gi += static_cast<uint32_t>(nst);
  }
}

// ---------------------------------------------------------------- selector (warpgroup 3)

template <bool kCons>
__device__ __forceinline__ void select(const TopkParams& p, Smem<kCons>& sm, const Run* runs, int nr, int64_t t0,
                                       int64_t c) {
  const int rank = static_cast<int>(threadIdx.x) - 384;
  const ThreadGroup<128> grp{rank, kBarSelector, sm.scratch};
  int gm = 0;
  for (int r = 0; r < nr; ++r) {
    const Run& run = runs[r];
    int cnt[kTokens] = {0, 0};
    uint32_t theta[kTokens] = {0u, 0u};  // every finite score's key is above 0
    const int nst = static_cast<int>((run.hi - run.lo + kStageKeys - 1) / kStageKeys);
    const int subs = (nst + kStagesPerSub - 1) / kStagesPerSub;
    for (int m = 0; m < subs; ++m, ++gm) {
      mbarrier_wait_parity(smem_addr(&sm.hfull[gm % 2]), static_cast<uint32_t>(gm / 2) & 1);
      const int64_t k0 = run.lo + int64_t{m} * kSubKeys;
      const int nk = static_cast<int>(run.hi - k0 < kSubKeys ? run.hi - k0 : kSubKeys);
      for (int tk = 0; tk < run.n; ++tk) {
        const int64_t tok = t0 + run.g0 + tk;
        const float* sb = sm.sbuf[gm % 2][tk];
        // this thread's 16 consecutive hand-off entries (conflict-light 16-byte reads)
        constexpr int kPer = kSubKeys / 128;
        static_assert(kPer == 2 * kCandidateBlockSize);
        float x[kPer];
#pragma unroll
        for (int i = 0; i < kPer; i += 4) {
          const float4 f = *reinterpret_cast<const float4*>(sb + kPer * rank + i);
          x[i] = f.x, x[i + 1] = f.y, x[i + 2] = f.z, x[i + 3] = f.w;
        }
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if (kPer * rank + i >= nk) x[i] = kTopkNegInf;  // past the run (stale hand-off)
        const int64_t j0 = k0 + kPer * rank;  // this thread's first position
        // the entry of position j0 + i: itself, or a consumer's union block's
        int64_t eb[2] = {j0, j0 + kCandidateBlockSize};
        if constexpr (kCons)
          for (int b = 0; b < 2; ++b) {
            const int64_t u = run.ubase + (j0 + b * kCandidateBlockSize) / kCandidateBlockSize;
            eb[b] = kPer * rank + b * kCandidateBlockSize < nk ? int64_t{sm.ublk[u]} * kCandidateBlockSize : 0;
          }
        if (p.scores != nullptr)
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            const int64_t e = eb[i / kCandidateBlockSize] + i % kCandidateBlockSize;
            if (kPer * rank + i < nk && e < p.scores_cols) p.scores[tok * p.scores_stride + e] = x[i];
          }
        if (!kCons && p.role == IndexerRole::kCandidateSource)
#pragma unroll
          for (int b = 0; b < 2; ++b)
            if (kPer * rank + b * kCandidateBlockSize < nk) {
              float mx = kTopkNegInf;
#pragma unroll
              for (int e = 0; e < kCandidateBlockSize; ++e)
                if (x[b * kCandidateBlockSize + e] > mx) mx = x[b * kCandidateBlockSize + e];  // a NaN never wins
              p.ws_block[tok * p.chunks * kIndexTopk + j0 / kCandidateBlockSize + b] = mx;
            }
        // the scores above the threshold, appended in position order
        uint32_t pass = 0;
        int mine = 0;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const bool ok = isfinite(x[i]) && order_key(x[i]) > theta[tk];
          pass |= static_cast<uint32_t>(ok) << i;
          mine += ok;
        }
        int added;
        int at = cnt[tk] + grp.exclusive_sum(mine, added);
#pragma unroll
        for (int i = 0; i < kPer; ++i)
          if ((pass >> i) & 1) {
            sm.cand_key[tk][at] = x[i];
            sm.cand_entry[tk][at] = static_cast<int32_t>(eb[i / kCandidateBlockSize] + i % kCandidateBlockSize);
            ++at;
          }
        cnt[tk] += added;
        if (cnt[tk] > kCap - kSubKeys) {  // make room before the next hand-off could overflow
          grp.sync();
          float* ck = sm.cand_key[tk];
          int32_t* ce = sm.cand_entry[tk];
          const auto load = [&](int64_t i) { return ScoredEntry{ck[i], ce[i]}; };
          const auto store = [&](int j, ScoredEntry e) {
            ck[j] = e.key;
            ce[j] = e.entry;
          };
          // usually enough: the items at or above the top 512's leading digits
          const PruneResult pr = prune_top(grp, sm.sel, cnt[tk], kIndexTopk, load, store);
          cnt[tk] = pr.kept;
          if (pr.bound > 0) theta[tk] = pr.bound - 1;  // key > theta: key >= bound
          if (cnt[tk] > kCap - kSubKeys) {  // ties at the last digit: the exact top 512
            const SelectResult res = select_top(grp, sm.sel, cnt[tk], kIndexTopk, true, load, store, [](int) {});
            cnt[tk] = res.k;
            if (!res.all) theta[tk] = res.boundary;
          }
        }
      }
      mbarrier_arrive(smem_addr(&sm.hempty[gm % 2]));  // the hand-off is read
    }
    for (int tk = 0; tk < run.n; ++tk) {  // the block's workspace row c of each token
      const int64_t row = (t0 + run.g0 + tk) * p.chunks * kIndexTopk + c * kIndexTopk;
      grp.sync();
      const float* ck = sm.cand_key[tk];
      const int32_t* ce = sm.cand_entry[tk];
      select_top(
          grp, sm.sel, cnt[tk], kIndexTopk, true, [&](int64_t i) { return ScoredEntry{ck[i], ce[i]}; },
          [&](int j, ScoredEntry e) {
            p.ws_score[row + j] = e.key;
            p.ws_index[row + j] = e.entry;
          },
          [&](int j) {
            p.ws_score[row + j] = kTopkNegInf;
            p.ws_index[row + j] = -1;
          });
    }
  }
}
#endif

// A consumer's unions, by the whole block before the roles part: for each run, the sorted union of
// its tokens' candidate rows (strictly ascending prefixes, then -1; SPEC 8.7) into sm.ublk from
// run.ubase, with the bit set of the tokens holding each block; returns nothing, sets ubase and
// the run's positions [lo, hi) of block column c. The rows are staged in the candidate buffers
// and merged in the hand-off buffers (both unused until the roles start): row A's element i goes
// to i + #(B < a), row B's element j to j + #(A <= b) (A first on ties, the tie's B copy dropped),
// then one block scan compacts the merge.
__device__ __forceinline__ void build_unions(const TopkParams& p, Smem<true>& sm, int64_t t0, Run* runs, int nr,
                                             int64_t nch, int64_t c) {
  constexpr int W = kCandidateTopkBlocks;
  const int tid = static_cast<int>(threadIdx.x);
  const ThreadGroup<kThreads> grp{tid, 0, sm.scratch};
  int32_t* rows = sm.cand_entry[0];  // [2][W]
  int32_t* merged = reinterpret_cast<int32_t*>(&sm.sbuf[0][0][0]);
  int32_t* flag = merged + kUnionMax;  // bit 0: in row A, bit 1: in row B; 0: a dropped tie
  int base = 0;
  for (int r = 0; r < nr; ++r) {
    const int n = runs[r].n;
    for (int i = tid; i < n * W; i += kThreads) rows[i] = p.cand[(t0 + runs[r].g0 + i / W) * p.cand_stride + i % W];
    for (int i = tid; i < kUnionMax; i += kThreads) flag[i] = 0;
    __syncthreads();
    if (tid < n) {  // the non-negative prefix of each row
      const int32_t* row = rows + tid * W;
      int lo = 0, hi = W;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (row[mid] >= 0) lo = mid + 1;
        else hi = mid;
      }
      sm.ulen[tid] = lo;
    }
    __syncthreads();
    const int la = sm.ulen[0], lb = n > 1 ? sm.ulen[1] : 0;
    const int32_t *A = rows, *B = rows + W;
    for (int i = tid; i < la; i += kThreads) {
      const int32_t a = A[i];
      const int rb = lower_bound(B, lb, a);
      merged[i + rb] = a;
      flag[i + rb] = 1 | (rb < lb && B[rb] == a ? 2 : 0);
    }
    for (int j = tid; j < lb; j += kThreads) {
      const int32_t b = B[j];
      const int ra = lower_bound(A, la, b);
      const bool tie = ra < la && A[ra] == b;
      if (!tie) {
        merged[j + ra] = b;
        flag[j + ra] = 2;
      }
    }
    __syncthreads();
    constexpr int kPer = kUnionMax / kThreads;
    int mine = 0;
    for (int k = 0; k < kPer; ++k) mine += flag[tid * kPer + k] != 0;
    int total;
    int at = base + grp.exclusive_sum(mine, total);
    for (int k = 0; k < kPer; ++k) {
      const int i = tid * kPer + k;
      if (flag[i] == 0) continue;
      sm.ublk[at] = merged[i];
      sm.umask[at] = static_cast<uint8_t>(flag[i]);
      ++at;
    }
    runs[r].ubase = base;
    run_range(runs[r], int64_t{total} * kCandidateBlockSize, nch, c);
    base += total;
    __syncthreads();  // the staging is reused by the next run
  }
}

// nch blocks per group of p.group <= 2 tokens; kSmemBytes<kCons> of dynamic shared memory.
template <bool kCons>
__global__ void __launch_bounds__(kThreads, 1) score_warpgroup_kernel(const TopkParams p, int64_t nch) {
#if defined(DSV41KV_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  // aligned by an offset from the array itself (not through an integer), so that every access
  // stays a shared-memory one (LDS/STS, not generic loads)
  auto& sm = *reinterpret_cast<Smem<kCons>*>(smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u));
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t c = blockIdx.x, t0 = static_cast<int64_t>(blockIdx.y) * p.group;
  const int gn = static_cast<int>(p.T - t0 < p.group ? p.T - t0 : p.group);
  if (tid == 0) {
    for (int s = 0; s < Smem<kCons>::kStages; ++s) {
      mbarrier_init(smem_addr(&sm.full[s]));
      mbarrier_init_count(smem_addr(&sm.empty[s]), 128);
    }
    for (int b = 0; b < 2; ++b) {
      mbarrier_init_count(smem_addr(&sm.hfull[b]), 256);
      mbarrier_init_count(smem_addr(&sm.hempty[b]), 128);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  Run runs[kTokens];
  const int nr = block_runs(p, t0, gn, runs);
  if constexpr (kCons) {
    build_unions(p, sm, t0, runs, nr, nch, c);
  } else {
    for (int r = 0; r < nr; ++r) {
      int64_t limit = 0;
      for (int i = 0; i < runs[r].n; ++i) limit = runs[r].nc[i] > limit ? runs[r].nc[i] : limit;
      const int64_t cap = p.chunks * kTopkChunk;  // the workspace's entries (>= the block table's)
      run_range(runs[r], limit < cap ? limit : cap, nch, c);
    }
  }
  const int wg = tid / 128;
  if (wg == 0) {
    produce(p, sm, runs, nr, tid / 32);
  } else if (wg == 3) {
    select(p, sm, runs, nr, t0, c);
  } else {
    score(p, sm, runs, nr, t0, wg - 1);
  }
#else
  (void)p, (void)nch;
  __trap();  // not reached: the dispatch takes the chunk kernel off sm_90a
#endif
}

}  // namespace dsv41kv::detail::cuda::wgscore
