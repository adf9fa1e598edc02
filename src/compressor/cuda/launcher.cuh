// Launch heuristics of the fused compress (+ insert) kernels: which kernel, which chunk size,
// which row mechanism and which grid shape for a call, instantiated per record writer in
// instantiations/.
#pragma once

#include <algorithm>
#include <atomic>

#include "compressor/cuda/decode_kernel.cuh"
#include "compressor/cuda/stream_kernel.cuh"
#include "dsv41kv/tuning.hpp"
#include "core/cuda/cuda_util.hpp"

namespace dsv41kv::detail::cuda {

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
void launch_compress_stream_c(const CompressParams& p, cudaStream_t stream, bool pdl, const CompressTuning& tn) {
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
    // (the kernel splits the tokens evenly, stream_share): measured faster at 32K for every
    // record (docs/changelog.md, v13). Larger grids keep one chunk per warp: spreading 256K
    // tokens evenly over the resident warps instead (each warp a long contiguous stretch) was
    // slower for both ratios, ratio 2 by far the most (docs/changelog.md, "Tried and did not
    // pay"): the one-chunk grid keeps the warps that run at the same time on neighbouring rows.
    const int64_t fit = resident_blocks<R, F, C, M>();
    // the grid's shape: stream_shape_r1 (a tapered tail on large grids)
    const StreamSplitR1 sp = stream_split_r1(p.N, C, fit, stream_shape_r1(p.N, C, fit, tn.taper));
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
// (16; dsv41kv/tuning.hpp), for both ratios, except ratio-1 NVFP4 which keeps 16. Smaller chunks keep
// the warps that run at the same time on nearer rows: at 256K, 8 measured faster than 16 for
// ratio 2 (nvfp4 the most) and each halving from 32 to 16 to 8 faster for ratio-1 v4 / mxfp8, but
// ratio-1 nvfp4 was slower with 8, before and after its warp writer (docs/changelog.md, v13,
// v14). Smaller grids keep 16: 32K ratio 2 was much slower with 8 (512 blocks = 1.3 waves of 396
// resident blocks where 16 makes one partial wave); 32K ratio 1 widens its grid anyway.
template <int R, int F>
void launch_compress_stream(const CompressParams& p, cudaStream_t stream, bool pdl, const CompressTuning& tn) {
  int c = tn.stream_chunk;
  if (c == 0) {
    const int64_t chunks8 = ((R == 2 ? (p.N + 1) / 2 : p.N) + kChunkLarge - 1) / kChunkLarge;
    const int64_t blocks8 = ((R == 2 ? p.num_reqs : 0) + chunks8 + 3) / 4;
    const bool large = (R == 2 || F != kNv) && blocks8 >= 4 * resident_blocks<R, F, kChunkLarge, (R == 1 ? kRowsTmaSwz : kRowsCp)>();
    c = large ? kChunkLarge : kChunkSmall;
  }
  // the chunk-8 ratio-1 kernel's TMA copies address a token by a 32-bit coordinate
  if (R == 1 && c == kChunkLarge && p.N > INT32_MAX) c = kChunkSmall;
  if (c == kChunkLarge) {
    launch_compress_stream_c<R, F, kChunkLarge, (R == 1 ? kRowsTmaSwz : kRowsCp)>(p, stream, pdl, tn);
    return;
  }
  if constexpr (R == 1 && F == kNv) {
    // rows and RoPE entries by TMA (kRowsTmaRot): sm_90+, 32-bit coordinates, a 16-byte aligned
    // table (a tensor map's global address), 8-byte aligned records (one store of the NoPE code
    // words), the scale offset from the values in 32 bits (S <= 2^22); grids of at least two
    // waves of one-chunk warps (256K: the TMA pipeline's gain; 32K, whose widened grid gives each
    // warp ~9 tokens, measured slower with it: the per-warp start costs more; docs/changelog.md,
    // v25)
    if (device_is_sm90_or_newer() && p.N <= INT32_MAX && p.table_rows >= 1 && p.table_rows <= INT32_MAX &&
        reinterpret_cast<uintptr_t>(p.table) % 16 == 0 && reinterpret_cast<uintptr_t>(p.cache.base) % 8 == 0 &&
        p.cache.page_stride_bytes % 8 == 0 && p.cache.S <= (int64_t{1} << 22) && tn.stream_rows != 1 &&
        (tn.stream_rows == 2 || (p.N + 4 * kChunkSmall - 1) / (4 * kChunkSmall) >=
                                            2 * resident_blocks<R, F, kChunkSmall, kRowsTmaRot>())) {
      launch_compress_stream_c<R, F, kChunkSmall, kRowsTmaRot>(p, stream, pdl, tn);
      return;
    }
  }
  launch_compress_stream_c<R, F, kChunkSmall, kRowsCp>(p, stream, pdl, tn);
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
void launch_compress(const CompressParams& p, int ratio, cudaStream_t stream, bool pdl, const CompressTuning& tn) {
  const int force = tn.program_warps;
  const bool small = force == 4 || (force != 1 && compress_programs(ratio, p.N, p.num_reqs) <= kSmallGridPrograms);
  if (ratio == 1) {
    if (small) launch_compress_g4<1, F>(p, stream, pdl);
    else launch_compress_stream<1, F>(p, stream, pdl, tn);
  } else {
    if (small) launch_compress_g4<2, F>(p, stream, pdl);
    else launch_compress_stream<2, F>(p, stream, pdl, tn);
  }
}

}  // namespace dsv41kv::detail::cuda
