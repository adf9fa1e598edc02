// Host-only tuning knob of the CUDA compressor kernels, for the bench (`dsv41kv bench
// --program-warps`): which program geometry the fused/compress kernels use. 0 (default) picks
// by size (<= kSmallGridPrograms programs: four warps per program, else one warp); 1 or 4 force
// one. Process-wide; not part of the public API.
#pragma once

namespace dsv41kv::detail::cuda {
void set_program_warps_override(int warps);  // 0, 1 or 4
int program_warps_override();
}  // namespace dsv41kv::detail::cuda
