// The CPU attention engine of SPEC 9.2 shared by sparse_decode and sparse_prefill: one query
// token's key list attended in fixed key blocks, split-K over the blocks with a log-sum-exp merge
// in block order, the sink applied once after the merge. Private to attention/.
//
// Numerics (docs/numerics.md, SPEC 9.7; every step fp32 unless said):
//   block of keys k_0 .. k_{n-1} (n <= kDecodeKeyBlock, in key-list order):
//     z_j[h]  = s * (fma chain over d = 0..511 ascending of q[h][d] * k_j[d], from 0)
//     m[h]    = max_j z_j[h]
//     p_j[h]  = fp32(exp(binary64(z_j[h]) - binary64(m[h])))        (binary64 exp, one rounding)
//     l[h]    = sum_j p_j[h]                    (j ascending)
//     acc[h][d] = fma chain over j ascending of p_j[h] * k_j[d], from 0   (probabilities stay fp32)
//   merge of the fold so far (m, l, acc) with the next block (m', l', acc'):
//     M = max(m, m'), a = fp32(exp(m - M)), b = fp32(exp(m' - M))  (one of them exactly 1)
//     l = l * a + l' * b,  acc = acc * a + acc' * b  (two products, one add)
//   finalize: lse = fp32(binary64(m) + log(binary64(l))); with the sink s: M = max(m, s),
//     a = fp32(exp(m - M)), b = fp32(exp(s - M)), r = a / (l * a + b), out = bf16(acc * r);
//     s = +inf: out = 0; s = -inf: b = 0 (no effect). A token without keys: out = 0, lse = +inf.
// The blocks are fixed by the key list alone (the first kDecodeKeyBlock keys, the next, ...) and
// always folded in order, so neither the split count nor the thread count changes a bit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "attention/avx512.hpp"
#include "attention/simd.hpp"
#include "core/cpu_form.hpp"
#include "core/parallel.hpp"
#include "dsv41kv/attention.hpp"
#include "dsv41kv/numerics.hpp"

namespace dsv41kv::detail::attn {

inline constexpr int kBlock = kDecodeKeyBlock;
inline constexpr int kD = kLatentDim;
inline constexpr int kMaxHeads = 128;  // the largest of kAttentionHeadCounts

// The views of one attention call (strides in elements).
struct Io {
  int64_t T = 0;
  int H = 0;
  const uint16_t* q = nullptr;
  int64_t q_tok = 0, q_head = 0;
  const float* sink = nullptr;
  float scale = 0.0f;
  uint16_t* out = nullptr;
  int64_t out_tok = 0, out_head = 0;
  float* lse = nullptr;
  int64_t lse_tok = 0;
};

// Heads are processed in chunks of HC lanes (8 for H = 8, else 16): per-head arrays are laid out
// [chunk][x][lane], so that the inner loops run over HC contiguous floats.
inline int lanes(int H) { return H % 16 == 0 ? 16 : 8; }

// The state of one key block or of the fold so far: m [H], l [H], acc [chunks][512][HC].
inline int64_t partial_floats(int H) { return int64_t{H} * (2 + kD); }
struct Partial {
  float* m;
  float* l;
  float* acc;
  static Partial at(float* base, int H) { return {base, base + H, base + 2 * H}; }
};

inline float exp_f(double x) { return static_cast<float>(std::exp(x)); }

// z for keys [0, n4) (n4 a multiple of 4; keys past the block's n are zero rows) of one head
// chunk of 8 * NV lanes: four keys against the chunk's heads per pass, every z an fma chain over d
// ascending.
template <int NV>
void block_scores(const float* qc, const float* kb, int n4, float scale, float* z) {
  constexpr int HC = 8 * NV;
  const V8 sc = v8_set(scale);
  for (int j0 = 0; j0 < n4; j0 += 4) {
    V8 acc[4][NV];
    for (auto& a : acc)
      for (auto& v : a) v = v8_zero();
    const float* k0 = kb + (j0 + 0) * kD;
    const float* k1 = kb + (j0 + 1) * kD;
    const float* k2 = kb + (j0 + 2) * kD;
    const float* k3 = kb + (j0 + 3) * kD;
    for (int d = 0; d < kD; ++d) {
      V8 q[NV];
      for (int v = 0; v < NV; ++v) q[v] = v8_load(qc + d * HC + 8 * v);
      const V8 kk[4] = {v8_set(k0[d]), v8_set(k1[d]), v8_set(k2[d]), v8_set(k3[d])};
      for (int jj = 0; jj < 4; ++jj)
        for (int v = 0; v < NV; ++v) acc[jj][v] = v8_fma(q[v], kk[jj], acc[jj][v]);
    }
    for (int jj = 0; jj < 4; ++jj)
      for (int v = 0; v < NV; ++v) v8_store(z + (j0 + jj) * HC + 8 * v, v8_mul(sc, acc[jj][v]));
  }
}

// acc[d][lane] = fma chain over j < n ascending of p[j][lane] * k_j[d], for one head chunk of
// 8 * NV lanes, four dims per pass.
template <int NV>
void block_pv(const float* p, const float* kb, int n, float* acc) {
  constexpr int HC = 8 * NV;
  for (int d0 = 0; d0 < kD; d0 += 4) {
    V8 a[4][NV];
    for (auto& r : a)
      for (auto& v : r) v = v8_zero();
    for (int j = 0; j < n; ++j) {
      V8 pj[NV];
      for (int v = 0; v < NV; ++v) pj[v] = v8_load(p + j * HC + 8 * v);
      const float* kj = kb + j * kD + d0;
      for (int dd = 0; dd < 4; ++dd) {
        const V8 x = v8_set(kj[dd]);
        for (int v = 0; v < NV; ++v) a[dd][v] = v8_fma(pj[v], x, a[dd][v]);
      }
    }
    for (int dd = 0; dd < 4; ++dd)
      for (int v = 0; v < NV; ++v) v8_store(acc + (d0 + dd) * HC + 8 * v, a[dd][v]);
  }
}

// Per-thread buffers of one call.
struct Scratch {
  int H = 0, HC = 0, chunks = 0;
  LineVector<float> qc;         // [chunks][512][HC]
  LineVector<float> kb;         // [kBlock][512] keys of the current block
  LineVector<float> z;          // [chunks][kBlock][HC] scores, then probabilities
  LineVector<float> blk, run;   // Partial storage
  explicit Scratch(int H_)
      : H(H_), HC(lanes(H_)), chunks(H_ / lanes(H_)), qc(static_cast<size_t>(H_) * kD),
        kb(static_cast<size_t>(kBlock) * kD), z(static_cast<size_t>(H_) * kBlock),
        blk(static_cast<size_t>(partial_floats(H_))), run(static_cast<size_t>(partial_floats(H_))) {}
};

// The buffers of the calls made from one thread, kept for its next call: every worker's Scratch
// and the split-K workspace. Allocating and zeroing them per call (half a MiB per worker, the
// workspace 128 KiB per block) cost a quarter of a one-token decode on two threads. Nothing a
// call reads from them was written by an earlier call: load_q, the key loads and every block
// write what the loops then read.
struct RunBuffers {
  int H = 0;
  std::vector<std::unique_ptr<Scratch>> scratch;
  LineVector<float> ws;
};
inline RunBuffers& run_buffers() {
  thread_local RunBuffers b;
  return b;
}

// q of token t widened to fp32 in the [chunk][d][lane] layout.
inline void load_q(const Io& io, int64_t t, Scratch& s) {
  for (int h = 0; h < io.H; ++h) {
    const uint16_t* qh = io.q + t * io.q_tok + h * io.q_head;
    float* dst = s.qc.data() + static_cast<size_t>((h / s.HC) * kD * s.HC + h % s.HC);
    for (int d = 0; d < kD; ++d) dst[d * s.HC] = num::bf16_decode(qh[d]);
  }
}

// The partial of the n keys in s.kb (1 <= n <= kBlock) into `out`, in the given form (the AVX-512
// one for chunks of 16 lanes; the same bits either way).
inline void compute_block(const Io& io, Scratch& s, int n, Partial out, CpuForm form) {
#if defined(DSV41KV_AVX512_FORMS)
  if (form == CpuForm::kAvx512 && s.HC == 16) {
    avx512::block_scores(s.qc.data(), s.kb.data(), n, io.scale, s.chunks, s.z.data());
    avx512::block_softmax(s.z.data(), n, s.chunks, out.m, out.l);
    avx512::block_pv(s.z.data(), s.kb.data(), n, s.chunks, out.acc);
    return;
  }
#else
  (void)form;
#endif
  const int n4 = (n + 3) / 4 * 4;
  std::fill(s.kb.begin() + static_cast<ptrdiff_t>(n) * kD, s.kb.begin() + static_cast<ptrdiff_t>(n4) * kD, 0.0f);
  const int HC = s.HC;
  for (int c = 0; c < s.chunks; ++c) {
    const float* qc = s.qc.data() + static_cast<size_t>(c) * kD * HC;
    float* z = s.z.data() + static_cast<size_t>(c) * kBlock * HC;
    if (HC == 16) block_scores<2>(qc, s.kb.data(), n4, io.scale, z);
    else block_scores<1>(qc, s.kb.data(), n4, io.scale, z);
    for (int l = 0; l < HC; ++l) {
      const int h = c * HC + l;
      float m = z[l];
      for (int j = 1; j < n; ++j) m = num::max_f(m, z[j * HC + l]);
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float pj = exp_f(static_cast<double>(z[j * HC + l]) - static_cast<double>(m));
        z[j * HC + l] = pj;
        sum = num::add_rn(sum, pj);
      }
      out.m[h] = m;
      out.l[h] = sum;
    }
    float* acc = out.acc + static_cast<size_t>(c) * kD * HC;
    if (HC == 16) block_pv<2>(z, s.kb.data(), n, acc);
    else block_pv<1>(z, s.kb.data(), n, acc);
  }
}

// The log-sum-exp merge of SPEC 9.2 for every head: with M = max(m, m'), the factors a = fp32(exp(m
// - M)) of the fold so far and b = fp32(exp(m' - M)) of the next block into fa, fb [H]; run.l and
// run.m take the merged values (run.acc is left to the caller: acc * a + acc' * b).
inline void merge_factors(Partial run, Partial blk, int H, float* fa, float* fb) {
  for (int h = 0; h < H; ++h) {
    const float M = num::max_f(run.m[h], blk.m[h]);
    fa[h] = exp_f(static_cast<double>(run.m[h]) - static_cast<double>(M));
    fb[h] = exp_f(static_cast<double>(blk.m[h]) - static_cast<double>(M));
    run.l[h] = num::add_rn(num::mul_rn(run.l[h], fa[h]), num::mul_rn(blk.l[h], fb[h]));
    run.m[h] = M;
  }
}

// run = run (+) blk in log-sum-exp form (run holds at least one block).
inline void merge(Partial run, Partial blk, int H) {
  float fa[kMaxHeads], fb[kMaxHeads];
  merge_factors(run, blk, H, fa, fb);
  const int HC = lanes(H);
  for (int c = 0; c < H / HC; ++c) {
    float* ra = run.acc + static_cast<size_t>(c) * kD * HC;
    const float* ba = blk.acc + static_cast<size_t>(c) * kD * HC;
    for (int v = 0; v < HC / 8; ++v) {
      const V8 av = v8_load(fa + c * HC + 8 * v), bv = v8_load(fb + c * HC + 8 * v);
      for (int d = 0; d < kD; ++d) {
        float* r = ra + d * HC + 8 * v;
        v8_store(r, v8_add(v8_mul(v8_load(r), av), v8_mul(v8_load(ba + d * HC + 8 * v), bv)));
      }
    }
  }
}

// run = run (+) the partial of the n keys in s.kb, with blk as the block's storage. The AVX-512
// form merges each tile of the PV product into run.acc as it leaves the registers (the same
// products and sum as merge()), so the block's acc is never stored.
inline void fold_block(const Io& io, Scratch& s, int n, Partial run, Partial blk, CpuForm form) {
#if defined(DSV41KV_AVX512_FORMS)
  if (form == CpuForm::kAvx512 && s.HC == 16) {
    avx512::block_scores(s.qc.data(), s.kb.data(), n, io.scale, s.chunks, s.z.data());
    avx512::block_softmax(s.z.data(), n, s.chunks, blk.m, blk.l);
    float fa[kMaxHeads], fb[kMaxHeads];
    merge_factors(run, blk, s.H, fa, fb);
    avx512::block_pv_merge(s.z.data(), s.kb.data(), n, s.chunks, run.acc, fa, fb);
    return;
  }
#endif
  compute_block(io, s, n, blk, form);
  merge(run, blk, s.H);
}

inline void copy_partial(Partial dst, Partial src, int H) {
  std::memcpy(dst.m, src.m, sizeof(float) * static_cast<size_t>(partial_floats(H)));
}

// out[t], lse[t] of a token without valid keys (SPEC 9.3).
inline void empty_row(const Io& io, int64_t t) {
  for (int h = 0; h < io.H; ++h) {
    std::memset(io.out + t * io.out_tok + h * io.out_head, 0, sizeof(uint16_t) * kD);
    io.lse[t * io.lse_tok + h] = std::numeric_limits<float>::infinity();
  }
}

// out[t], lse[t] from the fold of all of the token's blocks, the sink applied once.
inline void finalize(const Io& io, int64_t t, Partial run, int HC) {
  for (int h = 0; h < io.H; ++h) {
    const float m = run.m[h], l = run.l[h], sk = io.sink[h];
    io.lse[t * io.lse_tok + h] = static_cast<float>(static_cast<double>(m) + std::log(static_cast<double>(l)));
    uint16_t* o = io.out + t * io.out_tok + h * io.out_head;
    if (sk == std::numeric_limits<float>::infinity()) {
      std::memset(o, 0, sizeof(uint16_t) * kD);
      continue;
    }
    const float M = num::max_f(m, sk);
    const float a = exp_f(static_cast<double>(m) - static_cast<double>(M));
    const float b = exp_f(static_cast<double>(sk) - static_cast<double>(M));
    const float r = num::div_rn(a, num::add_rn(num::mul_rn(l, a), b));
    const float* acc = run.acc + static_cast<size_t>((h / HC) * kD * HC + h % HC);
    for (int d = 0; d < kD; ++d) o[d] = num::bf16_encode(num::mul_rn(acc[d * HC], r));
  }
}

// Runs the attention of every token of `io` over the key lists of `src`:
//   src.each(t, f)               f(key) for the valid keys of token t, in key-list order
//   src.load(key, float* dst)    one key's 512 values (K = V)
// with `splits` work items per token (1 .. key blocks of the widest list; more is clamped), the
// block loops in the given form.
template <class Src>
void run(const Io& io, const Src& src, int64_t splits, const ExecContext& ctx, CpuForm form) {
  using Key = typename Src::Key;
  const int64_t T = io.T;
  const int H = io.H;
  splits = std::max<int64_t>(splits, 1);
  std::vector<int64_t> blocks(static_cast<size_t>(T)), nsplit(static_cast<size_t>(T)), ws_at(static_cast<size_t>(T), -1);
  int64_t ws_slots = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = 0;
    src.each(t, [&](Key) { ++n; });
    const int64_t nb = (n + kBlock - 1) / kBlock;
    const int64_t st = std::clamp<int64_t>(nb, 1, splits);
    blocks[static_cast<size_t>(t)] = nb;
    nsplit[static_cast<size_t>(t)] = st;
    if (st > 1) {
      ws_at[static_cast<size_t>(t)] = ws_slots;
      ws_slots += nb;
    }
  }
  // split s >= 1 of a token stores each block's partial at ws slot ws_at + block; split 0 stores
  // its fold at ws slot ws_at (its own first block's slot)
  RunBuffers& rb = run_buffers();
  if (rb.H != H) {
    rb.scratch.clear();
    rb.H = H;
  }
  while (rb.scratch.size() < static_cast<size_t>(cpu_threads(ctx))) rb.scratch.push_back(std::make_unique<Scratch>(H));
  if (rb.ws.size() < static_cast<size_t>(ws_slots * partial_floats(H)))
    rb.ws.resize(static_cast<size_t>(ws_slots * partial_floats(H)));
  float* ws = rb.ws.data();
  std::atomic<size_t> next_scratch{0};  // one Scratch per worker (at most cpu_threads(ctx) of them)
  auto slot = [&](int64_t t, int64_t b) {
    return Partial::at(ws + (ws_at[static_cast<size_t>(t)] + b) * partial_floats(H), H);
  };

  parallel_for(T * splits, ctx, 1, [&](int64_t i0, int64_t i1) {
    Scratch& s = *rb.scratch[next_scratch++];
    std::vector<Key> keys;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / splits, sp = i % splits;
      const int64_t nb = blocks[static_cast<size_t>(t)], st = nsplit[static_cast<size_t>(t)];
      if (nb == 0) {
        if (sp == 0) empty_row(io, t);
        continue;
      }
      if (sp >= st) continue;
      keys.clear();
      src.each(t, [&](Key k) { keys.push_back(k); });
      const auto n_keys = static_cast<int64_t>(keys.size());
      load_q(io, t, s);
      const int64_t b0 = sp * nb / st, b1 = (sp + 1) * nb / st;
      const Partial run = Partial::at(s.run.data(), H), blk = Partial::at(s.blk.data(), H);
      for (int64_t b = b0; b < b1; ++b) {
        const int n = static_cast<int>(std::min<int64_t>(kBlock, n_keys - b * kBlock));
        for (int j = 0; j < n; ++j) src.load(keys[static_cast<size_t>(b * kBlock + j)], s.kb.data() + j * kD);
        if (sp > 0) {
          compute_block(io, s, n, slot(t, b), form);
        } else if (b == 0) {
          compute_block(io, s, n, run, form);
        } else {
          fold_block(io, s, n, run, blk, form);
        }
      }
      if (sp > 0) continue;
      if (st == 1) finalize(io, t, run, s.HC);
      else copy_partial(slot(t, 0), run, H);
    }
  });
  if (ws_slots == 0) return;
  parallel_for(T, ctx, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nb = blocks[static_cast<size_t>(t)], st = nsplit[static_cast<size_t>(t)];
      if (st <= 1) continue;
      const Partial run = slot(t, 0);
      for (int64_t b = nb / st; b < nb; ++b) merge(run, slot(t, b), H);
      finalize(io, t, run, lanes(H));
    }
  });
}

}  // namespace dsv41kv::detail::attn
