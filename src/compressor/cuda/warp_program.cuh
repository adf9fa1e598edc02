// The one-warp program of the streaming kernel (stream_kernel.cuh): row loads, the pool into the
// warp's scratch, the readers of the pooled row in its four layouts, and process_warp (RMS ->
// latent -> record), the program roles and the ratio-2 request program.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "formats/cuda/compress_math.cuh"
#include "compressor/cuda/program.cuh"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/memory.cuh"
#include "core/cuda/tma.cuh"
#include "formats/cuda/record_writers.cuh"

namespace dsv41kv::detail::cuda {

// ==================================================================== one-warp streaming kernel
//
// compress_stream_kernel<R, F, C>: 4 warps per 128-thread block, each warp owns
//   ratio 2: warps w < num_reqs: request program w (one program, generic loads, tail store);
//            the other warps: a chunk of C consecutive pair programs;
//   ratio 1: an even share of the token programs (consecutive), at most C of them: one per
//            C programs, or more, smaller shares when a small grid is widened to fill the GPU
//            (launch_compress_stream_c).
// A chunk starts with one round of metadata: lane j resolves program j of the chunk (token,
// insert slot, RoPE row), in parallel over the lanes; the program loop then broadcasts the role
// with shuffles. Ratio 2 issues the 16-byte row loads of program i+1 while pooling program i
// (rolling register prefetch: the next 8 KiB in flight through the compute); ratio 1 copies the
// rows of programs i+1, i+2 into a shared-memory ring with cp.async. Both copy the RoPE table
// entries of the inserts ahead the same way.

// A ratio-2 program's rows in the load layout: lane holds dims 4*lane + 128*k (k < 4) of the
// predecessor row (a) and the current row (b), kv and score halves.
struct PairRows {
  float4 bkv[4], bsc[4], akv[4], asc[4];
};

// Request programs: the rows of token t and of its predecessor `arow` (a ring or prev_rows row,
// any float alignment).
template <bool kAnyAlign>
__device__ __forceinline__ void load_rows(const CompressParams& p, int64_t t, const float* arow,
                                          int lane, PairRows& b) {
  const float* brow = p.kv + t * p.kv_stride;
  const bool a_al = !kAnyAlign || aligned16(arow);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int d = 4 * lane + 128 * k;
    b.bkv[k] = ld4(brow + d);
    b.bsc[k] = ld4(brow + kLatentDim + d);
    b.akv[k] = ld4_any(arow + d, a_al);
    b.asc[k] = ld4_any(arow + kLatentDim + d, a_al);
  }
}

// Pair programs: float4 group k (dims 4*lane + 128*k) of token t's rows (the predecessor is
// row t - 1).
// kEvictFirst: the loads carry the L2 evict-first policy (kRowsEvictFirst).
template <bool kEvictFirst>
__device__ __forceinline__ void load_group(const CompressParams& p, int64_t t, int lane, int k,
                                           PairRows& b) {
  // the lane's base address once (row pointer + 4*lane), then constant offsets 128*k: lets the
  // compiler use immediate offsets instead of a 64-bit index computation per group
  const float* brow = (p.kv + t * p.kv_stride) + 4 * lane;
  const float* arow = brow - p.kv_stride;
  b.bkv[k] = ld4_row<kEvictFirst>(brow + 128 * k);
  b.bsc[k] = ld4_row<kEvictFirst>(brow + kLatentDim + 128 * k);
  b.akv[k] = ld4_row<kEvictFirst>(arow + 128 * k);
  b.asc[k] = ld4_row<kEvictFirst>(arow + kLatentDim + 128 * k);
}

// Ratio 2: pooled = pool2(a, b) of the warp's program into the warp's scratch `pooled` (load
// layout, padded index pooled_index(d) = 4*lane + 4*(lane/8) + 144*k). Rolling prefetch: as soon
// as a group of `b` has been pooled, its registers receive the same group of the rows of token
// t_next (the next pair program of the chunk; -1: none), so that the next program's rows are in
// flight during the rest of this one.
// kEvictFirst: the prefetch loads carry the L2 evict-first policy (load_group).
template <bool kEvictFirst = false>
__device__ __forceinline__ void pool_warp(const CompressParams& p, PairRows& b, int64_t t_next,
                                          float* pooled, int lane) {
  const unsigned ul = static_cast<unsigned>(lane);
  float* const pl = pooled + (4u * ul + 4u * (ul >> 3));
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    const float4 a1[2] = {b.akv[k], b.akv[k + 1]}, a2[2] = {b.asc[k], b.asc[k + 1]};
    const float4 b1[2] = {b.bkv[k], b.bkv[k + 1]}, b2[2] = {b.bsc[k], b.bsc[k + 1]};
    float4 v[2];
    pool2_vec<2>(a1, a2, b1, b2, v);
    st4(pl + 144 * k, v[0]);
    st4(pl + 144 * (k + 1), v[1]);
    if (t_next >= 0) {
      load_group<kEvictFirst>(p, t_next, lane, k, b);
      load_group<kEvictFirst>(p, t_next, lane, k + 1, b);
    }
  }
}

// How process_warp reads the warp's pooled row (offsets in floats):
//  - PooledPtr: a generic pointer into shared memory (ratio 2: pool_warp wrote the row with plain
//    stores, so the reads must stay ordinary loads that the compiler orders after them);
//  - PooledSmem: a 32-bit shared address (ratio 1: only cp.async writes the ring, and cp.async,
//    its wait and these loads are all volatile asm, which the compiler keeps in program order).
//    The slot address stays one register; through a generic pointer into a runtime-selected slot
//    nvcc rebuilt it from the CTA's shared window (S2R SR_CgaCtaId, LEA, IMADs) in every program.
struct PooledPtr {
  static constexpr bool kSwizzled = false;  // dim d at pooled_index(d)
  static constexpr bool kRotated = false;
  const float* p;
  __device__ __forceinline__ float f32(unsigned off) const { return p[off]; }
  __device__ __forceinline__ float2 f32x2(unsigned off) const {
    return *reinterpret_cast<const float2*>(p + off);
  }
  __device__ __forceinline__ float4 f32x4(unsigned off) const { return ld4(p + off); }
};
struct PooledSmem {
  static constexpr bool kSwizzled = false;  // dim d at pooled_index(d)
  static constexpr bool kRotated = false;
  uint32_t a;  // shared-window address of float 0
  __device__ __forceinline__ float f32(unsigned off) const {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a + 4u * off));
    return v;
  }
  __device__ __forceinline__ float2 f32x2(unsigned off) const {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a + 4u * off));
    return v;
  }
  __device__ __forceinline__ float4 f32x4(unsigned off) const {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a + 4u * off));
    return v;
  }
};
// A ratio-1 kv row as its TMA copy lands it in a 1024-byte aligned ring slot (kv_rows_tensor_map:
// the row as 16 lines of 128 bytes, 128-byte swizzle): byte o of the row at
// o ^ (((o >> 7) & 7) << 4), i.e. 16-byte unit u of line r at unit u ^ (r % 8). The swizzle is
// what makes process_warp's reads of an unpadded row conflict-free (the padding of the cp.async
// layout cannot be had from one bulk copy): the RMS reads (lane l: dim l + 32i) read one whole
// line per instruction; the writer reads (lane l: dims 16l + 4c .. +3, 16-byte) of the eight
// lanes of a quarter warp fall in eight distinct units: lanes 2m and 2m + 1 read line m, units
// c ^ (m % 8) and (4 + c) ^ (m % 8). Every lane still receives its own dims in its own order.
// Each reader is row_swizzled_offset (below) worked out for its access; calling that function
// instead gives the same addresses but other generated code than the build whose timing was
// measured (docs/changelog.md, v24), so the change waits for a device A/B.
struct RowSwizzled {
  static constexpr bool kSwizzled = true;  // its own readers (below)
  static constexpr bool kRotated = false;
  uint32_t a;  // shared-window address of the slot (1024-byte aligned)
  __device__ __forceinline__ float rms(unsigned ul, int i) const {  // dim ul + 32 i
    float v;
    const uint32_t o = 128u * i + ((4u * ul) ^ (16u * (i & 7)));
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a + o));
    return v;
  }
  __device__ __forceinline__ float4 chunk(unsigned ul, int c) const {  // dims 16 ul + 4c .. + 3
    float4 v;
    const uint32_t o = 128u * (ul >> 1) + ((64u * (ul & 1u) + 16u * c) ^ (16u * ((ul >> 1) & 7u)));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(a + o));
    return v;
  }
  __device__ __forceinline__ float2 rope_pair(unsigned ul) const {  // dims 448 + 2 ul, + 1
    float2 v;
    const uint32_t line = 14u + (ul >> 4);
    const uint32_t o = 128u * line + ((8u * (ul & 15u)) ^ (16u * (line & 7u)));
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a + o));
    return v;
  }
};
// A ratio-1 kv row as a TMA copy without swizzle lands it (unpadded, 128-byte aligned slot), read
// conflict-free by rotating the writer reads instead: lane l reads its four 16-byte chunks
// (dims 16l + 4c .. + 3) in the order c ^ r, r = (l >> 1) & 3, so the eight lanes of a quarter
// warp (lanes 2m, 2m + 1 at line offsets 0 and 64, m = 0..3) read eight distinct 16-byte units.
// The reader returns chunk c ^ r at position c; the caller keeps the lane's weights, latent words
// and record words in that order (kRotated: the weights laid out rotated in shared memory once
// per block, `weights`; the latent stored chunk by chunk at its dims; the NVFP4 code words put
// back in order with NvRot). The RMS reads (one line per instruction) and the RoPE pair need no
// rotation.
struct RowRotated {
  static constexpr bool kSwizzled = true;  // its own readers (below)
  static constexpr bool kRotated = true;
  uint32_t a;   // shared-window address of the slot (128-byte aligned)
  uint32_t rx;  // 16 r: the byte offset of chunk r in the lane's 64 bytes
  uint32_t wl;  // the lane's 16 norm weights as fp32 in shared memory, in the rotated order
                // (kernel start: chunk c ^ r at wl + 16 c; 80 bytes per lane, conflict-free)
  __device__ __forceinline__ float4 weights(int c) const {  // dims 16 ul + 4 (c ^ r) .. + 3
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(wl + 16u * c));
    return v;
  }
  __device__ __forceinline__ float rms(unsigned ul, int i) const {  // dim ul + 32 i
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a + 4u * ul + 128u * i));
    return v;
  }
  __device__ __forceinline__ float4 chunk(unsigned ul, int c) const {  // dims 16 ul + 4 (c ^ r) .. + 3
    float4 v;
    const uint32_t o = ((a + 64u * ul) | rx) ^ (16u * c);  // a + 64 ul is 64-byte aligned
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(o));
    return v;
  }
  __device__ __forceinline__ float2 rope_pair(unsigned ul) const {  // dims 448 + 2 ul, + 1
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a + 4u * kNopeDim + 8u * ul));
    return v;
  }
  __device__ __forceinline__ unsigned r() const { return rx >> 4; }
};
// Byte offset of byte o of a row in the RowSwizzled layout (the pre-sm_90 fallback copy; the
// readers above use it worked out per access).
__host__ __device__ constexpr uint32_t row_swizzled_offset(uint32_t o) { return o ^ (((o >> 7) & 7u) << 4); }
static_assert(row_swizzled_offset(0) == 0 && row_swizzled_offset(128) == 144 && row_swizzled_offset(1024 + 7 * 128 + 112) == 1024 + 7 * 128);

// Where process_warp's record goes: RecAt (page, row in page: the writers compute the byte
// addresses) or, for NVFP4 in the ratio-1 streaming kernel, NvRecPtr (the value and scale
// addresses, computed once per program in the chunk's metadata round instead of per program on
// the whole warp: ~12 64-bit integer instructions per token less).
struct RecAt {
  static constexpr bool kPtr = false;
};
struct NvRecPtr {
  static constexpr bool kPtr = true;
  uint8_t* val;    // the record's 256 value bytes
  int64_t sc_off;  // its 32 scale bytes at val + sc_off
};

// RMS (normative order) -> latent -> latent_out / record of one program on one warp, from the
// pooled row in the warp's scratch `pooled` (ratio 2: written by pool_warp; ratio 1: the kv row
// itself, copied there by cp.async or TMA), in the layout `Pooled` describes (PooledPtr /
// PooledSmem: padded; RowSwizzled; RowRotated). Every read of the scratch ends before a
// __syncwarp, so the next program may overwrite it.
// rc, rsn: the RoPE table entries (cos, sin) of pair `lane` of the insert (ipage >= 0).
// rec: where an NVFP4 record goes when its addresses come from the metadata round (NvRecPtr).
template <int F, class Pooled, class Rec = RecAt>
__device__ __forceinline__ void process_warp(const CompressParams& p, int64_t t, int64_t ipage,
                                             int64_t ir, float rc, float rsn, Pooled pooled, int lane,
                                             const uint32_t (&wpk)[8], uint32_t wrope, Rec rec = {}) {
  static_assert(!Pooled::kRotated || F == kNv, "rotated rows: only the NVFP4 writer keeps the rotated order");
  // padded shared-memory addresses (pooled_index) as a per-lane base + constant offsets:
  //   RMS          d = lane + 32*i    : lane + 36*i
  //   writer       d = 16*lane + 4*c  : 16*lane + 4*(lane/2) + 4*c
  // (RowSwizzled: the same dims from the swizzled unpadded row, its own address arithmetic)
  // RoPE pair `lane` (dims 448 + 2*lane, 449 + 2*lane) is rotated by this lane (every record
  // format) with the table entries rc, rsn; its pooled values are read with the lane's other
  // reads of the scratch
  const unsigned ul = static_cast<unsigned>(lane);
  const unsigned pr = ul;                         // RMS reads
  const unsigned pwb = 16u * ul + 4u * (ul >> 1);  // writer reads
  __syncwarp();
  // 3. RMS: lane l sums d = l, l+32, ..., l+480 ascending, then the shuffle-down tree
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v;
    if constexpr (Pooled::kSwizzled) v = pooled.rms(ul, i);
    else v = pooled.f32(pr + 36u * i);
    part = num::fma_rn(v, v, part);
  }
  const float sum = Pooled::kRotated ? warp_reduce32_butterfly(part) : warp_reduce32(part);
  const float rs = cmath::rms_inverse(sum, p.eps);
  // 4. latent, writer layout: lane owns dims [16*lane, 16*lane + 16)
  const int d0 = 16 * lane;
  float pw[16];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float4 v;
    if constexpr (Pooled::kSwizzled) v = pooled.chunk(ul, c);
    else v = pooled.f32x4(pwb + 4u * c);
    pw[4 * c] = v.x;
    pw[4 * c + 1] = v.y;
    pw[4 * c + 2] = v.z;
    pw[4 * c + 3] = v.w;
  }
  // pooled_index(448 + 2*lane) = 504 + 2*lane + 4*(lane/16) (8-byte aligned, conflict-free)
  float2 pr2 = make_float2(0.0f, 0.0f);
  if constexpr (F != kNoRecord) {
    if constexpr (Pooled::kSwizzled) pr2 = pooled.rope_pair(ul);
    else pr2 = pooled.f32x2(504u + 2u * ul + 4u * (ul >> 4));
  }
  __syncwarp();  // every read of `pooled` done: the next program may overwrite it
  // latent = bf16((pooled * rs) * w) (cmath::latent_value, element-wise)
  float f[16];
  if constexpr (Pooled::kRotated) {  // the weights as fp32 from shared memory (RowRotated::weights)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float4 wv = pooled.weights(c);
      f[4 * c] = num::mul_rn(num::mul_rn(pw[4 * c], rs), wv.x);
      f[4 * c + 1] = num::mul_rn(num::mul_rn(pw[4 * c + 1], rs), wv.y);
      f[4 * c + 2] = num::mul_rn(num::mul_rn(pw[4 * c + 2], rs), wv.z);
      f[4 * c + 3] = num::mul_rn(num::mul_rn(pw[4 * c + 3], rs), wv.w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float wi = num::u2f(i % 2 == 0 ? (wpk[i / 2] << 16) : (wpk[i / 2] & 0xFFFF0000u));
      f[i] = num::mul_rn(num::mul_rn(pw[i], rs), wi);
    }
  }
  // NVFP4 takes the hardware conversion alone (no NaN check): a NaN there becomes 0x7FFF instead
  // of num::bf16_encode's pattern, but the record treats every NaN alike (its tile is poisoned,
  // SPEC 2.6: the amax bits of either pattern are >= 0x7F80 0000); the latent output gets the
  // exact patterns (bf16_fix_nan below). The other records store bf16 values or keep x.
  uint32_t lw[8];
  if constexpr (F == kNv) bf16_encode_packed_hw<16>(f, lw);
  else bf16_encode_packed<16>(f, lw);
  float x[16];
  bf16_decode_packed<16>(lw, x);
  if (p.latent != nullptr) {
    if constexpr (F == kNv) bf16_fix_nan<16>(f, lw);
    uint8_t* lat = reinterpret_cast<uint8_t*>(p.latent + t * kLatentDim + d0);
    if constexpr (Pooled::kRotated) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint32_t lwc[2] = {lw[2 * c], lw[2 * c + 1]};
        store_words<2>(lat + 8 * (c ^ pooled.r()), lwc);
      }
    } else {
      store_words<8>(lat, lw);
    }
  }
  if constexpr (F != kNoRecord) {
    if (ipage >= 0) {  // insert into slot ipage * S + ir
      // the latent of the lane's RoPE pair, element-wise as the owning lane (28 + lane/8)
      // computed it above (same pooled values, rs and weights)
      const float fr[2] = {num::mul_rn(num::mul_rn(pr2.x, rs), num::u2f(wrope << 16)),
                           num::mul_rn(num::mul_rn(pr2.y, rs), num::u2f(wrope & 0xFFFF0000u))};
      uint32_t lr[1];
      if constexpr (F == kNv) bf16_encode_packed_hw<2>(fr, lr);  // (a NaN poisons the RoPE tile alike)
      else bf16_encode_packed<2>(fr, lr);
      const float xr0 = num::u2f(lr[0] << 16), xr1 = num::u2f(lr[0] & 0xFFFF0000u);
      if constexpr (F == kV4) {
        write_v4_warp(p.cache, ipage, ir, lane, x, xr0, xr1, rc, rsn);
      } else if constexpr (F == kNv) {
        float q0, q1;
        num::rope_forward(xr0, xr1, rc, rsn, q0, q1);
        NvRot rot;
        if constexpr (Pooled::kRotated) {
          rot.sel = (pooled.rx & 16u) ? 0x2064u : 0x6420u;
          rot.swap = (pooled.rx & 32u) != 0;
        }
        if constexpr (Rec::kPtr) write_nv_warp_at<Pooled::kRotated>(rec.val, rec.val + rec.sc_off, lane, lw, q0, q1, rot);
        else write_nv_warp(p.cache, ipage, ir, lane, lw, q0, q1);
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

// The streaming kernel instantiated for small chunks (kChunkSmall: grids of fewer than 4 waves,
// and ratio-1 NVFP4 at any size) reads its kv rows with the L2 evict-first policy: they are read
// once, and the policy keeps the lines the launch writes (records, latents, ring rows) or that a
// previous kernel left in L2 while the rows stream through, instead of writing them back during
// the kernel. Measured faster with it on the H200 for 32K at both ratios and for 256K ratio-1
// NVFP4 (docs/changelog.md, v18). The chunk-8 instantiation (large grids) keeps the default
// policy: evict-first rows made 256K ratio 1 v4 / mxfp8 (138-153 MB of records, ~3x L2) and
// ratio 2 v4 slower. A compile-time choice: a policy chosen at run time goes through uniform
// registers at every copy (R2UR), which measured slower at 256K by itself (docs/changelog.md,
// "Tried and did not pay").
template <int C>
inline constexpr bool kRowsEvictFirst = C == kChunkSmall;

// RoPE table rows fetched this many programs ahead in the streaming kernel (ratio 2), and rows +
// RoPE entries (ratio 1).
inline constexpr int kRopeAhead = 2;
inline constexpr int kRowsAhead = 2;
// Shared scratch of the streaming kernel: ratio 2, one pooled row per warp; ratio 1, a ring of
// kRowsAhead + 1 rows per warp that cp.async fills (the row is its own pooled row).
template <int R>
__device__ __forceinline__ float* smem_pooled(int warp) {
  __shared__ __align__(16) float smem[4][kPooledFloats];
  return smem[warp];
}
template <int R>
__device__ __forceinline__ float (*smem_rows(int warp))[kPooledFloats] {
  __shared__ __align__(16) float rows[4][kRowsAhead + 1][kPooledFloats];
  return rows[warp];
}
// Ratio 1 with TMA rows (kRowsTma): the warp's ring of unpadded swizzled rows (RowSwizzled; the
// 128-byte swizzle needs 1024-byte aligned slots) and one mbarrier per slot, in one struct so
// that a single register addresses both (the barriers at kRowBarsOffset from the rows): with the
// barriers in an array of their own the v4 kernel needed one register more than its 72 and
// spilled 4 bytes, and measured slower at 256K (docs/changelog.md, v24). 7 KiB per warp, 31 KiB
// per block with the RoPE ring: 7 blocks still fit an SM (the register limit).
struct alignas(1024) RowsTmaSmem {
  float rows[kRowsAhead + 1][kLatentDim];
  uint64_t bars[kRowsAhead + 1];
};
// The warp's instance of a per-warp shared-memory struct (4 warps per block; one array per type).
template <class T>
__device__ __forceinline__ T* smem_per_warp(int warp) {
  __shared__ T s[4];
  return &s[warp];
}
inline constexpr uint32_t kRowBarsOffset = (kRowsAhead + 1) * kLatentDim * 4;
// Ratio 1, NVFP4, chunk 16 (kRowsTmaRot): rows without swizzle (RowRotated) and the RoPE table
// entries of each program by TMA too, on the slot's barrier: no cp.async at all.
struct alignas(128) RowsRopeTmaSmem {
  float rows[kRowsAhead + 1][kLatentDim];
  float rope[kRowsAhead + 1][kRopeDim];
  uint64_t bars[kRowsAhead + 1];
};
inline constexpr uint32_t kRopeSlotsOffset = (kRowsAhead + 1) * kLatentDim * 4;
inline constexpr uint32_t kRowRopeBarsOffset = kRopeSlotsOffset + (kRowsAhead + 1) * kRopeDim * 4;
static_assert(offsetof(RowsRopeTmaSmem, rope) == kRopeSlotsOffset && offsetof(RowsRopeTmaSmem, bars) == kRowRopeBarsOffset);

// Ratio-1 kv rows by TMA (the chunk-8 instantiation, i.e. large grids): one bulk tensor copy
// of the whole 2048-byte row per token into its ring slot (RowSwizzled layout), issued by lane 0
// and counted by the slot's mbarrier (expected bytes, then the copy's complete_tx); every lane
// waits on the barrier's phase parity. Why: a traffic kernel without arithmetic moved the 256K
// bytes measurably closer to the copy's rate with one bulk copy per row than with the per-lane
// 16-byte cp.async of the padded ring; the fused kernel with a bulk copy of unpadded rows was
// slower (4-way bank conflicts in the writer reads) until the rows were swizzled
// (docs/changelog.md, "Measurements that explain the limits": the access-pattern ceiling; v24).
// A tensor copy (cp.async.bulk.tensor with a tensor map) rather than the plain cp.async.bulk:
// the swizzle needs the map, and compute-sanitizer racecheck reports every plain bulk copy's
// shared writes as unsynchronised with the reads after the mbarrier wait ("invalid async
// operation synchronization", a tool limitation: docs/changelog.md, v24), while a tensor copy's
// writes are not attributed to a thread. The chunk-16 instantiations keep the cp.async ring with
// its L2 evict-first row policy, except ratio-1 NVFP4 on large grids (kRowsTmaRot below).
// Row mechanisms of the ratio-1 streaming kernel (template parameter M): cp.async into the padded
// ring (kRowsCp, also every ratio-2 kernel), TMA into the swizzled ring (kRowsTmaSwz, chunk 8),
// TMA of rows and RoPE entries, rotated reads (kRowsTmaRot, NVFP4 chunk 16).
inline constexpr int kRowsCp = 0, kRowsTmaSwz = 1, kRowsTmaRot = 2;
inline constexpr uint32_t kRowTmaBytes = kLatentDim * 4;
// kv row t into the slot at shared address `dst`, counted by `bar` (all 32 lanes call; lane 0
// issues). Builds for older architectures (no TMA; never launched on the sm_90 devices this path
// is for) copy the row synchronously into the same swizzled layout.
__device__ __forceinline__ void tma_row(uint32_t dst, const CUtensorMap* map, [[maybe_unused]] const CompressParams& p,
                                        int64_t t, uint32_t bar, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane == 0) {
    // the warp's reads of the slot's previous row (generic proxy, ended before a __syncwarp)
    // ordered before the copy's writes (async proxy)
    fence_proxy_async_shared();
    mbarrier_arrive_expect_tx<kRowTmaBytes>(bar);
    tma_load_3d(dst, map, 0, 0, static_cast<int32_t>(t), bar);
  }
#else
  __syncwarp();  // every lane's reads of the slot done
  const float* src = p.kv + t * p.kv_stride;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t q = static_cast<uint32_t>(lane + 32 * k);  // float4 q of the row
    const float4 v = ld4(src + 4 * q);
    *static_cast<float4*>(__cvta_shared_to_generic(dst + row_swizzled_offset(16u * q))) = v;
  }
  __syncwarp();  // ... and the row visible to the warp
#endif
}
// kRowsTmaRot: kv row t (>= 0) into the slot at `dst` and RoPE table row rrow (>= 0; the caller
// passes row 0 for a program without an insert, whose entries it then does not read: a constant
// byte count and no branch) into `rope_dst`, both counted by the slot's barrier; one lane chosen
// by elect.sync issues (core/cuda/tma.cuh: every operand must be warp-uniform as the compiler sees
// it; the caller derives them from the warp index broadcast from lane 0 and from shuffles with a
// uniform source lane). No proxy fence before the copy: the slot's previous reads are generic
// loads that completed before the warp's __syncwarp (their values were consumed), as in CUTLASS's
// TMA pipelines, where a consumer's release is an mbarrier arrive.
// row_pol / rope_pol: the copies' L2 policies (createpolicy): rows evict-first, RoPE rows
// evict-last, as the cp.async kernels have them (docs/changelog.md, v25). Never launched before
// sm_90 (the launcher picks kRowsTmaRot on sm_90+ only).
__device__ __forceinline__ void tma_row_rope(uint32_t dst, uint32_t rope_dst, const CUtensorMap* kv_map,
                                             const CUtensorMap* rope_map, int32_t t, int32_t rrow, uint32_t bar,
                                             uint64_t row_pol, uint64_t rope_pol) {
  tma_elect_expect_load_3d<kRowTmaBytes + kRopeDim * 4u>(dst, kv_map, t, bar, row_pol);
  tma_elect_load_2d(rope_dst, rope_map, rrow, bar, rope_pol);
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
    arow = request_predecessor_row(p, g, sl, ps);
  }
  if (t >= 0) {
    PairRows A;
    load_rows<true>(p, t, arow, lane, A);
    int64_t slot_ins, row, ipage = -1, ir = 0;
    insert_decision<R, F>(p, islot, ps, slot_ins, row);
    float rc = 0.0f, rsn = 0.0f;
    if (slot_ins >= 0) {
      divmod_fast(slot_ins, p.cache.S_div, ipage, ir);
      const float* trow = p.table + row * kRopeDim;
      rc = trow[lane];
      rsn = trow[kRopeDim / 2 + lane];
    }
    pool_warp(p, A, -1, pooled, lane);
    process_warp<F>(p, t, ipage, ir, rc, rsn, PooledPtr{pooled}, lane, wb, wrope);
  }
  if (tail) {
    // Every ring read of this program (the predecessor row) was consumed by the pool above,
    // before the warp barrier in process_warp; rows are copied in ascending token order.
    const int64_t n = (e - s) < p.cap_div.d ? (e - s) : p.cap_div.d;
    for (int64_t kk = 0; kk < n; ++kk) {
      const int64_t tt = e - n + kk;
      const int64_t st = p.slot[tt];
      if (st < 0 || st >= p.ring_slots) continue;
      float* dst = ring_row(p, st);
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

}  // namespace dsv41kv::detail::cuda
