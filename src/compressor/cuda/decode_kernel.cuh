// The four-warp kernel of the fused compress (+ insert) (decode-sized grids).
#pragma once

#include "formats/cuda/compress_math.cuh"
#include "compressor/cuda/program.cuh"
#include "core/cuda/cuda_util.hpp"
#include "core/cuda/memory.cuh"
#include "formats/cuda/record_writers.cuh"

namespace dsv41kv::detail::cuda {

// ==================================================================== four-warp kernel (decode)
//
// compress_kernel_g4<R, F, kPcp>: one 128-thread block per program, for small grids such as decode:
// thread gt owns dims [4*gt, 4*gt + 4) for the loads, the pool and the writer. A decode layer is
// a chain of dependent round trips to memory, so the kernel is organised around latency:
//  - at most two dependent rounds of loads before the compute:
//      request program j: qsl[j], qsl[j+1] together with the metadata of token j
//        (speculation: in a decode-first batch qsl[j] == j; otherwise the metadata is loaded
//        again for qsl[j], one round more), then the kv row of s with its ring / prev_rows
//        predecessor and the RoPE row (the row used to come with the metadata, where phase
//        stamps showed it lengthening the first round: moving it to the second round made
//        ratio-2 decode faster with per-layer buffers and changed nothing with shared ones;
//        docs/changelog.md, v23);
//      pair program k: pos, slot, t2r (, ins_slot) of both candidate tokens 2k and 2k+1, then
//        qsl[req], the two kv rows and the RoPE row;
//      ratio-1 program t: the kv row, slot, pos (, ins_slot), then the RoPE row (in flight
//        during the RMS);
//  - one block barrier: pooled values -> shared memory (padded index d + 4*(d/32)), then every
//    warp runs the normative RMS reduction itself (lane l: fma over d = l, l+32, ..., l+480
//    ascending, then the shuffle-down tree h = 16..1; the same operations in the same order in
//    each warp, so the same rs everywhere, without a second barrier to broadcast it);
//  - ring block/row and cache page/row from host-prepared multiply-shift divisions;
//  - PDL: pdl_wait before the first memory access (with pdl_early_metadata: after the
//    metadata reads, before kv rows, ring, table and outputs), then the next kernel may be
//    scheduled.
// Request programs run the tail store (SPEC 4.5) right after their pool (or at the end when
// they compute nothing): every thread writes only the ring dims it read from the predecessor
// row, after the pool consumed them, so the ring reads of a program complete before its ring
// writes, and the stores drain while the RMS and the writer compute.

// Token t's row (dims d0..d0+3 of the kv half and, ratio 2, of the score half) and metadata.
template <int R, int F>
struct G4Token {
  float4 kv, sc;
  int64_t slot, pos, islot;
  __device__ __forceinline__ void load(const CompressParams& p, int64_t t, int d0) {
    load_meta(p, t);
    load_row(p, t, d0);
  }
  __device__ __forceinline__ void load_meta(const CompressParams& p, int64_t t) {
    slot = ld_early(p.slot + t);
    pos = ld_early(p.pos + t);
    islot = -1;
    if constexpr (F != kNoRecord) islot = ld_early(p.ins_slot + t);
  }
  __device__ __forceinline__ void load_row(const CompressParams& p, int64_t t, int d0) {
    pdl_wait();  // (returns at once when already waited / no dependency) before the kv row
    const float* row = p.kv + t * p.kv_stride;
    kv = ld4_early(row + d0);
    if constexpr (R == 2) sc = ld4_early(row + kLatentDim + d0);
  }
};

// kPcp (ratio 2 only) = p.pcp: the PCP launches (prev_rows lookups, no tail store) are their own
// instantiation, so that the others never read the PCP fields: every parameter line a decode
// kernel touches costs time per launch (one more line at the start measurably slowed ratio-1
// decode, this one less measurably sped up ratio 2: docs/changelog.md, v21 and "Measurements
// that explain the limits", Parameter lines), and the PCP test compiled into LDCs of line 0x300
// at every request program.
template <int R, int F, bool kPcp = false>
__global__ void __launch_bounds__(128) compress_kernel_g4(const CompressParams p) {
  __shared__ __align__(16) float pooled[kPooledFloats];
  // PDL: wait for the previous kernel before the first access, or (pdl_early_metadata: the
  // caller promised that kernel writes no metadata) after this program's metadata reads
  if (!p.early_meta) pdl_wait();
  const int gt = static_cast<int>(threadIdx.x);
  const int lane = gt % 32;
  const int64_t prog = blockIdx.x;
  const int d0 = 4 * gt;
  // the thread's 4 bf16 norm weights, in flight with the first round of loads
  const uint2 wpk = ld2u_early(p.norm_w + d0);

  int64_t t = -1, pos_t = 0, islot = -1;
  int s = 0, e = 0;  // request programs: chunk [s, e) (qsl entries are int32)
  int64_t sl_s = -1;  // slot of row s
  float* ring_s = nullptr;  // its ring row (tail store)
  bool tail = false;
  float4 bkv, bsc = make_float4(0, 0, 0, 0), akv = bsc, asc = bsc;
  if constexpr (R == 1) {
    if (prog >= p.N) return;
    G4Token<R, F> tk;
    tk.load(p, prog, d0);
    if (tk.slot < 0) return;
    bkv = tk.kv;
    pos_t = tk.pos;
    islot = tk.islot;
    t = prog;
  } else if (prog < p.num_reqs) {
    const int64_t jt = prog < p.N ? prog : p.N - 1;  // speculated first token (in bounds)
    s = ld_early(p.qsl + prog);
    e = ld_early(p.qsl + prog + 1);
    G4Token<R, F> tk;
    tk.load_meta(p, jt);
    int64_t g = -1;
    if constexpr (kPcp) {
      // prev_row_indices may come from the kernel just before (the PCP link): read after the
      // grid dependency, as the kv row used to be (pdl_early_metadata covers only the metadata)
      pdl_wait();
      if (p.prev != nullptr && prog < p.prev_n) g = ld_early(p.prev_idx + prog);
    }
    if (s < 0 || s >= e || e > p.N) return;
    if (s != jt) tk.load_meta(p, s);  // not decode-ordered: one more round
    sl_s = tk.slot;
    islot = tk.islot;
    const int64_t ps = tk.pos;
    if (sl_s < 0 || sl_s >= p.ring_slots) return;
    tail = !kPcp;
    pdl_wait();  // (pdl_early_metadata) before the ring, prev_rows and the kv row
    if (ps >= 0 && (ps & 1)) {
      t = s;
      pos_t = ps;
      const float* arow = request_predecessor_row(p, g, sl_s, ps);
      const bool a_al = aligned16(arow);
      akv = ld4_any(arow + d0, a_al);
      asc = ld4_any(arow + kLatentDim + d0, a_al);
    }
    if (t < 0 && !tail) return;
    // row s itself, in flight with its predecessor row: the first round carries only metadata
    tk.load_row(p, s, d0);
    bkv = tk.kv;
    bsc = tk.sc;
    if (tail) {
      // row s's ring row, resolved here while the predecessor row is in flight: the tail store
      // runs between the pool and the block barrier, on the program's critical path
      ring_s = ring_row(p, sl_s);
    }
  } else {
    const int64_t t0 = 2 * (prog - p.num_reqs);
    if (t0 >= p.N) return;
    const int64_t t1 = t0 + 1 < p.N ? t0 + 1 : t0;  // in bounds
    const int64_t p0 = ld_early(p.pos + t0), p1 = ld_early(p.pos + t1);
    const int64_t sl0 = ld_early(p.slot + t0), sl1 = ld_early(p.slot + t1);
    const int32_t rq0 = ld_early(p.t2r + t0), rq1 = ld_early(p.t2r + t1);
    int64_t is0 = -1, is1 = -1;
    if constexpr (F != kNoRecord) {
      is0 = ld_early(p.ins_slot + t0);
      is1 = ld_early(p.ins_slot + t1);
    }
    if (p0 < 0) return;
    const int64_t tt = t0 + ((p0 + 1) & 1);
    if (tt >= p.N || tt < 1) return;
    const bool second = tt != t0;  // then t1 == tt
    const int64_t sl = second ? sl1 : sl0;
    const int32_t req = second ? rq1 : rq0;
    if (sl < 0 || sl >= p.ring_slots) return;
    if (req < 0 || req >= p.num_reqs) return;
    pdl_wait();  // before the kv rows
    const float* brow = p.kv + tt * p.kv_stride;
    bkv = ld4_early(brow + d0);
    bsc = ld4_early(brow + kLatentDim + d0);
    akv = ld4_early(brow - p.kv_stride + d0);
    asc = ld4_early(brow - p.kv_stride + kLatentDim + d0);
    if (tt == ld_early(p.qsl + req)) return;
    t = tt;
    pos_t = second ? p1 : p0;
    islot = second ? is1 : is0;
  }

  // tail store (SPEC 4.5) of a request program: rows [e - n, e) into the ring, ascending token
  // order; row s is still in registers (bkv, bsc) and its ring row in ring_s. Each thread writes only
  // the dims it read from the predecessor row, after the pool consumed them, so it can run
  // right after the pool: the stores drain while the RMS and the writer compute.
  auto tail_store = [&]() {
    if constexpr (R == 2) {
      if (!tail) return;
      if (e - s == 1) {  // one token (decode): row s only, to the ring row resolved earlier
        const bool d_al = aligned16(ring_s);
        st4_any(ring_s + d0, bkv, d_al);
        st4_any(ring_s + kLatentDim + d0, bsc, d_al);
        return;
      }
      const int n = static_cast<int64_t>(e - s) < p.cap_div.d ? e - s : static_cast<int>(p.cap_div.d);
      for (int tt = e - n; tt < e; ++tt) {
        float* dst = ring_s;
        if (tt != s) {
          const int64_t st = p.slot[tt];
          if (st < 0 || st >= p.ring_slots) continue;
          dst = ring_row(p, st);
        }
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
  };

  pdl_wait();  // every path has waited before the ring, the table and the outputs
  pdl_allow_dependents();
  if (t >= 0) {
    // insert slot as (page, row) and the RoPE row, loaded before the compute
    int64_t slot_ins = -1, row = 0, ipage = -1, ir = 0;
    insert_decision<R, F>(p, islot, pos_t, slot_ins, row);
    float rc[2], rsn[2];
    if constexpr (F != kNoRecord) {
      if (slot_ins >= 0) {
        rope_load<4>(d0, p.table + row * kRopeDim, rc, rsn);
        divmod_fast(slot_ins, p.cache.S_div, ipage, ir);
      }
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
    tail_store();
    __syncthreads();
    // 3. RMS (normative order), in every warp; pooled_index(lane + 32*i) = lane + 36*i
    float part = 0.0f;
    const float* const pr = pooled + lane;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float v = pr[36 * i];
      part = num::fma_rn(v, v, part);
    }
    const float rs = cmath::rms_inverse(warp_reduce32(part), p.eps);
    // 4. latent (writer layout == load layout)
    // latent = bf16((pooled * rs) * w) (cmath::latent_value, element-wise)
    const float wf[4] = {num::u2f(wpk.x << 16), num::u2f(wpk.x & 0xFFFF0000u), num::u2f(wpk.y << 16),
                         num::u2f(wpk.y & 0xFFFF0000u)};
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = num::mul_rn(num::mul_rn(pv[i], rs), wf[i]);
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
        write_record_at<F, 4>(p.cache, ipage, ir, gt, x, y);
      }
    }
  }

  if (t < 0) tail_store();  // (with a program, the store followed its pool)
}

}  // namespace dsv41kv::detail::cuda
