// The mma.sync mainloop of sparse MLA with sink (SPEC 9.2-9.5) for the 16- and 32-head tiles, and
// what it shares with the 64-head warpgroup kernel of sparse_mla_wgmma.cuh (the sources, the
// produce step, the launch), for sparse_decode and sparse_prefill (docs/cuda.md, "Sparse MLA on
// tensor cores"). A CTA of 8 warps owns one query token x a tile of HT heads x a run of 64-key
// blocks of the token's key list:
//   * Q [HT x 512] bf16 in shared memory (swizzled, loaded once);
//   * each key block is gathered by index and dequantized once into a bf16 tile [64 x 512]
//     (two tiles: block b+1 is produced while block b is consumed) and serves as K for
//     S = Q K^T and as V for O += P V (K = V = the 512-d state, SPEC 9.1);
//   * S: warp w computes rows 16 (w % R) .. +16 (R = HT / 16 row groups) x keys of slice w / R
//     (8 / R slices of 64 R / 8 keys) with mma.m16n8k16 (fp32), scaled by softmax_scale;
//   * online softmax in fp32: the slices' row maxima meet in shared memory, every warp of a row
//     group derives the same running max, P = exp(z - m) goes to shared [HT x 64] tiles as two
//     bf16 parts, hi = bf16(P) and lo = bf16(P - hi) (SPEC 9.7's bf16 P alone misses its tolerance
//     on states of a few tens: docs/cuda.md), each warp sums its own fp32 weights (the row sum is
//     added up once at the end) and the rescale factor of each row goes to shared memory;
//   * O: warp w owns dims [64 w, 64 w + 64) of all HT rows (HT / 16 x 8 accumulator tiles);
//     O += P_hi V + P_lo V with B = V by ldmatrix.trans of the key tile;
//   * epilogue: with one split the sink is applied (SPEC 9.2; empty rows 0 with lse +inf, 9.3)
//     and bf16 rows are stored; with several, the normalized fp32 partial and its lse go to the
//     caller's workspace for merge_kernel.
// Sources (the Src policy): the two paged caches of decode (one logical list: the compressed
// entries [0, cmp_len), then the SWA entries; each with its own record format, page size and
// capacity) or the bf16 workspace rows of prefill (plain loads, no dequantization).
// Every address is 64-bit (slot / S pages times the page stride).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda/cuda_util.hpp"
#include "core/cuda/memory.cuh"
#include "core/cuda/mma.cuh"
#include "dsv41kv/attention.hpp"
#include "formats/cuda/fast_numerics.cuh"
#include "formats/cuda/record_readers.cuh"

namespace dsv41kv::detail::cuda::mla {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlock = 64;               // keys per block (kDecodeKeyBlock)
constexpr int kDim = 512;                // K = V = Q width
constexpr int kRowBytes = 2 * kDim;      // one bf16 row of a Q or key tile
constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row
constexpr int kKeysPerWarp = kBlock / kWarps;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kBlock == kDecodeKeyBlock && kDim == kLatentDim);
static_assert(kDim / kWarps == 64, "PV: 64 dims (8 n-tiles) per warp");

// The per-CTA shared memory of a head tile (byte offsets into the dynamic window).
template <int HT>
struct Smem {
  static_assert(HT == 16 || HT == 32, "the 64-head tile runs on sparse_mla_wgmma.cuh");
  static constexpr int kRowGroups = HT / 16;
  static constexpr int kSlices = kWarps / kRowGroups;
  static constexpr int kSliceKeys = kBlock / kSlices;  // 8, 16 or 32
  static constexpr int kSliceTiles = kSliceKeys / 8;   // n8 tiles of S per warp
  static constexpr int kMTiles = HT / 16;              // m16 tiles of O per warp
  static constexpr int q = 0;
  static constexpr int k = q + HT * kRowBytes;                 // 2 key tiles
  static constexpr int p = k + 2 * kBlock * kRowBytes;         // P hi [HT x 64] bf16, 128-byte rows
  static constexpr int plo = p + HT * 2 * kBlock;              // P lo, the same
  static constexpr int max = plo + HT * 2 * kBlock;            // f32 [slices][HT]
  static constexpr int lsum = max + 4 * kSlices * HT;          // f32 [slices][HT]
  static constexpr int alpha = lsum + 4 * kSlices * HT;        // f32 [HT]
  static constexpr int mrow = alpha + 4 * HT;                  // f32 [HT]
  static constexpr int valid = mrow + 4 * HT;                  // i32 [2][64]
  static constexpr int bytes = valid + 4 * 2 * kBlock;
  static_assert(bytes <= 227 * 1024, "fits one SM's shared memory");
};

// Shared memory of the 64-head warpgroup kernel (sparse_mla_wgmma.cuh; byte offsets from a
// 1024-byte-aligned base).
struct WgSmem {
  static constexpr int kHeads = 64;
  static constexpr int kTile = kBlock * kRowBytes;    // one [64 x 512] bf16 tile, 8 sub-tiles [64 x 64]
  static constexpr int q = 0;                         // Q
  static constexpr int k = q + kTile;                 // 2 key tiles
  static constexpr int x = k + 2 * kTile;             // 32 KiB: P and the row values below
  static constexpr int valid = x + 2 * 8 * 128 * 16;  // i32 [2][64]
  static constexpr int bars = valid + 4 * 2 * kBlock;   // u64 mbarriers: full[2], empty[2], pready, pfree,
                                                        // mlready (specialized form)
  static constexpr int bytes = bars + 8 * 8;
  // P hi and P lo ([64 x 64] bf16 each, 128-byte swizzled like a Q sub-tile) from warpgroup 0 to
  // warpgroup 1 of the consumers, the rescale factor, running max and row sum of each row
  static constexpr int p_hi = x, p_lo = x + kBlock * 128, alpha = x + 2 * kBlock * 128, m = alpha + 4 * kBlock,
                       l = m + 4 * kBlock;
  static_assert(l + 4 * kBlock <= valid && p_lo % 1024 == 0, "P and the row values fit the exchange region");
  static constexpr int alloc = bytes + 1024;          // room to align the base
  static_assert(q % 1024 == 0 && k % 1024 == 0 && x % 1024 == 0, "swizzle atoms are 1024-byte aligned");
  static_assert(alloc <= 227 * 1024, "fits one SM's shared memory");
};

// The heads of one call: q, out, lse, sink and the epilogue's destinations.
struct Heads {
  const uint16_t* q = nullptr;
  int64_t q_tok = 0, q_head = 0;
  uint16_t* out = nullptr;
  int64_t out_tok = 0, out_head = 0;
  float* lse = nullptr;
  int64_t lse_tok = 0;
  const float* sink = nullptr;
  float scale = 0;
  int64_t T = 0;
  int H = 0;
  int head_groups = 1;    // ceil(H / HT)
  int splits = 1;         // work items per (token, head group)
  float* ws_o = nullptr;  // splits > 1: f32 [T][splits][H][512] normalized partial outputs
  float* ws_lse = nullptr;  // splits > 1: f32 [T][splits][H] partial lse (-inf: no key)
};

// SPEC 9.2 / 9.3, the sink once: the factor e^(m-M) / (l e^(m-M) + e^(sink-M)), M = max(m, sink),
// that takes a row's unnormalized output (running max m, sum l of its weights) to the output; 0
// for a row without a key (m = -inf) whatever the sink, and for sink +inf.
__device__ __forceinline__ float sink_factor(float m, float l, float sink) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (m == kNegInf || sink == std::numeric_limits<float>::infinity()) return 0.0f;
  const float M = fmaxf(m, sink);
  const float ea = expf(m - M), eb = expf(sink - M);
  return ea / (l * ea + eb);
}
// The factor of a split's normalized partial: 1 / l, 0 for a row without a key (merge_kernel
// weighs the partials by their lse and applies the sink once).
__device__ __forceinline__ float partial_factor(float m, float l) {
  return m != -std::numeric_limits<float>::infinity() ? 1.0f / l : 0.0f;
}
// The lse a row reports: m + ln l, or `empty` (+inf for an output row, -inf for a split's
// partial) without a key.
__device__ __forceinline__ float row_lse(float m, float l, float empty) {
  return m != -std::numeric_limits<float>::infinity() ? m + logf(l) : empty;
}

// A paged cache of one key list (decode): slot = page * S + r, record format F.
struct CacheList {
  const uint8_t* base = nullptr;
  int64_t S = 1, page_stride = 0, row_stride = 0, capacity = 0;
  float fp8_scale = 1.0f;
  bool aligned = false;  // record_chunks_aligned
  int format = 0;        // a RecordFormat value
  const int32_t* idx = nullptr;
  int64_t idx_stride = 0;
  const int32_t* len = nullptr;
  int width = 0;  // entries per index row (128 or 512): lengths are clamped to it
};

// A key: its raw index entry and the source it belongs to (-1: past the list).
struct KeyRef {
  int32_t e = -1;
  int32_t src = -1;
};

// One source of a decode key: the fields of its cache the reader needs (selected as scalars, so
// no cache descriptor is ever addressed indirectly).
struct KeySource {
  const uint8_t* base;
  int64_t S, page_stride, row_stride;
  float fp8_scale;
  bool aligned;
};
// Dims [16 lane, 16 lane + 16) of key slot e of `c` in record format F.
template <int F>
__device__ __forceinline__ void read_slot_chunk(const KeySource& c, int64_t e, int lane, uint32_t (&w)[8]) {
  int64_t page, r;
  divmod(e, c.S, page, r);
  read_record_chunk16<F>(c.base + page * c.page_stride, c.S, r, c.row_stride, c.fp8_scale, 16 * lane, c.aligned, w);
}
// The same for a format given as a value (a warp-uniform switch: one key per warp).
__device__ __forceinline__ void read_slot_chunk(int format, const KeySource& c, int64_t e, int lane,
                                                uint32_t (&w)[8]) {
  switch (format) {
    case kV4: read_slot_chunk<kV4>(c, e, lane, w); break;
    case kMx: read_slot_chunk<kMx>(c, e, lane, w); break;
    case kNv: read_slot_chunk<kNv>(c, e, lane, w); break;
    case kBf16: read_slot_chunk<kBf16>(c, e, lane, w); break;
    default: read_slot_chunk<kFp8>(c, e, lane, w); break;
  }
}

// A hint that the 128-byte line of `p` be brought into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// Part `seg` (0..3) of the L2 prefetch of a record whose values are [v, v + vb) and whose scales
// start at sc (nullptr: none): four lanes cover a record of up to 640 value bytes.
__device__ __forceinline__ void prefetch_record_part(const uint8_t* v, int vb, const uint8_t* sc, int seg) {
  const auto at = [&](int off) { return v + (off < vb ? off : vb - 1); };
  prefetch_l2(at(128 * seg));
  if (seg == 0) prefetch_l2(at(512));
  if (seg == 1) prefetch_l2(at(vb - 1));
  if (seg == 2 && sc != nullptr) prefetch_l2(sc);
}

// Decode's two caches: the compressed list (with_cmp), then the SWA list. The record formats are
// values (one kernel per head tile serves every pair of formats; the dequantization of a key is
// tens of instructions per lane, the switch a few).
struct CacheSource {
  // the 64-head kernel gathers with a producer warpgroup (V4.1-Flash batch 128: 272 against
  // 330 us with every warp gathering; docs/performance.md)
  static constexpr bool kProducerWarps = true;
  CacheList swa, cmp;
  bool with_cmp = false;
  // The key list of one token (the kernel parameter itself stays constant).
  struct List {
    int32_t ncmp, n;
    const int32_t* swa_row;
    const int32_t* cmp_row;
  };
  __device__ List begin(int64_t t) const {
    const int32_t ls = ld_early(swa.len + t);
    const int32_t nswa = ls < 0 ? 0 : ls > swa.width ? swa.width : ls;
    List l{0, 0, swa.idx + t * swa.idx_stride, nullptr};
    if (with_cmp) {
      const int32_t lc = ld_early(cmp.len + t);
      l.ncmp = lc < 0 ? 0 : lc > cmp.width ? cmp.width : lc;
      l.cmp_row = cmp.idx + t * cmp.idx_stride;
    }
    l.n = l.ncmp + nswa;
    return l;
  }
  __device__ KeyRef entry(const List& l, int64_t j) const {
    KeyRef k;
    if (j < l.ncmp) {
      k.e = l.cmp_row[j];
      k.src = 0;
    } else if (j < l.n) {
      k.e = l.swa_row[j - l.ncmp];
      k.src = 1;
    }
    return k;
  }
  __device__ bool valid(KeyRef k) const {
    if (k.src < 0 || k.e < 0) return false;
    return k.e < (k.src == 0 ? cmp.capacity : swa.capacity);
  }
  __device__ KeySource source(int src) const {
    const bool c = src == 0;
    return {c ? cmp.base : swa.base,           c ? cmp.S : swa.S,
            c ? cmp.page_stride : swa.page_stride, c ? cmp.row_stride : swa.row_stride,
            c ? cmp.fp8_scale : swa.fp8_scale, c ? cmp.aligned : swa.aligned};
  }
  __device__ int format(int src) const { return src == 0 ? cmp.format : swa.format; }
  // Whether source `src`'s records can be read by the vector loads and cp.async copies of the
  // 64-head gather (sparse_mla_wgmma.cuh, direct::): values, scales and rows 16-byte aligned (the
  // 584 record's 8 scale bytes: 8).
  __device__ bool stageable(int src) const {
    const KeySource c = source(src);
    return c.aligned && (format(src) != kNv || c.page_stride % 16 == 0);
  }
  // The values (or plain row) and scales of valid key k.
  __device__ void locate(KeyRef k, const uint8_t*& v, const uint8_t*& sc) const {
    const KeySource c = source(k.src);
    int64_t page, r;
    divmod(static_cast<int64_t>(k.e), c.S, page, r);
    const uint8_t* pg = c.base + page * c.page_stride;
    switch (format(k.src)) {
      case kV4: v = pg + V4Layout::value_offset(c.S, r), sc = pg + V4Layout::scale_offset(c.S, r); break;
      case kMx: v = pg + Mxfp8Layout::value_offset(c.S, r), sc = pg + Mxfp8Layout::scale_offset(c.S, r); break;
      case kNv: v = pg + Nvfp4Layout::value_offset(c.S, r), sc = pg + Nvfp4Layout::scale_offset(c.S, r); break;
      default: v = pg + r * c.row_stride, sc = nullptr; break;
    }
  }
  // Part `seg` (0..3) of the L2 prefetch of key k's record (nothing for a masked key).
  __device__ void prefetch(KeyRef k, int seg) const {
    if (!valid(k)) return;
    const KeySource c = source(k.src);
    int64_t page, r;
    divmod(static_cast<int64_t>(k.e), c.S, page, r);
    const uint8_t* pg = c.base + page * c.page_stride;
    switch (format(k.src)) {
      case kV4: prefetch_record_part(pg + V4Layout::value_offset(c.S, r), V4Layout::kValueBytes, pg + V4Layout::scale_offset(c.S, r), seg); break;
      case kMx:
        prefetch_record_part(pg + Mxfp8Layout::value_offset(c.S, r), Mxfp8Layout::kValueBytes, pg + Mxfp8Layout::scale_offset(c.S, r), seg);
        break;
      case kNv:
        prefetch_record_part(pg + Nvfp4Layout::value_offset(c.S, r), Nvfp4Layout::kValueBytes, pg + Nvfp4Layout::scale_offset(c.S, r), seg);
        break;
      case kBf16: prefetch_record_part(pg + r * c.row_stride, 2 * kDim, nullptr, seg); break;
      default: prefetch_record_part(pg + r * c.row_stride, kDim, nullptr, seg); break;
    }
  }
  // dims [16 lane, 16 lane + 16) of `nk` keys as bf16x2 words (masked keys: zeros); when all come
  // from one source, its format is resolved once and their loads are issued together
  template <int NK>
  __device__ void read(const KeyRef (&k)[NK], const bool (&ok)[NK], int lane, uint32_t (&w)[NK][8]) const {
    bool one = true;
#pragma unroll
    for (int i = 1; i < NK; ++i) one = one && k[i].src == k[0].src;
    if (one && k[0].src >= 0) {
      const KeySource c = source(k[0].src);
      const auto batch = [&](auto F) {
#pragma unroll
        for (int i = 0; i < NK; ++i) {
          if (ok[i]) {
            read_slot_chunk<F()>(c, k[i].e, lane, w[i]);
          } else {
#pragma unroll
            for (int x = 0; x < 8; ++x) w[i][x] = 0;
          }
        }
      };
      switch (format(k[0].src)) {
        case kV4: batch(std::integral_constant<int, kV4>{}); break;
        case kMx: batch(std::integral_constant<int, kMx>{}); break;
        case kNv: batch(std::integral_constant<int, kNv>{}); break;
        case kBf16: batch(std::integral_constant<int, kBf16>{}); break;
        default: batch(std::integral_constant<int, kFp8>{}); break;
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      if (ok[i]) {
        read_slot_chunk(format(k[i].src), source(k[i].src), k[i].e, lane, w[i]);
      } else {
#pragma unroll
        for (int x = 0; x < 8; ++x) w[i][x] = 0;
      }
    }
  }
};

// Prefill's bf16 workspace rows: row indices[t][j] for j < topk_length[t], masked outside
// [0, s_kv).
struct WorkspaceSource {
  // gathered by all 8 warps of the 64-head kernel (a producer warpgroup of 4 took 18.8 against
  // 15.3 ms for 32K tokens: four warps wait on these plain 1 KiB rows' latency)
  static constexpr bool kProducerWarps = false;
  const uint16_t* kv = nullptr;
  int64_t s_kv = 0, kv_stride = 0;
  const int32_t* idx = nullptr;
  int64_t idx_stride = 0;
  const int32_t* len = nullptr;
  int64_t topk = 0;
  struct List {
    int64_t n;
    const int32_t* row;
  };
  __device__ List begin(int64_t t) const {
    const int32_t l = ld_early(len + t);
    return {l < 0 ? 0 : l > topk ? topk : l, idx + t * idx_stride};
  }
  __device__ KeyRef entry(const List& l, int64_t j) const {
    KeyRef k;
    if (j < l.n) {
      k.e = l.row[j];
      k.src = 0;
    }
    return k;
  }
  __device__ bool valid(KeyRef k) const { return k.src == 0 && k.e >= 0 && k.e < s_kv; }
  // dims [16 lane, 16 lane + 16) of `nk` keys as bf16x2 words (masked keys: zeros), plain loads
  // as decode's (the cp.async form gave wrong rows with the 16-row head tile on the H200; it comes
  // back once that is understood: docs/changelog.md)
  template <int NK>
  __device__ void read(const KeyRef (&k)[NK], const bool (&ok)[NK], int lane, uint32_t (&w)[NK][8]) const {
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      if (ok[i]) {
        const uint4* src = reinterpret_cast<const uint4*>(kv + static_cast<int64_t>(k[i].e) * kv_stride + 16 * lane);
        const uint4 a = __ldg(src), b = __ldg(src + 1);
        w[i][0] = a.x; w[i][1] = a.y; w[i][2] = a.z; w[i][3] = a.w;
        w[i][4] = b.x; w[i][5] = b.y; w[i][6] = b.z; w[i][7] = b.w;
      } else {
#pragma unroll
        for (int x = 0; x < 8; ++x) w[i][x] = 0;
      }
    }
  }
};

// The chunk addresses of a key tile: rows of 1024 bytes, chunk c of row r at c ^ (r % 8) (the
// mma.sync mainloop's ldmatrix tiles).
struct RowTile {
  __device__ static uint32_t addr(uint32_t tile, int row, int chunk) { return tile_addr(tile, row, chunk, kChunks); }
};

// Produces key block `b` into key tile `buf` (the mma.sync mainloop's): warp w handles keys 8 w ..
// 8 w + 7, lane l dims [16 l, 16 l + 16) (chunks 2 l, 2 l + 1 of the row); masked keys are zero
// rows (P is 0 there, and 0 * garbage could be NaN). `pend` holds, in lane k < 8, the key of this
// block the warp's k-th row is; it is replaced by that of block b + 1 (the index load runs a block
// ahead). NB keys' loads are issued before their stores. (The 64-head kernels stage their keys by
// cp.async instead: sparse_mla_wgmma.cuh.)
template <int NB, class Src>
__device__ __forceinline__ void produce(const Src& src, const typename Src::List& list, int64_t b, int buf, uint32_t sk,
                                        int32_t* svalid, int warp, int lane, KeyRef& pend) {
  const uint32_t tile = sk + static_cast<uint32_t>(buf * kBlock * kRowBytes);
  static_assert(kKeysPerWarp % NB == 0);
#pragma unroll
  for (int k0 = 0; k0 < kKeysPerWarp; k0 += NB) {
    KeyRef key[NB];
    bool ok[NB];
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      key[i].e = __shfl_sync(0xFFFFFFFFu, pend.e, k0 + i);
      key[i].src = __shfl_sync(0xFFFFFFFFu, pend.src, k0 + i);
      ok[i] = src.valid(key[i]);
    }
    uint32_t w[NB][8];
    src.read(key, ok, lane, w);
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      const int row = warp * kKeysPerWarp + k0 + i;
      const uint32_t s0 = RowTile::addr(tile, row, 2 * lane), s1 = RowTile::addr(tile, row, 2 * lane + 1);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(s0), "r"(w[i][0]), "r"(w[i][1]), "r"(w[i][2]),
                   "r"(w[i][3])
                   : "memory");
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(s1), "r"(w[i][4]), "r"(w[i][5]), "r"(w[i][6]),
                   "r"(w[i][7])
                   : "memory");
    }
#pragma unroll
    for (int i = 0; i < NB; ++i)
      if (lane == k0 + i) svalid[buf * kBlock + warp * kKeysPerWarp + lane] = ok[i] ? 1 : 0;
  }
  if (lane < kKeysPerWarp) pend = src.entry(list, (b + 1) * kBlock + warp * kKeysPerWarp + lane);
}

// One CTA: token t, head group g, split s (blockIdx.x = (t * head_groups + g) * splits + s).
template <int HT, class Src>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(const Heads p, const Src src) {
  using L = Smem<HT>;
  constexpr int kNB = HT == 64 ? 2 : 4;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_address(smem);
  const uint32_t sq = sbase + L::q, sk = sbase + L::k, sp = sbase + L::p, splo = sbase + L::plo;
  float* smax = reinterpret_cast<float*>(smem + L::max);
  float* slsum = reinterpret_cast<float*>(smem + L::lsum);
  float* salpha = reinterpret_cast<float*>(smem + L::alpha);
  float* smrow = reinterpret_cast<float*>(smem + L::mrow);
  int32_t* svalid = reinterpret_cast<int32_t*>(smem + L::valid);

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, tq = lane % 4;
  const int64_t item = blockIdx.x;
  const int split = static_cast<int>(item % p.splits);
  const int group = static_cast<int>((item / p.splits) % p.head_groups);
  const int64_t t = item / (static_cast<int64_t>(p.splits) * p.head_groups);
  const int h0 = group * HT;

  pdl_wait();
  // Q rows h0 .. h0 + HT - 1 (zero rows past H: the 8-head tile of a 16-row MMA)
  for (int c = static_cast<int>(threadIdx.x); c < HT * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.H) v = *reinterpret_cast<const uint4*>(p.q + t * p.q_tok + (h0 + r) * p.q_head + 8 * ch);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(tile_addr(sq, r, ch, kChunks)), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
  }
  const typename Src::List list = src.begin(t);
  const int64_t nb = (static_cast<int64_t>(list.n) + kBlock - 1) / kBlock;
  const int64_t per = (nb + p.splits - 1) / p.splits;
  const int64_t blo = split * per, bhi = blo + per < nb ? blo + per : nb;

  // S warp: row group rg, key slice sl; O warp: dims [64 warp, +64)
  const int rg = warp % L::kRowGroups, sl = warp / L::kRowGroups;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  float o[L::kMTiles][8][4];
#pragma unroll
  for (int mt = 0; mt < L::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][nt][x] = 0.0f;

  KeyRef pend;
  if (blo < bhi) {
    if (lane < kKeysPerWarp) pend = src.entry(list, blo * kBlock + warp * kKeysPerWarp + lane);
    produce<kNB>(src, list, blo, 0, sk, svalid, warp, lane, pend);
  }
  __syncthreads();

  for (int64_t b = blo; b < bhi; ++b) {
    const int cur = static_cast<int>((b - blo) & 1);
    const uint32_t kt = sk + static_cast<uint32_t>(cur * kBlock * kRowBytes);
    // ---- S = Q K^T for rows 16 rg .. +16, keys sl * kSliceKeys .. +kSliceKeys
    float s[L::kSliceTiles][4];
#pragma unroll
    for (int nt = 0; nt < L::kSliceTiles; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) s[nt][x] = 0.0f;
    const int key0 = sl * L::kSliceKeys;
    if constexpr (L::kSliceTiles >= 2) {
#pragma unroll 4
      for (int kk = 0; kk < kDim / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, a_frag_addr(sq, 16 * rg, 2 * kk, lane, kChunks));
#pragma unroll
        for (int np = 0; np < L::kSliceTiles / 2; ++np) {
          uint32_t bb[4];
          ldmatrix_x4(bb, bt_frag_addr(kt, key0 + 16 * np, 2 * kk, lane, kChunks));
          mma_bf16_16816(s[2 * np], a, bb[0], bb[1]);
          mma_bf16_16816(s[2 * np + 1], a, bb[2], bb[3]);
        }
      }
    } else {  // one n-tile of 8 keys: an x4 load covers two k-steps
#pragma unroll 4
      for (int kk = 0; kk < kDim / 16; kk += 2) {
        uint32_t a0[4], a1[4], bb[4];
        ldmatrix_x4(a0, a_frag_addr(sq, 16 * rg, 2 * kk, lane, kChunks));
        ldmatrix_x4(a1, a_frag_addr(sq, 16 * rg, 2 * kk + 2, lane, kChunks));
        ldmatrix_x4(bb, bt_frag2k_addr(kt, key0, 2 * kk, lane, kChunks));
        mma_bf16_16816(s[0], a0, bb[0], bb[1]);
        mma_bf16_16816(s[0], a1, bb[2], bb[3]);
      }
    }
    // ---- scores, masks, the slice's row maxima
    float mx[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < L::kSliceTiles; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int key = key0 + 8 * nt + 2 * tq + (x & 1);
        const float z = svalid[cur * kBlock + key] ? s[nt][x] * p.scale : kNegInf;
        s[nt][x] = z;
        mx[x / 2] = fmaxf(mx[x / 2], z);
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
    }
    if (tq == 0) {
      smax[sl * HT + 16 * rg + g] = mx[0];
      smax[sl * HT + 16 * rg + g + 8] = mx[1];
    }
    __syncthreads();  // (1) maxima visible; every warp is past its PV of block b - 1
    // ---- online softmax: the same running max in every slice; P (bf16) to shared memory
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 16 * rg + g + 8 * i;
      float bm = kNegInf;
#pragma unroll
      for (int x = 0; x < L::kSlices; ++x) bm = fmaxf(bm, smax[x * HT + row]);
      const float mn = fmaxf(m_run[i], bm);
      const float alpha = m_run[i] == kNegInf ? 0.0f : exp2f((m_run[i] - mn) * kLog2e);
      m_run[i] = mn;
      l_run[i] *= alpha;
      if (sl == 0 && tq == 0) salpha[row] = alpha;
    }
#pragma unroll
    for (int nt = 0; nt < L::kSliceTiles; ++nt) {
      uint32_t wv[2], wl[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float z0 = s[nt][2 * i], z1 = s[nt][2 * i + 1];
        const float p0 = z0 == kNegInf ? 0.0f : exp2f((z0 - m_run[i]) * kLog2e);
        const float p1 = z1 == kNegInf ? 0.0f : exp2f((z1 - m_run[i]) * kLog2e);
        split_bf16x2(p0, p1, wv[i], wl[i]);
        l_run[i] += p0 + p1;  // the fp32 weights (as FlashMLA): an exact fp32 lse
      }
      const int col = key0 + 8 * nt + 2 * tq;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = 16 * rg + g + 8 * i;
        const uint32_t off = tile_addr(0, row, col / 8, 2 * kBlock / 16) + 2 * (col % 8);
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(sp + off), "r"(wv[i]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(splo + off), "r"(wl[i]) : "memory");
      }
    }
    // ---- the next block into the other tile (its last reader, PV of block b - 1, is done)
    if (b + 1 < bhi) produce<kNB>(src, list, b + 1, cur ^ 1, sk, svalid, warp, lane, pend);
    __syncthreads();  // (2) P and the rescale factors visible (and a record block b + 1 stored)
    // ---- O = alpha O + P V for dims [64 warp, +64)
#pragma unroll
    for (int mt = 0; mt < L::kMTiles; ++mt) {
      const float a0 = salpha[16 * mt + g], a1 = salpha[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlock / 16; ++kk) {
      uint32_t a[L::kMTiles][4], al[L::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < L::kMTiles; ++mt) {
        ldmatrix_x4(a[mt], a_frag_addr(sp, 16 * mt, 2 * kk, lane, 2 * kBlock / 16));
        ldmatrix_x4(al[mt], a_frag_addr(splo, 16 * mt, 2 * kk, lane, 2 * kBlock / 16));
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, b_trans_frag_addr(kt, 16 * kk, 8 * warp + 2 * np, lane, kChunks));
#pragma unroll
        for (int mt = 0; mt < L::kMTiles; ++mt) {
          mma_bf16_16816(o[mt][2 * np], a[mt], bb[0], bb[1]);
          mma_bf16_16816(o[mt][2 * np + 1], a[mt], bb[2], bb[3]);
          mma_bf16_16816(o[mt][2 * np], al[mt], bb[0], bb[1]);
          mma_bf16_16816(o[mt][2 * np + 1], al[mt], bb[2], bb[3]);
        }
      }
    }
  }
  pdl_allow_dependents();

  // ---- the row sums of the slices, the running max; then each warp finishes its dims
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xFFFFFFFFu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xFFFFFFFFu, l_run[i], 2);
  }
  if (tq == 0) {
    slsum[sl * HT + 16 * rg + g] = l_run[0];
    slsum[sl * HT + 16 * rg + g + 8] = l_run[1];
    if (sl == 0) {
      smrow[16 * rg + g] = m_run[0];
      smrow[16 * rg + g + 8] = m_run[1];
    }
  }
  __syncthreads();
  constexpr float kInf = std::numeric_limits<float>::infinity();
#pragma unroll
  for (int mt = 0; mt < L::kMTiles; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 16 * mt + g + 8 * i, h = h0 + row;
      if (h >= p.H) continue;
      float l = 0.0f;
#pragma unroll
      for (int x = 0; x < L::kSlices; ++x) l += slsum[x * HT + row];
      const float m = smrow[row];
      if (p.splits == 1) {
        const float f = sink_factor(m, l, p.sink[h]);
        uint16_t* dst = p.out + t * p.out_tok + h * p.out_head + 64 * warp + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<uint32_t*>(dst + 8 * nt) = bf16x2_rn_hw(o[mt][nt][2 * i] * f, o[mt][nt][2 * i + 1] * f);
        if (warp == 0 && tq == 0) p.lse[t * p.lse_tok + h] = row_lse(m, l, kInf);
      } else {
        const float f = partial_factor(m, l);
        const int64_t part = (t * p.splits + split) * p.H + h;
        float* dst = p.ws_o + part * kDim + 64 * warp + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[mt][nt][2 * i] * f, o[mt][nt][2 * i + 1] * f);
        if (warp == 0 && tq == 0) p.ws_lse[part] = row_lse(m, l, kNegInf);
      }
    }
}

// The launch of one head tile and source. Each of the six is compiled in its own file of
// instantiations/ (explicit instantiation definitions), so that the heavy mainloops compile in
// parallel; every other translation unit sees the extern declarations below and compiles none.
template <class Src>
__global__ void sparse_mla_wg_kernel(const Heads p, const Src src);  // sparse_mla_wgmma.cuh
template <class Src>
__global__ void sparse_mla_ws_kernel(const Heads p, const Src src);  // sparse_mla_wgmma.cuh
// The producer warps of sparse_mla_ws_kernel, the registers (setmaxnreg) of a producer and of
// each consumer warpgroup's thread, and its block size (the producers, then two consumer
// warpgroups).
constexpr int kWsProducerWarps = 4, kWsProducerRegs = 112, kWsFirstConsumerRegs = 232, kWsSecondConsumerRegs = 160;
constexpr int kWsThreads = 32 * kWsProducerWarps + 256;

// The 64-head tile runs on warpgroup tensor cores (sparse_mla_wgmma.cuh): decode's records with a
// producer warpgroup (Src::kProducerWarps: the dequantization is most of a block's CUDA-core work),
// prefill's bf16 rows gathered by every warp; the 16- and 32-head tiles (tensor-parallel ranks of
// 8 or 16 heads, and 32 heads) on the mma.sync mainloop above.
template <int HT, class Src>
void launch_sparse_mla(const Heads& h, const Src& src, cudaStream_t st, bool pdl) {
  const auto launch = [&](auto* kernel, int smem, int threads) {
    DSV41KV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t ctas = h.T * h.head_groups * h.splits;
    launch_kernel_smem(kernel, dim3(static_cast<unsigned>(ctas)), dim3(threads), smem, st, pdl, h, src);
  };
  if constexpr (HT == 64 && Src::kProducerWarps) launch(&sparse_mla_ws_kernel<Src>, WgSmem::alloc, kWsThreads);
  else if constexpr (HT == 64) launch(&sparse_mla_wg_kernel<Src>, WgSmem::alloc, kThreads);
  else launch(&sparse_mla_kernel<HT, Src>, Smem<HT>::bytes, kThreads);
}

#define DSV41KV_SPARSE_MLA_INSTANCES(X) \
  X(16, CacheSource) X(32, CacheSource) X(64, CacheSource) X(16, WorkspaceSource) X(32, WorkspaceSource) X(64, WorkspaceSource)
#define DSV41KV_SPARSE_MLA_EXTERN(HT, SRC) \
  extern template void launch_sparse_mla<HT, SRC>(const Heads&, const SRC&, cudaStream_t, bool);
DSV41KV_SPARSE_MLA_INSTANCES(DSV41KV_SPARSE_MLA_EXTERN)
#define DSV41KV_INSTANTIATE_SPARSE_MLA(HT, SRC) \
  template void launch_sparse_mla<HT, SRC>(const Heads&, const SRC&, cudaStream_t, bool);

}  // namespace dsv41kv::detail::cuda::mla
