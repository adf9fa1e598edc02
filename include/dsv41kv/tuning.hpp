// dsv41kv: launch choices of the CUDA compressor kernels, as a value a call may carry
// (ExecContext::compress_tuning). By default (no tuning, or every field at its default) the
// library decides by the size of the call; benchmarks and tests pass other values to time or
// compare each mechanism on the same inputs. Results never depend on the tuning: every choice is
// bit-identical to the CPU reference. The values are checked like every argument (E8).
#pragma once

namespace dsv41kv {

// Programs per chunk of the one-warp streaming kernel (pairs for ratio 2, tokens for ratio 1).
inline constexpr int kStreamChunkSmall = 16, kStreamChunkLarge = 8;
// At most this many head and tail parts in a ratio-1 grid shape.
inline constexpr int kStreamHeadMax = 2, kStreamTailMax = 3;

// The shape of the ratio-1 streaming grid (`dsv41kv bench --stream-head / --stream-tail`): head
// part k has max(1, head_waves[k] x resident warps) warps of at most head_chunk[k] tokens, tail
// parts likewise at the grid's end; parts whose chunk is not below the grid's chunk are left out.
struct StreamTaper {
  bool set = false;  // false: the library's own shape
  int nhead = 0, ntail = 0;
  double head_waves[kStreamHeadMax] = {}, tail_waves[kStreamTailMax] = {};
  int head_chunk[kStreamHeadMax] = {}, tail_chunk[kStreamTailMax] = {};
};

struct CompressTuning {
  // 0: by size (up to 1024 programs a program runs on a 128-thread block, above on one warp);
  // 1 or 4 forces one warp or four warps per program.
  int program_warps = 0;
  // 0: by grid size (kStreamChunkLarge for grids of many waves, else kStreamChunkSmall); either
  // value forces that chunk.
  int stream_chunk = 0;
  // How the ratio-1 NVFP4 chunk-16 kernel reads its kv rows and RoPE entries: 0 the library's
  // choice (TMA for grids of at least two waves where the device and arguments allow it), 1
  // cp.async, 2 TMA at any size where allowed.
  int stream_rows = 0;
  StreamTaper taper;
};
// Throws E8 "compress_tuning: ctx.compress_tuning: ..." naming the first invalid value (every
// call that receives a tuning checks it the same way before any launch).
void validate_compress_tuning(const CompressTuning& t);

}  // namespace dsv41kv
