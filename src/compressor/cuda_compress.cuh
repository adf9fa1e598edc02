// The fused save-compress-norm kernel (SPEC 4.4-4.6, 7.5), optionally fused with the RoPE +
// quantized insert of SPEC 5.1 (template parameter F), so that the latent stays in registers.
//
// Programs follow the reference decomposition exactly (as the CPU backend does):
//   ratio 1: program t < N;  ratio 2: request programs j < num_reqs, then pair programs
//   k < ceil(N / 2) over the flat token array.
// A program runs on a group of G warps (G = 1: one warp, 4 warps per 128-thread block, each warp
// chunks of kChunk consecutive programs, for large grids; G = 4: one 128-thread block per
// program, for small grids such as decode).
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

#include <algorithm>
#include <atomic>

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

// The ring row of ring slot `slot` (already bounded): block slot / cap, row slot % cap.
__device__ __forceinline__ float* ring_row(const CompressParams& p, int64_t slot) {
  int64_t blk, row;
  divmod_fast(slot, p.cap_div, blk, row);
  return p.ring + blk * p.ring_bs + row * p.ring_rs;
}

// The predecessor row of a ratio-2 request program whose first token closes a group (SPEC 4.4,
// 7.5): under PCP the gathered row prev_rows[g] when the link found one (g: prev_row_indices of
// the request, -1 when none or not PCP), otherwise the ring row of position ps - 1 in the block
// of the first token's ring slot `sl` (already bounded).
__device__ __forceinline__ const float* request_predecessor_row(const CompressParams& p, int64_t g, int64_t sl,
                                                                 int64_t ps) {
  const float* arow = nullptr;
  if (g >= 0 && g < p.prev_count) arow = p.prev + g * p.prev_stride;
  if (arow == nullptr) {
    int64_t blk, rem, quo, row_pred;
    divmod_fast(sl, p.cap_div, blk, rem);
    divmod_fast(ps - 1, p.cap_div, quo, row_pred);
    arow = p.ring + blk * p.ring_bs + row_pred * p.ring_rs;
  }
  return arow;
}

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
// instead gives the same addresses but other generated code than the build measured in session
// 12, so the change waits for a device A/B.
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
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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
  float sum;
  if constexpr (Pooled::kRotated) {
    // the same tree as a butterfly: lanes l and l ^ h add the same two values (in either order:
    // IEEE addition is commutative, and a NaN sum is the canonical NaN either way), so after each
    // level they hold the same value and every lane ends with lane 0's sum, without the broadcast
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1) part = num::add_rn(part, __shfl_xor_sync(0xFFFFFFFFu, part, h));
    sum = part;
  } else {
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1)
      part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, h));
    sum = __shfl_sync(0xFFFFFFFFu, part, 0);
  }
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

__device__ __forceinline__ int64_t shfl64(int64_t v, int src) {
  return static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(v), src));
}
__device__ __forceinline__ const float* shflptr(const float* v, int src) {
  return reinterpret_cast<const float*>(
      __shfl_sync(0xFFFFFFFFu, static_cast<long long>(reinterpret_cast<uintptr_t>(v)), src));
}

// The streaming kernel instantiated for small chunks (kChunkSmall: grids of fewer than 4 waves,
// and ratio-1 NVFP4 at any size) reads its kv rows with the L2 evict-first policy: they are read
// once, and the policy keeps the lines the launch writes (records, latents, ring rows) or that a
// previous kernel left in L2 while the rows stream through, instead of writing them back during
// the kernel. A/B on the H200 (session 6, docs/perf-notes.md v18): 32K ratio 1 -5 to -10%, ratio
// 2 -3 to -4%, 256K ratio-1 NVFP4 -1.6%. The chunk-8 instantiation (large grids) keeps the
// default policy: evict-first rows made 256K ratio 1 v4 / mxfp8 (138-153 MB of records, ~3x
// L2) 4% / 2.5% slower and ratio 2 v4 1.4%. A compile-time choice: a policy chosen at run time
// goes through uniform registers at every copy (R2UR), which cost 1-1.5% at 256K by itself.
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
// spilled 4 bytes, 180.0 against 177.3 us at 256K (session 12). 7 KiB per warp, 31 KiB per block
// with the RoPE ring: 7 blocks still fit an SM (the register limit).
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
// Asynchronous global -> shared copies (sm_80+), their commit and wait (this thread's copies):
// 16 bytes bypassing L1 (the kv rows; with an L2 policy: kRowsEvictFirst), 4 bytes with an L2
// eviction policy (the RoPE table entries, see l2_policy_evict_last). Builds for older
// architectures copy synchronously (same results). Every form takes a 32-bit shared-window
// address (`_sa`).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem_src), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async4_sa(uint32_t d, const float* gmem_src, uint64_t pol) {
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(d), "l"(gmem_src), "l"(pol)
               : "memory");
}
// RoPE table entries are copied with an L2 evict-last policy (both ratios): every request reads
// the row of each of its positions, the 16 requests of a 256K prefill reach a position at
// different times, and in between tens of MB of kv rows stream through L2; with the default
// policy most RoPE rows came from DRAM again (ncu, 256K ratio 1 v4: 584 MB of DRAM reads for 549
// MB of rows, metadata and table; 546 MB with the policy, 191 -> 184.5 us; ratio 2 -2%).
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src) {
  *static_cast<float4*>(__cvta_shared_to_generic(d)) = *reinterpret_cast<const float4*>(gmem_src);
}
__device__ __forceinline__ void cp_async16_sa(uint32_t d, const float* gmem_src, uint64_t) {
  cp_async16_sa(d, gmem_src);
}
__device__ __forceinline__ void cp_async4_sa(uint32_t d, const float* gmem_src, uint64_t) {
  *static_cast<float*>(__cvta_shared_to_generic(d)) = *gmem_src;
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() { return 0; }
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif
// A 16-byte kv-row copy, with the L2 policy `pol` when kEvictFirst (kRowsEvictFirst), else the
// plain form.
template <bool kEvictFirst>
__device__ __forceinline__ void cp_async16_row(uint32_t d, const float* gmem_src, uint64_t pol) {
  if constexpr (kEvictFirst) cp_async16_sa(d, gmem_src, pol);
  else cp_async16_sa(d, gmem_src);
}

// Ratio-1 kv rows by TMA (the chunk-8 instantiation, i.e. large grids): one bulk tensor copy
// of the whole 2048-byte row per token into its ring slot (RowSwizzled layout), issued by lane 0
// and counted by the slot's mbarrier (expected bytes, then the copy's complete_tx); every lane
// waits on the barrier's phase parity. Why (session 12, docs/perf-notes.md v24): a traffic kernel
// without arithmetic moved the 256K bytes at ~92% of the copy with the per-lane 16-byte cp.async
// of the padded ring and at ~94-95% with one bulk copy per row; the fused kernel with a bulk copy
// of unpadded rows was slower (4-way bank conflicts in the writer reads) until the rows were
// swizzled. A tensor copy (cp.async.bulk.tensor with a tensor map) rather than the plain
// cp.async.bulk: the swizzle needs the map, and compute-sanitizer racecheck reports every plain
// bulk copy's shared writes as unsynchronised with the reads after the mbarrier wait ("invalid
// async operation synchronization", a tool limitation, session 11), while a tensor copy's writes
// are not attributed to a thread. The chunk-16 instantiations keep the cp.async ring with its L2
// evict-first row policy, except ratio-1 NVFP4 on large grids (kRowsTmaRot below).
// Row mechanisms of the ratio-1 streaming kernel (template parameter M): cp.async into the padded
// ring (kRowsCp, also every ratio-2 kernel), TMA into the swizzled ring (kRowsTmaSwz, chunk 8),
// TMA of rows and RoPE entries, rotated reads (kRowsTmaRot, NVFP4 chunk 16).
inline constexpr int kRowsCp = 0, kRowsTmaSwz = 1, kRowsTmaRot = 2;
inline constexpr uint32_t kRowTmaBytes = kLatentDim * 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void row_barrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bar) : "memory");
}
// the initialised barriers visible to the async proxy (the copies' complete_tx)
__device__ __forceinline__ void row_barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// kv row t into the slot at shared address `dst` (all 32 lanes call; lane 0 issues)
__device__ __forceinline__ void tma_row(uint32_t dst, const CUtensorMap* map, const CompressParams&, int64_t t,
                                        uint32_t bar, int lane) {
  if (lane == 0) {
    // the warp's reads of the slot's previous row (generic proxy, ended before a __syncwarp)
    // ordered before the copy's writes (async proxy)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "n"(kRowTmaBytes) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(0), "r"(static_cast<int32_t>(t)), "r"(bar)
        : "memory");
  }
}
// waits until the barrier's phase of the given parity has completed (acquire: the copy's bytes
// are visible to the calling lane)
__device__ __forceinline__ void row_barrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
// kRowsTmaRot: kv row t (>= 0) into the slot at `dst` and RoPE table row rrow (>= 0; the caller
// passes row 0 for a program without an insert, whose entries it then does not read: a constant
// byte count and no branch) into `rope_dst`, both counted by the slot's barrier; one lane chosen
// by elect.sync issues. Every operand must be warp-uniform as the compiler sees it (the caller derives them from the warp
// index broadcast from lane 0 and from shuffles with a uniform source lane), so that they live in
// uniform registers: otherwise ptxas wraps each copy in a loop over the distinct operand values
// of the active lanes (ELECT, R2UR, BRA.U.ANY). No proxy fence before the copy: the slot's
// previous reads are generic loads that completed before the warp's __syncwarp (their values were
// consumed), as in CUTLASS's TMA pipelines, where a consumer's release is an mbarrier arrive.
// row_pol / rope_pol: the copies' L2 policies (createpolicy): rows evict-first, RoPE rows
// evict-last, as the cp.async kernels have them (256K nvfp4 170.1-170.8 -> 167.3 us, session 13).
__device__ __forceinline__ void tma_row_rope(uint32_t dst, uint32_t rope_dst, const CUtensorMap* kv_map,
                                             const CUtensorMap* rope_map, int32_t t, int32_t rrow, uint32_t bar,
                                             uint64_t row_pol, uint64_t rope_pol) {
  constexpr uint32_t bytes = kRowTmaBytes + kRopeDim * 4u;
  asm volatile(
      "{ .reg .pred p;\n\t"
      "elect.sync _|p, 0xffffffff;\n\t"
      "@p mbarrier.arrive.expect_tx.shared.b64 _, [%2], %3;\n\t"
      "@p cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%5, %5, %4}], [%2], %6;\n\t"
      "}" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(kv_map)), "r"(bar), "n"(bytes), "r"(t), "r"(0), "l"(row_pol)
      : "memory");
  asm volatile(
      "{ .reg .pred p;\n\t"
      "elect.sync _|p, 0xffffffff;\n\t"
      "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%4, %3}], [%2], %5;\n\t"
      "}" ::"r"(rope_dst), "l"(reinterpret_cast<uint64_t>(rope_map)), "r"(bar), "r"(rrow), "r"(0), "l"(rope_pol)
      : "memory");
}
#else
// Builds for older architectures (no TMA; never launched on the sm_90 devices this path is for):
// the warp copies the row synchronously into the same swizzled layout.
__device__ __forceinline__ void row_barrier_init(uint32_t) {}
__device__ __forceinline__ void row_barrier_init_fence() {}
__device__ __forceinline__ void tma_row(uint32_t dst, const CUtensorMap*, const CompressParams& p, int64_t t, uint32_t,
                                        int lane) {
  __syncwarp();  // every lane's reads of the slot done
  const float* src = p.kv + t * p.kv_stride;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t q = static_cast<uint32_t>(lane + 32 * k);  // float4 q of the row
    const float4 v = ld4(src + 4 * q);
    *static_cast<float4*>(__cvta_shared_to_generic(dst + row_swizzled_offset(16u * q))) = v;
  }
  __syncwarp();  // ... and the row visible to the warp
}
__device__ __forceinline__ void row_barrier_wait(uint32_t, uint32_t) {}
__device__ __forceinline__ void tma_row_rope(uint32_t, uint32_t, const CUtensorMap*, const CUtensorMap*, int32_t,
                                             int32_t, uint32_t, uint64_t, uint64_t) {
  // (never launched before sm_90: the launcher picks kRowsTmaRot on sm_90+ only)
}
#endif

template <int R, int F>
__device__ __forceinline__ void request_program_warp(const CompressParams& p, int64_t prog,
                                                     float* pooled, int lane,
                                                     const uint32_t (&wb)[8], uint32_t wrope);

// Resident blocks the streaming kernel is compiled for (__launch_bounds__ minimum; registers
// per thread <= 65536 / (128 * blocks)). Ratio 1 fits 7 blocks (the shared-memory limit too: 30
// KiB per block, so 8 would not fit anyway): 72 registers, nvfp4 with an 8-byte spill (7 blocks
// still measured faster than 6 blocks (80 registers) and 5 (96): 256K 208-210 vs 211 vs 215 us,
// session 4). Overridable at build time.
#ifndef DSV41KV_R1_MIN_BLOCKS
#define DSV41KV_R1_MIN_BLOCKS 7
#endif
#ifndef DSV41KV_R1_NV_MIN_BLOCKS
#define DSV41KV_R1_NV_MIN_BLOCKS 7
#endif
#ifndef DSV41KV_R1_NV_TMA_MIN_BLOCKS
#define DSV41KV_R1_NV_TMA_MIN_BLOCKS 7
#endif
template <int R, int F, int M>
inline constexpr int kStreamMinBlocks =
    R == 2 ? 3
           : (M == kRowsTmaRot ? DSV41KV_R1_NV_TMA_MIN_BLOCKS
                               : (F == kNv ? DSV41KV_R1_NV_MIN_BLOCKS : DSV41KV_R1_MIN_BLOCKS));

// M: the row mechanism (kRowsCp, kRowsTmaSwz, kRowsTmaRot).
// kv_map: the kv rows as a TMA tensor map (kv_rows_tensor_map) when M != kRowsCp, else unused;
// rope_map: the RoPE table (rope_table_tensor_map) when M == kRowsTmaRot, else unused.
template <int R, int F, int C, int M>
__global__ void __launch_bounds__(128, (kStreamMinBlocks<R, F, M>))
    compress_stream_kernel(const CompressParams p, const __grid_constant__ CUtensorMap kv_map,
                           const __grid_constant__ CUtensorMap rope_map) {
  static_assert(C <= 32);
  static_assert(M == kRowsCp || R == 1);
  static_assert(M != kRowsTmaRot || F == kNv);
  // RoPE table entries of the inserts, copied kRopeAhead programs ahead (cp.async): the table
  // row of a program is known only from its position, and a plain load issued at the start of
  // the program was still in flight when its RoPE needed it (ncu: a third of the stall samples
  // of the ratio-2 nvfp4 kernel on that one multiply)
  __shared__ __align__(16) float rope_sm[4][(R == 1 ? kRowsAhead : kRopeAhead) + 1][kRopeDim];
  pdl_wait();  // PDL: the previous kernel's writes first (no early trigger: large grids)
  // (kRowsTmaRot: the warp index broadcast from lane 0, so that the compiler sees it and what
  // derives from it (ring addresses, the chunk, the loop) as warp-uniform: tma_row_rope)
  const int warp = M == kRowsTmaRot ? __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x) / 32, 0)
                                    : static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + warp;

  uint32_t wb[8];  // the lane's 16 bf16 norm weights, packed (even dim in the low half)
  // kRowsTmaRot: the lane's chunk rotation (RowRotated::rx)
  const uint32_t rot_rx = 16u * ((static_cast<unsigned>(lane) >> 1) & 3u);
  // (kRowsTmaRot: the block's weights as fp32 in shared memory instead, read per chunk by
  // RowRotated::weights: 4 loads per token instead of 16 unpacks of packed words; lane l's 16
  // at [l][0..15] in its rotated order: [l][4c + j] = dim 16 l + 4 (c ^ r_l) + j, rows of 20
  // floats so that a quarter warp's 16-byte loads hit distinct banks)
  __shared__ __align__(16) float w_sm[M == kRowsTmaRot ? 32 : 1][20];
  uint32_t w_lane = 0;
  if constexpr (M == kRowsTmaRot) {
    for (int e = static_cast<int>(threadIdx.x); e < kLatentDim; e += 128) {
      const int l = e / 16, c = (e / 4) % 4, j = e % 4;
      const int d = 16 * l + 4 * (c ^ ((l >> 1) & 3)) + j;
      w_sm[l][4 * c + j] = num::u2f(static_cast<uint32_t>(p.norm_w[d]) << 16);
    }
    __syncthreads();
    w_lane = smem_address(w_sm[lane]);
  } else {
    const uint4 u0 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane);
    const uint4 u1 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane + 8);
    wb[0] = u0.x; wb[1] = u0.y; wb[2] = u0.z; wb[3] = u0.w;
    wb[4] = u1.x; wb[5] = u1.y; wb[6] = u1.z; wb[7] = u1.w;
  }
  // the packed bf16 norm weights of the lane's RoPE pair (dims 448 + 2*lane, +1)
  uint32_t wrope = 0;
  if constexpr (F != kNoRecord)
    wrope = *reinterpret_cast<const uint32_t*>(p.norm_w + kNopeDim + 2 * lane);

  // This warp's programs [lo, hi), processed in chunks of at most C:
  //   ratio 2: the request program w (w < num_reqs), else pair chunk w - num_reqs;
  //   ratio 1: an even share of the N token programs over the grid's warps (stream_share, with
  //   N / W and N % W from the host). The grid has at least one warp per C programs
  //   (stream_blocks_r1), so a share is at most C programs and the chunk loop below runs once;
  //   widening a small grid only makes the shares smaller (tests/gpu/test_stream_split_gpu.cu).
  int64_t lo, hi;
  if constexpr (R == 2) {
    if (w < p.num_reqs) {
      request_program_warp<R, F>(p, w, smem_pooled<R>(warp), lane, wb, wrope);
      return;
    }
    const int64_t pairs = (p.N + 1) / 2;
    const int64_t k0 = (w - p.num_reqs) * C;
    if (k0 >= pairs) return;
    lo = p.num_reqs + k0;
    hi = p.num_reqs + (pairs - k0 < C ? pairs : k0 + C);
  } else {
    stream_range(w, p.seg, lo, hi);
  }
  // ratio 1: the warp's shared ring of rows (kRowsAhead + 1 slots, see the chunk loop), its
  // addresses computed once per warp
  // (kRowsTma: the slots' barriers too, at rows_sa + kRowBarsOffset, and row_parity bit s: the
  // parity of slot s's next phase, one phase per row copied into the slot)
  uint32_t rows_sa = 0, row_dst_lane = 0, row_parity = 0;
  if constexpr (M == kRowsTmaRot) {
    rows_sa = smem_address(smem_per_warp<RowsRopeTmaSmem>(warp));
    if (lane <= kRowsAhead) row_barrier_init(rows_sa + kRowRopeBarsOffset + 8u * static_cast<uint32_t>(lane));
    row_barrier_init_fence();
    __syncwarp();
  } else if constexpr (M == kRowsTmaSwz) {
    rows_sa = smem_address(smem_per_warp<RowsTmaSmem>(warp));
    if (lane <= kRowsAhead) row_barrier_init(rows_sa + kRowBarsOffset + 8u * static_cast<uint32_t>(lane));
    row_barrier_init_fence();
    __syncwarp();
  } else if constexpr (R == 1) {
    const unsigned ul = static_cast<unsigned>(lane);
    rows_sa = smem_address(smem_rows<R>(warp)[0]);
    row_dst_lane = rows_sa + 4u * (4u * ul + 4u * (ul >> 3));
  }
  for (int64_t first = lo; first < hi; first += C) {
    const int64_t n = hi - first < C ? hi - first : C;  // programs in the chunk

    // metadata of the whole chunk, one program per lane
    int64_t role_t = -1, role_slot = -1, role_row = 0;
    if (lane < n) resolve_role<R, F>(p, first + lane, role_t, role_slot, role_row);
    // the insert slot as (page, row in page), also resolved in parallel over the lanes
    int64_t role_page = -1, role_r = 0;
    if (role_slot >= 0) divmod_fast(role_slot, p.cache.S_div, role_page, role_r);
    // NVFP4, ratio 1: the record's value and scale addresses (NvRecPtr), here for all the
    // chunk's programs at once rather than on the whole warp per program
    // (byte offsets from the cache base rather than pointers, so that the stores stay global
    // ones after the shuffle; -1: no insert)
    int64_t role_val = -1, role_sc_off = 0;
    if constexpr (R == 1 && F == kNv) {
      if (role_page >= 0) {
        role_val = role_page * p.cache.page_stride_bytes + Nvfp4Layout::value_offset(p.cache.S, role_r);
        role_sc_off = Nvfp4Layout::scale_offset(p.cache.S, role_r) - Nvfp4Layout::value_offset(p.cache.S, role_r);
      }
    }
    // the RoPE table row of the program's insert (null: no insert)
    const float* role_trow = nullptr;
    if constexpr (F != kNoRecord) {
      if (role_page >= 0) role_trow = p.table + role_row * kRopeDim;
    }
    // the RoPE entries of program j's insert (lane: cos and sin of pair `lane`) copied into rope
    // slot `slot` (nothing without an insert), through 32-bit shared addresses and one L2
    // evict-last policy per chunk (both ratios)
    constexpr uint32_t kRopeBytes = kRopeDim * 4;
    const unsigned ul = static_cast<unsigned>(lane);
    const uint32_t rope_sa = smem_address(rope_sm[warp][0]);
    const uint64_t rope_policy = l2_policy_evict_last();
    auto copy_rope = [&](int j, int slot) {
      if constexpr (F != kNoRecord) {
        const float* trow = shflptr(role_trow, j);
        if (trow != nullptr) {
          const uint32_t dst = rope_sa + static_cast<uint32_t>(slot) * kRopeBytes + 4u * ul;
          cp_async4_sa(dst, trow + lane, rope_policy);
          cp_async4_sa(dst + 4u * (kRopeDim / 2), trow + kRopeDim / 2 + lane, rope_policy);
        }
      }
    };
    // the entries of the program whose copies landed in rope slot `slot`
    auto read_rope = [&](int slot, float& rc, float& rsn) {
      const PooledSmem rope{rope_sa + static_cast<uint32_t>(slot) * kRopeBytes};
      rc = rope.f32(ul);
      rsn = rope.f32(kRopeDim / 2 + ul);
    };
    // ratio 2: one commit group per program, empty when it has no insert (uniform group counting)
    auto rope_copy = [&](int j) {
      if constexpr (F != kNoRecord) {
        copy_rope(j, j % (kRopeAhead + 1));
        cp_async_commit();
      }
    };

    const int nn = static_cast<int>(n);
    if constexpr (M == kRowsTmaRot) {
      // Rows and RoPE entries of program j by TMA into ring slot j % (ahead + 1) (tma_row_rope),
      // kRowsAhead programs ahead, both on the slot's barrier; no cp.async groups. Token and RoPE
      // row travel as 32-bit values (the launcher picks this mechanism only for N and table rows
      // below 2^31); token -1: none; RoPE row 0 for a program without an insert (copied, not read).
      const int32_t role_t32 = static_cast<int32_t>(role_t);
      const int32_t role_rope32 = role_trow != nullptr ? static_cast<int32_t>(role_row) : 0;
      constexpr int kSlots = kRowsAhead + 1;
      // L2 policies: rows evict-first (read once; the chunk-16 cp.async kernel's kRowsEvictFirst),
      // RoPE rows evict-last (re-read by every request at each position, see l2_policy_evict_last)
      const uint64_t row_pol = l2_policy_evict_first();
      auto copy = [&](int j, int slot) {
        const int32_t tj = __shfl_sync(0xFFFFFFFFu, role_t32, j);
        const int32_t rj = __shfl_sync(0xFFFFFFFFu, role_rope32, j);
        const uint32_t us = static_cast<uint32_t>(slot);
        if (tj >= 0)
          tma_row_rope(rows_sa + us * kRowTmaBytes, rows_sa + kRopeSlotsOffset + us * kRopeBytes, &kv_map, &rope_map, tj,
                       rj, rows_sa + kRowRopeBarsOffset + 8u * us, row_pol, rope_policy);
      };
  #pragma unroll
      for (int j = 0; j < kRowsAhead; ++j)
        if (j < nn) copy(j, j);
      int s_use = 0, s_fill = kRowsAhead;  // ring slots of programs i and i + kRowsAhead
      for (int i = 0; i < nn; ++i) {
        // slot s_fill is program i-1's: every read of it ended before the __syncwarp that closes
        // process_warp
        if (i + kRowsAhead < nn) copy(i + kRowsAhead, s_fill);
        const int32_t t32 = __shfl_sync(0xFFFFFFFFu, role_t32, i);
        const uint32_t us = static_cast<uint32_t>(s_use);
        if (t32 >= 0) {
          row_barrier_wait(rows_sa + kRowRopeBarsOffset + 8u * us, (row_parity >> us) & 1u);
          row_parity ^= 1u << us;
          const int64_t off = shfl64(role_val, i);
          const NvRecPtr nrec{p.cache.base + off,
                              __shfl_sync(0xFFFFFFFFu, static_cast<int32_t>(role_sc_off), i)};  // (|sc_off| < 2^31: launcher)
          float rc = 0.0f, rsn = 0.0f;
          if (off >= 0) {
            const PooledSmem rope{rows_sa + kRopeSlotsOffset + us * kRopeBytes};
            rc = rope.f32(ul);
            rsn = rope.f32(kRopeDim / 2 + ul);
          }
          process_warp<F>(p, t32, off >= 0 ? 0 : -1, 0, rc, rsn, RowRotated{rows_sa + us * kRowTmaBytes, rot_rx, w_lane},
                          lane, wb, wrope, nrec);
        }
        s_use = s_use == kSlots - 1 ? 0 : s_use + 1;
        s_fill = s_fill == kSlots - 1 ? 0 : s_fill + 1;
      }
      continue;  // the next chunk (every slot read above ended before its __syncwarp)
    } else if constexpr (R == 1) {
      // Rows and RoPE entries of program j copied into ring slot j % (ahead + 1), kRowsAhead
      // programs ahead: 6 KiB per warp in flight without holding registers; the RoPE entries by
      // cp.async, one commit group per program. The row (when the program has a token):
      //  - kRowsTma: one TMA tensor copy (tma_row) into the swizzled ring (RowSwizzled), waited
      //    for on its slot's barrier (its copy was issued: same t);
      //  - otherwise: cp.async per lane (dims 4*lane + 128*k) into the padded load layout (dim d
      //    at pooled_index(d)), in the same commit group as the RoPE entries (PooledSmem).
      // Either way the row is what process_warp reads. Slots are tracked by two rotating counters
      // and addressed through 32-bit shared addresses computed once.
      constexpr bool kTma = M == kRowsTmaSwz;
      constexpr uint32_t kRowBytes = kTma ? kRowTmaBytes : kPooledFloats * 4;
      constexpr int kSlots = kRowsAhead + 1;
      const uint64_t row_policy = !kTma && kRowsEvictFirst<C> ? l2_policy_evict_first() : 0;
      auto copy = [&](int j, int slot) {
        const int64_t tj = shfl64(role_t, j);
        if constexpr (kTma) {
          const uint32_t us = static_cast<uint32_t>(slot);
          if (tj >= 0) tma_row(rows_sa + us * kRowBytes, &kv_map, p, tj, rows_sa + kRowBarsOffset + 8u * us, lane);
        } else if (tj >= 0) {
          const float* src = (p.kv + tj * p.kv_stride) + 4 * lane;
          const uint32_t dst = row_dst_lane + static_cast<uint32_t>(slot) * kRowBytes;
  #pragma unroll
          for (int k = 0; k < 4; ++k) cp_async16_row<kRowsEvictFirst<C>>(dst + 4u * 144u * k, src + 128 * k, row_policy);
        }
        copy_rope(j, slot);
        cp_async_commit();
      };
      // exactly kRowsAhead groups before the loop (empty ones past the chunk), so that the wait
      // of iteration i (all but the newest kRowsAhead groups) covers program i's group
  #pragma unroll
      for (int j = 0; j < kRowsAhead; ++j) {
        if (j < nn) copy(j, j);
        else cp_async_commit();
      }
      int s_use = 0, s_fill = kRowsAhead;  // ring slots of programs i and i + kRowsAhead
      for (int i = 0; i < nn; ++i) {
        // slot s_fill is program i-1's: every read of it ended before the __syncwarp that closes
        // process_warp
        if (i + kRowsAhead < nn) copy(i + kRowsAhead, s_fill);
        else cp_async_commit();
        cp_async_wait<kRowsAhead>();  // this lane's copies of program i have landed
        __syncwarp();                  // ... and every lane's, visible to the warp
        const int64_t t = shfl64(role_t, i);
        const uint32_t us = static_cast<uint32_t>(s_use);
        if constexpr (kTma) {
          if (t >= 0) {
            row_barrier_wait(rows_sa + kRowBarsOffset + 8u * us, (row_parity >> us) & 1u);
            row_parity ^= 1u << us;
          }
        }
        // the insert: (page, row) or, NVFP4, the record's addresses (null: no insert)
        int64_t pg = -1, ir = 0;
        NvRecPtr nrec{nullptr, 0};
        if constexpr (F == kNv) {
          const int64_t off = shfl64(role_val, i);
          nrec.val = p.cache.base + off;
          nrec.sc_off = shfl64(role_sc_off, i);
          pg = off >= 0 ? 0 : -1;
        } else {
          pg = shfl64(role_page, i);
          ir = shfl64(role_r, i);
        }
        float rc = 0.0f, rsn = 0.0f;
        if constexpr (F != kNoRecord) {
          if (pg >= 0) read_rope(s_use, rc, rsn);
        }
        if (t >= 0) {
          // the row in its layout, the record by its addresses (NVFP4) or by (page, row)
          auto run = [&](auto row) {
            if constexpr (F == kNv) process_warp<F>(p, t, pg, ir, rc, rsn, row, lane, wb, wrope, nrec);
            else process_warp<F>(p, t, pg, ir, rc, rsn, row, lane, wb, wrope);
          };
          if constexpr (kTma) run(RowSwizzled{rows_sa + us * kRowBytes});
          else run(PooledSmem{rows_sa + us * kRowBytes});
        }
        s_use = s_use == kSlots - 1 ? 0 : s_use + 1;
        s_fill = s_fill == kSlots - 1 ? 0 : s_fill + 1;
      }
      continue;  // the next chunk (every slot read above ended before its __syncwarp)
    }
    float* const pooled = smem_pooled<R>(warp);
    PairRows A;
    int64_t t = shfl64(role_t, 0);
    if (t >= 0) {
  #pragma unroll
      for (int k = 0; k < 4; ++k) load_group<kRowsEvictFirst<C>>(p, t, lane, k, A);
    }
    if constexpr (F != kNoRecord) {
      // exactly kRopeAhead groups before the loop (empty ones past the chunk), so that the wait
      // of iteration i (all but the newest kRopeAhead groups) covers program i's group
  #pragma unroll
      for (int j = 0; j < kRopeAhead; ++j) {
        if (j < nn) rope_copy(j);
        else cp_async_commit();
      }
    }
    for (int i = 0; i < nn; ++i) {
      const int64_t tn = shfl64(role_t, i + 1 < nn ? i + 1 : 0);
      const int64_t t_next = i + 1 < nn ? tn : -1;
      const int64_t pg = shfl64(role_page, i);
      const int64_t ir = shfl64(role_r, i);
      float rc = 0.0f, rsn = 0.0f;
      if constexpr (F != kNoRecord) {
        // program i's copies were issued kRopeAhead programs ago; issue program i + ahead's
        if (i + kRopeAhead < nn) rope_copy(i + kRopeAhead);
        else cp_async_commit();
        cp_async_wait<kRopeAhead>();  // this lane's copies of program i have landed
        if (pg >= 0) read_rope(i % (kRopeAhead + 1), rc, rsn);
      }
      if (t >= 0) {
        pool_warp<kRowsEvictFirst<C>>(p, A, t_next, pooled, lane);
        process_warp<F>(p, t, pg, ir, rc, rsn, PooledPtr{pooled}, lane, wb, wrope);
      } else if (t_next >= 0) {
  #pragma unroll
        for (int k = 0; k < 4; ++k) load_group<kRowsEvictFirst<C>>(p, t_next, lane, k, A);
      }
      t = t_next;
    }
  }  // chunks
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

// ==================================================================== four-warp kernel (decode)
//
// compress_kernel_g4<R, F, kPcp>: one 128-thread block per program, for small grids such as decode:
// thread gt owns dims [4*gt, 4*gt + 4) for the loads, the pool and the writer. A decode layer is
// a chain of dependent round trips to memory, so the kernel is organised around latency:
//  - at most two dependent rounds of loads before the compute:
//      request program j: qsl[j], qsl[j+1] together with the metadata of token j
//        (speculation: in a decode-first batch qsl[j] == j; otherwise the metadata is loaded
//        again for qsl[j], one round more), then the kv row of s with its ring / prev_rows
//        predecessor and the RoPE row (the row used to come with the metadata: moving it to
//        the second round took 0.10-0.11 us off ratio-2 decode with per-layer buffers, none
//        with shared ones; docs/perf-notes.md session 8);
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
// kernel touches costs time per launch (session 7: one more line, 2.09 -> 2.22 us for ratio-1
// decode; this one less, -0.06 to -0.08 us for ratio 2), and the PCP test compiled into LDCs of
// line 0x300 at every request program.
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
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1)
      part = num::add_rn(part, __shfl_down_sync(0xFFFFFFFFu, part, h));
    const float rs = cmath::rms_inverse(__shfl_sync(0xFFFFFFFFu, part, 0), p.eps);
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

// Blocks of compress_stream_kernel<R, F, C> (128 threads) that the current device runs at
// once: SMs x resident blocks per SM (3 to 7 depending on R and F), queried once per kernel and
// device and cached (host-only queries, legal during stream capture). One cache per template
// instantiation: every instantiation has the same function type, so a cache keyed by the type
// would hand one kernel's occupancy to all the others.
template <int R, int F, int C, int M>
int64_t resident_blocks() {
  static std::atomic<int64_t> cache[64] = {};
  int dev = 0;
  DSV41KV_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 64;
  if (cached) {
    const int64_t v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int per_sm = 0, sms = 0;
  DSV41KV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, compress_stream_kernel<R, F, C, M>, 128, 0));
  DSV41KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t v = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * sms);
  if (cached) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

template <int R, int F, int C, int M>
void launch_compress_stream_c(const CompressParams& p, cudaStream_t stream, bool pdl) {
  int64_t blocks;
  CompressParams q = p;
  if constexpr (R == 2) {
    const int64_t warps = p.num_reqs + ((p.N + 1) / 2 + C - 1) / C;  // one chunk per warp
    if (warps <= 0) return;
    blocks = (warps + 3) / 4;
  } else {
    if (p.N <= 0) return;
    // A grid of one chunk per warp that leaves slots of the GPU empty (32K tokens: 256 blocks
    // where 924 fit) is widened up to what fits, down to kStreamMinTokensPerWarp tokens per warp
    // (the kernel splits the tokens evenly, stream_share): 41 -> 36 us at 32K. Larger grids keep
    // one chunk per warp: spreading 256K tokens evenly over the resident warps instead (each warp
    // a long contiguous stretch) was slower for both ratios (200 -> 206 us ratio 1, 295 -> 322 us
    // ratio 2; docs/perf-notes.md v13): the one-chunk grid keeps the warps that run at the same
    // time on neighbouring rows.
    const int64_t fit = resident_blocks<R, F, C, M>();
    // the grid's shape: stream_shape_r1 (a tapered tail on large grids)
    const StreamSplitR1 sp = stream_split_r1(p.N, C, fit, stream_shape_r1(p.N, C, fit));
    blocks = sp.blocks;
    for (int k = 0; k < kStreamSegs; ++k) q.seg[k] = sp.seg[k];
  }
  // the kv rows' tensor map (kRowsTma; devices before sm_90 run the kernel's synchronous
  // fallback copy, which does not read it: tensor maps need compute capability 9.0)
  CUtensorMap kv_map{}, rope_map{};
  if constexpr (M == kRowsTmaSwz) {
    if (device_is_sm90_or_newer()) kv_map = kv_rows_tensor_map(p.kv, p.N, p.kv_stride, true);
  } else if constexpr (M == kRowsTmaRot) {  // (picked on sm_90+ only)
    kv_map = kv_rows_tensor_map(p.kv, p.N, p.kv_stride, false);
    rope_map = rope_table_tensor_map(p.table, p.table_rows);
  }
  launch_kernel(compress_stream_kernel<R, F, C, M>, dim3(static_cast<unsigned>(blocks)), dim3(128), stream,
                pdl, q, kv_map, rope_map);
}

// Programs per chunk C of the streaming kernel (at most 32: one lane resolves each program's
// metadata): kChunkLarge (8) for grids of at least 4 waves of resident blocks, else kChunkSmall
// (16; cuda_tuning.hpp), for both ratios, except ratio-1 NVFP4 which keeps 16. Smaller chunks keep
// the warps that run at the same time on nearer rows: 256K ratio 2 nvfp4 301-304 -> 290-291 us,
// v4 297-299 -> 295-296; ratio 1 (32 -> 16 -> 8) v4 200-203 -> 194-195 -> 191-193, mxfp8 194-198
// -> 189-190 -> 186-188, but nvfp4 238 -> 243-245 with 8 (and with its warp writer 215 -> 219-221;
// docs/perf-notes.md v13, v14). Smaller grids keep 16: 32K ratio 2 ran 47 us with 16 and 54 with
// 8 (512 blocks = 1.3 waves of 396 resident blocks where 16 makes one partial wave); 32K ratio 1
// widens its grid anyway.
template <int R, int F>
void launch_compress_stream(const CompressParams& p, cudaStream_t stream, bool pdl) {
  int c = stream_chunk_override();
  if (c == 0) {
    const int64_t chunks8 = ((R == 2 ? (p.N + 1) / 2 : p.N) + kChunkLarge - 1) / kChunkLarge;
    const int64_t blocks8 = ((R == 2 ? p.num_reqs : 0) + chunks8 + 3) / 4;
    const bool large = (R == 2 || F != kNv) && blocks8 >= 4 * resident_blocks<R, F, kChunkLarge, (R == 1 ? kRowsTmaSwz : kRowsCp)>();
    c = large ? kChunkLarge : kChunkSmall;
  }
  // the chunk-8 ratio-1 kernel's TMA copies address a token by a 32-bit coordinate
  if (R == 1 && c == kChunkLarge && p.N > INT32_MAX) c = kChunkSmall;
  if (c == kChunkLarge) {
    launch_compress_stream_c<R, F, kChunkLarge, (R == 1 ? kRowsTmaSwz : kRowsCp)>(p, stream, pdl);
    return;
  }
  if constexpr (R == 1 && F == kNv) {
    // rows and RoPE entries by TMA (kRowsTmaRot): sm_90+, 32-bit coordinates, a 16-byte aligned
    // table (a tensor map's global address), 8-byte aligned records (one store of the NoPE code
    // words), the scale offset from the values in 32 bits (S <= 2^22); grids of at least two
    // waves of one-chunk warps (256K: the TMA pipeline's gain; 32K, whose widened grid gives each
    // warp ~9 tokens, ran 34.5 -> 36.0 us with it, session 13: the per-warp start costs more)
    if (device_is_sm90_or_newer() && p.N <= INT32_MAX && p.table_rows >= 1 && p.table_rows <= INT32_MAX &&
        reinterpret_cast<uintptr_t>(p.table) % 16 == 0 && reinterpret_cast<uintptr_t>(p.cache.base) % 8 == 0 &&
        p.cache.page_stride_bytes % 8 == 0 && p.cache.S <= (int64_t{1} << 22) && stream_rows_override() != 1 &&
        (stream_rows_override() == 2 || (p.N + 4 * kChunkSmall - 1) / (4 * kChunkSmall) >=
                                            2 * resident_blocks<R, F, kChunkSmall, kRowsTmaRot>())) {
      launch_compress_stream_c<R, F, kChunkSmall, kRowsTmaRot>(p, stream, pdl);
      return;
    }
  }
  launch_compress_stream_c<R, F, kChunkSmall, kRowsCp>(p, stream, pdl);
}

template <int R, int F>
void launch_compress_g4(const CompressParams& p, cudaStream_t stream, bool pdl) {
  const int64_t programs = compress_programs(R, p.N, p.num_reqs);
  if (programs <= 0) return;
  const dim3 grid(static_cast<unsigned>(programs));
  if constexpr (R == 2) {
    if (p.pcp) {
      launch_kernel(compress_kernel_g4<R, F, true>, grid, dim3(128), stream, pdl, p);
      return;
    }
  }
  launch_kernel(compress_kernel_g4<R, F, false>, grid, dim3(128), stream, pdl, p);
}

template <int F>
void launch_compress(const CompressParams& p, int ratio, cudaStream_t stream, bool pdl) {
  const int force = program_warps_override();
  const bool small = force == 4 || (force != 1 && compress_programs(ratio, p.N, p.num_reqs) <= kSmallGridPrograms);
  if (ratio == 1) {
    if (small) launch_compress_g4<1, F>(p, stream, pdl);
    else launch_compress_stream<1, F>(p, stream, pdl);
  } else {
    if (small) launch_compress_g4<2, F>(p, stream, pdl);
    else launch_compress_stream<2, F>(p, stream, pdl);
  }
}

}  // namespace dsv41kv::detail::cuda
