// The AVX-512 form of the attention engine's block loops (kernel.hpp), for head chunks of 16 lanes
// (H a multiple of 16), chosen at run time (core/cpu_form.hpp). The layouts are kernel.hpp's:
// q [chunk][512][16], keys [key][512], scores and probabilities [chunk][kBlock][16], acc
// [chunk][512][16]. Each output element is computed by the same IEEE operations in the same order
// as the portable loops (fma chains over d ascending, over keys ascending), so the bits are the
// same; register blocks only change which elements are computed together. Private to attention/.
#pragma once

namespace dsv41kv::detail::attn::avx512 {

// z[c][j][l] = scale * (fma chain over d ascending of q[c][d][l] * k_j[d]) for j < n, c < chunks.
void block_scores(const float* qc, const float* kb, int n, float scale, int chunks, float* z);
// Per lane of each chunk: m = max_f over j < n of z, z[j] = fp32(exp(binary64(z[j]) - binary64(m))),
// l = the sum of those over j ascending from 0; m and l [chunks * 16].
void block_softmax(float* z, int n, int chunks, float* m, float* l);
// out[i] = static_cast<float>(std::exp(x[i])) for i < n (the softmax's exp: a vector evaluation
// that takes std::exp on the lanes it cannot vouch for; avx512.cpp says why it is the same).
void exp_f32(const double* x, int n, float* out);
// acc[c][d][l] = fma chain over j < n ascending of p[c][j][l] * k_j[d], from 0.
void block_pv(const float* p, const float* kb, int n, int chunks, float* acc);

// run_acc[c][d][l] = run_acc * fa[c * 16 + l] + (the fma chain of block_pv) * fb[c * 16 + l]: the
// log-sum-exp merge of the block's acc into the fold so far, without storing the block's acc.
void block_pv_merge(const float* p, const float* kb, int n, int chunks, float* run_acc, const float* fa,
                    const float* fb);

}  // namespace dsv41kv::detail::attn::avx512
