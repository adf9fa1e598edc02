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
