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

template <int R, int G, int F>
__global__ void __launch_bounds__(G == 1 ? 256 : 128)
    compress_kernel(const CompressParams p) {
  constexpr int E = 16 / G;        // dims per thread in the writer layout
  constexpr int K = 4 / G;         // float4 loads per thread per half-row
  constexpr int kPerBlock = G == 1 ? 8 : 1;
  constexpr int kThreads = 32 * G; // threads per program
  __shared__ __align__(16) float smem[kPerBlock][kPooledFloats];
  __shared__ float smem_rs;        // G = 4: rs broadcast

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int local = G == 1 ? warp : 0;
  const int gt = G == 1 ? lane : static_cast<int>(threadIdx.x);
  const int64_t prog = static_cast<int64_t>(blockIdx.x) * kPerBlock + local;
  float* pooled = smem[local];

  // ---------------------------------------------------------------- program role
  int64_t t = -1;                 // token whose latent this program computes
  int64_t pos_t = 0;
  const float* arow = nullptr;    // predecessor [kv | score] row (ratio 2)
  bool tail = false;              // request program with a tail store
  int64_t s = 0, e = 0;
  if constexpr (R == 1) {
    if (prog >= p.N) return;
    if (p.slot[prog] < 0) return;
    t = prog;
    pos_t = p.pos[t];
  } else {
    if (prog < p.num_reqs) {
      s = p.qsl[prog];
      e = p.qsl[prog + 1];
      if (s < 0 || s >= e || e > p.N) return;
      const int64_t sl = p.slot[s];
      if (sl < 0 || sl >= p.ring_slots) return;
      const int64_t ps = p.pos[s];
      tail = !p.pcp;
      if (ps >= 0 && (ps & 1)) {
        t = s;
        pos_t = ps;
        if (p.pcp && p.prev != nullptr && prog < p.prev_n) {
          const int64_t g = p.prev_idx[prog];
          if (g >= 0 && g < p.prev_count) arow = p.prev + g * p.prev_stride;
        }
        if (arow == nullptr) {
          int64_t blk, rem, quo, row_pred;
          divmod(sl, p.cap, blk, rem);
          divmod(ps - 1, p.cap, quo, row_pred);
          arow = p.ring + blk * p.ring_bs + row_pred * p.ring_rs;
        }
      }
      if (t < 0 && !tail) return;
    } else {
      const int64_t t0 = 2 * (prog - p.num_reqs);
      if (t0 >= p.N) return;
      const int64_t p0 = p.pos[t0];
      if (p0 < 0) return;
      const int64_t tt = t0 + ((p0 + 1) & 1);
      if (tt >= p.N || tt < 1) return;
      const int64_t sl = p.slot[tt];
      if (sl < 0 || sl >= p.ring_slots) return;
      const int32_t req = p.t2r[tt];
      if (req < 0 || req >= p.num_reqs || tt == p.qsl[req]) return;
      t = tt;
      pos_t = tt == t0 ? p0 : p.pos[tt];
      arow = p.kv + (tt - 1) * p.kv_stride;
    }
  }

  // registers of the current row kept for a tail store of row s from registers (G = 4)
  float4 bkv[K], bsc[K];

  if (t >= 0) {
    const float* brow = p.kv + t * p.kv_stride;
    // ---------------------------------------------------------------- 1. loads
    float4 akv[K], asc[K];
    const bool a_al = R == 2 && aligned16(arow);  // ring rows may be unaligned
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int d = 4 * gt + 128 * G * k;
      bkv[k] = ld4(brow + d);
      if constexpr (R == 2) {
        bsc[k] = ld4(brow + kLatentDim + d);
        akv[k] = ld4_any(arow + d, a_al);
        asc[k] = ld4_any(arow + kLatentDim + d, a_al);
      }
    }
    // insert decision and its table row, loaded early (off the critical path)
    bool do_insert = false;
    int64_t islot = -1;
    const float* trow = nullptr;
    if constexpr (F != kNoRecord) {
      islot = p.ins_slot[t];
      const int64_t row = (pos_t / R) * R;
      do_insert = islot >= 0 && islot < p.cache.capacity && pos_t >= 0 &&
                  ((pos_t + 1) % R) == 0 && row < p.table_rows;
      trow = p.table + row * kRopeDim;
    }
    const int d0 = E * gt;
    float wv[E];  // unused: latent_value takes the bf16 bits
    uint16_t wb[E];
    load_bf16<E>(p.norm_w + d0, wv, wb);

    // ---------------------------------------------------------------- 2. pool
    float pv[K][4];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if constexpr (R == 2) {
        pv[k][0] = pool2_fast(akv[k].x, asc[k].x, bkv[k].x, bsc[k].x);
        pv[k][1] = pool2_fast(akv[k].y, asc[k].y, bkv[k].y, bsc[k].y);
        pv[k][2] = pool2_fast(akv[k].z, asc[k].z, bkv[k].z, bsc[k].z);
        pv[k][3] = pool2_fast(akv[k].w, asc[k].w, bkv[k].w, bsc[k].w);
      } else {
        pv[k][0] = bkv[k].x;
        pv[k][1] = bkv[k].y;
        pv[k][2] = bkv[k].z;
        pv[k][3] = bkv[k].w;
      }
      const int d = 4 * gt + 128 * G * k;
      st4(pooled + pooled_index(d), make_float4(pv[k][0], pv[k][1], pv[k][2], pv[k][3]));
    }
    if constexpr (G == 1) __syncwarp();
    else __syncthreads();

    // ---------------------------------------------------------------- 3. RMS (normative order)
    float rs = 0.0f;
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
      const float sum = __shfl_sync(0xFFFFFFFFu, part, 0);
      rs = cmath::rms_inverse(sum, p.eps);
      if constexpr (G != 1) {
        if (gt == 0) smem_rs = rs;
      }
    }
    if constexpr (G != 1) {
      __syncthreads();
      rs = smem_rs;
    }

    // ---------------------------------------------------------------- 4. latent (writer layout)
    float pw[E];
    if constexpr (G == 1) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float4 v = ld4(pooled + pooled_index(d0 + 4 * c));
        pw[4 * c] = v.x;
        pw[4 * c + 1] = v.y;
        pw[4 * c + 2] = v.z;
        pw[4 * c + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) pw[i] = pv[0][i];  // writer layout == load layout
    }
    uint16_t lat[E];
    float x[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      lat[i] = cmath::latent_value(pw[i], rs, wb[i]);
      x[i] = num::bf16_decode(lat[i]);
    }
    if (p.latent != nullptr) {
      uint32_t w[E / 2];
      pack_bf16<E>(lat, w);
      store_words<E / 2>(reinterpret_cast<uint8_t*>(p.latent + t * kLatentDim + d0), w);
    }
    if constexpr (F != kNoRecord) {
      if (do_insert) {
        float y[E];
        rope_thread<E>(d0, trow, x, y);
        write_record<F, E>(p.cache, islot, gt, x, y);
      }
    }
    (void)wv;
  }

  // ---------------------------------------------------------------- tail store (SPEC 4.5)
  if constexpr (R == 2) {
    if (tail) {
      // Every ring read of this program happened above, before the group barrier; rows are
      // copied in ascending token order.
      const int64_t n = (e - s) < p.cap ? (e - s) : p.cap;
      for (int64_t kk = 0; kk < n; ++kk) {
        const int64_t tt = e - n + kk;
        const int64_t sl = p.slot[tt];
        if (sl < 0 || sl >= p.ring_slots) continue;
        int64_t blk, row;
        divmod(sl, p.cap, blk, row);
        float* dst = p.ring + blk * p.ring_bs + row * p.ring_rs;
        const bool d_al = aligned16(dst);
        if (G != 1 && tt == s && t == s) {
#pragma unroll
          for (int k = 0; k < K; ++k) {
            const int d = 4 * gt + 128 * G * k;
            st4_any(dst + d, bkv[k], d_al);
            st4_any(dst + kLatentDim + d, bsc[k], d_al);
          }
        } else {
          const float* src = p.kv + tt * p.kv_stride;
#pragma unroll
          for (int i = 4 * gt; i < kRingRowFloats; i += 4 * kThreads)
            st4_any(dst + i, ld4(src + i), d_al);
        }
      }
    }
  }
}

template <int R, int G, int F>
void launch_compress_rg(const CompressParams& p, cudaStream_t stream) {
  constexpr int kPerBlock = G == 1 ? 8 : 1;
  const int64_t programs = compress_programs(R, p.N, p.num_reqs);
  if (programs <= 0) return;
  const int64_t blocks = (programs + kPerBlock - 1) / kPerBlock;
  compress_kernel<R, G, F><<<static_cast<unsigned>(blocks), 32 * G * kPerBlock, 0, stream>>>(p);
  DSV41KV_CUDA_CHECK_LAUNCH("compress_kernel");
}

template <int F>
void launch_compress(const CompressParams& p, int ratio, cudaStream_t stream) {
  const int force = program_warps_override();
  const bool small = force == 4 || (force != 1 && compress_programs(ratio, p.N, p.num_reqs) <= kSmallGridPrograms);
  if (ratio == 1) {
    if (small) launch_compress_rg<1, 4, F>(p, stream);
    else launch_compress_rg<1, 1, F>(p, stream);
  } else {
    if (small) launch_compress_rg<2, 4, F>(p, stream);
    else launch_compress_rg<2, 1, F>(p, stream);
  }
}

}  // namespace dsv41kv::detail::cuda
