// Host-only tuning knobs of the CUDA compressor kernels, for the bench and the GPU tests.
// Process-wide; not part of the public API.
#pragma once

namespace dsv41kv::detail::cuda {

// Program geometry of the fused/compress kernels (`dsv41kv bench --program-warps`): 0 (default)
// picks by size (<= kSmallGridPrograms programs: four warps per program, else one warp); 1 or 4
// force one.
void set_program_warps_override(int warps);  // 0, 1 or 4
int program_warps_override();

// Programs per chunk of the streaming kernel (pairs for ratio 2, tokens for ratio 1; see
// cuda_compress.cuh): 0 (default) picks by grid size (kChunkLarge for grids of many waves, else
// kChunkSmall); either value forces that one (the GPU tests run both on the same inputs).
inline constexpr int kChunkSmall = 16, kChunkLarge = 8;
void set_stream_chunk_override(int programs);
int stream_chunk_override();

// How the ratio-1 NVFP4 chunk-16 kernel copies its kv rows and RoPE entries: 0 (default) TMA
// for grids of at least two waves where the device and arguments allow it (kRowsTmaRot in
// cuda_compress.cuh), else cp.async; 1 cp.async; 2 TMA at any size where allowed (the GPU tests
// run both on the same inputs).
void set_stream_rows_override(int mode);  // 0, 1 or 2
int stream_rows_override();

// Shape of the ratio-1 streaming grid (`dsv41kv bench --stream-head / --stream-tail
// W,C[;W,C...]`): head part k has max(1, Wk x (resident warps)) warps of at most Ck tokens, the
// same for the tail parts (stream_shape_r1; parts with Ck >= the grid's chunk are left out).
// `set` false (default): the library's own shape.
inline constexpr int kStreamHeadMax = 2, kStreamTailMax = 3;
struct StreamTaper {
  bool set = false;
  int nhead = 0, ntail = 0;
  double head_waves[kStreamHeadMax] = {}, tail_waves[kStreamTailMax] = {};
  int head_chunk[kStreamHeadMax] = {}, tail_chunk[kStreamTailMax] = {};
};
void set_stream_taper_override(const StreamTaper& t);

}  // namespace dsv41kv::detail::cuda
