// A 32-bit word fill of device memory on a stream (the runtime has only a byte memset): the
// padding rows' lse (+inf) and similar non-byte patterns of a step, without a host copy, so
// that a step stays free of allocations and capturable in a CUDA graph. CUDA builds only;
// includable from host C++ (no CUDA headers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv41kv::detail {

// dst[0 .. count) = word on `stream` (a cudaStream_t); dst 4-byte aligned. Throws Error(kCuda)
// when the launch fails.
void fill_words(void* dst, uint32_t word, size_t count, void* stream);

}  // namespace dsv41kv::detail
