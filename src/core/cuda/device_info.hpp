// Facts of the current CUDA device that host-side plans size their grids by; plain C++ (no CUDA
// headers), so that host code of every module can ask. Defined in cuda_util.cu.
#pragma once

namespace dsv41kv::detail::cuda {
// SMs of the current device (cached per device).
int sm_count();
}  // namespace dsv41kv::detail::cuda
