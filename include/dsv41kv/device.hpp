// dsv41kv: what CUDA support this build has and what GPU the process can see.
#pragma once

#include <string>

namespace dsv41kv {

// True when the library was built with the CUDA backend (DSV41KV_CUDA=ON).
bool built_with_cuda();
// True when built with CUDA and at least one device is visible to the CUDA runtime.
bool cuda_device_available();
// "NVIDIA H200 (sm_90, 132 SMs)" or the reason there is none ("built without CUDA",
// "no CUDA device: <runtime message>").
std::string cuda_device_description();

}  // namespace dsv41kv
