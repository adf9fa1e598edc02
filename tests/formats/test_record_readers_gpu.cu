// The attention's chunk reader (formats/cuda/record_readers.cuh: read_record_chunk16, vector
// loads and hardware conversions) against the exact reader read_record_dims<F, 16> (the element
// readers of records.hpp) on the device: pages of random bytes (every e4m3 byte including the NaN
// codes, every scale byte, NaN and subnormal bf16) of every record format, every state of each
// page and every 16-dim chunk, with the vector loads and with the byte-wise fallback; the words
// must be the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "formats/cuda/record_readers.cuh"
#include "support/gpu_util.hpp"

namespace dsv41kv::test {
namespace {

using namespace dsv41kv::detail::cuda;

template <int F>
__global__ void chunk_kernel(const uint8_t* base, int64_t pages, int64_t S, int64_t page_stride, int64_t row_stride,
                             float sigma, bool aligned, unsigned long long* mismatches) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pages * S * 32) return;
  const int c = static_cast<int>(i % 32);
  const int64_t state = i / 32, p = state / S, r = state % S;
  const uint8_t* pg = base + p * page_stride;
  uint32_t w[8];
  read_record_chunk16<F>(pg, S, r, row_stride, sigma, 16 * c, aligned, w);
  uint16_t o[16];
  read_record_dims<F, 16>(pg, S, r, row_stride, sigma, 16 * c, o);
  for (int k = 0; k < 8; ++k)
    if (w[k] != (static_cast<uint32_t>(o[2 * k]) | (static_cast<uint32_t>(o[2 * k + 1]) << 16))) {
      atomicAdd(mismatches, 1ull);
      return;
    }
}

// The 288 record's table decode (decode_chunk16_hw<kNv>: nv_chunk16_table; decode_chunk16_sw when
// it reports a NaN scale) against num::bf16_encode(mul_rn(e2m1_decode(n), e4m3_decode(s))): every scale
// byte s (a block) x every 4-nibble pattern x, x in each of the chunk's four 16-bit groups.
__global__ void nv_table_kernel(unsigned long long* mismatches) {
  const auto sb = static_cast<uint8_t>(blockIdx.x);
  const float sc = chunk_scale<kNv>(sb, 0.0f);
  for (uint32_t x = threadIdx.x; x < 65536u; x += blockDim.x) {
    const uint32_t qw[4] = {x | (x << 16), x | (x << 16), 0, 0};
    uint32_t w[8];
    if (!decode_chunk16_hw<kNv>(qw, sc, w)) decode_chunk16_sw<kNv>(qw, sc, w);
    for (int k = 0; k < 16; ++k) {
      const auto n = static_cast<uint8_t>((x >> (4 * (k % 4))) & 0xFu);
      const uint16_t want = num::bf16_encode(num::mul_rn(num::e2m1_decode(n), num::e4m3_decode(sb)));
      if (static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2))) != want) {
        atomicAdd(mismatches, 1ull);
        return;
      }
    }
  }
}

class RecordReadersGpu : public GpuTest {};

TEST_F(RecordReadersGpu, NvfpTableDecodeEqualsTheExactDecodeOnEveryScaleAndNibble) {
  DeviceBuffer<unsigned long long> mism(std::vector<unsigned long long>{0ull});
  nv_table_kernel<<<256, 256>>>(mism.data());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(mism.download()[0], 0ull) << "threads with a mismatching value";
}

TEST_F(RecordReadersGpu, ChunkReaderEqualsTheExactReader) {
  for (RecordFormat f : kAllRecordFormats) {
    const int64_t S = 16, pages = 24;
    CacheView v = CacheView::with_default_strides(nullptr, f, pages, S);
    const int64_t es = static_cast<int64_t>(dtype_size(record_info(f).element));
    const int64_t page_stride = v.page_stride * es, row_stride = v.row_stride * es;
    std::vector<uint8_t> bytes(static_cast<size_t>(pages * page_stride));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng().integer(0, 255));
    DeviceBuffer<uint8_t> d(bytes);
    for (const bool aligned : {true, false}) {
      DeviceBuffer<unsigned long long> mism(std::vector<unsigned long long>(1, 0));
      const float sigma = 0.0625f;
      const unsigned blocks = static_cast<unsigned>((pages * S * 32 + 255) / 256);
      with_record_format(f, [&](auto F) {
        chunk_kernel<F()><<<blocks, 256>>>(d.data(), pages, S, page_stride, row_stride, sigma, aligned, mism.data());
      });
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(mism.download()[0], 0u) << record_info(f).name << (aligned ? " vector loads" : " byte loads");
    }
    EXPECT_TRUE(record_chunks_aligned(static_cast<int>(f), d.data(), page_stride, row_stride)) << record_info(f).name;
  }
}

}  // namespace
}  // namespace dsv41kv::test
