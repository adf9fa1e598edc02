// The output inverse RoPE of SPEC 9.6 on one head row of the attention output, as host+device
// code shared by the CPU backend and the kernels to come: the NoPE dims 0..447 are copied, each
// RoPE pair (448 + 2i, 449 + 2i) is widened to fp32, rotated back with the one inverse pair
// rotation (num::rope_inverse, SPEC 1.4: y0 = fma(x0, c, x1 s), y1 = fma(x1, c, -(x0 s))) at the
// table row `trow` (32 cos, then 32 sin) and stored bf16 (RNE). `y` may be `o` (in place: each
// pair is read before it is written).
#pragma once

#include <cstdint>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

DSV41KV_HD void output_rope_row(const uint16_t* o, const float* trow, uint16_t* y) {
  for (int d = 0; d < kNopeDim; ++d) y[d] = o[d];
  for (int i = 0; i < kRopeDim / 2; ++i) {
    const int d0 = kNopeDim + 2 * i;
    float y0, y1;
    num::rope_inverse(num::bf16_decode(o[d0]), num::bf16_decode(o[d0 + 1]), trow[i], trow[kRopeDim / 2 + i], y0, y1);
    y[d0] = num::bf16_encode(y0);
    y[d0 + 1] = num::bf16_encode(y1);
  }
}

}  // namespace dsv41kv::detail
