// The RoPE of SPEC 1.4 applied to a stored bf16 vector: the queries of sparse MLA (SPEC 9.2,
// forward at the token's position on dims 448..511), the index queries (SPEC 8.2, dims 64..127)
// and the attention output (SPEC 9.6, inverse). The rotated dims are computed in fp32 with the
// pair rotation every insert uses (num::rope_forward / num::rope_inverse) and rounded once to bf16
// (SPEC 2.1); the other dims are copied bit for bit (SPEC 1.4: NoPE dims are never modified).
#pragma once

#include <cstdint>

#include "dsv41kv/numerics.hpp"
#include "dsv41kv/records.hpp"

namespace dsv41kv::detail {

enum class RopeDirection : uint8_t { kForward, kInverse };

// out = in with the last 64 of its `dim` dims [dim - 64, dim) rotated at table row `trow`
// (32 cos, then 32 sin). `out == in` rotates in place.
DSV41KV_HD void rope_bf16(const uint16_t* in, uint16_t* out, int dim, const float* trow, RopeDirection dir) {
  const int b = dim - kRopeDim;
  if (out != in)
    for (int d = 0; d < b; ++d) out[d] = in[d];
  for (int i = 0; i < kRopeDim / 2; ++i) {
    const float x0 = num::bf16_decode(in[b + 2 * i]), x1 = num::bf16_decode(in[b + 2 * i + 1]);
    const float c = trow[i], s = trow[kRopeDim / 2 + i];
    float y0, y1;
    if (dir == RopeDirection::kForward)
      num::rope_forward(x0, x1, c, s, y0, y1);
    else
      num::rope_inverse(x0, x1, c, s, y0, y1);
    out[b + 2 * i] = num::bf16_encode(y0);
    out[b + 2 * i + 1] = num::bf16_encode(y1);
  }
}

}  // namespace dsv41kv::detail
