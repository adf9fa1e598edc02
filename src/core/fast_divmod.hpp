// Division by a divisor that is fixed for a whole launch (ring capacity, states per cache page)
// without a division instruction: the GPU has none, and a 32-bit division is a ~20-instruction
// dependent sequence (a 64-bit one several times longer) that sits on the critical path of the
// latency-bound decode kernels. The host prepares a multiplier once per launch
// (Granlund-Montgomery, "round-up" variant, Hacker's Delight 10-9):
//   l = ceil(log2 d),  m = floor(2^32 (2^l - d) / d) + 1,  q = (mulhi(m, a) + a) >> l,
// exact for every 0 <= a < 2^31 and 1 <= d < 2^31 (the sum cannot overflow 32 bits there).
// Values outside that range fall back to the plain division. Host and device share the code;
// tests/core/test_fast_divmod.cpp checks it against `/` and `%` over every shape of divisor.
#pragma once

#include <cstdint>

#include "dsv41kv/common.hpp"

namespace dsv41kv::detail {

struct FastDivmod {
  int64_t d = 1;       // the divisor (> 0)
  uint32_t d32 = 1;    // d as 32 bits (when fast)
  uint32_t mul = 1;    // m above (when fast)
  uint32_t shift = 0;  // l above (when fast)
  bool fast = true;    // 1 <= d < 2^31: the multiply-shift path is valid for a < 2^31

  // Host side: d must be > 0 (the callers' plans guarantee it).
  static FastDivmod make(int64_t d) {
    FastDivmod f;
    f.d = d;
    f.fast = d >= 1 && d < (int64_t{1} << 31);
    if (!f.fast) return f;
    f.d32 = static_cast<uint32_t>(d);
    uint32_t l = 0;
    while ((uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;
    f.shift = l;
    f.mul = static_cast<uint32_t>((((uint64_t{1} << l) - static_cast<uint64_t>(d)) << 32) /
                                      static_cast<uint64_t>(d) +
                                  1);
    return f;
  }
};

DSV41KV_HD uint32_t mulhi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// q = a / f.d, r = a % f.d for a >= 0.
DSV41KV_HD void divmod_fast(int64_t a, const FastDivmod& f, int64_t& q, int64_t& r) {
  if (f.fast && static_cast<uint64_t>(a) < (uint64_t{1} << 31)) {
    const uint32_t a32 = static_cast<uint32_t>(a);
    const uint32_t q32 = (mulhi_u32(f.mul, a32) + a32) >> f.shift;
    q = q32;
    r = a32 - q32 * f.d32;
  } else {
    q = a / f.d;
    r = a - q * f.d;
  }
}

}  // namespace dsv41kv::detail
