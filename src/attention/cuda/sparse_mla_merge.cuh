// The split-K merge kernel of the sparse MLA (SPEC 9.4), apart from sparse_mla.cuh so that only
// the launcher's translation unit (attention_cuda.cu) defines it: the mainloop instantiations
// include sparse_mla.cuh too.
#pragma once

#include "attention/cuda/sparse_mla.cuh"

namespace dsv41kv::detail::cuda::mla {

// The split-K merge (SPEC 9.4): one warp per (token, head), lane l dims [16 l, 16 l + 16): the
// partials weighted by exp(lse_s - M), the sink once, empty rows 0 with lse +inf. Launched with
// PDL after sparse_mla_kernel (pdl_wait before reading the partials).
__global__ void __launch_bounds__(128) merge_kernel(const Heads p) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  pdl_wait();
  if (w >= p.T * p.H) return;
  const int64_t t = w / p.H;
  const int h = static_cast<int>(w % p.H);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity(), kInf = std::numeric_limits<float>::infinity();
  float M = kNegInf;
  for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.ws_lse[(t * p.splits + s) * p.H + h]);
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
  float L = 0.0f;
  if (M != kNegInf) {
    for (int s = 0; s < p.splits; ++s) {
      const int64_t part = (t * p.splits + s) * p.H + h;
      const float ls = p.ws_lse[part];
      if (ls == kNegInf) continue;
      const float wgt = expf(ls - M);
      L += wgt;
      const float* src = p.ws_o + part * kDim + 16 * lane;
#pragma unroll
      for (int i = 0; i < 16; i += 4) {
        const float4 v = ld4(src + i);
        acc[i] += wgt * v.x;
        acc[i + 1] += wgt * v.y;
        acc[i + 2] += wgt * v.z;
        acc[i + 3] += wgt * v.w;
      }
    }
  }
  const float f = sink_factor(M, L, p.sink[h]);
  uint32_t wv[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) wv[i] = bf16x2_rn_hw(acc[2 * i] * f, acc[2 * i + 1] * f);
  store_words<8>(reinterpret_cast<uint8_t*>(p.out + t * p.out_tok + h * p.out_head + 16 * lane), wv);
  if (lane == 0) p.lse[t * p.lse_tok + h] = row_lse(M, L, kInf);
}

}  // namespace dsv41kv::detail::cuda::mla
