// The 64-head tile of sparse MLA with sink on sm_90a warpgroup tensor cores (docs/cuda.md,
// "Sparse MLA on warpgroup tensor cores"). A CTA of two warpgroups (8 warps, 256 threads) owns
// one query token x 64 heads x a run of 64-key blocks of the token's key list, as the mma.sync
// mainloop of sparse_mla.cuh does, with the same sources, produce step, epilogue and workspace:
//   * Q [64 x 512] and two key tiles [64 x 512] (block b + 1 is produced while block b is
//     consumed) in shared memory, 128-byte swizzled (core/cuda/wgmma.cuh);
//   * S: warpgroup 0 computes the scores over all 512 dims for all 64 heads x 64 keys (32
//     wgmma m64n64k16, Q and K from shared memory);
//   * online softmax in warpgroup 0's registers (each row of a quad of lanes); P (hi, lo) and each
//     row's rescale factor go to warpgroup 1 through shared memory (FlashMLA's split);
//     P = exp(z - m) in fp32 is split into bf16 hi = bf16(P) and lo = bf16(P - hi), the A
//     operands of two products (P's rounding error, 2^-9 of P for hi alone, becomes ~2^-17);
//   * O: warpgroup w owns dims [256 w, 256 w + 256) of all 64 rows (128 fp32 registers a thread):
//     O = alpha O + P_hi V + P_lo V with wgmma m64n256k16, A from registers (warpgroup 0) or from
//     shared memory (warpgroup 1), B = the key tile read MN-major (K = V);
//   * sparse_mla_wg_kernel (prefill's bf16 rows): the next block's rows are copied by all 8 warps
//     (cp.async) while this block's S, softmax and PV run; its tile is free once both
//     warpgroups' PV of the previous block has completed;
//   * sparse_mla_ws_kernel (decode's records): a third warpgroup gathers and dequantizes (below).
#pragma once

#include "attention/cuda/sparse_mla.cuh"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/wgmma.cuh"

namespace dsv41kv::detail::cuda::mla {

// ---- Shared-memory helpers of the key tiles, the fallback read and prefill's row copies.
namespace staged {
// The address of 16-byte slot s of a row of a [kBlock x 512] bf16 key tile (128-byte swizzled).
__device__ __forceinline__ uint32_t slot(uint32_t tile, int row, int s) { return tile + sw128_offset(kBlock, row, s); }

// Lane `lane`'s 16 bf16 dims [16 lane, +16) of a row (slots 2 lane, 2 lane + 1).
__device__ __forceinline__ void store_chunks(uint32_t tile, int row, int lane, const uint32_t (&w)[8]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(slot(tile, row, 2 * lane)), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(slot(tile, row, 2 * lane + 1)), "r"(w[4]), "r"(w[5]),
               "r"(w[6]), "r"(w[7])
               : "memory");
}

// Dims [16 lane, +16) of a key whose source cannot be read by vector loads, by read_slot_chunk's
// register reads (byte by byte where unaligned): a call of its own, so that its registers are the
// call's and not the gather loop's (the path of unusual strides only).
static __device__ __noinline__ void unstaged_chunk(int format, KeySource c, int32_t e, int lane, uint32_t (&w)[8]) {
  read_slot_chunk(format, c, e, lane, w);
}

// The format of a key as a compile-time value.
template <class Fn>
__device__ __forceinline__ void by_format(int format, Fn&& fn) {
  switch (format) {
    case kV4: fn(std::integral_constant<int, kV4>{}); break;
    case kMx: fn(std::integral_constant<int, kMx>{}); break;
    case kNv: fn(std::integral_constant<int, kNv>{}); break;
    case kBf16: fn(std::integral_constant<int, kBf16>{}); break;
    default: fn(std::integral_constant<int, kFp8>{}); break;
  }
}

// Prefill's bf16 workspace rows (sparse_mla_wg_kernel, every warp: rows 8 w .. 8 w + 7 of block
// `b`, lane k < 8 holding `pend`, the key of row 8 w + k; moved on to block b + 1): each row's 64
// chunks by cp.async straight to their final places (no dequantization; lane l dims [16 l, +16)),
// a masked key as a zero row; committed as one group, for the caller's wait before the tile is
// read.
__device__ __forceinline__ void produce_rows(const WorkspaceSource& src, const WorkspaceSource::List& list, int64_t b,
                                             int buf, uint32_t sk, int32_t* svalid, int warp, int lane,
                                             KeyRef& pend) {
  const uint32_t tile = sk + static_cast<uint32_t>(buf * kBlock * kRowBytes);
  const bool ok = lane < kKeysPerWarp && src.valid(pend);
  const uint32_t okm = __ballot_sync(0xFFFFFFFFu, ok);
#pragma unroll
  for (int k = 0; k < kKeysPerWarp; ++k) {
    const int row = warp * kKeysPerWarp + k;
    if ((okm >> k) & 1u) {
      const int32_t e = __shfl_sync(0xFFFFFFFFu, pend.e, k);
      const uint8_t* v = reinterpret_cast<const uint8_t*>(src.kv + static_cast<int64_t>(e) * src.kv_stride);
      cp_async16_sa(slot(tile, row, 2 * lane), v + 32 * lane);
      cp_async16_sa(slot(tile, row, 2 * lane + 1), v + 32 * lane + 16);
    } else {
      const uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      store_chunks(tile, row, lane, w);
    }
  }
  cp_async_commit();
  if (lane < kKeysPerWarp) {
    svalid[buf * kBlock + warp * kKeysPerWarp + lane] = ok ? 1 : 0;
    pend = src.entry(list, (b + 1) * kBlock + warp * kKeysPerWarp + lane);
  }
}
}  // namespace staged

// ---- The register gather of the producer warpgroup (sparse_mla_ws_kernel). Lane (kr, q) =
// (lane / 4, lane % 4) of a producer warp handles keys kr and 8 + kr of the warp's 16 and, of
// each, the 16-dim chunks c = q + 4 j (j = 0..7): the four lanes of a key read 64 consecutive
// bytes a load (two whole sectors), one scale load serves all the lane's chunks of a key, and each
// chunk is converted in registers (decode_chunk16_hw; decode_chunk16_sw where it reports a NaN:
// the bits of read_record_chunk16) and stored as two 16-byte chunks of the key's tile row (a
// quarter warp's stores, rows 2m and 2m + 1, cover disjoint bank groups under the 128-byte
// swizzle). Bytes that need no conversion (bf16 rows, the 584 record's bf16 RoPE) go by cp.async
// straight to their chunks. Against a gather that staged the raw records by cp.async and had each
// lane convert one chunk of all 16 keys (a copy, a re-read and a scale lookup a key and lane) this
// is ~1500 instead of ~2400 instructions a warp a block (docs/cuda.md). Sources that these vector
// loads cannot read (CacheSource::stageable: unaligned values, scales or rows) are read by
// read_slot_chunk (staged::unstaged_chunk).
namespace direct {
constexpr int kKeysPerLane = 2;

// The scale of the lane's chunk c = q + 4 j (chunk_scale) from its key's scale words (584: 8
// bytes, one per 64 dims: byte j; 528: 16, one per 32 dims: byte 2 j + q / 2; 288: 32, one per 16
// dims: byte 4 j + q).
template <int F>
__device__ __forceinline__ float scale_of(const uint32_t (&sw)[8], int j, int q, float fp8_scale) {
  if constexpr (F == kV4) return chunk_scale<F>(static_cast<uint8_t>(sw[j / 4] >> (8 * (j % 4))), fp8_scale);
  else if constexpr (F == kMx) return chunk_scale<F>(static_cast<uint8_t>(sw[j / 2] >> (16 * (j % 2) + 8 * (q / 2))), fp8_scale);
  else if constexpr (F == kNv) return chunk_scale<F>(static_cast<uint8_t>(sw[j] >> (8 * q)), fp8_scale);
  else return fp8_scale;
}

// The lane's chunks of NK keys of format F (v: values or row, sc: scales, on: the key is read here;
// row: its tile row): cp.async for bf16 bytes (committed by the caller), the rest through
// registers.
template <int F, int NK>
__device__ __forceinline__ void gather(const uint8_t* const (&v)[NK], const uint8_t* const (&sc)[NK],
                                       const bool (&on)[NK], float fp8_scale, uint32_t tile, const int (&row)[NK],
                                       int q) {
  // chunk c = q + 4 j of a row: slots 2 c and 2 c + 1 are sub-tile j's chunks 2 q and 2 q + 1
  // (sw128_offset), so one address a row for each and j times the sub-tile size added to it
  constexpr uint32_t kSub = kBlock * 128;
#pragma unroll
  for (int i = 0; i < NK; ++i) {
    if (!on[i]) continue;
    const uint32_t a0 = tile + sw128_offset(kBlock, row[i], 2 * q), a1 = tile + sw128_offset(kBlock, row[i], 2 * q + 1);
    if constexpr (F == kBf16) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        cp_async16_sa(a0 + j * kSub, v[i] + 32 * (q + 4 * j));
        cp_async16_sa(a1 + j * kSub, v[i] + 32 * (q + 4 * j) + 16);
      }
    } else {
      // the 584 record's chunks 28..31 are its bf16 RoPE dims: lane q's is chunk 28 + q (j = 7)
      constexpr int NJ = F == kV4 ? kNopeDim / 64 : 8;
      if constexpr (F == kV4) {
        cp_async16_sa(a0 + NJ * kSub, v[i] + kNopeDim + 32 * q);
        cp_async16_sa(a1 + NJ * kSub, v[i] + kNopeDim + 32 * q + 16);
      }
      uint32_t sw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (F == kV4) {
        const uint2 y = ld8_once(sc[i]);
        sw[0] = y.x, sw[1] = y.y;
      } else if constexpr (F == kMx || F == kNv) {
        const uint4 y = ld16_once(sc[i]);
        sw[0] = y.x, sw[1] = y.y, sw[2] = y.z, sw[3] = y.w;
        if constexpr (F == kNv) {
          const uint4 z = ld16_once(sc[i] + 16);
          sw[4] = z.x, sw[5] = z.y, sw[6] = z.z, sw[7] = z.w;
        }
      }
      const uint8_t* vq = v[i] + (F == kNv ? 8 : 16) * q;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        uint32_t qw[4] = {0, 0, 0, 0};
        if constexpr (F == kNv) {
          const uint2 y = ld8_once(vq + 32 * j);
          qw[0] = y.x, qw[1] = y.y;
        } else {
          const uint4 x = ld16_once(vq + 64 * j);
          qw[0] = x.x, qw[1] = x.y, qw[2] = x.z, qw[3] = x.w;
        }
        const float s = scale_of<F>(sw, j, q, fp8_scale);
        uint32_t w[8];
        if (!decode_chunk16_hw<F>(qw, s, w)) decode_chunk16_sw<F>(qw, s, w);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a0 + j * kSub), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                     "r"(w[3])
                     : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a1 + j * kSub), "r"(w[4]), "r"(w[5]), "r"(w[6]),
                     "r"(w[7])
                     : "memory");
      }
    }
  }
}

// Produces key block `b` into key tile `buf` (warp w: rows KPW w .. KPW w + KPW - 1; lane k < KPW
// holds `pend`, the key of row KPW w + k). Usually every key of the warp comes from one source (a
// token's list changes source once): its format is resolved once for the warp; otherwise each
// lane reads its keys by their own format.
template <int KPW>
__device__ __forceinline__ void produce(const CacheSource& src, int buf, uint32_t sk, int32_t* svalid, int warp,
                                        int lane, KeyRef pend) {
  static_assert(KPW == 8 * kKeysPerLane, "a warp's keys: 8 a round, kKeysPerLane rounds");
  const uint32_t tile = sk + static_cast<uint32_t>(buf * kBlock * kRowBytes);
  const int row0 = warp * KPW, kr = lane / 4, q = lane % 4;
  // lane k < KPW locates key k once; the lanes of a key take its addresses by shuffles
  const bool ok = lane < KPW && src.valid(pend);
  const bool st = ok && src.stageable(pend.src);
  const uint8_t* v = nullptr;
  const uint8_t* sc = nullptr;
  if (st) src.locate(pend, v, sc);
  const uint32_t okm = __ballot_sync(0xFFFFFFFFu, ok), stm = __ballot_sync(0xFFFFFFFFu, st);
  const int s0 = __shfl_sync(0xFFFFFFFFu, pend.src, stm != 0 ? __ffs(stm) - 1 : 0);
  const bool one = __all_sync(0xFFFFFFFFu, !st || pend.src == s0);
  const uint8_t* const kv[2] = {shflptr(v, kr), shflptr(v, 8 + kr)};
  const uint8_t* const ksc[2] = {shflptr(sc, kr), shflptr(sc, 8 + kr)};
  const int ks[2] = {__shfl_sync(0xFFFFFFFFu, pend.src, kr), __shfl_sync(0xFFFFFFFFu, pend.src, 8 + kr)};
  const int row[2] = {row0 + kr, row0 + 8 + kr};
  const bool on[2] = {((stm >> kr) & 1u) != 0, ((stm >> (8 + kr)) & 1u) != 0};
  if (stm != 0 && one) {
    const float fp8_scale = src.source(s0).fp8_scale;
    staged::by_format(src.format(s0), [&](auto F) { gather<F(), 2>(kv, ksc, on, fp8_scale, tile, row, q); });
  } else if (stm != 0) {
    // both sources among the warp's keys (the block where the list changes source): lanes may
    // take different formats here
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!on[i]) continue;
      const uint8_t* const v1[1] = {kv[i]};
      const uint8_t* const sc1[1] = {ksc[i]};
      const bool on1[1] = {true};
      const int row1[1] = {row[i]};
      const float fp8_scale = src.source(ks[i]).fp8_scale;
      staged::by_format(src.format(ks[i]), [&](auto F) { gather<F(), 1>(v1, sc1, on1, fp8_scale, tile, row1, q); });
    }
  }
  cp_async_commit();
  // the keys not read above: masked ones as zero rows (P is 0 there, and 0 * garbage could be
  // NaN), those of a source that cannot be read by vector loads by read_slot_chunk, lane l dims
  // [16 l, +16) (a call: its byte-by-byte form needs registers of its own)
#pragma unroll 1
  for (uint32_t rest = ~stm & ((1u << KPW) - 1u); rest != 0; rest &= rest - 1) {
    const int k = __ffs(rest) - 1;
    uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if ((okm >> k) & 1u) {
      KeyRef key;
      key.e = __shfl_sync(0xFFFFFFFFu, pend.e, k);
      key.src = __shfl_sync(0xFFFFFFFFu, pend.src, k);
      staged::unstaged_chunk(src.format(key.src), src.source(key.src), key.e, lane, w);
    }
    staged::store_chunks(tile, row0 + k, lane, w);
  }
  cp_async_wait<0>();
  if (lane < KPW) svalid[buf * kBlock + row0 + lane] = ok ? 1 : 0;
}
}  // namespace direct

// ---- The consumer side of one warpgroup, shared by both kernels: warpgroup c (0, 1) owns dims
// [256 c, 256 c + 256) of O and the partial scores of the same dims; thread wt (0..127) of it
// holds rows row0 = 16 (warp % 4) + g and row0 + 8 (g = lane / 4, tq = lane % 4).
struct WgRows {
  float m[2], l[2];  // running max and fp32 row sum (the quad's part) of the two rows
  float o[128];      // O [64 x 256] of the warpgroup, m64n256 accumulator layout
};

__device__ __forceinline__ void wg_begin(WgRows& r) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  r.m[0] = r.m[1] = kNegInf;
  r.l[0] = r.l[1] = 0.0f;
#pragma unroll
  for (int i = 0; i < 128; ++i) r.o[i] = 0.0f;
}

// O of both rows scaled by their factors (a0: row row0, a1: row row0 + 8), in the m64n256
// accumulator layout.
__device__ __forceinline__ void wg_rescale(WgRows& r, float a0, float a1) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    r.o[4 * j] *= a0;
    r.o[4 * j + 1] *= a0;
    r.o[4 * j + 2] *= a1;
    r.o[4 * j + 3] *= a1;
  }
}

// The online softmax of one block: scale, mask (valid[key] == 0: -inf), the running max of both
// rows (a quad of lanes holds a row), O and l rescaled, P = exp(z - m) into the hi / lo A fragments
// of the block's 4 k-steps of 16 keys, l += the fp32 weights.
__device__ __forceinline__ void wg_softmax(WgRows& r, float (&s)[32], const int32_t* valid, float scale, int tq,
                                           uint32_t (&ahi)[4][4], uint32_t (&alo)[4][4], float (&alpha)[2]) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float mx[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int key = 8 * j + 2 * tq + (x & 1);
      const float z = valid[key] ? s[4 * j + x] * scale : kNegInf;
      s[4 * j + x] = z;
      mx[x / 2] = fmaxf(mx[x / 2], z);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
    const float mn = fmaxf(r.m[i], mx[i]);
    alpha[i] = r.m[i] == kNegInf ? 0.0f : exp2f((r.m[i] - mn) * kLog2e);
    r.m[i] = mn;
    r.l[i] *= alpha[i];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float z0 = s[4 * j + 2 * i], z1 = s[4 * j + 2 * i + 1];
      const float p0 = z0 == kNegInf ? 0.0f : exp2f((z0 - r.m[i]) * kLog2e);
      const float p1 = z1 == kNegInf ? 0.0f : exp2f((z1 - r.m[i]) * kLog2e);
      r.l[i] += p0 + p1;
      // n8 tile j is k-step j / 2; registers 0, 1 (rows g, g + 8) of its first 8 keys, 2, 3 of
      // the last 8
      split_bf16x2(p0, p1, ahi[j / 2][2 * (j % 2) + i], alo[j / 2][2 * (j % 2) + i]);
    }
  wg_rescale(r, alpha[0], alpha[1]);
}

// Issues O += P_hi V + P_lo V over dims [256 c, +256) of key tile kt (sub-tiles 4 c .. 4 c + 3,
// read MN-major); the rescaled O and the A fragments are complete before the fence.
__device__ __forceinline__ void wg_issue_pv(WgRows& r, uint32_t (&ahi)[4][4], uint32_t (&alo)[4][4], uint32_t kt, int c) {
  wgmma_fence_operands(r.o);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_fence_operands(ahi[kk]);
    wgmma_fence_operands(alo[kk]);
  }
  wgmma_fence();
  const uint32_t v = kt + static_cast<uint32_t>(4 * c * kBlock * 128);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1>(r.o, ahi[kk], sw128_desc(v + kk * 2048, kBlock * 128, 1024), 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1>(r.o, alo[kk], sw128_desc(v + kk * 2048, kBlock * 128, 1024), 1);
  wgmma_commit();
}

// Issues S = Q K^T over all 512 dims of key tile kt (32 k-steps; the specialized form's first
// consumer, which alone computes S).
__device__ __forceinline__ void wg_issue_scores_full(float (&s)[32], uint32_t sq, uint32_t kt) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 32; ++kk) {
    const uint32_t off = static_cast<uint32_t>((kk / 4) * (kBlock * 128) + (kk % 4) * 32);
    wgmma_m64n64k16_ss<0>(s, sw128_desc(sq + off, 16, 1024), sw128_desc(kt + off, 16, 1024), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// This thread's P fragments (rows row0, row0 + 8; keys 8 j + 2 tq, + 1 of n8 tile j) into the
// swizzled [64 x 64] bf16 tiles sp (hi) and splo (lo): the A operand of the other consumer's PV.
__device__ __forceinline__ void wg_put_p(const uint32_t (&ahi)[4][4], const uint32_t (&alo)[4][4], uint32_t sp,
                                         uint32_t splo, int row0, int tq) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t off = sw128_offset(kBlock, row0 + 8 * i, j) + static_cast<uint32_t>(4 * tq);
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(sp + off), "r"(ahi[j / 2][2 * (j % 2) + i]) : "memory");
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(splo + off), "r"(alo[j / 2][2 * (j % 2) + i]) : "memory");
    }
}

// O += P_hi V + P_lo V over dims [256 c, +256) of key tile kt with P from shared memory (the
// specialized form's second consumer).
__device__ __forceinline__ void wg_issue_pv_smem(WgRows& r, uint32_t sp, uint32_t splo, uint32_t kt, int c) {
  wgmma_fence_operands(r.o);
  wgmma_fence();
  const uint32_t v = kt + static_cast<uint32_t>(4 * c * kBlock * 128);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_ss<1>(r.o, sw128_desc(sp + kk * 32, 16, 1024), sw128_desc(v + kk * 2048, kBlock * 128, 1024), 1);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_ss<1>(r.o, sw128_desc(splo + kk * 32, 16, 1024), sw128_desc(v + kk * 2048, kBlock * 128, 1024), 1);
  wgmma_commit();
}

// The epilogue of rows row0, row0 + 8 over dims [256 c, +256) (after the last wait): with one
// split the sink (SPEC 9.2; a row without a key is 0 with lse +inf, 9.3) and bf16 rows; with
// several the normalized fp32 partial and its lse (-inf: no key) into the workspace; a split
// without keys (m = -inf in every row) stores those empty rows. Both warpgroups hold the same m and
// l: warpgroup 0 writes the lse.
__device__ __forceinline__ void wg_store(const Heads& p, WgRows& r, int64_t t, int split, int h0, int row0, int c,
                                         int tq) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr float kInf = std::numeric_limits<float>::infinity();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    r.l[i] += __shfl_xor_sync(0xFFFFFFFFu, r.l[i], 1);
    r.l[i] += __shfl_xor_sync(0xFFFFFFFFu, r.l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = h0 + row0 + 8 * i;
    if (h >= p.H) continue;
    const float m = r.m[i], l = r.l[i];
    if (p.splits == 1) {
      const float f = sink_factor(m, l, p.sink[h]);
      uint16_t* dst = p.out + t * p.out_tok + h * p.out_head + 256 * c + 2 * tq;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = bf16x2_rn_hw(r.o[4 * j + 2 * i] * f, r.o[4 * j + 2 * i + 1] * f);
      if (c == 0 && tq == 0) p.lse[t * p.lse_tok + h] = row_lse(m, l, kInf);
    } else {
      const float f = partial_factor(m, l);
      const int64_t part = (t * p.splits + split) * p.H + h;
      float* dst = p.ws_o + part * kDim + 256 * c + 2 * tq;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(r.o[4 * j + 2 * i] * f, r.o[4 * j + 2 * i + 1] * f);
      if (c == 0 && tq == 0) p.ws_lse[part] = row_lse(m, l, kNegInf);
    }
  }
}

// The shared-memory window of both kernels (1024-byte-aligned base) and the CTA's work item.
struct WgCta {
  uint8_t* smem;
  uint32_t sbase;
  int64_t t;
  int split, h0;
  __device__ WgCta(uint8_t* raw, const Heads& p) {
    const uint32_t sraw = smem_address(raw);
    sbase = (sraw + 1023u) & ~1023u;
    smem = raw + (sbase - sraw);
    const int64_t item = blockIdx.x;
    split = static_cast<int>(item % p.splits);
    const int group = static_cast<int>((item / p.splits) % p.head_groups);
    t = item / (static_cast<int64_t>(p.splits) * p.head_groups);
    h0 = group * WgSmem::kHeads;
  }
  // Q rows h0 .. h0 + 63 (zero rows past H) into the swizzled Q tile, by `threads` threads.
  __device__ void load_q(const Heads& p, int threads) const {
    const uint32_t sq = sbase + WgSmem::q;
    for (int c = static_cast<int>(threadIdx.x); c < WgSmem::kHeads * kChunks; c += threads) {
      const int r = c / kChunks, ch = c % kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (h0 + r < p.H) v = *reinterpret_cast<const uint4*>(p.q + t * p.q_tok + (h0 + r) * p.q_head + 8 * ch);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(sq + sw128_offset(kBlock, r, ch)), "r"(v.x),
                   "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
  }
  // The run of key blocks [blo, bhi) of this split of the token's list.
  template <class List>
  __device__ void blocks(const Heads& p, const List& list, int64_t& blo, int64_t& bhi) const {
    const int64_t nb = (static_cast<int64_t>(list.n) + kBlock - 1) / kBlock;
    const int64_t per = (nb + p.splits - 1) / p.splits;
    blo = split * per;
    bhi = blo + per < nb ? blo + per : nb;
  }
};

// A split without keys (blo >= bhi) stores its empty rows at once, on a path of its own (so that no
// path without wgmma meets the accumulators in flight); whether it did.
__device__ __forceinline__ bool wg_store_if_empty(const Heads& p, WgRows& r, const WgCta& cta, int64_t blo,
                                                  int64_t bhi, int row0, int c, int tq) {
  if (blo < bhi) return false;
  pdl_allow_dependents();
  wg_store(p, r, cta.t, cta.split, cta.h0, row0, c, tq);
  return true;
}

template <class Src>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_wg_kernel(const Heads p, const Src src) {
#if defined(DSV41KV_WGMMA)
  // prefill's rows (decode's records take sparse_mla_ws_kernel: launch_sparse_mla)
  static_assert(std::is_same_v<Src, WorkspaceSource>);
  using L = WgSmem;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const WgCta cta(smem_raw, p);
  const uint32_t sq = cta.sbase + L::q, sk = cta.sbase + L::k;
  const uint32_t sp = cta.sbase + L::p_hi, splo = cta.sbase + L::p_lo, pready = cta.sbase + L::bars + 32u;
  float* salpha = reinterpret_cast<float*>(cta.smem + L::alpha);
  float* sm = reinterpret_cast<float*>(cta.smem + L::m);
  float* sl = reinterpret_cast<float*>(cta.smem + L::l);
  int32_t* svalid = reinterpret_cast<int32_t*>(cta.smem + L::valid);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wg = warp / 4;
  const int tq = lane % 4, row0 = 16 * (warp % 4) + lane / 4;

  if (threadIdx.x == 0) {
    mbarrier_init_count(pready, 128);  // warpgroup 0's P of a block is stored
    mbarrier_init_fence();
  }
  pdl_wait();
  cta.load_q(p, kThreads);
  const typename Src::List list = src.begin(cta.t);
  int64_t blo, bhi;
  cta.blocks(p, list, blo, bhi);
  WgRows r;
  wg_begin(r);
  if (wg_store_if_empty(p, r, cta, blo, bhi, row0, wg, tq)) return;
  // bf16 workspace rows travel by cp.async to their final chunks (staged::produce_rows), in flight
  // through a whole block's S, softmax and PV
  KeyRef pend;
  if (lane < kKeysPerWarp) pend = src.entry(list, blo * kBlock + warp * kKeysPerWarp + lane);
  staged::produce_rows(src, list, blo, 0, sk, svalid, warp, lane, pend);
  cp_async_wait<0>();
  fence_proxy_async_shared();  // Q and the first key tile, written by this thread, read by wgmma

  // The consumers split as sparse_mla_ws_kernel's (the same S, softmax and PV instructions, so
  // decode and prefill give the same bits): warpgroup 0 computes S over all dims and the softmax
  // and hands P and the rescale factors to warpgroup 1 through shared memory (pready); each runs
  // the PV of its half of the dims.
  // (do-while: at least one block here, and the loop's exit is the only way to the wait below)
  int64_t b = blo;
  do {
    const int it = static_cast<int>(b - blo), cur = it & 1;
    const uint32_t kt = sk + static_cast<uint32_t>(cur * L::kTile);
    const bool next = b + 1 < bhi;
    wgmma_wait<0>();  // this warpgroup's PV of block b - 1
    wgmma_fence_operands(r.o);
    __syncthreads();  // (A) key tile `cur` stored by every warp; both PVs of block b - 1 done, so the
                      // other key tile and the P buffers are free
    float s[32];
    if (wg == 0) wg_issue_scores_full(s, sq, kt);
    // the copies of block b + 1, in flight while this block's S, softmax and PV run
    if (next) staged::produce_rows(src, list, b + 1, cur ^ 1, sk, svalid, warp, lane, pend);
    if (wg == 0) {
      wgmma_wait<0>();
      wgmma_fence_operands(s);  // the compiler keeps every access of s and o after the wait
      wgmma_fence_operands(r.o);
      uint32_t ahi[4][4], alo[4][4];
      float alpha[2];
      wg_softmax(r, s, svalid + cur * kBlock, p.scale, tq, ahi, alo, alpha);
      wg_put_p(ahi, alo, sp, splo, row0, tq);
      if (tq == 0) salpha[row0] = alpha[0], salpha[row0 + 8] = alpha[1];
      fence_proxy_async_shared();  // P, read by warpgroup 1's wgmma
      mbarrier_arrive(pready);
      wg_issue_pv(r, ahi, alo, kt, 0);
    } else {
      mbarrier_wait_parity(pready, static_cast<uint32_t>(it & 1));
      wg_rescale(r, salpha[row0], salpha[row0 + 8]);
      wg_issue_pv_smem(r, sp, splo, kt, 1);
    }
    if (next) {
      cp_async_wait<0>();
      fence_proxy_async_shared();  // the key tile of block b + 1, read by the next S
    }
  } while (++b < bhi);
  wgmma_wait<0>();
  wgmma_fence_operands(r.o);
  if (wg == 0) {  // each row's max and (whole) sum for warpgroup 1's epilogue
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = r.l[i];
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
      if (tq == 0) sm[row0 + 8 * i] = r.m[i], sl[row0 + 8 * i] = l;
    }
  }
  __syncthreads();
  if (wg == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // wg_store sums l over the quad: the whole sum in one lane
      r.m[i] = sm[row0 + 8 * i];
      r.l[i] = tq == 0 ? sl[row0 + 8 * i] : 0.0f;
    }
  }
  pdl_allow_dependents();
  wg_store(p, r, cta.t, cta.split, cta.h0, row0, wg, tq);
#else
  // Built only for sm_90a (CMakeLists.txt): wgmma has no other target.
  __trap();
#endif
}

// The warp-specialized form of the same product: kWsThreads threads, the first kWsProducerWarps
// warps the producers (gather and dequantize each block into a free key tile, kBlock /
// kWsProducerWarps keys a warp: direct::produce, and prefetch the next block's records into L2),
// then two consumer warpgroups split as FlashMLA splits them (below): the first computes S and the
// softmax and holds S, P and its half of O (kWsFirstConsumerRegs), the second only its half of O
// (kWsSecondConsumerRegs), so setmaxnreg leaves the producers kWsProducerRegs (the staged gather
// holds two keys' loads and conversions in flight with them). A second producer warpgroup (512 threads) would need
// m64n128 PV instructions: ptxas checks each instruction against the launch cap of 64K / threads,
// setmaxnreg.inc notwithstanding (docs/changelog.md, "Ideas"). The tiles are handed over with
// mbarriers: full[buf] (every producer thread arrives after its stores) and empty[buf] (256
// consumer arrivals once each consumer's PV of the tile's block is done).
template <class Src>
__global__ void __launch_bounds__(kWsThreads, 1) sparse_mla_ws_kernel(const Heads p, const Src src) {
#if defined(DSV41KV_WGMMA)
  using L = WgSmem;
  constexpr int kKPW = kBlock / kWsProducerWarps, kProducers = 32 * kWsProducerWarps;
  static_assert(kWsProducerWarps % 4 == 0 && kBlock % kWsProducerWarps == 0 && kKPW <= 16);
  // setmaxnreg redistributes what the launch allocated: 64K / threads a thread, in multiples of 8
  static_assert(kProducers * kWsProducerRegs + 128 * (kWsFirstConsumerRegs + kWsSecondConsumerRegs) <=
                    (65536 / kWsThreads) / 8 * 8 * kWsThreads &&
                kWsProducerRegs % 8 == 0 && kWsFirstConsumerRegs % 8 == 0 && kWsSecondConsumerRegs % 8 == 0);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const WgCta cta(smem_raw, p);
  const uint32_t sq = cta.sbase + L::q, sk = cta.sbase + L::k, sbars = cta.sbase + L::bars;
  int32_t* svalid = reinterpret_cast<int32_t*>(cta.smem + L::valid);
  const auto full = [&](int buf) { return sbars + 8u * static_cast<uint32_t>(buf); };
  const auto empty = [&](int buf) { return sbars + 16u + 8u * static_cast<uint32_t>(buf); };
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;

  if (tid == 0) {
    mbarrier_init_count(full(0), kProducers);
    mbarrier_init_count(full(1), kProducers);
    mbarrier_init_count(empty(0), 256);
    mbarrier_init_count(empty(1), 256);
    mbarrier_init_count(sbars + 32u, 128);  // pready: the first consumer's P of a block is stored
    mbarrier_init_count(sbars + 40u, 128);  // pfree: the second consumer's PV of a block is done
    mbarrier_init_count(sbars + 48u, 128);  // mlready: the rows' max and sum, after the last block
    mbarrier_init_fence();
  }
  pdl_wait();
  cta.load_q(p, kWsThreads);
  fence_proxy_async_shared();  // Q, read by the consumers' wgmma
  __syncthreads();             // Q and the barriers ready
  const typename Src::List list = src.begin(cta.t);
  int64_t blo, bhi;
  cta.blocks(p, list, blo, bhi);

  if (warp < kWsProducerWarps) {
    // ---- producers: block b into tile (b - blo) % 2 once its previous block's PVs are done
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs) : "memory");
    if (blo >= bhi) return;
    KeyRef pend, ahead;
    const auto entry = [&](int64_t blk) { return src.entry(list, blk * kBlock + warp * kKPW + lane); };
    if (lane < kKPW) {
      pend = entry(blo);
      ahead = entry(blo + 1);
    }
    constexpr int kSegs = 4 * kKPW / 32;  // L2 prefetch parts (of 4 a record) a lane issues
    for (int64_t b = blo; b < bhi; ++b) {
      const int it = static_cast<int>(b - blo), buf = it & 1;
      if (it >= 2) mbarrier_wait_parity(empty(buf), static_cast<uint32_t>(((it >> 1) - 1) & 1));
      // block b + 1's records into L2 while this block is gathered (its entries are here)
      KeyRef k;
      k.e = __shfl_sync(0xFFFFFFFFu, ahead.e, lane % kKPW);
      k.src = __shfl_sync(0xFFFFFFFFu, ahead.src, lane % kKPW);
#pragma unroll
      for (int j = 0; j < kSegs; ++j) src.prefetch(k, kSegs * (lane / kKPW) + j);
      direct::produce<kKPW>(src, buf, sk, svalid, warp, lane, pend);
      fence_proxy_async_shared();
      mbarrier_arrive(full(buf));
      if (lane < kKPW) {
        pend = ahead;
        ahead = entry(b + 2);
      }
    }
    return;
  }
  // ---- consumers: consumer warpgroup c owns dims [256 c, +256) of O. The first (c = 0) alone
  // computes S over all dims and the softmax, hands P (hi, lo) and each row's rescale factor to the
  // second through shared memory (pready / pfree), and runs its PV with P from registers; the
  // second only rescales and runs its PV with P from shared memory (FlashMLA's split: no S
  // exchange, and the second holds little beside O, so the producer gets the registers).
  const int c = (warp - kWsProducerWarps) / 4, tq = lane % 4, row0 = 16 * (warp % 4) + lane / 4;
  const uint32_t sp = cta.sbase + L::p_hi, splo = cta.sbase + L::p_lo;
  float* salpha = reinterpret_cast<float*>(cta.smem + L::alpha);
  float* sm = reinterpret_cast<float*>(cta.smem + L::m);
  float* sl = reinterpret_cast<float*>(cta.smem + L::l);
  const uint32_t pready = sbars + 32u, pfree = sbars + 40u, mlready = sbars + 48u;
  // (each consumer's path whole from its setmaxnreg on: code after a join of the two would be
  // allocated for the smaller count)
  if (c == 0) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsFirstConsumerRegs) : "memory");
    WgRows r;
    wg_begin(r);
    if (wg_store_if_empty(p, r, cta, blo, bhi, row0, 0, tq)) return;
    int64_t b = blo;
    do {
      const int it = static_cast<int>(b - blo), buf = it & 1;
      const uint32_t kt = sk + static_cast<uint32_t>(buf * L::kTile);
      mbarrier_wait_parity(full(buf), static_cast<uint32_t>((it >> 1) & 1));
      float s[32];
      wg_issue_scores_full(s, sq, kt);
      wgmma_wait<0>();  // S(b), and PV(b - 1) before it
      wgmma_fence_operands(s);
      wgmma_fence_operands(r.o);
      if (it > 0) mbarrier_arrive(empty(buf ^ 1));  // block b - 1's tile: this warpgroup is done with it
      uint32_t ahi[4][4], alo[4][4];
      float alpha[2];
      wg_softmax(r, s, svalid + buf * kBlock, p.scale, tq, ahi, alo, alpha);
      if (it > 0) mbarrier_wait_parity(pfree, static_cast<uint32_t>((it - 1) & 1));  // P(b - 1) read
      wg_put_p(ahi, alo, sp, splo, row0, tq);
      if (tq == 0) salpha[row0] = alpha[0], salpha[row0 + 8] = alpha[1];
      fence_proxy_async_shared();  // P, read by the other warpgroup's wgmma
      mbarrier_arrive(pready);
      wg_issue_pv(r, ahi, alo, kt, 0);
    } while (++b < bhi);
    wgmma_wait<0>();
    wgmma_fence_operands(r.o);
    // each row's max and (whole) sum for the other warpgroup's epilogue
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = r.l[i];
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
      l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
      if (tq == 0) sm[row0 + 8 * i] = r.m[i], sl[row0 + 8 * i] = l;
    }
    mbarrier_arrive(mlready);
    pdl_allow_dependents();
    wg_store(p, r, cta.t, cta.split, cta.h0, row0, 0, tq);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsSecondConsumerRegs) : "memory");
    WgRows r;
    wg_begin(r);
    if (wg_store_if_empty(p, r, cta, blo, bhi, row0, 1, tq)) return;
    int64_t b = blo;
    do {
      const int it = static_cast<int>(b - blo), buf = it & 1;
      const uint32_t kt = sk + static_cast<uint32_t>(buf * L::kTile);
      mbarrier_wait_parity(full(buf), static_cast<uint32_t>((it >> 1) & 1));  // V(b)
      mbarrier_wait_parity(pready, static_cast<uint32_t>(it & 1));            // P(b)
      wg_rescale(r, salpha[row0], salpha[row0 + 8]);
      wg_issue_pv_smem(r, sp, splo, kt, 1);
      wgmma_wait<0>();
      wgmma_fence_operands(r.o);
      mbarrier_arrive(empty(buf));  // block b's tile: this warpgroup is done with it
      mbarrier_arrive(pfree);       // and with P(b)
    } while (++b < bhi);
    mbarrier_wait_parity(mlready, 0u);
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // wg_store sums l over the quad: the whole sum in one lane
      r.m[i] = sm[row0 + 8 * i];
      r.l[i] = tq == 0 ? sl[row0 + 8 * i] : 0.0f;
    }
    pdl_allow_dependents();
    wg_store(p, r, cta.t, cta.split, cta.h0, row0, 1, tq);
  }
#else
  __trap();
#endif
}

}  // namespace dsv41kv::detail::cuda::mla
