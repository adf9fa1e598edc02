// The dispatch every op's API entry shares, after its plan has checked the views: host views get
// their value checks (which read index data), then the CPU backend; device views the CUDA backend,
// or E8 in a build without CUDA. An empty call (no rows) runs no backend, but its host values are
// still checked. The backend entry points are declared in every build (the CUDA ones are defined
// only in CUDA builds and never called without them).
#pragma once

#include "core/validate.hpp"
#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

template <class Values, class Cpu, class Cuda>
void dispatch(const char* op, Device device, bool empty, Values&& check_values, Cpu&& cpu,
              [[maybe_unused]] Cuda&& cuda) {
  if (device == Device::CPU) {
    check_values();
    if (!empty) cpu();
    return;
  }
#if defined(DSV41KV_WITH_CUDA)
  if (!empty) cuda();
#else
  no_cuda(op);
#endif
}

// The dispatch of an op with a CPU backend only: device views get E8 (no_cuda_backend) in every
// build, after the same view checks.
template <class Values, class Cpu>
void dispatch_cpu_only(const char* op, Device device, bool empty, Values&& check_values, Cpu&& cpu) {
  if (device != Device::CPU) no_cuda_backend(op);
  check_values();
  if (!empty) cpu();
}

}  // namespace dsv41kv::detail
