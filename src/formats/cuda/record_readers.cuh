// Device readers of the record formats (SPEC 5.3): the dequantized bf16 values of E consecutive
// dims of one state, element-wise the readers of records.hpp (rec::read_*), so the same bits as the
// CPU's gather. The gather kernel reads a state with them today; the sparse-attention kernels will
// read their keys and values through the same functions.
#pragma once

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
    float v[16];
    if constexpr (F == kNv) {
      const uint2 q = *reinterpret_cast<const uint2*>(pg + Nvfp4Layout::value_offset(S, r) + d0 / 2);
      const float sc = e4m3_decode_finite(pg[Nvfp4Layout::scale_offset(S, r) + d0 / 16]);
      const uint32_t qw[2] = {q.x, q.y};
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const uint8_t nib = static_cast<uint8_t>((qw[k / 8] >> (4 * (k % 8))) & 0xFu);
        v[k] = num::mul_rn(num::e2m1_decode(nib), sc);
      }
    } else {
      const uint8_t* q8;
      float sc;
      if constexpr (F == kV4) {
        q8 = pg + V4Layout::value_offset(S, r) + d0;
        sc = num::ue8m0_scale(pg[V4Layout::scale_offset(S, r) + d0 / 64]);
      } else if constexpr (F == kMx) {
        q8 = pg + Mxfp8Layout::value_offset(S, r) + d0;
        sc = num::ue8m0_scale(pg[Mxfp8Layout::scale_offset(S, r) + d0 / 32]);
      } else {
        q8 = pg + r * row_stride_bytes + d0;
        sc = fp8_scale;
      }
      const uint4 q = *reinterpret_cast<const uint4*>(q8);
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 16; ++k)
        v[k] = num::mul_rn(e4m3_decode_finite(static_cast<uint8_t>(qw[k / 4] >> (8 * (k % 4)))), sc);
    }
    bf16_encode_packed<16>(v, w);
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
