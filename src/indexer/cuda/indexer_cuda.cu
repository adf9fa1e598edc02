// The indexer's exact kernels on CUDA: the index-K store (SPEC 8.1) and the Q preparation
// (SPEC 8.2), through the same per-row rules as the CPU backend (indexer/rows.hpp, host+device
// code), so that every byte equals the CPU's. Simple forms first: one block of 128 threads per
// written token (one projection output per thread, each with lin::dot_fixed's order; the norm,
// the RoPE and the record by the first thread) and one thread per query head. Indices a kernel
// cannot use (a slot beyond the cache, a position without a table row) write nothing: the host
// checks them for host views only. Two written tokens with the same slot race on CUDA (the
// serving metadata never produces them).
#include "core/cuda/cuda_util.hpp"
#include "indexer/cuda/backend_cuda.hpp"
#include "indexer/rows.hpp"

namespace dsv41kv::detail::cuda {
namespace {

struct KStoreParams {
  const uint16_t* latent = nullptr;
  const int64_t* pos = nullptr;
  const int64_t* slot = nullptr;
  int64_t N = 0;
  int ratio = 1;
  const uint16_t* wk = nullptr;      // bf16 [128, 512]
  const uint16_t* k_norm = nullptr;  // bf16 [128]
  float eps = 0;
  const float* table = nullptr;
  int64_t table_rows = 0;
  uint8_t* cache = nullptr;
  IndexKFormat format = IndexKFormat::FP8_132;
  int64_t S = 1, page_stride = 0, capacity = 0;
};

__global__ void __launch_bounds__(128) k_store_kernel(const KStoreParams p) {
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot[t], pos = p.pos[t];
  if (slot < 0 || slot >= p.capacity || pos < 0 || !closes_group(pos, p.ratio)) return;
  const int64_t row = rope_row(pos, p.ratio);
  if (row >= p.table_rows) return;
  __shared__ float x[kLatentDim];
  __shared__ float k[kIndexHeadDim];
  const int o = static_cast<int>(threadIdx.x);
  for (int d = o; d < kLatentDim; d += kIndexHeadDim) x[d] = num::bf16_decode(p.latent[t * kLatentDim + d]);
  __syncthreads();
  float w[kLatentDim];
  for (int d = 0; d < kLatentDim; ++d) w[d] = num::bf16_decode(p.wk[o * kLatentDim + d]);
  k[o] = num::bf16_round(lin::dot_fixed(x, w, kLatentDim));
  __syncthreads();
  if (o != 0) return;
  float kk[kIndexHeadDim];
  for (int d = 0; d < kIndexHeadDim; ++d) kk[d] = k[d];
  index_key_finish(p.k_norm, p.eps, p.table + row * kRopeDim, kk);
  uint8_t* page = p.cache + (slot / p.S) * p.page_stride;
  if (p.format == IndexKFormat::FP8_132)
    rec::write_index_k_fp8(page, p.S, slot % p.S, kk);
  else
    rec::write_index_k_mxfp4(page, p.S, slot % p.S, kk);
}

struct QPrepParams {
  const uint16_t* q = nullptr;      // bf16 [T, 32, 128]
  const uint16_t* w_raw = nullptr;  // bf16 [T, 32]
  const int64_t* pos = nullptr;
  int64_t T = 0;
  const float* table = nullptr;
  int64_t table_rows = 0;
  uint8_t* q8 = nullptr;            // [>= T, 32, 128]
  float* w = nullptr;               // [>= T, 32]
};

__global__ void __launch_bounds__(128) q_prep_kernel(const QPrepParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // t * 32 + h
  if (row >= p.T * kIndexHeads) return;
  const int64_t pos = p.pos[row / kIndexHeads];
  if (pos < 0 || pos >= p.table_rows) return;
  p.w[row] = index_query_head(p.q + row * kIndexHeadDim, p.table + pos * kRopeDim, p.w_raw[row],
                              p.q8 + row * kIndexHeadDim);
}

// SPEC 8.6: topk[t][j] = j for j < n_c(p_t), -1 after; an invalid token's row all -1. A row whose
// n_c exceeds 512 is not written (the host refuses it for host views).
__global__ void __launch_bounds__(256) shortcut_kernel(const int64_t* pos, const int32_t* valid, int64_t T, int ratio,
                                                       int32_t* topk, int64_t stride) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * kIndexTopk) return;
  const int64_t t = i / kIndexTopk, j = i % kIndexTopk;
  const bool ok = valid == nullptr || valid[t] != 0;
  const int64_t nc = ok ? closed_groups(pos[t] + 1, int64_t{ratio}) : 0;
  if (nc > kIndexTopk) return;
  topk[t * stride + j] = j < nc ? static_cast<int32_t>(j) : -1;
}

}  // namespace

void indexer_shortcut(const IndexerShortcutArgs& a, const IndexerShortcutPlan& p, const ExecContext& ctx) {
  if (p.T == 0) return;
  const int64_t n = p.T * kIndexTopk;
  shortcut_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, as_stream(ctx.stream)>>>(
      a.positions.ptr<const int64_t>(), a.token_valid.present() ? a.token_valid.ptr<const int32_t>() : nullptr, p.T,
      a.ratio, a.topk.ptr<int32_t>(), p.topk_stride);
  DSV41KV_CUDA_CHECK_LAUNCH("shortcut_kernel");
}

void index_k_store(const IndexKStoreArgs& a, const IndexKStorePlan& p, const ExecContext& ctx) {
  if (p.N == 0) return;
  KStoreParams k;
  k.latent = a.latent.ptr<const uint16_t>();
  k.pos = a.positions.ptr<const int64_t>();
  k.slot = a.slots.ptr<const int64_t>();
  k.N = p.N;
  k.ratio = p.ratio;
  k.wk = a.wk.ptr<const uint16_t>();
  k.k_norm = a.k_norm.ptr<const uint16_t>();
  k.eps = a.eps;
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = p.table_rows;
  k.cache = static_cast<uint8_t*>(a.cache.base);
  k.format = a.cache.format;
  k.S = a.cache.states_per_page;
  k.page_stride = a.cache.page_stride;
  k.capacity = p.capacity;
  k_store_kernel<<<static_cast<unsigned>(p.N), kIndexHeadDim, 0, as_stream(ctx.stream)>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("k_store_kernel");
}

void index_q_prep(const IndexQPrepArgs& a, const IndexQPrepPlan& p, const ExecContext& ctx) {
  if (p.T == 0) return;
  QPrepParams k;
  k.q = a.q.ptr<const uint16_t>();
  k.w_raw = a.w_raw.ptr<const uint16_t>();
  k.pos = a.positions.ptr<const int64_t>();
  k.T = p.T;
  k.table = a.rope_table.ptr<const float>();
  k.table_rows = p.table_rows;
  k.q8 = a.q8.ptr<uint8_t>();
  k.w = a.w.ptr<float>();
  const int64_t rows = p.T * kIndexHeads;
  q_prep_kernel<<<static_cast<unsigned>((rows + 127) / 128), 128, 0, as_stream(ctx.stream)>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("q_prep_kernel");
}

}  // namespace dsv41kv::detail::cuda

// ---------------------------------------------------------------- scores and top-k (SPEC 8.3-8.7)

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace dsv41kv::detail::cuda {
namespace {

struct TopkParams {
  int ratio = 1;
  IndexerRole role = IndexerRole::kPlain;
  const uint8_t* q8 = nullptr;  // [T, 32, 128]
  const float* w = nullptr;     // [T, 32]
  const int64_t* pos = nullptr;
  const int32_t* t2r = nullptr;
  const int32_t* valid = nullptr;  // null: all valid
  const int32_t* bt = nullptr;
  int64_t bt_stride = 0, bt_cols = 0;
  const uint8_t* cache = nullptr;
  int64_t S = 1, page_stride = 0, num_pages = 0;
  int32_t* topk = nullptr;
  int64_t topk_stride = 0;
  int32_t* cand = nullptr;
  int64_t cand_stride = 0;
  float* scores = nullptr;
  int64_t scores_stride = 0, scores_cols = 0;
  int64_t T = 0;
};

__device__ bool token_valid(const TopkParams& p, int64_t t) { return p.valid == nullptr || p.valid[t] != 0; }
__device__ int64_t token_nc(const TopkParams& p, int64_t t) {
  return token_valid(p, t) ? closed_groups(p.pos[t] + 1, int64_t{p.ratio}) : 0;
}

// Whether entry i's block is among the consumer's candidate blocks (a sorted prefix, then -1).
__device__ bool in_candidates(const TopkParams& p, int64_t t, int64_t i) {
  const int32_t* c = p.cand + t * p.cand_stride;
  const int64_t b = i / kCandidateBlockSize;
  int lo = 0, hi = kCandidateTopkBlocks;  // first position whose block is >= b or -1
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (c[mid] >= 0 && c[mid] < b) lo = mid + 1;
    else hi = mid;
  }
  return lo < kCandidateTopkBlocks && c[lo] == b;
}

// I(t, i) as the CPU's indexer/score.hpp computes it: D exact in binary64 in any order, then
// sum_h w[h] * max(0, D) in binary64 with heads ascending, each product and sum rounded once
// (explicit roundings: no contraction into an FMA), times sk, rounded once to fp32.
__device__ float score_of(const TopkParams& p, int64_t t, int64_t i) {
  const int32_t page = p.bt[p.t2r[t] * p.bt_stride + i / p.S];
  if (page < 0 || page >= p.num_pages) return -std::numeric_limits<float>::infinity();
  const uint8_t* pg = p.cache + page * p.page_stride;
  const uint8_t* k8 = rec::index_k_fp8_codes(pg, p.S, i % p.S);
  double k[kIndexHeadDim];
  for (int d = 0; d < kIndexHeadDim; ++d) k[d] = num::e4m3_decode(k8[d]);
  const uint8_t* q = p.q8 + t * kIndexHeads * kIndexHeadDim;
  double acc = 0.0;
  for (int h = 0; h < kIndexHeads; ++h) {
    double D = 0.0;
    for (int d = 0; d < kIndexHeadDim; ++d) D = fma(static_cast<double>(num::e4m3_decode(q[h * kIndexHeadDim + d])), k[d], D);
    acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(p.w[t * kIndexHeads + h]), D < 0.0 ? 0.0 : D));
  }
  return __double2float_rn(__dmul_rn(acc, static_cast<double>(rec::read_index_k_fp8_scale(pg, p.S, i % p.S))));
}

// One thread per (token, column) of the scores workspace (tokens along x, up to 2^31 - 1; columns
// along y, up to 65535 * 128): the score of every visible entry (a
// consumer's outside its candidate blocks -inf), -inf past n_c and for invalid tokens.
__global__ void __launch_bounds__(128) scores_kernel(const TopkParams p) {
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= p.scores_cols) return;
  const int64_t nc = token_nc(p, t);
  float s = -std::numeric_limits<float>::infinity();
  if (i < nc && (p.role != IndexerRole::kCandidateConsumer || in_candidates(p, t, i))) s = score_of(p, t, i);
  p.scores[t * p.scores_stride + i] = s;
}

constexpr int kSelectThreads = 256;
using BlockScan = cub::BlockScan<int, kSelectThreads>;
using BlockSum = cub::BlockReduce<int, kSelectThreads>;

// A float's order as an unsigned key (larger float, larger key; -0 as +0: equal keys rank by index).
__device__ uint32_t order_key(float x) {
  const uint32_t b = num::f2u(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The top min(K, #eligible) of key(0..n) by (key desc, index asc), written to out[0..K) in
// ascending index order, -1 after (select.hpp's rule): a radix selection of the K-th key (four
// 8-bit passes over a shared histogram), then an ordered compaction.
template <class Key>
__device__ void select_top_block(int64_t n, int K, bool finite_only, int32_t* out, Key key) {
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_count;
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ typename BlockSum::TempStorage sum;
  const int tid = static_cast<int>(threadIdx.x);
  auto eligible = [&](float x) { return finite_only ? isfinite(x) : !isnan(x); };
  int mine = 0;
  for (int64_t i = tid; i < n; i += kSelectThreads) mine += eligible(key(i));
  const int count = BlockSum(sum).Sum(mine);
  if (tid == 0) s_count = count;
  __syncthreads();
  const int k = s_count < K ? s_count : K;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  const bool all = k == s_count;  // every eligible entry is taken
  if (!all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int d = tid; d < 256; d += kSelectThreads) hist[d] = 0;
      __syncthreads();
      for (int64_t i = tid; i < n; i += kSelectThreads) {
        const float x = key(i);
        if (!eligible(x)) continue;
        const uint32_t u = order_key(x);
        if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
      }
      __syncthreads();
      if (tid == 0) {
        int cum = 0, digit = 0;
        for (int d = 255; d >= 0; --d) {
          if (cum + hist[d] >= remaining) {
            digit = d;
            break;
          }
          cum += hist[d];
        }
        s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        s_remaining = remaining - cum;
      }
      __syncthreads();
      prefix = s_prefix;
      remaining = s_remaining;
      mask |= 255u << shift;
      __syncthreads();
    }
  }
  // ordered compaction: every key above the K-th, then its ties by index
  int taken = 0, ties = 0;
  for (int64_t base = 0; base < n; base += kSelectThreads) {
    const int64_t i = base + tid;
    int gt = 0, eq = 0;
    if (i < n) {
      const float x = key(i);
      if (eligible(x)) {
        const uint32_t u = order_key(x);
        gt = all || u > prefix;
        eq = !all && u == prefix;
      }
    }
    int eq_rank, eq_total;
    BlockScan(scan).ExclusiveSum(eq, eq_rank, eq_total);
    __syncthreads();
    const int take = gt || (eq && ties + eq_rank < remaining);
    int pos, n_taken;
    BlockScan(scan).ExclusiveSum(take, pos, n_taken);
    __syncthreads();
    if (take) out[taken + pos] = static_cast<int32_t>(i);
    taken += n_taken;
    ties += eq_total;
  }
  for (int j = taken + tid; j < K; j += kSelectThreads) out[j] = -1;
}

// One block per token: the top-k over its scores row; a candidate source also its blocks.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const TopkParams p) {
  const int64_t t = blockIdx.x;
  const int64_t nc0 = token_nc(p, t);
  const int64_t nc = nc0 <= p.scores_cols ? nc0 : -1;  // a row the workspace cannot hold is not written
  if (nc < 0) return;
  const float* row = p.scores + t * p.scores_stride;
  select_top_block(nc, kIndexTopk, true, p.topk + t * p.topk_stride, [&](int64_t i) { return row[i]; });
  if (p.role != IndexerRole::kCandidateSource) return;
  const int64_t nb = nc > 0 ? (nc + kCandidateBlockSize - 1) / kCandidateBlockSize : 0;
  __syncthreads();
  select_top_block(nb, kCandidateTopkBlocks, false, p.cand + t * p.cand_stride, [&](int64_t b) {
    if (b == nb - 1) return std::numeric_limits<float>::infinity();  // the newest block
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = b * kCandidateBlockSize; i < (b + 1) * kCandidateBlockSize && i < nc; ++i)
      if (row[i] > m) m = row[i];  // a NaN never wins
    return m;
  });
}

}  // namespace

void indexer_topk(const IndexerTopkArgs& a, const IndexerTopkPlan& p, const ExecContext& ctx) {
  if (p.T == 0) return;
  TopkParams k;
  k.ratio = a.ratio;
  k.role = a.role;
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
  k.topk = a.topk.ptr<int32_t>();
  k.topk_stride = p.topk_stride;
  if (a.role != IndexerRole::kPlain) {
    k.cand = a.candidates.ptr<int32_t>();
    k.cand_stride = p.cand_stride;
  }
  k.scores = a.scores.ptr<float>();
  k.scores_stride = p.scores_stride;
  k.scores_cols = p.scores_cols;
  k.T = p.T;
  cudaStream_t s = as_stream(ctx.stream);
  if (p.scores_cols > 0) {
    const dim3 grid(static_cast<unsigned>(p.T), static_cast<unsigned>((p.scores_cols + 127) / 128));
    scores_kernel<<<grid, 128, 0, s>>>(k);
    DSV41KV_CUDA_CHECK_LAUNCH("scores_kernel");
  }
  select_kernel<<<static_cast<unsigned>(p.T), kSelectThreads, 0, s>>>(k);
  DSV41KV_CUDA_CHECK_LAUNCH("select_kernel");
}

}  // namespace dsv41kv::detail::cuda
