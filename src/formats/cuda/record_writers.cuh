// Cooperative device writers of the record formats (SPEC 3.3, 5.2), element-wise the same
// operations as the per-state writers of records.hpp, so the same bytes.
//
// Thread layout used by the writers ("writer layout"): a program (one token) is executed by
// 512/E threads; thread gt owns the E consecutive dims [E*gt, E*gt + E). E = 16 (one warp per
// token) or E = 4 (four warps per token). Every quantization tile (64, 32 or 16 dims) spans
// tile/E consecutive lanes of one warp, reduced with xor-shuffles over all 32 lanes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/cuda/memory.cuh"
#include "core/fast_divmod.hpp"
#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"
#include "formats/cuda/fast_numerics.cuh"

namespace dsv41kv::detail::cuda {

// Record writer selector of the kernels: a RecordFormat value, or kNoRecord (compress only).
inline constexpr int kNoRecord = -1;
inline constexpr int kV4 = static_cast<int>(RecordFormat::V4_584);
inline constexpr int kMx = static_cast<int>(RecordFormat::MXFP8_528);
inline constexpr int kNv = static_cast<int>(RecordFormat::NVFP4_288);
inline constexpr int kBf16 = static_cast<int>(RecordFormat::PLAIN_BF16);
inline constexpr int kFp8 = static_cast<int>(RecordFormat::PLAIN_FP8);

// The one switch from a run-time record format to the kernels' template parameter (host code):
// fn(std::integral_constant<int, F>{}) with F the format's selector.
template <class Fn>
void with_record_format(RecordFormat f, Fn&& fn) {
  switch (f) {
    case RecordFormat::V4_584: fn(std::integral_constant<int, kV4>{}); return;
    case RecordFormat::MXFP8_528: fn(std::integral_constant<int, kMx>{}); return;
    case RecordFormat::NVFP4_288: fn(std::integral_constant<int, kNv>{}); return;
    case RecordFormat::PLAIN_BF16: fn(std::integral_constant<int, kBf16>{}); return;
    case RecordFormat::PLAIN_FP8: fn(std::integral_constant<int, kFp8>{}); return;
  }
  invalid_argument("record format: unknown value " + std::to_string(static_cast<int>(f)));
}

// ---------------------------------------------------------------- RoPE in the writer layout

// The cos/sin values of the RoPE pairs a thread owns (dims >= 448 only; others load nothing),
// from the table row `trow` (64 floats, 16-byte aligned). d0 = first dim of the thread.
template <int E>
__device__ __forceinline__ void rope_load(int d0, const float* trow, float (&c)[E / 2],
                                          float (&s)[E / 2]) {
  if (d0 < kNopeDim) return;
  const int j0 = (d0 - kNopeDim) / 2;  // first pair index
  if constexpr (E == 16) {
    const float4 c0 = ld4(trow + j0), c1 = ld4(trow + j0 + 4);
    const float4 s0 = ld4(trow + 32 + j0), s1 = ld4(trow + 32 + j0 + 4);
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w;
    c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w;
    s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
  } else {
    const float2 cc = *reinterpret_cast<const float2*>(trow + j0);
    const float2 ss = *reinterpret_cast<const float2*>(trow + 32 + j0);
    c[0] = cc.x; c[1] = cc.y;
    s[0] = ss.x; s[1] = ss.y;
  }
}
// y = x, then the forward RoPE of SPEC 1.4 on the pairs of dims >= 448 this thread owns, with
// cos/sin from rope_load.
template <int E>
__device__ __forceinline__ void rope_apply(int d0, const float (&c)[E / 2], const float (&s)[E / 2],
                                           const float (&x)[E], float (&y)[E]) {
#pragma unroll
  for (int i = 0; i < E; ++i) y[i] = x[i];
  if (d0 < kNopeDim) return;
#pragma unroll
  for (int i = 0; i < E / 2; ++i)
    num::rope_forward(x[2 * i], x[2 * i + 1], c[i], s[i], y[2 * i], y[2 * i + 1]);
}
// Both: table row `trow` (64 floats, 16-byte aligned), d0 = first dim of the thread.
template <int E>
__device__ __forceinline__ void rope_thread(int d0, const float* trow, const float (&x)[E],
                                            float (&y)[E]) {
  float c[E / 2], s[E / 2];
  rope_load<E>(d0, trow, c, s);
  rope_apply<E>(d0, c, s, x, y);
}

// ---------------------------------------------------------------- cooperative record writers

// Where records go: a validated CacheView flattened for the kernels.
// (field order: what the writers read first, see CompressParams)
struct CacheDst {
  uint8_t* base = nullptr;          // page 0, byte 0
  int64_t S = 1;                    // states per page
  int64_t page_stride_bytes = 0;
  int64_t capacity = 0;             // num_pages * S: slots >= capacity are skipped
  FastDivmod S_div;                 // division by S (slot -> page, row)
  int64_t row_stride_bytes = 0;     // plain rows
  float fp8_inv = 1.0f;             // plain fp8: fp32(1 / sigma), IEEE division on the host
};
// The kernels' view of a validated cache (host code).
inline CacheDst make_cache_dst(const CacheView& c) {
  const RecordInfo& ri = record_info(c.format);
  const int64_t es = static_cast<int64_t>(dtype_size(ri.element));
  CacheDst d;
  d.base = static_cast<uint8_t*>(c.base);
  d.S = c.states_per_page;
  d.S_div = FastDivmod::make(c.states_per_page);
  d.page_stride_bytes = c.page_stride * es;
  d.row_stride_bytes = c.row_stride * es;
  d.capacity = c.num_pages * c.states_per_page;
  d.fp8_inv = c.format == RecordFormat::PLAIN_FP8 ? num::div_rn(1.0f, c.fp8_scale) : 1.0f;
  return d;
}

// Max over `kLanes` consecutive lanes (a power of two dividing 32); every lane must call it.
template <int kLanes>
__device__ __forceinline__ uint32_t tile_reduce_bits(uint32_t m) {
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  return m;
}

// Writes the record of one state (slot already bounded) cooperatively: thread gt of the
// program owns dims [E*gt, E*gt + E); x = latent values, y = x after RoPE. All 32 lanes of every
// warp of the program must call it (shuffles).
// write_record_at: the same with the slot already split into (page, r) = divmod(slot, c.S).
template <int F, int E>
__device__ __forceinline__ void write_record_at(const CacheDst& c, int64_t page, int64_t r, int gt,
                                                const float (&x)[E], const float (&y)[E]) {
  static_assert(E == 16 || E == 4);
  const int d0 = E * gt;
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  if constexpr (F == kV4) {
    const uint32_t mb = tile_reduce_bits<64 / E>(local_amax_bits<E>(x));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint8_t* val = pg + V4Layout::value_offset(c.S, r);
    uint8_t* sc = pg + V4Layout::scale_offset(c.S, r);
    if (d0 < kNopeDim) {
      uint32_t w[E / 4];
      const uint8_t sb = ue8m0_thread<E>(x, amax, fin, w);
      store_words<E / 4>(val + d0, w);
      if (d0 % 64 == 0) sc[d0 / 64] = sb;
    } else {
      uint32_t w[E / 2];
      bf16_encode_packed<E>(y, w);
      store_words<E / 2>(val + kNopeDim + 2 * (d0 - kNopeDim), w);
      if (d0 == kNopeDim) sc[7] = 0;
    }
  } else if constexpr (F == kMx) {
    const uint32_t mb = tile_reduce_bits<32 / E>(local_amax_bits<E>(y));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint32_t w[E / 4];
    const uint8_t sb = ue8m0_thread<E>(y, amax, fin, w);
    store_words<E / 4>(pg + Mxfp8Layout::value_offset(c.S, r) + d0, w);
    if (d0 % 32 == 0) pg[Mxfp8Layout::scale_offset(c.S, r) + d0 / 32] = sb;
  } else if constexpr (F == kNv) {
    const uint32_t mb = tile_reduce_bits<16 / E>(local_amax_bits<E>(y));
    const float amax = num::u2f(mb);
    const bool fin = bits_finite(mb);
    uint8_t nib[E];
    uint8_t sb;
    if (!fin) {
#pragma unroll
      for (int i = 0; i < E; ++i) nib[i] = 0;
      sb = 0x7F;
    } else {
      // num::nvfp4_quantize_tile, element-wise
      float thr[7];
      sb = nv_tile_scale(amax, thr);
#pragma unroll
      for (int i = 0; i < E; ++i) nib[i] = e2m1_quotient_code(y[i], thr);
    }
    uint8_t* val = pg + Nvfp4Layout::value_offset(c.S, r) + d0 / 2;
    if constexpr (E == 16) {
      uint32_t w[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        w[k] = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[k] |= static_cast<uint32_t>(nib[8 * k + 2 * b] | (nib[8 * k + 2 * b + 1] << 4))
                  << (8 * b);
      }
      store_words<2>(val, w);
    } else {
      store_u16(val, static_cast<uint32_t>(nib[0] | (nib[1] << 4)) |
                         (static_cast<uint32_t>(nib[2] | (nib[3] << 4)) << 8));
    }
    if (d0 % 16 == 0) pg[Nvfp4Layout::scale_offset(c.S, r) + d0 / 16] = sb;
  } else if constexpr (F == kBf16) {
    uint32_t w[E / 2];
    bf16_encode_packed<E>(y, w);
    store_words<E / 2>(pg + r * c.row_stride_bytes + 2 * d0, w);
  } else if constexpr (F == kFp8) {
    uint32_t w[E / 4];
#pragma unroll
    for (int i = 0; i < E / 4; ++i) {
      w[i] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w[i] |= static_cast<uint32_t>(rec::plain_fp8_encode(y[4 * i + b], c.fp8_inv)) << (8 * b);
    }
    store_words<E / 4>(pg + r * c.row_stride_bytes + d0, w);
  }
}

// The V4 record of one state written by one warp in the writer layout E = 16 (the streaming
// kernel), without the divergence of write_record_at<kV4, 16> (where lanes 0-27 quantise the
// NoPE tiles and lanes 28-31 then rotate and encode 8 RoPE pairs each, one path after the
// other): lanes 0-27 quantise their NoPE dims as there, and then every lane l rotates RoPE pair l
// (dims 448 + 2l, 449 + 2l with cos/sin entries l and 32 + l of the table row) and stores one
// bf16x2 word at value byte 448 + 4l. xr0/xr1 are the latent values of the pair (the same
// bf16-rounded values the owning lane holds in x), cs/sn its table entries. Element-wise the
// same operations as write_record_at (num::rope_forward, bf16_encode_packed, ue8m0_thread), so
// the same bytes. All 32 lanes must call it (shuffles).
__device__ __forceinline__ void write_v4_warp(const CacheDst& c, int64_t page, int64_t r, int lane,
                                              const float (&x)[16], float xr0, float xr1,
                                              float cs, float sn) {
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  uint8_t* val = pg + V4Layout::value_offset(c.S, r);
  uint8_t* sc = pg + V4Layout::scale_offset(c.S, r);
  const uint32_t mb = tile_reduce_bits<4>(local_amax_bits<16>(x));
  if (lane < kNopeDim / 16) {
    uint32_t w[4];
    const uint8_t sb = ue8m0_thread<16>(x, num::u2f(mb), bits_finite(mb), w);
    store_words<4>(val + 16 * lane, w);
    if (lane % 4 == 0) sc[lane / 4] = sb;
  }
  if (lane == kNopeDim / 16) sc[7] = 0;
  float y[2];
  num::rope_forward(xr0, xr1, cs, sn, y[0], y[1]);
  uint32_t w[1];
  bf16_encode_packed<2>(y, w);
  store_words<1>(val + kNopeDim + 4 * lane, w);
}

// The NVFP4 record of one state written by one warp in the writer layout E = 16 (the streaming
// kernel), the way write_v4_warp does V4: lanes 0-27 quantise their NoPE tile (dims 16l..16l+15,
// whose values are the bf16 latent itself, `lw` packed two per word) with e2m1_raw_bf16x2, and
// every lane l quantises the RoPE pair l it rotated (q0, q1: dims 448 + 2l, 449 + 2l; RoPE tile
// 28 + l/8 spans 8 lanes, reduced with shuffles) and stores its one value byte. Replaces
// write_record_at<kNv, 16>, where lanes 28-31 first gathered 16 rotated values with 16 shuffles
// per lane and then ran 16 scalar e2m1 decisions each while the other lanes ran theirs: the same
// scale and the same decisions per element (nv_tile_scale, e2m1_quotient_code), so the same bytes.
// All 32 lanes must call it (shuffles).
// write_nv_warp_at: the same with the record's value and scale addresses already computed.
// rot: the lane's rotation r of its four 4-value chunks (RowRotated: lw[2c], lw[2c+1] hold dims
// 16 lane + 4 (c ^ r) .. + 3), given as the pack selector of r & 1 (e2m1_pack8_raw) and r & 2; 0 for
// dims in order.
struct NvRot {
  uint32_t sel = 0x6420u;  // e2m1_pack8_raw selector: 0x2064 when r & 1
  bool swap = false;       // r & 2: the two code words change places
};
// kAligned8: `val` is 8-byte aligned (the caller checked the cache's base and page stride), so
// the code words go out as one 8-byte store without store_words' alignment branches.
template <bool kAligned8 = false>
__device__ __forceinline__ void write_nv_warp_at(uint8_t* val, uint8_t* sc, int lane, const uint32_t (&lw)[8],
                                                 float q0, float q1, NvRot rot = {}) {
  if (lane < kNopeDim / 16) {
    // tile amax from the packed bf16 words: |v| bits of a bf16 value are its fp32 |v| bits >> 16
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = __vmaxu2(m, lw[i] & 0x7FFF7FFFu);
    const uint32_t mb = max(m & 0xFFFFu, m >> 16) << 16;
    uint32_t out[2] = {0u, 0u};
    uint8_t sb = 0x7F;
    if (bits_finite(mb)) {
      sb = nv_tile_scale_byte(num::u2f(mb));
      const E2m1Select S = e2m1_select_bf16x2(sb);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint32_t cc[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) cc[b] = e2m1_raw_bf16x2(lw[4 * k + b], S);
        out[k] = e2m1_pack8_raw(cc, rot.sel);
      }
    }
    if (rot.swap) {
      const uint32_t o0 = out[0];
      out[0] = out[1];
      out[1] = o0;
    }
    if constexpr (kAligned8) *reinterpret_cast<uint2*>(val + 8 * lane) = make_uint2(out[0], out[1]);
    else store_words<2>(val + 8 * lane, out);
    sc[lane] = sb;
  }
  // RoPE tiles: pair `lane` of tile 28 + lane/8
  const uint32_t mb = tile_reduce_bits<8>(max(num::f2u(q0) & 0x7FFFFFFFu, num::f2u(q1) & 0x7FFFFFFFu));
  uint32_t byte = 0;
  uint8_t sb = 0x7F;
  if (bits_finite(mb)) {
    // both values' decisions in bf16x2 (e2m1_raw_f32x2) rather than two scalar ones
    sb = nv_tile_scale_byte(num::u2f(mb));
    const uint32_t c = e2m1_raw_f32x2(q0, q1, e2m1_select_bf16x2(sb));
    byte = (c & 0x0Fu) | ((c >> 12) & 0xF0u);
  }
  val[kNopeDim / 2 + lane] = static_cast<uint8_t>(byte);
  if (lane % 8 == 0) sc[kNopeDim / 16 + lane / 8] = sb;
}
__device__ __forceinline__ void write_nv_warp(const CacheDst& c, int64_t page, int64_t r, int lane,
                                              const uint32_t (&lw)[8], float q0, float q1) {
  uint8_t* pg = c.base + page * c.page_stride_bytes;
  write_nv_warp_at(pg + Nvfp4Layout::value_offset(c.S, r), pg + Nvfp4Layout::scale_offset(c.S, r), lane, lw, q0,
                   q1);
}

template <int F, int E>
__device__ __forceinline__ void write_record(const CacheDst& c, int64_t slot, int gt,
                                             const float (&x)[E], const float (&y)[E]) {
  int64_t page, r;
  divmod_fast(slot, c.S_div, page, r);
  write_record_at<F, E>(c, page, r, gt, x, y);
}

}  // namespace dsv41kv::detail::cuda
