// Launch interface of the fused compress (+ insert) kernels: the flat parameter struct (device
// pointers and sizes already validated and bounded on the host), the ratio-1 streaming grid's work
// split, and the launcher. The kernels live in stream_kernel.cuh / decode_kernel.cuh, the launch
// heuristics in launcher.cuh; each record writer is instantiated in its own translation unit
// (instantiations/compress_<format>.cu) to keep nvcc's work per file small.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "formats/cuda/record_writers.cuh"
#include "dsv41kv/tuning.hpp"

namespace dsv41kv::detail::cuda {

// Programs per chunk of the streaming kernel's two instantiations (tuning.hpp).
inline constexpr int kChunkSmall = kStreamChunkSmall, kChunkLarge = kStreamChunkLarge;

// One segment of the ratio-1 streaming grid: warps [w0, next segment's w0) split the tokens
// [t0, t0 + tokens) evenly, q = tokens / warps and r = tokens % warps computed on the host
// (stream_share). The first segment starts at warp 0 and token 0; unused segments (at the end)
// have w0 = INT64_MAX.
struct StreamSeg {
  int64_t w0 = INT64_MAX, t0 = 0, q = 0, r = 0;
};
inline constexpr int kStreamSegs = kStreamHeadMax + 1 + kStreamTailMax;  // head, body, tail

// One fused save-compress-norm [+ insert] launch (SPEC 4.4-4.6, 5.1, 7.5).
//
// Field order = the order of first use on the decode path, packed into as few 64-byte lines of
// the kernel's parameter constant bank as possible: the parameters start at c[0x0][0x210] on
// sm_90 and the immediate constant cache fetches 64-byte lines; a warp that reads a constant
// from a line not yet cached stalls at that instruction until the line arrives, and ncu showed
// those misses one after the other at every decode kernel's start (~20% of its stall samples,
// one per line touched: 5 lines for ratio 1, 5 for ratio 2 with the old order; docs/changelog.md,
// v16). In this order ratio 1 decode touches 3 lines (0x200: the flags, N, kv, kv_stride, slot,
// pos; 0x240: norm_w .. cache.page_stride_bytes; 0x280: the rest of the cache), ratio 2 one more
// (0x2c0: the ring); only the PCP instantiation of the decode kernel reads the PCP fields (line
// 0x300).
// Lines cost time per decode launch even when their misses overlap (a bank relaid for fewer
// serialised misses but one more line for ratio 1 measured slower for ratio 1; the PCP line less
// for ratio 2 measured faster: docs/changelog.md, v21, "Tried and did not pay" and "Parameter
// lines"), so the count of lines is what matters. The static_asserts below keep the groups
// inside their lines.
struct CompressParams {
  // line 0x200 (48 bytes after the driver's 16): what every program reads first
  uint8_t early_meta = 0;           // ExecContext::pdl_early_metadata (decode kernel)
  uint8_t pcp = 0;                  // ring policy kOpenRow: no tail store, prev_rows lookups
  float eps = 0.0f;
  int64_t N = 0;
  const float* kv = nullptr;        // [>= N, 512*ratio], row stride kv_stride floats (% 16 == 0)
  int64_t kv_stride = 0;
  const int64_t* slot = nullptr;    // [N] ratio 2 ring slots; ratio 1 validity mask
  const int64_t* pos = nullptr;     // [>= N]
  // line 0x240: the writer
  const uint16_t* norm_w = nullptr; // bf16 [512]
  const int64_t* ins_slot = nullptr;  // [N] (insert, record kernels only)
  const float* table = nullptr;     // [table_rows, 64]
  int64_t table_rows = 0;
  uint16_t* latent = nullptr;       // bf16 [>= N, 512] or null (fused without latent_out)
  CacheDst cache;                   // base, S, page_stride_bytes here; the rest in line 0x280
  // line 0x280 (after the cache's last 48 bytes): ratio 2 request metadata
  const int32_t* qsl = nullptr;     // [num_reqs + 1]
  const int32_t* t2r = nullptr;     // [N]
  // line 0x2c0: the ring (ratio 2)
  int64_t num_reqs = 0;
  int64_t ring_slots = 0;           // blocks * cap: ring slots >= this are treated as -1
  float* ring = nullptr;            // [blocks, cap, 1024] with the strides below (floats)
  int64_t ring_bs = 0, ring_rs = 0;
  FastDivmod cap_div;               // division by cap (ring slot -> block, row); cap = cap_div.d
  // PCP only
  const float* prev = nullptr;      // [prev_count, 1024], row stride prev_stride, or null
  int64_t prev_stride = 0, prev_count = 0;
  const int64_t* prev_idx = nullptr;  // [prev_n]
  int64_t prev_n = 0;
  // ratio-1 streaming kernel only (set by its launcher from stream_split_r1): the grid's warps
  // in kStreamSegs segments, see StreamSeg and stream_range
  StreamSeg seg[kStreamSegs] = {};
};
// byte offsets inside the parameter bank (struct offset + 0x210)
inline constexpr size_t kParamBankBase = 0x210;
constexpr size_t param_line(size_t struct_offset) { return (kParamBankBase + struct_offset) / 64; }
static_assert(param_line(offsetof(CompressParams, pos) + 7) == 0x200 / 64);
static_assert(param_line(offsetof(CompressParams, norm_w)) == 0x240 / 64);
static_assert(param_line(offsetof(CompressParams, cache) + offsetof(CacheDst, page_stride_bytes) + 7) == 0x240 / 64);
static_assert(param_line(offsetof(CompressParams, cache) + offsetof(CacheDst, capacity)) == 0x280 / 64);
static_assert(param_line(offsetof(CompressParams, t2r) + 7) == 0x280 / 64);
static_assert(param_line(offsetof(CompressParams, num_reqs)) == 0x2c0 / 64);
static_assert(param_line(offsetof(CompressParams, cap_div) + sizeof(FastDivmod) - 1) == 0x2c0 / 64);

// Ratio-1 streaming kernel work split: warp w of W takes tokens [lo, hi) of an even split of N,
// given q = N / W and r = N % W computed once on the host: the first r warps take q + 1 tokens,
// the others q, in token order. (Each warp used to compute w * N / W itself: a 64-bit division,
// i.e. a call to a ~70-instruction routine at every warp's start, 2.8% of the stall samples of
// the 256K ratio-1 kernel under ncu: docs/changelog.md, v16.)
DSV41KV_HD void stream_share(int64_t w, int64_t q, int64_t r, int64_t& lo, int64_t& hi) {
  const bool extra = w < r;
  lo = w * q + (extra ? w : r);
  hi = lo + q + (extra ? 1 : 0);
}

// Blocks (4 warps each) of the ratio-1 streaming kernel for N tokens in chunks of C, with `fit`
// blocks resident at once: one chunk per warp, or, when that leaves slots of the GPU empty, the
// grid widened up to `fit` blocks but not below kStreamMinTokensPerWarp tokens per warp. Every
// warp's share (stream_share) is then at most C tokens.
inline constexpr int64_t kStreamMinTokensPerWarp = 8;
inline int64_t stream_blocks_r1(int64_t N, int64_t C, int64_t fit) {
  const int64_t blocks = ((N + C - 1) / C + 3) / 4;
  const int64_t wide = ((N + kStreamMinTokensPerWarp - 1) / kStreamMinTokensPerWarp + 3) / 4;
  const int64_t w = wide < fit ? wide : fit;
  return blocks > w ? blocks : w;
}

// A head or tail part of a shaped ratio-1 grid: `warps` warps of at most `chunk` tokens each.
struct StreamPart {
  int64_t warps = 0, chunk = 0;
};
// The shape of a ratio-1 grid: head parts (the first tokens, in order), the body (the rest, in
// chunks of C), tail parts (the last tokens, the last part taking the last ones).
struct StreamShape {
  int nhead = 0;
  StreamPart head[kStreamHeadMax];
  int ntail = 0;
  StreamPart tail[kStreamTailMax];
};
// The ratio-1 grid and its split of N tokens (CompressParams::seg). Without head or tail parts:
// the grid of stream_blocks_r1, every warp one share of an even split (one chunk C, or less when
// a small grid is widened). With them (every part's chunk below C): head part k takes the next
// min(left, warps * chunk) tokens from the start, tail part k (from the last one backwards)
// from the end, the body the rest in chunks of C; each part's warps at most its chunk; whole
// blocks (the padding warps join the last segment). Why shapes: the block scheduler starts
// blocks in index order, so tail warps with short shares start last and the grid's last blocks
// end close together instead of one chunk-C block lifetime apart (the launcher's default, see
// launch_compress_stream_c). Head parts (first-wave blocks of different lengths, so that they
// are not all replaced at once) measured no gain at 256K (docs/changelog.md, v20); they stay
// for experiments (`dsv41kv bench --stream-head`).
struct StreamSplitR1 {
  int64_t blocks = 0;
  StreamSeg seg[kStreamSegs] = {};
};
inline StreamSplitR1 stream_split_r1(int64_t N, int64_t C, int64_t fit, const StreamShape& shape = {}) {
  StreamSplitR1 s;
  bool shaped = N > 0 && (shape.nhead > 0 || shape.ntail > 0) && shape.nhead >= 0 && shape.nhead <= kStreamHeadMax &&
                shape.ntail >= 0 && shape.ntail <= kStreamTailMax;
  for (int k = 0; shaped && k < shape.nhead; ++k)
    shaped = shape.head[k].warps > 0 && shape.head[k].chunk > 0 && shape.head[k].chunk < C;
  for (int k = 0; shaped && k < shape.ntail; ++k)
    shaped = shape.tail[k].warps > 0 && shape.tail[k].chunk > 0 && shape.tail[k].chunk < C;
  if (!shaped) {
    s.blocks = stream_blocks_r1(N, C, fit);
    const int64_t W = 4 * s.blocks;
    s.seg[0].w0 = 0;
    s.seg[0].q = N / W;
    s.seg[0].r = N % W;
    return s;
  }
  // parts in token order: heads, the body, tails
  const int n = shape.nhead + 1 + shape.ntail;
  int64_t tokens[kStreamSegs] = {}, warps[kStreamSegs] = {}, chunk[kStreamSegs] = {};
  for (int k = 0; k < shape.nhead; ++k) chunk[k] = shape.head[k].chunk;
  chunk[shape.nhead] = C;
  for (int k = 0; k < shape.ntail; ++k) chunk[shape.nhead + 1 + k] = shape.tail[k].chunk;
  int64_t left = N;
  for (int k = 0; k < shape.nhead; ++k) {
    const int64_t cap = shape.head[k].warps * shape.head[k].chunk;
    tokens[k] = left < cap ? left : cap;
    left -= tokens[k];
  }
  for (int k = shape.ntail - 1; k >= 0; --k) {
    const int64_t cap = shape.tail[k].warps * shape.tail[k].chunk;
    tokens[shape.nhead + 1 + k] = left < cap ? left : cap;
    left -= tokens[shape.nhead + 1 + k];
  }
  tokens[shape.nhead] = left;
  int64_t W = 0;
  for (int k = 0; k < n; ++k) {
    warps[k] = (tokens[k] + chunk[k] - 1) / chunk[k];
    W += warps[k];
  }
  const int64_t Wb = (W + 3) / 4 * 4;
  int last = n - 1;
  while (last > 0 && warps[last] == 0) --last;
  warps[last] += Wb - W;
  s.blocks = Wb / 4;
  int64_t w0 = 0, t0 = 0;
  int used = 0;
  for (int k = 0; k < n; ++k) {
    if (warps[k] == 0) continue;  // no warps, no tokens: not a segment
    s.seg[used].w0 = w0;
    s.seg[used].t0 = t0;
    s.seg[used].q = tokens[k] / warps[k];
    s.seg[used].r = tokens[k] % warps[k];
    ++used;
    w0 += warps[k];
    t0 += tokens[k];
  }
  return s;
}
// The shape the launcher gives a ratio-1 grid of N tokens in chunks of C with `fit` resident
// blocks (host, compressor_cuda.cu): the tuning's taper when one is set (CompressTuning::taper),
// otherwise, on grids of at least two waves of one chunk per warp,
// a tapered tail (chunk 8: half a wave of warps of at most 4 tokens, one wave of 2, a quarter
// wave of 1; chunk 16: half a wave of 8, half of 4, a quarter of 2), else none.
StreamShape stream_shape_r1(int64_t N, int64_t C, int64_t fit, const StreamTaper& taper = {});

// Tokens [lo, hi) of warp w: the last segment that starts at or before w.
DSV41KV_HD void stream_range(int64_t w, const StreamSeg (&seg)[kStreamSegs], int64_t& lo, int64_t& hi) {
  int64_t w0 = 0, t0 = 0, q = seg[0].q, r = seg[0].r;
#pragma unroll
  for (int k = 1; k < kStreamSegs; ++k) {
    if (w >= seg[k].w0) {
      w0 = seg[k].w0;
      t0 = seg[k].t0;
      q = seg[k].q;
      r = seg[k].r;
    }
  }
  stream_share(w - w0, q, r, lo, hi);
  lo += t0;
  hi += t0;
}

// Programs of a call: ratio 1: N; ratio 2: num_reqs + ceil(N / 2).
inline int64_t compress_programs(int ratio, int64_t N, int64_t num_reqs) {
  return ratio == 1 ? N : num_reqs + (N + 1) / 2;
}
// Up to this many programs a program runs on a 128-thread block (4 warps share one token:
// shorter latency for decode); above it on one warp (chunks of kChunk programs per warp).
inline constexpr int64_t kSmallGridPrograms = 1024;

// F = kNoRecord (compress only) or a RecordFormat value (fused compress + insert).
// pdl: programmatic dependent launch (ExecContext::programmatic_launch); tn: the launch choices
// (ExecContext::compress_tuning, or the defaults).
template <int F>
void launch_compress(const CompressParams& p, int ratio, cudaStream_t stream, bool pdl, const CompressTuning& tn);

// The first `rows` ratio-1 kv rows (512 floats each, `row_stride` floats apart, 16-byte aligned,
// row_stride % 16 == 0, rows in [1, 2^31)) as a TMA tensor map for the streaming kernel's row
// copies: three dimensions {32 floats, 16 lines of 128 bytes, rows}, a box of one whole row, the
// 128-byte swizzle (RowSwizzled in warp_program.cuh). Encoded on the host (the driver's
// cuTensorMapEncodeTiled, through the runtime's entry-point query: no libcuda link), no device
// work; passed by value as a kernel parameter, so graph capture records it with the launch.
// Error(kCuda) when the driver refuses (not expected for validated arguments). Only for devices
// of compute capability >= 9.0 (the launcher passes an unused zero map elsewhere).
// swizzle: the 128-byte swizzle (RowSwizzled) or none (RowRotated).
CUtensorMap kv_rows_tensor_map(const float* kv, int64_t rows, int64_t row_stride, bool swizzle);
// The RoPE table [rows, 64] floats (16-byte aligned, rows in [1, 2^31)) as a TMA tensor map of
// one table row per box, no swizzle (the ratio-1 NVFP4 kernel's RoPE copies, kRowsTmaRot).
CUtensorMap rope_table_tensor_map(const float* table, int64_t rows);

}  // namespace dsv41kv::detail::cuda
