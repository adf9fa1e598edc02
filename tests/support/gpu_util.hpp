// Helpers of the GPU test target: a skip-when-no-GPU fixture, a per-run seed, and RAII device
// buffers that mirror a host vector (upload, download, whole-backing comparison).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsv41kv/common.hpp"
#include "dsv41kv/device.hpp"
#include "support/canary.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"

namespace dsv41kv::test {

#define GPU_CHECK(expr)                                                                  \
  do {                                                                                   \
    const cudaError_t e_ = (expr);                                                       \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);               \
  } while (0)

// Every GPU test derives from this: skips with the reason when no CUDA device is visible.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << cuda_device_description();
    seed_ = seed_for(::testing::UnitTest::GetInstance()->current_test_info()->name());
    rng_ = std::make_unique<Rng>(seed_);
  }
  Rng& rng() { return *rng_; }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_ = 0;
  std::unique_ptr<Rng> rng_;
};

// A device copy of a host vector; `offset_bytes` shifts the device view inside a larger
// allocation (to test unaligned bases).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(const std::vector<T>& host, size_t offset_bytes = 0) { upload_new(host, offset_bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(raw_, o.raw_);
    std::swap(n_, o.n_);
    std::swap(off_, o.off_);
    return *this;
  }
  ~DeviceBuffer() {
    if (raw_) cudaFree(raw_);
  }
  void upload_new(const std::vector<T>& host, size_t offset_bytes = 0) {
    if (raw_) cudaFree(raw_);
    raw_ = nullptr;
    n_ = host.size();
    off_ = offset_bytes;
    if (cudaMalloc(&raw_, n_ * sizeof(T) + off_ + 16) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    upload(host);
  }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::runtime_error("DeviceBuffer::upload: size");
    if (n_ && cudaMemcpy(data(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy H2D");
    // cudaMemcpy from pageable memory may return before its DMA has reached the device, and it
    // runs on the legacy stream, which does not order the tests' non-blocking streams: without
    // this a kernel on such a stream could run before the upload lands, and the upload (a canary
    // cache, a ring) would then overwrite its output (seen on the H200: a PDL chain test found
    // canary bytes where records had been written; docs/changelog.md, v16).
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize after H2D");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize");
    if (n_ && cudaMemcpy(h.data(), data(), n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy D2H");
    return h;
  }
  T* data() const { return reinterpret_cast<T*>(static_cast<char*>(raw_) + off_); }
  size_t size() const { return n_; }
  TensorView view(std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(data(), dtype_of<T>(), shape, Device::CUDA);
  }
  TensorView view1() const {
    return TensorView::contiguous(data(), dtype_of<T>(), {static_cast<int64_t>(n_)}, Device::CUDA);
  }
  TensorView strided(std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride) const {
    return TensorView::strided(data(), dtype_of<T>(), shape, stride, Device::CUDA);
  }

 private:
  void* raw_ = nullptr;
  size_t n_ = 0;
  size_t off_ = 0;
};

// A sweep's outcome: how many inputs mismatched and the smallest mismatching input (bit
// pattern or packed word; all ones when none).
struct SweepResult {
  unsigned long long mismatches = ~0ull;  // stays non-zero unless the sweep ran and came back
  uint32_t first = 0;
};

// Runs `launch(count, first)` (one sweep kernel launch) on a zeroed device counter and a
// first-mismatch slot of all ones, and downloads both into `out`. Call it under
// ASSERT_NO_FATAL_FAILURE: a failing CUDA call ends the test.
template <class Launch>
void run_sweep(Launch&& launch, SweepResult& out) {
  struct DevWords {
    unsigned long long* cnt = nullptr;
    uint32_t* first = nullptr;
    ~DevWords() {
      cudaFree(cnt);
      cudaFree(first);
    }
  } d;
  GPU_CHECK(cudaMalloc(&d.cnt, sizeof *d.cnt));
  GPU_CHECK(cudaMalloc(&d.first, sizeof *d.first));
  GPU_CHECK(cudaMemset(d.cnt, 0, sizeof *d.cnt));
  GPU_CHECK(cudaMemset(d.first, 0xFF, sizeof *d.first));
  launch(d.cnt, d.first);
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaMemcpy(&out.mismatches, d.cnt, sizeof out.mismatches, cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(&out.first, d.first, sizeof out.first, cudaMemcpyDeviceToHost));
}

}  // namespace dsv41kv::test
