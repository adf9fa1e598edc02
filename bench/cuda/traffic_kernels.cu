// The traffic kernels of dsv41kv-access-ceiling (traffic_kernels.hpp, access_ceiling.hpp).
#include "traffic_kernels.hpp"

#include <algorithm>

namespace dsv41kv::bench {
namespace {

constexpr int kPadFloats = kRowFloats + 64;  // the fused kernel's padded row (4 floats per 32)
constexpr int kSlots = 3;                    // ring slots per warp: two rows ahead

// One token's record: the values as coalesced 4-byte words, then the scale bytes, at the slot's
// place in its page (the record layouts of records.hpp). `x` stands for the quantised data.
__device__ __forceinline__ void store_record(const TrafficParams& p, int64_t slot, int lane, uint32_t x) {
  uint8_t* page = p.cache + (slot / kPageStates) * p.page_stride;
  const int64_t r = slot % kPageStates;
  uint8_t* val = page + r * p.value_bytes;
  uint8_t* sc = page + kPageStates * p.value_bytes + r * p.scale_bytes;
  for (int o = 4 * lane; o < p.value_bytes; o += 128) *reinterpret_cast<uint32_t*>(val + o) = x + o;
  if (4 * lane < p.scale_bytes) *reinterpret_cast<uint32_t*>(sc + 4 * lane) = x;
}

__device__ __forceinline__ uint32_t fold(float4 v) {
  return __float_as_uint(v.x) ^ __float_as_uint(v.y) ^ __float_as_uint(v.z) ^ __float_as_uint(v.w);
}

// The fused kernel's grid and traffic without its arithmetic: warp w owns tokens [8w, 8w + 8);
// a metadata round (lane j: token 8w + j's slot; kAll: also its position and insert slot), then
// per token: its 2048-byte row read the mechanism's way (kAll: and its RoPE table row, 256 bytes:
// by cp.async into a shared ring with the fused kernel's evict-last policy in the cp.async
// kernel, by plain loads one token ahead in the others), folded, and its record written at its
// slot (kAll: insert slot).
template <RowMechanism M, bool kAll>
__global__ void __launch_bounds__(128) traffic_kernel(const TrafficParams p) {
  __shared__ __align__(128) float ring[M == RowMechanism::kRegisters ? 1 : 4][kSlots][kPadFloats];
  __shared__ __align__(16) float rope_ring[M == RowMechanism::kCpAsync && kAll ? 4 : 1][kSlots][kRopeFloats];
  __shared__ __align__(8) uint64_t bars[4][kSlots];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.x) * 4 + warp) * kChunk;
  const int n = static_cast<int>(t0 < p.T ? std::min<int64_t>(kChunk, p.T - t0) : 0);
  int64_t my_slot = -1, my_row = 0;
  if (lane < n) {
    my_slot = p.slots[t0 + lane];
    if constexpr (kAll) {
      const int64_t ps = p.pos[t0 + lane], in = p.ins[t0 + lane];
      my_row = ps;
      my_slot = my_slot < 0 ? -1 : in;
    }
  }
  auto slot_of = [&](int j) {
    return static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(my_slot), j));
  };
  // token j's RoPE entries for this lane (pair `lane`: cos, sin), plain loads
  auto rope_of = [&](int j) {
    const int64_t row = static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(my_row), j));
    const float* e = p.table + row * kRopeFloats;
    return make_float2(e[lane], e[32 + lane]);
  };
  const unsigned ul = static_cast<unsigned>(lane);
  if constexpr (M == RowMechanism::kRegisters) {
    // rows one token ahead in registers (4 x 16 bytes per lane)
    float4 cur[4], next[4];
    float2 rope_cur = make_float2(0.0f, 0.0f), rope_next = rope_cur;
    if (n > 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) cur[k] = reinterpret_cast<const float4*>(p.kv + t0 * kRowFloats)[lane + 32 * k];
      if constexpr (kAll) rope_cur = rope_of(0);
    }
    for (int i = 0; i < n; ++i) {
      if (i + 1 < n) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          next[k] = reinterpret_cast<const float4*>(p.kv + (t0 + i + 1) * kRowFloats)[lane + 32 * k];
        if constexpr (kAll) rope_next = rope_of(i + 1);
      }
      uint32_t x = __float_as_uint(rope_cur.x) ^ __float_as_uint(rope_cur.y);
#pragma unroll
      for (int k = 0; k < 4; ++k) x ^= fold(cur[k]);
      const int64_t s = slot_of(i);
      if (s >= 0) store_record(p, s, lane, x);
#pragma unroll
      for (int k = 0; k < 4; ++k) cur[k] = next[k];
      rope_cur = rope_next;
    }
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t ring_sa = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[warp][0][0]));
    const uint32_t bars_sa = static_cast<uint32_t>(__cvta_generic_to_shared(&bars[warp][0]));
    const uint32_t rope_sa = static_cast<uint32_t>(__cvta_generic_to_shared(
        &rope_ring[M == RowMechanism::kCpAsync && kAll ? warp : 0][0][0]));
    constexpr uint32_t kSlotBytes = kPadFloats * 4, kRopeSlotBytes = kRopeFloats * 4;
    uint64_t rope_policy = 0;
    if constexpr (M == RowMechanism::kCpAsync && kAll)
      asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(rope_policy));
    if constexpr (M == RowMechanism::kBulkCopy) {
      if (lane < kSlots) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bars_sa + 8u * ul) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      __syncwarp();
    }
    // row of token j into slot j % kSlots: cp.async, 16 bytes per lane into the padded layout
    // (one commit group per row), or one bulk copy of the whole row (unpadded) counted by the
    // slot's mbarrier
    auto copy = [&](int j) {
      const float* row = p.kv + (t0 + j) * kRowFloats;
      const uint32_t slot = ring_sa + static_cast<uint32_t>(j % kSlots) * kSlotBytes;
      if constexpr (M == RowMechanism::kCpAsync) {
        const uint32_t dst = slot + 4u * (4u * ul + 4u * (ul >> 3));
#pragma unroll
        for (int k = 0; k < 4; ++k)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 576u * k), "l"(row + 4 * lane + 128 * k)
                       : "memory");
        if constexpr (kAll) {  // the RoPE entries as the fused kernel copies them
          const int64_t trow = static_cast<int64_t>(__shfl_sync(0xFFFFFFFFu, static_cast<long long>(my_row), j));
          const float* e = p.table + trow * kRopeFloats;
          const uint32_t rd = rope_sa + static_cast<uint32_t>(j % kSlots) * kRopeSlotBytes + 4u * ul;
          asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(rd), "l"(e + lane),
                       "l"(rope_policy)
                       : "memory");
          asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;" ::"r"(rd + 128u), "l"(e + 32 + lane),
                       "l"(rope_policy)
                       : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
      } else if (lane == 0) {
        const uint32_t bar = bars_sa + 8u * static_cast<uint32_t>(j % kSlots);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "n"(kRowBytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(slot),
                     "l"(row), "n"(kRowBytes), "r"(bar)
                     : "memory");
      }
    };
    for (int j = 0; j < 2; ++j) {
      if (j < n) copy(j);
      else if constexpr (M == RowMechanism::kCpAsync) asm volatile("cp.async.commit_group;" ::: "memory");
    }
    for (int i = 0; i < n; ++i) {
      const uint32_t su = static_cast<uint32_t>(i % kSlots);
      if (i + 2 < n) copy(i + 2);
      else if constexpr (M == RowMechanism::kCpAsync) asm volatile("cp.async.commit_group;" ::: "memory");
      if constexpr (M == RowMechanism::kCpAsync) {
        asm volatile("cp.async.wait_group 2;" ::: "memory");
      } else {
        uint32_t done = 0;
        do {
          asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                       : "=r"(done)
                       : "r"(bars_sa + 8u * su), "r"(static_cast<uint32_t>((i / kSlots) & 1))
                       : "memory");
        } while (done == 0);
      }
      __syncwarp();
      // the fused kernel's writer reads: lane l, dims 16l .. 16l + 15 (padded or not)
      const uint32_t rd = ring_sa + su * kSlotBytes +
                          4u * (M == RowMechanism::kCpAsync ? 16u * ul + 4u * (ul >> 1) : 16u * ul);
      uint32_t x = 0;
      if constexpr (kAll) {
        if constexpr (M == RowMechanism::kCpAsync) {
          float c0, s0;
          const uint32_t rd = rope_sa + su * kRopeSlotBytes + 4u * ul;
          asm volatile("ld.shared.f32 %0, [%1];" : "=f"(c0) : "r"(rd));
          asm volatile("ld.shared.f32 %0, [%1];" : "=f"(s0) : "r"(rd + 128u));
          x = __float_as_uint(c0) ^ __float_as_uint(s0);
        } else {
          const float2 r = rope_of(i);
          x = __float_as_uint(r.x) ^ __float_as_uint(r.y);
        }
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float4 v;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(rd + 16u * c));
        x ^= fold(v);
      }
      __syncwarp();
      const int64_t s = slot_of(i);
      if (s >= 0) store_record(p, s, lane, x);
    }
#else
    (void)ring;
    (void)rope_ring;
    (void)bars;
    (void)ul;
    __trap();  // run_access_ceiling measures these only on sm_90 devices
#endif
  }
}

}  // namespace

cudaError_t launch_traffic(RowMechanism m, bool all_inputs, const TrafficParams& p, cudaStream_t st) {
  const unsigned blocks = static_cast<unsigned>((p.T / kChunk + 3) / 4);  // 4 warps per block
  switch (m) {
    case RowMechanism::kRegisters:
      if (all_inputs) traffic_kernel<RowMechanism::kRegisters, true><<<blocks, 128, 0, st>>>(p);
      else traffic_kernel<RowMechanism::kRegisters, false><<<blocks, 128, 0, st>>>(p);
      break;
    case RowMechanism::kCpAsync:
      if (all_inputs) traffic_kernel<RowMechanism::kCpAsync, true><<<blocks, 128, 0, st>>>(p);
      else traffic_kernel<RowMechanism::kCpAsync, false><<<blocks, 128, 0, st>>>(p);
      break;
    case RowMechanism::kBulkCopy:
      if (all_inputs) traffic_kernel<RowMechanism::kBulkCopy, true><<<blocks, 128, 0, st>>>(p);
      else traffic_kernel<RowMechanism::kBulkCopy, false><<<blocks, 128, 0, st>>>(p);
      break;
  }
  return cudaGetLastError();
}

}  // namespace dsv41kv::bench
