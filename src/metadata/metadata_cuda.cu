// CUDA builders of the per-step metadata (SPEC 6.1, 6.3-6.5), behind the public API of
// metadata.hpp (validated and dispatched by metadata.cpp). One thread per token row t < N, so
// the launch geometry depends only on N; every index read from device memory is bounded before
// it is dereferenced and an out-of-range value yields -1 (token_to_req: 0) instead of an error,
// because the host cannot read device values without a synchronisation (backend.hpp). For
// valid inputs every output is bit-identical to the CPU builders.
#include "core/cuda/cuda_util.hpp"
#include "metadata/backend.hpp"
#include "metadata/slots.hpp"
#include "dsv41kv/records.hpp"
#include "formats/window.hpp"

namespace dsv41kv::detail::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// ---------------------------------------------------------------- token_to_req (6.1)

// out[t] = the largest j < num_reqs with qsl[j] <= t (the request whose chunk holds t when qsl
// is valid) for t < num_actual, 0 otherwise. num_actual < 0: qsl[num_reqs].
__global__ void token_to_req_kernel(const int32_t* __restrict__ qsl, int64_t num_reqs,
                                    int64_t num_actual, int32_t* __restrict__ out, int64_t N) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= N) return;
  int64_t na = num_actual >= 0 ? num_actual : static_cast<int64_t>(qsl[num_reqs]);
  if (na > N) na = N;
  int32_t v = 0;
  if (t < na && num_reqs > 0) {
    // upper_bound over qsl[0..num_reqs): first j with qsl[j] > t, minus one
    int64_t lo = 0, hi = num_reqs;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(qsl[mid]) <= t) lo = mid + 1;
      else hi = mid;
    }
    v = lo > 0 ? static_cast<int32_t>(lo - 1) : 0;
  }
  out[t] = v;
}

// ---------------------------------------------------------------- slot builders

struct TableRef {
  const int32_t* data;
  int64_t rows, cols, stride0, stride1;
  __device__ int32_t at(int64_t r, int64_t c) const { return data[r * stride0 + c * stride1]; }
};

TableRef table_ref(const TensorView& v) {
  return {v.ptr<const int32_t>(), v.shape[0], v.shape[1], v.stride[0],
          v.shape[1] > 1 ? v.stride[1] : 1};
}

__global__ void ring_slots_kernel(const int32_t* __restrict__ t2r, const int64_t* __restrict__ pos,
                                  TableRef bt, int64_t num_actual, int64_t cap,
                                  int64_t num_blocks, int64_t* __restrict__ out, int64_t N) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= N) return;
  int64_t v = -1;
  if (t < num_actual) {
    const int64_t j = t2r[t];
    const int64_t p = pos[t];
    if (j >= 0 && j < bt.rows && p >= 0) {
      const int64_t b = bt.at(j, 0);
      if (num_blocks < 0 || b < num_blocks) {
        int64_t q, r;
        divmod(p, cap, q, r);
        v = slot_in_page(b, cap, r);
      }
    }
  }
  out[t] = v;
}

__global__ void token_slots_kernel(const int32_t* __restrict__ t2r, const int64_t* __restrict__ pos,
                                   TableRef bt, int64_t num_actual, int64_t page,
                                   int64_t num_pages, int64_t* __restrict__ out, int64_t N) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= N) return;
  int64_t v = -1;
  if (t < num_actual) {
    const int64_t j = t2r[t];
    const int64_t p = pos[t];
    if (j >= 0 && j < bt.rows && p >= 0) {
      int64_t lp, off;
      divmod(p, page, lp, off);
      if (lp < bt.cols) {
        const int64_t pg = bt.at(j, lp);
        if (num_pages < 0 || pg < num_pages) v = slot_in_page(pg, page, off);
      }
    }
  }
  out[t] = v;
}

// out may alias token_slots: each thread reads token_slots[t] before writing out[t].
__global__ void compressed_slots_kernel(const int32_t* __restrict__ t2r,
                                        const int64_t* __restrict__ pos, TableRef bt,
                                        const int64_t* tslot, int64_t num_actual, int ratio,
                                        int64_t S, int64_t num_pages, int64_t* out, int64_t N) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= N) return;
  int64_t v = -1;
  if (t < num_actual) {
    const int64_t j = t2r[t];
    const int64_t p = pos[t];
    const bool valid = p >= 0 && closes_group(p, ratio) && (tslot == nullptr || tslot[t] >= 0);
    if (valid && j >= 0 && j < bt.rows) {
      const int64_t s = p / ratio;
      int64_t lp, off;
      divmod(s, S, lp, off);
      if (lp < bt.cols) {
        const int64_t pg = bt.at(j, lp);
        if (num_pages < 0 || pg < num_pages) v = slot_in_page(pg, S, off);
      }
    }
  }
  out[t] = v;
}

// ---------------------------------------------------------------- the read path's decode rows (6.6)

// The decode request of decode token t: the largest j < num_decodes with qsl[j] <= t, or -1 when
// none is (num_decodes 0, or qsl[0] > t for an invalid qsl).
__device__ int64_t decode_request_of(const int32_t* __restrict__ qsl, int64_t num_decodes, int64_t t) {
  int64_t lo = 0, hi = num_decodes;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(qsl[mid]) <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

constexpr int kWindowThreads = kSwaWindow;  // one thread per window entry
constexpr int kTopkThreads = 256;

// One block per row t < max_tokens: rows t < T get their window (SPEC 6.6), the others length 0.
__global__ void __launch_bounds__(kWindowThreads)
swa_window_kernel(const int32_t* __restrict__ qsl, int64_t num_decodes, int64_t T, const int64_t* __restrict__ pos,
                  const int64_t* __restrict__ slot_swa, TableRef bt, int64_t page, int64_t num_pages,
                  int32_t* __restrict__ idx, int64_t row_stride, int32_t* __restrict__ len) {
  const int64_t t = blockIdx.x;
  const int k = threadIdx.x;
  if (t >= T) {
    if (k == 0) len[t] = 0;
    return;
  }
  const int64_t j = decode_request_of(qsl, num_decodes, t);
  const int64_t p = pos[t];
  const bool valid = slot_swa[t] >= 0 && p >= 0 && j >= 0 && j < bt.rows;
  int32_t v = -1;
  const int64_t n = valid ? window_len(p) : 0;
  if (k < n) {
    int64_t lp, off;
    divmod(swa_window_start(p) + k, page, lp, off);
    if (lp < bt.cols) v = row_entry(bt.at(j, lp), page, off, num_pages);
  }
  idx[t * row_stride + k] = v;
  if (k == 0) len[t] = static_cast<int32_t>(n);
}

// One block per row t < max_tokens: the top-k entries of decode row t as global slots, the count
// of entries >= 0 as its length; rows t >= T length 0.
__global__ void __launch_bounds__(kTopkThreads)
topk_slots_kernel(const int32_t* __restrict__ qsl, int64_t num_decodes, int64_t T, const int64_t* __restrict__ slot_swa,
                  const int32_t* __restrict__ topk, int64_t topk_stride, int64_t K, TableRef bt, int64_t S,
                  int64_t num_pages, int32_t* __restrict__ idx, int64_t row_stride, int32_t* __restrict__ len) {
  const int64_t t = blockIdx.x;
  if (t >= T) {
    if (threadIdx.x == 0) len[t] = 0;
    return;
  }
  const int64_t j = decode_request_of(qsl, num_decodes, t);
  const bool valid = slot_swa[t] >= 0 && j >= 0 && j < bt.rows;
  int n = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kTopkThreads) {  // uniform trip count: every thread reaches the barrier
    const int64_t k = k0 + threadIdx.x;
    int32_t v = -1;
    if (k < K && valid) {
      const int64_t i = topk[t * topk_stride + k];
      if (i >= 0) {
        int64_t lp, off;
        divmod(i, S, lp, off);
        if (lp < bt.cols) v = row_entry(bt.at(j, lp), S, off, num_pages);
      }
    }
    if (k < K) idx[t * row_stride + k] = v;
    n += __syncthreads_count(v >= 0);
  }
  if (threadIdx.x == 0) len[t] = n;
}

__global__ void token_valid_kernel(const int64_t* __restrict__ slot, int32_t* __restrict__ valid, int64_t N) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < N) valid[t] = slot[t] >= 0 ? 1 : 0;
}

__global__ void mask_lengths_kernel(const int32_t* __restrict__ valid, int32_t* __restrict__ len, int64_t T) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < T && valid[t] == 0) len[t] = 0;
}

}  // namespace

void build_token_to_req(const TokenToReqArgs& a, const ExecContext& ctx) {
  const int64_t N = a.token_to_req.shape[0];
  if (N == 0) return;
  token_to_req_kernel<<<grid_for(N), kThreads, 0, as_stream(ctx.stream)>>>(
      a.qsl.ptr<const int32_t>(), a.qsl.shape[0] - 1, a.num_actual_tokens,
      a.token_to_req.ptr<int32_t>(), N);
  DSV41KV_CUDA_CHECK_LAUNCH("token_to_req_kernel");
}

void build_ring_slots(const RingSlotArgs& a, const ExecContext& ctx) {
  const int64_t N = a.ring_slots.shape[0];
  if (N == 0) return;
  ring_slots_kernel<<<grid_for(N), kThreads, 0, as_stream(ctx.stream)>>>(
      a.token_to_req.ptr<const int32_t>(), a.positions.ptr<const int64_t>(),
      table_ref(a.ring_block_table), a.num_actual_tokens, a.cap, a.num_ring_blocks,
      a.ring_slots.ptr<int64_t>(), N);
  DSV41KV_CUDA_CHECK_LAUNCH("ring_slots_kernel");
}

void build_token_slots(const TokenSlotArgs& a, const ExecContext& ctx) {
  const int64_t N = a.slots.shape[0];
  if (N == 0) return;
  token_slots_kernel<<<grid_for(N), kThreads, 0, as_stream(ctx.stream)>>>(
      a.token_to_req.ptr<const int32_t>(), a.positions.ptr<const int64_t>(),
      table_ref(a.block_table), a.num_actual_tokens, a.page, a.num_pages, a.slots.ptr<int64_t>(),
      N);
  DSV41KV_CUDA_CHECK_LAUNCH("token_slots_kernel");
}

void build_compressed_slots(const CompressedSlotArgs& a, const ExecContext& ctx) {
  const int64_t N = a.slots.shape[0];
  if (N == 0) return;
  compressed_slots_kernel<<<grid_for(N), kThreads, 0, as_stream(ctx.stream)>>>(
      a.token_to_req.ptr<const int32_t>(), a.positions.ptr<const int64_t>(),
      table_ref(a.block_table), a.token_slots.present() ? a.token_slots.ptr<const int64_t>() : nullptr,
      a.num_actual_tokens, a.ratio, a.states_per_page, a.num_pages, a.slots.ptr<int64_t>(), N);
  DSV41KV_CUDA_CHECK_LAUNCH("compressed_slots_kernel");
}

// Grids of max_tokens (or N) blocks whatever the split: a captured graph replays with the same
// geometry, and the split only moves the boundary between the rows written and the rows zeroed.
void build_swa_window(const SwaWindowArgs& a, const DecodeSplit& sp, const ExecContext& ctx) {
  const int64_t max_tokens = a.lengths.shape[0];
  if (max_tokens == 0) return;
  swa_window_kernel<<<static_cast<unsigned>(max_tokens), kWindowThreads, 0, as_stream(ctx.stream)>>>(
      a.qsl.ptr<const int32_t>(), sp.num_decodes, sp.num_decode_tokens, a.positions.ptr<const int64_t>(),
      a.slot_swa.ptr<const int64_t>(), table_ref(a.block_table), a.page, a.num_pages, a.indices.ptr<int32_t>(),
      a.indices.stride[0], a.lengths.ptr<int32_t>());
  DSV41KV_CUDA_CHECK_LAUNCH("swa_window_kernel");
}

void build_decode_topk_slots(const DecodeTopkSlotArgs& a, const DecodeSplit& sp, const ExecContext& ctx) {
  const int64_t max_tokens = a.lengths.shape[0];
  if (max_tokens == 0) return;
  topk_slots_kernel<<<static_cast<unsigned>(max_tokens), kTopkThreads, 0, as_stream(ctx.stream)>>>(
      a.qsl.ptr<const int32_t>(), sp.num_decodes, sp.num_decode_tokens, a.slot_swa.ptr<const int64_t>(),
      a.topk.ptr<const int32_t>(), a.topk.stride[0], a.topk.shape[1], table_ref(a.block_table), a.states_per_page,
      a.num_pages, a.indices.ptr<int32_t>(), a.indices.stride[0], a.lengths.ptr<int32_t>());
  DSV41KV_CUDA_CHECK_LAUNCH("topk_slots_kernel");
}

void build_token_valid(const TensorView& slot_swa, const TensorView& token_valid, const ExecContext& ctx) {
  const int64_t N = token_valid.shape[0];
  token_valid_kernel<<<grid_for(N), kThreads, 0, as_stream(ctx.stream)>>>(slot_swa.ptr<const int64_t>(),
                                                                         token_valid.ptr<int32_t>(), N);
  DSV41KV_CUDA_CHECK_LAUNCH("token_valid_kernel");
}

void mask_invalid_lengths(const TensorView& token_valid, const TensorView& lengths, const ExecContext& ctx) {
  const int64_t T = lengths.shape[0];
  mask_lengths_kernel<<<grid_for(T), kThreads, 0, as_stream(ctx.stream)>>>(token_valid.ptr<const int32_t>(),
                                                                          lengths.ptr<int32_t>(), T);
  DSV41KV_CUDA_CHECK_LAUNCH("mask_lengths_kernel");
}

}  // namespace dsv41kv::detail::cuda
