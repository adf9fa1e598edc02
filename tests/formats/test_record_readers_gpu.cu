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

class RecordReadersGpu : public GpuTest {};

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
