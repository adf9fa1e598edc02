// Device readers of the record formats (SPEC 5.3): the dequantized bf16 values of E consecutive
// dims of one state, element-wise the readers of records.hpp (rec::read_*), so the same bits as the
// CPU's gather. The gather kernel reads a state with them today; the sparse-attention kernels will
// read their keys and values through the same functions.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dsv41kv/records.hpp"
#include "formats/cuda/fast_numerics.cuh"
#include "formats/cuda/record_writers.cuh"

namespace dsv41kv::detail::cuda {

// The bf16 bits of dims [d0, d0 + E) of state r of the page at `pg` (S states per page; plain rows
// at pg + r * row_stride_bytes; fp8_scale: sigma of plain fp8 rows). F: a RecordFormat value.
template <int F, int E>
__device__ __forceinline__ void read_record_dims(const uint8_t* pg, int64_t S, int64_t r, int64_t row_stride_bytes,
                                                 float fp8_scale, int d0, uint16_t (&o)[E]) {
  if constexpr (F == kBf16) {
    const auto* row = reinterpret_cast<const uint16_t*>(pg + r * row_stride_bytes);
#pragma unroll
    for (int k = 0; k < E; ++k) o[k] = row[d0 + k];
  } else {
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const int d = d0 + k;
      if constexpr (F == kV4) o[k] = rec::read_v4_584(pg, S, r, d);
      else if constexpr (F == kMx) o[k] = rec::read_mxfp8_528(pg, S, r, d);
      else if constexpr (F == kNv) o[k] = rec::read_nvfp4_288(pg, S, r, d);
      else o[k] = rec::read_plain_fp8(pg + r * row_stride_bytes, d, fp8_scale);
    }
  }
}

// The scale of a 16-dim chunk of a quantized record from its scale byte (F != kBf16): the tile's
// ue8m0 power of two (584, 528), the decoded e4m3 block scale (288), the plain fp8 cache's sigma.
template <int F>
__device__ __forceinline__ float chunk_scale(uint8_t byte, float fp8_scale) {
  if constexpr (F == kNv) return e4m3_decode_finite(byte);
  else if constexpr (F == kFp8) return fp8_scale;
  else return num::ue8m0_scale(byte);
}
// The 16 dims of a chunk from its raw bytes (decode_values16: as floats; decode_chunk16: as 8
// packed bf16x2 words): 16 e4m3 codes in qw[0..3]
// (byte k = dim k), or for 288 records 16 e2m1 nibbles in qw[0..1] (nibble k = dim k), times the
// chunk's scale (chunk_scale), each product rounded as rec::read_* rounds it.
template <int F>
__device__ __forceinline__ void decode_values16(const uint32_t (&qw)[4], float sc, float (&v)[16]) {
  if constexpr (F == kNv) {
    // e2m1 by its f16 bit pattern: nibble s|eem as f16 bits s << 15 | eem << 9 is the e2m1 value
    // times 2^-14 (ee > 0: 2^(ee - 15) 1.m; ee = 0: m 2^-15, the subnormal), exact; times
    // sc 2^14 in fp32 it is e2m1 * sc exactly (a product of 2 and 4 significant bits, sc of an
    // e4m3 byte: 2^-9 .. 448 or 0, NaN alike), so num::mul_rn(num::e2m1_decode(n), sc) bit for bit
    const float sc14 = sc * 16384.0f;
#pragma unroll
    for (int k = 0; k < 16; k += 2) {
      const uint32_t b = (qw[k / 8] >> (4 * (k % 8))) & 0xFFu;  // nibbles k (low) and k + 1
      const uint32_t t = (b & 0xFu) | ((b & 0xF0u) << 12);       // one nibble per 16-bit half
      const uint32_t h = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      v[k] = num::mul_rn(f.x, sc14);
      v[k + 1] = num::mul_rn(f.y, sc14);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; k += 2) {
      const float2 f = e4m3x2_decode_finite(static_cast<uint16_t>(qw[k / 4] >> (8 * (k % 4))));
      v[k] = num::mul_rn(f.x, sc);
      v[k + 1] = num::mul_rn(f.y, sc);
    }
  }
}
// The 288 record's 16 values by table: the bf16 of the 8 e2m1 magnitudes (0, 0.5, 1, 1.5, 2, 3,
// 4, 6) times sc, exact (2 and 4 significant bits; sc an e4m3 value, finite: a NaN sc returns
// false), as a table of low bytes and one of high bytes that PRMT indexes by 4 nibbles at once;
// the nibble's sign flips the high byte's top bit (e2m1 -x times sc is -(x sc), a zero included).
// About 3 instructions a value instead of the floats' ~7. Equal to decode_chunk16_sw bit for bit
// (RecordReadersGpu.NvfpTableDecodeEqualsTheExactDecodeOnEveryScaleAndNibble).
__device__ __forceinline__ bool nv_chunk16_table(const uint32_t (&qw)[4], float sc, uint32_t (&w)[8]) {
  const uint32_t t01 = bf16x2_rn_hw(num::mul_rn(0.0f, sc), num::mul_rn(0.5f, sc));
  const uint32_t t23 = bf16x2_rn_hw(sc, num::mul_rn(1.5f, sc));
  const uint32_t t45 = bf16x2_rn_hw(num::mul_rn(2.0f, sc), num::mul_rn(3.0f, sc));
  const uint32_t t67 = bf16x2_rn_hw(num::mul_rn(4.0f, sc), num::mul_rn(6.0f, sc));
  const uint32_t lo0 = __byte_perm(t01, t23, 0x6420), lo1 = __byte_perm(t45, t67, 0x6420);
  const uint32_t hi0 = __byte_perm(t01, t23, 0x7531), hi1 = __byte_perm(t45, t67, 0x7531);
#pragma unroll
  for (int g = 0; g < 4; ++g) {  // values 4 g .. 4 g + 3: nibbles of bits [16 (g % 2), +16) of qw[g / 2]
    const uint32_t x = (qw[g / 2] >> (16 * (g % 2))) & 0xFFFFu;
    // x's nibbles as selectors: __byte_perm uses their magnitude bits (s & 7) only
    const uint32_t L = __byte_perm(lo0, lo1, x);
    uint32_t H = __byte_perm(hi0, hi1, x);
    // byte k's top bit <- nibble k's sign: bits 3, 7, 11, 15 of x
    H ^= __byte_perm(x << 4, x, 0x5140) & 0x80808080u;
    w[2 * g] = __byte_perm(L, H, 0x5140);
    w[2 * g + 1] = __byte_perm(L, H, 0x7362);
  }
  return sc == sc;
}

// Its two forms apart, so that several chunks can be converted without a branch between them: the
// hardware conversion (hw: the right bits unless a value is a NaN, which it reports by returning
// false) and the exact one (sw, for a chunk where hw returned false).
template <int F>
__device__ __forceinline__ bool decode_chunk16_hw(const uint32_t (&qw)[4], float sc, uint32_t (&w)[8]) {
  if constexpr (F == kNv) {
    return nv_chunk16_table(qw, sc, w);
  } else {
    float v[16];
    decode_values16<F>(qw, sc, v);
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // pair by pair: a value is dead once packed
      w[i] = bf16x2_rn_hw(v[2 * i], v[2 * i + 1]);
      ok = ok && bf16_hw_ok2(v[2 * i], v[2 * i + 1]);
    }
    return ok;
  }
}
template <int F>
__device__ __forceinline__ void decode_chunk16_sw(const uint32_t (&qw)[4], float sc, uint32_t (&w)[8]) {
  float v[16];
  decode_values16<F>(qw, sc, v);
  bf16_encode_packed_sw<16>(v, w);
}
// Both in one (the hardware conversion with its NaN fallback, bf16_encode_packed).
template <int F>
__device__ __forceinline__ void decode_chunk16(const uint32_t (&qw)[4], float sc, uint32_t (&w)[8]) {
  float v[16];
  decode_values16<F>(qw, sc, v);
  bf16_encode_packed<16>(v, w);
}

// The fast form of read_record_dims<F, 16> for the attention's key gather: dims [d0, d0 + 16)
// (d0 % 16 == 0) of state r as 8 packed bf16x2 words (even dim in the low half), with one or two
// vector loads of the state's bytes and one load of its scale (the same layout offsets,
// records.hpp), the hardware e4m3 decode (e4m3_decode_finite, equal to num::e4m3_decode on every
// finite byte; a NaN byte decodes to a NaN either way) and the hardware bf16 conversion with its
// NaN fallback (bf16_encode_packed): the same bits as read_record_dims for every byte pattern
// (RecordReadersGpu.ChunkReaderEqualsTheExactReader in tests/formats/test_record_readers_gpu.cu,
// random pages of every format, every state and chunk). The vector loads need 16-byte aligned
// chunks (8-byte for the 288 record's values): `aligned` says the page and row strides and the
// base allow them (decided once per cache on the host); otherwise the bytes are read one by one.
template <int F>
__device__ __forceinline__ void read_record_chunk16(const uint8_t* pg, int64_t S, int64_t r, int64_t row_stride_bytes,
                                                    float fp8_scale, int d0, bool aligned, uint32_t (&w)[8]) {
  if (!aligned) {
    uint16_t o[16];
    read_record_dims<F, 16>(pg, S, r, row_stride_bytes, fp8_scale, d0, o);
    pack_bf16<16>(o, w);
    return;
  }
  if constexpr (F == kBf16 || (F == kV4)) {
    if (F == kBf16 || d0 >= kNopeDim) {
      const uint8_t* src = F == kBf16 ? pg + r * row_stride_bytes + 2 * d0
                                      : pg + V4Layout::value_offset(S, r) + kNopeDim + 2 * (d0 - kNopeDim);
      const uint4 a = *reinterpret_cast<const uint4*>(src), b = *reinterpret_cast<const uint4*>(src + 16);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
      return;
    }
  }
  if constexpr (F == kBf16) {
    return;
  } else {
    uint32_t qw[4] = {0, 0, 0, 0};
    uint8_t sb = 0;
    if constexpr (F == kNv) {
      const uint2 q = *reinterpret_cast<const uint2*>(pg + Nvfp4Layout::value_offset(S, r) + d0 / 2);
      qw[0] = q.x, qw[1] = q.y;
      sb = pg[Nvfp4Layout::scale_offset(S, r) + d0 / 16];
    } else {
      const uint8_t* q8;
      if constexpr (F == kV4) {
        q8 = pg + V4Layout::value_offset(S, r) + d0;
        sb = pg[V4Layout::scale_offset(S, r) + d0 / 64];
      } else if constexpr (F == kMx) {
        q8 = pg + Mxfp8Layout::value_offset(S, r) + d0;
        sb = pg[Mxfp8Layout::scale_offset(S, r) + d0 / 32];
      } else {
        q8 = pg + r * row_stride_bytes + d0;
      }
      const uint4 q = *reinterpret_cast<const uint4*>(q8);
      qw[0] = q.x, qw[1] = q.y, qw[2] = q.z, qw[3] = q.w;
    }
    decode_chunk16<F>(qw, chunk_scale<F>(sb, fp8_scale), w);
  }
}

// Whether read_record_chunk16 may use its vector loads for a cache of format F at `base` with
// these strides (bytes): every chunk it reads is then 16-byte aligned (8-byte for 288 values).
inline bool record_chunks_aligned(int F, const void* base, int64_t page_stride_bytes, int64_t row_stride_bytes) {
  const int64_t a = F == kNv ? 8 : 16;
  const bool rows = (F == kBf16 || F == static_cast<int>(RecordFormat::PLAIN_FP8)) ? row_stride_bytes % a == 0 : true;
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && page_stride_bytes % a == 0 && rows;
}

}  // namespace dsv41kv::detail::cuda
