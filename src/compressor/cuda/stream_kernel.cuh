// The one-warp streaming kernel of the fused compress (+ insert) (prefill-sized grids).
#pragma once

#include "compressor/cuda/warp_program.cuh"
#include "core/cuda/cuda_util.hpp"

namespace dsv41kv::detail::cuda {

// Resident blocks the streaming kernel is compiled for (__launch_bounds__ minimum; registers
// per thread <= 65536 / (128 * blocks)). Ratio 1 fits 7 blocks (the shared-memory limit too: 30
// KiB per block, so 8 would not fit anyway): 72 registers, nvfp4 with an 8-byte spill (7 blocks
// still measured faster at 256K than 6 blocks (80 registers) or 5 (96): docs/changelog.md, v14).
// Overridable at build time.
#ifndef DSV41KV_R1_MIN_BLOCKS
#define DSV41KV_R1_MIN_BLOCKS 7
#endif
#ifndef DSV41KV_R1_NV_MIN_BLOCKS
#define DSV41KV_R1_NV_MIN_BLOCKS 7
#endif
#ifndef DSV41KV_R1_NV_TMA_MIN_BLOCKS
#define DSV41KV_R1_NV_TMA_MIN_BLOCKS 7
#endif
template <int R, int F, int M>
inline constexpr int kStreamMinBlocks =
    R == 2 ? 3
           : (M == kRowsTmaRot ? DSV41KV_R1_NV_TMA_MIN_BLOCKS
                               : (F == kNv ? DSV41KV_R1_NV_MIN_BLOCKS : DSV41KV_R1_MIN_BLOCKS));

// M: the row mechanism (kRowsCp, kRowsTmaSwz, kRowsTmaRot).
// kv_map: the kv rows as a TMA tensor map (kv_rows_tensor_map) when M != kRowsCp, else unused;
// rope_map: the RoPE table (rope_table_tensor_map) when M == kRowsTmaRot, else unused.
template <int R, int F, int C, int M>
__global__ void __launch_bounds__(128, (kStreamMinBlocks<R, F, M>))
    compress_stream_kernel(const CompressParams p, const __grid_constant__ CUtensorMap kv_map,
                           const __grid_constant__ CUtensorMap rope_map) {
  static_assert(C <= 32);
  static_assert(M == kRowsCp || R == 1);
  static_assert(M != kRowsTmaRot || F == kNv);
  // RoPE table entries of the inserts, copied kRopeAhead programs ahead (cp.async): the table
  // row of a program is known only from its position, and a plain load issued at the start of
  // the program was still in flight when its RoPE needed it (ncu: a third of the stall samples
  // of the ratio-2 nvfp4 kernel on that one multiply; docs/changelog.md, v9)
  __shared__ __align__(16) float rope_sm[4][(R == 1 ? kRowsAhead : kRopeAhead) + 1][kRopeDim];
  pdl_wait();  // PDL: the previous kernel's writes first (no early trigger: large grids)
  // (kRowsTmaRot: the warp index broadcast from lane 0, so that the compiler sees it and what
  // derives from it (ring addresses, the chunk, the loop) as warp-uniform: tma_row_rope)
  const int warp = M == kRowsTmaRot ? __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x) / 32, 0)
                                    : static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * 4 + warp;

  uint32_t wb[8];  // the lane's 16 bf16 norm weights, packed (even dim in the low half)
  // kRowsTmaRot: the lane's chunk rotation (RowRotated::rx)
  const uint32_t rot_rx = 16u * ((static_cast<unsigned>(lane) >> 1) & 3u);
  // (kRowsTmaRot: the block's weights as fp32 in shared memory instead, read per chunk by
  // RowRotated::weights: 4 loads per token instead of 16 unpacks of packed words; lane l's 16
  // at [l][0..15] in its rotated order: [l][4c + j] = dim 16 l + 4 (c ^ r_l) + j, rows of 20
  // floats so that a quarter warp's 16-byte loads hit distinct banks)
  __shared__ __align__(16) float w_sm[M == kRowsTmaRot ? 32 : 1][20];
  uint32_t w_lane = 0;
  if constexpr (M == kRowsTmaRot) {
    for (int e = static_cast<int>(threadIdx.x); e < kLatentDim; e += 128) {
      const int l = e / 16, c = (e / 4) % 4, j = e % 4;
      const int d = 16 * l + 4 * (c ^ ((l >> 1) & 3)) + j;
      w_sm[l][4 * c + j] = num::u2f(static_cast<uint32_t>(p.norm_w[d]) << 16);
    }
    __syncthreads();
    w_lane = smem_address(w_sm[lane]);
  } else {
    const uint4 u0 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane);
    const uint4 u1 = *reinterpret_cast<const uint4*>(p.norm_w + 16 * lane + 8);
    wb[0] = u0.x; wb[1] = u0.y; wb[2] = u0.z; wb[3] = u0.w;
    wb[4] = u1.x; wb[5] = u1.y; wb[6] = u1.z; wb[7] = u1.w;
  }
  // the packed bf16 norm weights of the lane's RoPE pair (dims 448 + 2*lane, +1)
  uint32_t wrope = 0;
  if constexpr (F != kNoRecord)
    wrope = *reinterpret_cast<const uint32_t*>(p.norm_w + kNopeDim + 2 * lane);

  // This warp's programs [lo, hi), processed in chunks of at most C:
  //   ratio 2: the request program w (w < num_reqs), else pair chunk w - num_reqs;
  //   ratio 1: an even share of the N token programs over the grid's warps (stream_share, with
  //   N / W and N % W from the host). The grid has at least one warp per C programs
  //   (stream_blocks_r1), so a share is at most C programs and the chunk loop below runs once;
  //   widening a small grid only makes the shares smaller (tests/compressor/test_stream_split_gpu.cu).
  int64_t lo, hi;
  if constexpr (R == 2) {
    if (w < p.num_reqs) {
      request_program_warp<R, F>(p, w, smem_pooled<R>(warp), lane, wb, wrope);
      return;
    }
    const int64_t pairs = (p.N + 1) / 2;
    const int64_t k0 = (w - p.num_reqs) * C;
    if (k0 >= pairs) return;
    lo = p.num_reqs + k0;
    hi = p.num_reqs + (pairs - k0 < C ? pairs : k0 + C);
  } else {
    stream_range(w, p.seg, lo, hi);
  }
  // ratio 1: the warp's shared ring of rows (kRowsAhead + 1 slots, see the chunk loop), its
  // addresses computed once per warp
  // (kRowsTma: the slots' barriers too, at rows_sa + kRowBarsOffset, and row_parity bit s: the
  // parity of slot s's next phase, one phase per row copied into the slot)
  uint32_t rows_sa = 0, row_dst_lane = 0, row_parity = 0;
  if constexpr (M == kRowsTmaRot) {
    rows_sa = smem_address(smem_per_warp<RowsRopeTmaSmem>(warp));
    if (lane <= kRowsAhead) mbarrier_init(rows_sa + kRowRopeBarsOffset + 8u * static_cast<uint32_t>(lane));
    mbarrier_init_fence();
    __syncwarp();
  } else if constexpr (M == kRowsTmaSwz) {
    rows_sa = smem_address(smem_per_warp<RowsTmaSmem>(warp));
    if (lane <= kRowsAhead) mbarrier_init(rows_sa + kRowBarsOffset + 8u * static_cast<uint32_t>(lane));
    mbarrier_init_fence();
    __syncwarp();
  } else if constexpr (R == 1) {
    const unsigned ul = static_cast<unsigned>(lane);
    rows_sa = smem_address(smem_rows<R>(warp)[0]);
    row_dst_lane = rows_sa + 4u * (4u * ul + 4u * (ul >> 3));
  }
  for (int64_t first = lo; first < hi; first += C) {
    const int64_t n = hi - first < C ? hi - first : C;  // programs in the chunk

    // metadata of the whole chunk, one program per lane
    int64_t role_t = -1, role_slot = -1, role_row = 0;
    if (lane < n) resolve_role<R, F>(p, first + lane, role_t, role_slot, role_row);
    // the insert slot as (page, row in page), also resolved in parallel over the lanes
    int64_t role_page = -1, role_r = 0;
    if (role_slot >= 0) divmod_fast(role_slot, p.cache.S_div, role_page, role_r);
    // NVFP4, ratio 1: the record's value and scale addresses (NvRecPtr), here for all the
    // chunk's programs at once rather than on the whole warp per program
    // (byte offsets from the cache base rather than pointers, so that the stores stay global
    // ones after the shuffle; -1: no insert)
    int64_t role_val = -1, role_sc_off = 0;
    if constexpr (R == 1 && F == kNv) {
      if (role_page >= 0) {
        role_val = role_page * p.cache.page_stride_bytes + Nvfp4Layout::value_offset(p.cache.S, role_r);
        role_sc_off = Nvfp4Layout::scale_offset(p.cache.S, role_r) - Nvfp4Layout::value_offset(p.cache.S, role_r);
      }
    }
    // the RoPE table row of the program's insert (null: no insert)
    const float* role_trow = nullptr;
    if constexpr (F != kNoRecord) {
      if (role_page >= 0) role_trow = p.table + role_row * kRopeDim;
    }
    // the RoPE entries of program j's insert (lane: cos and sin of pair `lane`) copied into rope
    // slot `slot` (nothing without an insert), through 32-bit shared addresses and one L2
    // evict-last policy per chunk (both ratios)
    constexpr uint32_t kRopeBytes = kRopeDim * 4;
    const unsigned ul = static_cast<unsigned>(lane);
    const uint32_t rope_sa = smem_address(rope_sm[warp][0]);
    const uint64_t rope_policy = l2_policy_evict_last();
    auto copy_rope = [&](int j, int slot) {
      if constexpr (F != kNoRecord) {
        const float* trow = shflptr(role_trow, j);
        if (trow != nullptr) {
          const uint32_t dst = rope_sa + static_cast<uint32_t>(slot) * kRopeBytes + 4u * ul;
          cp_async4_sa(dst, trow + lane, rope_policy);
          cp_async4_sa(dst + 4u * (kRopeDim / 2), trow + kRopeDim / 2 + lane, rope_policy);
        }
      }
    };
    // the entries of the program whose copies landed in rope slot `slot`
    auto read_rope = [&](int slot, float& rc, float& rsn) {
      const PooledSmem rope{rope_sa + static_cast<uint32_t>(slot) * kRopeBytes};
      rc = rope.f32(ul);
      rsn = rope.f32(kRopeDim / 2 + ul);
    };
    // ratio 2: one commit group per program, empty when it has no insert (uniform group counting)
    auto rope_copy = [&](int j) {
      if constexpr (F != kNoRecord) {
        copy_rope(j, j % (kRopeAhead + 1));
        cp_async_commit();
      }
    };

    const int nn = static_cast<int>(n);
    if constexpr (M == kRowsTmaRot) {
      // Rows and RoPE entries of program j by TMA into ring slot j % (ahead + 1) (tma_row_rope),
      // kRowsAhead programs ahead, both on the slot's barrier; no cp.async groups. Token and RoPE
      // row travel as 32-bit values (the launcher picks this mechanism only for N and table rows
      // below 2^31); token -1: none; RoPE row 0 for a program without an insert (copied, not read).
      const int32_t role_t32 = static_cast<int32_t>(role_t);
      const int32_t role_rope32 = role_trow != nullptr ? static_cast<int32_t>(role_row) : 0;
      constexpr int kSlots = kRowsAhead + 1;
      // L2 policies: rows evict-first (read once; the chunk-16 cp.async kernel's kRowsEvictFirst),
      // RoPE rows evict-last (re-read by every request at each position, see l2_policy_evict_last)
      const uint64_t row_pol = l2_policy_evict_first();
      auto copy = [&](int j, int slot) {
        const int32_t tj = __shfl_sync(0xFFFFFFFFu, role_t32, j);
        const int32_t rj = __shfl_sync(0xFFFFFFFFu, role_rope32, j);
        const uint32_t us = static_cast<uint32_t>(slot);
        if (tj >= 0)
          tma_row_rope(rows_sa + us * kRowTmaBytes, rows_sa + kRopeSlotsOffset + us * kRopeBytes, &kv_map, &rope_map, tj,
                       rj, rows_sa + kRowRopeBarsOffset + 8u * us, row_pol, rope_policy);
      };
  #pragma unroll
      for (int j = 0; j < kRowsAhead; ++j)
        if (j < nn) copy(j, j);
      int s_use = 0, s_fill = kRowsAhead;  // ring slots of programs i and i + kRowsAhead
      for (int i = 0; i < nn; ++i) {
        // slot s_fill is program i-1's: every read of it ended before the __syncwarp that closes
        // process_warp
        if (i + kRowsAhead < nn) copy(i + kRowsAhead, s_fill);
        const int32_t t32 = __shfl_sync(0xFFFFFFFFu, role_t32, i);
        const uint32_t us = static_cast<uint32_t>(s_use);
        if (t32 >= 0) {
          mbarrier_wait_parity(rows_sa + kRowRopeBarsOffset + 8u * us, (row_parity >> us) & 1u);
          row_parity ^= 1u << us;
          const int64_t off = shfl64(role_val, i);
          const NvRecPtr nrec{p.cache.base + off,
                              __shfl_sync(0xFFFFFFFFu, static_cast<int32_t>(role_sc_off), i)};  // (|sc_off| < 2^31: launcher)
          float rc = 0.0f, rsn = 0.0f;
          if (off >= 0) {
            const PooledSmem rope{rows_sa + kRopeSlotsOffset + us * kRopeBytes};
            rc = rope.f32(ul);
            rsn = rope.f32(kRopeDim / 2 + ul);
          }
          process_warp<F>(p, t32, off >= 0 ? 0 : -1, 0, rc, rsn, RowRotated{rows_sa + us * kRowTmaBytes, rot_rx, w_lane},
                          lane, wb, wrope, nrec);
        }
        s_use = s_use == kSlots - 1 ? 0 : s_use + 1;
        s_fill = s_fill == kSlots - 1 ? 0 : s_fill + 1;
      }
      continue;  // the next chunk (every slot read above ended before its __syncwarp)
    } else if constexpr (R == 1) {
      // Rows and RoPE entries of program j copied into ring slot j % (ahead + 1), kRowsAhead
      // programs ahead: 6 KiB per warp in flight without holding registers; the RoPE entries by
      // cp.async, one commit group per program. The row (when the program has a token):
      //  - kRowsTma: one TMA tensor copy (tma_row) into the swizzled ring (RowSwizzled), waited
      //    for on its slot's barrier (its copy was issued: same t);
      //  - otherwise: cp.async per lane (dims 4*lane + 128*k) into the padded load layout (dim d
      //    at pooled_index(d)), in the same commit group as the RoPE entries (PooledSmem).
      // Either way the row is what process_warp reads. Slots are tracked by two rotating counters
      // and addressed through 32-bit shared addresses computed once.
      constexpr bool kTma = M == kRowsTmaSwz;
      constexpr uint32_t kRowBytes = kTma ? kRowTmaBytes : kPooledFloats * 4;
      constexpr int kSlots = kRowsAhead + 1;
      const uint64_t row_policy = !kTma && kRowsEvictFirst<C> ? l2_policy_evict_first() : 0;
      auto copy = [&](int j, int slot) {
        const int64_t tj = shfl64(role_t, j);
        if constexpr (kTma) {
          const uint32_t us = static_cast<uint32_t>(slot);
          if (tj >= 0) tma_row(rows_sa + us * kRowBytes, &kv_map, p, tj, rows_sa + kRowBarsOffset + 8u * us, lane);
        } else if (tj >= 0) {
          const float* src = (p.kv + tj * p.kv_stride) + 4 * lane;
          const uint32_t dst = row_dst_lane + static_cast<uint32_t>(slot) * kRowBytes;
  #pragma unroll
          for (int k = 0; k < 4; ++k) cp_async16_row<kRowsEvictFirst<C>>(dst + 4u * 144u * k, src + 128 * k, row_policy);
        }
        copy_rope(j, slot);
        cp_async_commit();
      };
      // exactly kRowsAhead groups before the loop (empty ones past the chunk), so that the wait
      // of iteration i (all but the newest kRowsAhead groups) covers program i's group
  #pragma unroll
      for (int j = 0; j < kRowsAhead; ++j) {
        if (j < nn) copy(j, j);
        else cp_async_commit();
      }
      int s_use = 0, s_fill = kRowsAhead;  // ring slots of programs i and i + kRowsAhead
      for (int i = 0; i < nn; ++i) {
        // slot s_fill is program i-1's: every read of it ended before the __syncwarp that closes
        // process_warp
        if (i + kRowsAhead < nn) copy(i + kRowsAhead, s_fill);
        else cp_async_commit();
        cp_async_wait<kRowsAhead>();  // this lane's copies of program i have landed
        __syncwarp();                  // ... and every lane's, visible to the warp
        const int64_t t = shfl64(role_t, i);
        const uint32_t us = static_cast<uint32_t>(s_use);
        if constexpr (kTma) {
          if (t >= 0) {
            mbarrier_wait_parity(rows_sa + kRowBarsOffset + 8u * us, (row_parity >> us) & 1u);
            row_parity ^= 1u << us;
          }
        }
        // the insert: (page, row) or, NVFP4, the record's addresses (null: no insert)
        int64_t pg = -1, ir = 0;
        NvRecPtr nrec{nullptr, 0};
        if constexpr (F == kNv) {
          const int64_t off = shfl64(role_val, i);
          nrec.val = p.cache.base + off;
          nrec.sc_off = shfl64(role_sc_off, i);
          pg = off >= 0 ? 0 : -1;
        } else {
          pg = shfl64(role_page, i);
          ir = shfl64(role_r, i);
        }
        float rc = 0.0f, rsn = 0.0f;
        if constexpr (F != kNoRecord) {
          if (pg >= 0) read_rope(s_use, rc, rsn);
        }
        if (t >= 0) {
          // the row in its layout, the record by its addresses (NVFP4) or by (page, row)
          auto run = [&](auto row) {
            if constexpr (F == kNv) process_warp<F>(p, t, pg, ir, rc, rsn, row, lane, wb, wrope, nrec);
            else process_warp<F>(p, t, pg, ir, rc, rsn, row, lane, wb, wrope);
          };
          if constexpr (kTma) run(RowSwizzled{rows_sa + us * kRowBytes});
          else run(PooledSmem{rows_sa + us * kRowBytes});
        }
        s_use = s_use == kSlots - 1 ? 0 : s_use + 1;
        s_fill = s_fill == kSlots - 1 ? 0 : s_fill + 1;
      }
      continue;  // the next chunk (every slot read above ended before its __syncwarp)
    }
    float* const pooled = smem_pooled<R>(warp);
    PairRows A;
    int64_t t = shfl64(role_t, 0);
    if (t >= 0) {
  #pragma unroll
      for (int k = 0; k < 4; ++k) load_group<kRowsEvictFirst<C>>(p, t, lane, k, A);
    }
    if constexpr (F != kNoRecord) {
      // exactly kRopeAhead groups before the loop (empty ones past the chunk), so that the wait
      // of iteration i (all but the newest kRopeAhead groups) covers program i's group
  #pragma unroll
      for (int j = 0; j < kRopeAhead; ++j) {
        if (j < nn) rope_copy(j);
        else cp_async_commit();
      }
    }
    for (int i = 0; i < nn; ++i) {
      const int64_t tn = shfl64(role_t, i + 1 < nn ? i + 1 : 0);
      const int64_t t_next = i + 1 < nn ? tn : -1;
      const int64_t pg = shfl64(role_page, i);
      const int64_t ir = shfl64(role_r, i);
      float rc = 0.0f, rsn = 0.0f;
      if constexpr (F != kNoRecord) {
        // program i's copies were issued kRopeAhead programs ago; issue program i + ahead's
        if (i + kRopeAhead < nn) rope_copy(i + kRopeAhead);
        else cp_async_commit();
        cp_async_wait<kRopeAhead>();  // this lane's copies of program i have landed
        if (pg >= 0) read_rope(i % (kRopeAhead + 1), rc, rsn);
      }
      if (t >= 0) {
        pool_warp<kRowsEvictFirst<C>>(p, A, t_next, pooled, lane);
        process_warp<F>(p, t, pg, ir, rc, rsn, PooledPtr{pooled}, lane, wb, wrope);
      } else if (t_next >= 0) {
  #pragma unroll
        for (int k = 0; k < 4; ++k) load_group<kRowsEvictFirst<C>>(p, t_next, lane, k, A);
      }
      t = t_next;
    }
  }  // chunks
}

}  // namespace dsv41kv::detail::cuda
