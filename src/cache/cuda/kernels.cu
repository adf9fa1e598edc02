// The separate (non-fused) CUDA kernels of the write path: RoPE + quantized insert of latent
// rows (SPEC 5.1), the dequantize-gather reader (SPEC 5.3) and save_ring_rows (SPEC 7.5).
// One warp per row; lane l owns dims [16l, 16l + 16) (the writer layout of formats/cuda/record_writers.cuh).
#include "cache/cuda/params.hpp"
#include "formats/cuda/record_readers.cuh"
#include "core/cuda/cuda_util.hpp"

namespace dsv41kv::detail::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

int64_t blocks_for(int64_t rows) { return (rows + kWarpsPerBlock - 1) / kWarpsPerBlock; }

// ---------------------------------------------------------------- insert

template <int F>
__global__ void __launch_bounds__(256) insert_kernel(const InsertParams p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= p.N) return;
  const int64_t slot = p.slot[t];
  if (slot < 0 || slot >= p.cache.capacity) return;
  const int64_t pos = p.pos[t];
  if (pos < 0 || !closes_group(pos, p.ratio)) return;  // only closing tokens are written
  const int64_t row = rope_row(pos, p.ratio);             // RoPE at the group start
  if (row >= p.table_rows) return;
  const int d0 = 16 * lane;
  float x[16], y[16];
  uint16_t bits[16];
  load_bf16<16>(p.latent + t * kLatentDim + d0, x, bits);
  rope_thread<16>(d0, p.table + row * kRopeDim, x, y);
  write_record<F, 16>(p.cache, slot, lane, x, y);
}

template <int F>
void launch_insert_f(const InsertParams& p, cudaStream_t stream) {
  insert_kernel<F><<<static_cast<unsigned>(blocks_for(p.N)), 32 * kWarpsPerBlock, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("insert_kernel");
}

// ---------------------------------------------------------------- query RoPE (SWA insert)

// One warp per (token, head) row of q_out; lane l owns dims [16l, 16l + 16): the NoPE lanes copy
// their bits, the RoPE lanes (d0 >= 448) rotate with the writers' pair rotation (rope_thread:
// num::rope_forward, as formats/rope_bf16.hpp on the host) and round to bf16. Every lane reads its
// dims before writing them, so q_out may be q itself. A row whose position has no table row is
// not written (the host checks positions of host views).
__global__ void __launch_bounds__(256) q_rope_kernel(const QRopeParams p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= p.T * p.H_pad) return;
  const int64_t t = w / p.H_pad;
  const int h = static_cast<int>(w % p.H_pad);
  const int64_t pos = p.pos[t];
  if (pos < 0 || pos >= p.table_rows) return;
  const int d0 = 16 * lane;
  uint16_t* dst = p.out + t * p.o_ts + h * p.o_hs + d0;
  uint16_t o[16];
  if (h >= p.H) {
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] = 0;
  } else {
    float x[16], y[16];
    uint16_t bits[16];
    load_bf16<16>(p.q + t * p.q_ts + h * p.q_hs + d0, x, bits);
    if (d0 < kNopeDim) {
#pragma unroll
      for (int i = 0; i < 16; ++i) o[i] = bits[i];
    } else {
      rope_thread<16>(d0, p.table + pos * kRopeDim, x, y);
#pragma unroll
      for (int i = 0; i < 16; ++i) o[i] = num::bf16_encode(y[i]);
    }
  }
  uint32_t wv[8];
  pack_bf16<16>(o, wv);
  store_words<8>(reinterpret_cast<uint8_t*>(dst), wv);
}

// ---------------------------------------------------------------- gather

template <int F>
__global__ void __launch_bounds__(256) gather_kernel(const GatherParams p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (i >= p.M) return;
  const int64_t slot = p.slot[i];
  if (slot < 0 || slot >= p.capacity) return;
  int64_t page, r;
  divmod(slot, p.S, page, r);
  const uint8_t* pg = p.base + page * p.page_stride_bytes;
  const int d0 = 16 * lane;
  uint16_t o[16];
  read_record_dims<F, 16>(pg, p.S, r, p.row_stride_bytes, p.fp8_scale, d0, o);
  uint32_t w[8];
  pack_bf16<16>(o, w);
  store_words<8>(reinterpret_cast<uint8_t*>(p.out + i * p.out_stride + d0), w);
}

template <int F>
void launch_gather_f(const GatherParams& p, cudaStream_t stream) {
  gather_kernel<F><<<static_cast<unsigned>(blocks_for(p.M)), 32 * kWarpsPerBlock, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("gather_kernel");
}

// ---------------------------------------------------------------- save_ring_rows

__global__ void __launch_bounds__(256) save_ring_rows_kernel(const SaveRowsParams p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (g >= p.G) return;
  const int64_t slot = p.slot[g];
  if (slot < 0 || slot >= p.ring_slots) return;
  int64_t blk, row;
  divmod(slot, p.cap, blk, row);
  float* dst = p.ring + blk * p.ring_bs + row * p.ring_rs;
  const float* src = p.prev + g * p.prev_stride;
  const bool d_al = aligned16(dst);  // ring block strides are arbitrary
  float4 v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = ld4(src + 4 * lane + 128 * k);
#pragma unroll
  for (int k = 0; k < 8; ++k) st4_any(dst + 4 * lane + 128 * k, v[k], d_al);
}

}  // namespace

void launch_insert(RecordFormat f, const InsertParams& p, cudaStream_t stream) {
  if (p.N <= 0) return;
  with_record_format(f, [&](auto F) { launch_insert_f<F()>(p, stream); });
}

void launch_q_rope(const QRopeParams& p, cudaStream_t stream) {
  const int64_t rows = p.T * p.H_pad;
  if (rows <= 0) return;
  q_rope_kernel<<<static_cast<unsigned>(blocks_for(rows)), 32 * kWarpsPerBlock, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("q_rope_kernel");
}

void launch_gather(RecordFormat f, const GatherParams& p, cudaStream_t stream) {
  if (p.M <= 0) return;
  with_record_format(f, [&](auto F) { launch_gather_f<F()>(p, stream); });
}

void launch_save_ring_rows(const SaveRowsParams& p, cudaStream_t stream) {
  if (p.G <= 0) return;
  save_ring_rows_kernel<<<static_cast<unsigned>(blocks_for(p.G)), 32 * kWarpsPerBlock, 0,
                          stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("save_ring_rows_kernel");
}

}  // namespace dsv41kv::detail::cuda
