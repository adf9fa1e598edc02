// The fused save-compress-norm kernel (SPEC 4.4-4.6, 7.5), optionally fused with the RoPE +
// quantized insert of SPEC 5.1 (template parameter F), so that the latent stays in registers.
//
// Programs follow the reference decomposition exactly (as the CPU backend does):
//   ratio 1: program t < N;  ratio 2: request programs j < num_reqs, then pair programs
//   k < ceil(N / 2) over the flat token array.
// A program runs on a group of G warps (G = 1: one warp, 8 programs per 256-thread block, for
// large grids; G = 4: one 128-thread block per program, for small grids such as decode).
//
// Per program (token t that closes a group, predecessor row a, current row b = kv_score[t]):
//  1. load layout: thread gt loads dims d = 4*gt + 128*G*k (k < 4/G) of a.kv, a.score, b.kv,
//     b.score as 16-byte vectors, all loads in flight before the first use;
//  2. pooled[d] = pool2(a, b) (ratio 1: b.kv) -> shared memory (padded: index d + 4*(d/32),
//     conflict-free for every access below);
//  3. warp 0 lane l: part = fma over d = l, l+32, ..., l+480 ascending (the normative order),
//     then the shuffle-down tree h = 16..1 (= SPEC 4.6's reduction), rs = 1/sqrt(sum/512 + eps);
//  4. writer layout: thread gt owns dims [E*gt, E*gt+E), E = 16/G: latent = bf16((pooled*rs)*w),
//     optional latent_out store, RoPE at the group start row, cooperative record write.
// Request programs (ratio 2) read the predecessor from the ring (or prev_rows under PCP) and then
// run the tail store (policy kTail): every ring read of the program completes before its first
// ring write (the pooled values are consumed and the group synchronised before the store).
//
// Every index read from device memory is bounded before it is dereferenced (SPEC 0.4 item 3:
// the host cannot check device values without a synchronisation): a request with an out-of-range
// qsl, a slot >= capacity or < 0, a token_to_req outside [0, num_reqs), a negative position, a
// RoPE row beyond the table: the program (or its insert half) writes nothing.
#pragma once

#include "compressor/cuda_kernels.hpp"
#include "compressor/cuda_tuning.hpp"
#include "core/cuda_util.hpp"

namespace dsv41kv::detail::cuda {

inline constexpr int kPooledFloats = kLatentDim + kLatentDim / 8;  // 512 + padding 4 per 32

__device__ __forceinline__ int pooled_index(int d) { return d + 4 * (d / 32); }

// Insert decision of a token (SPEC 5.1): the cache slot and RoPE table row, or slot -1.
template <int R, int F>
__device__ __forceinline__ void insert_decision(const CompressParams& p, int64_t islot,
                                                int64_t pos_t, int64_t& slot_out,
                                                int64_t& row_out) {
  slot_out = -1;
  row_out = 0;
  if constexpr (F != kNoRecord) {
    const int64_t row = (pos_t / R) * R;
    const bool ins = islot >= 0 && islot < p.cache.capacity && pos_t >= 0 &&
                     ((pos_t + 1) % R) == 0 && row < p.table_rows;
    if (ins) {
      slot_out = islot;
      row_out = row;
    }
  }
}

// ==================================================================== one-warp streaming kernel
//
// compress_stream_kernel<R, F, C>: 4 warps per 128-thread block, each warp owns
//   ratio 2: warps w < num_reqs: request program w (one program, generic loads, tail store);
//            the other warps: a chunk of C consecutive pair programs;
//   ratio 1: a chunk of C consecutive token programs.
// A chunk starts with one round of metadata: lane j resolves program j of the chunk (token,
// insert slot, RoPE row), in parallel over the lanes; the program loop then broadcasts the role
// with shuffles and issues the 16-byte row loads of program i+1 before computing program i
// (two register buffers), so every warp keeps the next 8 KiB (ratio 2) / 2 KiB (ratio 1) in
// flight through the whole compute phase.

template <int R>
struct Rows {
  float4 bkv[4];
  float4 bsc[R == 2 ? 4 : 1];
  float4 akv[R == 2 ? 4 : 1];
  float4 asc[R == 2 ? 4 : 1];
};

// Loads the rows of token t (ratio 2: predecessor row `arow`, current row kv[t]) in the load
// layout: lane loads dims d = 4*lane + 128*k.
template <int R, bool kAnyAlign>
__device__ __forceinline__ void load_rows(const CompressParams& p, int64_t t, const float* arow,
                                          int lane, Rows<R>& b) {
  const float* brow = p.kv + t * p.kv_stride;
  const bool a_al = !kAnyAlign || aligned16(arow);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int d = 4 * lane + 128 * k;
    b.bkv[k] = ld4(brow + d);
    if constexpr (R == 2) {
      b.bsc[k] = ld4(brow + kLatentDim + d);
      if constexpr (kAnyAlign) {
        b.akv[k] = ld4_any(arow + d, a_al);
        b.asc[k] = ld4_any(arow + kLatentDim + d, a_al);
      } else {
        b.akv[k] = ld4(arow + d);
        b.asc[k] = ld4(arow + kLatentDim + d);
      }
    }
  }
}

// pool -> RMS (normative order) -> latent -> latent_out / record of one program on one warp.
// `pooled` is the warp's shared scratch; the warp is synchronised on entry use and on exit, so
// consecutive programs can reuse it.
// Loads float4 group k (dims 4*lane + 128*k) of token t's rows into b.
template <int R>
__device__ __forceinline__ void load_group(const CompressParams& p, int64_t t, int lane, int k,
                                           Rows<R>& b) {
  // the lane's base address once (row pointer + 4*lane), then constant offsets 128*k: lets the
  // compiler use immediate offsets instead of a 64-bit index computation per group
  const float* brow = (p.kv + t * p.kv_stride) + 4 * lane;
  b.bkv[k] = ld4(brow + 128 * k);
  if constexpr (R == 2) {
    const float* arow = brow - p.kv_stride;  // pair programs: the predecessor is row t - 1
    b.bsc[k] = ld4(brow + kLatentDim + 128 * k);
    b.akv[k] = ld4(arow + 128 * k);
    b.asc[k] = ld4(arow + kLatentDim + 128 * k);
  }
}

// pool -> RMS (normative order) -> latent -> latent_out / record of one program on one warp.
// `pooled` is the warp's shared scratch (every read of it ends before a __syncwarp, so
// consecutive programs can reuse it). Rolling prefetch: as soon as a group of `b` has been
// pooled, its registers receive the same group of the rows of token t_next (a pair or ratio-1
// program of the same chunk; -1: none), so that the next program's rows are in flight during
// the rest of this one.
template <int R, int F>
__device__ __forceinline__ void process_warp(const CompressParams& p, int64_t t, int64_t ipage,
                                             int64_t ir, int64_t trow_row, Rows<R>& b, int64_t t_next,
                                             float* pooled, int lane, const uint32_t (&wpk)[8],
                                             uint32_t wrope) {
  // padded shared-memory addresses (pooled_index) as a per-lane base + constant offsets:
  //   load layout  d = 4*lane + 128*k : 4*lane + 4*(lane/8) + 144*k
  //   RMS          d = lane + 32*i    : lane + 36*i
  //   writer       d = 16*lane + 4*c  : 16*lane + 4*(lane/2) + 4*c
  const unsigned ul = static_cast<unsigned>(lane);
  float* const pl = pooled + (4u * ul + 4u * (ul >> 3));
  const float* const pr = pooled + ul;
  const float* const pwb = pooled + (16u * ul + 4u * (ul >> 1));
  // RoPE pair `lane` (dims 448 + 2*lane, 449 + 2*lane) is rotated by this lane (every record
  // format): its table entries are loaded now (in flight during the pool), its pooled values
  // are read with the lane's other reads of the scratch
  float rc = 0.0f, rsn = 0.0f;
  if constexpr (F != kNoRecord) {
    if (ipage >= 0) {
      const float* trow = p.table + trow_row * kRopeDim;
      rc = trow[lane];
      rsn = trow[kRopeDim / 2 + lane];
    }
  }
  // 2. pool, load layout -> shared memory
  if constexpr (R == 2) {
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      const float4 a1[2] = {b.akv[k], b.akv[k + 1]}, a2[2] = {b.asc[k], b.asc[k + 1]};
      const float4 b1[2] = {b.bkv[k], b.bkv[k + 1]}, b2[2] = {b.bsc[k], b.bsc[k + 1]};
      float4 v[2];
      pool2_vec<2>(a1, a2, b1, b2, v);
      st4(pl + 144 * k, v[0]);
      st4(pl + 144 * (k + 1), v[1]);
      if (t_next >= 0) {
        load_group<R>(p, t_next, lane, k, b);
        load_group<R>(p, t_next, lane, k + 1, b);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      st4(pl + 144 * k, b.bkv[k]);
      if (t_next >= 0) load_group<R>(p, t_next, lane, k, b);
    }
  }
  __syncwarp();
  // 3. RMS: lane l sums d = l, l+32, ..., l+480 ascending, then the shuffle-down tree
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float v = pr[36 * i];
    part = num::fma_rn(v, v, part);
  }
#pragma unroll
  for (int h = 16; h >= 1; h >>= 1)
    part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, h));
  const float sum = __shfl_sync(0xFFFFFFFFu, part, 0);
  const float rs = cmath::rms_inverse(sum, p.eps);
  // 4. latent, writer layout: lane owns dims [16*lane, 16*lane + 16)
  const int d0 = 16 * lane;
  float pw[16];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float4 v = ld4(pwb + 4 * c);
    pw[4 * c] = v.x;
    pw[4 * c + 1] = v.y;
    pw[4 * c + 2] = v.z;
    pw[4 * c + 3] = v.w;
  }
  // pooled_index(448 + 2*lane) = 504 + 2*lane + 4*(lane/16) (8-byte aligned, conflict-free)
  float2 pr2 = make_float2(0.0f, 0.0f);
  if constexpr (F != kNoRecord) pr2 = *reinterpret_cast<const float2*>(pooled + (504u + 2u * ul + 4u * (ul >> 4)));
  __syncwarp();  // every read of `pooled` done: the next program may overwrite it
  // latent = bf16((pooled * rs) * w) (cmath::latent_value, element-wise)
  float f[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float wi = num::u2f(i % 2 == 0 ? (wpk[i / 2] << 16) : (wpk[i / 2] & 0xFFFF0000u));
    f[i] = num::mul_rn(num::mul_rn(pw[i], rs), wi);
  }
  uint32_t lw[8];
  bf16_encode_packed<16>(f, lw);
  float x[16];
  bf16_decode_packed<16>(lw, x);
  if (p.latent != nullptr)
    store_words<8>(reinterpret_cast<uint8_t*>(p.latent + t * kLatentDim + d0), lw);
  if constexpr (F != kNoRecord) {
    if (ipage >= 0) {  // insert into slot ipage * S + ir
      // the latent of the lane's RoPE pair, element-wise as the owning lane (28 + lane/8)
      // computed it above (same pooled values, rs and weights)
      const float fr[2] = {num::mul_rn(num::mul_rn(pr2.x, rs), num::u2f(wrope << 16)),
                           num::mul_rn(num::mul_rn(pr2.y, rs), num::u2f(wrope & 0xFFFF0000u))};
      uint32_t lr[1];
      bf16_encode_packed<2>(fr, lr);
      const float xr0 = num::u2f(lr[0] << 16), xr1 = num::u2f(lr[0] & 0xFFFF0000u);
      if constexpr (F == kV4) {
        write_v4_warp(p.cache, ipage, ir, lane, x, xr0, xr1, rc, rsn);
      } else {
        // y = x after RoPE: every lane rotates its pair, lanes 28-31 (dims 448 + 16*(lane-28)
        // + [0, 16) = pairs 8*(lane-28) + [0, 8)) collect theirs with shuffles
        float q0, q1;
        num::rope_forward(xr0, xr1, rc, rsn, q0, q1);
        const int src0 = 8 * (lane & 3);
        const bool rl = lane >= kNopeDim / 16;
        float y[16];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float a = __shfl_sync(0xFFFFFFFFu, q0, src0 + i);
          const float b = __shfl_sync(0xFFFFFFFFu, q1, src0 + i);
          y[2 * i] = rl ? a : x[2 * i];
          y[2 * i + 1] = rl ? b : x[2 * i + 1];
        }
        write_record_at<F, 16>(p.cache, ipage, ir, lane, x, y);
      }
    }
  }
}

// Role of program `prog` (not a ratio-2 request program) as seen by one lane: the token t
// (-1: nothing to do), its insert slot (-1: no insert) and RoPE row.
template <int R, int F>
__device__ __forceinline__ void resolve_role(const CompressParams& p, int64_t prog, int64_t& t_out,
                                             int64_t& islot_out, int64_t& row_out) {
  t_out = -1;
  islot_out = -1;
  row_out = 0;
  int64_t t, pos_t, islot = -1;
  if constexpr (R == 1) {
    t = prog;
    const int64_t sl = p.slot[t];
    pos_t = p.pos[t];
    if constexpr (F != kNoRecord) islot = p.ins_slot[t];
    if (sl < 0) return;
  } else {
    const int64_t t0 = 2 * (prog - p.num_reqs);
    const int64_t p0 = p.pos[t0];  // t0 < N (chunks stop at the last program)
    if (p0 < 0) return;
    t = t0 + ((p0 + 1) & 1);
    if (t >= p.N || t < 1) return;
    const int64_t sl = p.slot[t];
    const int32_t req = p.t2r[t];
    const int64_t pt = p.pos[t];
    if constexpr (F != kNoRecord) islot = p.ins_slot[t];
    if (sl < 0 || sl >= p.ring_slots) return;
    if (req < 0 || req >= p.num_reqs) return;
    if (t == p.qsl[req]) return;
    pos_t = t == t0 ? p0 : pt;
  }
  t_out = t;
  insert_decision<R, F>(p, islot, pos_t, islot_out, row_out);
}

__device__ __forceinline__ int64_t shfl64(int64_t v, int src) {
  return static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(v), src));
}

template <int R, int F>
__device__ __forceinline__ void request_program_warp(const CompressParams& p, int64_t prog,
                                                     float* pooled, int lane,
                                                     const uint32_t (&wb)[8], uint32_t wrope);

template <int R, int F, int C>
__global__ void __launch_bounds__(128, R == 2 ? 3 : 4)
    compress_stream_kernel(const CompressParams p) {
  static_assert(C <= 32);
  __shared__ __align__(16) float smem[4][kPooledFloats];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + warp;
  float* pooled = smem[warp];

  uint32_t wb[8];  // the lane's 16 bf16 norm weights, packed (even dim in the low half)
  {
    const uint4 u0 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane);
    const uint4 u1 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane + 8);
    wb[0] = u0.x; wb[1] = u0.y; wb[2] = u0.z; wb[3] = u0.w;
    wb[4] = u1.x; wb[5] = u1.y; wb[6] = u1.z; wb[7] = u1.w;
  }
  // the packed bf16 norm weights of the lane's RoPE pair (dims 448 + 2*lane, +1)
  uint32_t wrope = 0;
  if constexpr (F != kNoRecord)
    wrope = *reinterpret_cast<const uint32_t*>(p.norm_w + kNopeDim + 2 * lane);

  int64_t first;       // first program of the chunk
  int64_t n;           // programs in the chunk
  if constexpr (R == 2) {
    if (w < p.num_reqs) {
      request_program_warp<R, F>(p, w, pooled, lane, wb, wrope);
      return;
    }
    const int64_t pairs = (p.N + 1) / 2;
    const int64_t k0 = (w - p.num_reqs) * C;
    if (k0 >= pairs) return;
    first = p.num_reqs + k0;
    n = pairs - k0 < C ? pairs - k0 : C;
  } else {
    const int64_t k0 = w * C;
    if (k0 >= p.N) return;
    first = k0;
    n = p.N - k0 < C ? p.N - k0 : C;
  }

  // metadata of the whole chunk, one program per lane
  int64_t role_t = -1, role_slot = -1, role_row = 0;
  if (lane < n) resolve_role<R, F>(p, first + lane, role_t, role_slot, role_row);
  // the insert slot as (page, row in page), also resolved in parallel over the lanes
  int64_t role_page = -1, role_r = 0;
  if (role_slot >= 0) divmod(role_slot, p.cache.S, role_page, role_r);

  Rows<R> A;
  const int nn = static_cast<int>(n);
  int64_t t = shfl64(role_t, 0);
  if (t >= 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) load_group<R>(p, t, lane, k, A);
  }
  for (int i = 0; i < nn; ++i) {
    const int64_t tn = shfl64(role_t, i + 1 < nn ? i + 1 : 0);
    const int64_t t_next = i + 1 < nn ? tn : -1;
    const int64_t pg = shfl64(role_page, i), row = shfl64(role_row, i);
    const int64_t ir = shfl64(role_r, i);
    if (t >= 0) {
      process_warp<R, F>(p, t, pg, ir, row, A, t_next, pooled, lane, wb, wrope);
    } else if (t_next >= 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) load_group<R>(p, t_next, lane, k, A);
    }
    t = t_next;
  }
}

// A ratio-2 request program on one warp (SPEC 4.4 request program + 4.5 tail store).
template <int R, int F>
__device__ __forceinline__ void request_program_warp(const CompressParams& p, int64_t prog,
                                                     float* pooled, int lane,
                                                     const uint32_t (&wb)[8], uint32_t wrope) {
  const int64_t s = p.qsl[prog];
  const int64_t e = p.qsl[prog + 1];
  if (s < 0 || s >= e || e > p.N) return;
  const int64_t sl = p.slot[s];
  const int64_t ps = p.pos[s];
  int64_t islot = -1;
  if constexpr (F != kNoRecord) islot = p.ins_slot[s];
  int64_t g = -1;
  if (p.pcp && p.prev != nullptr && prog < p.prev_n) g = p.prev_idx[prog];
  if (sl < 0 || sl >= p.ring_slots) return;
  const bool tail = !p.pcp;
  int64_t t = -1;
  const float* arow = nullptr;
  if (ps >= 0 && (ps & 1)) {
    t = s;
    if (g >= 0 && g < p.prev_count) arow = p.prev + g * p.prev_stride;
    if (arow == nullptr) {
      int64_t blk, rem, quo, row_pred;
      divmod(sl, p.cap, blk, rem);
      divmod(ps - 1, p.cap, quo, row_pred);
      arow = p.ring + blk * p.ring_bs + row_pred * p.ring_rs;
    }
  }
  if (t >= 0) {
    Rows<R> A;
    load_rows<R, true>(p, t, arow, lane, A);
    int64_t slot_ins, row, ipage = -1, ir = 0;
    insert_decision<R, F>(p, islot, ps, slot_ins, row);
    if (slot_ins >= 0) divmod(slot_ins, p.cache.S, ipage, ir);
    process_warp<R, F>(p, t, ipage, ir, row, A, -1, pooled, lane, wb, wrope);
  }
  if (tail) {
    // Every ring read of this program (the predecessor row) was consumed by the pool above,
    // before the warp barrier in process_warp; rows are copied in ascending token order.
    const int64_t n = (e - s) < p.cap ? (e - s) : p.cap;
    for (int64_t kk = 0; kk < n; ++kk) {
      const int64_t tt = e - n + kk;
      const int64_t st = p.slot[tt];
      if (st < 0 || st >= p.ring_slots) continue;
      int64_t blk, row;
      divmod(st, p.cap, blk, row);
      float* dst = p.ring + blk * p.ring_bs + row * p.ring_rs;
      const bool d_al = aligned16(dst);
      const float* src = p.kv + tt * p.kv_stride;
      float4 v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = ld4(src + 4 * lane + 128 * k);
#pragma unroll
      for (int k = 0; k < 8; ++k) st4_any(dst + 4 * lane + 128 * k, v[k], d_al);
    }
  }
}

// ==================================================================== four-warp kernel (decode)
//
// compress_kernel_g4<R, F>: one 128-thread block per program (small grids such as decode: the
// 512 dims of a token spread over 128 threads). Loads are issued as early as their addresses
// are known and checked afterwards, so that a request program waits for three dependent round
// trips (qsl -> slot/pos + current row -> ring row + RoPE row) before computing.
//  1. load layout: thread gt loads dims 4*gt of a.kv, a.score, b.kv, b.score;
//  2. pooled = pool2(a, b) (ratio 1: b.kv) -> shared memory (padded index d + 4*(d/32));
//  3. warp 0 lane l: part = fma over d = l, l+32, ..., l+480 ascending (the normative order),
//     then the shuffle-down tree h = 16..1, rs = 1/sqrt(sum/512 + eps), broadcast;
//  4. writer layout == load layout (thread gt owns dims [4*gt, 4*gt+4)): latent, latent_out,
//     RoPE, cooperative record write; request programs then run the tail store.
template <int R, int F>
__global__ void __launch_bounds__(128) compress_kernel_g4(const CompressParams p) {
  __shared__ __align__(16) float pooled[kPooledFloats];
  __shared__ float smem_rs;
  const int gt = static_cast<int>(threadIdx.x);
  const int64_t prog = blockIdx.x;
  const int d0 = 4 * gt;

  uint16_t wb[4];
  {
    float wv[4];
    load_bf16<4>(p.norm_w + d0, wv, wb);
    (void)wv;
  }

  int64_t t = -1, pos_t = 0, islot = -1;
  int64_t s = 0, e = 0, sl_s = -1;  // request programs: chunk [s, e), slot of row s
  bool tail = false;
  float4 bkv, bsc, akv, asc;
  if constexpr (R == 1) {
    if (prog >= p.N) return;
    bkv = ld4(p.kv + prog * p.kv_stride + d0);
    const int64_t sl = p.slot[prog];
    pos_t = p.pos[prog];
    if constexpr (F != kNoRecord) islot = p.ins_slot[prog];
    if (sl < 0) return;
    t = prog;
  } else {
    if (prog < p.num_reqs) {
      s = p.qsl[prog];
      e = p.qsl[prog + 1];
      if (s < 0 || s >= e || e > p.N) return;
      const float* brow = p.kv + s * p.kv_stride;
      bkv = ld4(brow + d0);
      bsc = ld4(brow + kLatentDim + d0);
      sl_s = p.slot[s];
      const int64_t ps = p.pos[s];
      if constexpr (F != kNoRecord) islot = p.ins_slot[s];
      int64_t g = -1;
      if (p.pcp && p.prev != nullptr && prog < p.prev_n) g = p.prev_idx[prog];
      if (sl_s < 0 || sl_s >= p.ring_slots) return;
      tail = !p.pcp;
      if (ps >= 0 && (ps & 1)) {
        t = s;
        pos_t = ps;
        const float* arow = nullptr;
        if (g >= 0 && g < p.prev_count) arow = p.prev + g * p.prev_stride;
        if (arow == nullptr) {
          int64_t blk, rem, quo, row_pred;
          divmod(sl_s, p.cap, blk, rem);
          divmod(ps - 1, p.cap, quo, row_pred);
          arow = p.ring + blk * p.ring_bs + row_pred * p.ring_rs;
        }
        const bool a_al = aligned16(arow);
        akv = ld4_any(arow + d0, a_al);
        asc = ld4_any(arow + kLatentDim + d0, a_al);
      }
      if (t < 0 && !tail) return;
    } else {
      const int64_t t0 = 2 * (prog - p.num_reqs);
      if (t0 >= p.N) return;
      const int64_t p0 = p.pos[t0];
      if (p0 < 0) return;
      const int64_t tt = t0 + ((p0 + 1) & 1);
      if (tt >= p.N || tt < 1) return;
      const float* brow = p.kv + tt * p.kv_stride;
      bkv = ld4(brow + d0);
      bsc = ld4(brow + kLatentDim + d0);
      akv = ld4(brow - p.kv_stride + d0);
      asc = ld4(brow - p.kv_stride + kLatentDim + d0);
      const int64_t sl = p.slot[tt];
      const int32_t req = p.t2r[tt];
      const int64_t pt = p.pos[tt];
      if constexpr (F != kNoRecord) islot = p.ins_slot[tt];
      if (sl < 0 || sl >= p.ring_slots) return;
      if (req < 0 || req >= p.num_reqs || tt == p.qsl[req]) return;
      t = tt;
      pos_t = tt == t0 ? p0 : pt;
    }
  }

  if (t >= 0) {
    // RoPE row of the insert, loaded before the compute
    int64_t slot_ins = -1, row = 0;
    insert_decision<R, F>(p, islot, pos_t, slot_ins, row);
    float rc[2], rsn[2];
    if constexpr (F != kNoRecord) {
      if (slot_ins >= 0) rope_load<4>(d0, p.table + row * kRopeDim, rc, rsn);
    }
    // 2. pool
    float pv[4];
    if constexpr (R == 2) {
      const float4 a1[1] = {akv}, a2[1] = {asc}, b1[1] = {bkv}, b2[1] = {bsc};
      float4 o[1];
      pool2_vec<1>(a1, a2, b1, b2, o);
      pv[0] = o[0].x;
      pv[1] = o[0].y;
      pv[2] = o[0].z;
      pv[3] = o[0].w;
    } else {
      pv[0] = bkv.x;
      pv[1] = bkv.y;
      pv[2] = bkv.z;
      pv[3] = bkv.w;
    }
    st4(pooled + pooled_index(d0), make_float4(pv[0], pv[1], pv[2], pv[3]));
    __syncthreads();
    // 3. RMS (normative order) on warp 0
    if (gt < 32) {
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float v = pooled[pooled_index(gt + 32 * i)];
        part = num::fma_rn(v, v, part);
      }
#pragma unroll
      for (int h = 16; h >= 1; h >>= 1)
        part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, h));
      if (gt == 0) smem_rs = cmath::rms_inverse(part, p.eps);
    }
    __syncthreads();
    const float rs = smem_rs;
    // 4. latent (writer layout == load layout)
    // latent = bf16((pooled * rs) * w) (cmath::latent_value, element-wise)
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f[i] = num::mul_rn(num::mul_rn(pv[i], rs), num::bf16_decode(wb[i]));
    uint32_t lw[2];
    bf16_encode_packed<4>(f, lw);
    float x[4];
    bf16_decode_packed<4>(lw, x);
    if (p.latent != nullptr)
      store_words<2>(reinterpret_cast<uint8_t*>(p.latent + t * kLatentDim + d0), lw);
    if constexpr (F != kNoRecord) {
      if (slot_ins >= 0) {
        float y[4];
        rope_apply<4>(d0, rc, rsn, x, y);
        write_record<F, 4>(p.cache, slot_ins, gt, x, y);
      }
    }
  }

  // tail store (SPEC 4.5)
  if constexpr (R == 2) {
    if (tail) {
      // Every ring read of this program (the predecessor row) was consumed by the pool before
      // the block barriers above; rows are copied in ascending token order. Row s was loaded
      // into registers (bkv, bsc) and its slot into sl_s.
      const int64_t n = (e - s) < p.cap ? (e - s) : p.cap;
      for (int64_t kk = 0; kk < n; ++kk) {
        const int64_t tt = e - n + kk;
        const int64_t st = tt == s ? sl_s : p.slot[tt];
        if (st < 0 || st >= p.ring_slots) continue;
        int64_t blk, row;
        divmod(st, p.cap, blk, row);
        float* dst = p.ring + blk * p.ring_bs + row * p.ring_rs;
        const bool d_al = aligned16(dst);
        if (tt == s) {
          st4_any(dst + d0, bkv, d_al);
          st4_any(dst + kLatentDim + d0, bsc, d_al);
        } else {
          const float* src = p.kv + tt * p.kv_stride;
          const float4 v0 = ld4(src + d0), v1 = ld4(src + kLatentDim + d0);
          st4_any(dst + d0, v0, d_al);
          st4_any(dst + kLatentDim + d0, v1, d_al);
        }
      }
    }
  }
}

// Programs per warp of the streaming kernel.
template <int R>
inline constexpr int kChunk = R == 2 ? 16 : 32;

template <int R, int F>
void launch_compress_stream(const CompressParams& p, cudaStream_t stream) {
  constexpr int C = kChunk<R>;
  const int64_t chunks = R == 2 ? ((p.N + 1) / 2 + C - 1) / C : (p.N + C - 1) / C;
  const int64_t warps = (R == 2 ? p.num_reqs : 0) + chunks;
  if (warps <= 0) return;
  const int64_t blocks = (warps + 3) / 4;
  compress_stream_kernel<R, F, C><<<static_cast<unsigned>(blocks), 128, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("compress_stream_kernel");
}

template <int R, int F>
void launch_compress_g4(const CompressParams& p, cudaStream_t stream) {
  const int64_t programs = compress_programs(R, p.N, p.num_reqs);
  if (programs <= 0) return;
  compress_kernel_g4<R, F><<<static_cast<unsigned>(programs), 128, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("compress_kernel_g4");
}

template <int F>
void launch_compress(const CompressParams& p, int ratio, cudaStream_t stream) {
  const int force = program_warps_override();
  const bool small = force == 4 || (force != 1 && compress_programs(ratio, p.N, p.num_reqs) <= kSmallGridPrograms);
  if (ratio == 1) {
    if (small) launch_compress_g4<1, F>(p, stream);
    else launch_compress_stream<1, F>(p, stream);
  } else {
    if (small) launch_compress_g4<2, F>(p, stream);
    else launch_compress_stream<2, F>(p, stream);
  }
}

}  // namespace dsv41kv::detail::cuda
