// Warp-level tensor-core primitives (sm_80+ PTX, used on sm_90a): the bf16 MMA
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, the ldmatrix loads that build its operand
// fragments from shared memory, and the XOR swizzle of the shared tiles they read. Fragment
// layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major, 4 x b32 of bf16x2):  a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]
//                                                a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col": B[k][n], 2 x b32):         b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32, 4 x f32):                c0, c1 = C[g][2t, 2t+1] c2, c3 = C[g+8][2t, 2t+1]
// The low half of each b32 is the element of the lower column (A) or row (B) index.
// ldmatrix.x4: lanes 8i .. 8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i;
// register i of lane l receives row l / 4, elements 2(l % 4), 2(l % 4) + 1 of matrix i (with
// .trans: of the transposed matrix, i.e. elements [2(l % 4)][l / 4] and [2(l % 4) + 1][l / 4]).
// Hence, for a row-major tile X in shared memory:
//   * an A fragment of rows r0..r0+15, cols c0..c0+15: lane l gives row r0 + l % 16, col
//     c0 + 8 (l / 16) (matrices: rows 0-7 / 8-15 x cols 0-7, then the same x cols 8-15);
//   * B fragments of two n-tiles when X = B^T is stored [n][k] (S = Q K^T, K rows = keys):
//     lane l gives row n0 + l % 8 + 8 (l / 16), col k0 + 8 ((l / 8) % 2); registers 0, 1 are
//     b0, b1 of n-tile n0, registers 2, 3 those of n0 + 8;
//   * B fragments of two n-tiles when X = B is stored [k][n] (O = P V, V rows = keys), with
//     .trans: lane l gives row k0 + l % 8 + 8 ((l / 8) % 2), col n0 + 8 (l / 16); registers 0, 1
//     are b0, b1 of n-tile n0, registers 2, 3 those of n0 + 8.
// Tiles whose rows are >= 128 bytes are stored with the 16-byte chunk c of row r at chunk
// c ^ (r % 8) (swizzle_chunk): the 8 row addresses of one ldmatrix matrix (same logical chunk,
// 8 consecutive rows) then fall in 8 different bank groups, so it is conflict-free.
// MmaGpu in tests/core/test_mma_gpu.cu checks these layouts and addresses against a host matrix
// product (both operand forms, swizzled tiles).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv41kv::detail::cuda {

// The shared-memory chunk (16 bytes) where logical chunk c of row r of a swizzled tile lives.
__host__ __device__ constexpr int swizzle_chunk(int r, int c) { return c ^ (r & 7); }
// Byte address of logical chunk c of row r of a swizzled tile at `base` with `chunks` 16-byte
// chunks a row (chunks >= 8, a multiple of 8).
__host__ __device__ constexpr uint32_t tile_addr(uint32_t base, int r, int c, int chunks) {
  return base + static_cast<uint32_t>((r * chunks + swizzle_chunk(r, c)) * 16);
}
// The row address lane `lane` gives to ldmatrix.x4 for (see the layouts above; tiles of bf16
// with `chunks` chunks a row, k0, n0 and c0 multiples of 8 elements given as chunks):
//   an A fragment of rows r0 .. r0+15 x chunks c0, c0+1 (16 columns);
__host__ __device__ constexpr uint32_t a_frag_addr(uint32_t base, int r0, int c0, int lane, int chunks) {
  return tile_addr(base, r0 + lane % 16, c0 + lane / 16, chunks);
}
//   B fragments of n-tiles n0, n0 + 8 for k chunks c0, c0+1 from B^T stored [n][k];
__host__ __device__ constexpr uint32_t bt_frag_addr(uint32_t base, int n0, int c0, int lane, int chunks) {
  return tile_addr(base, n0 + lane % 8 + 8 * (lane / 16), c0 + (lane / 8) % 2, chunks);
}
//   B fragments of one n-tile n0 for the two k-steps of chunks c0 .. c0+3 from B^T stored [n][k]
//   (registers 0, 1: b0, b1 of k chunks c0, c0+1; 2, 3: of c0+2, c0+3);
__host__ __device__ constexpr uint32_t bt_frag2k_addr(uint32_t base, int n0, int c0, int lane, int chunks) {
  return tile_addr(base, n0 + lane % 8, c0 + lane / 8, chunks);
}
//   with .trans, B fragments of n-tiles at chunks c0, c0+1 (n0, n0 + 8) for k rows k0 .. k0+15
//   from B stored [k][n].
__host__ __device__ constexpr uint32_t b_trans_frag_addr(uint32_t base, int k0, int c0, int lane, int chunks) {
  return tile_addr(base, k0 + lane % 8 + 8 * ((lane / 8) % 2), c0 + lane / 16, chunks);
}

// sm_80+ (the host pass sees the declarations; device code for older targets fails to assemble).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// d += a * b (fp32 accumulate; m16n8k16, bf16 operands).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
}
#endif

}  // namespace dsv41kv::detail::cuda
