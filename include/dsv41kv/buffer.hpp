// dsv41kv: an owning allocation on a device, for callers that keep state and scratch on the device
// their views name (the pipeline's weights, rings, caches and per-step buffers; tools; tests).
//
// Host memory (Device::CPU, 256-byte aligned) or device memory (Device::CUDA, cudaMalloc on the
// current device; E8 "built without CUDA" in a build without CUDA). The contents start
// unspecified. Transfers run on ctx.stream: upload and fill are ordered on it and do not wait for
// it (a source in pageable host memory may be reused at once: the driver stages it before the
// call returns, and may order that with the stream); download waits for the copy, since its
// caller reads the bytes next (the one place a Buffer synchronises). No CUDA type appears here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "dsv41kv/common.hpp"

namespace dsv41kv {

class Buffer {
 public:
  Buffer() = default;  // empty: no allocation, size 0
  // `bytes` may be 0 (an empty buffer on `device`). Error(kCuda) when cudaMalloc fails.
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device device() const { return device_; }
  size_t size() const { return bytes_; }  // bytes
  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }

  // A view of the buffer from element `offset` (elements of dt): row-major contiguous, or with
  // explicit strides (elements). E8 naming the view when it addresses bytes beyond size().
  TensorView view(DType dt, std::initializer_list<int64_t> shape, int64_t offset = 0) const;
  TensorView view(DType dt, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> stride,
                  int64_t offset = 0) const;

  // Host <-> buffer copies of `bytes` at byte `offset`; E8 when [offset, offset + bytes) is not
  // inside the buffer or a pointer is null with bytes > 0.
  void upload(const void* host, size_t bytes, size_t offset = 0, const ExecContext& ctx = {});
  void download(void* host, size_t bytes, size_t offset = 0, const ExecContext& ctx = {}) const;
  template <class T>
  void upload(const std::vector<T>& host, size_t offset = 0, const ExecContext& ctx = {}) {
    upload(host.data(), host.size() * sizeof(T), offset, ctx);
  }
  // The first n elements of T (resizes `host`).
  template <class T>
  void download(std::vector<T>& host, size_t n, const ExecContext& ctx = {}) const {
    host.resize(n);
    download(host.data(), n * sizeof(T), 0, ctx);
  }

  // Every byte of [offset, offset + bytes) set to `byte` (bytes = SIZE_MAX: to the end).
  void fill(uint8_t byte, size_t offset = 0, size_t bytes = SIZE_MAX, const ExecContext& ctx = {});
  // The whole buffer as repetitions of a pattern of `pattern_bytes` (1, 2, 4 or 8; size() a
  // multiple of it), e.g. a float canary. CUDA: a pattern of distinct bytes goes up as a host
  // copy of the whole buffer, allocated for the call (a set-up operation, not a per-step one).
  void fill_pattern(const void* pattern, size_t pattern_bytes, const ExecContext& ctx = {});
  template <class T>
  void fill_with(const T& value, const ExecContext& ctx = {}) {
    fill_pattern(&value, sizeof(T), ctx);
  }

 private:
  void release() noexcept;
  TensorView place(TensorView v, int64_t offset) const;
  Device device_ = Device::CPU;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Copies the elements of a contiguous view, host or device, to host memory (view.numel() elements
// of its dtype); waits for the copy. E8 for a view that is absent, not contiguous or on a device
// this build lacks.
void download_view(const TensorView& view, void* host, const ExecContext& ctx = {});

}  // namespace dsv41kv
