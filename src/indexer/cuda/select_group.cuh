// The indexer's selection on CUDA (SPEC 8.5's ranking: score descending, then position
// ascending), run by a group of NT threads: the whole block (barrier 0: __syncthreads) or one
// warpgroup of a warp-specialized block (a named barrier of its own, so that the other roles
// keep running). Both scoring kernels and the select kernel of topk_cuda.cu use this one
// definition; select.hpp is the CPU's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "dsv41kv/numerics.hpp"

namespace dsv41kv::detail::cuda {

// A float's order as an unsigned key (larger float, larger key; -0 as +0: equal keys rank by
// position). Every non-NaN float has a key above 0, so 0 is "no threshold".
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = num::f2u(x == 0.0f ? 0.0f : x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// NT threads (a multiple of 32, at most 1024) with rank 0..NT-1 that synchronise on named
// barrier `bar` (0: __syncthreads, the group is the whole block). `scratch` is NT / 32 ints of
// shared memory of the group's own.
template <int NT>
struct ThreadGroup {
  static_assert(NT % 32 == 0 && NT <= 1024);
  static constexpr int kSize = NT;
  int rank;
  int bar;
  int* scratch;
  __device__ __forceinline__ void sync() const {
    if (bar == 0) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(NT) : "memory");
  }
  // The exclusive prefix sum of v over the ranks, and the group's total (every rank calls).
  __device__ __forceinline__ int exclusive_sum(int v, int& total) const {
    const int lane = rank % 32, warp = rank / 32;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) scratch[warp] = x;
    sync();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < NT / 32; ++w) {
      const int s = scratch[w];
      before += w < warp ? s : 0;
      all += s;
    }
    sync();  // scratch is reused by the next call
    total = all;
    return before + x - v;
  }
  __device__ __forceinline__ int sum(int v) const {
    int total;
    exclusive_sum(v, total);
    return total;
  }
};

// The shared state of one group's selection.
struct SelectShared {
  int hist[256];
  uint32_t prefix;
  int remaining;
  int above, count;  // prune_top: the keys in larger digits and in the chosen digit
};

// An item of a selection: the ranked float and the entry (or block) it stands for.
struct ScoredEntry {
  float key;
  int32_t entry;
};

// What select_top found: k = min(K, #eligible) entries taken; when fewer than all eligible were
// taken (all == false), `boundary` is the order key of the K-th ranked one (every later key
// equal to it ranks below the K taken, every larger key is among them).
struct SelectResult {
  int k;
  bool all;
  uint32_t boundary;
};

// One 8-bit pass of a radix search: among the eligible items whose order key equals `prefix` on
// `mask`, the digit at `shift` where the count from the top reaches `remaining` (1 <= remaining <=
// the items matching). Leaves in `sh`: prefix with that digit, remaining within it, the matching
// items in larger digits (above) and in the digit (count). Rank r holds digits 255 - (r * kBins +
// b); an exclusive scan gives the count of every larger digit. Every rank of the group calls; the
// results are read after the final barrier.
template <int NT, class Load, class Eligible>
__device__ void digit_pass(const ThreadGroup<NT>& grp, SelectShared& sh, int64_t n, int shift, uint32_t prefix,
                           uint32_t mask, int remaining, Load load, Eligible eligible) {
  constexpr int kBins = 256 / NT > 0 ? 256 / NT : 1;
  static_assert(NT >= 256 ? NT % 256 == 0 : 256 % NT == 0);
  const int tid = grp.rank;
  for (int b = tid; b < 256; b += NT) sh.hist[b] = 0;
  grp.sync();
  for (int64_t i = tid; i < n; i += NT) {
    const float x = load(i).key;
    if (!eligible(x)) continue;
    const uint32_t u = order_key(x);
    if ((u & mask) == prefix) atomicAdd(&sh.hist[(u >> shift) & 255u], 1);
  }
  grp.sync();
  int h[kBins], local = 0;
#pragma unroll
  for (int b = 0; b < kBins; ++b) {
    const int d = 255 - (tid * kBins + b);
    h[b] = d >= 0 ? sh.hist[d] : 0;
    local += h[b];
  }
  int total;
  int above = grp.exclusive_sum(local, total);
#pragma unroll
  for (int b = 0; b < kBins; ++b) {
    const int d = 255 - (tid * kBins + b);
    if (d >= 0 && above < remaining && above + h[b] >= remaining) {
      sh.prefix = prefix | (static_cast<uint32_t>(d) << shift);
      sh.remaining = remaining - above;
      sh.above = above;
      sh.count = h[b];
    }
    above += h[b];
  }
  grp.sync();
}

// The top min(K, #eligible) of items 0..n by (key desc, position asc). load(i) returns the item
// at position i (a struct whose .key is the float ranked); emit(j, item) is called for j < k in
// ascending position order, pad(j) for k <= j < K. Every item a round emits was loaded before the
// round's barriers, so emit may overwrite the positions it reads (an in-place compaction: j <= i).
// Eligible: finite keys (finite_only) or any non-NaN. A radix selection of the K-th key (four 8-bit
// passes over a shared histogram), then an ordered compaction; every rank of the group calls.
template <int NT, class Load, class Emit, class Pad>
__device__ SelectResult select_top(const ThreadGroup<NT>& grp, SelectShared& sh, int64_t n, int K, bool finite_only,
                                   Load load, Emit emit, Pad pad) {
  const int tid = grp.rank;
  auto eligible = [&](float x) { return finite_only ? isfinite(x) : !isnan(x); };
  int mine = 0;
  for (int64_t i = tid; i < n; i += NT) mine += eligible(load(i).key);
  const int count = grp.sum(mine);
  const int k = count < K ? count : K;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  const bool all = k == count;  // every eligible entry is taken
  if (!all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      digit_pass(grp, sh, n, shift, prefix, mask, remaining, load, eligible);
      prefix = sh.prefix;
      remaining = sh.remaining;
      mask |= 255u << shift;
      grp.sync();
    }
  }
  // ordered compaction: every key above the K-th, then its ties by position
  int taken = 0, ties = 0;
  for (int64_t base = 0; base < n && taken < k; base += NT) {
    const int64_t i = base + tid;
    int gt = 0, eq = 0;
    decltype(load(0)) item{};
    if (i < n) {
      item = load(i);
      if (eligible(item.key)) {
        const uint32_t u = order_key(item.key);
        gt = all || u > prefix;
        eq = !all && u == prefix;
      }
    }
    int eq_total;
    const int eq_rank = grp.exclusive_sum(eq, eq_total);
    const int take = gt || (eq && ties + eq_rank < remaining);
    int n_taken;
    const int at = grp.exclusive_sum(take, n_taken);
    if (take) emit(taken + at, item);
    taken += n_taken;
    ties += eq_total;
    grp.sync();  // this round's writes before the next round's loads
  }
  for (int j = taken + tid; j < K; j += NT) pad(j);
  grp.sync();  // the group's shared state is reused by the next call
  return {k, all, prefix};
}

// What prune_top kept: `kept` items, every one with an order key >= `bound` (0: all kept).
struct PruneResult {
  int kept;
  uint32_t bound;
};

// A cheaper step than select_top for a running top-K of finite keys: keeps, in place and in
// position order, every item whose order key is >= a bound that at least min(K, n) items reach
// (the bound is the lowest key with the 8-bit digit prefix of the K-th ranked key, taken at the
// first digit where at most 2K items reach it), so the top K are among the kept; a later item
// belongs to the top K only if its key is >= bound too (with ties by position, only if > the K-th
// key, which is >= bound). Usually one or two histogram passes instead of four, and no tie
// handling; ties at the last digit can keep more than 2K (the caller falls back on select_top).
// Items must be finite (the caller's buffer holds only such). Every rank of the group calls.
template <int NT, class Load, class Store>
__device__ PruneResult prune_top(const ThreadGroup<NT>& grp, SelectShared& sh, int n, int K, Load load, Store store) {
  const int tid = grp.rank;
  if (n <= 2 * K) return {n, 0u};
  uint32_t prefix = 0, mask = 0;
  int remaining = K, above_all = 0, kept = n;
  for (int shift = 24; shift >= 0; shift -= 8) {
    digit_pass(grp, sh, n, shift, prefix, mask, remaining, load, [](float) { return true; });
    prefix = sh.prefix;
    above_all += sh.above;  // keys in larger digits: above the bound whatever the later digits
    kept = above_all + sh.count;
    remaining = sh.remaining;
    mask |= 255u << shift;
    grp.sync();
    if (kept <= 2 * K) break;
  }
  // ordered in-place compaction of the keys >= prefix (the masked digits' lowest key)
  int at = 0;
  for (int base = 0; base < n; base += NT) {
    const int i = base + tid;
    int take = 0;
    decltype(load(0)) item{};
    if (i < n) {
      item = load(i);
      take = order_key(item.key) >= prefix;
    }
    int n_taken;
    const int j = at + grp.exclusive_sum(take, n_taken);
    if (take) store(j, item);
    at += n_taken;
    grp.sync();
  }
  return {at, prefix};
}

}  // namespace dsv41kv::detail::cuda
